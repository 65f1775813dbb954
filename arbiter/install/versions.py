# SPDX-License-Identifier: Apache-2.0
"""Versioned installs of the native parts: `<lib dir>/<version>-<content hash>/`.

Each version's libvgpu.so and compiled programs live in a directory of their own that is
made once (copied into a temporary directory, then renamed into place) and never written
again: a container maps the libvgpu.so of the directory vgpud handed it, so neither a
`pip install` over the package nor a rebuild changes what running containers mapped (an
in-place overwrite of a mapped library crashes its users). The content hash makes a
rebuilt same-version install a different directory.

`<lib dir>/current` is a relative symlink to the install whose programs the engines exec
(`vgpu install` registers `current/bin/<program>`; `vgpu upgrade` switches it): it is
replaced atomically (a new link renamed over it), so an engine's exec finds either the old
or the new program, never a half-written one.

A directory no container uses any more is removed (`collect`), never the one vgpud serves,
never the one `current` names. A container's use is known from its slice
(Slice.libvgpu_version, recorded at prestart) or, for a container an older vgpud started
(it recorded nothing), from the mountinfo of its init: the bind source of
/usr/lib/vgpu/libvgpu.so. What cannot be read counts as in use. A container whose slice is
already gone (the reconciler released it after its init died) may still have its poststop
hook to run from its install: an install an OCI runtime's container state names (runc's
state.json, a config.json beside it) is kept until the runtime deletes that container.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from arbiter.errors import VgpuError
from arbiter.files.atomic import replace_link

if TYPE_CHECKING:
    from arbiter.model import Slice

__all__ = [
    "CURRENT",
    "MANIFEST",
    "Holder",
    "Install",
    "InstallError",
    "Keeper",
    "collect",
    "content_hash",
    "current",
    "install",
    "installed",
    "mounted_installs",
    "own_install",
    "runtime_referenced",
    "stable_program",
    "switch_current",
    "unused",
]

log = logging.getLogger("vgpud")

#: Written last into the temporary directory: an install has one, a leftover has none.
MANIFEST = "vgpu-install.json"
_HASH_CHARS = 12
_TMP_PREFIX = ".tmp-"
_RM_PREFIX = ".rm-"
#: A temporary directory older than this is a leftover of an interrupted install.
_STALE_TMP_S = 600.0
#: The symlink naming the install whose programs the engines exec.
CURRENT = "current"
#: The files of an OCI runtime's container state that name its hooks (runc: state.json;
#: crun and others keep the bundle's config.json).
_RUNTIME_STATE_FILES = ("state.json", "config.json")
#: A container state file larger than this is not read (a spec is a few KiB).
_RUNTIME_STATE_MAX = 4 << 20


class InstallError(VgpuError):
    """A versioned install could not be made or read."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"failed to install {path}: {reason}")


@dataclass(frozen=True)
class Install:
    """One versioned install directory."""

    path: Path
    version: str
    hash: str

    @property
    def name(self) -> str:
        """`<version>-<hash>`: what a slice records and `vgpu ls` shows."""
        return self.path.name

    @property
    def libvgpu(self) -> Path:
        """The install's libvgpu.so."""
        return self.path / "libvgpu.so"

    def program(self, name: str) -> Path:
        """The install's compiled program `name` (e.g. vgpu-hook, shim/runc)."""
        return self.path / "bin" / name


