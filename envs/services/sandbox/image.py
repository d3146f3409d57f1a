"""Build the Docker image the docker sandbox runs programs in.

Two ways, because CI and many clusters cannot reach an image registry:

* ``debootstrap`` (offline from any registry; needs root, ``debootstrap`` and a Debian
  mirror): a ``minbase`` Debian with ``python3`` (the full standard library: ``json``,
  ``unittest``, ``dataclasses``, ... are missing from ``python3-minimal``), trimmed of apt
  caches, docs and locales, tarred and ``docker import``-ed. The tarball is cached under
  ``~/.cache/agentgym/`` (``$XDG_CACHE_HOME``), so a rebuild (new daemon, pruned image)
  takes seconds instead of minutes.
* ``pull``: ``docker pull python:3.11-slim`` and tag it, where a registry is reachable.

``method="auto"``: a cached rootfs if there is one, else debootstrap when possible, else pull.
The image needs ``python3``, ``bash``, ``tar`` and ``timeout`` and no user entry: containers
run as uid 65534. Run as ``python -m agentgym.envs.services.sandbox.image`` (or this file directly:
it imports nothing from agentgym, so setup scripts can call it before anything else works).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

DEFAULT_IMAGE = "agentgym-sandbox:latest"
DEFAULT_SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_PACKAGES: tuple[str, ...] = ("python3",)
DEFAULT_PULL_REF = "python:3.11-slim"
IMAGE_LABEL = "org.agentgym.sandbox.image"
#: Paths emptied from the rootfs: apt caches and lists, docs, man pages, locales (-120 MB).
_TRIM = ("var/cache/apt", "var/lib/apt/lists", "usr/share/doc", "usr/share/man",
         "usr/share/locale", "usr/share/info")
_RECIPE_VERSION = "1"  # bump when the rootfs recipe changes, to invalidate cached tarballs

Method = Literal["auto", "debootstrap", "pull"]


class ImageBuildError(RuntimeError):
    """The image could not be built (no root, no debootstrap, no registry, no daemon, ...)."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "agentgym"


def rootfs_tarball(suite: str = DEFAULT_SUITE, packages: Sequence[str] = DEFAULT_PACKAGES,
                   mirror: str = DEFAULT_MIRROR) -> Path:
    """Where the cached rootfs for this recipe lives (the name encodes the recipe)."""
    key = hashlib.sha256("|".join([_RECIPE_VERSION, suite, mirror, *sorted(packages)])
                         .encode()).hexdigest()[:12]
    return cache_dir() / f"sandbox-rootfs-{suite}-{key}.tar.gz"


def _client(client: Any = None) -> Any:
    if client is not None:
        return client
    try:
        import docker
        c = docker.from_env(timeout=600)
        c.ping()
        return c
    except Exception as e:  # noqa: BLE001
        raise ImageBuildError(f"Docker daemon not reachable: {e}") from e


def image_exists(tag: str = DEFAULT_IMAGE, client: Any = None) -> bool:
    import docker.errors
    try:
        _client(client).images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def _debootstrap(tarball: Path, suite: str, mirror: str, packages: Sequence[str],
                 log: Callable[[str], None]) -> None:
    if os.geteuid() != 0:
        raise ImageBuildError("debootstrap needs root")
    if shutil.which("debootstrap") is None:
        raise ImageBuildError("debootstrap not installed (apt-get install debootstrap)")
    tarball.parent.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="agentgym-rootfs-"))
    try:
        cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}",
               suite, str(root), mirror]
        log(f"[image] {' '.join(cmd)}  (a few minutes)")
        t0 = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ImageBuildError(f"debootstrap failed ({proc.returncode}):\n"
                                  + (proc.stdout + proc.stderr)[-3000:])
        log(f"[image] debootstrap done in {time.monotonic() - t0:.0f} s")
        for rel in _TRIM:
            target = root / rel
            if target.is_dir():
                for child in target.iterdir():
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child, ignore_errors=True)
                    else:
                        child.unlink(missing_ok=True)
        partial = tarball.with_suffix(".partial")
        subprocess.run(["tar", "--numeric-owner", "--exclude=./proc/*", "--exclude=./sys/*",
                        "--exclude=./dev/*", "-C", str(root), "-I", "gzip -1", "-cf",
                        str(partial), "."], check=True)
        partial.replace(tarball)  # atomic: a crash never leaves a half tarball in the cache
        log(f"[image] cached rootfs {tarball} ({tarball.stat().st_size / 1e6:.0f} MB)")
    finally:
        for sub in ("proc", "sys", "dev/pts"):  # debootstrap mounts these; never rm -r a mount
            if os.path.ismount(root / sub):
                subprocess.run(["umount", "-l", str(root / sub)], check=False)
        shutil.rmtree(root, ignore_errors=True)


