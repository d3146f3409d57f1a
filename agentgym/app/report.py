"""A self-contained HTML viewer for trajectories: read what the policy saw and what it is trained on.

``write_html_report`` writes one HTML file (inline CSS and JS, nothing fetched) with the batch
metrics and one card per trajectory: the episode summary, the per-turn reward terms, and the token
sequence coloured by ``loss_mask`` — prompt, environment (mask 0) and policy (mask 1) tokens look
different, and a token whose mask disagrees with the policy turn spans is outlined in red, so a
masking bug shows at a glance. Environment tokens are further coloured by their kind
(``Trajectory.token_kinds``): chat-template glue, tool output, retrieved passages, other env text.

Why the text is built this way:

* The colours come from ``loss_mask`` itself (what the learner trains on), not from the turn spans;
  the spans are only used to flag disagreement. The kinds refine the colour of mask-0 tokens; a
  token whose kind disagrees with its mask (``policy`` kind ⇔ mask 1) is outlined in red as well.
* Tokens are grouped into *runs* (consecutive tokens of one kind and one turn) and each run is split
  into *pieces* whose texts concatenate to exactly ``decode(run ids)``. A piece is one token, except
  where a token is only part of a character (byte-level BPE splits multi-byte characters; decoding
  such a token alone gives "\\ufffd"): then the tokens that complete the character form one piece.
  If a tokenizer defies this, the whole run becomes one piece — faithful text wins over boundaries.
* Special tokens are pieces of their own, styled differently; newlines and tabs get a visible
  marker drawn by CSS (not part of the text, so copying the text gives the real text back).
* Token ids and log-probs live in one ``data-`` attribute per run rather than a ``title`` per
  token, which keeps 64 trajectories × 2k tokens to a few MB; a little JS shows them on hover.
* Without a tokenizer, or for chat-only trajectories (no token ids), the messages are shown by role.
"""

from __future__ import annotations

import html
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from agentgym.trajectory import SAMPLED_KINDS, Trajectory

__all__ = ["write_html_report", "render_html_report", "token_pieces", "Piece"]

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_MARKED = re.compile(r"[\x00-\x1f\x7f]")
_WS_CLASS = {"\n": "nl", "\t": "tab"}


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


def _special_ids(tokenizer: Any) -> set[int]:
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
    special = _special_ids(tokenizer) if special_ids is None else special_ids
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


# --------------------------------------------------------------------------- html helpers


def _esc(text: str) -> str:
    return html.escape(text, quote=False)


