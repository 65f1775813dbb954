# SPDX-License-Identifier: Apache-2.0
"""`vgpu install docker|containerd|podman`: register vgpu with a container engine.

Like `nvidia-ctk runtime configure`: each target is a pure plan (the files to
write and their new text) applied by one function that backs a file up once
(`<file>.vgpu.bak`, before the first change only), writes atomically, keeps every
unrelated setting, does nothing when the file already says what we would write,
prints a unified diff instead with --dry-run, and says which service to restart.

- docker: daemon.json `runtimes.vgpu.path` = vgpu-runtime (`docker run --runtime=vgpu`),
  the compiled one (arbiter/native/bin/) where it is shipped.
- containerd: a drop-in `<config dir>/conf.d/vgpu.toml` with the CRI runtime `vgpu`
  (runtime_type io.containerd.vgpu.v2, pod_annotations ["vgpu.io/*"]) and the
  `imports` line for it in the main config; `ctr run --runtime io.containerd.vgpu.v2`
  needs only containerd-shim-vgpu-v2 on containerd's PATH.
- podman: an OCI hooks.d file (Podman, CRI-O) that runs vgpu-hook (the compiled one
  where it is shipped).
"""
from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import os
import re
import shutil
import sys
import tempfile
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shim.errors import InstallError

__all__ = [
    "DEFAULT_FILES",
    "TARGETS",
    "Change",
    "add_arguments",
    "apply",
    "plan",
    "run",
]

TARGETS = ("docker", "containerd", "podman")
DEFAULT_FILES = {
    "docker": Path("/etc/docker/daemon.json"),
    "containerd": Path("/etc/containerd/config.toml"),
    "podman": Path("/etc/containers/oci/hooks.d/vgpu.json"),
}
RESTART = {
    "docker": "restart Docker to apply it: systemctl restart docker",
    "containerd": "restart containerd to apply it: systemctl restart containerd",
    "podman": "Podman reads hooks.d at each container start: nothing to restart "
              "(CRI-O: systemctl restart crio)",
}
BACKUP_SUFFIX = ".vgpu.bak"
RUNTIME_NAME = "vgpu"
SHIM_RUNTIME_TYPE = "io.containerd.vgpu.v2"
CRI_PLUGIN = "io.containerd.grpc.v1.cri"


@dataclass(frozen=True)
class Change:
    """One file and the text it should have (old None: the file does not exist yet)."""

    path: Path
    old: str | None
    new: str

    @property
    def changed(self) -> bool:
        """True when the file's text would change."""
        return self.old != self.new

    def diff(self) -> str:
        """A unified diff of the change."""
        old = [] if self.old is None else self.old.splitlines(keepends=True)
        lines = difflib.unified_diff(
            old, self.new.splitlines(keepends=True),
            fromfile="/dev/null" if self.old is None else str(self.path),
            tofile=str(self.path))
        return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise InstallError(path, f"cannot read it: {getattr(e, 'strerror', None) or e}") from e


# ---- docker -------------------------------------------------------------------------

def plan_docker(path: Path, runtime_path: str) -> list[Change]:
    """daemon.json with runtimes.vgpu.path set; every other setting kept."""
    old = _read(path)
    try:
        doc = json.loads(old) if old and old.strip() else {}
    except ValueError as e:
        raise InstallError(path, f"not valid JSON: {e}") from e
    if not isinstance(doc, dict):
        raise InstallError(path, "not a JSON object")
    runtimes = doc.setdefault("runtimes", {})
    if not isinstance(runtimes, dict):
        raise InstallError(path, "runtimes is not a JSON object")
    entry = runtimes.get(RUNTIME_NAME)
    entry = dict(entry) if isinstance(entry, dict) else {}
    if entry.get("path") == runtime_path and old is not None:
        return [Change(path, old, old)]
    entry["path"] = runtime_path
    runtimes[RUNTIME_NAME] = entry
    return [Change(path, old, json.dumps(doc, indent=4) + "\n")]


# ---- containerd ---------------------------------------------------------------------

