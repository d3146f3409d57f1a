#!/usr/bin/env bash
# The long studies of issue 23, each resumable: run one, stop it (Ctrl-C, a session ending), run it again.
# Finished runs are reused (--resume); an unfinished run goes on from its last checkpoint.
# Results: benchmarks/RESULTS.md ("Algorithm comparison with a negative control") and
# benchmarks/search_r1/README.md §8. One core each, at nice 10, so that two can share a 2-core machine.
#
#   bash benchmarks/issue23_studies.sh math           # Math-v0: 6 arms x 5 seeds x 30 steps (~11 min a run, 1 core)
#   bash benchmarks/issue23_studies.sh search_r1_v2   # Search-R1 in a box v2 (~1-2 h an RL run, 9 RL runs)
#   bash benchmarks/issue23_studies.sh searchqa       # SearchQA after SFT: 6 arms x 5 seeds (needs v2's SFT model)
#   bash benchmarks/issue23_studies.sh report         # both comparisons' compare.md, v2's interim table and its re-scores' summary, from the runs finished so far
#   bash benchmarks/issue23_studies.sh rescore        # v2's sampled re-scores still pending (search_r1_v2 runs them too)
#   bash benchmarks/issue23_studies.sh save           # before a session ends: finished runs -> benchmarks/results/
#
# A new machine has no runs/ folder: the two Search-R1 studies then start from what `save` committed (v2:
# benchmarks/search_r1/restore_progress.py, which re-trains the SFT model; searchqa: the finished run folders).
# Every run is fp32 (AGENTGYM_PRECISION=fp32: what precision=auto chose on the Zen 3 the first runs had), so
# runs made on CPUs with and without bf16 units stay one study.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 AGENTGYM_PRECISION=fp32
RUNS=${RUNS:-runs}
ARMS="reinforce,ppo,grpo,grpo:group_scale=false:loss_agg=dr-grpo,rloo,grpo-shuffled"
MATH=(--env Math-v0 --steps 30 groups_per_step=2 group_size=4 eval.episodes=64)   # finished (30 runs)
SFT_MODEL="$RUNS/search_r1_v2/sft/model"
V2=(--config benchmarks/search_r1/configs/smollm2_v2.yaml --sft-baselines --seeds 3 --eval-per-type 30)
RAW=${RAW:-benchmarks/results}   # where `save` commits finished runs, and where a new machine restores them from
# The pilots (benchmarks/RESULTS.md, "Algorithm comparison with a negative control"): lr 5e-6 with 2 x 4 episodes
# collapsed to "never search" through its steps without signal, learner.skip_no_signal=true prevented it, so
# every arm gets the knob; at lr 1e-5, 20 steps x 2 x 5, greedy held-out success stayed 0.350 while the mean
# success of 4 samples per question rose 0.183 -> 0.283 (paired over 60 questions +0.100 [+0.054, +0.150]):
# so the held-out score is eval.samples=4. A run checkpoints every 5 steps, so a stopped one goes on from there.
SEARCHQA=(--config benchmarks/search_r1/configs/smollm2_v2.yaml --steps 20 "model=$SFT_MODEL"
          groups_per_step=2 group_size=5 optim.lr=1e-5 learner.skip_no_signal=true
          eval.episodes=60 eval.samples=4 checkpoint_every=5)

compare() { nice -n 10 agentgym --threads 1 compare --algos "$ARMS" "$@"; }

# v2's sampled re-scores (rescore_sampled.sh): every finished RL run whose weights are still here and whose
# re-score is not, and the SFT model's (what they pair with). The committed re-scores are taken over first,
# so a new machine re-scores only what was never scored.
rescore_pending() {
  local dir="$RUNS/search_r1_v2" name final
  [ -f "$dir/progress.json" ] || return 0
  mkdir -p "$dir/rescore"
  if compgen -G "$RAW/search_r1_v2_runs/rescore/*.json" > /dev/null; then
    cp -n "$RAW"/search_r1_v2_runs/rescore/*.json "$dir/rescore/"
  fi
  if [ ! -f "$dir/rescore/sft.json" ] && [ -d "$SFT_MODEL" ]; then
    RUNS="$RUNS" bash benchmarks/search_r1/rescore_sampled.sh sft "$SFT_MODEL"
  fi
  if [ ! -f "$dir/rescore/rag_sft.json" ] && [ -d "$SFT_MODEL" ]; then   # one-shot RAG, SFT model, sampled
    RUNS="$RUNS" RETRIEVAL=rag bash benchmarks/search_r1/rescore_sampled.sh rag_sft "$SFT_MODEL"
  fi
  for name in $(python - "$dir/progress.json" <<'PY'
import json, sys
records = json.load(open(sys.argv[1]))["records"]
for arm in ("grpo_masked", "ppo_masked", "grpo_unmasked"):     # the RL arms, in the study's order
    for seed in range(len(records.get(arm, []))):              # the seeds whose phase finished
        print(f"{arm}_seed{seed}")
PY
  ); do
    [ -f "$dir/rescore/$name.json" ] && continue
    compgen -G "$dir/$name/checkpoints/step_*/model" > /dev/null || { echo "no weights of $name here: not re-scored"; continue; }
    # a --retrain stopped part way leaves an early checkpoint: only the final step's weights are the run's
    final=$(printf 'step_%06d' "$(python -c "import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))['steps'])" "$dir/$name/config.yaml")")
    [ -d "$dir/$name/checkpoints/$final/model" ] || { echo "$name has not reached its last step ($final): not re-scored yet"; continue; }
    RUNS="$RUNS" bash benchmarks/search_r1/rescore_sampled.sh "$name" "$dir/$name"
  done
}

