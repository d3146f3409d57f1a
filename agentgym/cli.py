"""``agentgym`` command line. The one place that wires concrete parts together (lazily)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

__all__ = ["main"]


def _parse_kv(pairs: Sequence[str] | None) -> dict[str, Any]:
    """``key=value`` pairs; values are parsed as JSON when possible (``max_turns=3``)."""
    out: dict[str, Any] = {}
    for p in pairs or []:
        if "=" not in p:
            raise SystemExit(f"error: expected key=value, got {p!r}")
        k, v = p.split("=", 1)
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def _load_plugins(modules: Sequence[str] | None) -> None:
    """Import user modules that call ``agentgym.register`` (``--import mypkg.envs``)."""
    import importlib
    for m in modules or []:
        importlib.import_module(m)


def cmd_list(args: argparse.Namespace) -> int:
    import agentgym
    for env_id in agentgym.list_envs():
        spec = agentgym.spec(env_id)
        entry = spec.entry_point if isinstance(spec.entry_point, str) else getattr(spec.entry_point, "__qualname__", "?")
        print(f"{env_id:32s} {entry}")
    return 0


def _print_messages(console: Any, messages: Sequence[dict[str, str]]) -> None:
    from rich.panel import Panel
    from rich.text import Text
    colours = {"system": "magenta", "user": "cyan", "tool": "yellow", "assistant": "green"}
    for m in messages:
        console.print(Panel(Text(m["content"]), title=m["role"], title_align="left",
                            border_style=colours.get(m["role"], "white")))


def _read_action(console: Any) -> str | None:
    console.print("[bold]Your action[/] (end with an empty line; Ctrl-D quits):")
    lines: list[str] = []
    while True:
        try:
            line = input()
        except EOFError:
            return "\n".join(lines) if lines else None
        if line == "" and lines:
            return "\n".join(lines)
        lines.append(line)


def cmd_play(args: argparse.Namespace) -> int:
    import agentgym
    from rich.console import Console
    from rich.table import Table
    console = Console()
    env = agentgym.make(args.env_id, **_parse_kv(args.env_kwarg))
    for ep in range(args.episodes):
        obs, info = env.reset(seed=None if args.seed is None else args.seed + ep)
        console.rule(f"{args.env_id} — episode {ep + 1}")
        _print_messages(console, obs)
        done = False
        while not done:
            action = _read_action(console)
            if action is None:
                console.print("bye")
                env.close()
                return 0
            obs, reward, terminated, truncated, info = env.step(action)
            _print_messages(console, obs)
            table = Table(title=f"turn {info['turn']}: {info['action_type']}, reward {reward:+.3f}")
            table.add_column("term")
            table.add_column("value", justify="right")
            for k, v in info["reward_terms"].items():
                table.add_row(k, f"{v:+.3f}")
            console.print(table)
            done = terminated or truncated
        summary = info["episode_summary"]
        console.print(f"[bold]episode over[/] ({'terminated' if terminated else 'truncated'}): "
                      f"success={summary['success']} return={summary['return']:+.3f} turns={summary['turns']}")
    env.close()
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    import agentgym  # noqa: F401  (registers the built-ins)
    from agentgym.checking import fuzz_env, run_check_env
    from agentgym.registry import full_id
    env_id = full_id(args.env_id)
    kwargs = _parse_kv(args.env_kwarg)
    err = run_check_env(env_id, kwargs)
    print(f"check_env: {'passed' if err is None else 'FAILED'}")
    if err:
        print(err)
    report = fuzz_env(env_id, n=args.actions, seed=args.seed, env_kwargs=kwargs)
    print(report.summary())
    for f in report.failures[:10]:
        print("  -", f)
    return 0 if err is None and report.ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentgym", description="Gymnasium environments and RL learners for LLM agents.")
    parser.add_argument("--import", dest="imports", action="append", metavar="MODULE",
                        help="import a module that registers your own envs (repeatable)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list", help="list registered envs")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("play", help="play an episode yourself in the terminal")
    p.add_argument("env_id")
    p.add_argument("--episodes", type=int, default=1)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--env-kwarg", "-e", action="append", metavar="KEY=VALUE", help="env constructor argument")
    p.set_defaults(func=cmd_play)

    p = sub.add_parser("check", help="Gymnasium check_env plus a fuzz of malformed actions")
    p.add_argument("env_id")
    p.add_argument("--actions", type=int, default=500, help="number of fuzzed actions")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--env-kwarg", "-e", action="append", metavar="KEY=VALUE")
    p.set_defaults(func=cmd_check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _load_plugins(args.imports)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
