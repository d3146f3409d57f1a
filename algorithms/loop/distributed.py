"""Data-parallel training on ``torch.distributed`` (``torchrun``): gloo on CPU, NCCL (+ FSDP2) on CUDA.

``torchrun --nproc-per-node N -m agentgym.app.cli train …`` starts N processes; :func:`init_from_env`
joins them into one process group (from torchrun's ``RANK`` / ``WORLD_SIZE`` / ``MASTER_ADDR``
variables). The division of work, and why:

* **Rollouts**: each rank collects ``groups_per_step / N`` groups with its own seeds; the trainer then
  gathers the trajectories (``all_gather_object``: token lists, small next to the model) so every rank
  holds the same *global* batch, in rank order.
* **Advantages** are computed on that global batch on every rank (ReBN, whitening and GRPO groups see
  all episodes, exactly as in one process).
* **Gradients**: each rank runs forward/backward on its share of the micro-batches (round-robin), with
  the loss normalised by the *global* minibatch totals; the gradients are then summed across ranks with
  one ``all_reduce`` per optimizer step — what DDP's bucketed all-reduce computes, done once after
  local accumulation (DDP's ``no_sync`` pattern) so that uneven micro-batch counts and the separate
  value head need no special cases. The sum equals the one-process accumulated gradient, so one step
  on a fixed global batch gives the same parameters as one process (tested to ≤ 1e-6).
* **FSDP2** (``fsdp=true``): ``fully_shard`` on every decoder layer and the model — the policy, the
  frozen KL reference and a separate critic alike — shards parameters, gradients and optimizer state for
  models that do not fit one device; FSDP then reduces (averages) gradients itself, so the loss is
  scaled by N, a replicated value head is averaged the same way, and every rank runs the same number
  of micro-batches (padded with zero-weight passes). Meant for CUDA (NCCL); it runs on CPU with gloo
  too, which is how CI tests it (one step on a fixed batch equals one process; train/resume end to end).
  Sampling needs a separate engine (each rank's ``generate`` would run a different number of forward
  passes through the sharded model): vLLM, or with ``backend=hf`` an unsharded HF copy per rank that
  loads the gathered full weights after every update.
* Only rank 0 logs, evaluates and writes checkpoints; every rank resumes from the same checkpoint.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import torch

__all__ = ["DistContext", "init_from_env", "current", "gather_lists", "all_reduce_gradients", "all_reduce_sum",
           "launched_by_torchrun", "under_torchrun", "apply_fsdp2"]


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_by_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def under_torchrun() -> bool:
    """Started by torchrun (or another torchelastic launcher), at any world size, 1 included."""
    return "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ


def env_rank() -> int:
    """This process's rank as torchrun set it (0 outside torchrun), usable before the group exists."""
    return int(os.environ.get("RANK", "0"))


def init_from_env(device: str | None = None, timeout_min: int = 180) -> DistContext | None:
    """Join torchrun's process group (gloo on CPU, nccl on CUDA); None outside torchrun.

    The long timeout covers rank 0's evaluations and checkpoint writes, during which the other ranks
    wait at their next collective."""
    import torch.distributed as dist
    if not launched_by_torchrun():
        return None
    if not dist.is_initialized():
        cuda = torch.cuda.is_available() and (device is None or str(device).startswith("cuda"))
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(minutes=timeout_min))
    return current()


def current() -> DistContext | None:
    """The process group this process is in, or None (one process)."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    return DistContext(dist.get_rank(), dist.get_world_size(), dist.get_backend())


def gather_lists(local: Sequence[Any], ctx: DistContext | None) -> list[Any]:
    """Every rank's list, concatenated in rank order, on every rank."""
    if ctx is None:
        return list(local)
    import torch.distributed as dist
    parts: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(parts, list(local))
    return [x for part in parts for x in part]


def all_reduce_sum(values: Sequence[float], ctx: DistContext | None) -> list[float]:
    """Element-wise sum over ranks of a list of floats (statistics, flags)."""
    if ctx is None:
        return list(values)
    import torch.distributed as dist
    t = torch.tensor(list(values), dtype=torch.float64)
    if ctx.backend == "nccl":
        t = t.cuda()
    dist.all_reduce(t)
    return t.cpu().tolist()


def all_reduce_gradients(params: Iterable[torch.nn.Parameter], ctx: DistContext | None,
                         average: bool = False) -> None:
    """Sum (``average``: average) the gradients of ``params`` over ranks (missing gradients count as 0),
    one flat all-reduce."""
    if ctx is None:
        return
    import torch.distributed as dist
    params = [p for p in params if p.requires_grad]
    if not params:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat)
    if average:
        flat /= ctx.world_size
    offset = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
        offset += n


def apply_fsdp2(model: torch.nn.Module) -> torch.nn.Module:
    """Shard a transformers causal LM (or a critic holding its body) with FSDP2 (``fully_shard``): each
    decoder layer, then the root, over all ranks of the process group on the model's device type
    (CUDA with NCCL; CPU with gloo works too — that is how the CPU tests exercise this path)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    import torch.distributed as dist
    device_type = next(model.parameters()).device.type
    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    layers = None
    for owner in (getattr(model, "model", None), getattr(model, "body", None), model):
        layers = getattr(owner, "layers", None)
        if layers is not None:
            break
    for layer in layers or []:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model
