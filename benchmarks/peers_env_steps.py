"""Env step rate with scripted actions: agentgym vs GEM (``gem-llm`` 0.1.0) and SkyRL-Gym (``skyrl-gym`` 0.4.0).

The peers live in a throwaway venv that shares this machine's torch/transformers (never vendored)::

    python -m venv /tmp/peers --system-site-packages
    /tmp/peers/bin/pip install gem-llm==0.1.0 skyrl-gym==0.4.0
    HF_HUB_OFFLINE=1 /tmp/peers/bin/python benchmarks/peers_env_steps.py --out benchmarks/results/peers_env_steps.json

Every side gets the same tasks and the same scripted action strings; only the env differs.

(a) Single-step math. Tasks: ``agentgym/Math-v0`` problems (train split, task indices 0..N-1). Action:
    ``<think>`` the worked steps ``</think>``, ``\\boxed{gold}``, then ``Answer: gold`` and ``#### gold``
    lines, so that every side's answer extractor finds the answer in the same text (SkyRL's ``aime`` env
    reads ``Answer:``, its ``gsm8k`` env ``#### N``). Sides: ours (``agentgym.make("Math-v0")``, reset
    by task index, i.e. the problem is generated at reset, and reset with the task dict, i.e. tasks
    pre-materialised like the peers' datasets); GEM ``MathEnv`` over an in-memory
    ``datasets.Dataset`` of the same problems, with ``use_mp=False`` (grading in-process under
    ``signal.alarm``) and with its default ``use_mp=True`` (grading in a 1-process pool); SkyRL's
    ``aime`` (boxed answers, the closest to ours) and ``gsm8k`` envs, built with ``skyrl_gym.make`` per
    episode as SkyRL does (so their "reset" is ``make`` + ``init``).
(b) Tag-protocol search (Search-R1). Tasks: the bundled SearchQA world's train questions. Episode:
    ``<think>..</think><search>QUESTION</search>`` then ``<think>..</think><answer>GOLD</answer>``.
    Sides: ours (``agentgym.make("SearchQA-v0", retriever=R)``, protocol ``search_r1``); GEM's
    ``ToolEnvWrapper(QaEnv, [SearchTool])``; SkyRL's ``search`` env. All three query the *same*
    in-process retriever object ``R`` over our bundled corpus. The peers' tools normally POST to a
    retrieval server, so this script (and only this script) replaces their HTTP call:
      - GEM: a ``SearchTool`` subclass whose ``_search`` calls ``R`` and formats the hits with GEM's own
        ``_passages2string`` (instead of ``requests.post`` + msgpack);
      - SkyRL: ``skyrl_gym.tools.search.call_search_api`` is monkeypatched to return
        ``({"result": [[hit dicts]]}, None)`` from ``R`` (the server's response shape); the rest of
        their ``SearchToolGroup.search`` (formatting, ``json.dumps``) runs unchanged.
    ``R`` is ``bm25`` (our ``BM25Retriever``, bm25s, a real search per query) and ``cached`` (the same
    hits served from a dict filled before timing: retrieval cost ~0, so only env overhead is left).

Timing: ``time.perf_counter`` around each reset/step call only (building actions, looking tasks up and
the loop are outside). Sides run in blocks of ``--math-episodes`` / ``--search-episodes`` episodes,
interleaved (the order rotates every round), after one untimed warm-up block each; medians over
``--repeats`` rounds. Every block uses tasks no earlier block used, so no memo sees a task twice
(our two math variants play the same block; ``parse_number``'s memo is emptied before each of their
blocks); within a block all sides get the same tasks (GEM's ``QaEnv`` always shuffles its dataset,
so there each block is an equally sized slice of its own permutation of the same questions).
Reported per side: µs per step including reset (``(reset + step time) / steps``; for single-step
math this is per episode), µs per ``step`` call alone, steps/s, and ``peer_over_ours``: this side's
time / each of our variants' time in the same round, median over rounds (> 1: ours is faster).

``--sides ours`` runs our envs alone (no peers needed): an A/B of two agentgym versions is this
script run with each version's interpreter, alternately (see benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import agentgym
from agentgym.envs.mathrl import answers as math_answers
from agentgym.envs.services.retrieval import BM25Retriever, Hit, Retriever
from agentgym.envs.searchqa.env import SearchQAEnv

Block = dict[str, float]


# --------------------------------------------------------------------------- shared retrievers
class CachedRetriever(Retriever):
    """``inner``'s hits for ``queries``, computed up front and served from a dict: retrieval cost ~0."""

    kind = "cached"

    def __init__(self, inner: Retriever, queries: list[str], topk: int):
        self.inner = inner
        self.cache = {(q, topk): hits for q, hits in zip(queries, inner.search(queries, topk))}

    def _search_batch(self, queries: list[str], topk: int) -> list[list[Hit]]:
        out = []
        for q in queries:
            key = (q, topk)
            if key not in self.cache:
                self.cache[key] = self.inner.search([q], topk)[0]
            out.append(self.cache[key])
        return out


