# SPDX-License-Identifier: Apache-2.0
"""The committed gRPC stubs are what `make proto` generates from arbiter/proto/vgpu.proto."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import ROOT

STUBS = ("vgpu_pb2.py", "vgpu_pb2_grpc.py")


def test_committed_stubs_are_current(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    (tmp_path / "arbiter" / "proto").mkdir(parents=True)
    shutil.copy(ROOT / "arbiter" / "proto" / "vgpu.proto", tmp_path / "arbiter" / "proto")
    # The same command as the Makefile's `proto` target, run in a copy of the tree.
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I.", "--python_out=.",
         "--grpc_python_out=.", "arbiter/proto/vgpu.proto"],
        cwd=tmp_path, check=True, capture_output=True, text=True, timeout=120,
    )
    for name in STUBS:
        fresh = (tmp_path / "arbiter" / "proto" / name).read_text()
        committed = (ROOT / "arbiter" / "proto" / name).read_text()
        assert committed == fresh, f"arbiter/proto/{name} is stale: run `make proto`"


def test_makefile_target_runs_the_same_command() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert ("-m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. "
            "arbiter/proto/vgpu.proto") in makefile
