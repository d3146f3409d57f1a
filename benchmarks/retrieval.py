"""Retrieval throughput (in-process vs HTTP) and recall@k (dense flat / hnsw / ivf vs BM25).

    python benchmarks/retrieval.py [--docs 1000] [--queries 256] [--threads N]
                                   [--server process|thread] [--out results.json]

On the synthetic corpus of ``agentgym.envs.services.retrieval.synthetic_corpus`` (invented people, one
gold passage per question), with the packaged all-MiniLM-L6-v2 on CPU:

(1) Queries/s of the same retriever and the same queries: in-process ``search`` in batches of
    1, 16 and 64; through the HTTP server (loopback, Search-R1 protocol) with one sequential
    client and with 8 concurrent clients, one query per request. The server coalesces queued
    requests into one ``search`` call; the mean batch size it reached is reported. By default the
    server is its own process loading the saved index (as ``agentgym retriever serve`` runs it);
    ``--server thread`` runs it in a thread of this process instead, where clients and server
    share one GIL (on a busy 2-core machine that added ~40 ms per request, measured).
(2) recall@1/3/5 of the gold passage for dense flat / hnsw / ivf (same query embeddings, so only
    the index differs) and BM25, over one question per passage.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator

import faiss
import httpx
import numpy as np
import torch

from agentgym.envs.services.retrieval import (
    BM25Retriever,
    DenseRetriever,
    Hit,
    RemoteRetriever,
    Retriever,
    create_app,
    synthetic_corpus,
)
from agentgym.envs.services.retrieval.dense import auto_nlist
from agentgym.http_server import BackgroundServer

KS = (1, 3, 5)
BATCH_SIZES = (1, 16, 64)
CLIENTS = 8


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def in_process_qps(retriever: Retriever, queries: list[str], batch: int, topk: int) -> float:
    def run() -> None:
        for start in range(0, len(queries), batch):
            retriever.search(queries[start : start + batch], topk)

    return len(queries) / timed(run)


def http_qps(url: str, queries: list[str], clients: int, topk: int) -> tuple[float, float]:
    """(queries/s, mean queries per server-side batch), one query per request."""
    before = httpx.get(url + "/health", timeout=30).json()
    remote = RemoteRetriever(url, timeout_s=120, max_retries=0)
    errors: list[BaseException] = []

    def work(part: list[str]) -> None:
        try:
            for q in part:
                remote.search_one(q, topk)
        except BaseException as e:  # reported after the run
            errors.append(e)

    threads = [threading.Thread(target=work, args=(queries[i::clients],)) for i in range(clients)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join(600)
    elapsed = time.perf_counter() - t0
    remote.close()
    if errors or any(th.is_alive() for th in threads):
        raise RuntimeError(f"HTTP benchmark failed: {errors[:1] or 'clients still running after 600 s'}")
    after = httpx.get(url + "/health", timeout=30).json()
    batches = max(after["batches"] - before["batches"], 1)
    return len(queries) / elapsed, len(queries) / batches


_SERVE = (
    "import sys; from agentgym.envs.services.retrieval import load_retriever, serve; "
    "serve(load_retriever(sys.argv[1]), port=int(sys.argv[2]), log_level='warning')"
)


@contextlib.contextmanager
def running_server(retriever: DenseRetriever | BM25Retriever, mode: str, start_timeout_s: float = 300) -> Iterator[str]:
    """URL of a retrieval server for ``retriever``: a subprocess serving its saved index, or a thread."""
    if mode == "thread":
        with BackgroundServer(create_app(retriever)) as srv:
            yield srv.url
        return
    with tempfile.TemporaryDirectory() as tmp:
        retriever.save(tmp)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = subprocess.Popen([sys.executable, "-c", _SERVE, tmp, str(port)])
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + start_timeout_s
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"server process exited with {proc.returncode}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"server not up after {start_timeout_s} s")
                try:
                    if httpx.get(url + "/health", timeout=5).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.2)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(20)


def recall(results: list[list[Hit]], gold: list[str]) -> dict[int, float]:
    return {k: float(np.mean([g in [h.doc_id for h in hits[:k]] for g, hits in zip(gold, results)])) for k in KS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=1000, help="passages in the synthetic corpus")
    ap.add_argument("--queries", type=int, default=256, help="queries for the throughput runs")
    ap.add_argument("--topk", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch/faiss threads (default: library default)")
    ap.add_argument("--server", choices=["process", "thread"], default="process")
    ap.add_argument("--out", default=None, help="write the raw numbers as JSON")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
        faiss.omp_set_num_threads(args.threads)
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # for the server process

    machine = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "faiss": faiss.__version__,
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }

    docs, all_questions = synthetic_corpus(args.docs, seed=0)
    kinds = ["birthplace", "year", "creator", "profession"]
    questions = [q for q in all_questions if q.kind == kinds[int(q.doc_id) % 4]]  # one per passage
    gold = [q.doc_id for q in questions]
    texts = [q.question for q in questions]
    rng = np.random.default_rng(0)
    bench_queries = [texts[i] for i in rng.choice(len(texts), size=min(args.queries, len(texts)), replace=False)]

    builds: dict[str, float] = {}
    flat = DenseRetriever(index_type="flat")
    flat.encode_queries(["warm-up"])
    t0 = time.perf_counter()
    passage_emb = flat.encode_passages([d["contents"] for d in docs])
    t_enc = time.perf_counter() - t0
    dense = {
        "flat": flat,
        "hnsw": DenseRetriever(index_type="hnsw"),
        "ivf": DenseRetriever(index_type="ivf"),  # auto nlist (4·sqrt(n), >= 39 points per list), nprobe 8
    }
    nlist = auto_nlist(args.docs)
    dense["ivf-wide"] = DenseRetriever(index_type="ivf", nlist=nlist, nprobe=max(8, nlist // 2))
    for name, r in dense.items():
        builds[f"dense-{name}"] = timed(lambda r=r: r.build(docs, embeddings=passage_emb))
    bm25 = BM25Retriever()
    builds["bm25"] = timed(lambda: bm25.build(docs))

    # (2) recall
    t0 = time.perf_counter()
    query_emb = flat.encode_queries(texts)
    t_qenc = time.perf_counter() - t0
    recalls: dict[str, dict[int, float]] = {}
    search_only_qps: dict[str, float] = {}
    for name, r in dense.items():
        t0 = time.perf_counter()
        res = r.search_embeddings(query_emb, max(KS))
        search_only_qps[f"dense-{name}"] = len(texts) / (time.perf_counter() - t0)
        recalls[f"dense-{name}"] = recall(res, gold)
    t0 = time.perf_counter()
    res = bm25.search(texts, max(KS))
    search_only_qps["bm25"] = len(texts) / (time.perf_counter() - t0)
    recalls["bm25"] = recall(res, gold)

    # (1) throughput, same retriever and queries in-process and over HTTP
    throughput: dict[str, dict[str, float]] = {}
    for name, r in (("dense-flat", flat), ("bm25", bm25)):
        row: dict[str, float] = {}
        r.search(bench_queries[:8], args.topk)  # warm-up
        for b in BATCH_SIZES:
            row[f"in-process b={b}"] = in_process_qps(r, bench_queries, b, args.topk)
        with running_server(r, args.server) as url:
            http_qps(url, bench_queries[:8], 1, args.topk)  # warm-up (connections, first request)
            row["HTTP 1 client"], _ = http_qps(url, bench_queries, 1, args.topk)
            row[f"HTTP {CLIENTS} clients"], row["server mean batch"] = http_qps(url, bench_queries, CLIENTS, args.topk)
        throughput[name] = row
    machine["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]

    print(f"## Retrieval benchmark ({args.docs} synthetic passages, all-MiniLM-L6-v2 on CPU, topk={args.topk})\n")
    print(f"machine: {machine['cpus']} CPUs, torch threads {machine['torch_threads']}, load average "
          f"{machine['loadavg_start']} at start, {machine['loadavg_end']} at end; {machine['platform']}\n")
    print(f"passage encoding: {args.docs / t_enc:.0f} passages/s; query encoding (batch {flat.query_batch_size}): "
          f"{len(texts) / t_qenc:.0f} queries/s\n")
    print(f"### Throughput, queries/s ({len(bench_queries)} queries; HTTP = 1 query per request, "
          f"server in a {args.server})\n")
    cols = [f"in-process b={b}" for b in BATCH_SIZES] + ["HTTP 1 client", f"HTTP {CLIENTS} clients", "server mean batch"]
    print("| retriever | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for name, row in throughput.items():
        print(f"| {name} | " + " | ".join(f"{row[c]:.1f}" for c in cols) + " |")
    print(f"\n### recall@k of the gold passage ({len(texts)} questions, one per passage)\n")
    print("| retriever | " + " | ".join(f"recall@{k}" for k in KS) + " | build s | search-only q/s |")
    print("|---|" + "---:|" * (len(KS) + 2))
    for name, rec in recalls.items():
        print(f"| {name} | " + " | ".join(f"{rec[k]:.3f}" for k in KS) + f" | {builds[name]:.2f} | {search_only_qps[name]:.0f} |")
    ivf, wide = dense["ivf"], dense["ivf-wide"]
    print(f"\nhnsw: M={dense['hnsw'].hnsw_m}, efSearch={dense['hnsw'].ef_search}; ivf: nlist={ivf.nlist}, "
          f"nprobe={min(ivf.nprobe, ivf.nlist or ivf.nprobe)} (default); ivf-wide: same lists, nprobe={wide.nprobe}. "
          f"Dense build times exclude encoding (shared). "
          f"search-only q/s: dense = faiss search on pre-encoded queries; bm25 = tokenise + score.")

    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "machine": machine, "passages_per_s": args.docs / t_enc,
                       "query_encode_per_s": len(texts) / t_qenc, "throughput_qps": throughput,
                       "recall": {n: {str(k): v for k, v in r.items()} for n, r in recalls.items()},
                       "build_s": builds, "search_only_qps": search_only_qps}, f, indent=2)


if __name__ == "__main__":
    from _common import run_interruptible   # benchmarks/ is sys.path[0] when this runs as a script
    raise SystemExit(run_interruptible(main))   # Ctrl-C: one line and status 130, no traceback
