# SPDX-License-Identifier: Apache-2.0
"""`vgpu install docker|containerd|podman`: register vgpu with a container engine.

Like `nvidia-ctk runtime configure`: each target is a pure plan (the files to
write and their new text, the links to make) applied by one function that backs a
file up once (`<file>.vgpu.bak`, before the first change only), writes atomically,
keeps every unrelated setting, does nothing when the file already says what we would
write, prints a unified diff instead with --dry-run, and says which service to restart.

What is written comes from the shipped snippets (configs/docker/daemon.json,
configs/containerd/vgpu.toml, configs/oci-hooks.d/vgpu.json, found by
arbiter.install.shipped) with the stable paths of the compiled programs:
`<lib dir>/current/bin/<program>` (paths.lib_dir of the config, or --lib-dir). First this
installation's native files are installed under `<lib dir>/<version>-<hash>/` (once,
arbiter.install.versions) and `current` is switched to them atomically, so a `pip install` over
the package never changes what engines exec, and `vgpu upgrade` switches every engine at
once without rewriting its config. A program path given explicitly (--runtime-path,
--hook-path, --shim-path) is registered as it is:

- docker: daemon.json `runtimes.vgpu.path` = vgpu-runtime (`docker run --runtime=vgpu`).
- containerd: the drop-in `<config dir>/conf.d/vgpu.toml`: on a version 2 config the CRI
  section the host's config gives containerd (containerd 1.x replaces a plugin's whole
  section from an import: shim.containerd_cri), on version 3 (containerd 2.x, which merges
  imports key by key) nothing of it, with the runtime handler `vgpu` added (`runtime_path` =
  containerd-shim-vgpu-v2: containerd >= 1.6 runs that binary for the handler whatever
  its PATH; `pod_annotations` and `container_annotations` = `vgpu.io/*`,
  `cdi.k8s.io/*`) and, with --set-as-default, `default_runtime_name = "vgpu"`; the
  `imports` line for it in the main config, and a symlink
  `<bin dir>/containerd-shim-vgpu-v2` so that `ctr run --runtime io.containerd.vgpu.v2`
  (which resolves the shim by name on containerd's PATH) finds it.
- podman: an OCI hooks.d file (Podman, CRI-O) that runs vgpu-hook at every stage the
  shipped file lists (prestart and poststop).

`vgpu uninstall` (shim.uninstall) takes back what this writes.
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shutil
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import tomli_w

from arbiter.errors import ShippedFileNotFoundError, VgpuError
from arbiter.files.atomic import replace_link, write_whole
from arbiter.install import versions
from arbiter.install.shipped import shipped_file
from arbiter.native import program_path
from shim.containerd_cri import (
    CRI_PLUGIN,
    RUNTIME_NAME,
    cri_plugin,
    cri_section,
    import_paths,
    merged_cri_section,
    vgpu_only,
    with_vgpu,
)
from shim.errors import InstallError

__all__ = [
    "DEFAULT_BIN_DIR",
    "DEFAULT_FILES",
    "PROGRAM",
    "TARGETS",
    "Change",
    "Link",
    "Switch",
    "add_arguments",
    "apply",
    "plan",
    "registered",
    "run",
    "switch_step",
]

TARGETS = ("docker", "containerd", "podman")
DEFAULT_FILES = {
    "docker": Path("/etc/docker/daemon.json"),
    "containerd": Path("/etc/containerd/config.toml"),
    "podman": Path("/etc/containers/oci/hooks.d/vgpu.json"),
}
#: Where the containerd shim's link goes: on containerd's PATH (systemd's default PATH
#: and containerd's own have it).
DEFAULT_BIN_DIR = Path("/usr/local/bin")
RESTART = {
    "docker": "restart Docker to apply it: systemctl restart docker",
    "containerd": "restart containerd to apply it: systemctl restart containerd",
    "podman": "Podman reads hooks.d at each container start: nothing to restart "
              "(CRI-O: systemctl restart crio)",
}
BACKUP_SUFFIX = ".vgpu.bak"
#: The shipped snippet of each target (arbiter.install.shipped.CONFIGS lists them).
SNIPPETS = {
    "docker": "docker/daemon.json",
    "containerd": "containerd/vgpu.toml",
    "podman": "oci-hooks.d/vgpu.json",
}
SHIM = "containerd-shim-vgpu-v2"
#: The program each target's engine execs.
PROGRAM = {"docker": "vgpu-runtime", "containerd": SHIM, "podman": "vgpu-hook"}


class Step(Protocol):
    """One thing `vgpu install` may change: a file's text or a symlink."""

    @property
    def path(self) -> Path:
        """The file or link."""

    @property
    def changed(self) -> bool:
        """True when applying it would change something."""

    def preview(self) -> str:
        """What --dry-run prints for it."""

    def write(self) -> str:
        """Apply it; the line that says what was done."""


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

    def preview(self) -> str:
        """The unified diff, without its last newline."""
        return self.diff().rstrip("\n")

    def write(self) -> str:
        """Back the file up (before the first change only), then write it atomically."""
        backup = self.path.with_name(self.path.name + BACKUP_SUFFIX)
        if self.old is not None and not backup.exists():
            shutil.copy2(self.path, backup)
        _write(self.path, self.new)
        made = f" (backup: {backup})" if backup.exists() else ""
        return f"vgpu: wrote {self.path}{made}"


