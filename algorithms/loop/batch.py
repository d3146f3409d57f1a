"""One batch format for every learner: trajectories collated into right-padded ``(B, T)`` tensors.

All per-token tensors use the token-position alignment of :mod:`agentgym.algorithms.maths.losses`
(entry ``t`` is about token ``t``). Learners fill ``advantages``/``returns`` (and, when needed,
``ref_logprobs``/``old_values``) after collating; :meth:`Batch.micro_batches` then cuts the batch
for gradient accumulation, each piece trimmed to its own longest sequence.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields, replace
from typing import Iterator, Sequence

import numpy as np
import torch

from agentgym.trajectory import SAMPLED_KINDS, TOKEN_KINDS, Trajectory

__all__ = ["Batch", "collate", "kind_codes"]


_KIND_CODE = {k: i for i, k in enumerate(TOKEN_KINDS)}


def kind_codes(kinds: Sequence[str]) -> list[int]:
    """The integer codes of token kinds in ``Batch.kind`` (their index in ``TOKEN_KINDS``)."""
    try:
        return [_KIND_CODE[k] for k in kinds]
    except KeyError as e:
        raise ValueError(f"unknown token kind {e.args[0]!r}; kinds are {list(TOKEN_KINDS)}") from None


@dataclass
class Batch:
    """Right-padded token tensors of ``B`` trajectories (``T`` = the longest).

    Attributes:
        input_ids: token ids, padded with ``pad_id``.
        attention_mask: 1 on real tokens.
        position_ids: 0, 1, … along each sequence (right padding: the same positions as at sampling).
        loss_mask: 1 on policy-sampled tokens (the trajectory's ``loss_mask``).
        response_mask: 1 on every token after the prompt (policy and environment tokens).
        kind: each token's kind as its index in ``agentgym.trajectory.TOKEN_KINDS`` (-1 on padding);
            trajectories without ``token_kinds`` (older files) get the kinds their mask implies.
        old_logprobs: log-probs of the "old" policy for the ratio: the sampling-time ones, or — when the
            sampler is a separate engine — recomputed by the training model before the update.
        sampler_logprobs: the sampling-time log-probs, always (for the optional truncated
            importance-sampling correction and the sampler-vs-learner divergence).
        is_weights: per-token truncated importance weights (1 without the correction).
        token_rewards: each step reward on its turn's last policy token.
        advantages, returns: per-token targets, filled by the learner.
        ref_logprobs, old_values: reference-model log-probs and value estimates at collection
            (filled by learners that use them; zeros otherwise).
        seq_ids: index of each row in the list of trajectories given to :func:`collate`.
        group_ids: the trajectories' group ids (-1 for none).
        lengths: real length of each row.
        prompt_lengths: length of each row's initial prompt.
    """
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    loss_mask: torch.Tensor
    response_mask: torch.Tensor
    kind: torch.Tensor
    old_logprobs: torch.Tensor
    sampler_logprobs: torch.Tensor
    is_weights: torch.Tensor
    token_rewards: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    ref_logprobs: torch.Tensor
    old_values: torch.Tensor
    seq_ids: torch.Tensor
    group_ids: torch.Tensor
    lengths: torch.Tensor
    prompt_lengths: torch.Tensor

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def width(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def logits_offset(self) -> int:
        """First position whose logits predict a non-prompt token (``min prompt length - 1``): a
        forward pass needs no logits before it (``logits_to_keep = width - logits_offset``)."""
        return max(0, int(self.prompt_lengths.min()) - 1) if len(self) else 0

    def logit_positions(self, needed: torch.Tensor) -> torch.Tensor:
        """The positions whose logits some row needs: ``p`` such that a token at ``p + 1`` is marked in
        ``needed`` (``(B, T)``) in at least one row; sorted, on ``needed``'s device. A forward pass then
        projects only those hidden states onto the vocabulary (``logits_to_keep=positions``): in multi-turn
        episodes the environment's tokens between turns (retrieved documents, tool output) need none.
        Never empty (one position when nothing is needed, so that a loss of 0 still has a graph)."""
        positions = (needed[:, 1:] > 0).any(0).nonzero().squeeze(1)
        if positions.numel() == 0:
            positions = torch.tensor([max(self.width - 2, 0)], device=needed.device)
        return positions

    def train_mask(self, mask_env_tokens: bool = True, kinds: Sequence[str] | None = None) -> torch.Tensor:
        """The tokens that carry loss (a float mask like ``loss_mask``).

        ``kinds=None``: the policy's tokens (``loss_mask``), or with ``mask_env_tokens=False`` (an
        ablation) every token after the prompt. ``kinds`` (names from ``TOKEN_KINDS``) narrows that
        set to the tokens of those kinds. The rule: with ``mask_env_tokens=True`` loss stays on
        tokens the policy sampled, so ``kinds`` may name only sampled kinds (``policy``) — naming
        ``tool``, ``retrieved``, ``template`` or ``env`` raises rather than silently training on
        text the policy never produced. Training on environment tokens of chosen kinds is the
        ablation ``mask_env_tokens=False, kinds=("policy", "tool")`` (e.g. tool outputs but never
        retrieved passages). ``prompt`` tokens never carry loss.
        """
        base = self.loss_mask if mask_env_tokens else self.response_mask
        if kinds is None:
            return base
        kinds = tuple(kinds)
        codes = kind_codes(kinds)
        if "prompt" in kinds:
            raise ValueError("prompt tokens never carry loss; remove 'prompt' from kinds")
        not_sampled = [k for k in kinds if k not in SAMPLED_KINDS]
        if mask_env_tokens and not_sampled:
            raise ValueError(f"kinds {not_sampled} are not sampled by the policy; training on them is the ablation "
                             f"mask_env_tokens=False")
        selected = torch.isin(self.kind, torch.tensor(codes, dtype=self.kind.dtype, device=self.kind.device))
        return base * selected.to(base.dtype)

    def _map(self, fn) -> "Batch":
        return replace(self, **{f.name: fn(f.name, getattr(self, f.name)) for f in fields(self)})

    def to(self, device: torch.device | str) -> "Batch":
        return self._map(lambda _, t: t.to(device))

    def select(self, rows: Sequence[int] | torch.Tensor) -> "Batch":
        """The rows ``rows`` (in that order), trimmed to their longest sequence."""
        idx = torch.as_tensor(rows, dtype=torch.long, device=self.input_ids.device)
        width = int(self.lengths[idx].max()) if len(idx) else 0
        return self._map(lambda _, t: t[idx, :width] if t.dim() == 2 else t[idx])

    def micro_rows(self, size: int, max_tokens: int | None = None) -> Iterator[list[int]]:
        """The rows of each micro-batch (gradient accumulation, no-grad passes): at most ``size``
        consecutive rows, or with ``max_tokens`` rows of similar length together (veRL's dynamic batch
        size): rows sorted longest first, cut where one more row would make ``rows × longest`` exceed
        ``max_tokens`` (a row longer than that goes alone), so short rows are not padded to a long one."""
        if size < 1:
            raise ValueError(f"micro-batch size must be >= 1, got {size}")
        if max_tokens is None:
            for start in range(0, len(self), size):
                yield list(range(start, min(start + size, len(self))))
            return
        if max_tokens < 1:
            raise ValueError(f"micro-batch token budget must be >= 1, got {max_tokens}")
        order = sorted(range(len(self)), key=lambda i: (-int(self.lengths[i]), i))
        piece: list[int] = []
        for i in order:     # longest first: the first row of a piece sets its width
            if piece and (len(piece) + 1 > size or (len(piece) + 1) * int(self.lengths[piece[0]]) > max_tokens):
                yield piece
                piece = []
            piece.append(i)
        if piece:
            yield piece

    def micro_batches(self, size: int, max_tokens: int | None = None) -> Iterator["Batch"]:
        """The micro-batches of :meth:`micro_rows`, each trimmed to its longest row."""
        for rows in self.micro_rows(size, max_tokens):
            yield self.select(rows)

    @property
    def padded_tokens(self) -> int:
        """Positions this batch's passes compute: rows × width (its real tokens are ``lengths.sum()``)."""
        return int(self.input_ids.shape[0] * self.input_ids.shape[1])


