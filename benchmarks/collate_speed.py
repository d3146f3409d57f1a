"""Host-side collation of an update's trajectories into tensors (``algorithms.loop.batch.collate``), timed.

Issue 49: on the H200 most of our update's lag behind TRL was host time with no kernel under it, and
collating ``Trajectory`` objects from Python lists is part of it. This times ``collate`` on a batch of
the benchmark's shape (default 32 trajectories x (256 prompt + 256 response) tokens, 4 turns each)
and, with ``--baseline-rev REV``, the ``collate`` of another commit side by side in the same process
(its ``algorithms/loop/batch.py`` is read with ``git show`` and loaded beside ours), checking both give the
same tensors.

    python benchmarks/collate_speed.py --baseline-rev f402ca4 --repeats 30
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from agentgym.algorithms.loop.batch import collate
from agentgym.trajectory import Trajectory

ROOT = Path(__file__).resolve().parents[1]


def make_trajectories(n: int, prompt: int, response: int, turns: int, seed: int = 0) -> list[Trajectory]:
    """``n`` multi-turn trajectories: a prompt, then ``turns`` policy spans with environment tokens between."""
    rng = random.Random(seed)
    out = []
    for g in range(n):
        ids, mask, lps, kinds, spans = [], [], [], [], []
        ids += [rng.randrange(49152) for _ in range(prompt)]
        mask += [0] * prompt
        lps += [0.0] * prompt
        kinds += ["prompt"] * prompt
        per = max(1, response // (2 * turns))
        for _ in range(turns):
            start = len(ids)
            ids += [rng.randrange(49152) for _ in range(per)]
            mask += [1] * per
            lps += [-rng.random() for _ in range(per)]
            kinds += ["policy"] * per
            spans.append((start, len(ids)))
            ids += [rng.randrange(49152) for _ in range(per)]
            mask += [0] * per
            lps += [0.0] * per
            kinds += ["retrieved"] * per
        out.append(Trajectory(token_ids=ids, loss_mask=mask, logprobs=lps, prompt_length=prompt, turn_spans=spans,
                              actions=["a"] * turns, finish_reasons=["stop"] * turns,
                              step_rewards=[rng.random() for _ in spans], reward_terms=[{} for _ in spans],
                              messages=[], token_kinds=kinds, group_id=g // 8))
    return out


def load_collate_at(rev: str):
    """``collate`` as it was at commit ``rev``."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:algorithms/loop/batch.py"], capture_output=True,
                            text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "batch_at_rev.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("batch_at_rev", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.collate


def time_it(fn, trajectories, repeats: int) -> list[float]:
    fn(trajectories)  # warm-up
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(trajectories)
        out.append(time.perf_counter() - t0)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--response", type=int, default=256)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--baseline-rev", default=None, help="also time collate at this git commit, side by side")
    args = ap.parse_args(argv)
    if min(args.batch, args.prompt, args.response, args.turns, args.repeats) < 1:
        print("collate_speed.py: --batch, --prompt, --response, --turns and --repeats must be >= 1", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    trajectories = make_trajectories(args.batch, args.prompt, args.response, args.turns)
    sides = {"ours": collate}
    if args.baseline_rev:
        sides[f"at {args.baseline_rev}"] = load_collate_at(args.baseline_rev)
        a, b = collate(trajectories), sides[f"at {args.baseline_rev}"](trajectories)
        same = all(torch.equal(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__)
        print(f"same tensors as {args.baseline_rev}: {same}")
    times = {name: time_it(fn, trajectories, args.repeats) for name, fn in sides.items()}
    print(f"collate of {args.batch} x ({args.prompt} + {args.response}) tokens, {args.turns} turns, 1 torch thread,"
          f" {args.repeats} repeats")
    print(f"{'side':>16}  {'min ms':>8}  {'median ms':>9}  {'max ms':>8}")
    for name, ts in times.items():
        print(f"{name:>16}  {min(ts) * 1e3:8.2f}  {statistics.median(ts) * 1e3:9.2f}  {max(ts) * 1e3:8.2f}")
    if len(times) == 2:
        (_, ours), (_, base) = times.items()
        print(f"median ratio baseline / ours: {statistics.median(base) / statistics.median(ours):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
