# Sourced by scripts/setup*.sh (after they cd to the repository root): what every setup step shares.
# pip: no "Running pip as the 'root' user" warning and no version check on every call (uninstall too)
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
# apt-get update + install, quiet: its progress and debconf notes go to $APT_LOG, shown only when it fails
APT_LOG=${APT_LOG:-/tmp/agentgym-setup-apt.log}
apt_quiet() {
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o Dpkg::Use-Pty=0 "$@"; } \
      >"$APT_LOG" 2>&1; then
    echo "[setup] error: apt-get install $* failed; the end of $APT_LOG:" >&2
    tail -n 40 "$APT_LOG" >&2
    return 1
  fi
}