def _scatter_rows(flat: np.ndarray, lengths: np.ndarray, width: int, value: float) -> torch.Tensor:
    """Right-pad the concatenated rows ``flat`` (row ``i`` has ``lengths[i]`` entries) into ``(B, width)``
    with one scatter: the row-major order of the ``column < length`` mask is the order of ``flat``."""
    out = np.full((len(lengths), width), value, dtype=flat.dtype)
    out[np.arange(width)[None, :] < lengths[:, None]] = flat
    return torch.from_numpy(out)


def _padded(rows: Sequence[Sequence[float]], lengths: np.ndarray, width: int, *, value: float,
            dtype: type) -> torch.Tensor:
    """Right-pad rows of known lengths into a ``(B, width)`` tensor; the rows are read in one C-level pass."""
    flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=dtype, count=int(lengths.sum()))
    return _scatter_rows(flat, lengths, width, value)


def _kind_codes_padded(trajectories: Sequence[Trajectory], lengths: np.ndarray, width: int) -> torch.Tensor:
    """Each token's kind code (``-1`` on padding), looked up in one C-level pass over all tokens."""
    kinds = [t.token_kinds if t.token_kinds is not None else t.kinds() for t in trajectories]
    for i, (k, n) in enumerate(zip(kinds, lengths)):
        if len(k) != n:
            raise ValueError(f"trajectory {i}: {len(k)} token kinds for {n} tokens")
    try:
        flat = np.fromiter(map(_KIND_CODE.__getitem__, itertools.chain.from_iterable(kinds)), dtype=np.int64,
                           count=int(lengths.sum()))
    except KeyError as e:
        raise ValueError(f"unknown token kind {e.args[0]!r}; kinds are {list(TOKEN_KINDS)}") from None
    return _scatter_rows(flat, lengths, width, -1)


