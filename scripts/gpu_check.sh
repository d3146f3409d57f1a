#!/usr/bin/env bash
# The GPU check (issue 22): run on a machine with a CUDA GPU (the device tool's machine), from the repository
# root. Installs what the machine lacks from wheels carried in .whl/ (see the device README), then runs every
# test marked `gpu` (the bf16 learner, FSDP2 on NCCL, HF generation, vLLM where its wheel is there, the main
# job with its time) and prints the card. Without a GPU every one of them is skipped with its reason.
set -uo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
# the repository itself (editable, no dependencies fetched: the machine has no index to fetch from)
python3 -m pip install -q --no-deps --no-build-isolation -e . || echo "pip install -e . failed: the tests below will say what is missing"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
# the test files that hold GPU tests (collecting all of them would need every CPU-side dependency too)
if [ $# -eq 0 ]; then set -- $(grep -l "mark.gpu" tests/test_*.py); fi
python3 -m pytest -q -m gpu -rs -s "$@"
