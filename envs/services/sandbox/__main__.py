"""``agentgym sandbox {build-image,status}`` (also ``python -m agentgym.envs.services.sandbox ...``)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from .image import DEFAULT_IMAGE, build_command

_BOUNDARY = {"docker": True, "bwrap": True, "subprocess": False}


def status_report(image: str = DEFAULT_IMAGE) -> dict[str, Any]:
    """What ``sandbox="auto"`` uses here and each backend's state (the ``status`` command's data)."""
    from .selection import available_backends, default_backend, unsafe_allowed
    found = available_backends(image)
    default, _ = default_backend(image)
    return {"default": default, "security_boundary": _BOUNDARY.get(default or "", False),
            "unsafe_opt_in": unsafe_allowed(),
            "backends": {b: {"available": s == "ok", "security_boundary": _BOUNDARY[b],
                             "reason": s} for b, s in found.items()}}


def format_status(report: dict[str, Any]) -> str:
    from .selection import ALLOW_UNSAFE_ENV_VAR, ENV_VAR, FIX_HINT, UNSAFE_HINT
    default = report["default"]
    if default is None:
        head = ("default: none -- no isolating sandbox works here, so envs that run code "
                "(CodeExec-v0, Math-v0 with tools) refuse to start")
    elif report["security_boundary"]:
        head = f"default: {default} (a security boundary)"
    else:
        head = f"default: {default} (NOT a security boundary: opted in with ${ALLOW_UNSAFE_ENV_VAR})"
    lines = [head + f"; what sandbox=\"auto\" uses (order: ${ENV_VAR}, else docker, bwrap)", "",
             f"{'backend':<12}{'boundary':<10}status"]
    for name, b in report["backends"].items():
        status = "ok" if b["available"] else f"unavailable: {b['reason']}"
        if name == "subprocess":
            status += (" (opted in; runs only where named)" if report["unsafe_opt_in"] else
                       " (runs only when named and opted in to)")
        lines.append(f"{name:<12}{'yes' if b['security_boundary'] else 'NO':<10}{status}")
    if default is None:
        lines += ["", FIX_HINT, UNSAFE_HINT]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="agentgym sandbox", description="Code-execution sandboxes.")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build-image", help="build the docker sandbox image")
    b.add_argument("--tag", default=DEFAULT_IMAGE)
    b.add_argument("--method", choices=["auto", "debootstrap", "pull"], default="auto")
    b.add_argument("--if-missing", action="store_true", help="do nothing if the image exists")
    b.add_argument("--rebuild-rootfs", action="store_true", help="ignore the cached rootfs")
    s = sub.add_parser("status", help="which backend code runs in by default, and each backend's state",
                       description="Exit status 0 when a default backend exists, 1 when code would be refused.")
    s.add_argument("--image", default=DEFAULT_IMAGE)
    s.add_argument("--json", action="store_true", help="machine-readable output")
    a = p.parse_args(argv)
    if a.cmd == "status":
        try:
            report = status_report(a.image)
        except ValueError as e:  # e.g. an unknown name in $AGENTGYM_SANDBOX
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(json.dumps(report, indent=2) if a.json else format_status(report))
        return 0 if report["default"] is not None else 1
    return build_command(a.tag, a.method, if_missing=a.if_missing, rebuild_rootfs=a.rebuild_rootfs)


if __name__ == "__main__":
    sys.exit(main())
