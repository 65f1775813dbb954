# SPDX-License-Identifier: Apache-2.0
"""arbiter.files.atomic: a new file beside its final name, never one that is there, and the
fsync policy."""
from __future__ import annotations

import os
import stat

import pytest

from arbiter.files.atomic import open_beside


def test_a_new_private_file_beside_the_name(tmp_path):
    fd, tmp = open_beside(tmp_path / "vgpu0")
    os.close(fd)
    name = os.path.basename(tmp)
    assert name.startswith(f".vgpu0.{os.getpid()}-") and name.endswith(".tmp")
    assert os.path.dirname(tmp) == str(tmp_path)
    st = os.stat(tmp)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_size == 0


def test_names_that_are_there_are_skipped_not_opened(tmp_path):
    """A leftover of a crashed vgpud with the same pid (or a link planted there) is never
    opened: O_EXCL refuses it and the next number is taken."""
    fd, first = open_beside(tmp_path / "x")
    os.close(fd)
    n = int(first.rsplit("-", 1)[1].removesuffix(".tmp"))
    prefix = first.rsplit("-", 1)[0]
    (tmp_path / "target").write_text("keep")
    for k in range(n + 1, n + 4):  # the next three names: a file, a symlink, a directory
        path = f"{prefix}-{k}.tmp"
        if k == n + 1:
            open(path, "w").close()
        elif k == n + 2:
            os.symlink(tmp_path / "target", path)
        else:
            os.mkdir(path)
    fd, tmp = open_beside(tmp_path / "x")
    os.write(fd, b"new")
    os.close(fd)
    assert tmp == f"{prefix}-{n + 4}.tmp"
    assert (tmp_path / "target").read_text() == "keep"


def test_a_forked_child_names_files_with_its_own_pid(tmp_path):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its name, through the pipe
        _fd, tmp = open_beside(tmp_path / "x")
        os.write(w, tmp.encode())
        os._exit(0)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    name = os.read(r, 4096).decode()
    os.close(r)
    assert os.waitstatus_to_exitcode(status) == 0
    assert os.path.basename(name).startswith(f".x.{pid}-")


def test_write_whole_fresh_writes_at_the_name_and_leaves_nothing_on_failure(tmp_path):
    from arbiter.files.atomic import write_whole
    fd = write_whole(tmp_path / "f", b"data", 0o640, last=(0, b"D"), how="fresh", keep=True)
    assert fd is not None and os.pread(fd, 4, 0) == b"Data"
    os.close(fd)
    assert sorted(os.listdir(tmp_path)) == ["f"]
    assert stat.S_IMODE(os.stat(tmp_path / "f").st_mode) == 0o640
    with pytest.raises(FileExistsError):  # O_EXCL: what is at the name is left as it was
        write_whole(tmp_path / "f", b"other", 0o600, how="fresh")
    assert (tmp_path / "f").read_bytes() == b"Data"
    # A write that fails leaves no file. The last byte a file can hold is 2**63 - 2, so a
    # write at 2**63 - 1 fails on every filesystem (tmpfs takes 2**62, ext4 stops at 16 TiB).
    with pytest.raises(OSError):
        write_whole(tmp_path / "g", b"x", 0o600, last=((1 << 63) - 1, b"M"), how="fresh")
    assert sorted(os.listdir(tmp_path)) == ["f"]


def test_write_whole_replaces_whole_and_keeps_no_temporary_name(tmp_path):
    from arbiter.files.atomic import write_whole
    (tmp_path / "f").write_bytes(b"old, and longer than the new")
    before = os.stat(tmp_path / "f").st_ino
    write_whole(tmp_path / "f", b"new", 0o644)
    assert (tmp_path / "f").read_bytes() == b"new"
    assert os.stat(tmp_path / "f").st_ino != before  # a new file renamed over, not rewritten
    assert stat.S_IMODE(os.stat(tmp_path / "f").st_mode) == 0o644
    assert sorted(os.listdir(tmp_path)) == ["f"]


def test_replace_link_points_the_name_at_the_new_target(tmp_path):
    from arbiter.files.atomic import replace_link
    replace_link(tmp_path / "current", "v1")
    assert os.readlink(tmp_path / "current") == "v1"
    replace_link(tmp_path / "current", "v2", durable=True)
    assert os.readlink(tmp_path / "current") == "v2"
    assert sorted(os.listdir(tmp_path)) == ["current"]


# The fsync policy, seen from the kernel's side: strace counts each process's fsyncs.
SYNCS = {"fsync", "fdatasync", "syncfs", "sync"}
_WRITES = """
import sys
from arbiter.files.atomic import replace_link, write_whole
durable = sys.argv[1] == "durable"
d = sys.argv[2]
write_whole(d + "/file", b"data", 0o644, durable=durable)
replace_link(d + "/link", "file", durable=durable)
"""


@pytest.mark.parametrize(("how", "fsyncs"), [("durable", 3), ("run-dir", 0)])
def test_only_a_durable_write_fsyncs_the_file_and_its_directory(tmp_path, how, fsyncs):
    """durable: the file before its rename, then the directory after each of the two
    renames (file and link); the default: none (the run dir is a tmpfs)."""
    import shutil
    import subprocess
    import sys

    from support.paths import ROOT
    from support.prereq import require
    require(shutil.which("strace") is not None, "needs strace (scripts/install-deps.sh)")
    log = tmp_path / "strace.log"
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(["strace", "-f", "-e", "trace=fsync,fdatasync,syncfs,sync", "-o", str(log),
                    sys.executable, "-c", _WRITES, how, str(out)],
                   cwd=ROOT, check=True, capture_output=True)
    calls = [line for line in log.read_text().splitlines()
             if "(" in line and line.split("(")[0].split()[-1] in SYNCS]
    assert len(calls) == fsyncs, calls
    assert all(line.rstrip().endswith("= 0") for line in calls), calls
    assert (out / "file").read_bytes() == b"data" and os.readlink(out / "link") == "file"
