"""``python -m agentgym.envs.sandbox {build-image,status}`` -- the same as the CLI's
``agentgym sandbox ...`` commands, usable before the CLI is wired or installed."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from .image import DEFAULT_IMAGE, ImageBuildError, build_image, image_exists


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agentgym.envs.sandbox")
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
    try:
        if a.if_missing and image_exists(a.tag):
            print(f"[image] {a.tag} already present")
            return 0
        build_image(a.tag, a.method, rebuild_rootfs=a.rebuild_rootfs)
    except ImageBuildError as e:
        print(f"[image] error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