@dataclass(frozen=True)
class Link:
    """A symlink `path` -> `target` (old: what it points to now, None: nothing there)."""

    path: Path
    old: str | None
    target: str

    @property
    def changed(self) -> bool:
        """True when the link is missing or points elsewhere."""
        return self.old != self.target

    def preview(self) -> str:
        """The link as it is and as it would be."""
        now = "missing" if self.old is None else f"-> {self.old}"
        return f"link {self.path}: {now}, would be -> {self.target}"

    def write(self) -> str:
        """Make the link atomically (a temporary link renamed over the old one)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        replace_link(self.path, self.target, durable=True)
        return f"vgpu: linked {self.path} -> {self.target}"


@dataclass(frozen=True)
class Switch:
    """This installation's native files installed under `lib_dir` (once) and
    `<lib_dir>/current` pointed at them (old: what it names now, None: nothing)."""

    lib_dir: Path
    old: str | None
    version: str
    name: str
    files: Mapping[str, Path] = field(compare=False)

    @property
    def path(self) -> Path:
        """The link engines exec through."""
        return self.lib_dir / versions.CURRENT

    @property
    def changed(self) -> bool:
        """True when current names another install, or its install is missing."""
        return self.old != self.name or \
            not (self.lib_dir / self.name / versions.MANIFEST).is_file()

    def preview(self) -> str:
        """The install and the link as they would be."""
        now = "missing" if self.old is None else f"-> {self.old}"
        return (f"install {self.lib_dir / self.name} (unless there) and switch "
                f"{self.path}: {now}, would be -> {self.name}")

    def write(self) -> str:
        """Install (made once) and switch atomically."""
        try:
            inst = versions.install(self.lib_dir, self.version, self.files)
            versions.switch_current(self.lib_dir, inst)
        except versions.InstallError as e:
            raise InstallError(e.path, e.reason) from e
        return f"vgpu: engines run the programs of {self.path} -> {inst.name}"


def switch_step(lib_dir: Path) -> Switch:
    """The step that makes `<lib_dir>/current` name this installation's versioned install."""
    from arbiter.native import own_files
    from arbiter.version import version

    try:
        files = own_files()
        digest = versions.content_hash(files)
    except VgpuError as e:
        raise InstallError(lib_dir, str(e)) from e
    except OSError as e:
        raise InstallError(Path(e.filename or lib_dir),
                           f"cannot read it: {e.strerror or e}") from e
    try:
        old: str | None = os.readlink(lib_dir / versions.CURRENT)
    except FileNotFoundError:
        old = None
    except OSError as e:
        raise InstallError(lib_dir / versions.CURRENT, e.strerror or str(e)) from e
    return Switch(lib_dir, old, version(), f"{version()}-{digest}", files)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise InstallError(path, f"cannot read it: {getattr(e, 'strerror', None) or e}") from e


def _snippet(target: str) -> tuple[Path, str]:
    """The shipped snippet of `target`: its path and text."""
    try:
        path = shipped_file(SNIPPETS[target])
        return path, path.read_text(encoding="utf-8")
    except ShippedFileNotFoundError as e:
        raise InstallError(Path(e.name), str(e)) from e
    except (OSError, UnicodeDecodeError) as e:
        raise InstallError(Path(SNIPPETS[target]),
                           f"cannot read the shipped snippet: {e}") from e


def _json_snippet(target: str) -> dict[str, Any]:
    path, text = _snippet(target)
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise InstallError(path, f"the shipped snippet is not valid JSON: {e}") from e
    if not isinstance(doc, dict):
        raise InstallError(path, "the shipped snippet is not a JSON object")
    return doc


# ---- docker -------------------------------------------------------------------------

