#!/usr/bin/env bash
# Make the code-execution sandboxes usable on this machine (idempotent; safe to re-run).
#   1. apt-get install what is missing of docker.io, debootstrap, bubblewrap (needs root)
#   2. start dockerd in the background when `docker info` fails (no systemd needed),
#      log to $DOCKERD_LOG, wait up to $DOCKERD_WAIT_S seconds for it to answer
#   3. build the sandbox image when it is missing: offline, debootstrap + `docker import`
#      (a few minutes the first time; the rootfs is cached under ~/.cache/agentgym/, so later
#      builds take seconds), or `docker pull` where a registry is reachable
# Needs the agentgym Python deps (the `docker` SDK): run after scripts/setup.sh's pip install.
#   PYTHON                  interpreter with agentgym installed (default: python3)
#   AGENTGYM_SANDBOX_IMAGE  image tag (default: agentgym-sandbox:latest)
#   DOCKERD_LOG             dockerd's log file (default: /tmp/dockerd.log)
#   DOCKERD_WAIT_S          how long to wait for dockerd (default: 60)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
IMAGE=${AGENTGYM_SANDBOX_IMAGE:-agentgym-sandbox:latest}
LOG=${DOCKERD_LOG:-/tmp/dockerd.log}
WAIT=${DOCKERD_WAIT_S:-60}
export PATH="$PATH:/usr/sbin:/sbin"  # dockerd and debootstrap live there

say() { echo "[setup-docker] $*"; }
have() { command -v "$1" >/dev/null 2>&1; }
is_root() { [ "$(id -u)" = "0" ]; }
docker_ok() { docker info >/dev/null 2>&1; }
. scripts/common.sh   # PIP_* settings and apt_quiet

# --- 1. packages -----------------------------------------------------------------------------
missing=""
{ have dockerd && have docker; } || missing="$missing docker.io"
have debootstrap || missing="$missing debootstrap"
have bwrap || missing="$missing bubblewrap"
if [ -n "$missing" ]; then
  if is_root && have apt-get; then
    say "apt-get install:$missing (log: $APT_LOG)"
    # shellcheck disable=SC2086
    apt_quiet $missing
  else
    say "error: missing:$missing; install them as root (apt-get install$missing)"
    exit 1
  fi
else
  say "docker.io, debootstrap and bubblewrap already installed"
fi

# --- 2. the daemon ---------------------------------------------------------------------------
wait_for_docker() {
  local i
  for ((i = 0; i < WAIT; i++)); do
    docker_ok && return 0
    sleep 1
  done
  return 1
}

start_dockerd() {  # $@: extra dockerd flags
  say "starting dockerd${*:+ $*} (log: $LOG)"
  # setsid + nohup: the daemon outlives this script (and the CI step that ran it)
  nohup setsid dockerd "$@" >>"$LOG" 2>&1 </dev/null &
}

if docker_ok; then
  say "docker daemon already running"
else
  if ! is_root; then
    say "error: the docker daemon does not answer and only root can start it"
    exit 1
  fi
  pidfile=/var/run/docker.pid
  if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    say "dockerd (pid $(cat "$pidfile")) is starting; waiting for it"
  else
    rm -f "$pidfile"  # a stale pid file from a dead daemon blocks a new one
    start_dockerd
  fi
  if ! wait_for_docker; then
    # Typical cause on minimal machines: iptables/bridge setup fails. The sandbox only
    # uses network_mode=none, so a daemon without them is enough.
    say "dockerd did not answer in ${WAIT}s; retrying with --iptables=false --bridge=none"
    tail -n 5 "$LOG" || true
    if [ -f "$pidfile" ]; then kill "$(cat "$pidfile")" 2>/dev/null || true; sleep 2; fi
    rm -f "$pidfile"
    start_dockerd --iptables=false --bridge=none
    if ! wait_for_docker; then
      say "error: dockerd did not start; last lines of $LOG:"
      tail -n 30 "$LOG" || true
      exit 1
    fi
  fi
  say "docker daemon up: $(docker version --format '{{.Server.Version}}' 2>/dev/null || echo '?')"
fi

# --- 3. the sandbox image --------------------------------------------------------------------
if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  say "image $IMAGE already present"
else
  if ! "$PY" -c "import docker" 2>/dev/null; then
    say "error: the 'docker' Python package is missing for $PY; run scripts/setup.sh first"
    exit 1
  fi
  if "$PY" -c "import agentgym.envs.services.sandbox.image" 2>/dev/null; then
    "$PY" -m agentgym.envs.services.sandbox build-image --tag "$IMAGE"
  else  # agentgym not installed yet: image.py runs stand-alone
    "$PY" envs/services/sandbox/image.py --tag "$IMAGE"
  fi
fi

if "$PY" -c "import agentgym.envs.services.sandbox" 2>/dev/null; then
  say "sandbox status (agentgym sandbox status):"
  "$PY" -m agentgym.envs.services.sandbox status --image "$IMAGE" | sed 's/^/[setup-docker]   /' || true
fi
