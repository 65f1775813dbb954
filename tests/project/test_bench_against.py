# SPDX-License-Identifier: Apache-2.0
"""bench/arbiter.py --against: another build in a git worktree, measured beside the tree.

Not a timed test: it checks that both builds are built, started and measured in one run and
that the worktree is gone afterwards (also after Ctrl-C), never what the figures are."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.paths import ROOT
from support.prereq import require
from support.process import clean_env

BENCH = ROOT / "bench" / "arbiter.py"
sys.path.insert(0, str(ROOT / "bench"))

from against import PREVIOUS_FALLBACK, previous_release  # noqa: E402


def worktrees() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True,
                          text=True, check=True).stdout


def _interruptible() -> None:
    """In the child: SIGINT back to its default. A suite started in the background by a
    non-interactive shell (CI's `make test &`) inherits SIGINT ignored, and Python then
    installs no KeyboardInterrupt handler: a Ctrl-C would reach a bench that ignores it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def bench(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    (tmp_path / "run").mkdir()
    return subprocess.Popen(
        [sys.executable, str(BENCH), "--duration", "0.3", "--clients", "1", "--rounds", "1",
         "--dir", str(tmp_path), "--run-dir-parent", str(tmp_path / "run"), *args], cwd=ROOT,
        env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=_interruptible)


def assert_nothing_left(tmp_path: Path) -> None:
    """No worktree, directory, mount or process of the run is left."""
    assert str(tmp_path) not in worktrees()
    assert [p.name for p in tmp_path.iterdir()] == ["run"]
    assert list((tmp_path / "run").iterdir()) == []  # state and run dirs gone
    assert str(tmp_path) not in Path("/proc/self/mountinfo").read_text()
    # A broker outlives its vgpud by orphan_s (1 s in the bench's config), by design.
    deadline = time.monotonic() + 10
    while (naming := processes_naming(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert naming == [], "processes of the run outlived it (vgpud, its broker)"


def processes_naming(path: Path) -> list[str]:
    naming = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(path).encode() in (entry / "cmdline").read_bytes():
                naming.append(f"{entry.name}: {(entry / 'cmdline').read_bytes()[:120]!r}")
        except OSError:
            pass
    return naming


def test_against_measures_both_builds_and_removes_the_worktree(tmp_path):
    p = bench(tmp_path, "--against", "HEAD", "--json", "--rounds", "2")
    out, err = p.communicate(timeout=180)
    assert p.returncode == 0, err
    rows = json.loads(out[out.index("\n[") + 1:])
    seen = {(r["build"], r["scenario"]) for r in rows}
    assert seen == {(b, s) for b in ("tree", "HEAD")
                    for s in ("2x Health", "empty", "50 on GPU 0")}
    assert all(r["pairs"] > 0 and r["errors"] == 0 for r in rows), rows
    assert "tree / HEAD, empty, 1 clients: pairs/s x" in out
    assert "(rounds x" in out  # two rounds each: the paired rounds' range is shown
    assert "bench: building HEAD" in err
    assert_nothing_left(tmp_path)


def adding(tmp_path: Path) -> bool:
    return str(tmp_path) in worktrees()


def measuring(tmp_path: Path) -> bool:
    return len(list(tmp_path.glob("vgpu-bench-*/vgpud.sock"))) == 2  # both vgpuds start


@pytest.mark.parametrize("when", [adding, measuring], ids=["adding", "measuring"])
def test_ctrl_c_removes_the_worktree(tmp_path, when):
    p = bench(tmp_path, "--against", "HEAD", "--duration", "5")
    deadline = time.monotonic() + 120
    while not when(tmp_path):
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    p.communicate(timeout=60)
    assert p.returncode != 0
    assert_nothing_left(tmp_path)


def test_an_unknown_ref_is_one_line_naming_it(tmp_path):
    p = bench(tmp_path, "--against", "no-such-ref-28")
    out, err = p.communicate(timeout=60)
    assert p.returncode != 0 and out == ""
    assert err.strip().splitlines() == [
        f"bench: --against 'no-such-ref-28': no such commit or tag in {ROOT} "
        "(a tag, a branch, or a commit hash)"]


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                    *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path) -> Path:
    git(tmp_path, "init", "-q")
    for n in range(3):
        (tmp_path / "f").write_text(str(n))
        git(tmp_path, "add", "f")
        git(tmp_path, "commit", "-q", "-m", str(n))
    return tmp_path


def test_previous_release_without_tags_is_the_fixed_commit(repo):
    assert previous_release(repo) == PREVIOUS_FALLBACK


def test_previous_release_is_the_newest_tag_before_head(repo):
    git(repo, "tag", "v0.1.0", "HEAD~2")
    git(repo, "tag", "v0.2.0", "HEAD~1")
    git(repo, "tag", "other", "HEAD~1")
    assert previous_release(repo) == "v0.2.0"
    git(repo, "tag", "v0.10.0", "HEAD")  # HEAD is being released: the one before it
    assert previous_release(repo) == "v0.2.0"


def test_containers_bench_starts_both_builds_containers(tmp_path):
    """bench/containers.py --against: the ref's own vgpu-runtime, hook and vgpud start the
    same bundles (root and runc, as the bench needs)."""
    require(os.geteuid() == 0 and shutil.which("runc") is not None, "needs root and runc")
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "containers.py"), "--runs", "2",
                        "--concurrent", "2", "--rounds", "2", "--against", "HEAD"], cwd=ROOT,
                       env=clean_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    for row in ("vgpu-runtime (tree) + vgpu.io/memory=64Mi",
                "vgpu-runtime (HEAD) + vgpu.io/memory=64Mi", "2 vGPU containers at once (HEAD)"):
        assert row in p.stdout
    assert "tree / HEAD: added median " in p.stdout
    # 4 starts a build in 2 rounds: paired start by start and round by round.
    assert "of 4 paired starts), p99 x" in p.stdout
    assert "of 2 later), p99 of 2 at once x" in p.stdout
    assert "/vgpu-against-" not in worktrees()


@pytest.mark.parametrize("key", ["runs", "concurrent", "rounds"])
def test_containers_bench_refuses_a_count_below_one(key):
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "containers.py"), f"--{key}", "0",
                        "--against", "none"], cwd=ROOT, env=clean_env(), capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1].endswith(f"--{key} 0: must be 1 or more")
    assert p.stdout == ""
