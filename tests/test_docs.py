"""The README and the guides in docs/ are tested like code.

* Every ```python block runs. The blocks of one page run in order in one fresh Python process (a block
  may use what an earlier block on its page defined), in an empty temporary directory, offline
  (``HF_HUB_OFFLINE=1``), on one thread. A block is skipped only when the line just before its fence is
  ``<!-- not-run: REASON -->`` with a real reason (a GPU, vLLM, a model download, minutes of compute).
* Every ``agentgym ...`` command in a ```bash block parses with the real command line
  (``agentgym.app.cli.build_parser()``): the subcommand and its flags exist, and its ``key=value``
  overrides name real config keys.
* Every relative link resolves to a file of this repository (and a ``#heading`` to a heading there).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"^<!--\s*not-run:(.*?)-->\s*$")
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)")
MIN_REASON_WORDS = 3


@dataclass
class Block:
    page: str          # path relative to the repository root
    line: int          # 1-based line of the block's first code line
    lang: str
    code: str
    not_run: str | None = None    # the marker's reason; "" for a marker without one


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def parse_blocks(text: str, page: str) -> tuple[list[Block], list[str]]:
    """Fenced code blocks of a markdown text, and the problems with its not-run markers."""
    lines = text.split("\n")
    blocks: list[Block] = []
    problems: list[str] = []
    used_markers: set[int] = set()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang = m.group(1), m.group(2).lower()
        start = i + 1
        j = start
        while j < len(lines) and not re.match(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[j]):
            j += 1
        block = Block(page, start + 1, lang, "\n".join(lines[start:j]) + "\n")
        marker = MARKER.match(lines[i - 1].strip()) if i > 0 else None
        if marker:
            used_markers.add(i - 1)
            block.not_run = marker.group(1).strip()
            if lang != "python":
                problems.append(f"{page}:{i}: a not-run marker before a ```{lang or '(no language)'} block "
                                "(only ```python blocks run)")
            elif len(block.not_run.split()) < MIN_REASON_WORDS:
                problems.append(f"{page}:{i}: a not-run marker needs a reason (why the block cannot run here), "
                                f"got {block.not_run!r}")
        blocks.append(block)
        i = j + 1
    for k, line in enumerate(lines):
        if line.strip().startswith("<!--") and "not-run" in line and k not in used_markers:
            problems.append(f"{page}:{k + 1}: a not-run marker that is not on the line just before a ```python fence")
    return blocks, problems


def page_blocks(path: Path) -> tuple[list[Block], list[str]]:
    return parse_blocks(path.read_text(encoding="utf-8"), rel(path))


def runnable(blocks: list[Block]) -> list[Block]:
    return [b for b in blocks if b.lang == "python" and b.not_run is None]


# --------------------------------------------------------------------------- python blocks run

DRIVER = r"""
import json, sys, traceback
ns = {"__name__": "__main__"}
for b in json.load(sys.stdin):
    code = "\n" * (b["line"] - 1) + b["code"]    # tracebacks name the page and its line numbers
    try:
        exec(compile(code, b["page"], "exec"), ns)
    except BaseException:
        traceback.print_exc()
        print(f"\ndoc block failed: {b['page']}, the block starting at line {b['line']}", file=sys.stderr)
        sys.exit(1)
