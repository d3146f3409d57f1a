"""Token ids → the text the report shows: runs and pieces (for :mod:`agentgym.app.report`).

A *run* is consecutive tokens of one kind (prompt, environment, policy by ``loss_mask``) and one turn,
flagged where the mask disagrees with the policy turn spans or the token kinds. Each run is split into
*pieces* whose texts concatenate to exactly ``decode(run ids)``: one token each, except where a token
is only part of a character (byte-level BPE), and the whole run as one piece if a tokenizer defies
this — faithful text wins over boundaries. Why it is built this way: the module docstring of
:mod:`agentgym.app.report`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from agentgym.trajectory import SAMPLED_KINDS, Trajectory

__all__ = ["Piece", "token_pieces", "Run", "token_runs", "token_kinds_of", "special_token_ids"]


# --------------------------------------------------------------------------- decoding


@dataclass
class Piece:
    """Displayed unit of a run: its text and the token positions (absolute) it covers."""
    text: str
    positions: list[int]
    special: bool = False


def _decoder(tokenizer: Any) -> Callable[[Sequence[int]], str]:
    def decode(ids: Sequence[int]) -> str:
        # No clean-up: the viewer must show the text the model saw, spaces before punctuation included.
        return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)
    return decode


def special_token_ids(tokenizer: Any) -> set[int]:
    ids = set(int(i) for i in (getattr(tokenizer, "all_special_ids", None) or []))
    for i, tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(tok, "special", False):
            ids.add(int(i))
    return ids


def _incremental_pieces(decode: Callable[[Sequence[int]], str], ids: Sequence[int], start: int) -> list[Piece]:
    """Split ``ids`` into pieces by incremental decoding (the window trick of streaming detokenizers).

    Each new token's text is ``decode(prev + tok) - decode(prev)``, with ``prev`` the previous
    piece (so SentencePiece's leading-space handling is right); a token whose text is still an
    incomplete character ("\\ufffd" at the end) is held and joined with the tokens that complete it.
    """
    out: list[Piece] = []
    pending: list[int] = []
    prefix_off = read_off = 0
    for k in range(len(ids)):
        pending.append(start + k)
        prefix_text = decode(ids[prefix_off:read_off])
        new_text = decode(ids[prefix_off:k + 1])
        last = k + 1 == len(ids)
        complete = new_text.startswith(prefix_text) and len(new_text) > len(prefix_text) \
            and not new_text.endswith("\ufffd")
        if complete or last:
            text = new_text[len(prefix_text):] if new_text.startswith(prefix_text) else new_text
            out.append(Piece(text, pending))
            pending = []
            prefix_off, read_off = read_off, k + 1
    return out


def token_pieces(tokenizer: Any, ids: Sequence[int], start: int = 0,
                 special_ids: set[int] | None = None) -> list[Piece]:
    """Pieces of one run whose texts concatenate to exactly ``decode(ids)`` (special tokens kept).

    ``start`` is the absolute position of ``ids[0]`` in the trajectory (pieces carry positions).
    """
    decode = _decoder(tokenizer)
    special = special_token_ids(tokenizer) if special_ids is None else special_ids
    pieces: list[Piece] = []
    # split at special tokens: each is its own piece, the stretches between are decoded alone
    seg_start = 0
    for k in range(len(ids) + 1):
        if k < len(ids) and int(ids[k]) not in special:
            continue
        seg = list(ids[seg_start:k])
        if seg:
            pieces.extend(_segment_pieces(tokenizer, decode, seg, start + seg_start))
        if k < len(ids):
            pieces.append(Piece(decode([ids[k]]), [start + k], special=True))
        seg_start = k + 1
    if "".join(p.text for p in pieces) != decode(ids):
        # e.g. a tokenizer whose decode normalises across special tokens: keep the text faithful
        return [Piece(decode(ids), list(range(start, start + len(ids))))]
    return pieces


def _decode_singles(tokenizer: Any, ids: list[int]) -> list[str]:
    """Each id decoded alone, in one call (the Rust backend of fast tokenizers skips per-id Python overhead)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "decode_batch"):
        return backend.decode_batch([[i] for i in ids], skip_special_tokens=False)
    return tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _segment_pieces(tokenizer: Any, decode: Callable[[Sequence[int]], str], ids: list[int],
                    start: int) -> list[Piece]:
    whole = decode(ids)
    # fast path: right whenever every token decodes to its own text (checked against the whole)
    singles = _decode_singles(tokenizer, ids)
    if "".join(singles) == whole:
        return [Piece(t, [start + k]) for k, t in enumerate(singles)]
    pieces = _incremental_pieces(decode, ids, start)
    if "".join(p.text for p in pieces) == whole:
        return pieces
    return [Piece(whole, list(range(start, start + len(ids))))]


@dataclass
class Run:
    kind: str            # prompt | env | pol (from loss_mask)
    turn: int | None     # policy turn index, or the turn an env run follows
    start: int
    end: int
    mismatch: bool = False
    reward: float | None = None
    token_kind: str = "" # the tokens' kind (TOKEN_KINDS) — one per env run; policy runs are not split by it


def token_kinds_of(traj: Trajectory, n: int) -> list[str]:
    kinds = traj.kinds() if len(traj.loss_mask) == n else []
    return kinds if len(kinds) == n else ["env"] * n


def token_runs(traj: Trajectory) -> list[Run]:
    n = len(traj.token_ids)
    mask = list(traj.loss_mask[:n]) + [0] * max(0, n - len(traj.loss_mask))
    kinds = token_kinds_of(traj, n)
    expected = [0] * n
    turn_of = [None] * n
    for k, (s, e) in enumerate(traj.turn_spans):
        for i in range(max(0, s), min(n, e)):
            expected[i] = 1
            turn_of[i] = k
    runs: list[Run] = []
    turn = -1
    for i in range(n):
        if turn_of[i] is not None:
            turn = turn_of[i]
        kind = "pol" if mask[i] else ("prompt" if i < traj.prompt_length else "env")
        token_kind = kinds[i] if kind == "env" else ""
        key_turn = turn_of[i] if turn_of[i] is not None else (turn if turn >= 0 else None)
        bad = bool(mask[i]) != bool(expected[i]) or (kinds[i] in SAMPLED_KINDS) != bool(mask[i])
        r = runs[-1] if runs else None
        if r is not None and r.kind == kind and r.turn == key_turn and r.mismatch == bad and r.token_kind == token_kind:
            r.end = i + 1
        else:
            runs.append(Run(kind, key_turn, i, i + 1, bad, token_kind=token_kind))
    for k, (s, e) in enumerate(traj.turn_spans):
        if k < len(traj.step_rewards) and e > 0:
            for r in runs:
                if r.start < e <= r.end:
                    r.reward = traj.step_rewards[k] if r.reward is None else r.reward + traj.step_rewards[k]
    return runs

