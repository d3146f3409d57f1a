"""Search-R1 evaluation: greedy decoding, exact match per dataset (and their unweighted average).

Reads a Search-R1 ``test.parquet`` (``agentgym retriever prep``), keeps the rows of the requested
datasets (``data_source``), runs every question through ``SearchQA-v0`` with the given policy and
retriever, and reports EM per dataset, as Search-R1's tables do (``docs/search_r1_protocol.md``:
"Evaluation: greedy decoding, EM per dataset"; the average is over the datasets, unweighted).

    python benchmarks/search_r1/evaluate.py --model runs/search_r1/ppo_qwen2.5-3b-instruct/checkpoints/step_001005/model \\
        --tokenizer Qwen/Qwen2.5-3B-Instruct --questions data/search_r1/test.parquet \\
        --retriever http://127.0.0.1:8000 --datasets nq --out results/ppo_3b_it/nq.json

``--model`` is a model directory, hub id, ``smollm2``, or ``oracle`` (the env's scripted reference
policy: a check of the data and retriever plumbing). Trainer checkpoints hold weights only, so pass
the base model as ``--tokenizer``. ``--retrieval none|rag`` evaluates the no-search and RAG baselines
(one generation per question).

Search-R1's own files work as they are: its parquets (``nq_search.py`` and the ``qa_search_*_merge.py``
scripts; the baselines' ``nq.py`` and ``nq_rag.py``) give their ``prompt`` column to the model verbatim
(``--prompt auto``, the default), and ``--retriever`` may be its ``e5_Flat.index`` with ``--corpus`` (its
wiki-18 jsonl) and ``--encoder`` (default intfloat/e5-base-v2). ``--scorer qa_em`` scores as Search-R1's
``qa_em.py`` does (whole sequence); the default ``em`` scores the answer the episode ended with.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any, Sequence


def log(msg: str) -> None:
    print(f"[{datetime.now().strftime('%H:%M:%S')}] {msg}", flush=True)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", required=True, help="model dir | hub id | smollm2 | oracle")
    p.add_argument("--tokenizer", default=None, help="default: --model (trainer checkpoints: the base model)")
    p.add_argument("--questions", required=True, help="Search-R1 test.parquet")
    p.add_argument("--retriever", default="http://127.0.0.1:8000",
                   help="retrieval server URL, index directory, a Search-R1 faiss file (*.index) with --corpus, "
                        "or dense|bm25 with --corpus")
    p.add_argument("--corpus", default=None, help="corpus jsonl (for dense|bm25, or the one a *.index was built from)")
    p.add_argument("--encoder", default="intfloat/e5-base-v2",
                   help="query encoder of a Search-R1 *.index (mean pooling, 'query: ' prefix, 256 tokens)")
    p.add_argument("--prompt", choices=["auto", "parquet", "template"], default="auto",
                   help="auto: a Search-R1-made parquet's prompt column as is, else the built template")
    p.add_argument("--scorer", choices=["em", "subem", "qa_em", "qa_subem"], default="em",
                   help="em: the answer the episode ended with; qa_em: Search-R1's whole-sequence qa_em.py")
    p.add_argument("--datasets", default=None, help="comma-separated data_source values (default: all in the file)")
    p.add_argument("--limit", type=int, default=None, help="first N questions per dataset (smoke runs)")
    p.add_argument("--retrieval", choices=["agentic", "none", "rag"], default="agentic")
    p.add_argument("--topk", type=int, default=3)
    p.add_argument("--max-turns", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=500)
    p.add_argument("--max-obs-tokens", type=int, default=500)
    p.add_argument("--max-context-tokens", type=int, default=4596)
    p.add_argument("--batch-size", type=int, default=64, help="episodes per rollout call")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None, help="torch dtype name; default bf16 on CUDA, fp32 on CPU")
    p.add_argument("--out", default=None, help="JSON file with per-dataset EM and per-question results")
    return p.parse_args(argv)


def load_policy(args: argparse.Namespace) -> Any:
    from agentgym.policies.models import load_model, load_tokenizer
    from agentgym.policies.scripted import ScriptedPolicy
    from agentgym.policies.transformers_policy import TransformersPolicy
    if args.model == "oracle":
        from agentgym.envs.searchqa.env import SearchQAEnv
        return ScriptedPolicy(load_tokenizer(args.tokenizer or "smollm2"), SearchQAEnv.oracle)
    import torch
    dtype = getattr(torch, args.dtype) if args.dtype else None
    model = load_model(args.model, device=args.device, dtype=dtype)
    return TransformersPolicy(model, load_tokenizer(args.tokenizer or args.model), name=args.model)


def select_rows(rows: list[dict], datasets: Sequence[str] | None, limit: int | None) -> dict[str, list[int]]:
    """Row indices per data_source, in file order (first ``limit`` of each)."""
    by_source: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        by_source[r.get("data_source", "unknown")].append(i)
    wanted = list(datasets) if datasets else list(by_source)
    missing = [d for d in wanted if d not in by_source]
    if missing:
        raise SystemExit(f"error: no rows with data_source {missing}; the file has {sorted(by_source)}")
    return {d: by_source[d][:limit] for d in wanted}


def env_kwargs_for(args: argparse.Namespace, rows: list[dict]) -> dict[str, Any]:
    """``SearchQAEnv`` arguments for these settings and question rows."""
    from agentgym.envs.searchqa.data import load_corpus_jsonl

    retriever: Any = args.retriever
    corpus = None
    if str(args.retriever).endswith(".index"):  # a faiss file built by Search-R1: it needs its corpus and encoder
        if not args.corpus:
            raise SystemExit(f"error: --retriever {args.retriever} is a Search-R1 faiss file: give its corpus "
                             "jsonl with --corpus")
        retriever = {"index": args.retriever, "corpus": args.corpus, "model": args.encoder}
    elif args.corpus:
        corpus = load_corpus_jsonl(args.corpus)
    data: dict[str, Any] = {"questions": rows, **({"corpus": corpus} if corpus is not None else {})}
    env_kwargs: dict[str, Any] = dict(protocol="search_r1", retrieval=args.retrieval, retriever=retriever,
                                      topk=args.topk, data=data, prompt=args.prompt, scorer=args.scorer)
    if args.retrieval == "agentic":
        env_kwargs.update(max_turns=args.max_turns, forced_answer=True)
    else:  # Search-R1's baselines: one generation
        env_kwargs.update(max_turns=1, forced_answer=False)
    return env_kwargs


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from agentgym.envs.searchqa.data import load_search_r1_parquet
    from agentgym.envs.searchqa.env import SearchQAEnv
    from agentgym.policy import SamplingParams
    from agentgym.rollout_config import RolloutConfig
    from agentgym.rollout import RolloutEngine

    rows = load_search_r1_parquet(args.questions)
    plan = select_rows(rows, args.datasets.split(",") if args.datasets else None, args.limit)
    env_kwargs = env_kwargs_for(args, rows)

    def make_env() -> SearchQAEnv:
        return SearchQAEnv(**env_kwargs)

    policy = load_policy(args)
    engine = RolloutEngine(policy, RolloutConfig(sampling=SamplingParams(max_new_tokens=args.max_new_tokens, greedy=True),
                                                 max_obs_tokens=args.max_obs_tokens,
                                                 max_context_tokens=args.max_context_tokens))
    results: dict[str, Any] = {}
    questions: list[dict[str, Any]] = []
    t_all = time.perf_counter()
    try:
        for source, indices in plan.items():
            t0, correct = time.perf_counter(), 0
            for start in range(0, len(indices), args.batch_size):
                chunk = indices[start:start + args.batch_size]
                batch = engine.collect(make_env, task_indices=chunk, seed=0)
                for idx, traj in zip(chunk, batch.trajectories):
                    ok = bool(traj.episode.get("success"))
                    correct += ok
                    questions.append({"data_source": source, "index": idx, "id": rows[idx]["id"], "em": float(ok),
                                      "answer": next((m["content"] for m in reversed(traj.messages)
                                                      if m["role"] == "assistant"), ""),
                                      "searches": traj.episode.get("searches", 0), "turns": traj.num_turns})
                done = min(start + args.batch_size, len(indices))
                log(f"{source}: {done}/{len(indices)} EM {correct / done:.3f} ({time.perf_counter() - t0:.0f} s)")
            results[source] = {"em": correct / len(indices) if indices else float("nan"), "n": len(indices)}
    finally:
        engine.close()
    ems = [r["em"] for r in results.values()]
    summary = {"model": args.model, "retrieval": args.retrieval, "questions": args.questions,
               "per_dataset": results, "average_em": sum(ems) / len(ems) if ems else float("nan"),
               "settings": {k: v for k, v in vars(args).items() if k not in ("out",)},
               "wall_s": time.perf_counter() - t_all}
    print("| dataset | n | EM |\n|---|---:|---:|")
    for source, r in results.items():
        print(f"| {source} | {r['n']} | {r['em']:.3f} |")
    print(f"| average (unweighted over {len(results)}) | | {summary['average_em']:.3f} |")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({**summary, "per_question": questions}, indent=1))
        log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: the scripts' shared helpers
    from _common import run_interruptible
    sys.exit(run_interruptible(main))   # Ctrl-C: one line and status 130, no traceback
