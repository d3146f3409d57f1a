#!/bin/bash
# Sampled held-out success (4 samples per question, temperature 1, top_p 0.95) of the SFT model and the lr 1e-5 pilot's final model
cd /work/main
for pair in "sft:/work/main/runs/search_r1_v2/sft/model" "pilot:/work/main/runs/pilot_searchqa/grpo_lr1e-5_skip/checkpoints/step_000020/model"; do
  name=${pair%%:*}; pol=${pair#*:}
  OMP_NUM_THREADS=1 nice -n 5 agentgym --threads 1 eval SearchQA-v0 --policy "$pol" --split test --episodes 60 --group-size 4 \
    --first-task 0 --seed 0 --max-new-tokens 48 --temperature 1.0 --top-p 0.95 --max-obs-tokens 500 --max-context-tokens 2048 \
    --env-kwarg protocol=search_r1 --env-kwarg retrieval=agentic --env-kwarg retriever=dense --env-kwarg topk=3 \
    --env-kwarg max_turns=4 --env-kwarg forced_answer=true --json /tmp/sampled/$name.json
  echo "$name EXIT $? $(date -u)"
done
