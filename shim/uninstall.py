# SPDX-License-Identifier: Apache-2.0
"""`vgpu uninstall docker|containerd|podman`: take back what `vgpu install` wrote.

Each target is a pure plan of steps, applied by shim.install.apply (so --dry-run prints the
same diffs): only vgpu's own entries go, every other setting of the user's stays, and a run
with nothing left to remove changes nothing. Backups (`<file>.vgpu.bak`) stay: they hold
the file as it was before the first install. A file the install created (no backup beside
it) that holds nothing but what vgpu put there is removed whole.

- docker: daemon.json's `runtimes.vgpu` (and `runtimes` when that leaves it empty); refused
  while `default-runtime` is vgpu, which Docker would then fail to find.
- containerd: the drop-in `<config dir>/conf.d/vgpu.toml`, its item in the main config's
  `imports`, and the shim's link `<bin dir>/containerd-shim-vgpu-v2` (a link only).
- podman / CRI-O: the hooks.d file, when it is vgpu's (its hook runs vgpu-hook).

The versioned installs under paths.lib_dir stay: other engines and running containers use
them (`vgpu upgrade` prunes old ones).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shim.errors import InstallError
from shim.install import (
    BACKUP_SUFFIX,
    DEFAULT_BIN_DIR,
    DEFAULT_FILES,
    PROGRAM,
    RESTART,
    SHIM,
    TARGETS,
    Change,
    Step,
    _read,
    _toml,
    apply,
    dropin_path,
)

__all__ = ["Removal", "add_arguments", "plan", "run"]


@dataclass(frozen=True)
class Removal:
    """A file or symlink vgpu made, to delete (present: whether it is there now)."""

    path: Path
    present: bool
    what: str = "file"

    @property
    def changed(self) -> bool:
        """True when there is something to delete."""
        return self.present

    def preview(self) -> str:
        """What --dry-run prints for it."""
        return f"would remove {self.what} {self.path}"

    def write(self) -> str:
        """Delete it (gone already: fine)."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        return f"vgpu: removed {self.what} {self.path}"


def _made_by_install(path: Path) -> bool:
    """No backup beside it: `vgpu install` backs up a file it changes before the first
    change, so the file did not exist before."""
    return not path.with_name(path.name + BACKUP_SUFFIX).exists()


def _edit(path: Path, old: str, new: str, emptied: bool) -> Step:
    """The file with `new` text, or removed when `emptied` and install made it."""
    if emptied and _made_by_install(path):
        return Removal(path, True)
    return Change(path, old, new)


# ---- docker -------------------------------------------------------------------------

def plan_docker(path: Path) -> list[Step]:
    """daemon.json without runtimes.vgpu."""
    old = _read(path)
    if old is None or not old.strip():
        return []
    try:
        doc = json.loads(old)
    except ValueError as e:
        raise InstallError(path, f"not valid JSON: {e}") from e
    runtimes = doc.get("runtimes") if isinstance(doc, dict) else None
    if not isinstance(runtimes, dict) or "vgpu" not in runtimes:
        return []
    if doc.get("default-runtime") == "vgpu":
        raise InstallError(path, 'default-runtime is "vgpu": set it back to runc (or remove '
                                 "it) first, or Docker will not start")
    del runtimes["vgpu"]
    if not runtimes:
        del doc["runtimes"]
    new = json.dumps(doc, indent=4) + "\n"
    backup = _read(path.with_name(path.name + BACKUP_SUFFIX))
    with contextlib.suppress(ValueError):
        if backup is not None and json.loads(backup) == doc:
            new = backup   # what it was, byte for byte (install re-indents the file)
    return [_edit(path, old, new, not doc)]


# ---- containerd ---------------------------------------------------------------------

_IMPORTS = re.compile(r"^imports\s*=\s*\[(?P<items>[^\]]*)\][ \t]*(?:\n|$)", re.MULTILINE)


def _without_import(path: Path, text: str, doc: dict[str, Any], item: str,
                    had_imports: bool) -> str:
    """`text` without `item` in its top-level imports (the line gone when it empties and
    the file had none before the install: `had_imports`); refused unless the result parses
    to `doc` less exactly that item."""
    m = _IMPORTS.search(text)
    if m is None:
        raise InstallError(path, f"cannot remove {item} from its imports safely: remove it "
                                 "by hand")
    rest = [i for i in doc["imports"] if i != item]
    items, quoted = m.group("items"), json.dumps(item)
    for cut in (f", {quoted}", f"{quoted}, ", quoted):   # the inverse of install's edit
        if cut in items:
            items = items.replace(cut, "", 1)
            break
    if rest or had_imports:
        new = text[:m.start("items")] + items + text[m.end("items"):]
    else:   # the line install added
        new = text[:m.start()] + text[m.end():]
    expected = {k: v for k, v in doc.items() if k != "imports"}
    if rest or had_imports:
        expected["imports"] = rest
    try:
        ok = tomllib.loads(new) == expected
    except tomllib.TOMLDecodeError:
        ok = False
    if not ok:
        raise InstallError(path, f"cannot remove {item} from its imports safely: remove it "
                                 "by hand")
    return new


