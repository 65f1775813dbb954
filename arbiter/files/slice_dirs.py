# SPDX-License-Identifier: Apache-2.0
"""The arbiter's side of slice files: region directories under <run_dir>/slices, and each
slice's scheduling files under <run_dir>/sched.

A slice's directory `<run_dir>/slices/<id>/` holds per vGPU a region file
(`vgpu<i>`: limits and identity, only vgpud writes it, containers mount it read-only)
and a usage file (`vgpu<i>.usage`: the slice's processes write it; read here as
untrusted data). Both follow arbiter.files.region_file's layout. The directory is a tmpfs of its
own, sized to its files (arbiter.files.slicefs: what bounds the files a container writes),
made in place under the arbiter's lock; a crash half-way leaves a part that
reconcile_dirs completes or removes; removal unmounts it and renames it away first.
Each vGPU also has a .req and a .conf beside its GPU's scheduling file
(arbiter.files.sched_files), named by a key derived from the slice id; the .req itself is in the
slice's directory, bind-mounted at that name. The store (SQLite) is the truth: `reconcile_dirs`
makes the files agree with it after a crash, `repair_sched` remakes deleted ones.

Every slice file a container can open (region, usage, .req) is opened without waiting
and then held open read-write while the slice lives (arbiter.files.leases: no tenant can lease
it then; the GPUs' files are held by arbiter.compute.broker_watch). One that a lease holds at that
moment (after a vgpud restart) is kept as it is, said (`on_busy`) and tried again by
`retry_pending`, never waited on.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from arbiter.errors import RegionError, SchedError
from arbiter.files import fileops
from arbiter.files.leases import Pins
from arbiter.files.region_file import (
    REGION_SIZE,
    USAGE_SIZE,
    USAGE_SUFFIX,
    create_region,
    create_usage,
    open_region,
    region_bytes,
    usage_bytes,
    usage_path_of,
)
from arbiter.files.sched_files import (
    REQ_SIZE,
    SCHED_DIR_NAME,
    new_slice_file_ops,
    prepare_sched_dir,
    remove_slice_files,
    req_path,
    slice_file_keys,
    slice_file_name,
    slice_key_of,
    usable_name,
    write_slice_files,
)
from arbiter.files.slicefs import detach, share, slice_fs_bytes, slice_fs_options
from arbiter.model import Slice

__all__ = ["REGION_FILE_MODE", "USAGE_FILE_MODE", "ReconcileReport", "Regions", "Retired"]

log = logging.getLogger(__name__)

#: In run_dir, while run_dir is a bind mount of itself that a vgpud made (Regions._share).
_BOUND_MARK = ".bound-by-vgpud"

#: Limits: readable by a container's processes (any uid), written by vgpud alone.
REGION_FILE_MODE = 0o644
#: Usage: container processes run as any uid and account there; host users other
#: than root cannot reach it (the slice directories are root's alone).
USAGE_FILE_MODE = 0o666
_ROOT_MODE = 0o711
_DIR_MODE = 0o700
#: The most vGPUs a slice can have (one per GPU): bounds the keys a removal looks for.
_MAX_VGPUS = 64


@dataclass(frozen=True)
class Retired:
    """A slice Regions.retire() took out of use: what Regions.finish() still removes."""

    slice_id: str
    sched_files: tuple[tuple[str, int], ...]  # (GPU uuid, slice key) of each .req left
    #: What finish() runs before its own removals, in the same call: the .conf deletes
    #: and the closes of the files vgpud held (each a system call, and every call into
    #: the library lets go of the GIL once).
    first: tuple[fileops.Op, ...] = ()


@dataclass(frozen=True)
class _Creation:
    """What Regions.create runs for one slice (arbiter.files.fileops), and where in it."""

    slice_id: str
    final: str
    ops: tuple[fileops.Op, ...]
    held: tuple[str | None, ...]  # per op: the path its kept file is held under
    #: The GPUs whose scheduling files the first ops check (one each), in that order;
    #: the slice's mkdir comes right after them.
    gpus: tuple[str, ...]
    mount: int  # index of the tmpfs mount; -1: none
    sched: int  # index of the first scheduling-file op: what fails from there is SchedError
    sched_files: tuple[tuple[str, int], ...]  # (GPU uuid, slice key) per vGPU


@dataclass(frozen=True)
class ReconcileReport:
    """What reconcile_dirs changed: slice ids whose directories it made, fixed or removed."""

    created: tuple[str, ...] = ()
    fixed: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()


def region_name(ordinal: int) -> str:
    """File name of a slice's vGPU `ordinal` (what VGPU_REGION_DIR/vgpu<i> names)."""
    return f"vgpu{ordinal}"


