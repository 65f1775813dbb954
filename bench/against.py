# SPDX-License-Identifier: Apache-2.0
"""Another build of vgpu beside the tree, for the benchmarks' side-by-side rows (--against).

`built_tree(ref)` checks the commit or tag out in a git worktree under a temporary directory,
builds its C parts there (`make -s all`: libvgpu, simgpu, the compiled programs) and removes
the worktree when the block ends, however it ends (an error, Ctrl-C, or SIGTERM once
`exit_on_sigterm()` made that an exit). Its Python runs from its own checkout with this
interpreter and its installed packages (the same venv): `vgpud_proc(tree)` loads that build's
own bench/vgpud_proc.py, which knows how that build's vgpud starts (its module, its config
keys).

The previous release is the newest tag `v*` that HEAD contains and is not HEAD itself.
Before the first release is tagged it is PREVIOUS_FALLBACK: main on 2026-12-02, the build
whose vgpud figures issue 28 measured as the last good ones.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent

#: The previous release while no `v*` tag exists (main on 2026-12-02, see above).
PREVIOUS_FALLBACK = "bfd1b41"
#: What --against takes to measure the tree alone.
NONE = "none"


@dataclass(frozen=True)
class Tree:
    """A build to measure: the working tree itself, or a commit built in a worktree."""

    label: str   # what the tables print: "tree", or the ref as given
    path: Path   # its checkout (the tree's own for the tree)
    commit: str  # "" for the working tree (it may hold uncommitted changes)


def this_tree() -> Tree:
    """The working tree the benchmark runs from, as it is (uncommitted changes included)."""
    return Tree("tree", ROOT, "")


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    """cmd's outcome, in a process group of its own. Interrupted (Ctrl-C, SIGTERM), the whole
    group is killed and gone before this returns: a make killed alone leaves its compilers
    writing into the worktree while it is being removed (seen under load), and a
    `git worktree add` still running would register the worktree after its removal."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate()
    except BaseException:
        _kill_group(p)
        raise
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def _kill_group(p: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    # The group's other members (the compilers) are reparented and reaped by init; the
    # group is gone once none of them is left, within moments of SIGKILL.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(p.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.01)


def _git(*args: str, root: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return _run(["git", "-C", str(root), *args])


def previous_release(root: Path = ROOT) -> str:
    """The newest `v*` tag that HEAD contains and that is not HEAD itself (the release
    before the one being made); PREVIOUS_FALLBACK when there is none."""
    head = _git("rev-parse", "HEAD", root=root).stdout.strip()
    tags = _git("tag", "--merged", "HEAD", "--sort=-v:refname", "--list", "v*",
                root=root).stdout.split()
    for tag in tags:
        if _git("rev-parse", f"{tag}^{{commit}}", root=root).stdout.strip() != head:
            return tag
    return PREVIOUS_FALLBACK


def resolve(ref: str, root: Path = ROOT) -> str:
    """The commit ref names; exits with one line when it names none."""
    if not ref or ref.startswith("-"):
        sys.exit(f"bench: --against {ref!r}: not a commit or tag")
    p = _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", root=root)
    if p.returncode != 0:
        sys.exit(f"bench: --against {ref!r}: no such commit or tag in {root} "
                 "(a tag, a branch, or a commit hash)")
    return p.stdout.strip()


def exit_on_sigterm() -> None:
    """Make SIGTERM unwind like Ctrl-C does (exit 143), so that worktrees are removed."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


@contextlib.contextmanager
def built_tree(ref: str, root: Path = ROOT, parent: str = "/var/tmp") -> Iterator[Tree]:
    """Check ref out in a worktree of root under a temporary directory, build it, yield it;
    remove the worktree afterwards, whatever happened."""
    commit = resolve(ref, root)
    tmp = Path(tempfile.mkdtemp(prefix="vgpu-against-", dir=parent))
    path = tmp / "tree"
    try:
        p = _git("worktree", "add", "--detach", "--quiet", str(path), commit, root=root)
        if p.returncode != 0:
            sys.exit(f"bench: --against {ref}: git worktree add failed: "
                     f"{p.stderr.strip().splitlines()[-1] if p.stderr.strip() else p.returncode}")
        print(f"bench: building {ref} ({commit[:12]}) in {path}", file=sys.stderr)
        p = _run(["make", "-s", "-C", str(path), "all"])
        if p.returncode != 0:
            tail = (p.stdout + p.stderr).strip().splitlines()[-5:]
            sys.exit(f"bench: --against {ref}: make failed (exit {p.returncode}):\n"
                     + "\n".join(tail))
        yield Tree(ref, path, commit)
    finally:
        # Twice --force: also when an interrupted `worktree add` left it locked.
        removed = _git("worktree", "remove", "--force", "--force", str(path),
                       root=root).returncode == 0
        shutil.rmtree(tmp, ignore_errors=True)
        if not removed:  # a half-made one: its directory is gone now, so prune forgets it
            _git("worktree", "unlock", str(path), root=root)
            _git("worktree", "prune", root=root)


def start_vgpud(tree: Tree, tmp: Path, run_dir: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """That build's start_vgpud(tmp, run_dir); when it does not return (Ctrl-C while it
    waits for vgpud to answer, or it gives up), the vgpud it started is killed: its command
    line names tmp, and it is this process's child."""
    try:
        return vgpud_proc(tree).start_vgpud(tmp, run_dir)
    except BaseException:
        for pid in _children_naming(str(tmp)):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        from vgpud_proc import unmount_under  # the tree's: bench/ is on sys.path
        unmount_under(run_dir)
        raise


def _children_naming(text: str) -> list[int]:
    me, out = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            argv = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == me and os.fsencode(text) in argv:
            out.append(int(entry))
    return out


def vgpud_proc(tree: Tree) -> ModuleType:
    """That build's own bench/vgpud_proc.py (start_vgpud(tmp, run_dir) -> (process, socket)),
    loaded under a name of its own."""
    if tree.commit == "":
        import vgpud_proc as mine  # bench/ is on sys.path: the benchmarks import it so
        return mine
    source = tree.path / "bench" / "vgpud_proc.py"
    if not source.is_file():
        sys.exit(f"bench: --against {tree.label}: it has no bench/vgpud_proc.py "
                 "(older than the benchmarks' private vgpud)")
    name = f"vgpud_proc_{tree.commit[:12]}"
    spec = importlib.util.spec_from_file_location(name, source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    path = list(sys.path)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = path  # it puts its checkout first; this process imports the tree's
    return module
