# SPDX-License-Identifier: Apache-2.0
"""What building the node image (Containerfile) needs here, where no image registry is
reachable: a Debian 12 base made with debootstrap from the Debian mirror, and the wheels
of vgpu's Python dependencies at the versions this Python runs, so the image itself builds
with no network (`--network none`, pip `--no-index`).

Both are made once and kept under CACHE (VGPU_TEST_CACHE, default ~/.cache/vgpu-tests),
each named by a digest of its inputs: a change of suite, mirror, package list,
dependencies or installed versions makes a new one. debootstrap takes about a minute and
the download of the wheels seconds; the next sessions take them from the cache.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

from support.paths import ROOT

__all__ = ["BASE_PACKAGES", "CACHE", "base_tarball", "debian_tarball", "wheelhouse"]

CACHE = Path(os.environ.get("VGPU_TEST_CACHE") or Path.home() / ".cache" / "vgpu-tests")
SUITE = "bookworm"   # Debian 12: the base the Containerfile names
MIRROR = "http://deb.debian.org/debian"
#: Everything both Containerfile stages install when missing: a base that has it all
#: builds offline (the runtime stage reuses the same base; it only needs python3).
BASE_PACKAGES = ("gcc", "make", "libc6-dev", "binutils", "python3", "python3-venv")


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """One maker at a time per cached thing (several sessions share the cache)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _cached(name: str, make: Callable[[Path], None]) -> Path:
    """CACHE/name, made by make(tmp) into a temporary path and renamed into place."""
    path = CACHE / name
    with _locked(name):
        if not path.exists():
            tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=CACHE))
            try:
                make(tmp)
                os.rename(tmp / "out", path)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return path


def debian_tarball(suite: str, packages: tuple[str, ...] = ()) -> Path:
    """A plain tar of a Debian rootfs of `suite` (debootstrap minbase, plus `packages`),
    made once and kept in the cache."""
    key = _digest(suite, MIRROR, "minbase", ",".join(packages))

    def make(tmp: Path) -> None:
        if shutil.which("debootstrap") is None:
            raise FileNotFoundError("debootstrap is missing: apt-get install debootstrap")
        root = tmp / "rootfs"
        include = [f"--include={','.join(packages)}"] if packages else []
        p = subprocess.run(["debootstrap", "--variant=minbase", *include, suite, str(root),
                            MIRROR], capture_output=True, text=True, timeout=1200)
        if p.returncode != 0:
            raise RuntimeError(f"debootstrap exited {p.returncode}:\n{p.stdout[-3000:]}"
                               f"{p.stderr[-3000:]}")
        # The downloaded packages are installed: the base needs them no more.
        for deb in (root / "var/cache/apt/archives").glob("*.deb"):
            deb.unlink()
        subprocess.run(["tar", "--numeric-owner", "-C", str(root), "-cf", str(tmp / "out"),
                        "."], check=True)
    return _cached(f"debian-{suite}-{key}.tar", make)


def base_tarball() -> Path:
    """A plain tar of a Debian 12 rootfs (debootstrap minbase with BASE_PACKAGES), for
    `podman import`: the stand-in for docker.io/library/debian:12-slim."""
    return debian_tarball(SUITE, BASE_PACKAGES)


def _requirements() -> list[str]:
    """vgpu's runtime dependencies and its build backend (pip builds it in the image)."""
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return [*doc["project"]["dependencies"], *doc["build-system"]["requires"]]


def _installed() -> str:
    """This Python's installed versions as pip constraints (the versions the tests run)."""
    out = subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable",
                          "--all"], capture_output=True, text=True, check=True).stdout
    return "".join(line + "\n" for line in out.splitlines()
                   if line and not line.startswith("#") and " @ " not in line)


def wheelhouse() -> Path:
    """A directory of wheels: vgpu's dependencies (and setuptools, its build backend) at
    the versions installed here, for this Python's version (Debian 12's python3 is 3.11)."""
    reqs, constraints = _requirements(), _installed()
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    key = _digest(tag, *reqs, constraints)

    def make(tmp: Path) -> None:
        (tmp / "constraints.txt").write_text(constraints)
        p = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet",
                            "--disable-pip-version-check", "--only-binary=:all:",
                            "--dest", str(tmp / "out"),
                            "--constraint", str(tmp / "constraints.txt"), *reqs],
                           capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"pip download exited {p.returncode}:\n{p.stderr[-3000:]}")
    return _cached(f"wheels-{tag}-{key}", make)