def content_hash(files: Mapping[str, Path]) -> str:
    """The first hex digits of a sha256 over every (path inside, bytes), in path order."""
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(rel.encode() + b"\0")
        with open(files[rel], "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(hashlib.sha256(chunk).digest())
        h.update(b"\0")
    return h.hexdigest()[:_HASH_CHARS]


def _valid_version(version: str) -> bool:
    return bool(version) and "/" not in version and not version.startswith(".") \
        and "\0" not in version


def install(root: Path, version: str, files: Mapping[str, Path]) -> Install:
    """The install of `files` as `version` under `root`: the existing one, else made now.

    Made in a temporary directory beside it and renamed into place, so a directory named
    `<version>-<hash>` is always complete; an existing one is never written."""
    if not _valid_version(version):
        raise InstallError(root, f"version {version!r} cannot name a directory")
    if "libvgpu.so" not in files:
        raise InstallError(root, "no libvgpu.so to install (build it with make)")
    try:
        digest = content_hash(files)
    except OSError as e:
        raise InstallError(root, f"cannot read {e.filename}: {e.strerror}") from e
    target = root / f"{version}-{digest}"
    if (target / MANIFEST).is_file():
        return Install(target, version, digest)
    try:
        root.mkdir(mode=0o755, parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{target.name}.", dir=root))
    except OSError as e:
        raise InstallError(root, e.strerror or str(e)) from e
    try:
        os.chmod(tmp, 0o755)
        for rel, src in sorted(files.items()):
            dst = tmp / rel
            dst.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
            os.chmod(dst, 0o755)
        manifest = {"version": version, "hash": digest, "files": sorted(files)}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        _fsync_tree(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            # Another vgpud (or vgpu upgrade) made it meanwhile: theirs is complete.
            if not (target / MANIFEST).is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise InstallError(target, e.strerror or str(e)) from e
    log.info("installed %s", target)
    return Install(target, version, digest)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, names in os.walk(root):
        for n in names:
            fd = os.open(os.path.join(dirpath, n), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def installed(root: Path) -> list[Install]:
    """Every complete install under `root`, by name."""
    out = []
    try:
        entries = sorted(root.iterdir())
    except FileNotFoundError:
        return []
    for d in entries:
        if d.name.startswith(".") or not d.is_dir() or d.is_symlink():
            continue
        try:
            manifest = json.loads((d / MANIFEST).read_text(encoding="utf-8"))
            version, digest = str(manifest["version"]), str(manifest["hash"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not one of ours: never touched
        if d.name == f"{version}-{digest}":
            out.append(Install(d, version, digest))
    return out


def _unescape(field: str) -> str:
    """mountinfo's octal escapes (\\040 for a space, ...)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit() and len(field[i + 1:i + 4]) == 3:
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounted_installs(mountinfo: str, names: Iterable[str], target: str) -> set[str]:
    """The install names whose files are bind-mounted at `target` in a mountinfo text.

    A bind mount's root (field 4) is the source's path inside its filesystem, so the
    install's directory name is one of its components wherever the lib dir is mounted."""
    wanted = set(names)
    found: set[str] = set()
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if len(fields) < 5 or _unescape(fields[4]) != target:
            continue
        root = _unescape(fields[3]).removesuffix("//deleted")
        found.update(part for part in root.split("/") if part in wanted)
    return found


@dataclass(frozen=True)
class Holder:
    """A live slice as collection sees it: the install it recorded, its container's init."""

    recorded: str
    pid: int


def unused(installs: Iterable[Install], serving: str, holders: Iterable[Holder], *,
           target: str, proc: Path = Path("/proc"), keep: Iterable[str] = ()) -> list[Install]:
    """The installs no container maps any more, vgpud does not serve, and `keep` does not
    name (`current`'s, those a runtime's container state names).

    A holder with a recorded install keeps it; one without (started by an older vgpud)
    keeps what its init's mountinfo shows; an init whose mountinfo cannot be read for any
    reason but its being gone keeps them all."""
    kept = set(keep)
    candidates = [i for i in installs if i.name != serving and i.name not in kept]
    names = {i.name for i in candidates}
    in_use: set[str] = set()
    for h in holders:
        if h.recorded:
            in_use.add(h.recorded)
            continue
        if h.pid <= 0:
            continue   # not started: it gets the install vgpud serves at prestart
        try:
            text = (proc / str(h.pid) / "mountinfo").read_text(encoding="utf-8",
                                                                errors="replace")
        except (FileNotFoundError, ProcessLookupError):
            continue   # gone: nothing of it maps anything
        except OSError:
            return []  # unknown: every install may be in use
        in_use |= mounted_installs(text, names, target)
    return [i for i in candidates if i.name not in in_use]


def current(root: Path) -> Install | None:
    """The install `<root>/current` names; None when there is no link or it names no install."""
    try:
        name = os.readlink(root / CURRENT)
    except OSError:
        return None
    return next((i for i in installed(root) if i.name == name), None)


def stable_program(root: Path, name: str) -> Path:
    """The path engines exec for program `name`: through `current`, whatever it names."""
    return root / CURRENT / "bin" / name


def switch_current(root: Path, inst: Install) -> str | None:
    """Point `<root>/current` at `inst` atomically (a new link renamed over the old one);
    the name it pointed at before (None: there was none)."""
    if inst.path.parent != root or not (inst.path / MANIFEST).is_file():
        raise InstallError(inst.path, f"not a complete install under {root}")
    link = root / CURRENT
    try:
        before: str | None = os.readlink(link)
    except FileNotFoundError:
        before = None
    except OSError as e:
        raise InstallError(link, f"cannot read it: {e.strerror or e}") from e
    try:  # relative: the lib dir may be mounted elsewhere
        replace_link(link, inst.name, durable=True)
    except OSError as e:
        raise InstallError(link, e.strerror or str(e)) from e
    if before != inst.name:
        log.info("switched %s -> %s (was %s)", link, inst.name, before)
    return before


def _container_dirs(roots: Iterable[Path]) -> Iterable[Path]:
    """Each container directory under an OCI runtime's state roots (depth 1 or 2:
    /run/runc/<id>, /run/containerd/runc/<namespace>/<id>)."""
    for root in roots:
        try:
            level1 = [d for d in Path(root).iterdir() if d.is_dir()]
        except OSError:
            continue
        for d in level1:
            if any((d / f).is_file() for f in _RUNTIME_STATE_FILES):
                yield d
                continue
            with contextlib.suppress(OSError):
                yield from (c for c in d.iterdir() if c.is_dir())


def runtime_referenced(root: Path, names: Iterable[str], roots: Iterable[Path]) -> set[str]:
    """The install names whose paths (`<root>/<name>/`) a runtime's container state names:
    a container the runtime has not deleted yet runs its poststop hook from there."""
    wanted = {n: f"{root}/{n}/".encode() for n in names}
    found: set[str] = set()
    if not wanted:
        return found
    for d in _container_dirs(roots):
        for f in _RUNTIME_STATE_FILES:
            try:
                with open(d / f, "rb") as fh:
                    data = fh.read(_RUNTIME_STATE_MAX)
            except OSError:
                continue
            found.update(n for n, needle in wanted.items() if needle in data)
    return found


def collect(root: Path, serving: str, holders: Iterable[Holder], *, target: str,
            proc: Path = Path("/proc"), runtime_state_roots: Iterable[Path] = ()
            ) -> list[Install]:
    """Remove the installs `unused` names (renamed aside first, so a half-removed directory
    never looks like an install) and leftovers of interrupted installs; the removed ones.

    Kept besides: the install `current` names and those a runtime's container state names."""
    removed = []
    found = installed(root)
    keep = runtime_referenced(root, (i.name for i in found if i.name != serving),
                              runtime_state_roots)
    with contextlib.suppress(OSError):
        keep.add(os.readlink(root / CURRENT))
    for inst in unused(found, serving, holders, target=target, proc=proc, keep=keep):
        aside = root / f"{_RM_PREFIX}{inst.name}"
        try:
            os.rename(inst.path, aside)
        except OSError as e:
            log.warning("installs: cannot remove %s: %s", inst.path, e.strerror or e)
            continue
        shutil.rmtree(aside, ignore_errors=True)
        log.info("removed %s: no container uses it", inst.path)
        removed.append(inst)
    now = time.time()
    with contextlib.suppress(FileNotFoundError):
        for d in root.iterdir():
            if not d.is_dir() or d.is_symlink():
                continue
            stale = d.name.startswith(_TMP_PREFIX) and now - d.lstat().st_mtime > _STALE_TMP_S
            if d.name.startswith(_RM_PREFIX) or stale:
                shutil.rmtree(d, ignore_errors=True)
    return removed


class Keeper:
    """vgpud's part: installs its own native files at start and, every `interval_s`, removes
    the installs no live slice's container maps (an Attachment: vgpud/ composes it)."""

    def __init__(self, root: Path, own: Install, slices: Callable[[], Iterable[Slice]], *,
                 target: str, interval_s: float, proc: Path = Path("/proc"),
                 runtime_state_roots: Iterable[Path] = ()) -> None:
        self.root = root
        self.own = own
        self._slices = slices
        self.target = target
        self.interval_s = interval_s
        self.proc = proc
        self.runtime_state_roots = tuple(runtime_state_roots)
        #: What vgpud's Health reports (`vgpu info`); libvgpu and hook are what the
        #: container path mounts and injects (vgpud/ gives it this same install), so the
        #: DRA plugin's CDI specs name exactly them.
        self.paths = {"lib_dir": str(root), "libvgpu": str(own.libvgpu),
                      "hook": str(own.program("vgpu-hook"))}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def collect_once(self) -> list[Install]:
        """One pass: the installs removed."""
        holders = [Holder(s.libvgpu_version, s.owner_pid) for s in self._slices()]
        return collect(self.root, self.own.name, holders, target=self.target, proc=self.proc,
                       runtime_state_roots=self.runtime_state_roots)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.collect_once()
            except Exception:
                log.exception("installs: collection failed (retried next pass)")

    def start(self) -> None:
        """Collect now, then in a thread."""
        self.collect_once()
        self._thread = threading.Thread(target=self._loop, name="vgpud-installs", daemon=True)
        self._thread.start()

    def serve_on(self, sock: socket.socket) -> None:
        """No socket is served here: one passed for these paths is not ours to keep."""
        sock.close()

    def close(self) -> None:
        """Stop collecting (the installs stay: containers may map them)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


def own_install(root: Path) -> Install:
    """This installation's native files (arbiter.native.own_files), installed under `root`
    as this package's version."""
    from arbiter.native import own_files
    from arbiter.version import version
    try:
        files = own_files()
    except VgpuError as e:
        raise InstallError(root, str(e)) from e
    return install(root, version(), files)
