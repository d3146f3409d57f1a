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
from pathlib import Path
from typing import Any, Mapping, Sequence

from agentgym.app.report_assets import CSS, JS
from agentgym.app.report_tokens import special_token_ids, token_kinds_of, token_runs, token_pieces
from agentgym.trajectory import SAMPLED_KINDS, Trajectory

__all__ = ["write_html_report", "render_html_report"]

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_MARKED = re.compile(r"[\x00-\x1f\x7f]")
_WS_CLASS = {"\n": "nl", "\t": "tab"}


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


_KIND_LABELS = {"prompt": "prompt", "policy": "policy", "template": "template", "tool": "tool output",
                "retrieved": "retrieved", "env": "environment"}


def _tokens_html(traj: Trajectory, tokenizer: Any, special: set[int]) -> tuple[str, bool]:
    """The token runs as HTML, and whether any token's mask disagrees with the turn spans."""
    parts = []
    mismatch = False
    lps = traj.logprobs
    for run in token_runs(traj):
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
        env_kinds = [k for i, k in enumerate(token_kinds_of(traj, n))
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



def render_html_report(trajectories: Sequence[Trajectory], tokenizer: Any = None,
                       metrics: Mapping[str, Any] | None = None, title: str = "agentgym trajectories",
                       sections: Sequence[tuple[str, str]] = ()) -> str:
    """The report as an HTML string (see :func:`write_html_report`)."""
    trajectories = list(trajectories)
    if metrics is None and trajectories:
        from agentgym.rollout_metrics import summarize
        metrics = summarize(trajectories)
    special = special_token_ids(tokenizer) if tokenizer is not None else set()
    cards = "".join(_card(i, t, tokenizer, special) for i, t in enumerate(trajectories))
    n_fail = sum(1 for t in trajectories if not (t.episode or {}).get("success"))
    legend = ('<span class="legend"><span class="run prompt">prompt</span><span class="run pol">policy (mask 1)</span>'
              'environment (mask 0): <span class="run env k-template">template</span><span class="run env k-tool">'
              'tool output</span><span class="run env k-retrieved">retrieved</span><span class="run env k-env">other'
              '</span><span class="run"><i class="sp">special</i></span><span class="run bad">mask ≠ turn spans or '
              'kind</span></span>')
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>{_esc(title)}</title><style>{CSS}</style></head>'
            f'<body><header><h1>{_esc(title)}</h1><div class="controls">'
            f'<label><input type="checkbox" id="failed-only"> failed only</label>'
            f'<label><input type="checkbox" id="hide-prompt"> hide prompt tokens</label>'
            f'<span id="counter">{len(trajectories)} trajectories ({n_fail} failed)</span>{legend}</div></header>'
            f'<main><details open><summary>batch metrics</summary><div id="metrics">'
            f'{_metrics_html(metrics or {})}</div></details>'
            + "".join(f'<details open><summary>{_esc(name)}</summary>{body}</details>' for name, body in sections)
            + f'{cards}</main>'
            f'<div id="tip"></div><script>{JS}</script></body></html>\n')


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
