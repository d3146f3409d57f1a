"""Sandbox throughput: executions per second of each backend, with bare ``python`` as the floor.

    python benchmarks/sandbox.py [--runs 60] [--slow-runs 20] [--threads 1 2]
                                 [--backends docker docker-per-job bwrap bwrap-per-job subprocess]
                                 [--pool-size 2] [--out FILE]

Backends: ``docker`` and ``bwrap`` are the warm sandboxes (long-lived runners that fork a fresh
child per job and are verified clean after each); ``docker-per-job`` (a fresh container per job
from a warm pool of single-use containers) and ``bwrap-per-job`` (a new bwrap per job) are the
older paths, measured side by side; ``subprocess`` has no isolation. Programs: ``print(1)``
(pure overhead); a small test-running program of the kind the CodeExec env runs as its reward
check (a ``solution.py`` passed in ``files`` + 8 unittest cases, one run); and the same 8 tests as
8 separate one-test programs of one candidate, sent as one ``run_batch`` (bare python: 8 runs).
Each backend runs each program from 1 caller thread (latency-bound) and from several threads
(throughput-bound; the env steps episodes concurrently) after a warm-up, so the numbers are
steady state. The floor runs the same interpreter directly (``python -c`` / ``python main.py``
in a prepared dir): no isolation, no limits, no files written per run.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from agentgym.envs.services.sandbox import available_backends, make_sandbox

TRIVIAL = "print(1)"
SOLUTION = '''
def fizzbuzz(n):
    return "FizzBuzz" if n % 15 == 0 else "Fizz" if n % 3 == 0 else "Buzz" if n % 5 == 0 else str(n)
'''
TESTS = '''
import unittest
from solution import fizzbuzz

class T(unittest.TestCase):
''' + "".join(f"    def test_{i}(self):\n        self.assertEqual(fizzbuzz({n}), {want!r})\n"
              for i, (n, want) in enumerate([(1, "1"), (3, "Fizz"), (5, "Buzz"), (15, "FizzBuzz"),
                                             (7, "7"), (9, "Fizz"), (10, "Buzz"), (30, "FizzBuzz")])) + '''
unittest.main(argv=["t"], verbosity=0)
'''
PROGRAMS = {"print(1)": (TRIVIAL, {}), "unittest x8": (TESTS, {"solution.py": SOLUTION})}
CASES = [(1, "1"), (3, "Fizz"), (5, "Buzz"), (15, "FizzBuzz"), (7, "7"), (9, "Fizz"), (10, "Buzz"), (30, "FizzBuzz")]
#: The 8 tests as 8 one-test programs (one candidate): sent as one run_batch.
BATCH = [f"from solution import fizzbuzz\nassert fizzbuzz({n}) == {want!r}\n" for n, want in CASES]
BATCH_NAME = "8 tests, run_batch"
#: name -> (make_sandbox backend, options)
VARIANTS = {"docker": ("docker", {"warm": True}), "docker-per-job": ("docker", {"warm": False}),
            "bwrap": ("bwrap", {"warm": True}), "bwrap-per-job": ("bwrap", {"warm": False}),
            "subprocess": ("subprocess", {})}


def floor_python() -> str:
    """The interpreter the local backends use here (the system one when we are root)."""
    return "/usr/bin/python3" if os.geteuid() == 0 and os.path.exists("/usr/bin/python3") \
        else sys.executable


def bare_runner(code: str, files: dict[str, str]) -> tuple[Callable[[], bool], Callable[[], None]]:
    work = tempfile.mkdtemp(prefix="agentgym-bench-")
    for name, text in {"main.py": code, **files}.items():
        with open(os.path.join(work, name), "w") as f:
            f.write(text)
    for i, prog in enumerate(BATCH):
        with open(os.path.join(work, f"t{i}.py"), "w") as f:
            f.write(prog)
    py = floor_python()

    def once() -> bool:
        if code == BATCH_NAME:
            return all(subprocess.run([py, f"t{i}.py"], cwd=work, capture_output=True).returncode == 0
                       for i in range(len(BATCH)))
        if not files:
            p = subprocess.run([py, "-c", code], capture_output=True)
        else:
            p = subprocess.run([py, "main.py"], cwd=work, capture_output=True)
        return p.returncode == 0

    return once, lambda: shutil.rmtree(work, ignore_errors=True)


def measure(once: Callable[[], bool], runs: int, threads: int) -> dict:
    latencies: list[float] = []

    def timed(_: int) -> bool:
        t0 = time.perf_counter()
        ok = once()
        latencies.append(time.perf_counter() - t0)
        return ok

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as ex:
        oks = list(ex.map(timed, range(runs)))
    wall = time.perf_counter() - t0
    lat = sorted(latencies)
    return {"runs": runs, "threads": threads, "failures": oks.count(False),
            "exec_per_s": runs / wall, "median_ms": 1000 * statistics.median(lat),
            "p90_ms": 1000 * lat[min(len(lat) - 1, int(0.9 * len(lat)))]}


def ray_rollouts(episodes: int, sandbox: str) -> list[dict]:
    """CodeExec-v0 episodes (oracle policy) with the envs in this process (thread pool) vs in Ray env
    actors that share the node's one sandbox service; the same sandbox backend for both."""
    import agentgym
    from agentgym.policies.loading import load_tokenizer_for
    from agentgym.policies.scripted import ScriptedPolicy
    from agentgym.ray_envs import ensure_ray
    from agentgym.rollout_config import RolloutConfig
    from agentgym.rollout import RolloutEngine
    ensure_ray(num_cpus=os.cpu_count() or 2)
    oracle = agentgym.make("CodeExec-v0", sandbox=sandbox).unwrapped.oracle
    rows = []
    for backend in ("thread", "ray"):
        engine = RolloutEngine(ScriptedPolicy(load_tokenizer_for("tiny-random"), oracle),
                               RolloutConfig(env_backend=backend))
        kwargs = {"sandbox": sandbox}
        try:
            # warm-up with as many episodes: every env (thread) or env actor (ray) exists, and the
            # node's sandbox is warm, so both rows are steady state
            engine.collect("CodeExec-v0", num_groups=episodes, group_size=1, seed=0, env_kwargs=kwargs)
            t0 = time.perf_counter()
            b = engine.collect("CodeExec-v0", num_groups=episodes, group_size=1, seed=1, env_kwargs=kwargs)
            wall = time.perf_counter() - t0
        finally:
            engine.close()
        rows.append({"env_backend": backend, "sandbox": sandbox, "episodes": episodes, "wall_s": wall,
                     "episodes_per_s": episodes / wall, "success": b.metrics["success_rate"]})
        print(f"[bench] CodeExec rollouts, envs in {backend}: {episodes / wall:.2f} episodes/s", file=sys.stderr)
    return rows


