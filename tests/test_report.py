"""The HTML trajectory viewer: structure checked by parsing the file, rendering checked in headless Chromium.

Trajectories are real: the SmolLM2 tokenizer, ``ScriptedPolicy`` on ``Arithmetic-v0`` through the
``RolloutEngine`` in both formatter styles. Chromium is required (``apt-get install chromium``);
the rendering tests fail, not skip, without it.
"""

from __future__ import annotations

import dataclasses
import html
import inspect
import json
import re
import shutil
import struct
import subprocess
import time
import zlib
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

import agentgym.rollout
from agentgym.policies.models import load_tokenizer
from agentgym.policies.scripted import ScriptedPolicy
from agentgym.policy import Generation
from agentgym.app.report_tokens import token_pieces
from agentgym.app.report import write_html_report
from agentgym.rollout_config import RolloutConfig
from agentgym.rollout import RolloutEngine
from agentgym.trajectory import TrajectoryBuilder

CHROMIUM = "/usr/bin/chromium"
WRONG = "Let me think…\n\t<answer>é 世界 🎉 & </pre><script>alert(1)</script></answer>"


def mixed_script(ctx: dict[str, Any]) -> str:
    """Hard tasks: a correct calculator call, then the answer. Easy tasks: a wrong answer full of
    multi-byte characters and HTML, so the batch has failures and text that must be escaped."""
    task = ctx["task"]
    if task["difficulty"] == "hard":
        if ctx["turn"] == 0:
            call = {"name": "calculator", "arguments": {"expression": task["expression"]}}
            return f"<tool_call>{json.dumps(call)}</tool_call>"
        return "<answer>%s</answer>" % task["answers"][0]
    return WRONG


# --------------------------------------------------------------------------- parsing the report


@dataclasses.dataclass
class Run:
    classes: set[str]
    attrs: dict[str, str]
    pieces: list[tuple[str, set[str]]] = dataclasses.field(default_factory=list)

    @property
    def kind(self) -> str:
        return next(k for k in ("pol", "env", "prompt") if k in self.classes)

    @property
    def text(self) -> str:
        return "".join(t for t, _ in self.pieces)

    @property
    def plain_text(self) -> str:
        """Text without special tokens (what ``decode(skip_special_tokens=True)`` gives)."""
        return "".join(t for t, c in self.pieces if "sp" not in c)

    @property
    def ids(self) -> list[int]:
        return [int(x) for p in self.attrs["data-ids"].split(",") for x in p.split("+")]


@dataclasses.dataclass
class Card:
    attrs: dict[str, str]
    classes: set[str]
    runs: list[Run] = dataclasses.field(default_factory=list)
    messages: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (classes, text)
    text: str = ""


