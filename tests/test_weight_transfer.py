"""Weight pushes from the trainer to Ray rollout workers over a collective (issue 15): a real local Ray
cluster, a real gloo process group (the NCCL path is the same code with another backend), the tiny model.
"""

from __future__ import annotations

import copy
import gc
import os
import signal
import threading
import time

import pytest
import torch

ray = pytest.importorskip("ray", reason="ray not installed: bash scripts/setup.sh installs it")

from agentgym.policies.ray_pool import (  # noqa: E402
    RayPolicyPool, _pack, _unpack, collective_backend, plan_buckets, tensor_digest)
from agentgym.policies.transformers_policy import TransformersPolicy  # noqa: E402
from agentgym.policy import SamplingParams  # noqa: E402
from helpers_processes import wait_until_gone  # noqa: E402

GREEDY = SamplingParams(max_new_tokens=6, greedy=True)


pytestmark = pytest.mark.usefixtures("ray_cluster")   # tests/conftest.py: a local Ray cluster


@pytest.fixture(scope="module")
def local():
    return TransformersPolicy.tiny_random(seed=0)


def _trained(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """A copy of ``model`` after a pretend optimizer step (seeded noise on every parameter)."""
    gen = torch.Generator().manual_seed(seed)
    out = copy.deepcopy(model)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return out


def _digests(module: torch.nn.Module) -> dict[str, str]:
    return {k: tensor_digest(v) for k, v in module.state_dict().items()}


def test_buckets_are_aligned_views_and_tied_tensors_travel_once():
    emb = torch.randn(10, 6)
    named = [("embed.weight", emb), ("norm.weight", torch.randn(6, dtype=torch.bfloat16)),
             ("step", torch.tensor(3, dtype=torch.int64)), ("empty", torch.empty(0, 4)),
             ("proj.weight", torch.randn(6, 6).t()),          # not contiguous
             ("lm_head.weight", emb)]                           # tied to the embedding
    entries, sizes = plan_buckets(named, bucket_bytes=256)
    assert entries[-1][5] == 0 and entries[0][5] == -1          # the head is an alias of the embedding
    assert all(e[4] % 64 == 0 for e in entries)
    assert sizes == [256, 128, 192]                             # 240 B | 12 + 8 + 0 B | 144 B, padded to 64
    buffers = [_pack(named, entries, b, n, "cpu") for b, n in enumerate(sizes)]
    out = _unpack(buffers, entries)
    assert [n for n, _ in out] == [n for n, _ in named]
    for (_, want), (_, got) in zip(named, out):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    assert out[-1][1].data_ptr() == out[0][1].data_ptr()
    assert len(plan_buckets(named, bucket_bytes=0)[1]) == 4     # 0: one per tensor (not tied, not empty)


def test_nccl_only_when_every_rank_has_a_gpu_of_its_own():
    assert collective_backend(None, [None, None]) == "gloo"               # CPU trainer
    assert collective_backend("GPU-a", ["GPU-b", None]) == "gloo"         # a CPU worker
    assert collective_backend("GPU-a", ["GPU-b", "GPU-c"]) == "nccl"
    assert collective_backend("GPU-a", ["GPU-a"]) == "gloo"               # NCCL: one rank per GPU
    assert collective_backend("GPU-a", ["GPU-b", "GPU-b"]) == "gloo"


def test_unknown_weight_transfer_is_a_clear_error():
    from agentgym.algorithms.loop.train_config import TrainConfig
    with pytest.raises(ValueError, match="weight_transfer must be one of auto, object_store, collective; got 'nccl'"):
        RayPolicyPool("tiny-random", num_workers=1, weight_transfer="nccl")
    with pytest.raises(ValueError, match="weight_transfer must be one of"):
        TrainConfig(weight_transfer="shm")
    assert TrainConfig().weight_transfer == "auto"


def test_collective_pushes_equal_object_store_pushes_exactly(local):
    """Three optimizer steps, each pushed through both transports (a decoy push in between, so that
    each push changes the workers' weights): the workers hold the trainer's weights bit for bit and
    generate what a local engine with those weights generates; the group is opened once and reused."""
    prompts = [local.tokenizer.encode(f"Question {i}: what is {i} + {i}?") for i in range(4)]
    pool = RayPolicyPool("tiny-random", num_workers=2, seed=0, weight_transfer="collective",
                         weight_bucket_mb=1, weight_sync_timeout_s=60)      # 1 MiB: several buckets

    def push(model: torch.nn.Module, transfer: str) -> list:
        pool.weight_transfer = transfer
        assert pool.transport == transfer and pool.sync_weights(model) > 0
        want = _digests(model)
        for w in pool.workers:
            assert ray.get(w.state_digest.remote()) == want
        return [(g.token_ids, g.logprobs) for g in pool.generate(prompts, GREEDY)]
    try:
        groups = set()
        for seed in (1, 2, 3):
            step, decoy = _trained(local.model, seed), _trained(local.model, 100 + seed)
            by_object_store = push(step, "object_store")
            push(decoy, "collective")
            by_collective = push(step, "collective")
            groups.add(id(pool._side.group))
            assert by_collective == by_object_store
        assert pool.collective_backend == "gloo" and len(groups) == 1               # one group, reused
        check = TransformersPolicy.tiny_random(seed=0)          # a local engine with the last weights
        check.sync_weights(list(step.state_dict().items()))
        mine = check.generate(prompts, GREEDY)
        assert [g.token_ids for g in mine] == [ids for ids, _ in by_collective]
        for g, (_, lp) in zip(mine, by_collective):
            assert g.logprobs == pytest.approx(lp, abs=1e-4)
        t0 = time.perf_counter()
        pool.close()
        pool.close()                                                                # twice: a no-op
        assert time.perf_counter() - t0 < 30 and pool._side.group is None
        with pytest.raises(RuntimeError, match="closed"):
            pool.sync_weights(step)
    finally:
        pool.close()


def test_a_garbage_collected_pool_releases_its_group_without_hanging(local):
    pool = RayPolicyPool("tiny-random", num_workers=1, seed=0, weight_transfer="auto", weight_sync_timeout_s=30)
    pool.sync_weights(_trained(local.model, 4))
    assert pool.collective_backend == "gloo"                    # auto = collective (measured, see docstring)
    side, actor = pool._side, pool.workers[0]
    pid = ray.get(actor.pid.remote())
    del actor
    gone = threading.Event()

    def drop() -> None:
        nonlocal pool
        pool = None
        gc.collect()
        gone.set()
    t = threading.Thread(target=drop, daemon=True)
    t.start()
    assert gone.wait(30), "dropping the pool hung"
    assert side.group is None                                   # the trainer's side was shut down
    wait_until_gone(pid, 30, "actor process of the dropped pool")   # Ray ends an actor whose handles are gone


def test_a_worker_that_cannot_join_fails_the_push_clearly_and_close_does_not_hang(local):
    pool = RayPolicyPool("tiny-random", num_workers=2, seed=0, weight_transfer="collective", weight_sync_timeout_s=5)
    try:
        os.kill(ray.get(pool.workers[1].pid.remote()), signal.SIGKILL)     # crashes before the first push
        t0 = time.perf_counter()
        with pytest.raises(RuntimeError, match=r"could not form a process group within 5 s; "
                                               r"rollout worker rank 2 failed with ActorDiedError.*object_store"):
            pool.sync_weights(_trained(local.model, 5))
        assert time.perf_counter() - t0 < 40
    finally:
        t0 = time.perf_counter()
        pool.close()
        pool.close()
        assert time.perf_counter() - t0 < 40


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA GPUs")
def test_gpu_weights_go_over_nccl_when_the_worker_has_its_own_gpu(local):
    """One worker on a GPU of its own: NCCL from another GPU of the trainer's; with a single GPU (shared
    by trainer and worker, which NCCL refuses) the push falls back to gloo. Exact weights either way."""
    pool = RayPolicyPool("tiny-random", num_workers=1, seed=0, resources={"num_cpus": 1, "num_gpus": 1},
                         device="cuda", weight_sync_timeout_s=120)
    try:
        worker_gpu = ray.get(pool.workers[0].gpu.remote())
        assert worker_gpu is not None
        free = [i for i in range(torch.cuda.device_count())
                if str(torch.cuda.get_device_properties(i).uuid) != worker_gpu]
        device = torch.device("cuda", free[0] if free else 0)
        for seed in (6, 7):
            model = _trained(local.model, seed).to(device)
            pool.sync_weights(model)
            assert ray.get(pool.workers[0].state_digest.remote()) == _digests(model)
        assert pool.collective_backend == ("nccl" if free else "gloo")
    finally:
        pool.close()