# --------------------------------------------------------------------------- sides
class Side:
    """One env implementation; ``run(tasks)`` plays one scripted episode per task and times it."""

    name = "side"

    def run(self, tasks: list[dict[str, Any]]) -> Block:
        raise NotImplementedError

    def close(self) -> None:
        pass


def _block(reset_s: float, step_s: float, steps: int, episodes: int, reward: float) -> Block:
    return {"reset_s": reset_s, "step_s": step_s, "steps": steps, "episodes": episodes, "reward_sum": reward}


def _play(step: Any, actions: Any, outcome: Any) -> tuple[float, float, int]:
    """Step through scripted ``actions`` until done; only ``step(a)`` itself is timed. ``outcome``
    reads (reward, done) from what ``step`` returned. Returns (step seconds, reward sum, steps)."""
    pc, step_s, reward, steps = time.perf_counter, 0.0, 0.0, 0
    for a in actions:
        t0 = pc()
        out = step(a)
        step_s += pc() - t0
        r, done = outcome(out)
        reward += r
        steps += 1
        if done:
            break
    return step_s, reward, steps


def _gym_outcome(out: tuple) -> tuple[float, bool]:
    return out[1], out[2] or out[3]


def math_action(task: dict[str, Any]) -> str:
    gold = task["answer"]
    return ("<think>\n" + "\n".join(task["steps"]) + f"\n</think>\nThe final answer is \\boxed{{{gold}}}.\n"
            f"Answer: {gold}\n#### {gold}")


class OursMath(Side):
    def __init__(self, by_index: bool):
        self.env = agentgym.make("Math-v0")
        self.by_index = by_index
        self.name = "agentgym Math-v0" + (" (reset by index)" if by_index else " (reset with task dict)")

    def run(self, tasks):
        # Both of our variants play the same tasks: start each block with parse_number's memo empty so
        # the second one gains nothing from the first (pessimistic: common answers like "12" recur).
        if hasattr(math_answers, "_parse_number"):  # absent before the memo was added (A/B runs)
            math_answers._parse_number.cache_clear()
        pc, r_s, s_s, rew = time.perf_counter, 0.0, 0.0, 0.0
        for t in tasks:
            options = {"task_index": t["index"]} if self.by_index else {"task": t["task"]}
            t0 = pc()
            self.env.reset(options=options)
            t1 = pc()
            _, r, *_ = self.env.step(t["action"])
            t2 = pc()
            r_s += t1 - t0
            s_s += t2 - t1
            rew += r
        return _block(r_s, s_s, len(tasks), len(tasks), rew)


class GemMath(Side):
    def __init__(self, tasks, use_mp: bool):
        from datasets import Dataset
        from gem.envs.math_env import MathEnv
        ds = Dataset.from_list([{"problem": t["question"], "answer": t["answer"]} for t in tasks])
        self.env = MathEnv(dataset=ds, use_mp=use_mp, eval=True)
        self.actions = {t["question"]: t["action"] for t in tasks}
        self.name = f"GEM MathEnv (use_mp={use_mp})"

    def run(self, tasks):
        # GEM's MathEnv walks its own dataset (reshuffled each epoch); one block = one pass over the
        # same tasks, each answered with its scripted action (looked up outside the timers).
        pc, r_s, s_s, rew = time.perf_counter, 0.0, 0.0, 0.0
        for _ in tasks:
            t0 = pc()
            obs, _ = self.env.reset()
            t1 = pc()
            action = self.actions[obs]
            t2 = pc()
            _, r, *_ = self.env.step(action)
            t3 = pc()
            r_s += t1 - t0
            s_s += t3 - t2
            rew += r
        return _block(r_s, s_s, len(tasks), len(tasks), rew)

    def close(self):
        if self.env.use_mp:
            self.env.mp_pool.terminate()