def _had_imports(path: Path) -> bool:
    """Whether the file had an imports line before the first install (its backup has)."""
    backup = _read(path.with_name(path.name + BACKUP_SUFFIX))
    try:
        return backup is not None and "imports" in tomllib.loads(backup)
    except tomllib.TOMLDecodeError:
        return False


def plan_containerd(path: Path, bin_dir: Path) -> list[Step]:
    """Remove the drop-in, its import line item and the shim's link."""
    dropin = dropin_path(path)
    steps: list[Step] = [Removal(dropin, dropin.is_file())]
    link = bin_dir / SHIM
    if link.is_symlink():
        steps.append(Removal(link, True, "link"))
    elif link.exists():
        raise InstallError(link, "it is not a symlink, so vgpu did not make it: left alone")
    old = _read(path)
    if old is not None and old.strip():
        doc = _toml(path, old)
        imports = doc.get("imports", [])
        if isinstance(imports, list) and str(dropin) in imports:
            new = _without_import(path, old, doc, str(dropin), _had_imports(path))
            left = tomllib.loads(new)
            steps.append(_edit(path, old, new, set(left) <= {"version"}))
    return steps


# ---- podman / CRI-O -------------------------------------------------------------------

def plan_podman(path: Path) -> list[Step]:
    """Remove the hooks.d file when its hook is vgpu-hook."""
    old = _read(path)
    if old is None:
        return []
    try:
        hook = json.loads(old).get("hook", {})
        ours = Path(hook.get("path", "")).name == PROGRAM["podman"] or \
            hook.get("args", [None])[0] == PROGRAM["podman"]
    except (ValueError, AttributeError, IndexError):
        ours = False
    if not ours:
        raise InstallError(path, "its hook is not vgpu-hook, so vgpu did not write it: left "
                                 "alone")
    return [Removal(path, True)]


# ---- the command ----------------------------------------------------------------------

def plan(target: str, config_file: Path, *, bin_dir: Path = DEFAULT_BIN_DIR) -> list[Step]:
    """The steps that take vgpu's registration out of `target`'s config."""
    if target == "docker":
        return plan_docker(config_file)
    if target == "containerd":
        return plan_containerd(config_file, bin_dir)
    if target == "podman":
        return plan_podman(config_file)
    raise InstallError(config_file, f"unknown target {target!r}: use {', '.join(TARGETS)}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `vgpu uninstall` arguments."""
    p.add_argument("target", choices=TARGETS, help="the engine to take vgpu out of")
    p.add_argument("--config-file", metavar="PATH", type=Path,
                   help="the engine's config file (default: docker "
                        f"{DEFAULT_FILES['docker']}, containerd {DEFAULT_FILES['containerd']}, "
                        f"podman {DEFAULT_FILES['podman']})")
    p.add_argument("--dry-run", action="store_true", help="print what would go, change nothing")
    p.add_argument("--bin-dir", metavar="DIR", type=Path, default=DEFAULT_BIN_DIR,
                   help=f"where `vgpu install` linked {SHIM} (default: {DEFAULT_BIN_DIR})")


def run(args: argparse.Namespace, out: Callable[[str], None]) -> int:
    """Carry out `vgpu uninstall` for parsed args."""
    config_file = Path(args.config_file or DEFAULT_FILES[args.target])
    steps = plan(args.target, config_file, bin_dir=args.bin_dir)
    if not apply(steps, dry_run=args.dry_run, out=out):
        out(f"vgpu: {args.target} has no vgpu registration ({config_file}): nothing to change")
    elif args.dry_run:
        out("vgpu: dry run: nothing was changed")
    else:
        if os.path.exists(f"{config_file}{BACKUP_SUFFIX}"):
            out(f"vgpu: the backup from before the first install stays: "
                f"{config_file}{BACKUP_SUFFIX}")
        out(f"vgpu: {RESTART[args.target]}")
    return 0