class Regions:
    """Region directories of all slices under one run dir."""

    def __init__(self, run_dir: Path, *, context_reserve: int = 0, priority_floor: int = 0,
                 proc: Path = Path("/proc")) -> None:
        self.run_dir = Path(run_dir)
        self.root = self.run_dir / "slices"
        self._root_str = str(self.root)
        self.context_reserve = context_reserve
        #: % of the GPU a lower-priority slice keeps while a higher one runs (every slice).
        self.priority_floor = priority_floor
        self.proc = Path(proc)
        self.sched_root = self.run_dir / SCHED_DIR_NAME
        self._sched_root_str = str(self.sched_root)
        #: UUIDs of the GPUs whose scheduling files vgpud keeps (set by the daemon).
        self.sched_gpus: list[str] = []
        #: Told (slice id, vGPU ordinal, reason) when a usage file reads malformed; the
        #: daemon makes it an event and a metric. Once per slice and vGPU until it reads
        #: whole again.
        self.on_bad_usage: Callable[[str, int, str], None] | None = None
        self._bad_seen: set[tuple[str, int]] = set()
        #: Told (what, path) when a part of the run dir was missing and is made again.
        self.on_remade: Callable[[str, Path], None] | None = None
        #: Told (slice id, path, reason) when a tenant's file lease keeps a slice's file
        #: from being opened now; once per slice until all its files are held again.
        self.on_busy: Callable[[str, Path, str], None] | None = None
        #: The files containers can open, held open while in use (arbiter.files.leases).
        self.pins = Pins()
        #: Slices with a file not held, or a region write that waits for a lease to end.
        self._pending: set[str] = set()
        #: Each slice's files in the scheduling directory, (GPU uuid, slice key) per vGPU, as
        #: _write_sched made them: remove() deletes them by name, with no listing.
        self._sched_files: dict[str, tuple[tuple[str, int], ...]] = {}
        #: Slices retire()d whose finish() has not ended: gone for exists() and reconcile.
        self._retiring: set[str] = set()
        #: Whether slice directories get their own tmpfs (False once a mount was refused:
        #: vgpud without CAP_SYS_ADMIN, said once).
        self.bounded = True

    # -- paths -----------------------------------------------------------------

    def prepare(self) -> list[Path]:
        """Make <run_dir> and <run_dir>/slices (mode 0711: a slice's own directory is
        root's alone); return the directories it had to make.

        Directories that exist keep their mode: the operator chose it. The library that
        makes slices' files is loaded here, at vgpud's start (arbiter.files.fileops.load)."""
        fileops.load()
        made = []
        for d in (self.run_dir, self.root):
            if d.is_dir():
                continue
            try:
                d.mkdir(parents=True, exist_ok=True)
                os.chmod(d, _ROOT_MODE)
            except OSError as e:
                raise RegionError(d, "prepare directory for", e.strerror or str(e)) from e
            made.append(d)
        self._share()
        return made

    def _share(self) -> None:
        """Shared propagation on run_dir, for the previous release's hook (files.slicefs)."""
        if not self.bounded:
            return
        try:
            if share(self.run_dir):
                # Said in the directory itself: a later vgpud undoes it too (unshare).
                (self.run_dir / _BOUND_MARK).touch()
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.EACCES):
                raise RegionError(self.run_dir, "share mounts below", e.strerror or str(e)) from e
            self._unbounded(self.run_dir, e)

    def unshare(self) -> None:
        """Undo the bind mount a vgpud made of run_dir (_share), at a stop with no slice
        left, so that nothing of vgpud stays mounted (a run dir a test or the demo makes in
        a temporary directory can then be removed). With slices left it stays: their
        containers' files are below it. A mount someone else made there (a DaemonSet's
        hostPath volume) is not vgpud's to undo: only one _BOUND_MARK says vgpud made."""
        mark = self.run_dir / _BOUND_MARK
        if not mark.exists():
            return
        with contextlib.suppress(OSError):
            mark.unlink()
            detach(self.run_dir)

    def _ensure_root(self) -> None:
        """<run_dir>/slices deleted while vgpud runs: made again, and said so."""
        if self.root.is_dir():
            return
        for d in self.prepare():
            log.warning("%s was missing: made it again", d)
            if self.on_remade is not None:
                self.on_remade("directory", d)

    def slice_dir(self, slice_id: str) -> Path:
        """Directory of a slice's region files."""
        return Path(self.slice_path(slice_id))

    def slice_path(self, slice_id: str) -> str:
        """slice_dir as a str: what every Allocate and Release use, with no pathlib (a Path
        made, joined and hashed is some twenty Python calls)."""
        _check_id(slice_id)
        return f"{self._root_str}/{slice_id}"

    def region_path(self, slice_id: str, ordinal: int) -> Path:
        """Region file of a slice's vGPU `ordinal`."""
        return self.slice_dir(slice_id) / region_name(ordinal)

    # -- lifecycle -------------------------------------------------------------

    def create(self, s: Slice) -> Path:
        """Make the slice's directory, its own tmpfs, with one region file per grant, and
        its scheduling files: all of it in one call (arbiter.files.fileops).

        ValueError for limits a region cannot hold; RegionError (its directory or files)
        or SchedError (its scheduling files) for what failed, with nothing left behind."""
        final = self.slice_path(s.id)
        made = self._creation(s, final, own_fs=self.bounded)
        before = self._sched_files.get(s.id)  # a live slice's, when this one is a second create
        self._sched_files[s.id] = made.sched_files
        mkdir = len(made.gpus)
        mended: set[str] = set()  # each cause is mended once, then the list runs again
        while True:
            try:
                kept = fileops.run(made.ops)
                break
            except fileops.FileOpError as e:
                if e.index < mkdir and "sched" not in mended:
                    mended.add("sched")  # a GPU's scheduling file deleted under us
                    self._prepare_sched(list(made.gpus))
                elif e.index == mkdir and e.errno == errno.ENOENT and "root" not in mended:
                    mended.add("root")  # <run_dir>/slices deleted under vgpud
                    self._ensure_root()
                elif (e.index == made.mount and e.errno in (errno.EPERM, errno.EACCES)
                      and "mount" not in mended):
                    mended.add("mount")
                    with contextlib.suppress(OSError):
                        os.rmdir(final)
                    self._unbounded(Path(final), e)
                    made = self._creation(s, final, own_fs=False)
                else:
                    raise self._undo(made, e, before) from e
        for held, k in zip(made.held, kept, strict=True):
            if k is not None and held is not None:
                self.pins.adopt(s.id, held, k.fd, k.ino)
        return Path(final)

    def _undo(self, made: _Creation, e: fileops.FileOpError,
              before: tuple[tuple[str, int], ...] | None) -> RegionError:
        """Remove what a failed creation made; the error that says what failed. `before`:
        what _sched_files held for the slice before (a failed check or mkdir made nothing)."""
        if e.index <= len(made.gpus):
            if before is None:
                self._sched_files.pop(made.slice_id, None)
            else:
                self._sched_files[made.slice_id] = before
            if e.index < len(made.gpus):
                return SchedError(Path(e.op.path), "find", e.strerror)
            return RegionError(Path(made.final), "create", e.strerror)
        if e.index < made.sched:
            self._sched_files.pop(made.slice_id, None)
            _rmtree(Path(made.final))
            return RegionError(Path(made.final), "create", e.strerror)
        self.remove(made.slice_id)
        return SchedError(Path(e.op.path), "write", e.strerror)

    def _creation(self, s: Slice, final: str, own_fs: bool) -> _Creation:
        """The operations that make slice s's files at final (a directory not there yet),
        on a tmpfs of its own when own_fs, after a check of each GPU's scheduling file (a
        container is refused rather than started on a GPU nobody schedules). Pure: no
        system call, no state changed."""
        d = final
        gpus = tuple(dict.fromkeys(g.gpu_uuid for g in s.grants))
        ops = [fileops.is_file(f"{self._sched_root_str}/{uuid}") for uuid in gpus]
        ops.append(fileops.mkdir(d, _DIR_MODE))
        held: list[str | None] = [None] * len(ops)
        if own_fs:
            size = slice_fs_bytes(len(s.grants), (REGION_SIZE, USAGE_SIZE, REQ_SIZE))
            ops.append(fileops.mount_tmpfs(
                d, slice_fs_options(size, files=6 * len(s.grants) + 2, mode=_DIR_MODE)))
            held.append(None)
        mount = len(ops) - 1 if own_fs else -1
        usage, usage_magic = usage_bytes()
        sched_files = _sched_files_of(s)
        keys = [key for _, key in sched_files]
        for i, g in enumerate(s.grants):
            region = f"{d}/{region_name(i)}"  # str paths: pathlib costs more than the rest
            data, magic = region_bytes(
                uuid=g.gpu_uuid, device_index=g.gpu_index, memory_limit=g.memory,
                compute_share=g.compute, priority=s.priority, policy=s.policy,
                priority_floor=self.priority_floor, context_reserve=self.context_reserve,
                arbiter=True, slice_key=keys[i])
            ops += [fileops.write_at(region, data, REGION_FILE_MODE, last=magic, keep=True),
                    fileops.write_at(region + USAGE_SUFFIX, usage, USAGE_FILE_MODE,
                                     last=usage_magic, keep=True)]
            held += [region, region + USAGE_SUFFIX]
        sched = len(ops)
        for i, g in enumerate(s.grants):
            more = new_slice_file_ops(self._sched_root_str, d, g.gpu_uuid, keys[i],
                                      share=g.compute or 100, priority=int(s.priority),
                                      policy=int(s.policy), floor=self.priority_floor,
                                      bind=own_fs)
            ops += more
            # The .req is held at its name in the scheduling directory (_tenant_files).
            req = f"{self._sched_root_str}/{slice_file_name(g.gpu_uuid, keys[i], 'req')}"
            held += [req if op.keep else None for op in more]
        return _Creation(s.id, d, tuple(ops), tuple(held), gpus, mount, sched, sched_files)

    def _unbounded(self, path: Path, e: OSError) -> None:
        self.bounded = False
        log.warning("slice files are not size-bounded: cannot mount at %s: %s "
                    "(vgpud needs CAP_SYS_ADMIN)", path, e.strerror or str(e))

    def _create_file(self, path: Path, s: Slice, ordinal: int) -> None:
        """The region and usage files of vGPU `ordinal`, made again in place (repair)."""
        g = s.grants[ordinal]
        create_region(path, uuid=g.gpu_uuid, device_index=g.gpu_index, memory_limit=g.memory,
                      compute_share=g.compute, priority=s.priority, policy=s.policy,
                      priority_floor=self.priority_floor,
                      context_reserve=self.context_reserve, arbiter=True,
                      mode=REGION_FILE_MODE, usage_mode=USAGE_FILE_MODE, replace=True,
                      slice_key=slice_key_of(s.id, ordinal))

    # -- files a tenant can open --------------------------------------------------

    def _tenant_files(self, s: Slice) -> list[Path]:
        """The slice's files its container can open: region, usage and .req per vGPU."""
        out = []
        for i, g in enumerate(s.grants):
            region = self.region_path(s.id, i)
            out += [region, usage_path_of(region),
                    req_path(self.sched_root, g.gpu_uuid, slice_key_of(s.id, i))]
        return out

    def _hold(self, s: Slice) -> bool:
        """Hold the slice's tenant files open; False (said, retried) when one is not now."""
        for path in self._tenant_files(s):
            try:
                self.pins.hold(s.id, path)
            except RegionError as e:
                self._defer(s.id, e)
                return False
        return True

    def _defer(self, slice_id: str, e: RegionError) -> None:
        """A slice's file not opened now: said once a spell, tried again by retry_pending."""
        if slice_id not in self._pending:
            log.warning("slice %s: %s", slice_id, e)
            if e.busy and self.on_busy is not None:
                self.on_busy(slice_id, e.path, e.reason)
        self._pending.add(slice_id)

    def retry_pending(self, slices: Iterable[Slice]) -> None:
        """Write and hold again the files of slices a lease kept from vgpud (each pass)."""
        for s in slices:
            if s.id in self._pending:
                try:
                    self.update(s)
                except (RegionError, ValueError) as e:
                    log.warning("slice %s: %s", s.id, e)

    # -- scheduling files ---------------------------------------------------------

    def _write_sched(self, s: Slice) -> None:
        """The slice's .req/.conf on each of its GPUs, whose scheduling file must be there:
        a container is refused rather than started on a GPU nobody schedules."""
        self._sched_files[s.id] = _sched_files_of(s)
        self._ensure_sched(s)
        for i, g in enumerate(s.grants):
            write_slice_files(self.sched_root, g.gpu_uuid, slice_key_of(s.id, i),
                              share=g.compute or 100, priority=int(s.priority),
                              policy=int(s.policy), floor=self.priority_floor,
                              home=self.slice_dir(s.id))

    def _ensure_sched(self, s: Slice) -> None:
        """The scheduling file of each of s's GPUs, made again where it was deleted under
        us (or never made); the files that are there keep their inodes."""
        for g in s.grants:
            if not os.path.isfile(f"{self._sched_root_str}/{g.gpu_uuid}"):
                self._prepare_sched([g.gpu_uuid])

    def _prepare_sched(self, uuids: list[str]) -> None:
        """The GPUs' scheduling files, made again where deleted (one warning event each).

        Running containers keep the files they have mounted (the broker goes on serving
        those); new ones get the files made now."""
        missing = [self.sched_root] if not self.sched_root.is_dir() else [
            self.sched_root / u for u in uuids if not (self.sched_root / u).is_file()]
        prepare_sched_dir(self.sched_root, uuids)
        for path in missing:
            log.warning("%s was missing: made it again", path)
            if self.on_remade is not None:
                self.on_remade("directory" if path == self.sched_root else "file", path)

    def repair_sched(self, slices: Iterable[Slice]) -> None:
        """Remake deleted or damaged scheduling files (GPUs' and slices'); drop strays."""
        slices = list(slices)
        self.repair_gpus_sched()
        for s in slices:
            self.repair_slice_sched(s)
        self.drop_stray_sched(slices)

    def repair_gpus_sched(self) -> None:
        """The GPUs' scheduling files (and their directory), made again where deleted."""
        if self.sched_gpus:
            self._prepare_sched(self.sched_gpus)

    def repair_slice_sched(self, s: Slice) -> None:
        """One slice's .req and .conf, made again where deleted or damaged (one that a
        tenant's lease keeps from vgpud is retried later)."""
        try:
            self._write_sched(s)
        except SchedError as e:
            self._defer(s.id, e)
        except ValueError as e:
            log.warning("%s", e)

    def drop_stray_sched(self, slices: Iterable[Slice]) -> None:
        """Delete the slice files in the scheduling directory that none of `slices` has."""
        wanted = {slice_key_of(s.id, i) for s in slices for i in range(len(s.grants))}
        stray = slice_file_keys(self.sched_root) - wanted
        if stray:
            remove_slice_files(self.sched_root, stray)

    def update(self, s: Slice) -> None:
        """Write the slice's limits into its region files in place (running processes see them)
        and its settings into its .conf files (the broker sees them within 20 ms).

        The files stay the same inodes (containers have them bind-mounted) and keep
        their slice keys; libvgpu reads the limits on every check. A slice directory
        deleted under vgpud is made again (running processes keep the old files)."""
        if not self.exists(s.id):
            self.create(s)
            log.warning("%s was missing: made it again", self.slice_dir(s.id))
            if self.on_remade is not None:
                self.on_remade("slice", self.slice_dir(s.id))
            return
        held = self._hold(s)
        try:
            for i, g in enumerate(s.grants):
                with open_region(self.region_path(s.id, i), proc=self.proc) as r:
                    r.set_limits(memory_limit=g.memory, compute_share=g.compute,
                                 priority=s.priority, policy=s.policy,
                                 priority_floor=self.priority_floor)
            self._write_sched(s)
        except RegionError as e:
            if not e.busy:
                raise
            # The store holds the new limits; they reach the file once the lease ends.
            self._defer(s.id, e)
            return
        if held:
            self._pending.discard(s.id)

    def set_priority_floor(self, floor: int, slices: Iterable[Slice]) -> list[str]:
        """Use floor for every slice from now on, rewriting existing regions in place.

        Returns the ids of slices whose regions could not be updated (logged; the
        next start's reconcile_dirs repairs them)."""
        if not 0 <= floor <= 100:
            raise ValueError(f"priority_floor {floor} is outside 0..100")
        self.priority_floor = floor
        failed = []
        for s in slices:
            for i in range(len(s.grants)):
                try:
                    with open_region(self.region_path(s.id, i), proc=self.proc) as r:
                        if r.priority_floor != floor:
                            r.set_limits(priority_floor=floor)
                except RegionError as e:
                    if e.busy:  # written by retry_pending once the lease ends
                        self._defer(s.id, e)
                    else:
                        log.warning("%s", e)
                    failed.append(s.id)
                    break
            else:
                try:
                    self._write_sched(s)
                except SchedError as e:
                    log.warning("%s", e)
                    failed.append(s.id)
        return failed

    def remove(self, slice_id: str) -> bool:
        """Delete a slice's directory and scheduling files; False when there was no directory."""
        return self.finish(self.retire(slice_id))

    def retire(self, slice_id: str) -> Retired:
        """The first half of remove, quick, for under the arbiter's lock, with no system
        call: the slice's files are let go and exists() is False from now on. finish()
        does the rest: the .conf deleted (the broker stops serving it), the files closed,
        the unmounts (the kernel's mount locks and an RCU grace period each, which nothing
        else should wait behind)."""
        fds = self.pins.take(slice_id)
        self._pending.discard(slice_id)
        known = self._sched_files.pop(slice_id, None)
        ops = [fileops.unlink(f"{self._sched_root_str}/{slice_file_name(uuid, key, 'conf')}")
               for uuid, key in known or () if usable_name(uuid)]
        if known is None:  # made before this vgpud started and not yet rewritten: any GPU, any vGPU
            remove_slice_files(self.sched_root,
                               (slice_key_of(slice_id, i) for i in range(_MAX_VGPUS)))
        self._retiring.add(slice_id)
        return Retired(slice_id, known or (), (*ops, *(fileops.close(fd) for fd in fds)))

    def finish(self, r: Retired) -> bool:
        """The second half of remove (any thread, no lock needed: it touches only that
        slice's paths), in one call: what retire() left (its .conf deleted, its files
        closed), its .req unmounted and deleted, its directory unmounted and removed;
        False when there was no directory."""
        try:
            final = self.slice_path(r.slice_id)
            # Without CAP_SYS_ADMIN (not bounded) nothing was mounted, and umount2 is refused.
            unmount = self.bounded
            ops = []
            for uuid, key in r.sched_files:
                if usable_name(uuid):
                    req = f"{self._sched_root_str}/{slice_file_name(uuid, key, 'req')}"
                    if unmount:
                        ops.append(fileops.detach(req))
                    ops.append(fileops.unlink(req))
            # Its tmpfs lives on in the containers that mount its files; what stays is the
            # empty directory it was mounted on, removed in one step.
            if unmount:
                ops.append(fileops.detach(final))
            ops.append(fileops.rmdir(final))
            ops = [*r.first, *ops]
            errors = self._run_removal(r.slice_id, ops, last_is_mine=True)
            if not errors or errors[-1].index != len(ops) - 1:
                return True
            e = errors[-1]
            if e.errno == errno.ENOENT:
                return False
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise RegionError(Path(final), "remove", e.strerror)
            return self._remove_files_dir(Path(final))
        finally:
            self._retiring.discard(r.slice_id)

    def _run_removal(self, slice_id: str, ops: list[fileops.Op],
                     last_is_mine: bool = False) -> list[fileops.FileOpError]:
        """Run a removal's ops, each on its own: failures are said (the last one left to
        the caller when last_is_mine) and returned."""
        errors = fileops.run_all(ops)
        for e in errors:
            if not (last_is_mine and e.index == len(ops) - 1):
                log.warning("slice %s: failed to remove %s: %s", slice_id, e.op.path or
                            f"(close fd {e.op.fd})", e.strerror)
        return errors

    def _remove_files_dir(self, final: Path) -> bool:
        """A slice directory with its files on run_dir's own filesystem (no tmpfs of its
        own): renamed away first, so that the slice is gone at once, then deleted."""
        doomed = self.root / f".{final.name}.del"
        _rmtree(doomed)
        try:
            os.rename(final, doomed)
        except FileNotFoundError:
            return False
        except OSError as e:
            raise RegionError(final, "remove", e.strerror or str(e)) from e
        _rmtree(doomed)
        return True

    def exists(self, slice_id: str) -> bool:
        """True when the slice's directory is there (and the slice is not being removed)."""
        return slice_id not in self._retiring and self.slice_dir(slice_id).is_dir()

    # -- usage -----------------------------------------------------------------

    def usage(self, s: Slice) -> list[int]:
        """Bytes libvgpu charged to each vGPU of the slice (live processes); 0 when unreadable."""
        out = []
        for i in range(len(s.grants)):
            try:
                with open_region(self.region_path(s.id, i), writable=False, proc=self.proc) as r:
                    out.append(r.used_bytes())
                self._bad_seen.discard((s.id, i))  # whole again: the next spell is news
            except RegionError as e:
                self._unreadable(s.id, i, e)
                out.append(0)
        return out

    def _unreadable(self, slice_id: str, ordinal: int, e: RegionError) -> None:
        """A slice file that did not read: leased (not opened now) or damaged."""
        if e.busy:
            self._defer(slice_id, e)
        else:
            self._bad_usage(slice_id, ordinal, e)

    def _bad_usage(self, slice_id: str, ordinal: int, e: RegionError) -> None:
        """A usage file its tenant damaged (or that is gone): said once per bad spell (its
        tenant may change it a thousand times a second), never fatal."""
        key = (slice_id, ordinal)
        if key in self._bad_seen:
            return
        if len(self._bad_seen) > 10_000:
            self._bad_seen.clear()
        self._bad_seen.add(key)
        log.warning("slice %s vGPU %d: %s", slice_id, ordinal, e)
        if self.on_bad_usage is not None:
            self.on_bad_usage(slice_id, ordinal, e.reason)

    def slice_keys(self, s: Slice) -> list[int]:
        """Each vGPU's slice key (its name in the GPU's scheduling region); 0 when unreadable."""
        out = []
        for i in range(len(s.grants)):
            try:
                with open_region(self.region_path(s.id, i), writable=False, proc=self.proc) as r:
                    out.append(r.slice_key)
            except RegionError:
                out.append(0)
        return out

    def pids(self, s: Slice) -> dict[int, set[int]]:
        """Live processes registered in each vGPU's usage file, by vGPU ordinal.

        The tenant's word (it writes the file): for reporting, never for acting on."""
        out: dict[int, set[int]] = {}
        for i in range(len(s.grants)):
            try:
                with open_region(self.region_path(s.id, i), writable=False, proc=self.proc) as r:
                    out[i] = {p.pid for p in r.processes()}
            except RegionError as e:
                self._unreadable(s.id, i, e)
                out[i] = set()
        return out

    # -- crash repair ----------------------------------------------------------

    def reconcile_dirs(self, slices: Iterable[Slice]) -> ReconcileReport:
        """Make the directories match the stored slices.

        Leftover temporary directories go; a directory without a stored slice
        goes; a stored slice without a (whole) directory gets one; a region
        whose limits differ from the store (a crash between an update's
        commit and its rewrite) or from the config (priority_floor) is
        rewritten in place (its slice key stays).
        """
        self.prepare()
        wanted = {s.id: s for s in slices}
        created: list[str] = []
        fixed: list[str] = []
        removed: list[str] = []
        for entry in sorted(self.root.iterdir()):
            name = entry.name
            if name.startswith("."):
                _rmtree(entry)
            elif name in self._retiring:
                continue  # being removed by its release, outside the lock
            elif name not in wanted:
                if entry.is_dir() and not entry.is_symlink():
                    self.remove(name)
                else:
                    entry.unlink()
                removed.append(name)
        for sid, s in wanted.items():
            if not self.exists(sid):
                self.create(s)
                created.append(sid)
            elif not self._check(s):
                fixed.append(sid)
        self.repair_sched(wanted.values())
        for s in wanted.values():
            self._hold(s)
        return ReconcileReport(tuple(created), tuple(fixed), tuple(removed))

    def _check(self, s: Slice) -> bool:
        """True when every region file of s is whole and holds its limits; repairs otherwise."""
        ok = True
        d = self.slice_dir(s.id)
        names = {region_name(i) for i in range(len(s.grants))}
        names |= {n + USAGE_SUFFIX for n in names}
        names |= {req_path(d, g.gpu_uuid, slice_key_of(s.id, i)).name
                  for i, g in enumerate(s.grants)}
        for extra in d.iterdir():
            if extra.name not in names:
                _rmtree(extra)
                ok = False
        for i, g in enumerate(s.grants):
            path = d / region_name(i)
            if create_usage(usage_path_of(path), mode=USAGE_FILE_MODE):
                ok = False  # deleted: a container that had it mounted keeps the old one
            try:
                with open_region(path, proc=self.proc) as r:
                    if (r.memory_limit, r.compute_share, r.priority, r.policy,
                            r.priority_floor, r.device_index, r.uuid) == (
                            g.memory, g.compute, int(s.priority), int(s.policy),
                            self.priority_floor, g.gpu_index, g.gpu_uuid):
                        continue
                    if (r.device_index, r.uuid) == (g.gpu_index, g.gpu_uuid):
                        r.set_limits(memory_limit=g.memory, compute_share=g.compute,
                                     priority=s.priority, policy=s.policy,
                                     priority_floor=self.priority_floor)
                        ok = False
                        continue
            except RegionError as e:
                if e.busy:  # leased, so mounted and in use: kept, and written when it ends
                    self._defer(s.id, e)
                    continue
                log.warning("%s; making it again", e)
            ok = False
            self._create_file(path, s, i)
        return ok


def _sched_files_of(s: Slice) -> tuple[tuple[str, int], ...]:
    """(GPU uuid, slice key) of each vGPU of s: the names of its .req and .conf."""
    return tuple((g.gpu_uuid, slice_key_of(s.id, i)) for i, g in enumerate(s.grants))


def _check_id(slice_id: str) -> None:
    if not slice_id or "/" in slice_id or slice_id.startswith(".") or "\0" in slice_id:
        raise ValueError(f"invalid slice id {slice_id!r}")


def _rmtree(path: Path) -> None:
    with contextlib.suppress(OSError):
        detach(path)  # a slice's tmpfs (arbiter.files.slicefs) left mounted by a crash
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
