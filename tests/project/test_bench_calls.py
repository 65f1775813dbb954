# SPDX-License-Identifier: Apache-2.0
"""bench/vgpud_calls.py: Python calls vgpud makes a pair, counted by a hook in a real vgpud."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

from support.paths import ROOT

BENCH = ROOT / "bench" / "vgpud_calls.py"
sys.path.insert(0, str(ROOT / "bench"))
_spec = importlib.util.spec_from_file_location("vgpud_calls_bench", BENCH)
calls = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(calls)


def test_files_are_told_apart_by_whose_code_they_hold():
    assert calls.kind_of(str(ROOT / "arbiter" / "slices" / "store.py")) == "vgpud"
    assert calls.kind_of("<string>") == "vgpud"
    assert calls.kind_of("/usr/lib/python3/site-packages/grpc/_server.py") == "grpc"
    assert calls.kind_of("/usr/lib/python3.11/threading.py") == "threads"
    assert calls.kind_of("/usr/lib/python3.11/concurrent/futures/thread.py") == "threads"
    assert calls.kind_of("/usr/lib/python3.11/pathlib.py") == "other"
    # A package named like ours, installed elsewhere, is not vgpud's code.
    assert calls.kind_of("/x/site-packages/foo/arbiter/thing.py") == "other"


def test_a_real_vgpud_is_counted_and_leaves_nothing(tmp_path: Path):
    run = tmp_path / "run"
    run.mkdir()
    p = subprocess.run([sys.executable, str(BENCH), "--against", "none", "--pairs", "20",
                        "--dir", str(tmp_path), "--run-dir-parent", str(run)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    m = re.search(r"^tree\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)$", p.stdout, re.M)
    assert m, p.stdout
    total, *parts = (int(x) for x in m.groups())
    assert abs(total - sum(parts)) <= 2, p.stdout  # the parts add up (each rounded)
    assert parts[0] > 100 and parts[1] > 50, p.stdout  # vgpud's own code and gRPC's ran
    assert "command: python3 bench/vgpud_calls.py --against none" in p.stdout
    assert [x.name for x in tmp_path.iterdir()] == ["run"]
    assert list(run.iterdir()) == []
    assert str(tmp_path) not in Path("/proc/self/mountinfo").read_text()
