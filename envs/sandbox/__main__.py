"""``agentgym sandbox {build-image,status}`` (also ``python -m agentgym.envs.sandbox ...``)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from .image import DEFAULT_IMAGE, build_command


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="agentgym sandbox", description="Code-execution sandboxes.")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build-image", help="build the docker sandbox image")
    b.add_argument("--tag", default=DEFAULT_IMAGE)
    b.add_argument("--method", choices=["auto", "debootstrap", "pull"], default="auto")
    b.add_argument("--if-missing", action="store_true", help="do nothing if the image exists")
    b.add_argument("--rebuild-rootfs", action="store_true", help="ignore the cached rootfs")
    s = sub.add_parser("status", help="which sandbox backends work here (JSON)")
    s.add_argument("--image", default=DEFAULT_IMAGE)
    a = p.parse_args(argv)
    if a.cmd == "status":
        from .selection import available_backends
        print(json.dumps(available_backends(a.image), indent=2))
        return 0
    return build_command(a.tag, a.method, if_missing=a.if_missing, rebuild_rootfs=a.rebuild_rootfs)


if __name__ == "__main__":
    sys.exit(main())