def _import(client: Any, tarball: Path, tag: str) -> str:
    repo, _, version = tag.rpartition(":") if ":" in tag.rsplit("/", 1)[-1] else (tag, "", "")
    changes = ["ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "ENV LANG=C.UTF-8", f"LABEL {IMAGE_LABEL}=debootstrap",
               'CMD ["sleep", "infinity"]']
    with open(tarball, "rb") as f:
        client.api.import_image_from_data(f, repository=repo, tag=version or "latest",
                                          changes=changes)
    return client.images.get(tag).id


def _pull(client: Any, ref: str, tag: str, log: Callable[[str], None]) -> str:
    log(f"[image] docker pull {ref}")
    try:
        image = client.images.pull(ref)
    except Exception as e:  # noqa: BLE001
        raise ImageBuildError(f"docker pull {ref} failed: {e}") from e
    repo, _, version = tag.rpartition(":") if ":" in tag.rsplit("/", 1)[-1] else (tag, "", "")
    image.tag(repo, version or "latest")
    return image.id


def verify_image(tag: str = DEFAULT_IMAGE, client: Any = None) -> str:
    """Run the image once, locked down like the sandbox does, and return its Python version."""
    out = _client(client).containers.run(
        tag, ["python3", "-c", "import json, unittest, sys; print(sys.version.split()[0])"],
        network_mode="none", user="65534:65534", read_only=True, remove=True)
    return out.decode().strip()


def build_image(tag: str = DEFAULT_IMAGE, method: Method = "auto", *,
                suite: str = DEFAULT_SUITE, mirror: str = DEFAULT_MIRROR,
                packages: Sequence[str] = DEFAULT_PACKAGES, pull_ref: str = DEFAULT_PULL_REF,
                rebuild_rootfs: bool = False, client: Any = None,
                log: Callable[[str], None] = print) -> str:
    """Build (or rebuild) the sandbox image ``tag`` and return its image id.

    ``method``: "debootstrap" (offline build, cached rootfs), "pull" (registry) or "auto"
    (cached rootfs > debootstrap if we are root and have it > pull). ``rebuild_rootfs``
    ignores the cached tarball. Raises :class:`ImageBuildError` with the reason on failure.
    """
    if method not in ("auto", "debootstrap", "pull"):
        raise ValueError(f"unknown method {method!r}")
    client = _client(client)
    tarball = rootfs_tarball(suite, packages, mirror)
    errors: list[str] = []
    if method == "auto":
        can_debootstrap = os.geteuid() == 0 and shutil.which("debootstrap") is not None
        order = (["debootstrap"] if (tarball.exists() and not rebuild_rootfs) or can_debootstrap
                 else []) + ["pull"]
    else:
        order = [method]
    for how in order:
        try:
            if how == "pull":
                image_id = _pull(client, pull_ref, tag, log)
            else:
                if rebuild_rootfs or not tarball.exists():
                    _debootstrap(tarball, suite, mirror, packages, log)
                else:
                    log(f"[image] using cached rootfs {tarball}")
                log(f"[image] docker import -> {tag}")
                image_id = _import(client, tarball, tag)
            log(f"[image] {tag} ready ({image_id[:19]}), python {verify_image(tag, client)}")
            return image_id
        except ImageBuildError as e:
            errors.append(f"{how}: {e}")
            log(f"[image] {how} failed: {e}")
    raise ImageBuildError("could not build the sandbox image: " + "; ".join(errors))


def build_command(tag: str, method: str, *, if_missing: bool, rebuild_rootfs: bool) -> int:
    """The ``build-image`` command's body (exit code), shared by this module's ``main`` and
    ``python -m agentgym.envs.services.sandbox``."""
    try:
        if if_missing and image_exists(tag):
            print(f"[image] {tag} already present")
            return 0
        build_image(tag, method, rebuild_rootfs=rebuild_rootfs)
    except ImageBuildError as e:
        print(f"[image] error: {e}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tag", default=DEFAULT_IMAGE)
    p.add_argument("--method", choices=["auto", "debootstrap", "pull"], default="auto")
    p.add_argument("--if-missing", action="store_true", help="do nothing if the image exists")
    p.add_argument("--rebuild-rootfs", action="store_true", help="ignore the cached rootfs")
    a = p.parse_args(argv)
    return build_command(a.tag, a.method, if_missing=a.if_missing, rebuild_rootfs=a.rebuild_rootfs)


if __name__ == "__main__":
    sys.exit(main())
