"""Sandbox throughput: executions per second of each backend, with bare ``python`` as the floor.

    python benchmarks/sandbox.py [--runs 30] [--threads 1 2] [--backends docker bwrap subprocess]
                                 [--pool-size 2] [--out FILE]

Two programs: ``print(1)`` (pure overhead) and a small test-running program of the kind the
CodeExec env runs as its reward check (a ``solution.py`` passed in ``files`` + 8 unittest cases).
Each backend runs each program ``--runs`` times from 1 caller thread (latency-bound) and from
several threads (throughput-bound; the env steps episodes concurrently). The docker pool is
warmed up first, so the numbers are steady state: every run still gets a fresh container (the
pool recycles after each task), which is what bounds docker's rate. The floor runs the same
interpreter directly (``python -c`` / ``python main.py`` in a prepared dir): no isolation,
no limits, no files written per run.
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

from agentgym.envs.sandbox import available_backends, make_sandbox

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


def floor_python() -> str:
    """The interpreter the local backends use here (the system one when we are root)."""
    return "/usr/bin/python3" if os.geteuid() == 0 and os.path.exists("/usr/bin/python3") \
        else sys.executable


def bare_runner(code: str, files: dict[str, str]) -> tuple[Callable[[], bool], Callable[[], None]]:
    work = tempfile.mkdtemp(prefix="agentgym-bench-")
    for name, text in {"main.py": code, **files}.items():
        with open(os.path.join(work, name), "w") as f:
            f.write(text)
    py = floor_python()

    def once() -> bool:
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


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "machine": platform.machine(),
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
    ap.add_argument("--runs", type=int, default=30, help="runs per cell")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--backends", nargs="+", default=["docker", "bwrap", "subprocess"])
    ap.add_argument("--pool-size", type=int, default=2, help="docker warm pool size")
    ap.add_argument("--out", default=None, help="write the raw numbers as JSON")
    args = ap.parse_args()

    status = available_backends()
    rows: list[dict] = []

    def floor(program: str, threads: int) -> dict:
        """Bare python, measured right before each cell: a shared machine's load drifts."""
        code, files = PROGRAMS[program]
        once, cleanup = bare_runner(code, files)
        try:
            once()  # warm the page cache
            return measure(once, args.runs, threads)
        finally:
            cleanup()

    for backend in args.backends:
        if status.get(backend) != "ok":
            print(f"[bench] skipping {backend}: {status.get(backend)}", file=sys.stderr)
            continue
        opts = {"pool_size": max(args.pool_size, max(args.threads))} if backend == "docker" \
            else {}
        # allow_unsafe: the subprocess backend is measured on purpose (trusted benchmark code)
        with make_sandbox(backend, allow_unsafe=True, **opts) as sb:
            for program, (code, files) in PROGRAMS.items():
                def once(code=code, files=files) -> bool:
                    return sb.run(code, files=files, time_limit_s=10).ok
                for _ in range(3):  # warm-up (fills the docker pool)
                    once()
                for threads in args.threads:
                    base = floor(program, threads)
                    rows.append({"backend": backend, "program": program,
                                 **measure(once, args.runs, threads),
                                 "bare_exec_per_s": base["exec_per_s"]})
                    print(f"[bench] {backend:10s} {program:12s} threads={threads} "
                          f"{rows[-1]['exec_per_s']:.1f}/s (bare {base['exec_per_s']:.1f}/s)",
                          file=sys.stderr)

    print(f"\nSandbox executions per second ({', '.join(f'{k} {v}' for k, v in versions().items())})")
    print(f"bare python = {floor_python()} run directly, measured just before each row\n")
    print("| backend | program | caller threads | exec/s | bare python exec/s | ratio | median ms | p90 ms | failures |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['backend']} | {r['program']} | {r['threads']} | {r['exec_per_s']:.1f} | "
              f"{r['bare_exec_per_s']:.1f} | {r['exec_per_s'] / r['bare_exec_per_s']:.2f} | "
              f"{r['median_ms']:.0f} | {r['p90_ms']:.0f} | {r['failures']} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": versions(), "runs": args.runs, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    from _common import run_interruptible   # benchmarks/ is sys.path[0] when this runs as a script
    raise SystemExit(run_interruptible(main))   # Ctrl-C: one line and status 130, no traceback