class SkyMath(Side):
    def __init__(self, env_id: str):
        import skyrl_gym
        self.make, self.env_id = skyrl_gym.make, env_id
        self.key = "reward_model" if env_id == "aime" else "reward_spec"
        self.name = f"SkyRL {env_id}"

    def run(self, tasks):
        pc, r_s, s_s, rew = time.perf_counter, 0.0, 0.0, 0.0
        for t in tasks:
            extras = {self.key: {"method": "rule", "ground_truth": t["answer"]}}
            prompt = [{"role": "user", "content": t["question"]}]
            t0 = pc()
            env = self.make(self.env_id, extras=extras)   # SkyRL builds one env per episode
            env.init(prompt)
            t1 = pc()
            out = env.step(t["action"])
            t2 = pc()
            env.close()
            r_s += t1 - t0
            s_s += t2 - t1
            rew += out["reward"]
        return _block(r_s, s_s, len(tasks), len(tasks), rew)


def search_actions(q: dict[str, Any]) -> tuple[str, str]:
    return (f"<think>I need to look this up.</think><search>{q['question']}</search>",
            f"<think>I know the answer now.</think><answer>{q['answers'][0]}</answer>")


class OursSearch(Side):
    name = "agentgym SearchQA-v0 (search_r1)"

    def __init__(self, retriever: Retriever):
        self.env = agentgym.make("SearchQA-v0", retriever=retriever)

    def run(self, tasks):
        pc, r_s, s_s, rew, steps = time.perf_counter, 0.0, 0.0, 0.0, 0
        for t in tasks:
            t0 = pc()
            self.env.reset(options={"task_index": t["index"]})
            r_s += pc() - t0
            ds, dr, dn = _play(self.env.step, t["actions"], _gym_outcome)
            s_s, rew, steps = s_s + ds, rew + dr, steps + dn
        return _block(r_s, s_s, steps, len(tasks), rew)


class GemSearch(Side):
    name = "GEM ToolEnvWrapper(QaEnv, SearchTool)"

    def __init__(self, tasks, retriever: Retriever, topk: int):
        from datasets import Dataset
        from gem.envs.qa_env import QaEnv
        from gem.tools.search_tool import SearchTool
        from gem.tools.tool_env_wrapper import ToolEnvWrapper

        class InMemorySearchTool(SearchTool):
            """GEM's SearchTool with the HTTP POST replaced by a call to the shared retriever."""

            def _search(self, query: str) -> str:
                hits = retriever.search([query], self.topk)[0]
                return self._passages2string([h.to_dict() for h in hits])

        ds = Dataset.from_list([{"question": t["question"], "answer": list(t["answers"]), "qid": i}
                                for i, t in enumerate(tasks)])
        qa = QaEnv(dataset=ds, load_from_cache_file=False)
        # the templated prompt (GEM applies its template with dataset.map) -> that task's actions
        self.actions = {row["question"]: tasks[row["qid"]]["actions"] for row in qa.dataset}
        self.env = ToolEnvWrapper(qa, [InMemorySearchTool(topk=topk)], max_tool_uses=4)

    def run(self, tasks):
        pc, r_s, s_s, rew, steps = time.perf_counter, 0.0, 0.0, 0.0, 0
        for _ in tasks:
            t0 = pc()
            self.env.reset()
            r_s += pc() - t0
            ds, dr, dn = _play(self.env.step, self.actions[self.env.env.first_obs], _gym_outcome)
            s_s, rew, steps = s_s + ds, rew + dr, steps + dn
        return _block(r_s, s_s, steps, len(tasks), rew)


class SkySearch(Side):
    name = "SkyRL search"

    def __init__(self, retriever: Retriever, topk: int):
        import skyrl_gym
        import skyrl_gym.tools.search as sky_search
        from skyrl_gym.envs.search.env import SearchEnvConfig

        def call_search_api(retrieval_service_url, query, topk=3, return_scores=True, timeout=30,
                            log_requests=True, session=None):
            """Stands in for the POST to a Search-R1 retrieval server: same response shape."""
            hits = retriever.search([query], topk)[0]
            return {"result": [[h.to_dict(with_score=return_scores) for h in hits]]}, None

        sky_search.call_search_api = call_search_api   # benchmark-only monkeypatch
        self.make = skyrl_gym.make
        self.config = SearchEnvConfig(log_requests=False, topk=topk)

    def run(self, tasks):
        pc, r_s, s_s, rew, steps = time.perf_counter, 0.0, 0.0, 0.0, 0
        for t in tasks:
            extras = {"reward_spec": {"method": "rule", "ground_truth": {"target": list(t["answers"])}}, "max_turns": 5}
            prompt = [{"role": "user", "content": t["prompt"]}]
            t0 = pc()
            env = self.make("search", env_config=self.config, extras=extras)
            env.init(prompt)
            r_s += pc() - t0
            ds, dr, dn = _play(env.step, t["actions"], lambda out: (out["reward"], out["done"]))
            s_s, rew, steps = s_s + ds, rew + dr, steps + dn
            env.close()
        return _block(r_s, s_s, steps, len(tasks), rew)


