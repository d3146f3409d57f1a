"""N generation engines as Ray actors, data-parallel over episodes: ``RayPolicyPool``.

Each actor loads the same model spec with the one loader (``load_policy(spec, backend)``: transformers
or vLLM). ``generate`` splits a batch of prompts into contiguous shares, one per actor, and returns the
generations in order, so the rollout engine sees one policy. After every optimizer step the trainer
calls :meth:`sync_weights`: the weights are put once in Ray's object store and every actor loads them
(its own ``sync_weights``: in place, prefix cache reset for vLLM); the slowest actor's time is returned.
On a GPU cluster the transfer would go over NCCL (vLLM's weight-update group) instead of the object
store: not built here (no GPU on these machines).

Seeds: with ``SamplingParams.seed = s``, actor ``i`` samples its share with seed ``s + 1_000_003·i`` so
the pool is reproducible for a fixed number of workers (sampled ids differ from one engine's, as they
would between any two engines).
"""

from __future__ import annotations

import os
import time
from typing import Any, Mapping, Sequence

from agentgym.policy import Generation, SamplingParams

__all__ = ["RayPolicyPool"]


class _PolicyHost:
    def __init__(self, spec: str, backend: str, seed: int, options: Mapping[str, Any], threads: int):
        import torch

        from agentgym.policies.loading import load_policy
        torch.set_num_threads(threads)
        self.policy = load_policy(spec, backend, seed=seed, **dict(options))

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Generation]:
        return self.policy.generate(prompts, sampling)

    def sync_weights(self, weights: Any) -> float:
        if isinstance(weights, Mapping):
            weights = list(weights.items())
        return float(self.policy.sync_weights(weights) or 0.0)

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        close = getattr(self.policy, "close", None)
        if close is not None:
            close()


class RayPolicyPool:
    """A policy whose ``generate`` runs on ``num_workers`` Ray actors (each a full engine)."""

    def __init__(self, spec: str, *, num_workers: int = 2, backend: str = "hf", seed: int = 0,
                 address: str | None = None, resources: Mapping[str, Any] | None = None,
                 threads_per_worker: int = 1, **options: Any):
        import ray

        from agentgym.policies.loading import load_tokenizer_for
        from agentgym.ray_envs import ensure_ray
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        ensure_ray(address)
        self.tokenizer = load_tokenizer_for(spec)
        self.name = f"{spec} x{num_workers} ({backend})"
        cls = ray.remote(_PolicyHost).options(**dict(resources or {"num_cpus": threads_per_worker}))
        self.workers = [cls.remote(spec, backend, seed, options, threads_per_worker) for _ in range(num_workers)]
        ray.get([w.pid.remote() for w in self.workers])   # loaded (errors surface here, not mid-rollout)

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Generation]:
        import ray
        prompts = [list(p) for p in prompts]
        n = len(self.workers)
        bounds = [round(i * len(prompts) / n) for i in range(n + 1)]
        calls = []
        for i, w in enumerate(self.workers):
            share = prompts[bounds[i]:bounds[i + 1]]
            if share:
                sp = sampling if sampling.seed is None else sampling.replace(seed=sampling.seed + 1_000_003 * i)
                calls.append(w.generate.remote(share, sp))
        return [g for part in ray.get(calls) for g in part]

    def sync_weights(self, weights: Any) -> float:
        """Push new weights to every actor through the object store; returns the wall seconds."""
        import ray
        import torch
        t0 = time.perf_counter()
        if isinstance(weights, torch.nn.Module):
            weights = weights.state_dict().items()
        state = {k: v.detach().to("cpu") for k, v in weights}
        ref = ray.put(state)
        ray.get([w.sync_weights.remote(ref) for w in self.workers])
        return time.perf_counter() - t0

    def close(self) -> None:
        import ray
        for w in self.workers:
            try:
                ray.get(w.close.remote(), timeout=30)
                ray.kill(w)
            except Exception:
                pass
        self.workers = []