def _attr(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _text_html(text: str) -> str:
    """Escaped text with visible markers for newlines/tabs (CSS-drawn) and control characters."""
    if not _MARKED.search(text):  # the common case, kept cheap: ~130k calls for 64 × 2k tokens
        return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    out = []
    for part in re.split(r"([\n\t\r]|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f])", text):
        if not part:
            continue
        if part == "\r":  # a raw CR would be normalised to LF by the HTML parser; the reference is not
            out.append('<b class="cr"></b>&#13;')
        elif part in _WS_CLASS:
            out.append(f'<b class="{_WS_CLASS[part]}"></b>{part}')
        elif _CONTROL.fullmatch(part):
            out.append(f'<b class="ctl">\\x{ord(part):02x}</b>')
        else:
            out.append(_esc(part))
    return "".join(out)


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return str(v)
        if v == int(v) and abs(v) < 1e12:
            return str(int(v))
        return f"{v:.4g}"
    if isinstance(v, (dict, list, tuple)):
        return json.dumps(v, default=str, ensure_ascii=False)
    return str(v)


def _num(v: float) -> str:
    """Compact number for data attributes."""
    if v == 0:
        return "0"
    return f"{v:.4g}"


# --------------------------------------------------------------------------- cards


@dataclass
class _Run:
    kind: str            # prompt | env | pol (from loss_mask)
    turn: int | None     # policy turn index, or the turn an env run follows
    start: int
    end: int
    mismatch: bool = False
    reward: float | None = None
    token_kind: str = "" # the tokens' kind (TOKEN_KINDS) — one per env run; policy runs are not split by it


_KIND_LABELS = {"prompt": "prompt", "policy": "policy", "template": "template", "tool": "tool output",
                "retrieved": "retrieved", "env": "environment"}


def _token_kinds(traj: Trajectory, n: int) -> list[str]:
    kinds = traj.kinds() if len(traj.loss_mask) == n else []
    return kinds if len(kinds) == n else ["env"] * n


def _runs(traj: Trajectory) -> list[_Run]:
    n = len(traj.token_ids)
    mask = list(traj.loss_mask[:n]) + [0] * max(0, n - len(traj.loss_mask))
    kinds = _token_kinds(traj, n)
    expected = [0] * n
    turn_of = [None] * n
    for k, (s, e) in enumerate(traj.turn_spans):
        for i in range(max(0, s), min(n, e)):
            expected[i] = 1
            turn_of[i] = k
    runs: list[_Run] = []
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
            runs.append(_Run(kind, key_turn, i, i + 1, bad, token_kind=token_kind))
    for k, (s, e) in enumerate(traj.turn_spans):
        if k < len(traj.step_rewards) and e > 0:
            for r in runs:
                if r.start < e <= r.end:
                    r.reward = traj.step_rewards[k] if r.reward is None else r.reward + traj.step_rewards[k]
    return runs


def _tokens_html(traj: Trajectory, tokenizer: Any, special: set[int]) -> tuple[str, bool]:
    """The token runs as HTML, and whether any token's mask disagrees with the turn spans."""
    parts = []
    mismatch = False
    lps = traj.logprobs
    for run in _runs(traj):
        ids = traj.token_ids[run.start:run.end]
        mismatch = mismatch or run.mismatch
        pieces = token_pieces(tokenizer, ids, run.start, special)
        id_field = ",".join("+".join(str(traj.token_ids[p]) for p in pc.positions) for pc in pieces)
        kind_class = f" k-{run.token_kind}" if run.token_kind else ""
        attrs = [f'class="run {run.kind}{kind_class}{" bad" if run.mismatch else ""}"', f'data-start="{run.start}"',
                 f'data-ids="{id_field}"']
        if run.token_kind:
            attrs.append(f'data-kind="{_attr(_KIND_LABELS.get(run.token_kind, run.token_kind))}"')
        if run.turn is not None:
            attrs.append(f'data-turn="{run.turn}"')
        if run.kind == "pol":
            lp_field = ",".join("+".join(_num(lps[p]) if p < len(lps) else "" for p in pc.positions) for pc in pieces)
            attrs.append(f'data-lp="{lp_field}"')
        if run.reward is not None:
            attrs.append(f'data-r="{_num(run.reward)}"')
        inner = []
        for pc in pieces:
            cls = []
            if pc.special:
                cls.append("sp")
            if len(pc.positions) > 1:
                cls.append("mb")
            if run.kind == "pol" and any(p < len(lps) and lps[p] < -2.3 for p in pc.positions):
                cls.append("lo")  # sampled with p < 0.1
            c = f' class="{" ".join(cls)}"' if cls else ""
            inner.append(f"<i{c}>{_text_html(pc.text)}</i>")
        parts.append(f"<span {' '.join(attrs)}>{''.join(inner)}</span>")
    return "".join(parts), mismatch


def _messages_html(traj: Trajectory) -> str:
    out = []
    for m in traj.messages:
        role = str(m.get("role", "?"))
        kind = "pol" if role == "assistant" else ("prompt" if role in ("system", "user") else "env")
        name = f' · {_esc(str(m["name"]))}' if m.get("name") else ""
        out.append(f'<div class="msg {kind}"><div class="role">{_esc(role)}{name}</div>'
                   f'<div class="content">{_text_html(str(m.get("content", "")))}</div></div>')
    return "".join(out)


def _reward_table(traj: Trajectory) -> str:
    terms: list[str] = []
    for step in traj.reward_terms:
        for k in step:
            if k not in terms:
                terms.append(k)
    n = max(len(traj.step_rewards), len(traj.reward_terms))
    if not n:
        return '<p class="muted">no steps</p>'
    head = "".join(f"<th>{_esc(t)}</th>" for t in terms)
    rows = []
    for k in range(n):
        step = traj.reward_terms[k] if k < len(traj.reward_terms) else {}
        cells = "".join(f'<td class="{_sign(step.get(t))}">{_fmt(step[t]) if t in step else ""}</td>' for t in terms)
        r = traj.step_rewards[k] if k < len(traj.step_rewards) else None
        fin = traj.finish_reasons[k] if k < len(traj.finish_reasons) else ""
        rows.append(f"<tr><th>{k}</th>{cells}<td class=\"{_sign(r)} sr\">{_fmt(r) if r is not None else ''}</td>"
                    f"<td class=\"muted\">{_esc(fin)}</td></tr>")
    totals = {t: sum(s.get(t, 0.0) for s in traj.reward_terms) for t in terms}
    tot = "".join(f'<td class="{_sign(totals[t])}">{_fmt(float(totals[t]))}</td>' for t in terms)
    rows.append(f'<tr class="total"><th>Σ</th>{tot}<td class="{_sign(traj.total_reward)} sr">'
                f"{_fmt(traj.total_reward)}</td><td></td></tr>")
    return (f'<div class="scroll"><table class="rw"><thead><tr><th>turn</th>{head}<th>step reward</th>'
            f"<th>finish</th></tr></thead><tbody>{''.join(rows)}</tbody></table></div>")


def _sign(v: Any) -> str:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or v == 0:
        return "z"
    return "pos" if v > 0 else "neg"


def _card(i: int, traj: Trajectory, tokenizer: Any, special: set[int]) -> str:
    ep = traj.episode or {}
    success = bool(ep.get("success"))
    end = "truncated" if traj.truncated else ("terminated" if traj.terminated else "unfinished")
    if ep.get("end_reason"):
        end += f" ({ep['end_reason']})"
    ret = ep.get("return", traj.total_reward)
    facts = [("env", traj.env_id), ("task", traj.task_index), ("group", traj.group_id),
             ("success", success), ("return", ret), ("turns", ep.get("turns", traj.num_turns)),
             ("tool calls", ep.get("tool_calls", 0)), ("end", end)]
    shown = {"success", "return", "turns", "tool_calls", "terminated", "truncated", "task_index", "reward_terms",
             "end_reason"}
    facts += [(k.replace("_", " "), v) for k, v in ep.items() if k not in shown]
    facts_html = "".join(f'<span class="fact"><span class="k">{_esc(k)}</span> '
                         f'<span class="v">{_esc(_fmt(v))}</span></span>' for k, v in facts)
    n = len(traj.token_ids)
    n_pol = int(sum(traj.loss_mask))
    mask_note = ""
    if n:
        n_prompt = min(traj.prompt_length, n)
        env_kinds = [k for i, k in enumerate(_token_kinds(traj, n))
                     if i >= n_prompt and not (i < len(traj.loss_mask) and traj.loss_mask[i])]
        counts = {k: env_kinds.count(k) for k in _KIND_LABELS if env_kinds.count(k)}
        by_kind = (" (" + ", ".join(f'<span class="k-{k}">{c} {_KIND_LABELS[k]}</span>' for k, c in counts.items())
                   + ")") if traj.token_kinds is not None and counts else ""
        mask_note = (f'<span class="fact"><span class="k">tokens</span> <span class="v">{n} = '
                     f'<span class="prompt">{n_prompt} prompt</span> + <span class="pol">{n_pol} policy</span> + '
                     f'<span class="env">{n - n_prompt - n_pol} env</span>{by_kind}</span></span>')
    warnings = []
    if n and not (len(traj.loss_mask) == len(traj.logprobs) == n):
        warnings.append(f"length mismatch: ids {n}, loss_mask {len(traj.loss_mask)}, logprobs {len(traj.logprobs)}")
    if n and traj.token_kinds is not None and len(traj.loss_mask) == n and any(
            (k in SAMPLED_KINDS) != bool(m) for k, m in zip(traj.token_kinds, traj.loss_mask)):
        warnings.append("token kinds disagree with loss_mask (outlined in red)")
    body_kind = "tokens" if (tokenizer is not None and n) else "messages"
    if body_kind == "tokens":
        runs_html, mismatch = _tokens_html(traj, tokenizer, special)
        if mismatch:
            warnings.append("loss_mask disagrees with the policy turn spans (outlined in red)")
        body = f'<div class="tokens">{runs_html}</div>'
    else:
        body = f'<div class="messages">{_messages_html(traj)}</div>'
    warn_html = "".join(f'<div class="warn">⚠ {_esc(w)}</div>' for w in warnings)
    task = next((m.get("content", "") for m in traj.messages if m.get("role") == "user"), "")
    task_html = f'<div class="task">{_esc(str(task)[:300])}</div>' if task else ""
    status = "ok" if success else "fail"
    return (f'<section class="card {status}" id="t{i}" data-success="{int(success)}" data-index="{i}">'
            f'<h2><span class="badge {status}">{"✓ success" if success else "✗ failed"}</span> '
            f'#{i} {_esc(str(traj.env_id or ""))}</h2>{task_html}'
            f'<div class="facts">{facts_html}{mask_note}</div>{warn_html}'
            f'<details class="rwd" open><summary>reward terms per turn</summary>{_reward_table(traj)}</details>'
            f'<details class="body" open><summary>{body_kind}</summary>{body}</details></section>')


def _metrics_html(metrics: Mapping[str, Any]) -> str:
    """Batch metrics as small tables side by side, one per key prefix (``reward/``, ``time/``, …)."""
    if not metrics:
        return ""
    groups: dict[str, list[tuple[str, Any]]] = {}
    for k, v in metrics.items():
        groups.setdefault(k.split("/", 1)[0] if "/" in k else "", []).append((k, v))
    tables = []
    for prefix in sorted(groups, key=lambda p: (p != "", p != "reward", p)):
        rows = "".join(f"<tr><th>{_esc(k)}</th><td>{_esc(_fmt(v))}</td></tr>" for k, v in groups[prefix])
        tables.append(f'<table class="metrics" data-group="{_attr(prefix or "batch")}"><tbody>{rows}</tbody></table>')
    return "".join(tables)


_CSS = """
:root{--pol:#cfe8d4;--pol-b:#1f7a3a;--env:#ffe3b8;--env-b:#a15c00;--prompt:#e8e8ee;--prompt-b:#666;
--sp:#5b2a86;--bad:#d0021b;--tmpl:#ece4f5;--tmpl-b:#6b4f8a;--retr:#d6e9fb;--retr-b:#1d5f9e;--other:#fbf3c4;
--other-b:#7a6500}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Liberation Sans",sans-serif;margin:0;
background:#f6f7f9;color:#1d1d1f}
header{position:sticky;top:0;z-index:5;background:#fff;border-bottom:1px solid #ddd;padding:10px 18px}
header h1{font-size:18px;margin:0 0 6px}
.controls{display:flex;gap:14px;align-items:center;flex-wrap:wrap;font-size:13px}
.legend span{padding:1px 6px;border-radius:3px;margin-right:4px}
main{padding:12px 18px}
table{border-collapse:collapse;font-size:12.5px}
th,td{border:1px solid #ddd;padding:2px 7px;text-align:right;font-variant-numeric:tabular-nums}
th{background:#f0f1f4;text-align:left;font-weight:600}
#metrics{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start;margin:4px 0 12px}
.card{background:#fff;border:1px solid #d8d8de;border-left:6px solid #2e9d4e;border-radius:6px;
padding:8px 14px;margin:0 0 14px}
.card.fail{border-left-color:#d0021b}
.card h2{font-size:15px;margin:2px 0 4px}
.badge{font-size:12px;padding:1px 7px;border-radius:10px;color:#fff;background:#2e9d4e}
.badge.fail{background:#d0021b}
.task{color:#444;margin:0 0 4px;white-space:pre-wrap}
.facts{display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12.5px;margin-bottom:4px}
.fact .k{color:#777}.fact .v{font-weight:600}
.warn{background:#fde8ea;color:#9b0015;border:1px solid #f5b5bd;padding:3px 8px;margin:4px 0;border-radius:4px}
summary{cursor:pointer;color:#555;font-size:12.5px;margin:4px 0}
.rw td.pos{color:#1f7a3a}.rw td.neg{color:#b00020}.rw td.z{color:#999}.rw td.sr{font-weight:600}
.rw tr.total td,.rw tr.total th{border-top:2px solid #aaa}
.muted{color:#888}
.scroll{max-height:260px;overflow:auto;display:inline-block}
.tokens{font:12.5px/1.75 "DejaVu Sans Mono",Menlo,Consolas,monospace;white-space:pre-wrap;word-break:break-all;
border:1px solid #e2e2e8;border-radius:4px;padding:6px 8px;background:#fcfcfd}
.run i{font-style:normal;border-radius:2px}
.run.prompt{background:var(--prompt);color:#444}
.run.env{background:var(--env);color:#3d2600}
.run.pol{background:var(--pol);color:#0c3318;box-shadow:inset 0 -2px 0 var(--pol-b)}
.run.env.k-template{background:var(--tmpl);color:#3a2a4d}
.run.env.k-retrieved{background:var(--retr);color:#0d2f52}
.run.env.k-env{background:var(--other);color:#3d3300}
.run.prompt i:nth-child(even){background:#dcdce4}
.run.env i:nth-child(even){background:#fbd49c}
.run.env.k-template i:nth-child(even){background:#e0d3ee}
.run.env.k-retrieved i:nth-child(even){background:#bcdaf7}
.run.env.k-env i:nth-child(even){background:#f5e79a}
.run.pol i:nth-child(even){background:#b5dcbf}
.run i.sp{color:#fff;background:var(--sp)!important;font-weight:600;padding:0 2px;border-radius:3px}
.run i.mb{text-decoration:underline dotted #555}
.run.pol i.lo{text-decoration:underline wavy #c0392b}
.run.bad{outline:2px solid var(--bad);outline-offset:-1px}
.run[data-r]::after{content:"r=" attr(data-r);font:10px system-ui,sans-serif;color:#fff;background:#333;
border-radius:3px;padding:0 3px;margin-left:2px;vertical-align:super}
b.nl::before{content:"\\21B5";color:#9a9aa8;font-weight:400}
b.tab::before{content:"\\2192";color:#9a9aa8;font-weight:400}
b.cr::before{content:"\\240D";color:#9a9aa8;font-weight:400}
b.ctl{color:#b00020;font-weight:400}
body.hide-prompt .run.prompt{display:none}
body.failed-only .card.ok{display:none}
.messages .msg{border-left:4px solid #999;padding:3px 8px;margin:4px 0;border-radius:3px}
.msg .role{font-size:11.5px;font-weight:700;text-transform:uppercase;color:#555}
.msg .content{white-space:pre-wrap;font:12.5px/1.5 "DejaVu Sans Mono",Menlo,Consolas,monospace}
.msg.pol{background:var(--pol);border-color:var(--pol-b)}.msg.env{background:var(--env);border-color:var(--env-b)}
.msg.prompt{background:var(--prompt);border-color:var(--prompt-b)}
span.pol{color:var(--pol-b)}span.env{color:var(--env-b)}span.prompt{color:var(--prompt-b)}
span.k-template{color:var(--tmpl-b)}span.k-tool{color:var(--env-b)}span.k-retrieved{color:var(--retr-b)}
span.k-env{color:var(--other-b)}
#tip{position:fixed;z-index:10;display:none;pointer-events:none;background:#222;color:#fff;font:12px/1.4 monospace;
padding:4px 7px;border-radius:4px;max-width:520px;white-space:pre-wrap}
"""

_JS = r"""
(function(){
  var body = document.body, tip = document.getElementById('tip');
  var cards = Array.prototype.slice.call(document.querySelectorAll('section.card'));
  var counter = document.getElementById('counter');
  function update(){
    var failedOnly = document.getElementById('failed-only').checked;
    body.classList.toggle('failed-only', failedOnly);
    body.classList.toggle('hide-prompt', document.getElementById('hide-prompt').checked);
    var shown = cards.filter(function(c){ return !failedOnly || c.dataset.success !== '1'; }).length;
    var failed = cards.filter(function(c){ return c.dataset.success !== '1'; }).length;
    counter.textContent = 'showing ' + shown + ' of ' + cards.length + ' trajectories (' + failed + ' failed)';
  }
  document.getElementById('failed-only').addEventListener('change', update);
  document.getElementById('hide-prompt').addEventListener('change', update);
  // Token info from the run's data attributes: pieces are comma-separated, tokens of one piece '+'-joined.
  function info(el){
    var run = el.parentNode;
    if (!run || !run.classList || !run.classList.contains('run') || !run.dataset.ids) return null;
    var idx = Array.prototype.indexOf.call(run.children, el);
    var ids = run.dataset.ids.split(',')[idx].split('+');
    var pos = parseInt(run.dataset.start, 10);
    var pieces = run.dataset.ids.split(',');
    for (var k = 0; k < idx; k++) pos += pieces[k].split('+').length;
    var kind = run.classList.contains('pol') ? 'policy'
      : (run.classList.contains('env') ? (run.dataset.kind || 'environment') : 'prompt');
    var lines = [JSON.stringify(el.textContent)];
    var lps = run.dataset.lp ? run.dataset.lp.split(',')[idx].split('+') : null;
    ids.forEach(function(id, j){
      var s = 'token #' + (pos + j) + '  id ' + id + '  ' + kind;
      if (run.classList.contains('bad')) s += ' (MASK MISMATCH)';
      if (lps) { var lp = parseFloat(lps[j]); s += '  logprob ' + lp.toFixed(4) + '  p=' + Math.exp(lp).toFixed(3); }
      lines.push(s);
    });
    if (run.dataset.turn !== undefined) lines.push((kind === 'policy' ? 'turn ' : 'after turn ') + run.dataset.turn);
    if (run.classList.contains('env')) lines.push('environment token (loss_mask 0)');
    if (el.classList.contains('mb')) lines.push('(tokens joined: together they form one character)');
    return lines.join('\n');
  }
  document.addEventListener('mouseover', function(e){
    var t = e.target.closest ? e.target.closest('.run > i') : null;
    var text = t ? info(t) : null;
    if (!text) { tip.style.display = 'none'; return; }
    tip.textContent = text; tip.style.display = 'block';
  });
  document.addEventListener('mousemove', function(e){
    if (tip.style.display === 'none') return;
    var x = Math.min(e.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
    var y = e.clientY + 18 + tip.offsetHeight > window.innerHeight ? e.clientY - tip.offsetHeight - 10 : e.clientY + 18;
    tip.style.left = x + 'px'; tip.style.top = y + 'px';
  });
  if (/(^|[#&])failed($|&)/.test(location.hash)) document.getElementById('failed-only').checked = true;
  update();
  // '#selftest' (used by the tests through headless Chromium): hover the first policy token (and the first
  // tool-output token) and keep the tooltips.
  if (/selftest/.test(location.hash)) {
    var first = document.querySelector('.run.pol > i');
    var out = document.createElement('pre'); out.id = 'selftest';
    out.textContent = first ? info(first) : 'no policy token';
    body.appendChild(out);
    var tool = document.querySelector('.run.env.k-tool > i');
    var outTool = document.createElement('pre'); outTool.id = 'selftest-tool';
    outTool.textContent = tool ? info(tool) : 'no tool token';
    body.appendChild(outTool);
  }
  body.dataset.ready = '1';
})();
"""


def render_html_report(trajectories: Sequence[Trajectory], tokenizer: Any = None,
                       metrics: Mapping[str, Any] | None = None, title: str = "agentgym trajectories",
                       sections: Sequence[tuple[str, str]] = ()) -> str:
    """The report as an HTML string (see :func:`write_html_report`)."""
    trajectories = list(trajectories)
    if metrics is None and trajectories:
        from agentgym.rollout import summarize  # kernel; lazy so the viewer itself stays light
        metrics = summarize(trajectories)
    special = _special_ids(tokenizer) if tokenizer is not None else set()
    cards = "".join(_card(i, t, tokenizer, special) for i, t in enumerate(trajectories))
    n_fail = sum(1 for t in trajectories if not (t.episode or {}).get("success"))
    legend = ('<span class="legend"><span class="run prompt">prompt</span><span class="run pol">policy (mask 1)</span>'
              'environment (mask 0): <span class="run env k-template">template</span><span class="run env k-tool">'
              'tool output</span><span class="run env k-retrieved">retrieved</span><span class="run env k-env">other'
              '</span><span class="run"><i class="sp">special</i></span><span class="run bad">mask ≠ turn spans or '
              'kind</span></span>')
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>{_esc(title)}</title><style>{_CSS}</style></head>'
            f'<body><header><h1>{_esc(title)}</h1><div class="controls">'
            f'<label><input type="checkbox" id="failed-only"> failed only</label>'
            f'<label><input type="checkbox" id="hide-prompt"> hide prompt tokens</label>'
            f'<span id="counter">{len(trajectories)} trajectories ({n_fail} failed)</span>{legend}</div></header>'
            f'<main><details open><summary>batch metrics</summary><div id="metrics">'
            f'{_metrics_html(metrics or {})}</div></details>'
            + "".join(f'<details open><summary>{_esc(name)}</summary>{body}</details>' for name, body in sections)
            + f'{cards}</main>'
            f'<div id="tip"></div><script>{_JS}</script></body></html>\n')


def write_html_report(path: str | Path, trajectories: Sequence[Trajectory], tokenizer: Any = None,
                      metrics: Mapping[str, Any] | None = None, title: str = "agentgym trajectories",
                      sections: Sequence[tuple[str, str]] = ()) -> Path:
    """Write one self-contained HTML file showing ``trajectories`` token by token; returns its path.

    ``tokenizer`` decodes token ids (without it, messages are shown by role); ``metrics`` (e.g.
    ``RolloutBatch.metrics``) fills the header table, computed with ``summarize`` when omitted.
    ``sections``: extra ``(title, trusted HTML)`` blocks shown after it (the trainer adds training health).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html_report(trajectories, tokenizer, metrics, title, sections), encoding="utf-8",
                    errors="surrogatepass")
    return path
