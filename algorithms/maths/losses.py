"""The loss core shared by every learner: pure functions on ``(B, T)`` token tensors.

Policy-gradient surrogates (the per-token term a learner's *objective* contributes): PPO's clipped
ratio (:func:`clipped_surrogate`, optionally dual-clip, :func:`dual_clip_surrogate`), the on-policy
``-A log p`` (:func:`reinforce_surrogate`), GSPO's sequence-level ratio (:func:`gspo_surrogate`) and
CISPO's clipped, detached importance weight on a REINFORCE term (:func:`cispo_surrogate`). Each
returns ``(loss, ratio, clipped)`` per token; the registered objectives (:mod:`.objectives`) call
them with a learner's settings, and :func:`ppo_objective` aggregates one of them with the entropy, KL
and value terms.

Alignment. Every per-token tensor is indexed by the position of the token it is about:
``logprobs[b, t] = log p(token_ids[b, t] | token_ids[b, :t])``, computed from the logits at
``t - 1``; position 0 (never a policy token) holds 0. Masks use the same indexing, so a
trajectory's ``loss_mask`` applies as is.

Masks. ``loss_mask`` is 1 on the tokens the policy sampled. Every term — policy loss, entropy,
KL, value loss — is multiplied by the *training mask*: ``loss_mask`` normally (retrieved-token
masking: environment tokens get exactly zero gradient), or the response mask (every token after
the prompt) for the ``mask_env_tokens=False`` ablation. In that ablation env tokens have no
sampling-time log-prob; :func:`ppo_objective` takes the current log-prob, detached, as their
"old" one, so their ratio is 1: they get the plain policy-gradient term ``-A ∇log p`` and are
never clipped — the choice that needs no extra forward pass and keeps the ablation about the
mask only.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

__all__ = [
    "LOSS_AGG_MODES", "KL_ESTIMATORS", "selective_log_softmax", "token_logprobs", "entropy_from_logits",
    "clipped_surrogate", "dual_clip_surrogate", "ppo_clip_term", "gspo_surrogate", "cispo_surrogate",
    "reinforce_surrogate",
    "PolicyTerm", "aggregate", "kl_penalty", "clipped_value_loss",
    "masked_mean", "masked_whiten", "Settings", "ClipSettings", "LossTermSettings", "ValueLossSettings", "LossSettings",
    "ppo_objective",
]

#: veRL's four ``loss_agg_mode`` names with veRL's meaning (``verl.trainer.ppo.core_algos.agg_loss``), and
#: ``dr-grpo``: TRL's ``loss_type="dr_grpo"`` normalisation. See :func:`aggregate`.
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "dr-grpo")
KL_ESTIMATORS = ("k1", "k2", "k3", "low_var_kl")


# --------------------------------------------------------------------------- log-probs, entropy

def _own_selective_log_softmax(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits).gather(index)`` one row at a time (peak memory of one row, not the batch)."""
    return torch.stack([row.log_softmax(-1).gather(-1, idx.unsqueeze(-1)).squeeze(-1)
                        for row, idx in zip(logits, index)])


@functools.cache
def _trl_selective_log_softmax() -> Callable | None:
    # Lives in trl.trainer.utils (trl 1.16); a fused Triton kernel on CUDA. Imported lazily: the
    # import costs seconds, and only learners need it.
    try:
        from trl.trainer.utils import selective_log_softmax as fn
    except Exception:  # pragma: no cover - trl missing or moved
        return None
    return fn


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Log-softmax over the last axis gathered at ``index``; TRL's memory-efficient version if importable."""
    fn = _trl_selective_log_softmax()
    return fn(logits, index) if fn is not None else _own_selective_log_softmax(logits, index)