# --------------------------------------------------------------------------- harness
def interleaved(sides: list[Side], blocks_of_tasks: list[list[dict[str, Any]]], label: str) -> dict[str, list[Block]]:
    """Block 0 is an untimed warm-up for every side; then one round per further block, every side
    playing that block's tasks, the side order rotating each round."""
    for s in sides:
        s.run(blocks_of_tasks[0])
    blocks: dict[str, list[Block]] = {s.name: [] for s in sides}
    rounds = blocks_of_tasks[1:]
    for r, tasks in enumerate(rounds):
        order = sides[r % len(sides):] + sides[:r % len(sides)]
        for s in order:
            gc.collect()
            blocks[s.name].append(s.run(tasks))
        per = "  ".join(f"{k}:{1e6 * (b[-1]['reset_s'] + b[-1]['step_s']) / b[-1]['steps']:.0f}"
                        for k, b in enumerate(blocks.values()))
        print(f"[{label}] round {r + 1}/{len(rounds)}  us/step incl. reset per side: {per}", flush=True)
    return blocks


def summarize(blocks: dict[str, list[Block]]) -> dict[str, Any]:
    """Medians over rounds per side, and for every side its time / each of our variants' time in the
    same round (``peer_over_ours``; > 1: ours is faster), median over rounds."""
    def us_total(b: Block) -> float:
        return 1e6 * (b["reset_s"] + b["step_s"]) / b["steps"]

    def us_step(b: Block) -> float:
        return 1e6 * b["step_s"] / b["steps"]

    ours = [n for n in blocks if n.startswith("agentgym")]
    out = {}
    for name, bl in blocks.items():
        tot = statistics.median(us_total(b) for b in bl)
        out[name] = {
            "us_per_step_incl_reset": tot,
            "us_per_step_call": statistics.median(us_step(b) for b in bl),
            "us_per_reset": statistics.median(1e6 * b["reset_s"] / b["episodes"] for b in bl),
            "steps_per_s_incl_reset": 1e6 / tot,
            "steps_per_episode": bl[0]["steps"] / bl[0]["episodes"],
            "mean_return": bl[0]["reward_sum"] / bl[0]["episodes"],
            "peer_over_ours": {o: {"incl_reset": statistics.median(us_total(b) / us_total(a) for b, a in zip(bl, blocks[o])),
                                   "step_call": statistics.median(us_step(b) / us_step(a) for b, a in zip(bl, blocks[o]))}
                               for o in ours},
            "raw_us_per_step_incl_reset": [round(us_total(b), 2) for b in bl],
            "raw_us_per_step_call": [round(us_step(b), 2) for b in bl],
        }
    return out


def print_table(title: str, summary: dict[str, Any]) -> None:
    ours = list(next(iter(summary.values()))["peer_over_ours"])
    print(f"\n{title}\n(x/ours k = this side's time / our variant k's time, same round, median; > 1: ours faster)")
    head = "".join(f" {'x/ours ' + str(k + 1):>10s} {'(step())':>9s}" for k in range(len(ours)))
    print(f"{'side':44s} {'us/step+reset':>13s} {'us/step()':>10s} {'steps/s':>9s}{head} {'return':>7s}")
    for name, s in summary.items():
        ratios = "".join(f" {s['peer_over_ours'][o]['incl_reset']:10.2f} {s['peer_over_ours'][o]['step_call']:9.2f}"
                         for o in ours)
        print(f"{name:44s} {s['us_per_step_incl_reset']:13.1f} {s['us_per_step_call']:10.1f} "
              f"{s['steps_per_s_incl_reset']:9.0f}{ratios} {s['mean_return']:7.2f}")
    for k, o in enumerate(ours):
        print(f"  ours {k + 1} = {o}")


