# SPDX-License-Identifier: Apache-2.0
"""Every time the token's two sides rely on is defined once, in libvgpu/include/vgpu_timing.h,
and every Python copy of one is the same value.

A tiny C program, compiled against the real header, prints each of its macros as the compiler
sees them; each Python copy is compared with it. Every macro of the header is either mirrored
below or listed as used by C alone, with who uses it: a time added there is placed here too.
"""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from support import hand_broker
from support.paths import ROOT

from arbiter.files import sched_files as sched

HEADER = ROOT / "libvgpu" / "include" / "vgpu_timing.h"
_DEFINE = re.compile(r"^#define[ \t]+(VGPU_[A-Z0-9_]+)[ \t]+\S", re.MULTILINE)


#: vgpu_timing.h macro -> its Python copy (a callable: read when the test runs).
TWINS = {
    # vgpud reports no broker for a GPU whose heartbeat is older (libvgpu replaces it).
    "VGPU_BROKER_DEAD_NS": lambda: sched.BROKER_DEAD_NS,
    # The hand-played hostile tenant waits out and checks the charge of an unreported tail.
    "VGPU_TAIL_MAX_NS": lambda: hand_broker.TAIL_MAX_NS,
    # A ring from a new slice must get it taken on well before the heartbeat would.
    "VGPU_BEAT_NS": lambda: hand_broker.BEAT_NS,
}
#: Macros only C reads, and where.
C_ONLY = {
    "VGPU_US": "a unit",
    "VGPU_MS": "a unit",
    "VGPU_BROKER_STOPPED_NS": "sched.c (standalone election)",
    "VGPU_FUTURE_NS": "policy.c (claims), sched.c (the beat)",
    "VGPU_ACTIVE_NS": "policy.c",
    "VGPU_WANT_RENEW_NS": "sched.c",
    "VGPU_ACTIVE_RENEW_NS": "sched.c",
    "VGPU_PRESENT_NS": "policy.c",
    "VGPU_TAKE_NS": "policy.c",
    "VGPU_LEASE_RENEW_NS": "sched.c",
    "VGPU_LEASE_NS": "policy.c",
    "VGPU_TAIL_QUEUE_NS": "sched.c",
}


def test_every_macro_is_mirrored_or_c_only() -> None:
    names = set(_DEFINE.findall(HEADER.read_text()))
    assert names, f"no `#define VGPU_...` found in {HEADER}"
    assert names - TWINS.keys() - C_ONLY.keys() == set(), "macros placed neither here nor in C_ONLY"
    assert (TWINS.keys() | C_ONLY.keys()) - names == set(), "names vgpu_timing.h no longer has"


@pytest.fixture(scope="module")
def c_values(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    """Each macro of the header as the C compiler sees it."""
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to read the C side's values")
    d = tmp_path_factory.mktemp("timing")
    names = sorted(set(_DEFINE.findall(HEADER.read_text())))
    source = d / "print_timing.c"
    source.write_text(
        "#include <stdio.h>\n#include \"vgpu_timing.h\"\nint main(void) {\n"
        + "".join(f'    printf("%s %llu\\n", "{n}", (unsigned long long)({n}));\n' for n in names)
        + "    return 0;\n}\n")
    program = d / "print_timing"
    subprocess.run(["gcc", "-std=gnu11", "-Wall", "-Werror", f"-I{HEADER.parent}", "-o",
                    str(program), str(source)], check=True, capture_output=True, text=True,
                   timeout=120)
    out = subprocess.run([str(program)], check=True, capture_output=True, text=True,
                         timeout=30).stdout
    return {name: int(value) for name, value in (line.split() for line in out.splitlines())}


@pytest.mark.parametrize("name", sorted(TWINS))
def test_c_and_python_agree(c_values: dict[str, int], name: str) -> None:
    python = TWINS[name]()
    assert c_values[name] == python, f"{name}: C {c_values[name]}, Python {python}"

