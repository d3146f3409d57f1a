#!/bin/bash
# Search-R1 in a box v2, re-scored by sampling: a model's held-out success on the study's own 90 questions
# (30 per type) as the mean of 4 episodes per question sampled as in training (temperature 1.0, top-p 0.95),
# with `agentgym eval`. A greedy score (the study's EM) cannot see a gain below the argmax; this can
# (benchmarks/RESULTS.md, the lr 1e-5 pilot). Every model is scored on the same draws (--seed 0).
#   bash benchmarks/search_r1/rescore_sampled.sh sft runs/search_r1_v2/sft/model
#   bash benchmarks/search_r1/rescore_sampled.sh grpo_masked_seed2 runs/search_r1_v2/grpo_masked_seed2
#   RETRIEVAL=rag bash benchmarks/search_r1/rescore_sampled.sh rag_sft runs/search_r1_v2/sft/model
# RETRIEVAL=rag scores the one-shot RAG baseline the same way: the top-3 passages for the question in the
# prompt, one turn, no search (the study's RAG arm, `small_scale.py`), so RL arms pair with it by sampling too.
# The second and later models are paired with sft.json (per question, 95 % bootstrap CI) when it exists.
# Read them together (per arm over its seeds, and arm against arm): benchmarks/search_r1/rescore_summary.py.
set -euo pipefail
NAME=$1 POLICY=$2
RUNS=${RUNS:-runs}
case "${RETRIEVAL:-agentic}" in
  agentic) MODE=(-e retrieval=agentic -e max_turns=4 -e forced_answer=true) ;;
  rag)     MODE=(-e retrieval=rag -e max_turns=1 -e forced_answer=false) ;;
  *) echo "RETRIEVAL must be agentic or rag, got '$RETRIEVAL'" >&2; exit 2 ;;
esac
OUT="$RUNS/search_r1_v2/rescore"
mkdir -p "$OUT"
TASKS=$(python -c "import json,sys; d=json.load(open(sys.argv[1])); r=d['records']['sft']; r=r[0] if isinstance(r[0], list) else r; print(json.dumps(sorted(x['task_index'] for x in r)).replace(' ', ''))" "$RUNS/search_r1_v2/progress.json")
PAIR=()
# (eval pairs only runs of the same env settings; RAG's differ, so rescore_summary.py pairs it per question)
if [ "$NAME" != sft ] && [ "${RETRIEVAL:-agentic}" = agentic ] && [ -f "$OUT/sft.json" ]; then
  PAIR=(--paired-with "$OUT/sft.json")
fi
nice -n 10 agentgym --threads 1 eval SearchQA-v0 --policy "$POLICY" --split test "tasks=$TASKS" --group-size 4 --seed 0 \
  --max-new-tokens 48 --temperature 1.0 --top-p 0.95 --max-obs-tokens 500 --max-context-tokens 2048 \
  -e protocol=search_r1 -e retriever=dense -e topk=3 "${MODE[@]}" \
  --json "$OUT/$NAME.json" "${PAIR[@]}"
