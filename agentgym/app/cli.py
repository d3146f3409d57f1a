"""``agentgym`` command line. The one place that wires concrete parts together (lazily).

Read it top to bottom: :func:`main` parses (:mod:`agentgym.app.parser`, one function per subcommand),
imports ``--import`` plugins and runs the subcommand's ``cmd_*`` (:mod:`agentgym.app.commands` for the env
commands, :mod:`agentgym.app.run_commands` for those that make a run directory), turning operator
mistakes into one-line errors. The torch thread count every run uses is chosen here too."""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Sequence

from agentgym.app.commands import cmd_sandbox
from agentgym.app.parser import build_parser

__all__ = ["main", "flags_as_overrides", "parse_command_line"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``agentgym`` command; returns its exit code (0 ok, 1 runtime failure, 2 usage error,
    130 interrupted)."""
    import gymnasium as gym
    parser = build_parser()
    args, extra = parse_command_line(parser, list(sys.argv[1:] if argv is None else argv))
    # argparse stops filling a positional list at the first flag: `eval ENV --greedy episodes=8`
    # leaves `episodes=8` over; KEY=VALUE leftovers of a command that takes overrides join them.
    if getattr(args, "func", None) is cmd_sandbox:  # the sandbox package parses its own arguments
        args.sandbox_args = list(args.sandbox_args) + extra
    elif extra and hasattr(args, "overrides") and all("=" in x and not x.startswith("-") for x in extra):
        args.overrides = list(args.overrides or []) + extra
    elif extra:
        hint = (f" (config keys are set as KEY=VALUE or --KEY VALUE; `agentgym config {args.command}` lists them)"
                if hasattr(args, "overrides") else "")
        parser.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    try:
        _load_plugins(args.imports)
    except PluginError as e:
        if os.environ.get("AGENTGYM_DEBUG") and e.__cause__ is not None:
            raise e.__cause__
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be >= 1")
    try:
        return int(args.func(args) or 0)
    except (gym.error.Error, ValueError, TypeError, IndexError, FileNotFoundError, FileExistsError, IsADirectoryError,
            NotADirectoryError) as e:
        # Operator mistakes (unknown env id, bad env kwargs, bad config, a path that is missing, taken or of
        # the wrong kind) get one line, not a traceback: exit 2.
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a runtime failure: one line (the traceback with AGENTGYM_DEBUG=1), exit 1
        if os.environ.get("AGENTGYM_DEBUG"):
            raise
        print(f"error: {type(e).__name__}: {e} (AGENTGYM_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1


def parse_command_line(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """``argv`` parsed, and what the parser left over. For a command that takes config overrides, options
    it does not know are overrides (:func:`flags_as_overrides`): ``train --steps 5 --optim.lr=1e-5`` is
    ``train steps=5 optim.lr=1e-5``, as HF-style command lines take them. ``args.argv`` is the command
    as read (what a run's ``--resume`` hint repeats)."""
    args, extra = parser.parse_known_args(argv)
    if hasattr(args, "overrides") and any(x.startswith("--") for x in extra):
        argv = flags_as_overrides(argv, extra, args.command)
        args, extra = parser.parse_known_args(argv)
    args.argv = argv
    return args, extra


_KEY_VALUE = re.compile(r"^[A-Za-z_][\w.-]*=")


def flags_as_overrides(argv: Sequence[str], unknown: Sequence[str], command: str) -> list[str]:
    """``argv`` with each option the parser did not know, after the subcommand ``command``, written as a
    config override: ``--steps 5`` and ``--steps=5`` become ``steps=5``, ``--max-staleness 1`` becomes
    ``max_staleness=1``, and a bare ``--learner.skip-no-signal`` (no value follows) becomes ``...=true``.
    The config then checks the key and the value as it does for ``KEY=VALUE``. A following token is taken
    as the value unless it is an option (``--...``) or a ``KEY=VALUE`` itself; ``-1`` is a value."""
    flags = {x for x in unknown if x.startswith("--") and len(x) > 2}
    start = argv.index(command) + 1 if command in argv else len(argv)
    out, i = list(argv[:start]), start
    while i < len(argv):
        token = argv[i]
        i += 1
        if token == "--":  # everything after it is positional
            out += argv[i - 1:]
            break
        if token not in flags:
            out.append(token)
            continue
        key, eq, value = token[2:].partition("=")
        if not eq:
            nxt = argv[i] if i < len(argv) else None
            if nxt is None or nxt.startswith("--") or _KEY_VALUE.match(nxt):
                value = "true"
            else:
                value, i = nxt, i + 1
        out.append(f"{key.replace('-', '_')}={value}")
    return out


def _load_plugins(modules: Sequence[str] | None) -> None:
    """Import user modules that call ``agentgym.register`` (``--import mypkg.envs``).

    Resolved from the current directory first, as ``python -m`` does, so ``mypkg/`` next to you works
    without ``PYTHONPATH=.``."""
    import importlib
    import re
    if modules and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    for m in modules or []:
        if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", m):
            raise PluginError(f"--import {m!r}: not a module name (a dotted Python name such as mypkg.envs)")
        try:
            importlib.import_module(m)
        except ModuleNotFoundError as e:
            where = "" if e.name == m or m.startswith(f"{e.name}.") else f" (raised while importing {m})"
            raise PluginError(f"--import {m} failed: {e}{where}") from e
        except Exception as e:   # the plugin's own code failed: say where, in one line
            raise PluginError(f"--import {m} failed: {type(e).__name__}: {e}{_where(e)} "
                              "(AGENTGYM_DEBUG=1 shows the traceback)") from e


class PluginError(Exception):
    """An ``--import`` module that could not be imported (a usage error: exit 2)."""


def _where(e: BaseException) -> str:
    """`` at FILE:LINE``: the innermost frame of the failure."""
    import traceback
    if isinstance(e, SyntaxError):   # its message names the file and line already
        return ""
    frames = traceback.extract_tb(e.__traceback__)
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""


if __name__ == "__main__":
    sys.exit(main())
