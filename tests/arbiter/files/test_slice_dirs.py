# SPDX-License-Identifier: Apache-2.0
"""arbiter.files.slice_dirs: slice directories of region files, made and removed atomically."""
from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

import pytest

from arbiter.errors import RegionError, SchedError
from arbiter.files.region_file import open_region
from arbiter.files.sched_files import slice_key_of
from arbiter.files.slice_dirs import Regions
from arbiter.files.slicefs import detach
from arbiter.model import Grant, Policy, Priority, Slice

MiB = 1 << 20


def make_slice(sid: str = "abc123def456", n: int = 2, memory: int = 64 * MiB) -> Slice:
    return Slice(id=sid, owner=f"owner-{sid}",
                 grants=tuple(Grant(i, f"GPU-{i}", memory, 20 + i) for i in range(n)),
                 priority=Priority.HIGH, policy=Policy.BURST)


@pytest.fixture
def regions(tmp_path) -> Regions:
    r = Regions(tmp_path / "run", context_reserve=8 * MiB)
    r.prepare()
    return r


def test_prepare_makes_dirs_only_root_can_list(regions):
    for d in (regions.run_dir, regions.root):
        assert stat.S_IMODE(d.stat().st_mode) == 0o711


def test_create_writes_one_region_per_grant(regions):
    s = make_slice()
    d = regions.create(s)
    assert d == regions.root / s.id
    assert sorted(p.name for p in d.iterdir() if not p.name.endswith(".req")) == [
        "vgpu0", "vgpu0.usage", "vgpu1", "vgpu1.usage"]
    # Each vGPU's .req is in the slice's directory and at its name beside the GPU file.
    for i, g in enumerate(s.grants):
        own = d / f"{g.gpu_uuid}.{slice_key_of(s.id, i):016x}.req"
        at = regions.sched_root / own.name
        assert (own.stat().st_dev, own.stat().st_ino) == (at.stat().st_dev, at.stat().st_ino)
    assert [p.name for p in regions.root.iterdir()] == [s.id]  # no temporary left
    assert stat.S_IMODE(d.stat().st_mode) == 0o700  # no other host user reaches the files
    for i, g in enumerate(s.grants):
        path = d / f"vgpu{i}"
        assert stat.S_IMODE(path.stat().st_mode) == 0o644  # limits: vgpud's alone
        # usage: any container uid accounts there (through its bind mount)
        assert stat.S_IMODE((d / f"vgpu{i}.usage").stat().st_mode) == 0o666
        with open_region(path) as r:
            assert r.arbiter
            assert (r.uuid, r.device_index, r.memory_limit, r.compute_share) == (
                g.gpu_uuid, g.gpu_index, g.memory, g.compute)
            assert (r.priority, r.policy, r.context_reserve) == (Priority.HIGH, Policy.BURST,
                                                                 8 * MiB)


def test_update_changes_limits_in_place_and_bumps_generation(regions):
    s = make_slice(n=1)
    regions.create(s)
    path = regions.region_path(s.id, 0)
    with open_region(path) as r:
        gen = r.generation
        inode = path.stat().st_ino
        regions.update(Slice(s.id, s.owner, (Grant(0, "GPU-0", 32 * MiB, 50),),
                             priority=Priority.LOW, policy=Policy.FIXED))
        assert (r.memory_limit, r.compute_share, r.priority, r.policy) == (
            32 * MiB, 50, Priority.LOW, Policy.FIXED)  # seen through the same mapping
        assert r.generation > gen
    assert path.stat().st_ino == inode


def test_update_of_a_missing_region_fails_clearly_and_a_missing_dir_is_made_again(regions):
    s = make_slice()
    regions.create(s)
    regions.region_path(s.id, 0).unlink()
    with pytest.raises(RegionError, match=r"failed to open region file .*vgpu0"):
        regions.update(s)
    remade = []
    regions.on_remade = lambda what, path: remade.append((what, path))
    regions.remove(s.id)  # the whole directory deleted under vgpud
    regions.update(s)
    assert regions.exists(s.id) and remade == [("slice", regions.slice_dir(s.id))]


def test_remove_is_idempotent(regions):
    s = make_slice()
    regions.create(s)
    assert regions.remove(s.id)
    assert not regions.remove(s.id)
    assert list(regions.root.iterdir()) == []


