# SPDX-License-Identifier: Apache-2.0
"""The compute rules' cores stay pure (issue 21): no syscalls, clock reads, atomics or
globals, `now` a parameter, so each rule's trace test says what every host does.

libvgpu/src/ledger.c (a slice's GPU time), policy.c (the broker's grants and charges) and
hold.c (when a holder gives an empty queue back) are linked alone into their trace
drivers; this checks their text, so a clock read or a global slipped in fails here and
not as a share that moves on one host.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "libvgpu" / "src"
PURE = ["ledger", "policy", "hold"]
# What a pure core may include: fixed-width integers, memset/memmove, its own and the
# shared layouts' headers (constants and structs only).
ALLOWED_INCLUDES = {"<stdint.h>", "<string.h>", '"ledger.h"', '"policy.h"', '"hold.h"',
                    '"../include/vgpu_timing.h"', '"../include/vgpu_region.h"'}
FORBIDDEN = re.compile(r"\b(clock_gettime|gettimeofday|time|__atomic_\w+|atomic_\w+|_Atomic|"
                       r"syscall|open|read|write|mmap|futex|pthread_\w+|getenv|malloc|free)\s*\(")
# A file-scope variable: `static` (or a bare type) at column 0 ending in `;` or `=`, not a
# function (no parenthesis before the `=`/`;`) and not a const table.
GLOBAL = re.compile(r"^(?!.*\bconst\b)(static\s+)?[A-Za-z_][\w\s\*]*\s[\*\w]+(\[[^\]]*\])?\s*(=|;)",
                    re.M)


def code(text: str) -> str:
    """The text without comments and string literals."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r'"(\\.|[^"\\])*"', '""', text)


@pytest.mark.parametrize("name", PURE)
def test_a_pure_core_includes_only_layouts_and_integers(name: str) -> None:
    for suffix in (".c", ".h"):
        text = (SRC / f"{name}{suffix}").read_text()
        includes = set(re.findall(r"^#include\s+(\S+)", text, re.M))
        assert includes <= ALLOWED_INCLUDES, f"{name}{suffix}: {includes - ALLOWED_INCLUDES}"


@pytest.mark.parametrize("name", PURE)
def test_a_pure_core_reads_no_clock_and_keeps_no_state(name: str) -> None:
    text = code((SRC / f"{name}.c").read_text())
    assert not FORBIDDEN.findall(text), f"{name}.c calls {FORBIDDEN.findall(text)}"
    assert not GLOBAL.findall(_file_scope(text)), f"{name}.c has file-scope state"


def _file_scope(text: str) -> str:
    """The lines of text at brace depth 0 (declarations outside any function or struct)."""
    out, depth = [], 0
    for line in text.splitlines():
        if depth == 0 and not line.startswith(("#", " ", "\t", "}")):
            out.append(line)
        depth += line.count("{") - line.count("}")
    return "\n".join(out)


def test_the_checks_catch_a_clock_read_and_a_global() -> None:
    """The patterns above find what they are for."""
    assert FORBIDDEN.findall(code("uint64_t f(void) { clock_gettime(1, &ts); }"))
    assert FORBIDDEN.findall(code("void f(int *x) { __atomic_load_n(x, 0); }"))
    assert not FORBIDDEN.findall(code("/* clock_gettime(x) */ int f(void);"))
    assert GLOBAL.findall(_file_scope("static uint64_t g_last;\nint f(void)\n{\n}\n"))
    assert GLOBAL.findall(_file_scope("int counter = 0;\n"))
    assert not GLOBAL.findall(_file_scope("static const char *names[] = {\n};\n"))
    assert not GLOBAL.findall(_file_scope("static int f(int a)\n{\n    int x = 1;\n}\n"))
