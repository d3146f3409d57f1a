"""HumanEval-v0 reward latency: seconds from ``reset`` to the graded ``step`` with the oracle's reply.

    python benchmarks/humaneval_speed.py [--backends bwrap docker] [--problems 164] [--repeats 1]
                                         [--threads 1] [--out FILE]

Each backend gets one env over its own warm sandbox (started and warmed by one untimed episode first,
so the numbers are steady state). Every problem is then played once per repeat: ``reset`` to the
problem, ``step`` with its canonical solution, which loads the program and runs the problem's own
``check`` in the sandbox. The table shows the median, p90 and max of those per-episode seconds, how many
passed, and the share of episodes within the 0.2 s target. A backend that is not usable here is
reported as skipped, with the reason.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

TARGET_S = 0.2


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def time_backend(backend: str, problems: int, repeats: int) -> dict:
    """Per-episode seconds (reset + oracle step) on ``backend`` for the first ``problems`` problems."""
    from agentgym.envs.humaneval import HumanEvalEnv
    from agentgym.envs.services.sandbox import make_sandbox
    sandbox = make_sandbox(backend)
    try:
        env = HumanEvalEnv(sandbox=sandbox)
        env.reset(options={"task_index": 0})             # warm-up: the runner starts, caches fill
        env.step(env.oracle({"task": env.task}))
        seconds, passed = [], 0
        for _ in range(repeats):
            for i in range(problems):
                start = time.perf_counter()
                _, info = env.reset(options={"task_index": i})
                _, reward, *_ = env.step(env.oracle({"task": info["privileged"]["task"]}))
                seconds.append(time.perf_counter() - start)
                passed += reward == 1.0
    finally:
        sandbox.close()
    return {"episodes": len(seconds), "passed": passed, "median_s": statistics.median(seconds),
            "p90_s": _percentile(seconds, 0.9), "max_s": max(seconds),
            "within_target": sum(s <= TARGET_S for s in seconds) / len(seconds), "seconds": seconds}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", nargs="+", default=["bwrap", "docker"], choices=["bwrap", "docker", "subprocess"],
                    help="sandboxes to time (subprocess needs AGENTGYM_ALLOW_UNSAFE_SANDBOX=1: no isolation)")
    ap.add_argument("--problems", type=int, default=164, help="the first N problems (1..164)")
    ap.add_argument("--repeats", type=int, default=1, help="passes over those problems")
    ap.add_argument("--threads", type=int, default=1, help="torch / BLAS threads (nothing here needs more)")
    ap.add_argument("--out", default=None, help="write the numbers (every episode's seconds too) as JSON")
    args = ap.parse_args()
    if not 1 <= args.problems <= 164 or args.repeats < 1:
        ap.error("--problems must be in 1..164 and --repeats >= 1")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    from agentgym.envs.services.sandbox import SandboxRefusedError, available_backends
    status = available_backends()
    rows = {}
    for backend in args.backends:
        if status.get(backend) != "ok":
            print(f"[bench] skipping {backend}: {status.get(backend)}", file=sys.stderr)
            continue
        try:
            rows[backend] = time_backend(backend, args.problems, args.repeats)
        except SandboxRefusedError as e:   # subprocess without the explicit opt-in
            print(f"[bench] skipping {backend}: {str(e).splitlines()[0]}", file=sys.stderr)
    print(f"HumanEval-v0 reset + oracle step, {args.problems} problems x {args.repeats}; "
          f"{_cpu_model()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(f"{'backend':<12}{'episodes':>9}{'passed':>8}{'median s':>10}{'p90 s':>8}{'max s':>8}{'<= 0.2 s':>10}")
    for backend, r in rows.items():
        print(f"{backend:<12}{r['episodes']:>9}{r['passed']:>8}{r['median_s']:>10.3f}{r['p90_s']:>8.3f}"
              f"{r['max_s']:>8.3f}{r['within_target']:>10.0%}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"problems": args.problems, "repeats": args.repeats, "cpus": os.cpu_count(),
                       "load_1min": os.getloadavg()[0], "backends": rows}, f, indent=1)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    from _common import run_interruptible
    sys.exit(run_interruptible(main))