def entropy_from_logits(logits: torch.Tensor, chunk_rows: int = 1024) -> torch.Tensor:
    """Shannon entropy (nats) of ``softmax(logits)`` over the last axis, in chunks of rows."""
    flat = logits.reshape(-1, logits.shape[-1])
    parts = []
    for chunk in flat.split(chunk_rows):
        logp = chunk.log_softmax(-1)
        parts.append(-(logp.exp() * logp).sum(-1))
    return torch.cat(parts).reshape(logits.shape[:-1])


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, temperature: float = 1.0, *, offset: int = 0,
                   with_entropy: bool = False, entropy_grad: bool = True,
                   positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (and entropies) of ``token_ids`` under ``softmax(logits / temperature)``.

    ``token_ids``: ``(B, T)``; ``logits``: ``(B, T - offset, V)``, the model's logits at positions
    ``offset … T-1`` (``offset > 0`` when the forward pass kept only the logits that predict
    response tokens: ``logits_to_keep``). Returns ``(B, T)`` tensors aligned with the tokens,
    0 at positions ``≤ offset``. Dividing by the sampling temperature makes them comparable with
    the policy's sampling-time log-probs. ``entropy_grad=False`` computes the entropy for logging
    only (no graph kept).

    ``positions`` (sorted, 1-D, each ``< T - 1``): instead, ``logits`` is ``(B, len(positions), V)``, the
    logits at those positions only (``logits_to_keep=positions``); the result holds the log-probs of
    the tokens at ``positions + 1`` and 0 everywhere else.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if positions is None:   # the contiguous case: every position from ``offset`` on but the last
        if logits.shape[1] != token_ids.shape[1] - offset:
            raise ValueError(f"{logits.shape[1]} logit positions for {token_ids.shape[1]} tokens at offset {offset}")
        logits, positions = logits[:, :-1], torch.arange(offset, token_ids.shape[1] - 1, device=token_ids.device)
    elif logits.shape[1] != positions.numel():
        raise ValueError(f"{logits.shape[1]} logit positions for {positions.numel()} positions asked for")
    z = logits.float()
    if temperature != 1.0:
        z = z / temperature
    targets = positions.to(token_ids.device) + 1
    logp = z.new_zeros(token_ids.shape).index_copy(1, targets, selective_log_softmax(z, token_ids[:, targets]))
    ent = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent = z.new_zeros(token_ids.shape).index_copy(1, targets, entropy_from_logits(z))
    return logp, ent


# --------------------------------------------------------------------------- surrogates

