"""Load test of the retrieval server on loopback: N concurrent clients for a fixed time.

    python benchmarks/retrieval_server_load.py [--clients 32] [--duration-s 60] [--index bundled]
                                               [--server-threads 1] [--out results.json]

Starts ``agentgym retriever serve`` as its own process on 127.0.0.1 (a free port), exactly as a
user runs it (default: the bundled SearchQA world, dense all-MiniLM-L6-v2 + faiss flat, the
SearchQA-v0 default), then runs ``--clients`` concurrent clients (asyncio + httpx, one query per
request, Search-R1 protocol, topk 3, the bundled training questions in turn) for ``--duration-s``
seconds, and stops the server. Bounded: the run ends at the duration or after ``--max-requests``,
every request has a timeout, and the server is terminated (then killed) whatever happens.

Reports requests/s, latency p50/p90/p99/max, errors (a non-200 reply, a transport error or a reply
of the wrong shape; the exit status is 1 if there was any) and the server's mean batch size (it
coalesces concurrent requests into one encoder call). The load average is recorded before and after:
on a 2-core machine the numbers mean little when other jobs run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np


def start_server(index: str, max_request_bytes: int, threads: int, timeout_s: float) -> tuple[subprocess.Popen, str]:
    """``agentgym retriever serve INDEX --port 0``; returns the process and its /retrieve URL."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "agentgym.app.cli", "retriever", "serve", index, "--port", "0",
           "--max-request-bytes", str(max_request_bytes)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert proc.stdout is not None
    seen: list[str] = []
    watchdog = threading.Timer(timeout_s, proc.kill)  # a server that never says "serving" is ended
    watchdog.start()
    try:
        for line in proc.stdout:  # "serving ... on URL" comes once the port is bound and the index loaded
            if line.startswith("serving "):
                break
            seen.append(line)
        else:
            stop_server(proc)
            raise RuntimeError(f"server did not start (exit {proc.returncode}): {''.join(seen[-5:])}")
    finally:
        watchdog.cancel()
    url = line.split(" on ", 1)[1].split()[0]
    # Keep reading the server's output (uvicorn's access log): a full pipe would block its event loop.
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
    health = url.rsplit("/", 1)[0] + "/health"
    deadline = time.monotonic() + timeout_s
    while True:  # the socket is bound before uvicorn runs: wait until it answers
        try:
            if httpx.get(health, timeout=5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_server(proc)
            raise RuntimeError("server did not answer /health")
        time.sleep(0.2)


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def load(url: str, queries: list[str], clients: int, duration_s: float, max_requests: int,
               topk: int, timeout_s: float) -> tuple[list[float], Counter, float]:
    """Run ``clients`` workers until the deadline; returns latencies (s), error kinds, elapsed s."""
    latencies: list[float] = []
    errors: Counter = Counter()
    issued = 0
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as http:
        start = time.perf_counter()
        deadline = start + duration_s

        async def worker(w: int) -> None:
            nonlocal issued
            i = w
            while time.perf_counter() < deadline and issued < max_requests:
                issued += 1
                body = {"queries": [queries[i % len(queries)]], "topk": topk, "return_scores": True}
                i += clients
                t0 = time.perf_counter()
                try:
                    r = await http.post(url, json=body)
                except httpx.HTTPError as e:
                    errors[type(e).__name__] += 1
                    continue
                dt = time.perf_counter() - t0
                if r.status_code != 200:
                    errors[f"HTTP {r.status_code}"] += 1
                    continue
                result = r.json().get("result")
                if not (isinstance(result, list) and len(result) == 1 and 0 < len(result[0]) <= topk):
                    errors["bad reply"] += 1
                    continue
                latencies.append(dt)

        # the workers stop by themselves at the deadline; the outer timeout is a backstop
        await asyncio.wait_for(asyncio.gather(*(worker(w) for w in range(clients))),
                               timeout=duration_s + timeout_s + 30)
        elapsed = time.perf_counter() - start
    return latencies, errors, elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--duration-s", type=float, default=60.0)
    ap.add_argument("--max-requests", type=int, default=1_000_000, help="stop after this many requests")
    ap.add_argument("--index", default="bundled", help="index directory, or 'bundled' (dense, bundled world)")
    ap.add_argument("--topk", type=int, default=3)
    ap.add_argument("--server-threads", type=int, default=1, help="OMP/MKL threads of the server process")
    ap.add_argument("--max-request-bytes", type=int, default=1 << 20)
    ap.add_argument("--timeout-s", type=float, default=30.0, help="per request")
    ap.add_argument("--out", default=None, help="write the numbers as JSON")
    args = ap.parse_args()
    if args.clients < 1 or args.duration_s <= 0 or args.max_requests < 1:
        ap.error("--clients, --duration-s and --max-requests must be positive")

    from agentgym.envs.searchqa.data import bundled_dataset
    # questions that need a search: a no-search one ("What is 6 times 9?") can rightly match no passage
    queries = [q["question"] for q in bundled_dataset()[1] if q.get("needs_search", True)]
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    proc, url = start_server(args.index, args.max_request_bytes, args.server_threads, timeout_s=300)
    startup_s = time.perf_counter() - t0
    try:
        health_url = url.rsplit("/", 1)[0] + "/health"
        before = httpx.get(health_url, timeout=30).json()
        latencies, errors, elapsed = asyncio.run(load(url, queries, args.clients, args.duration_s,
                                                      args.max_requests, args.topk, args.timeout_s))
        after = httpx.get(health_url, timeout=30).json()
    finally:
        stop_server(proc)
    load_after = os.getloadavg()

    lat_ms = np.asarray(latencies) * 1000 if latencies else np.zeros(1)
    batches = after["batches"] - before["batches"]
    served = after["requests"] - before["requests"]
    n_errors = sum(errors.values())
    result = {
        "clients": args.clients, "duration_s": round(elapsed, 1), "requests_ok": len(latencies),
        "errors": n_errors, "error_kinds": dict(errors), "requests_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(float(np.percentile(lat_ms, 50)), 1), "p90_ms": round(float(np.percentile(lat_ms, 90)), 1),
        "p99_ms": round(float(np.percentile(lat_ms, 99)), 1), "max_ms": round(float(lat_ms.max()), 1),
        "server_mean_batch": round(served / batches, 2) if batches else None,
        "server": {"index": args.index, "kind": after.get("kind"), "num_docs": after.get("num_docs"),
                   "threads": args.server_threads, "startup_s": round(startup_s, 1)},
        "load_avg_before": [round(x, 2) for x in load_before], "load_avg_after": [round(x, 2) for x in load_after],
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
    }
    print(f"\nRetrieval server under load: {args.clients} clients x {elapsed:.0f} s, "
          f"{result['server']['kind']} index over {result['server']['num_docs']} passages, topk {args.topk}, "
          f"server threads {args.server_threads}\n")
    print("| clients | requests | errors | requests/s | p50 ms | p90 ms | p99 ms | max ms | server mean batch |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {args.clients} | {len(latencies)} | {n_errors} | {result['requests_per_s']} | {result['p50_ms']} | "
          f"{result['p90_ms']} | {result['p99_ms']} | {result['max_ms']} | {result['server_mean_batch']} |")
    print(f"\nload average before {result['load_avg_before']}, after {result['load_avg_after']}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 1 if n_errors else 0


if __name__ == "__main__":
    from _common import run_interruptible   # benchmarks/ is sys.path[0] when this runs as a script
    raise SystemExit(run_interruptible(main))   # Ctrl-C: one line and status 130, no traceback
