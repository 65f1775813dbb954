# SPDX-License-Identifier: Apache-2.0
"""libvgpu-fileops.so through arbiter.files.fileops: the mirror matches the header, and each
operation does what it says on the real filesystem (mounts included: these run as root),
stops a list at the first failure with that op's index and errno, and leaves nothing of
the failed op behind."""
from __future__ import annotations

import errno
import fcntl
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.c_layout import assert_fields, assert_size_and_alignment, read_layout

from arbiter.errors import LibraryMismatchError
from arbiter.files import fileops as fo
from arbiter.files.atomic import _TRIES, temp_prefix

MAGIC = 0x55504756


@pytest.fixture(scope="module")
def c_layout() -> dict[str, Any]:
    return read_layout(["fileops.h"], ["vg_fileop"])


def test_the_mirror_is_the_headers_struct(c_layout: dict[str, Any]) -> None:
    assert_size_and_alignment(c_layout, "vg_fileop", fo._COp)
    assert_fields(c_layout, "vg_fileop", fo._COp)


def test_every_constant_has_its_twin(c_layout: dict[str, Any]) -> None:
    twins = {"VG_FILEOP_KEEP": fo._KEEP, "VG_FILEOPS_VERSION": fo._VERSION,
             "VG_TEMP_TRIES": _TRIES}
    for name in ("MKDIR", "MOUNT_TMPFS", "WRITE_AT", "WRITE_BESIDE", "MKNOD_BIND", "LINK",
                 "DETACH", "UNLINK", "RMDIR", "CLOSE", "IS_FILE"):
        twins[f"VG_OP_{name}"] = getattr(fo, name)
    assert c_layout["constants"] == twins


def _open_fds() -> set[int]:
    return {int(n) for n in os.listdir("/proc/self/fd")}


def _mounted(path: Path) -> bool:
    return str(path) in {line.split()[4] for line in
                         Path("/proc/self/mountinfo").read_text().splitlines()}


def test_a_directory_gets_its_mode_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        fo.run([fo.mkdir(str(tmp_path / "d"), 0o711)])
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o711