def clipped_surrogate(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, clip_eps: float = 0.2,
                      clip_eps_high: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO's per-token loss ``max(-A·ρ, -A·clip(ρ, 1-ε, 1+ε_high))`` with ``ρ = exp(logp - old_logp)``.

    ``clip_eps_high`` (DAPO's "clip-higher") defaults to ``clip_eps``. Returns ``(loss, ratio,
    clipped)`` where ``clipped`` is 1 where the clipped branch is the active (larger) one.
    """
    high = clip_eps if clip_eps_high is None else clip_eps_high
    ratio = torch.exp(logp - old_logp)
    unclipped = -advantages * ratio
    clipped_loss = -advantages * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + high)
    return torch.maximum(unclipped, clipped_loss), ratio, (clipped_loss > unclipped).float()


def reinforce_surrogate(logp: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """The on-policy policy-gradient loss ``-A · log p`` (its gradient is ``-A ∇log p``)."""
    return -advantages * logp


def dual_clip_surrogate(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, clip_eps: float = 0.2,
                        clip_eps_high: float | None = None,
                        dual_clip_c: float = 3.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Dual-clip PPO (Ye et al., 2020, "Mastering Complex Control in MOBA Games with Deep Reinforcement
    Learning", arXiv:1912.09729): for a negative advantage the objective is also bounded below by
    ``c·A`` (``c > 1``), so a token whose ratio has grown huge under a negative advantage cannot
    contribute an unbounded loss. In loss form: ``min(PPO loss, -c·A)`` where ``A < 0``; unchanged
    where ``A ≥ 0``. ``clipped`` marks tokens where either clip is active (no gradient there).
    """
    if not dual_clip_c > 1.0:
        raise ValueError(f"dual_clip_c must be > 1, got {dual_clip_c}")
    loss, ratio, clipped = clipped_surrogate(logp, old_logp, advantages, clip_eps, clip_eps_high)
    bound = -dual_clip_c * advantages
    dual = (advantages < 0) & (bound < loss)
    return torch.where(dual, bound, loss), ratio, torch.maximum(clipped, dual.float())


def gspo_surrogate(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                   clip_eps: float = 3e-4,
                   clip_eps_high: float | None = 4e-4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GSPO (Zheng et al., 2025, "Group Sequence Policy Optimization", arXiv:2507.18071), token form.

    The importance ratio is the sequence's, length-normalised: ``s = exp(mean_t (logp - old_logp))``
    over the row's ``mask`` tokens (the geometric mean of the token ratios), clipped to
    ``[1 - ε, 1 + ε_high]`` as a whole — a sequence is kept or dropped, not single tokens. The paper's
    clip ranges are tiny next to PPO's because ``s`` is a per-token geometric mean (3e-4 / 4e-4 in
    its §5.1). Token form ("GSPO-token" in the paper): every token carries ``s``'s value with its own
    log-prob's gradient, ``s_t = sg[s] · p_t / sg[p_t]``, so per-token (per-turn) advantages work;
    with one advantage per sequence and ``seq-mean-token-mean`` aggregation its gradient is exactly
    GSPO's, ``-A · s · mean_t ∇log p_t`` when unclipped.
    """
    high = clip_eps if clip_eps_high is None else clip_eps_high
    m = mask.to(logp.dtype)
    seq_log_ratio = ((logp - old_logp).detach() * m).sum(-1) / m.sum(-1).clamp(min=1.0)
    ratio = torch.exp(seq_log_ratio[:, None] + logp - logp.detach())   # value s, gradient s·∇log p_t
    unclipped = -advantages * ratio
    clipped_loss = -advantages * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + high)
    return torch.maximum(unclipped, clipped_loss), ratio, (clipped_loss > unclipped).float()


def ppo_clip_term(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                  clip: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO's clipped ratio with ``clip``'s range (anything with ``clip_eps``, ``clip_eps_high`` and
    ``dual_clip_c``: :class:`LossSettings`, a learner's config): dual-clip when ``dual_clip_c`` is set."""
    if clip.dual_clip_c is not None:
        return dual_clip_surrogate(logp, old_logp, advantages, clip.clip_eps, clip.clip_eps_high, clip.dual_clip_c)
    return clipped_surrogate(logp, old_logp, advantages, clip.clip_eps, clip.clip_eps_high)


def cispo_surrogate(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, clip_eps: float = 1.0,
                    clip_eps_high: float | None = 0.28) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CISPO (MiniMax, 2025, "MiniMax-M1", arXiv:2506.13585): a REINFORCE term weighted by the clipped,
    detached importance ratio, ``-sg(clip(ρ, 1-ε, 1+ε_high)) · A · log p``.

    Unlike PPO's clip, which zeroes the gradient of tokens outside the trust region, every token keeps
    its gradient; only the weight is bounded. The paper imposes no lower bound (``clip_eps=1``: the
    weight's floor is 0, which a ratio never goes below) and tunes only the upper one; our default
    ``ε_high = 0.28`` borrows DAPO's clip-higher value and is a starting point, not the paper's number.
    ``clipped`` marks tokens whose weight was clipped (they still carry gradient).
    """
    high = clip_eps if clip_eps_high is None else clip_eps_high
    ratio = torch.exp(logp - old_logp)
    weight = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + high).detach()
    clipped = ((ratio > 1.0 + high) | (ratio < 1.0 - clip_eps)).float()
    return -weight * advantages * logp, ratio, clipped


# --------------------------------------------------------------------------- aggregation

def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean", *, num_tokens: float | None = None,
              num_seqs: float | None = None, max_len: float | None = None) -> torch.Tensor:
    """Reduce a ``(B, T)`` per-token loss to a scalar over the masked tokens.

    With ``S_i = Σ_t v·m`` (sequence ``i``'s token sum), ``N`` the masked tokens, ``n`` the sequences
    with at least one masked token and ``L = max_len`` (default ``T``, the padded width):

    * ``token-mean`` (DAPO; TRL ``dapo``): ``Σ_i S_i / N`` — every token weighs the same;
    * ``seq-mean-token-mean`` (the GRPO paper; TRL ``grpo``): ``Σ_i (S_i / N_i) / n`` — each
      sequence's token mean, then their mean (a short answer's tokens weigh more);
    * ``seq-mean-token-sum``: ``Σ_i S_i / n`` — each sequence's token *sum*, then their mean;
    * ``seq-mean-token-sum-norm``: ``Σ_i S_i / L`` — veRL's Dr.GRPO mode (its ``loss_scale_factor``
      is ``L``): a constant divisor, so no length bias, and not divided by the number of sequences;
    * ``dr-grpo``: ``Σ_i S_i / (n · L)`` — TRL's ``loss_type="dr_grpo"`` (``L`` its
      ``max_completion_length``): veRL's Dr.GRPO mode averaged over the sequences.

    The first four are veRL's ``agg_loss`` modes, with its meaning: a sequence without a masked token
    is not counted in ``n``. (TRL counts every row in ``grpo`` and ``dr_grpo``; the two agree whenever
    every row has a loss token, as every agentgym trajectory has.)

    Gradient accumulation: pass the totals of the whole minibatch (``num_tokens`` = its masked
    tokens ``N``, ``num_seqs`` = its sequences with a masked token ``n``); the micro-batches' results
    then sum to the minibatch's.
    """
    mask = mask.to(values.dtype)
    if mode == "token-mean":
        denom = mask.sum() if num_tokens is None else torch.as_tensor(num_tokens, dtype=values.dtype)
        return (values * mask).sum() / denom.clamp(min=1.0)
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {LOSS_AGG_MODES}")
    n_seqs = float((mask.sum(-1) > 0).sum()) if num_seqs is None else num_seqs
    length = values.shape[1] if max_len is None else max_len
    if mode == "seq-mean-token-mean":
        per_seq = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        return per_seq.sum() / max(n_seqs, 1)
    if mode == "seq-mean-token-sum":
        return (values * mask).sum() / max(n_seqs, 1)
    if mode == "seq-mean-token-sum-norm":
        return (values * mask).sum() / length
    return (values * mask).sum() / length / max(n_seqs, 1)   # dr-grpo


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``(v - mean) / sqrt(var + eps)`` over the masked entries, with the sample (Bessel-corrected)
    variance: PPO's advantage whitening as TRL and veRL compute it (``masked_whiten`` in both). 0 where
    ``mask`` is 0, and everywhere when fewer than two entries are masked (nothing to scale by)."""
    mask = mask.to(values.dtype)
    n = mask.sum()
    mean = masked_mean(values, mask)
    if n < 2:
        return torch.zeros_like(values)
    var = masked_mean((values - mean) ** 2, mask) * (n / (n - 1))
    return (values - mean) * torch.rsqrt(var + eps) * mask