def dropin_path(config: Path) -> Path:
    """Where the vgpu drop-in goes: conf.d/ next to the main config."""
    return config.parent / "conf.d" / "vgpu.toml"


def dropin_text() -> str:
    """The containerd drop-in: the CRI runtime class handler `vgpu`."""
    return (
        "# Written by `vgpu install containerd`: the CRI runtime `vgpu` (RuntimeClass handler)\n"
        "# runs containers through containerd-shim-vgpu-v2; vgpu.io/* pod annotations reach\n"
        "# the container so it can ask for a vGPU.\n"
        "version = 2\n"
        "\n"
        f'[plugins."{CRI_PLUGIN}".containerd.runtimes.{RUNTIME_NAME}]\n'
        f'  runtime_type = "{SHIM_RUNTIME_TYPE}"\n'
        '  pod_annotations = ["vgpu.io/*"]\n'
    )


def _toml(path: Path, text: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InstallError(path, f"not valid TOML: {e}") from e


_IMPORTS = re.compile(r"^imports\s*=\s*\[(?P<items>[^\]]*)\]", re.MULTILINE)
_TABLE = re.compile(r"^\s*\[", re.MULTILINE)
_VERSION = re.compile(r"^version\s*=.*\n?", re.MULTILINE)


def _with_import(path: Path, text: str, item: str) -> str:
    """`text` with `item` added to its top-level imports list (made if missing)."""
    quoted = json.dumps(item)
    m = _IMPORTS.search(text)
    table = _TABLE.search(text)
    if m is not None and (table is None or m.start() < table.start()):
        items = m.group("items").rstrip()
        sep = ", " if items.strip() and not items.strip().endswith(",") else ""
        new_items = f"{items}{sep}{quoted}" if items.strip() else quoted
        return text[:m.start("items")] + new_items + text[m.end("items"):]
    line = f"imports = [{quoted}]\n"
    v = _VERSION.search(text)
    if v is not None and (table is None or v.start() < table.start()):
        end = v.end()
        prefix = text[:end] if text[:end].endswith("\n") else text[:end] + "\n"
        return prefix + line + text[end:]
    return line + text


def plan_containerd(path: Path) -> list[Change]:
    """The drop-in and the main config's imports line (a new main config if there is none)."""
    dropin = dropin_path(path)
    changes = [Change(dropin, _read(dropin), dropin_text())]
    old = _read(path)
    if old is None or not old.strip():
        new = f"version = 2\nimports = [{json.dumps(str(dropin))}]\n"
        return [*changes, Change(path, old, new if old is None else old + new)]
    doc = _toml(path, old)
    if doc.get("version", 1) != 2:
        raise InstallError(path, f"config version {doc.get('version', 1)} is not supported "
                                 "(vgpu writes a version 2 drop-in; run `containerd config "
                                 "migrate` first)")
    imports = doc.get("imports", [])
    if not isinstance(imports, list):
        raise InstallError(path, "imports is not a list")
    if str(dropin) in imports:
        return [*changes, Change(path, old, old)]
    new = _with_import(path, old, str(dropin))
    after = _toml(path, new)
    expected = dict(doc, imports=[*imports, str(dropin)])
    if after != expected:   # never write what we cannot prove equal but for the import
        raise InstallError(path, f"cannot add {dropin} to its imports safely: add it by hand")
    return [*changes, Change(path, old, new)]


# ---- podman / CRI-O -------------------------------------------------------------------

def hook_template() -> dict[str, Any]:
    """configs/oci-hooks.d/vgpu.json (from the package or the checkout), else a built-in one."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "arbiter" / "configs" / "oci-hooks.d" / "vgpu.json",
                      here.parent / "configs" / "oci-hooks.d" / "vgpu.json"):
        if candidate.is_file():
            doc = json.loads(candidate.read_text(encoding="utf-8"))
            if isinstance(doc, dict):
                return doc
    return {
        "version": "1.0.0",
        "hook": {"path": "/usr/local/bin/vgpu-hook", "args": ["vgpu-hook", "prestart"]},
        "when": {"annotations": {"^vgpu\\.io/": ".*"}},
        "stages": ["prestart"],
    }


def plan_podman(path: Path, hook_path: str) -> list[Change]:
    """The hooks.d file with hook.path pointing at this installation's vgpu-hook."""
    doc = hook_template()
    hook = doc.get("hook")
    if isinstance(hook, dict):
        hook["path"] = hook_path
    new = json.dumps(doc, indent=2) + "\n"
    return [Change(path, _read(path), new)]


# ---- applying -------------------------------------------------------------------------

def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def apply(changes: Sequence[Change], *, dry_run: bool, out: Callable[[str], None]) -> bool:
    """Write (or with dry_run, show the diff of) every change; True when anything changed."""
    pending = [c for c in changes if c.changed]
    for c in pending:
        if dry_run:
            out(c.diff().rstrip("\n"))
            continue
        backup = c.path.with_name(c.path.name + BACKUP_SUFFIX)
        try:
            if c.old is not None and not backup.exists():
                shutil.copy2(c.path, backup)
            _write(c.path, c.new)
        except OSError as e:
            raise InstallError(c.path, e.strerror or str(e)) from e
        made = f" (backup: {backup})" if backup.exists() else ""
        out(f"vgpu: wrote {c.path}{made}")
    return bool(pending)


def _program(name: str, explicit: str | None) -> str:
    """The absolute path of one of our programs: given, the compiled one (shipped in the
    package or built in the checkout: it starts containers without a Python process),
    beside this one, or on PATH."""
    if explicit:
        return str(Path(explicit).absolute())
    from arbiter.native import program_path

    native = program_path(name)
    if native is not None:
        return str(native)
    beside = Path(sys.argv[0]).resolve().parent / name if sys.argv and sys.argv[0] else None
    if beside is not None and beside.is_file():
        return str(beside)
    found = shutil.which(name)
    if found:
        return str(Path(found).absolute())
    raise InstallError(Path(name), f"cannot find {name} (install vgpu with pip, or pass "
                                   f"--{name.removeprefix('vgpu-')}-path)")


def plan(target: str, config_file: Path, *, runtime_path: str | None = None,
         hook_path: str | None = None) -> list[Change]:
    """The changes that register vgpu with `target`, for the config file given."""
    if target == "docker":
        return plan_docker(config_file, _program("vgpu-runtime", runtime_path))
    if target == "containerd":
        return plan_containerd(config_file)
    if target == "podman":
        return plan_podman(config_file, _program("vgpu-hook", hook_path))
    raise InstallError(config_file, f"unknown target {target!r}: use {', '.join(TARGETS)}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `vgpu install` arguments."""
    p.add_argument("target", choices=TARGETS, help="the engine to configure")
    p.add_argument("--config-file", metavar="PATH", type=Path,
                   help="the engine's config file (default: docker "
                        f"{DEFAULT_FILES['docker']}, containerd {DEFAULT_FILES['containerd']}, "
                        f"podman {DEFAULT_FILES['podman']})")
    p.add_argument("--dry-run", action="store_true", help="print the diff, change nothing")
    p.add_argument("--runtime-path", metavar="PATH",
                   help="vgpu-runtime for Docker (default: beside `vgpu`, else on PATH)")
    p.add_argument("--hook-path", metavar="PATH",
                   help="vgpu-hook for hooks.d (default: beside `vgpu`, else on PATH)")


def run(args: argparse.Namespace, out: Callable[[str], None]) -> int:
    """Carry out `vgpu install` for parsed args."""
    config_file = args.config_file or DEFAULT_FILES[args.target]
    changes = plan(args.target, Path(config_file), runtime_path=args.runtime_path,
                   hook_path=args.hook_path)
    changed = apply(changes, dry_run=args.dry_run, out=out)
    if not changed:
        out(f"vgpu: {args.target} is already configured ({config_file}): nothing to change")
    elif args.dry_run:
        out("vgpu: dry run: nothing was changed")
    else:
        out(f"vgpu: {RESTART[args.target]}")
    return 0