def plan_docker(path: Path, runtime_path: str) -> list[Change]:
    """daemon.json with the shipped runtimes (path: `runtime_path`); every other setting kept."""
    shipped = _json_snippet("docker").get("runtimes", {})
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
    before = json.dumps(runtimes, sort_keys=True)
    for name, wanted in shipped.items():
        entry = runtimes.get(name)
        entry = dict(entry) if isinstance(entry, dict) else {}
        entry.update(wanted, path=runtime_path)
        runtimes[name] = entry
    if old is not None and json.dumps(runtimes, sort_keys=True) == before:
        return [Change(path, old, old)]
    return [Change(path, old, json.dumps(doc, indent=4) + "\n")]


# ---- containerd ---------------------------------------------------------------------

#: The config versions vgpu writes a drop-in for: 2 (containerd 1.x, and 2.x migrating it),
#: 3 (2.x) and 4 (containerd after 2.2: server settings moved, the CRI plugins as in 3).
CONFIG_VERSIONS = (2, 3, 4)


def dropin_path(config: Path) -> Path:
    """Where the vgpu drop-in goes: conf.d/ next to the main config."""
    return config.parent / "conf.d" / "vgpu.toml"


def _shipped_runtime(shim_path: str) -> dict[str, Any]:
    """The shipped snippet's `vgpu` CRI runtime, with `runtime_path` = `shim_path`
    (containerd >= 1.6 runs that binary for the handler whatever its PATH)."""
    path, text = _snippet("containerd")
    runtime = _cri_runtimes(_toml(path, text)).get(RUNTIME_NAME)
    if not isinstance(runtime, dict) or "runtime_type" not in runtime:
        raise InstallError(path, f"the shipped snippet has no CRI runtime {RUNTIME_NAME!r}")
    return {**runtime, "runtime_path": shim_path}


def dropin_text(config: Path, section: dict[str, Any], version: int = 2) -> str:
    """The drop-in: the shipped snippet's comments, then the CRI section it must hold
    (config `version` 2: the whole section; 3 on: what vgpu adds to it)."""
    _, text = _snippet("containerd")
    comments = "".join(line for line in text.splitlines(keepends=True)
                       if line.startswith("#"))
    if version < 3:
        note = (f"#\n# Written by `vgpu install containerd` from {config}: containerd 1.x takes "
                "an\n# imported plugin section whole, so this is that config's CRI section with "
                "the\n# vgpu runtime added. Run `vgpu install containerd` again after editing "
                "it.\n")
    else:
        note = (f"#\n# Written by `vgpu install containerd` for {config} (version {version}, "
                "containerd 2.x):\n# containerd merges an imported file key by key, so this "
                "holds vgpu's runtime alone.\n")
    doc = {"version": version, "plugins": {cri_plugin(version): section}}
    return comments + note + tomli_w.dumps(doc)


def _cri_runtimes(doc: dict[str, Any]) -> dict[str, Any]:
    runtimes: dict[str, Any] = (doc.get("plugins", {}).get(CRI_PLUGIN, {})
                                .get("containerd", {}).get("runtimes", {}))
    return runtimes


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


def _link(path: Path, target: str) -> Link:
    """The link step; a file that is not a symlink is never replaced."""
    try:
        return Link(path, os.readlink(path), target)
    except FileNotFoundError:
        return Link(path, None, target)
    except OSError as e:
        reason = ("it exists and is not a symlink: remove it or pass --bin-dir"
                  if e.errno == 22 else e.strerror or str(e))
        raise InstallError(path, reason) from e


def _imported(config: Path, imports: list[Any], ours: Path) -> list[dict[str, Any]]:
    """The documents of the files `imports` names (ours and missing ones left out)."""
    docs = []
    for path in import_paths(config, [str(i) for i in imports]):
        if path == ours:
            continue
        text = _read(path)
        if text is not None:
            docs.append(_toml(path, text))
    return docs


