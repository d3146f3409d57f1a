"""Where a training run's sampler runs: the one function that decides it.

The rules, by the backend's declared capabilities (never its name):

* ``rollout_workers > 0`` — a :class:`~agentgym.policies.ray_pool.RayPolicyPool`: ``rollout_workers``
  Ray actors, each a full engine of the chosen backend.
* a backend that ``trains_in_place`` (hf), without FSDP and with ``max_staleness == 0`` — colocated:
  the sampler *is* the module the learner trains, nothing is copied.
* otherwise a separate engine loaded from the same weights through the one loader: vLLM; an HF copy
  under FSDP (each rank's ``generate`` runs its own number of forward passes, which a sharded module
  cannot, as its passes are collective); an HF copy when ``max_staleness > 0`` (the next batch is
  generated while the learner updates, so the sampler must not be the module being stepped).

A backend that ``follows_run_precision`` gets ``precision=`` (it generates under the run's autocast), a
policy handed in to be trained in place too (``use_precision``; its other options stay its own);
one that runs as an ``engine_bf16_with_run`` runs in bf16 when the run does (fp32 master weights
stay with the learner) unless ``dtype`` is set — a single engine and Ray rollout workers alike. A separate sampler must declare
``supports_weight_sync`` (the trainer syncs it after every update), else training is refused.
"""

from __future__ import annotations

from typing import Any

from agentgym.policies.backends import backend_class, trainable_backend

__all__ = ["place_sampler"]


def place_sampler(cfg: Any, backend: str, precision: Any, policy: Any | None = None,
                  train_dtype: Any = None) -> tuple[Any, Any]:
    """``(train_policy, sampler)`` for a :class:`~agentgym.algorithms.loop.trainer.TrainConfig` ``cfg``.

    ``backend``: a resolved registry name (:func:`~agentgym.policies.backends.resolve_backend`);
    ``precision``: the run's resolved :class:`~agentgym.precision.Precision`; ``policy``: the module to
    train when the caller has one (else ``cfg.model`` is loaded); ``train_dtype``: its torch dtype.
    The sampler is the train policy itself exactly when colocated.
    """
    from agentgym.policies.loading import load_policy
    cls = backend_class(backend)
    options = dict(cfg.backend_options)
    if cls.follows_run_precision:           # the sampler generates under the same autocast
        options.setdefault("precision", precision.name)   # options are checked where they load (load_policy)
    sampler_dtype = cfg.dtype or ("bfloat16" if cls.engine_bf16_with_run and precision.bf16 else None)
    colocated = cls.trains_in_place and not cfg.fsdp and not cfg.max_staleness
    given = policy is not None
    if policy is None:  # any model spec, including an SFT / DPO output or another run's checkpoint
        policy = load_policy(cfg.model, trainable_backend(), device=cfg.device, dtype=train_dtype, seed=cfg.seed,
                             **(options if colocated and not cfg.rollout_workers else {}))
    if cfg.rollout_workers > 0:             # engines in Ray actors
        from agentgym.policies.ray_pool import RayPolicyPool
        sampler = RayPolicyPool(cfg.model, num_workers=cfg.rollout_workers, backend=backend, seed=cfg.seed,
                                address=cfg.rollout.ray_address, weight_transfer=cfg.weight_transfer,
                                dtype=sampler_dtype, **options)
    elif colocated:
        sampler = policy                    # samples with the module being trained
        if given and cls.follows_run_precision and hasattr(policy, "use_precision"):
            policy.use_precision(precision.name)   # a policy handed in (agentgym compare's copies) too
    else:                                   # a separate engine, loaded from the same weights
        sampler = load_policy(cfg.model, backend, device=cfg.device, dtype=sampler_dtype, seed=cfg.seed, **options)
        if not sampler.supports_weight_sync:
            sampler.close()
            raise ValueError(f"backend {backend!r} cannot take a learner's weights (supports_weight_sync=False): "
                             "it can evaluate (agentgym eval --backend) but not sample for training")
    return policy, sampler