def test_usage_and_pids_of_an_unused_slice(regions):
    s = make_slice()
    regions.create(s)
    assert regions.usage(s) == [0, 0]
    assert regions.pids(s) == {0: set(), 1: set()}
    regions.remove(s.id)
    assert regions.usage(s) == [0, 0]  # unreadable counts as nothing


@pytest.mark.parametrize("bad", ["", "../x", ".hidden", "a/b"])
def test_slice_ids_cannot_escape(regions, bad):
    with pytest.raises(ValueError, match="invalid slice id"):
        regions.slice_dir(bad)


def test_reconcile_dirs_makes_the_tree_match_the_store(regions):
    kept, lost, stale, truncated = (make_slice(f"{c * 12}") for c in "abcd")
    for s in (kept, stale, truncated):
        regions.create(s)
    orphan = make_slice("eeeeeeeeeeee")
    regions.create(orphan)
    (regions.root / ".ffffffffffff.tmp").mkdir()          # a crash mid-create
    (regions.root / "stray-file").write_text("x")
    with open_region(regions.region_path(stale.id, 1)) as r:
        r.set_limits(memory_limit=MiB)                    # a crash mid-update
    regions.region_path(truncated.id, 0).write_bytes(b"\0" * 10)
    (regions.slice_dir(kept.id) / "vgpu9").write_text("x")  # not a vGPU of the slice

    report = regions.reconcile_dirs([kept, lost, stale, truncated])
    assert report.created == (lost.id,)
    assert set(report.fixed) == {stale.id, truncated.id, kept.id}
    assert set(report.removed) == {orphan.id, "stray-file"}
    assert sorted(p.name for p in regions.root.iterdir()) == sorted(
        s.id for s in (kept, lost, stale, truncated))
    for s in (kept, lost, stale, truncated):
        assert sorted(p.name for p in regions.slice_dir(s.id).iterdir()
                      if not p.name.endswith(".req")) == [
            "vgpu0", "vgpu0.usage", "vgpu1", "vgpu1.usage"]
        for i, g in enumerate(s.grants):
            with open_region(regions.region_path(s.id, i)) as r:
                assert (r.memory_limit, r.compute_share) == (g.memory, g.compute)
    # A second pass has nothing to do.
    again = regions.reconcile_dirs([kept, lost, stale, truncated])
    assert (again.created, again.fixed, again.removed) == ((), (), ())


# ---- slice keys and the priority floor ---------------------------------------------

def test_every_region_gets_its_own_key_and_updates_keep_it(regions):
    s = make_slice(n=2)
    regions.create(s)
    keys = regions.slice_keys(s)
    assert all(keys) and len(set(keys)) == 2
    inodes = [regions.region_path(s.id, i).stat().st_ino for i in range(2)]
    regions.update(Slice(s.id, s.owner, tuple(Grant(i, f"GPU-{i}", 32 * MiB, 60)
                                             for i in range(2))))
    assert regions.slice_keys(s) == keys
    assert [regions.region_path(s.id, i).stat().st_ino for i in range(2)] == inodes
    regions.remove(s.id)
    assert regions.slice_keys(s) == [0, 0]  # unreadable: no key


def test_priority_floor_is_written_at_create_and_changed_in_place(regions):
    a, b = make_slice("a" * 12, n=1), make_slice("b" * 12, n=2)
    regions.create(a)
    regions.priority_floor = 15
    regions.create(b)

    def floors(s: Slice) -> list[int]:
        out = []
        for i in range(len(s.grants)):
            with open_region(regions.region_path(s.id, i), writable=False) as r:
                out.append(r.priority_floor)
        return out

    assert (floors(a), floors(b)) == ([0], [15, 15])
    path = regions.region_path(b.id, 1)
    inode, key = path.stat().st_ino, regions.slice_keys(b)
    with open_region(path, writable=False) as live:  # a running process's view
        gen = live.generation
        assert regions.set_priority_floor(25, [a, b, make_slice("c" * 12)]) == ["c" * 12]
        assert live.priority_floor == 25 and live.generation > gen
    assert (floors(a), floors(b)) == ([25], [25, 25])
    assert (path.stat().st_ino, regions.slice_keys(b)) == (inode, key)
    regions.update(b)  # an Update keeps writing the configured floor
    assert floors(b) == [25, 25]
    with pytest.raises(ValueError, match="priority_floor 101"):
        regions.set_priority_floor(101, [a])
    assert regions.priority_floor == 25