def plan_containerd(path: Path, shim_path: str, bin_dir: Path, *, set_default: bool = False,
                    out: Callable[[str], None] = print) -> list[Step]:
    """The drop-in (the config's CRI section with the vgpu runtime, and with set_default
    vgpu as the default runtime), the main config's imports line (a new main config if
    there is none) and the shim's link on containerd's PATH."""
    dropin = dropin_path(path)
    old = _read(path)
    doc = _toml(path, old) if old is not None and old.strip() else {}
    version = doc.get("version", 1) if doc else 2
    if version not in CONFIG_VERSIONS:
        hint = ("run `containerd config migrate` (containerd 1.x) first"
                if version == 1 else "vgpu knows versions 2 (containerd 1.x and 2.x) and 3 "
                "and 4 (2.x)")
        raise InstallError(path, f"config version {version} is not supported ({hint})")
    imports = doc.get("imports", [])
    if not isinstance(imports, list):
        raise InstallError(path, "imports is not a list")
    imported = _imported(path, imports, dropin)
    runtime = _shipped_runtime(shim_path)
    if version < 3:
        section = with_vgpu(cri_section(doc, imported), runtime, set_default=set_default,
                            warn=out)
    else:
        section = vgpu_only(with_vgpu(merged_cri_section(doc, imported), runtime,
                                      set_default=set_default, warn=out),
                            set_default=set_default)
    steps: list[Step] = [Change(dropin, _read(dropin), dropin_text(path, section, version)),
                         _link(bin_dir / SHIM, shim_path)]
    if old is None or not old.strip():
        new = f"version = 2\nimports = [{json.dumps(str(dropin))}]\n"
        return [*steps, Change(path, old, new if old is None else old + new)]
    if str(dropin) in imports:
        return [*steps, Change(path, old, old)]
    new = _with_import(path, old, str(dropin))
    after = _toml(path, new)
    expected = dict(doc, imports=[*imports, str(dropin)])
    if after != expected:   # never write what we cannot prove equal but for the import
        raise InstallError(path, f"cannot add {dropin} to its imports safely: add it by hand")
    return [*steps, Change(path, old, new)]


# ---- podman / CRI-O -------------------------------------------------------------------

def plan_podman(path: Path, hook_path: str) -> list[Change]:
    """The shipped hooks.d file with hook.path pointing at this installation's vgpu-hook."""
    doc = _json_snippet("podman")
    hook = doc.get("hook")
    if not isinstance(hook, dict):
        raise InstallError(shipped_file(SNIPPETS["podman"]), "the shipped snippet has no hook")
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
    write_whole(path, text.encode(), mode, durable=True)


def apply(steps: Sequence[Step], *, dry_run: bool, out: Callable[[str], None]) -> bool:
    """Carry out (or with dry_run, show) every step that changes something; True when any."""
    pending = [s for s in steps if s.changed]
    for s in pending:
        if dry_run:
            out(s.preview())
            continue
        try:
            out(s.write())
        except OSError as e:
            raise InstallError(s.path, e.strerror or str(e)) from e
    return bool(pending)


def _program(name: str, explicit: str | None, flag: str, lib_dir: Path | None) -> str:
    """The absolute path engines exec for one of our compiled programs: given, else the
    stable path through `<lib_dir>/current`, else (no lib dir) this installation's own
    (arbiter/native/bin/ in the wheel, build/bin/ in a checkout)."""
    if explicit:
        return str(Path(explicit).absolute())
    if lib_dir is not None:
        return str(versions.stable_program(lib_dir.absolute(), name))
    found = program_path(name)
    if found is None:
        raise InstallError(Path(name), f"this installation has no compiled {name} (run `make` "
                                       f"in a checkout, reinstall vgpu, or pass {flag})")
    return str(found.absolute())


def plan(target: str, config_file: Path, *, runtime_path: str | None = None,
         hook_path: str | None = None, shim_path: str | None = None,
         bin_dir: Path = DEFAULT_BIN_DIR, set_default: bool = False,
         lib_dir: Path | None = None, switch: bool = True,
         out: Callable[[str], None] = print) -> list[Step]:
    """The steps that register vgpu with `target`, for the config file given
    (set_default: containerd only, vgpu becomes the CRI default runtime). With `lib_dir`
    and no explicit program path, the engine execs `<lib_dir>/current/bin/<program>` and,
    with `switch`, the first step installs this version there and switches `current`."""
    if target not in TARGETS:
        raise InstallError(config_file, f"unknown target {target!r}: use {', '.join(TARGETS)}")
    explicit = {"docker": runtime_path, "containerd": shim_path, "podman": hook_path}[target]
    flag = {"docker": "--runtime-path", "containerd": "--shim-path",
            "podman": "--hook-path"}[target]
    program = _program(PROGRAM[target], explicit, flag, lib_dir)
    first: list[Step] = []
    if lib_dir is not None and not explicit and switch:
        first.append(switch_step(lib_dir.absolute()))
    if target == "docker":
        return [*first, *plan_docker(config_file, program)]
    if target == "containerd":
        return [*first, *plan_containerd(config_file, program, bin_dir,
                                         set_default=set_default, out=out)]
    return [*first, *plan_podman(config_file, program)]