case "${1:-}" in
  math)
    for s in 0 1 2 3 4; do   # seed by seed: every finished seed has every arm
      compare --seeds "$s," --out "$RUNS/compare_issue23_math" --resume "${MATH[@]}"
    done ;;
  search_r1_v2)
    if [ ! -f "$RUNS/search_r1_v2/progress.json" ] && [ -f "$RAW/search_r1_v2_runs/heldout_records.json" ]; then
      python benchmarks/search_r1/restore_progress.py --runs-dir "$RUNS/search_r1_v2" -- "${V2[@]}"
    fi
    rescore_pending   # what a stopped session left unscored, before hours of training
    nice -n 10 python benchmarks/search_r1/small_scale.py --threads 1 "${V2[@]}" \
      --out "$RUNS/search_r1_v2/results" --runs-dir "$RUNS/search_r1_v2" --resume
    rescore_pending
    # GRPO masked seeds 0-2 ran before RL runs kept their final weights: trained again (same settings, their
    # recorded results kept) so that they too can be re-scored by sampling
    nice -n 10 python benchmarks/search_r1/small_scale.py --threads 1 "${V2[@]}" \
      --out "$RUNS/search_r1_v2/results" --runs-dir "$RUNS/search_r1_v2" --resume \
      --retrain grpo_masked_seed0,grpo_masked_seed1,grpo_masked_seed2
    rescore_pending ;;
  rescore)   # only v2's pending re-scores (also run by search_r1_v2 before and after its training)
    rescore_pending ;;
  searchqa)
    if [ ! -d "$SFT_MODEL" ]; then
      echo "no SFT model at $SFT_MODEL: run '$0 search_r1_v2' first (its SFT phase writes it)" >&2; exit 2
    fi
    if [ -d "$RAW/compare_issue23_searchqa" ]; then   # finished runs of earlier sessions (not over newer ones)
      mkdir -p "$RUNS/compare_issue23_searchqa"
      cp -rn "$RAW/compare_issue23_searchqa/." "$RUNS/compare_issue23_searchqa/"
    fi
    for s in 0 1 2 3 4; do
      compare --seeds "$s," --out "$RUNS/compare_issue23_searchqa" --resume "${SEARCHQA[@]}"
    done ;;
  report)   # trains nothing: the seeds every arm finished; v2: the phases finished so far
    if [ -f "$RUNS/search_r1_v2/progress.json" ]; then
      python benchmarks/search_r1/small_scale.py --threads 1 "${V2[@]}" --runs-dir "$RUNS/search_r1_v2" \
        --out "$RUNS/search_r1_v2/interim" --report-only
    fi
    RESCORE="$RUNS/search_r1_v2/rescore"
    if [ -f "$RESCORE/sft.json" ]; then   # the sampled re-scores, per arm and over seeds; arm pairs once both exist
      PAIRS=()
      scored() { compgen -G "$RESCORE/$1_seed*.json" > /dev/null || [ -f "$RESCORE/$1.json" ]; }
      for pair in "grpo_masked grpo_unmasked" "grpo_masked ppo_masked" "ppo_masked grpo_unmasked" \
                  "grpo_masked rag_sft" "ppo_masked rag_sft"; do
        read -r a b <<< "$pair"
        if scored "$a" && scored "$b"; then PAIRS+=(--pair "$a" "$b"); fi
      done
      python benchmarks/search_r1/rescore_summary.py --dir "$RESCORE" "${PAIRS[@]}" \
        --json "$RUNS/search_r1_v2/rescore_summary.json" --png "$RUNS/search_r1_v2/rescore_summary.png" \
        | tee "$RUNS/search_r1_v2/rescore_summary.md"
    fi
    if [ -d "$RUNS/compare_issue23_math" ]; then   # finished: its report is committed in $RAW
      compare --seeds 5 --out "$RUNS/compare_issue23_math" --report-only "${MATH[@]}"
    fi
    if [ -d "$RUNS/compare_issue23_searchqa" ]; then
      compare --seeds 5 --out "$RUNS/compare_issue23_searchqa" --report-only "${SEARCHQA[@]}"
    fi ;;
  save)      # the finished phases, without weights, where git keeps them
    if [ -f "$RUNS/search_r1_v2/progress.json" ]; then
      python benchmarks/search_r1/restore_progress.py --runs-dir "$RUNS/search_r1_v2" --save
    fi
    if compgen -G "$RUNS/search_r1_v2/rescore/*.json" > /dev/null; then   # without the trajectories (MBs each)
      mkdir -p "$RAW/search_r1_v2_runs/rescore"
      python - "$RUNS/search_r1_v2/rescore" "$RAW/search_r1_v2_runs/rescore" <<'PY'
import json, pathlib, sys
src, dst = map(pathlib.Path, sys.argv[1:])
for f in sorted(src.glob("*.json")):
    d = json.loads(f.read_text())
    d.pop("trajectories", None)
    (dst / f.name).write_text(json.dumps(d, indent=1))
    print(f"saved {dst / f.name}")
PY
    fi
    for done_file in "$RUNS"/compare_issue23_searchqa/*/seed*/compare_run.json; do
      [ -f "$done_file" ] || continue
      run=$(dirname "$done_file"); dst="$RAW/compare_issue23_searchqa/${run#"$RUNS"/compare_issue23_searchqa/}"
      mkdir -p "$dst" && find "$run" -maxdepth 1 -type f -exec cp {} "$dst/" \;
      echo "saved $dst"
    done ;;
  *)
    echo "usage: $0 math|search_r1_v2|searchqa|rescore|report|save" >&2; exit 2 ;;
esac
