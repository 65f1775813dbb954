# SPDX-License-Identifier: Apache-2.0
"""The committed gRPC stubs are what `make proto` generates from arbiter/proto/vgpu.proto."""
from __future__ import annotations

from pathlib import Path

import pytest
from support.paths import ROOT
from support.protoc import assert_stubs_current

STUBS = ("vgpu_pb2.py", "vgpu_pb2_grpc.py")


def test_committed_stubs_are_current(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    assert_stubs_current(tmp_path, "arbiter/proto/vgpu.proto", STUBS)


def test_makefile_target_runs_the_same_command() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert ("-m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. "
            "arbiter/proto/vgpu.proto") in makefile
