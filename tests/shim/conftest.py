# SPDX-License-Identifier: Apache-2.0
"""Fixtures shared by the shim tests."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from arbiter.daemon.events import EventLog
from arbiter.files.slice_dirs import Regions
from arbiter.model import Gpu
from arbiter.slices.arbiter import Arbiter
from arbiter.slices.store import Store


@pytest.fixture
def domain(tmp_path: Path) -> Iterator[Arbiter]:
    """arbiter.slices.arbiter.Arbiter on one simulated GPU (real SQLite and region files): the
    domain vgpud's lifecycle ops are given, in process."""
    store = Store(tmp_path / "state")
    arbiter = Arbiter(gpus=[Gpu(0, "GPU-0", "sim", 16 << 30, 0, ("/dev/null",))], store=store,
                      regions=Regions(tmp_path / "run"), events=EventLog(tmp_path / "ev.jsonl"))
    arbiter.start()
    yield arbiter
    store.close()
