"""SmolLM2-135M-Instruct greedy baselines on the benchmarks users know (issue 45).

Runs `agentgym eval` once per benchmark (HumanEval, BFCL categories, reasoning-gym tasks) as a user
would type it, keeps each eval's `--json` (trajectories dropped, per-task successes kept) and writes
`summary.json` plus a markdown table with the command, the CPU and the load.

    python benchmarks/baselines.py --out benchmarks/results/baselines_smollm2            # everything
    python benchmarks/baselines.py --only humaneval bfcl/simple_python --backend vllm    # a subset

Each entry is skipped when its JSON already exists, so an interrupted run resumes.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from agentgym.precision import cpu_identity

RG_TASKS = ("basic_arithmetic", "chain_sum", "leg_counting", "letter_counting", "gsm_symbolic")

# name -> (env id, extra eval arguments)
BENCHMARKS: dict[str, tuple[str, list[str]]] = {
    "humaneval": ("HumanEval-v0", ["--episodes", "164", "--first-task", "0", "--max-new-tokens", "1024"]),
    **{f"bfcl/{c}": ("BFCL-v0", ["--env-kwarg", f"category={c}", "--episodes", str(n), "--first-task", "0",
                                 "--max-new-tokens", "512"])
       for c, n in (("simple_python", 400), ("multiple", 200), ("parallel", 200))},
    # multi-turn prompts carry every function's documentation: at the default 2 048-token context most
    # episodes end before the model's first turn, so they get SmolLM2's whole window (8 192 tokens)
    "bfcl/multi_turn_base": ("BFCL-v0", ["--env-kwarg", "category=multi_turn_base", "--episodes", "50",
                                         "--first-task", "0", "--max-new-tokens", "512",
                                         "--max-context-tokens", "8192"]),
    # reasoning-gym's own rule (the answer inside <answer> tags), then answer_format=flexible (the tag, else
    # a boxed answer, an "answer is" number or the last number), which is what SmolLM2 can be scored on
    **{f"reasoning_gym{suffix}/{t}": ("ReasoningGym-v0", ["--env-kwarg", f"task={t}", *extra, "--episodes", "50",
                                                         "--first-task", "0", "--max-new-tokens", "256"])
       for suffix, extra in (("", []), ("_flexible", ["--env-kwarg", "answer_format=flexible"])) for t in RG_TASKS},
}


def run_one(name: str, out: Path, model: str, backend: str, threads: int) -> dict:
    env_id, extra = BENCHMARKS[name]
    path = out / (name.replace("/", "__") + ".json")
    cmd = ["agentgym", "eval", env_id, "--model", model, "--greedy", "--backend", backend,
           "--batch-size", "64", "--threads", str(threads), "--json", str(path), *extra]
    if not path.exists():
        load0 = os.getloadavg()[0]
        t0 = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr)[-2000:]
            raise SystemExit(f"{name}: `{shlex.join(cmd)}` failed (rc {proc.returncode}):\n{tail}")
        data = json.loads(path.read_text())
        # token ids, masks and log-probs are regenerated on demand (they would not fit the repository);
        # what the model wrote and how each episode ended stay, to read the failures
        data["episodes"] = [{"task_index": t.get("task_index"), "actions": t.get("actions"),
                             "episode": t.get("episode")} for t in data.pop("trajectories", [])]
        data["baseline_run"] = {"command": shlex.join(cmd), "wall_s": round(time.time() - t0, 1),
                                "load_1min_start": round(load0, 2), "load_1min_end": round(os.getloadavg()[0], 2),
                                "cpu": cpu_identity()["cpu"]}
        path.write_text(json.dumps(data, indent=1))
    data = json.loads(path.read_text())
    m = data["metrics"]
    return {"name": name, "env": env_id, "episodes": len(data.get("per_task", [])) or data["config"]["episodes"],
            "success": m.get("success_rate"), "task_summary": data.get("task_summary"),
            "truncated_rate": m.get("truncated_rate"), "response_tokens_mean": m.get("response_tokens_mean"),
            **data["baseline_run"]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/baselines_smollm2"))
    ap.add_argument("--only", nargs="*", default=None, help=f"subset of: {', '.join(BENCHMARKS)}")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--backend", default="vllm")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    names = args.only or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        ap.error(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in names:
        print(f"[baselines] {name} ...", flush=True)
        row = run_one(name, args.out, args.model, args.backend, args.threads)
        print(f"[baselines] {name}: success {row['success']:.3f} over {row['episodes']} tasks "
              f"({row['wall_s']} s, load {row['load_1min_start']})", flush=True)
        rows.append(row)
    summary_path = args.out / "summary.json"
    old = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    old.update({r["name"]: r for r in rows})
    summary_path.write_text(json.dumps(old, indent=1))
    lines = ["| benchmark | tasks | greedy success | wall s | load | command |", "|---|---|---|---|---|---|"]
    for r in old.values():
        lines.append(f"| {r['name']} | {r['episodes']} | {r['success']:.3f} | {r['wall_s']} | "
                     f"{r['load_1min_start']} | `{r['command']}` |")
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
