# SPDX-License-Identifier: Apache-2.0
"""The project's version: one definition for `vgpu --version`, `vgpu info` and vgpud's Health.

A release is a package version ([project].version in pyproject.toml). RELEASES names the
commit each earlier release was cut from (the git tag `v<version>` points at the same
commit), so a clone without tags still finds the previous release's sources: the upgrade
drill builds it in a temporary worktree (docs/upgrading.md).
"""
from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

__all__ = ["DISTRIBUTION", "RELEASES", "previous_release", "version"]

DISTRIBUTION = "vgpu"
#: Every release before this tree's version -> the commit it was cut from, oldest first.
RELEASES: dict[str, str] = {
    "0.1.0": "0feac9bdd85c9dd642421ddbe65edad430b0f8b5",
}


def version(package_dir: Path | None = None) -> str:
    """pyproject.toml's version in a source checkout, else the installed distribution's.

    The checkout is asked first: a checkout often also holds a stale `vgpu.egg-info`
    (from an earlier `pip install -e`) that importlib.metadata would find on sys.path.
    `package_dir` is the directory holding the `arbiter` package (tests point it elsewhere).
    """
    root = package_dir if package_dir is not None else Path(__file__).parent.parent
    found = _checkout_version(root / "pyproject.toml")
    if found is not None:
        return found
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


def _checkout_version(pyproject: Path) -> str | None:
    """[project].version of a pyproject.toml that is vgpu's, else None."""
    try:
        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    if not isinstance(project, dict) or project.get("name") != DISTRIBUTION:
        return None
    value = project.get("version")
    return value if isinstance(value, str) else None


def _key(v: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else -1 for p in v.split("."))


def previous_release(current: str, releases: dict[str, str] = RELEASES) -> str | None:
    """The newest release older than `current` (N-1: the one vgpud `current` serves too)."""
    older = [v for v in releases if _key(v) < _key(current)]
    return max(older, key=_key) if older else None