# --------------------------------------------------------------------------- KL, value loss

def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of ``KL(π ‖ π_ref)`` from log-probs of tokens sampled from ``π``.

    With ``d = logp - ref_logp`` (Schulman, "Approximating KL divergence"):

    * ``k1 = d`` — unbiased, high variance, can be negative;
    * ``k2 = d² / 2`` — biased, low variance; its gradient is the KL's gradient;
    * ``k3 = exp(-d) + d - 1`` — unbiased and ≥ 0 (GRPO's choice);
    * ``low_var_kl`` — k3 as verl computes it: ``d`` clamped to ±20 before ``exp`` and the result to [-10, 10].
    """
    d = logp - ref_logp
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d.square()
    if estimator == "k3":
        return torch.exp(-d) + d - 1.0
    if estimator == "low_var_kl":
        r = torch.clamp(-d, min=-20.0, max=20.0)
        return torch.clamp(torch.exp(r) - r - 1.0, min=-10.0, max=10.0)
    raise ValueError(f"unknown KL estimator {estimator!r}; choose one of {KL_ESTIMATORS}")


def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                       clip_eps: float | None = 0.2) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO value loss ``½ max((V - R)², (V_clip - R)²)``, ``V_clip = V_old + clip(V - V_old, ±ε)``.

    ``clip_eps=None`` gives the plain ``½ (V - R)²``. Returns ``(loss, clipped)``.
    """
    plain = (values - returns).square()
    if clip_eps is None:
        return 0.5 * plain, torch.zeros_like(plain)
    v_clip = old_values + torch.clamp(values - old_values, -clip_eps, clip_eps)
    clipped = (v_clip - returns).square()
    return 0.5 * torch.maximum(plain, clipped), (clipped > plain).float()


# --------------------------------------------------------------------------- the objective

#: A policy-gradient term: ``(logp, old_logp, advantages, ratio_mask) -> (loss, ratio, clipped)``, all
#: ``(B, T)``. ``ratio_mask`` marks the trained tokens that have sampling-time log-probs (what a
#: sequence-level ratio averages over). Learners' objectives (``register_objective``) are such terms.
PolicyTerm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
                      tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


class Settings:
    """Root of the settings blocks: each block checks the fields it declares in its own
    ``__post_init__`` and passes on (``super().__post_init__()``), so a learner config composed of
    several blocks runs every block's check once."""

    def __post_init__(self) -> None:
        pass


@dataclass
class ClipSettings(Settings):
    """PPO's clipped ratio: ``clip_eps`` / ``clip_eps_high`` (clip-higher; None = symmetric);
    ``dual_clip_c`` (None = off): dual-clip's lower bound ``c·A`` for negative advantages. GSPO and
    CISPO read the same two bounds on their own ratio (a learner's config sets its defaults)."""
    clip_eps: float = field(default=0.2, metadata={"help": "the ratio's lower clip: 1 - clip_eps (> 0)"})
    clip_eps_high: float | None = field(default=None, metadata={
        "help": "the ratio's upper clip: 1 + clip_eps_high (clip-higher, > 0); null = clip_eps"})
    dual_clip_c: float | None = field(default=None, metadata={
        "help": "dual-clip: bound a negative advantage's loss at c * |A| (> 1); null = off"})

    def __post_init__(self) -> None:
        if not isinstance(self.clip_eps, (int, float)) or isinstance(self.clip_eps, bool):
            raise ValueError("clip_eps must be a number")
        if any(v is not None and v <= 0 for v in (self.clip_eps, self.clip_eps_high)):
            raise ValueError("clip_eps and clip_eps_high must be > 0")
        if self.dual_clip_c is not None and not self.dual_clip_c > 1.0:
            raise ValueError(f"dual_clip_c must be > 1 or None (off), got {self.dual_clip_c}")
        super().__post_init__()


@dataclass
class LossTermSettings(Settings):
    """What every learner's loss has: the aggregation of token losses and the KL and entropy terms."""
    loss_agg: str = field(default="token-mean", metadata={
        "help": "how token losses become one: token-mean, seq-mean-token-mean, seq-mean-token-sum, "
                "seq-mean-token-sum-norm (veRL's modes) or dr-grpo (TRL's dr_grpo)"})
    kl_coef: float = field(default=0.0, metadata={
        "help": "weight of the KL to the reference model (>= 0; 0 = no reference)"})
    kl_estimator: str = field(default="k3", metadata={"help": "KL estimator: k1, k2, k3 or low_var_kl"})
    entropy_coef: float = field(default=0.0, metadata={"help": "weight of the entropy bonus"})

    def __post_init__(self) -> None:
        if self.loss_agg not in LOSS_AGG_MODES:
            raise ValueError(f"loss_agg must be one of {LOSS_AGG_MODES}, got {self.loss_agg!r}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"kl_estimator must be one of {KL_ESTIMATORS}, got {self.kl_estimator!r}")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
        super().__post_init__()


@dataclass
class ValueLossSettings(Settings):
    """The critic's value loss: its weight and PPO's value clipping."""
    value_coef: float = field(default=0.5, metadata={"help": "weight of the value loss"})
    value_clip_eps: float | None = field(default=0.2, metadata={
        "help": "clip new values to old values +- this (PPO's clipped value loss); null = no clipping"})


@dataclass
class LossSettings(ClipSettings, ValueLossSettings, LossTermSettings):
    """What :func:`ppo_objective` needs to know: the settings blocks it reads (each knob declared once,
    in its block) plus ``max_len``, the constant ``L`` of ``seq-mean-token-sum-norm`` and ``dr-grpo``.
    The clip range is used when no ``policy_term`` is passed to :func:`ppo_objective`.

    A learner builds one per update with :meth:`of`: its config *is* a ``LossTermSettings`` (and a
    ``ClipSettings`` / ``ValueLossSettings`` when its objective clips a ratio / it has a critic);
    a block the config is not keeps the block's defaults, which the loss then does not read.
    """
    max_len: float | None = None

    @classmethod
    def of(cls, config: LossTermSettings, max_len: float | None = None, **changes: Any) -> "LossSettings":
        """The loss settings of a learner ``config``, block by block (``changes``: e.g. ``kl_coef=0``
        when the KL is in the reward, not the loss)."""
        values: dict[str, Any] = {"max_len": max_len}
        for block in (ClipSettings, ValueLossSettings, LossTermSettings):
            source = config if isinstance(config, block) else block()
            values.update({f.name: getattr(source, f.name) for f in dataclasses.fields(block)})
        return cls(**{**values, **changes})


def ppo_objective(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                  settings: LossSettings, *, sampled_mask: torch.Tensor | None = None,
                  entropy: torch.Tensor | None = None, ref_logp: torch.Tensor | None = None,
                  values: torch.Tensor | None = None, old_values: torch.Tensor | None = None,
                  returns: torch.Tensor | None = None, num_tokens: float | None = None,
                  num_seqs: float | None = None, is_weights: torch.Tensor | None = None,
                  policy_term: PolicyTerm | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``loss = policy_loss - entropy_coef·H + kl_coef·KL + value_coef·value_loss``, each term
    aggregated over ``mask`` (the training mask) with ``settings.loss_agg``.

    ``sampled_mask`` marks tokens with sampling-time log-probs (the trajectory's ``loss_mask``);
    where ``mask`` is 1 but ``sampled_mask`` is 0 (env tokens in the unmasked ablation), the old
    log-prob is the current one, detached. The KL term needs ``ref_logp``, the value term
    ``values``, ``old_values`` and ``returns``; the entropy term needs ``entropy``. ``is_weights``
    (detached, per token) multiplies the policy-gradient term: the truncated importance-sampling
    correction for a sampler whose log-probs differ from the learner's. ``policy_term`` (a learner's
    objective, :mod:`.objectives`) replaces PPO's clipped ratio with ``settings``' clip range.

    Returns the scalar loss and detached statistics (token means over ``mask`` unless noted).
    """
    agg = functools.partial(aggregate, mask=mask, mode=settings.loss_agg, num_tokens=num_tokens,
                            num_seqs=num_seqs, max_len=settings.max_len)
    if sampled_mask is not None:
        old_logp = torch.where(sampled_mask.bool(), old_logp, logp.detach())
    stats: dict[str, torch.Tensor] = {}
    ratio_mask = mask if sampled_mask is None else mask * sampled_mask.to(mask.dtype)
    if policy_term is None:
        pg, ratio, clipped = ppo_clip_term(logp, old_logp, advantages, settings)
    else:
        pg, ratio, clipped = policy_term(logp, old_logp, advantages, ratio_mask)
    stats["clip_frac"] = masked_mean(clipped, mask)
    if is_weights is not None:
        pg = pg * is_weights.detach()
    policy_loss = agg(pg)
    loss = policy_loss
    log_ratio = (logp - old_logp).detach()
    stats["policy_loss"] = policy_loss
    stats["approx_kl"] = masked_mean(torch.exp(log_ratio) - 1.0 - log_ratio, mask)  # k3 of old vs new
    stats["ratio_mean"] = masked_mean(ratio.detach(), mask)
    if entropy is not None:
        stats["entropy"] = masked_mean(entropy.detach(), mask)
        if settings.entropy_coef:
            loss = loss - settings.entropy_coef * agg(entropy)
    if ref_logp is not None:
        kl = kl_penalty(logp, ref_logp, settings.kl_estimator)
        stats["kl"] = masked_mean(kl.detach(), mask)
        if settings.kl_coef:
            loss = loss + settings.kl_coef * agg(kl)
    if values is not None:
        if old_values is None or returns is None:
            raise ValueError("the value loss needs old_values and returns")
        vf, vclip = clipped_value_loss(values, old_values, returns, settings.value_clip_eps)
        value_loss = agg(vf)
        loss = loss + settings.value_coef * value_loss
        stats["value_loss"] = value_loss
        stats["value_clip_frac"] = masked_mean(vclip, mask)
    stats = {k: v.detach().float() for k, v in stats.items()}
    return loss, stats