def test_a_file_is_written_whole_magic_last_and_kept_open(tmp_path: Path) -> None:
    path = tmp_path / "region"
    data = bytes(range(256)) * 64
    kept = fo.run([fo.write_at(str(path), data, 0o644, last=(8, MAGIC), keep=True),
                   fo.write_at(str(tmp_path / "other"), b"x", 0o600)])
    k = kept[0]
    assert k is not None and kept[1] is None
    try:
        assert k.ino == path.stat().st_ino
        assert os.fstat(k.fd).st_ino == k.ino
        assert fcntl.fcntl(k.fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDWR
        assert os.get_inheritable(k.fd) is False
    finally:
        os.close(k.fd)
    body = path.read_bytes()
    assert body[:8] == data[:8] and body[8:12] == MAGIC.to_bytes(4, "little")
    assert body[12:] == data[12:]
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert (tmp_path / "other").read_bytes() == b"x"


def test_a_list_stops_at_the_first_failure_and_closes_what_it_kept(tmp_path: Path) -> None:
    (tmp_path / "taken").write_bytes(b"theirs")
    before = _open_fds()
    ops = [fo.write_at(str(tmp_path / "a"), b"a", 0o600, keep=True),
           fo.write_at(str(tmp_path / "taken"), b"mine", 0o600),
           fo.write_at(str(tmp_path / "c"), b"c", 0o600)]
    with pytest.raises(fo.FileOpError) as e:
        fo.run(ops)
    assert (e.value.index, e.value.errno) == (1, errno.EEXIST)
    assert e.value.filename == str(tmp_path / "taken")
    assert (tmp_path / "taken").read_bytes() == b"theirs"  # O_EXCL: never written
    assert (tmp_path / "a").exists() and not (tmp_path / "c").exists()
    assert _open_fds() == before


def test_a_write_that_fails_leaves_no_file(tmp_path: Path) -> None:
    small = tmp_path / "small"
    small.mkdir()
    fo.run([fo.mount_tmpfs(str(small), "size=4k,mode=700")])
    try:
        with pytest.raises(fo.FileOpError) as e:
            fo.run([fo.write_at(str(small / "big"), b"x" * 65536, 0o600)])
        assert e.value.errno == errno.ENOSPC
        assert os.listdir(small) == []
        with pytest.raises(fo.FileOpError) as e:
            fo.run([fo.write_beside(str(small / "big"), temp_prefix(small / "big"),
                                    b"x" * 65536, 0o600)])
        assert e.value.errno == errno.ENOSPC
        assert os.listdir(small) == []
    finally:
        fo.run([fo.detach(str(small))])
    assert not _mounted(small)


def test_write_beside_replaces_whole_and_skips_a_stale_temporary_name(tmp_path: Path) -> None:
    conf = tmp_path / "x.conf"
    conf.write_text("old\n")
    prefix = temp_prefix(conf)
    stale = Path(f"{prefix}0.tmp")
    stale.write_text("a crashed writer's")
    inode = conf.stat().st_ino
    fo.run([fo.write_beside(str(conf), prefix, b"new\n", 0o644)])
    assert conf.read_text() == "new\n" and conf.stat().st_ino != inode
    assert stat.S_IMODE(conf.stat().st_mode) == 0o644
    assert stale.read_text() == "a crashed writer's"  # O_EXCL: left as it was
    assert sorted(p.name for p in tmp_path.iterdir()) == [stale.name, "x.conf"]


def test_a_tmpfs_and_a_bound_file_are_made_and_removed(tmp_path: Path) -> None:
    home, sched = tmp_path / "slice", tmp_path / "sched"
    sched.mkdir()
    req, at = home / "k.req", sched / "k.req"
    kept = fo.run([fo.mkdir(str(home), 0o700),
                   fo.mount_tmpfs(str(home), "size=64k,nr_inodes=8,mode=700"),
                   fo.write_at(str(req), b"r" * 64, 0o666, keep=True),
                   fo.mknod_bind(str(at), str(req), 0o666)])
    os.close(kept[2].fd)
    assert _mounted(home) and _mounted(at)
    assert at.stat().st_ino == req.stat().st_ino and at.read_bytes() == b"r" * 64
    fo.run([fo.detach(str(at)), fo.unlink(str(at)), fo.detach(str(home)), fo.rmdir(str(home))])
    assert not home.exists() and not at.exists()
    assert not _mounted(home) and not _mounted(at)


def test_a_bind_or_a_link_replaces_a_stale_file_of_its_name(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.write_bytes(b"new")
    for make in (fo.link, lambda at, src: fo.mknod_bind(at, src, 0o644)):
        at = tmp_path / "at"
        at.write_bytes(b"stale")
        fo.run([make(str(at), str(source))])
        assert at.read_bytes() == b"new" and at.stat().st_ino == source.stat().st_ino
        fo.run([fo.detach(str(at)), fo.unlink(str(at))])
        assert not at.exists()


def test_removing_what_is_not_there_is_no_failure(tmp_path: Path) -> None:
    gone = str(tmp_path / "gone")
    assert fo.run([fo.detach(gone), fo.unlink(gone), fo.detach(str(tmp_path))]) == [None] * 3
    with pytest.raises(fo.FileOpError) as e:
        fo.run([fo.rmdir(gone)])
    assert e.value.errno == errno.ENOENT


def test_run_all_goes_on_past_failures_and_says_each(tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_bytes(b"")
    (tmp_path / "empty").mkdir()
    r, w = os.pipe()
    os.close(w)
    errors = fo.run_all([fo.rmdir(str(tmp_path / "full")), fo.close(r),
                         fo.rmdir(str(tmp_path / "nothing")), fo.rmdir(str(tmp_path / "empty"))])
    assert [(e.index, e.errno) for e in errors] == [(0, errno.ENOTEMPTY), (2, errno.ENOENT)]
    assert not (tmp_path / "empty").exists()
    with pytest.raises(OSError):
        os.fstat(r)  # closed by the op after the failure


def test_is_file_passes_a_regular_file_and_stops_the_list_at_anything_else(
        tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"")
    (tmp_path / "d").mkdir()
    after = tmp_path / "after"
    fo.run([fo.is_file(str(tmp_path / "f")), fo.mkdir(str(after), 0o700)])
    assert after.is_dir()
    for name, err in (("missing", errno.ENOENT), ("d", errno.EINVAL)):
        with pytest.raises(fo.FileOpError) as e:
            fo.run([fo.mkdir(str(tmp_path / f"x{name}"), 0o700),
                    fo.is_file(str(tmp_path / name)), fo.mkdir(str(after / name), 0o700)])
        assert (e.value.index, e.value.errno) == (1, err)
        assert not (after / name).exists()  # the list stopped there


def test_a_library_of_another_layout_is_refused(tmp_path: Path, monkeypatch) -> None:
    src = tmp_path / "old.c"
    src.write_text("#include <stdint.h>\nuint32_t vg_fileops_abi(void) { return 96u << 16 | 0; }\n"
                   "int vg_fileops_run(void *o, int n) { return n; }\n")
    lib = tmp_path / "libvgpu-fileops.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    monkeypatch.setattr(fo, "_lib", None)
    monkeypatch.setattr(fo, "fileops_path", lambda: lib)
    with pytest.raises(LibraryMismatchError,
                       match=rf"not this vgpu's: struct size 96, version 0; expected \d+, "
                             rf"{fo._VERSION} \(run `make`"):
        fo.load()
