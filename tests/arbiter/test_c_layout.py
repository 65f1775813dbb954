# SPDX-License-Identifier: Apache-2.0
"""tests/support/c_layout.py reads every member and constant a header declares (the layout tests
rely on it to catch a field or constant without a Python twin)."""
from __future__ import annotations

from pathlib import Path

from support.c_layout import header_constants, header_structs

HEADER = """\
#ifndef X_H
#define X_H
#define X_MAGIC 0x44454853u     /* "SHED" */
#define X_COUNT 128u
#define X_NAME "text"           /* not an integer: not a layout constant */
#define X_EXPR (1u << 4)        /* an expression: not read */
enum x_kind { X_A = 0, X_B = 1,
              X_C };
/* struct in_comment { int no; }; */
struct x_inner {
    _Atomic uint64_t key;       /* a; b; */
    uint32_t share, priority , floor;
    char uuid[X_COUNT];
    struct x_other *next;
    uint64_t reserved[2][3];
};
#endif
"""


def test_header_structs_lists_every_member_in_order(tmp_path: Path) -> None:
    (tmp_path / "x.h").write_text(HEADER)
    assert header_structs(tmp_path / "x.h") == {
        "x_inner": ["key", "share", "priority", "floor", "uuid", "next", "reserved"]}


def test_header_constants_lists_integer_macros_and_enum_constants(tmp_path: Path) -> None:
    (tmp_path / "x.h").write_text(HEADER)
    assert header_constants(tmp_path / "x.h") == ["X_MAGIC", "X_COUNT", "X_A", "X_B", "X_C"]