def wanted_packages(sides: str) -> set[str]:
    want = set(sides.split(","))
    return ({"agentgym-rl", "gymnasium", "bm25s"} | ({"gem-llm", "datasets"} if "gem" in want else set())
            | ({"skyrl-gym"} if "skyrl" in want else set()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--math-episodes", type=int, default=300, help="math episodes per block")
    ap.add_argument("--search-episodes", type=int, default=100,
                    help="search episodes per block ((repeats + 1) blocks must fit in the 1000 train questions)")
    ap.add_argument("--repeats", type=int, default=9, help="timed blocks per side (interleaved), after 1 warm-up")
    ap.add_argument("--retrievers", default="bm25,cached", help="comma list of bm25, cached")
    ap.add_argument("--topk", type=int, default=3)
    ap.add_argument("--skip-gem-mp", action="store_true", help="leave out GEM MathEnv with its default use_mp=True")
    ap.add_argument("--sides", default="ours,gem,skyrl",
                    help="comma list of ours, gem, skyrl (ours alone needs no peers: A/B runs of two agentgym versions)")
    ap.add_argument("--out", default=None, help="write the raw numbers as JSON")
    args = ap.parse_args()
    import datasets
    datasets.disable_progress_bars()
    n_blocks = args.repeats + 1

    import importlib.metadata as md
    results: dict[str, Any] = {
        "machine": f"{platform.machine()} {platform.node()}, {os.cpu_count()} cpus",
        "python": platform.python_version(),
        "versions": {p: md.version(p) for p in ("agentgym-rl", "gem-llm", "skyrl-gym", "gymnasium", "datasets", "bm25s")
                     if p in wanted_packages(args.sides)},
        "agentgym_path": os.path.dirname(agentgym.__file__),
        "load_avg_start": os.getloadavg(),
        "args": vars(args),
    }

    # (a) math: fresh task indices for every block
    probe = agentgym.make("Math-v0").unwrapped
    math_tasks = []
    for i in range(n_blocks * args.math_episodes):
        task = probe.get_task(i)
        math_tasks.append({"index": i, "task": task, "question": task["question"], "answer": task["answer"],
                           "action": math_action(task)})
    print(f"[math] {len(math_tasks)} tasks generated", flush=True)
    want = set(args.sides.split(","))
    sides: list[Side] = [OursMath(by_index=True), OursMath(by_index=False)]
    if "gem" in want:
        sides.append(GemMath(math_tasks, use_mp=False))
        if not args.skip_gem_mp:
            sides.append(GemMath(math_tasks, use_mp=True))
    if "skyrl" in want:
        sides += [SkyMath("aime"), SkyMath("gsm8k")]
    chunks = [math_tasks[b * args.math_episodes:(b + 1) * args.math_episodes] for b in range(n_blocks)]
    blocks = interleaved(sides, chunks, "math")
    for s in sides:
        s.close()
    results["math"] = summarize(blocks)
    print_table(f"(a) single-step math, {args.math_episodes} episodes x {args.repeats} blocks", results["math"])

    # (b) search
    base = SearchQAEnv(retriever="bm25")
    bm25 = BM25Retriever().build(list(base.corpus))
    n = n_blocks * args.search_episodes
    if n > len(base.questions):
        raise SystemExit(f"(repeats + 1) * search-episodes = {n} > {len(base.questions)} questions")
    search_tasks = []
    for i, q in enumerate(base.questions[:n]):
        search_tasks.append({"index": i, "question": q["question"], "answers": list(q["answers"]),
                             "prompt": base.initial_messages(q)[0]["content"], "actions": search_actions(q)})
    chunks = [search_tasks[b * args.search_episodes:(b + 1) * args.search_episodes] for b in range(n_blocks)]
    for kind in args.retrievers.split(","):
        retriever: Retriever = bm25 if kind == "bm25" else CachedRetriever(bm25, [t["question"] for t in search_tasks], args.topk)
        sides = [OursSearch(retriever)]
        if "gem" in want:
            sides.append(GemSearch(search_tasks, retriever, args.topk))
        if "skyrl" in want:
            sides.append(SkySearch(retriever, args.topk))
        blocks = interleaved(sides, chunks, f"search/{kind}")
        results[f"search_{kind}"] = summarize(blocks)
        print_table(f"(b) search ({kind} retriever), {args.search_episodes} episodes x {args.repeats} blocks",
                    results[f"search_{kind}"])

    results["load_avg_end"] = os.getloadavg()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    from _common import run_interruptible   # benchmarks/ is sys.path[0] when this runs as a script
    raise SystemExit(run_interruptible(main))   # Ctrl-C: one line and status 130, no traceback