def test_reconcile_fixes_the_floor_in_place_and_keeps_keys(regions):
    s = make_slice(n=2)
    regions.create(s)
    keys = regions.slice_keys(s)
    assert all(keys)
    inodes = [regions.region_path(s.id, i).stat().st_ino for i in range(2)]
    regions.priority_floor = 10  # the config changed while vgpud was down
    assert regions.reconcile_dirs([s]).fixed == (s.id,)
    assert regions.slice_keys(s) == keys
    assert [regions.region_path(s.id, i).stat().st_ino for i in range(2)] == inodes
    for i in range(2):
        with open_region(regions.region_path(s.id, i)) as r:
            assert r.priority_floor == 10
    assert regions.reconcile_dirs([s]).fixed == ()


def test_a_gpus_deleted_scheduling_file_is_made_again_by_the_next_create(regions):
    """Create checks each GPU's scheduling file in its one call (no stat of its own): one
    deleted under vgpud is made again (said once), the slice made whole, and a GPU whose
    file is there keeps its inode."""
    remade = []
    regions.on_remade = lambda what, path: remade.append((what, path))
    first = make_slice("a" * 12, n=2)
    regions.create(first)  # (the fixture's run dir has no scheduling directory yet)
    remade.clear()
    gpu0, gpu1 = (regions.sched_root / g.gpu_uuid for g in first.grants)
    kept = gpu1.stat().st_ino
    gpu0.unlink()
    s = make_slice("b" * 12, n=2)
    regions.create(s)
    assert gpu0.is_file() and gpu1.stat().st_ino == kept
    assert remade == [("file", gpu0)]
    assert regions.exists(s.id) and regions.reconcile_dirs([first, s]).fixed == ()
    gpu0.unlink()
    gpu0.mkdir()  # not a file, and not ours to remove: the slice is refused, nothing made
    with pytest.raises(SchedError, match="Is a directory"):
        regions.create(make_slice("c" * 12, n=1))
    assert not regions.exists("c" * 12) and not regions.slice_dir("c" * 12).exists()


def test_a_deleted_slices_dir_is_made_again_on_demand(regions):
    remade = []
    regions.on_remade = lambda what, path: remade.append((what, path))
    a = make_slice("a" * 12, n=1)
    regions.create(a)
    import shutil
    for d in regions.root.iterdir():  # a slice's own tmpfs: `rm -rf` empties, unmount removes
        detach(d)
    shutil.rmtree(regions.root)
    b = make_slice("b" * 12, n=1)
    regions.create(b)  # not "No such file or directory" until vgpud restarts
    assert regions.exists(b.id)
    assert ("directory", regions.root) in remade
    assert stat.S_IMODE(regions.root.stat().st_mode) == 0o711
    assert regions.reconcile_dirs([a, b]).created == (a.id,)


def test_a_deleted_usage_file_is_made_again_and_the_limits_keep_their_inode(regions):
    s = make_slice(n=1)
    regions.create(s)
    region = regions.region_path(s.id, 0)
    inode = region.stat().st_ino
    usage = region.with_name("vgpu0.usage")
    usage.unlink()
    assert regions.usage(s) == [0]
    assert regions.reconcile_dirs([s]).fixed == (s.id,)
    assert usage.is_file() and region.stat().st_ino == inode
    assert regions.usage(s) == [0]


def test_a_damaged_usage_file_is_reported_once_per_bad_spell(regions):
    s = make_slice(n=2)
    regions.create(s)
    seen = []
    regions.on_bad_usage = lambda sid, i, why: seen.append((sid, i, why))
    usage = regions.region_path(s.id, 1).with_name("vgpu1.usage")
    whole = usage.read_bytes()
    for n in range(5):  # its tenant rewrites it as fast as it likes: one report
        usage.write_bytes(bytes([n]) * 10)
        assert regions.usage(s) == [0, 0]
        assert regions.pids(s) == {0: set(), 1: set()}
    assert seen == [(s.id, 1, "truncated: 10 bytes, expected 65600")]
    usage.write_bytes(whole)
    assert regions.usage(s) == [0, 0]
    usage.write_bytes(b"\1" * 100)
    assert regions.usage(s) == [0, 0]
    # a new spell
    assert seen[1:] == [(s.id, 1, "bad magic 0x01010101, expected 0x53554756 "
                                  "(not a vgpu usage file, or one still being made)")]


def sched_files(regions: Regions, s: Slice) -> set[str]:
    """The names of s's .req and .conf files in the scheduling directory."""
    keys = {f"{slice_key_of(s.id, i):016x}" for i in range(len(s.grants))}
    return {p.name for p in regions.sched_root.iterdir()
            if p.name.count(".") >= 2 and p.name.rsplit(".", 2)[1] in keys}