class ReportParser(HTMLParser):
    """Cards, their token runs (pieces with classes) and message blocks, from the report's HTML."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.cards: list[Card] = []
        self.metrics: dict[str, str] = {}
        self.stack: list[tuple[str, set[str]]] = []
        self._piece: list[str] | None = None
        self._piece_cls: set[str] = set()
        self._msg: list[str] | None = None
        self._metric_key: list[str] | None = None
        self._metric_val: list[str] | None = None
        self._last_key = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        cls = set(a.get("class", "").split())
        self.stack.append((tag, cls))
        if tag == "section" and "card" in cls:
            self.cards.append(Card(a, cls))
        elif tag == "span" and "run" in cls and self.cards and "data-ids" in a:
            self.cards[-1].runs.append(Run(cls, a))
        elif tag == "i" and self.cards and self.cards[-1].runs and self._in("run"):
            self._piece, self._piece_cls = [], cls
        elif tag == "div" and "content" in cls and self.cards:
            self._msg = []
        elif tag == "th" and self._in("metrics"):
            self._metric_key = []
        elif tag == "td" and self._in("metrics"):
            self._metric_val = []

    def _in(self, cls: str) -> bool:
        return any(cls in c for _, c in self.stack)

    def handle_endtag(self, tag: str) -> None:
        if tag == "i" and self._piece is not None:
            self.cards[-1].runs[-1].pieces.append(("".join(self._piece), self._piece_cls))
            self._piece = None
        elif tag == "div" and self._msg is not None:
            parent_cls = self.stack[-2][1] if len(self.stack) > 1 else set()
            self.cards[-1].messages.append((" ".join(sorted(parent_cls)), "".join(self._msg)))
            self._msg = None
        elif tag == "th" and self._metric_key is not None:
            self._last_key, self._metric_key = "".join(self._metric_key), None
        elif tag == "td" and self._metric_val is not None:
            self.metrics[self._last_key], self._metric_val = "".join(self._metric_val), None
        while self.stack:
            if self.stack.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        for buf in (self._piece, self._msg, self._metric_key, self._metric_val):
            if buf is not None:
                buf.append(data)
        if self.cards:
            self.cards[-1].text += data


def without_piece_tags(markup: str) -> str:
    return re.sub(r'</?i(?: class="[^"]*")?>', "", markup)


def parse(path: Path) -> ReportParser:
    p = ReportParser()
    p.feed(path.read_text(encoding="utf-8"))
    p.close()
    return p


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


@pytest.fixture(scope="module", params=["chat", "continuation"])
def batch(request, tok):
    engine = RolloutEngine(ScriptedPolicy(tok, mixed_script), RolloutConfig(style=request.param, debug_checks=True))
    try:
        b = engine.collect("Arithmetic-v0", num_groups=4, group_size=2, seed=0)
    finally:
        engine.close()
    outcomes = {bool(t.episode["success"]) for t in b.trajectories}
    assert outcomes == {True, False}, "the fixture batch should hold successes and failures"
    return request.param, b


@pytest.fixture(scope="module")
def report(batch, tok, tmp_path_factory):
    style, b = batch
    path = write_html_report(tmp_path_factory.mktemp(f"report-{style}") / "report.html", b.trajectories, tok,
                             b.metrics, title=f"Arithmetic <{style}>")
    return path, b, parse(path)


def chromium(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"{CHROMIUM} not found: the report's rendering test needs Chromium "
                    "(Debian/Ubuntu: apt-get install -y chromium)")
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           "--disable-dev-shm-usage", *args], capture_output=True, text=True, timeout=timeout)


# --------------------------------------------------------------------------- structure


def test_every_token_is_shown_once_in_order_with_faithful_text(report, tok):
    path, b, rep = report
    assert len(rep.cards) == len(b.trajectories)
    for card, traj in zip(rep.cards, b.trajectories):
        assert [i for r in card.runs for i in r.ids] == traj.token_ids
        assert "".join(r.text for r in card.runs) == tok.decode(traj.token_ids, skip_special_tokens=False)
        # colours follow loss_mask exactly
        assert [int(r.kind == "pol") for r in card.runs for _ in r.ids] == traj.loss_mask
        assert sum(len(r.ids) for r in card.runs if r.kind == "prompt") == traj.prompt_length
        assert not any("bad" in r.classes for r in card.runs)


def test_policy_runs_read_back_as_the_actions(report):
    _, b, rep = report
    for card, traj in zip(rep.cards, b.trajectories):
        pol = [r for r in card.runs if r.kind == "pol"]
        assert [int(r.attrs["data-turn"]) for r in pol] == list(range(traj.num_turns))
        assert [r.plain_text for r in pol] == traj.actions
        # the sampled EOS is a special-token piece inside the policy run, carrying the step reward
        for r, reward in zip(pol, traj.step_rewards):
            assert r.pieces[-1] == ("<|im_end|>", {"sp"})
            assert float(r.attrs["data-r"]) == pytest.approx(reward, abs=1e-3)
            assert len(r.attrs["data-lp"].split(",")) == len(r.pieces)


def test_environment_runs_hold_the_tool_output(report):
    _, b, rep = report
    with_tool = [(c, t) for c, t in zip(rep.cards, b.trajectories) if t.episode["tool_calls"]]
    assert with_tool, "seed 0 should give hard tasks"
    for card, traj in with_tool:
        tool_out = next(m["content"] for m in traj.messages if m["role"] == "tool")
        env_after_call = "".join(r.text for r in card.runs if r.kind == "env" and r.attrs.get("data-turn") == "0")
        assert tool_out == str(int(tool_out))
        assert tool_out in env_after_call
        assert not any(r.kind == "env" and tool_out in r.text for r in card.runs if r.attrs.get("data-turn") != "0")


def test_environment_tokens_are_coloured_by_kind(batch, report, tok, tmp_path):
    """Env runs carry their token kind (class ``k-<kind>`` and a ``data-kind`` label); the tool output
    sits in ``tool`` runs, role headers and end-of-turn tokens in ``template`` runs."""
    path, b, rep = report
    for card, traj in zip(rep.cards, b.trajectories):
        for r in card.runs:
            start = int(r.attrs["data-start"])
            kinds = set(traj.token_kinds[start:start + len(r.ids)])
            if r.kind == "env":
                (kind,) = kinds  # one kind per env run
                assert f"k-{kind}" in r.classes and r.attrs["data-kind"]
            else:
                assert kinds == {"policy" if r.kind == "pol" else "prompt"} and "data-kind" not in r.attrs
    with_tool = [(c, t) for c, t in zip(rep.cards, b.trajectories) if t.episode["tool_calls"]]
    for card, traj in with_tool:
        tool_out = next(m["content"] for m in traj.messages if m["role"] == "tool")
        assert [r.text for r in card.runs if "k-tool" in r.classes] == [tool_out]
        assert all(r.attrs["data-kind"] == "tool output" for r in card.runs if "k-tool" in r.classes)
        template = "".join(r.text for r in card.runs if "k-template" in r.classes)
        if batch[0] == "chat":
            assert "<|im_start|>" in template and tool_out not in template
        else:  # continuation: env text is appended raw, no template glue after the prompt
            assert template == ""
        assert "tool output" in card.text  # the per-kind token counts
    raw = path.read_text(encoding="utf-8")
    assert '<span class="run env k-retrieved">retrieved</span>' in raw  # the legend

    # a trajectory written before kinds existed: its env tokens are plain "env" (derived from the mask)
    old = dataclasses.replace(with_tool[0][1], token_kinds=None)
    card = parse(write_html_report(tmp_path / "old.html", [old], tok)).cards[0]
    assert {r.attrs.get("data-kind") for r in card.runs if r.kind == "env"} == {"environment"}
    assert not any("bad" in r.classes for r in card.runs) and "token kinds disagree" not in card.text


def test_kind_that_disagrees_with_the_mask_is_flagged(report, tok, tmp_path):
    _, b, _ = report
    traj = next(t for t in b.trajectories if t.episode["tool_calls"])
    s0, e0 = traj.turn_spans[0]
    kinds = list(traj.token_kinds)
    kinds[s0:s0 + 2] = ["tool", "tool"]  # sampled tokens labelled as tool output
    card = parse(write_html_report(tmp_path / "kinds.html", [dataclasses.replace(traj, token_kinds=kinds)], tok)).cards[0]
    bad = [r for r in card.runs if "bad" in r.classes]
    assert [(r.kind, len(r.ids)) for r in bad] == [("pol", 2)]
    assert "token kinds disagree with loss_mask" in card.text


def test_html_is_escaped_and_whitespace_is_marked(report):
    path, b, rep = report
    raw = path.read_text(encoding="utf-8")
    assert "<tool" not in raw and "<answer" not in raw and "<script>alert" not in raw and "</pre><script" not in raw
    text = without_piece_tags(raw)  # tokens are separate <i> elements: join them to see the escaped text
    assert "&lt;tool_call&gt;" in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text and "&lt;/pre&gt;" in text
    assert "<title>Arithmetic &lt;" in raw
    assert raw.count("<script>") == 1  # only the viewer's own
    # the unescaped text comes back through an HTML parser
    failed = [c for c, t in zip(rep.cards, b.trajectories) if not t.episode["success"]]
    assert failed and all(WRONG in "".join(r.plain_text for r in c.runs if r.kind == "pol") for c in failed)
    # multi-byte characters are never shown as replacement characters; their tokens are grouped
    assert "\ufffd" not in raw
    grouped = [t for c in failed for r in c.runs if r.kind == "pol" for t, cls in r.pieces if "mb" in cls]
    assert {"世", "界"} <= {g.strip() for g in grouped} and any("🎉" in g for g in grouped)
    # newlines and tabs carry a visible marker in front of the real character
    assert '<b class="nl"></b>\n' in raw and '<b class="tab"></b>\t' in raw


def test_summary_reward_table_and_metrics(report):
    path, b, rep = report
    assert float(rep.metrics["success_rate"]) == pytest.approx(b.metrics["success_rate"], rel=1e-3)
    assert "reward/correct" in rep.metrics and "time/wall_s" in rep.metrics
    for i, (card, traj) in enumerate(zip(rep.cards, b.trajectories)):
        ok = bool(traj.episode["success"])
        assert card.attrs["data-success"] == str(int(ok)) and ("ok" if ok else "fail") in card.classes
        assert card.attrs["id"] == f"t{i}"
        for fact in (f"task {traj.task_index}", f"group {traj.group_id}", f"turns {traj.num_turns}",
                     f"tool calls {traj.episode['tool_calls']}", "end terminated", "env Arithmetic-v0"):
            assert fact in card.text
    raw = path.read_text(encoding="utf-8")
    card = raw[raw.index('<section class="card'):raw.index("</section>")]
    table = card[card.index('<table class="rw">'):card.index("</table>")]
    for term in b.trajectories[0].reward_terms[0]:
        assert f"<th>{term}</th>" in table
    # one header row and one row per turn (the total row has its own class)
    assert "step reward" in table and table.count("<tr>") == b.trajectories[0].num_turns + 1


# --------------------------------------------------------------------------- special cases


def test_mask_bug_is_flagged(report, tok, tmp_path):
    _, b, _ = report
    traj = next(t for t in b.trajectories if t.episode["tool_calls"])
    # a classic bug: tool output trained on (loss_mask 1 on environment tokens)
    mask = list(traj.loss_mask)
    s0, e0 = traj.turn_spans[0]
    s1, _ = traj.turn_spans[1]
    mask[e0:s1] = [1] * (s1 - e0)
    path = write_html_report(tmp_path / "bug.html", [dataclasses.replace(traj, loss_mask=mask)], tok)
    card = parse(path).cards[0]
    bad = [r for r in card.runs if "bad" in r.classes]
    assert [(r.kind, len(r.ids)) for r in bad] == [("pol", s1 - e0)]
    assert "loss_mask disagrees with the policy turn spans" in card.text


def test_messages_view_without_tokenizer_or_token_ids(report, tmp_path):
    _, b, _ = report

    class ScriptedChatPolicy:
        """A message-level policy (like a hosted model): no tokens, only text."""

        def respond(self, conversations, sampling, tools=None):
            return [Generation([], [], "<answer>1 <b>bold</b></answer>", "stop") for _ in conversations]

    engine = RolloutEngine(ScriptedChatPolicy())
    chat_only = engine.collect("Arithmetic-v0", num_groups=2, seed=1).trajectories
    engine.close()
    assert all(not t.token_ids for t in chat_only)
    for trajs, tokenizer in ((chat_only, None), (b.trajectories[:2], None)):
        path = write_html_report(tmp_path / "messages.html", trajs, tokenizer)
        rep = parse(path)
        for card, traj in zip(rep.cards, trajs):
            assert not card.runs
            assert [t for _, t in card.messages] == [m["content"] for m in traj.messages]
            assert [set(c.split()) - {"msg"} for c, _ in card.messages] == [
                {"pol" if m["role"] == "assistant" else "env" if m["role"] == "tool" else "prompt"}
                for m in traj.messages]
        raw = path.read_text(encoding="utf-8")
        assert "<b>bold" not in raw and "<tool_call>" not in raw and "<answer>" not in raw


def test_token_pieces_concatenate_to_the_decoded_text(tok, tmp_path):
    text = "naïve café — 日本語 🎉🎉 x\r\n\ty <|im_end|>tail\x00"
    ids = tok.encode(text, add_special_tokens=False)
    pieces = token_pieces(tok, ids, start=10)
    assert "".join(p.text for p in pieces) == tok.decode(ids, skip_special_tokens=False) == text
    assert [pos for p in pieces for pos in p.positions] == list(range(10, 10 + len(ids)))
    assert [p.text for p in pieces if p.special] == ["<|im_end|>"]
    assert all("\ufffd" not in p.text for p in pieces)
    assert any(len(p.positions) > 1 for p in pieces)  # at least one multi-token character

    # through the HTML: CR survives (as a character reference), NUL is shown as a visible escape
    builder = TrajectoryBuilder(tok.encode("prompt\r\n", add_special_tokens=False), [])
    builder.add_policy(ids, [-0.1] * len(ids), text, "stop")
    path = write_html_report(tmp_path / "ws.html", [builder.build()], tok)
    raw = path.read_text(encoding="utf-8")
    assert '<b class="cr"></b>&#13;' in raw and '<b class="ctl">\\x00</b>' in raw
    run = next(r for r in parse(path).cards[0].runs if r.kind == "pol")
    assert run.text == text.replace("\x00", "\\x00")


def test_large_batch_stays_small_and_fast(tok, tmp_path):
    """64 trajectories × ~2k tokens (real text, real tokenizer) stay a few MB."""
    text = inspect.getsource(agentgym.rollout)
    ids = tok.encode(text, add_special_tokens=False)
    trajs = []
    for g in range(64):
        builder = TrajectoryBuilder(ids[:300], [{"role": "user", "content": "..."}])
        pos = 300 + g
        while len(builder) < 2000:
            chunk = ids[pos:pos + 120]
            builder.add_policy(chunk, [-0.5 - 0.01 * k for k in range(len(chunk))], tok.decode(chunk), "stop")
            builder.add_step(0.1, {"format": 0.1})
            builder.add_env(ids[pos + 120:pos + 300])
            pos += 300
        trajs.append(builder.build(episode={"success": g % 3 == 0}, terminated=True, group_id=g // 8, env_id="x"))
    t0 = time.perf_counter()
    path = write_html_report(tmp_path / "big.html", trajs, tok)
    elapsed = time.perf_counter() - t0
    size = path.stat().st_size
    assert size < 6_000_000, f"{size / 1e6:.1f} MB"
    assert elapsed < 20, f"{elapsed:.1f} s"


# --------------------------------------------------------------------------- rendering in Chromium


def test_renders_in_headless_chromium(report, tok, tmp_path):
    path, b, _ = report
    profile = tmp_path / "profile"
    n, failed = len(b.trajectories), sum(not t.episode["success"] for t in b.trajectories)

    dom = chromium(f"--user-data-dir={profile}", "--dump-dom", path.resolve().as_uri() + "#selftest")
    assert dom.returncode == 0, dom.stderr[-2000:]
    out = dom.stdout
    assert 'data-ready="1"' in out, "the viewer's script did not run"
    assert f"showing {n} of {n} trajectories ({failed} failed)" in out
    assert out.count('<section class="card') == n and 'id="metrics"' in out and "success_rate" in out
    # the hover tooltip, computed by the script for the first policy token
    tip = html.unescape(out[out.index('<pre id="selftest">'):].split("</pre>", 1)[0])
    first = b.trajectories[0]
    start = first.turn_spans[0][0]
    assert f"token #{start}  id {first.token_ids[start]}  policy  logprob 0.0000  p=1.000" in tip
    assert "turn 0" in tip and json.dumps(tok.decode([first.token_ids[start]])) in tip
    # the first tool-output token's tooltip names its kind
    tool_tip = html.unescape(out[out.index('<pre id="selftest-tool">'):].split("</pre>", 1)[0])
    assert "tool output" in tool_tip and "environment token (loss_mask 0)" in tool_tip and "after turn 0" in tool_tip
    assert "<tool" not in out and "&lt;tool_call&gt;" in without_piece_tags(out)

    dom = chromium(f"--user-data-dir={profile}", "--dump-dom", path.resolve().as_uri() + "#failed")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "failed-only" in dom.stdout and f"showing {failed} of {n} trajectories" in dom.stdout

    shot = tmp_path / "shot.png"
    res = chromium(f"--user-data-dir={profile}", f"--screenshot={shot}", "--window-size=1200,2000",
                   path.resolve().as_uri())
    assert res.returncode == 0 and shot.is_file(), res.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1200, 2000)
    assert len(data) > 50_000, f"screenshot is only {len(data)} bytes: blank page?"
    # the page is not a flat colour: decompressed scanlines hold many distinct bytes
    idat = b"".join(data[i + 8:i + 8 + struct.unpack(">I", data[i:i + 4])[0]]
                    for i in _png_chunks(data, b"IDAT"))
    assert len(set(zlib.decompress(idat))) > 64


def _png_chunks(data: bytes, kind: bytes) -> list[int]:
    """Offsets of the chunks of type ``kind`` in a PNG."""
    out, i = [], 8
    while i < len(data):
        length = struct.unpack(">I", data[i:i + 4])[0]
        if data[i + 4:i + 8] == kind:
            out.append(i)
        i += 12 + length
    return out