"""


def run_blocks(blocks: list[Block], cwd: Path, timeout: float = 100) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "MPLBACKEND": "Agg", "AGENTGYM_DEBUG": "1"}
    payload = json.dumps([{"page": b.page, "line": b.line, "code": b.code} for b in blocks])
    return subprocess.run([sys.executable, "-c", DRIVER], input=payload, cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=timeout)


PAGES_WITH_CODE = [p for p in PAGES if runnable(page_blocks(p)[0])]


def test_not_run_markers_have_reasons():
    problems = [msg for p in PAGES for msg in page_blocks(p)[1]]
    assert not problems, "\n".join(problems)


def test_most_python_blocks_run():
    """The runnable blocks are the rule; the opted-out ones are the exception (each with its reason)."""
    blocks = [b for p in PAGES for b in page_blocks(p)[0] if b.lang == "python"]
    assert len(runnable(blocks)) >= 8 and len(runnable(blocks)) > len(blocks) / 2, \
        [(b.page, b.line, b.not_run) for b in blocks]
    assert "README.md" in {rel(p) for p in PAGES_WITH_CODE}      # the README's first example runs


@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=rel)
def test_python_blocks_run(page, tmp_path):
    result = run_blocks(runnable(page_blocks(page)[0]), tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]


def test_a_failing_block_fails_and_a_marker_needs_a_reason(tmp_path):
    """The checks above can fail: a broken block is reported with its page and line; a bare marker is refused."""
    text = "# t\n\n```python\nx = 1\n```\n\n```python\nassert x == 2, 'broken'\n```\n"
    blocks, problems = parse_blocks(text, "t.md")
    assert not problems and [b.line for b in blocks] == [4, 8]
    result = run_blocks(blocks, tmp_path)
    assert result.returncode == 1 and 'File "t.md", line 8' in result.stderr and "broken" in result.stderr
    for bare in ("<!-- not-run: -->", "<!-- not-run: slow -->"):
        _, problems = parse_blocks(f"{bare}\n```python\nx = 1\n```\n", "t.md")
        assert problems and "needs a reason" in problems[0]
    _, problems = parse_blocks("<!-- not-run: needs a GPU to run -->\n\n```python\nx = 1\n```\n", "t.md")
    assert problems and "not on the line just before" in problems[0]


# --------------------------------------------------------------------------- agentgym commands parse

def shell_commands(code: str) -> list[list[str]]:
    """Simple commands of a bash block: continuations joined, comments dropped, split at && ; | ||."""
    out: list[list[str]] = []
    for line in code.replace("\\\n", " ").splitlines():
        tokens = shlex.split(line, comments=True)
        cmd: list[str] = []
        for t in tokens + [";"]:
            if t in ("&&", "||", "|", ";"):
                if cmd:
                    out.append(cmd)
                cmd = []
            else:
                cmd.append(t)
    return out


def agentgym_argv(cmd: list[str]) -> list[str] | None:
    """The arguments after ``agentgym`` / ``-m agentgym`` / ``-m agentgym.app.cli`` in a command, or None
    if it runs none of them."""
    for k, t in enumerate(cmd):
        if t == "agentgym" or (t in ("agentgym", "agentgym.app.cli") and k > 0 and cmd[k - 1] == "-m"):
            return cmd[k + 1:]
    return None


def bash_agentgym_commands() -> list[tuple[str, list[str]]]:
    found = []
    for p in PAGES:
        for b in page_blocks(p)[0]:
            if b.lang in ("bash", "sh", "shell", "console"):
                found += [(f"{b.page}:{b.line}", argv) for cmd in shell_commands(b.code)
                          if (argv := agentgym_argv(cmd)) is not None]
    return found


def check_command(argv: list[str]) -> str | None:
    """None when ``agentgym ARGV`` parses as the CLI would take it, else why not."""
    from agentgym.app.parser import build_parser
    from agentgym.app.cli import parse_command_line
    from agentgym.config import load_config
    parser = build_parser()
    try:
        args, extra = parse_command_line(parser, list(argv))
    except SystemExit:
        return "does not parse (unknown subcommand, or a flag without its value)"
    extra = [x for x in extra if x not in ("...", "…")]
    if args.command == "sandbox":       # the sandbox package parses its own arguments
        return None if args.sandbox_args and args.sandbox_args[0] in ("status", "build-image") \
            else f"unknown sandbox command {args.sandbox_args[:1]}"
    bad = [x for x in extra if "=" not in x or x.startswith("-")]
    if bad or (extra and not hasattr(args, "overrides")):
        return f"unknown arguments {bad or extra}"
    overrides = [o for o in list(getattr(args, "overrides", None) or []) + extra if o not in ("...", "…")]
    classes = {"train": "agentgym.algorithms.loop.train_config:TrainConfig", "compare": "agentgym.algorithms.loop.train_config:TrainConfig",
               "sft": "agentgym.algorithms.offline.sft:SFTRunConfig", "dpo": "agentgym.algorithms.offline.dpo:DPORunConfig",
               "eval": "agentgym.app.eval_run:EvalRunConfig"}
    if args.command not in classes:
        return None
    import importlib
    module, _, name = classes[args.command].partition(":")
    cls = getattr(importlib.import_module(module), name)
    config = getattr(args, "config", None)
    config = str(ROOT / config) if config and (ROOT / config).is_file() else None   # example files: keys only
    try:
        load_config(cls, config, overrides)
    except (ValueError, TypeError) as e:
        return f"config: {e}"
    return None


def test_agentgym_commands_in_bash_blocks_are_real():
    commands = bash_agentgym_commands()
    assert len(commands) >= 20, commands
    assert {argv[0] for _, argv in commands if argv and not argv[0].startswith("-")} >= {"train", "eval", "compare"}
    problems = [f"{where}: agentgym {shlex.join(argv)}: {why}" for where, argv in commands
                if (why := check_command(argv)) is not None]
    assert not problems, "\n".join(problems)


def test_command_check_can_fail():
    assert check_command(["train", "steps=3"]) is None
    assert check_command(["trian"]) is not None
    assert check_command(["sft", "--resume"]) is not None              # sft has no --resume
    assert "config" in check_command(["train", "learner.no_such_key=1"])
    assert check_command(["train", "--steps", "3", "--optim.lr=1e-6"]) is None   # options as overrides
    assert "config" in check_command(["train", "--learner.no-such-key", "1"])


# --------------------------------------------------------------------------- links resolve

LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def outside_fences(text: str) -> str:
    """The text outside fenced code blocks."""
    out, fence = [], None
    for line in text.split("\n"):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
            continue
        if fence is not None:
            if re.match(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}\s*$", line):
                fence = None
            continue
        out.append(line)
    return "\n".join(out)


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans."""
    return re.sub(r"(`+)(.+?)\1", "", outside_fences(text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in outside_fences(path.read_text(encoding="utf-8")).split("\n"):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            s = slug(m.group(1))
            out.add(s if s not in seen else f"{s}-{seen[s]}")
            seen[s] = seen.get(s, 0) + 1
    return out


def test_relative_links_resolve():
    problems, checked = [], 0
    for page in PAGES:
        for target in LINK.findall(prose(page.read_text(encoding="utf-8"))):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):       # http:, https:, mailto:
                continue
            checked += 1
            path_part, _, anchor = target.partition("#")
            dest = (page.parent / path_part).resolve() if path_part else page
            where = f"{rel(page)}: ({target})"
            if not dest.is_relative_to(ROOT) or dest.is_relative_to(ROOT / "shared"):
                problems.append(f"{where}: points outside the repository")
            elif not dest.exists():
                problems.append(f"{where}: {dest.relative_to(ROOT)} does not exist")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{where}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert checked >= 50
    assert not problems, "\n".join(problems)


def test_readme_starts_with_the_two_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert text.startswith("# agentgym\n\n```bash\nbash scripts/setup.sh && agentgym train\n"
                           "bash scripts/setup.sh && python -m pytest -q\n```\n")
    assert "](docs/README.md)" in "\n".join(text.split("\n")[:12])    # the guides, on the first screen