def registered(target: str, config_file: Path) -> bool:
    """Whether `target` has a vgpu registration in (or beside) `config_file`: daemon.json's
    runtimes.vgpu, containerd's drop-in, the hooks.d file."""
    if target == "containerd":
        return dropin_path(config_file).is_file()
    if target == "podman":
        return config_file.is_file()
    try:
        doc = json.loads(_read(config_file) or "{}")
    except ValueError:
        return False
    return isinstance(doc, dict) and isinstance(doc.get("runtimes"), dict) \
        and "vgpu" in doc["runtimes"]


def config_lib_dir(args: argparse.Namespace) -> Path:
    """--lib-dir, else paths.lib_dir of the config (--config, $VGPU_CONFIG, the default)."""
    if getattr(args, "lib_dir", None):
        return Path(args.lib_dir).absolute()
    from arbiter import defaults
    from arbiter.config import load_config

    name = getattr(args, "config", None) or os.environ.get(defaults.ENV_CONFIG)
    return load_config(Path(name) if name else defaults.DEFAULT_CONFIG_PATH).lib_dir


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `vgpu install` arguments."""
    p.add_argument("target", choices=TARGETS, help="the engine to configure")
    p.add_argument("--config-file", metavar="PATH", type=Path,
                   help="the engine's config file (default: docker "
                        f"{DEFAULT_FILES['docker']}, containerd {DEFAULT_FILES['containerd']}, "
                        f"podman {DEFAULT_FILES['podman']})")
    p.add_argument("--dry-run", action="store_true", help="print the diff, change nothing")
    p.add_argument("--runtime-path", metavar="PATH",
                   help="vgpu-runtime for Docker (default: this installation's compiled one)")
    p.add_argument("--hook-path", metavar="PATH",
                   help="vgpu-hook for hooks.d (default: this installation's compiled one)")
    p.add_argument("--shim-path", metavar="PATH",
                   help=f"{SHIM} for containerd (default: this installation's compiled one)")
    p.add_argument("--lib-dir", metavar="DIR", type=Path,
                   help="where versioned installs live: engines exec DIR/current/bin/<program> "
                        "(default: paths.lib_dir of the config, /var/lib/vgpu/lib)")
    p.add_argument("--bin-dir", metavar="DIR", type=Path, default=DEFAULT_BIN_DIR,
                   help=f"where containerd finds {SHIM} by name (default: {DEFAULT_BIN_DIR})")
    p.add_argument("--set-as-default", action="store_true",
                   help="containerd: make vgpu the CRI default runtime (containers that ask "
                        "for no vGPU pass through it untouched); without it an earlier "
                        "default is undone")


def _found_by(target: str, steps: Sequence[Step]) -> str | None:
    """The line that says how the engine finds our program."""
    if target != "containerd":
        return None
    link = next(s for s in steps if isinstance(s, Link))
    dropin = next(s for s in steps if isinstance(s, Change))
    return (f"vgpu: containerd runs {link.target}: CRI (RuntimeClass handler `vgpu`) through "
            f"runtime_path in {dropin.path}, `ctr run --runtime io.containerd.vgpu.v2` "
            f"through {link.path} on containerd's PATH")


def run(args: argparse.Namespace, out: Callable[[str], None]) -> int:
    """Carry out `vgpu install` for parsed args."""
    config_file = args.config_file or DEFAULT_FILES[args.target]
    if args.set_as_default and args.target != "containerd":
        raise InstallError(Path(config_file), "--set-as-default is for containerd only (Docker: "
                                              '"default-runtime": "vgpu" in daemon.json)')
    explicit = {"docker": args.runtime_path, "containerd": args.shim_path,
                "podman": args.hook_path}[args.target]
    steps = plan(args.target, Path(config_file), runtime_path=args.runtime_path,
                 hook_path=args.hook_path, shim_path=args.shim_path, bin_dir=args.bin_dir,
                 set_default=args.set_as_default,
                 lib_dir=None if explicit else config_lib_dir(args), out=out)
    changed = apply(steps, dry_run=args.dry_run, out=out)
    # Switching `current` alone needs no engine restart: the engine execs the same path.
    if not any(s.changed for s in steps if not isinstance(s, Switch)):
        if changed and args.dry_run:
            out("vgpu: dry run: nothing was changed")
        out(f"vgpu: {args.target} is already configured ({config_file}): nothing to change")
    elif args.dry_run:
        out("vgpu: dry run: nothing was changed")
    else:
        found = _found_by(args.target, steps)
        if found:
            out(found)
        if args.set_as_default:
            out("vgpu: vgpu is containerd's CRI default runtime: pods that name no handler run "
                "through it, and those that ask for no vGPU pass to runc untouched")
        out(f"vgpu: {RESTART[args.target]}")
    return 0
