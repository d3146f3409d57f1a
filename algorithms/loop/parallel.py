"""Data parallelism for the learner under ``torchrun``: DDP-style gradient all-reduce, or FSDP2.

Every rank receives the same global batch; within each minibatch the micro-batches are dealt out
round-robin (:meth:`Parallel.share`), each rank accumulates its share's gradients with the loss
normalised by the *global* minibatch totals, then gradients are summed across ranks — so the update
equals the one-process update up to summation order. Under FSDP2 (CUDA) the trained policy, the frozen
reference and a separate critic are sharded per decoder layer; FSDP averages the gradients it reduces
and needs the same number of backward passes on every rank, so a rank with fewer micro-batches runs
zero-weight passes and the loss is scaled by the world size. Process-group plumbing (torchrun's
environment, collectives) is in :mod:`.distributed`.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from agentgym.algorithms.loop import distributed
from agentgym.algorithms.loop.batch import Batch

__all__ = ["Parallel"]


class Parallel:
    """How one learner spreads an update over the ranks of ``ctx`` (None: one process, no-ops)."""

    def __init__(self, ctx: distributed.DistContext | None, fsdp: bool):
        self.ctx = ctx
        self.fsdp = fsdp and ctx is not None
        self.sharded: list[nn.Module] = []   # the FSDP2-sharded modules (empty without fsdp)

    def shard(self, modules: Sequence[nn.Module | None]) -> None:
        """FSDP2: shard each module (``fully_shard`` per decoder layer, then the root), before the
        optimizer sees their parameters. Modules copied from the unsharded policy start equal on every rank."""
        for m in modules:
            if m is not None:
                self.sharded.append(distributed.apply_fsdp2(m))

    def share(self, micros: list[Batch]) -> tuple[list[Batch | None], float]:
        """This rank's micro-batches (round-robin) and the factor on its loss. Under FSDP a ``None``
        pads the list to the same number of passes on every rank (see :meth:`padding_pass`)."""
        if self.ctx is None:
            return list(micros), 1.0
        mine: list[Batch | None] = list(micros[self.ctx.rank::self.ctx.world_size])
        if not self.fsdp:
            return mine, 1.0
        rounds = -(-len(micros) // self.ctx.world_size)
        return mine + [None] * (rounds - len(mine)), float(self.ctx.world_size)

    @staticmethod
    def padding_pass(model: nn.Module, forward: Any, mb: Batch) -> None:
        """FSDP padding: a zero-weight forward/backward on the minibatch's first row, so this rank joins
        the collectives of a pass it has no micro-batch for."""
        out = forward(model, mb.select([0]))
        (out.logits.sum() * 0.0).backward()

    def reduce_stats(self, finite: bool, losses: dict[str, float],
                     token_stats: dict[str, float]) -> tuple[bool, dict[str, float], dict[str, float]]:
        """Every rank's (finite, loss sums, token-weighted stat sums), added up; finite only if all are."""
        if self.ctx is None:
            return finite, losses, token_stats
        parts = distributed.gather_lists([(finite, losses, token_stats)], self.ctx)
        total_losses: dict[str, float] = {}
        total_stats: dict[str, float] = {}
        for _, ls, ts in parts:
            for k, v in ls.items():
                total_losses[k] = total_losses.get(k, 0.0) + v
            for k, v in ts.items():
                total_stats[k] = total_stats.get(k, 0.0) + v
        return all(f for f, _, _ in parts), total_losses, total_stats

    def reduce_gradients(self, params: Sequence[nn.Parameter]) -> None:
        """All-reduce the gradients FSDP does not reduce itself (all of them under DDP; a replicated
        value head under FSDP, averaged there because the loss was scaled by the world size)."""
        if self.ctx is None:
            return
        managed = {id(p) for m in self.sharded for p in m.parameters()}
        distributed.all_reduce_gradients([p for p in params if id(p) not in managed], self.ctx, average=self.fsdp)

    # ------------------------------------------------------------------ full (unsharded) state
    def full_model_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """``model``'s full weights; under FSDP a collective every rank must join."""
        if not self.fsdp:
            return model.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))

    def load_full_model_state(self, model: nn.Module, weights: dict[str, torch.Tensor], strict: bool = True) -> None:
        """Full weights into ``model`` (into each rank's shards under FSDP: every rank calls it)."""
        if not self.fsdp:
            model.load_state_dict(weights, strict=strict)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True, strict=strict))

    def optimizer_state(self, modules: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The optimizer state in full (gathered under FSDP, so a checkpoint does not depend on the
        number of processes that wrote it)."""
        if not self.fsdp:
            return optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
        return get_optimizer_state_dict(modules, optimizer, options=StateDictOptions(full_state_dict=True))

    def load_optimizer_state(self, modules: nn.Module, optimizer: torch.optim.Optimizer, state: Any) -> None:
        if not self.fsdp:
            optimizer.load_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
        set_optimizer_state_dict(modules, optimizer, optim_state_dict=state,
                                 options=StateDictOptions(full_state_dict=True))