def versions() -> dict[str, str]:
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    except OSError:
        pass
    out = {"cpu": model, "python": platform.python_version(), "machine": platform.machine(),
           "cpus": str(os.cpu_count()), "kernel": platform.release(),
           "load avg (1 min)": f"{os.getloadavg()[0]:.1f}"}  # other work skews the numbers
    for name, cmd in (("docker", ["docker", "version", "--format", "{{.Server.Version}}"]),
                      ("bwrap", ["bwrap", "--version"])):
        try:
            out[name] = subprocess.run(cmd, capture_output=True, text=True,
                                       timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out[name] = "n/a"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=60, help="runs per cell (warm backends, subprocess)")
    ap.add_argument("--slow-runs", type=int, default=20, help="runs per cell of the per-job backends")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--backends", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--pool-size", type=int, default=2, help="warm pool size (docker, bwrap)")
    ap.add_argument("--out", default=None, help="write the raw numbers as JSON")
    ap.add_argument("--ray-rollouts", type=int, default=0, metavar="EPISODES",
                    help="also time CodeExec-v0 rollouts, thread pool vs Ray env actors (0: skip)")
    ap.add_argument("--ray-sandbox", default="auto", help="sandbox of those rollouts")
    args = ap.parse_args()

    status = available_backends()
    rows: list[dict] = []
    programs = {**PROGRAMS, BATCH_NAME: (BATCH_NAME, {"solution.py": SOLUTION})}

    def floor(program: str, threads: int, runs: int) -> dict:
        """Bare python, measured right before each cell: a shared machine's load drifts."""
        code, files = programs[program]
        once, cleanup = bare_runner(code, files)
        try:
            once()  # warm the page cache
            return measure(once, runs, threads)
        finally:
            cleanup()

    for variant in args.backends:
        backend, opts = VARIANTS[variant]
        if status.get(backend) != "ok":
            print(f"[bench] skipping {variant}: {status.get(backend)}", file=sys.stderr)
            continue
        if backend == "docker" or opts.get("warm"):
            opts = {**opts, "pool_size": max(args.pool_size, max(args.threads))}
        runs = args.slow_runs if variant.endswith("per-job") else args.runs
        # allow_unsafe: the subprocess backend is measured on purpose (trusted benchmark code)
        with make_sandbox(backend, allow_unsafe=True, **opts) as sb:
            for program, (code, files) in programs.items():
                def once(code=code, files=files) -> bool:
                    if code == BATCH_NAME:
                        return all(r.ok for r in sb.run_batch(
                            [{"code": c, "files": files, "time_limit_s": 10} for c in BATCH]))
                    return sb.run(code, files=files, time_limit_s=10).ok
                for _ in range(3):  # warm-up (fills the pools)
                    once()
                # a batch is 8 programs: fewer of them on the slow per-job paths
                n = max(4, runs // 4) if program == BATCH_NAME and variant.endswith("per-job") else runs
                for threads in args.threads:
                    base = floor(program, threads, n)
                    rows.append({"backend": variant, "program": program,
                                 **measure(once, n, threads),
                                 "bare_exec_per_s": base["exec_per_s"]})
                    print(f"[bench] {variant:14s} {program:18s} threads={threads} "
                          f"{rows[-1]['exec_per_s']:.1f}/s (bare {base['exec_per_s']:.1f}/s)",
                          file=sys.stderr)

    print(f"\nSandbox executions per second ({', '.join(f'{k} {v}' for k, v in versions().items())})")
    print(f"bare python = {floor_python()} run directly, measured just before each row\n")
    print(f"(\"{BATCH_NAME}\": one call per candidate, so exec/s counts candidates of 8 programs)")
    print("| backend | program | caller threads | exec/s | bare python exec/s | ratio | median ms | p90 ms | failures |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['backend']} | {r['program']} | {r['threads']} | {r['exec_per_s']:.1f} | "
              f"{r['bare_exec_per_s']:.1f} | {r['exec_per_s'] / r['bare_exec_per_s']:.2f} | "
              f"{r['median_ms']:.0f} | {r['p90_ms']:.0f} | {r['failures']} |")
    rollouts = ray_rollouts(args.ray_rollouts, args.ray_sandbox) if args.ray_rollouts else []
    if rollouts:
        thread, ray_ = rollouts
        print(f"\nCodeExec-v0 rollouts ({thread['episodes']} episodes, oracle policy, sandbox {args.ray_sandbox}): "
              f"thread pool {thread['episodes_per_s']:.2f} episodes/s, Ray env actors "
              f"{ray_['episodes_per_s']:.2f} episodes/s, ratio {ray_['episodes_per_s'] / thread['episodes_per_s']:.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": versions(), "runs": args.runs, "rows": rows, "ray_rollouts": rollouts}, f,
                      indent=2)


if __name__ == "__main__":
    from _common import run_interruptible   # benchmarks/ is sys.path[0] when this runs as a script
    raise SystemExit(run_interruptible(main))   # Ctrl-C: one line and status 130, no traceback
