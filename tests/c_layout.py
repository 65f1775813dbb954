# SPDX-License-Identifier: Apache-2.0
"""Checks that a ctypes mirror matches its C struct, as a C program prints it.

libvgpu/tests/region_layout.c and sched_layout.c print, as JSON, each struct's size,
alignment and (offset, size) of every field, and the header's constants.
"""
from __future__ import annotations

import ctypes
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import TEST_BIN, clean_env


def read_layout(program: Path) -> dict[str, Any]:
    """The layout as the C compiler sees it."""
    if not program.exists():
        pytest.fail(f"{program} is missing: run `make build/tests/{program.name}`")
    env = clean_env()
    env["LD_LIBRARY_PATH"] = str(TEST_BIN.parent / "simgpu")
    out = subprocess.run([str(program)], env=env, capture_output=True, text=True,
                         check=True, timeout=30).stdout
    layout: dict[str, Any] = json.loads(out)
    return layout


def assert_size_and_alignment(layout: dict[str, Any], struct_name: str,
                              cls: type[ctypes.Structure]) -> None:
    assert ctypes.sizeof(cls) == layout[struct_name]["size"]
    assert ctypes.alignment(cls) == layout[struct_name]["align"]


def assert_fields(layout: dict[str, Any], struct_name: str, cls: type[ctypes.Structure]) -> None:
    """Same names in the same order, then the same place and width for each."""
    c_fields = layout[struct_name]["fields"]
    assert [name for name, *_ in cls._fields_] == list(c_fields)
    for name, (offset, size) in c_fields.items():
        descr = getattr(cls, name)
        assert (name, descr.offset, descr.size) == (name, offset, size)
