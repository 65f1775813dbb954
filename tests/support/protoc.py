# SPDX-License-Identifier: Apache-2.0
"""The committed gRPC stubs against what `make proto` generates now (tests/*/test_*proto.py)."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from support.paths import ROOT

# The generator's own versions, which the stubs carry as the least runtime they need: a
# newer grpcio-tools or protobuf from PyPI (a fresh install) writes its own, and the code
# is the same. The committed stubs keep the versions they were made with, the floors that
# pyproject.toml names.
_VERSIONS = (
    (re.compile(r"^GRPC_GENERATED_VERSION = '[^']*'$", re.M), "GRPC_GENERATED_VERSION = 'X'"),
    (re.compile(r"^# Protobuf Python Version: .*$", re.M), "# Protobuf Python Version: X"),
    (re.compile(r"(_runtime_version\.Domain\.PUBLIC,\n)\s*\d+,\n\s*\d+,\n\s*\d+,\n\s*'[^']*',"),
     r"\1X,"),
)


def _without_versions(text: str) -> str:
    for pattern, repl in _VERSIONS:
        text = pattern.sub(repl, text)
    return text


def assert_stubs_current(tmp_path: Path, proto: str, stubs: tuple[str, ...]) -> None:
    """Generate proto (a path under ROOT) in tmp_path with the Makefile's `proto` command
    and check each committed stub beside it is the same, but for the generators' versions."""
    where = Path(proto).parent
    (tmp_path / where).mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / proto, tmp_path / proto)
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I.", "--python_out=.",
                    "--grpc_python_out=.", proto],
                   cwd=tmp_path, check=True, capture_output=True, text=True, timeout=120)
    for name in stubs:
        fresh = _without_versions((tmp_path / where / name).read_text())
        committed = _without_versions((ROOT / where / name).read_text())
        assert committed == fresh, f"{where / name} is stale: run `make proto`"