def held_fds(path: Path) -> set[int]:
    """This process's open fds on files below path."""
    fds = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}").startswith(f"{path}/"):
                fds.add(int(fd))
    return fds


def test_retire_lets_go_at_once_and_finish_removes_the_rest(regions):
    """retire() (the part under the arbiter's lock) only makes the slice gone for exists()
    and reconcile, with no system call; finish() (after the lock) deletes the .conf, closes
    the files vgpud held, unmounts and deletes its .req and its directory, all in one call;
    another slice's files stay."""
    s, other = make_slice("aaaaaaaaaaaa"), make_slice("bbbbbbbbbbbb")
    regions.create(s)
    regions.create(other)
    theirs = sched_files(regions, other)
    assert {n.rsplit(".", 1)[1] for n in sched_files(regions, s)} == {"req", "conf"}
    held = held_fds(regions.slice_dir(s.id))
    assert len(held) == 3 * len(s.grants)  # per vGPU: region, usage, .req
    r = regions.retire(s.id)
    assert {n.rsplit(".", 1)[1] for n in sched_files(regions, s)} == {"req", "conf"}
    assert held_fds(regions.slice_dir(s.id)) == held
    assert not regions.exists(s.id) and regions.slice_dir(s.id).is_dir()
    assert regions.reconcile_dirs([other]).removed == ()  # its release is removing it
    assert regions.finish(r)
    assert not regions.slice_dir(s.id).exists() and sched_files(regions, s) == set()
    for fd in held:  # closed (nothing opened a file since, to take the number again)
        with pytest.raises(OSError):
            os.fstat(fd)
    assert sched_files(regions, other) == theirs and regions.exists(other.id)
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(regions.slice_dir(s.id)) not in mounts


def test_a_slice_made_before_a_restart_is_removed_whole(regions):
    """A vgpud started later knows no slice's files by name until it rewrites them: remove
    finds them in the scheduling directory."""
    s = make_slice()
    regions.create(s)
    again = Regions(regions.run_dir)
    assert again.remove(s.id)
    assert sched_files(regions, s) == set() and not regions.slice_dir(s.id).exists()


def test_a_new_slices_req_replaces_whatever_had_its_name(regions):
    """A new slice's .req is linked or mounted at its name straight away; something left at
    that name (a crash's leftover) is cleared first, never kept."""
    s = make_slice("cccccccccccc", n=1)
    regions.prepare()
    at = regions.sched_root / f"GPU-0.{slice_key_of(s.id, 0):016x}.req"
    at.parent.mkdir(exist_ok=True)
    at.write_bytes(b"stale")
    regions.create(s)
    own = regions.slice_dir(s.id) / at.name
    assert (own.stat().st_dev, own.stat().st_ino) == (at.stat().st_dev, at.stat().st_ino)
    assert at.stat().st_size != len(b"stale")


def test_a_new_slices_files_are_held_open_as_they_are_made(regions):
    """Region, usage and .req of a new slice are held open (no tenant can lease them) from
    the fd that wrote them: nothing is opened a second time."""
    s = make_slice("dddddddddddd", n=2)
    regions.create(s)
    files = regions._tenant_files(s)
    assert regions.pins.held(s.id) == set(files) and len(files) == 6
    open_inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            st = os.stat(f"/proc/self/fd/{fd}")
            open_inodes.add((st.st_dev, st.st_ino))
    assert {(f.stat().st_dev, f.stat().st_ino) for f in files} <= open_inodes
    regions.remove(s.id)
    assert regions.pins.held(s.id) == set()


def _slice_mounts(regions: Regions) -> list[str]:
    return [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if line.split()[4].startswith(str(regions.run_dir))]


def test_a_new_slice_whose_region_fails_leaves_nothing(regions, monkeypatch):
    """A slice's own tmpfs too small for its region file (ENOSPC on the first file): the
    error names the slice's directory, and no directory, mount, scheduling file or open
    file of it stays."""
    from arbiter.files import slice_dirs
    monkeypatch.setattr(slice_dirs, "slice_fs_bytes", lambda vgpus, sizes: 4096)
    s = make_slice("eeeeeeeeeeee", n=2)
    before = _slice_mounts(regions)
    fds = set(os.listdir("/proc/self/fd"))
    with pytest.raises(RegionError, match="No space left on device") as e:
        regions.create(s)
    assert e.value.path == regions.slice_dir(s.id)
    assert not regions.slice_dir(s.id).exists() and not regions.exists(s.id)
    assert _slice_mounts(regions) == before and sched_files(regions, s) == set()
    assert set(os.listdir("/proc/self/fd")) == fds and regions.pins.held(s.id) == set()