def _token_rewards(trajectories: Sequence[Trajectory], width: int) -> torch.Tensor:
    """Each step reward on its turn's last policy token (:meth:`Trajectory.token_rewards`), scattered at once."""
    rows, cols, values = [], [], []
    for i, t in enumerate(trajectories):
        for pos, r in zip(t.reward_positions, t.step_rewards):
            rows.append(i)
            cols.append(pos)
            values.append(r)
    out = np.zeros((len(trajectories), width), dtype=np.float64)   # summed as Python floats are, then cast
    np.add.at(out, (np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)),
              np.asarray(values, dtype=np.float64))
    return torch.from_numpy(out.astype(np.float32))


def collate(trajectories: Sequence[Trajectory], *, pad_id: int = 0) -> Batch:
    """Stack token-level trajectories into a :class:`Batch` (advantages and returns left at 0).

    Vectorised: each field is one numpy scatter over the concatenated rows (no per-token Python beyond
    reading the lists), so collation costs a few ms for a 32 x 512 batch (benchmarks/collate_speed.py)."""
    if not trajectories:
        raise ValueError("cannot collate an empty list of trajectories")
    for i, t in enumerate(trajectories):
        if not (len(t.token_ids) == len(t.loss_mask) == len(t.logprobs)):
            raise ValueError(f"trajectory {i}: token_ids, loss_mask and logprobs differ in length")
    n = len(trajectories)
    lens = np.asarray([len(t.token_ids) for t in trajectories], dtype=np.int64)
    width = int(lens.max())
    lengths = torch.from_numpy(lens)
    columns = torch.arange(width)
    attention = (columns[None, :] < lengths[:, None]).long()
    prompt_lengths = torch.tensor([t.prompt_length for t in trajectories], dtype=torch.long)
    response = ((columns[None, :] >= prompt_lengths[:, None]) & attention.bool()).float()
    logprobs = _padded([t.logprobs for t in trajectories], lens, width, value=0.0, dtype=np.float32)
    zeros = torch.zeros(n, width)
    return Batch(
        input_ids=_padded([t.token_ids for t in trajectories], lens, width, value=pad_id, dtype=np.int64),
        attention_mask=attention,
        position_ids=columns.repeat(n, 1) * attention,
        loss_mask=_padded([t.loss_mask for t in trajectories], lens, width, value=0.0, dtype=np.float32),
        response_mask=response,
        kind=_kind_codes_padded(trajectories, lens, width),
        old_logprobs=logprobs,
        sampler_logprobs=logprobs.clone(),
        is_weights=torch.ones(n, width),
        token_rewards=_token_rewards(trajectories, width),
        advantages=zeros.clone(),
        returns=zeros.clone(),
        ref_logprobs=zeros.clone(),
        old_values=zeros.clone(),
        seq_ids=torch.arange(n),
        group_ids=torch.tensor([-1 if t.group_id is None else int(t.group_id) for t in trajectories]),
        lengths=lengths,
        prompt_lengths=prompt_lengths,
    )