def test_a_new_slice_whose_scheduling_file_fails_leaves_nothing(regions):
    """A directory where its second vGPU's .conf goes (rename cannot replace it): a
    SchedError naming that .conf, and every file, mount and held fd of the slice gone,
    the first vGPU's .req and .conf included."""
    s = make_slice("ffffffffffff", n=2)
    regions.prepare()
    regions.sched_root.mkdir(exist_ok=True)
    blocker = regions.sched_root / f"GPU-1.{slice_key_of(s.id, 1):016x}.conf"
    blocker.mkdir()
    before = _slice_mounts(regions)
    fds = set(os.listdir("/proc/self/fd"))
    with pytest.raises(SchedError, match="Is a directory") as e:
        regions.create(s)
    assert e.value.path == blocker
    assert not regions.slice_dir(s.id).exists()
    assert _slice_mounts(regions) == before and sched_files(regions, s) == {blocker.name}
    assert set(os.listdir("/proc/self/fd")) == fds and regions.pins.held(s.id) == set()


_UNBOUNDED = """
import logging, os, stat, sys
from pathlib import Path
from arbiter.files.slice_dirs import Regions
from arbiter.model import Grant, Slice
logging.basicConfig(level=logging.WARNING, format="%(message)s")
r = Regions(Path(sys.argv[1]))
r.root.mkdir(mode=0o711, parents=True)  # not prepare(): its share() would find out first
a, b = (Slice(id=i * 12, owner=i, grants=(Grant(0, "GPU-0", 1 << 26, 10),)) for i in "ab")
for s in (a, b):
    d = r.create(s)
    req = next(d.glob("*.req"))
    at = r.sched_root / req.name
    print(s.id, oct(stat.S_IMODE(d.stat().st_mode)), sorted(p.name for p in d.iterdir()),
          at.stat().st_ino == req.stat().st_ino, len(r.pins.held(s.id)))
print(r.bounded, r.remove(a.id), a.id in os.listdir(r.root), sorted(os.listdir(r.sched_root)))
"""


def test_without_cap_sys_admin_slice_files_are_made_unbounded(tmp_path):
    """vgpud without CAP_SYS_ADMIN (setpriv drops it): the first slice's mount is refused,
    said once, and every slice gets its files in a plain directory of mode 0700, its .req
    hard-linked into the scheduling directory; removal takes them all, with no unmount
    tried (refused too) and nothing said."""
    import shutil
    import subprocess
    import sys

    from support.paths import ROOT
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv(1)")
    p = subprocess.run(["setpriv", "--bounding-set", "-sys_admin", sys.executable, "-c",
                        _UNBOUNDED, str(tmp_path / "run")], capture_output=True, text=True,
                       timeout=60, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stderr
    files = ["GPU-0.{}.req", "vgpu0", "vgpu0.usage"]
    ka, kb = (f"{slice_key_of(i * 12, 0):016x}" for i in "ab")
    assert p.stdout.splitlines() == [
        f"{'a' * 12} 0o700 {sorted(f.format(ka) for f in files)} True 3",
        f"{'b' * 12} 0o700 {sorted(f.format(kb) for f in files)} True 3",
        f"False True False {['GPU-0', f'GPU-0.{kb}.conf', f'GPU-0.{kb}.req']}"]
    assert p.stderr.count("slice files are not size-bounded") == 1
    assert "failed" not in p.stderr


def test_a_slice_whose_directory_exists_is_refused_and_the_directory_kept(regions):
    """Made twice (a second vGPU daemon by mistake, a bug): the second create fails on its
    mkdir and removes nothing of the first."""
    s = make_slice("gggggggggggg", n=1)
    regions.create(s)
    files = sorted(p.name for p in regions.slice_dir(s.id).iterdir())
    with pytest.raises(RegionError, match="File exists"):
        regions.create(s)
    assert sorted(p.name for p in regions.slice_dir(s.id).iterdir()) == files
    assert len(sched_files(regions, s)) == 2
    assert regions._sched_files[s.id]  # its files still known by name: removed with no listing
    assert regions.remove(s.id) and sched_files(regions, s) == set()
