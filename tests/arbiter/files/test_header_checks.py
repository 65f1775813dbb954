# SPDX-License-Identifier: Apache-2.0
"""The checks a reader makes before it trusts a region, usage, scheduling or request file
have one description: each format's VGPU_*_CHECKS list in its C header. The C readers
apply it through vgpu_checks.h; vgpud's Python keeps it as data (REGION_CHECKS, ...).

A program compiled against the real headers prints each list, field by field with its
value, and what the C check says of a good header and of the same header with each field
changed: the Python lists must be the same, and the Python readers must refuse (naming
the field) exactly what C refuses.
"""
from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from support.paths import ROOT

from arbiter.files import region_file as rf
from arbiter.files import sched_files as sf
from arbiter.files.header_checks import field_reader, fill, first_problem

INCLUDE = ROOT / "libvgpu" / "include"
#: format -> (its C lists' prefix (_CHECKS, _FIELDS), its C functions' (_check, _init),
#: the struct, the Python list, the ctypes mirror)
FORMATS = {
    "region": ("VGPU_REGION", "vgpu_region", "struct vgpu_region",
               rf.REGION_CHECKS, rf.VgpuRegion),
    "usage": ("VGPU_USAGE", "vgpu_usage", "struct vgpu_usage",
              rf.USAGE_CHECKS, rf.VgpuUsage),
    "sched": ("VGPU_SCHED", "vgpu_sched", "struct vgpu_sched",
              sf.SCHED_CHECKS, sf.VgpuSched),
    "req": ("VGPU_SCHED_REQ", "vgpu_sched_req", "struct vgpu_sched_req",
            sf.REQ_CHECKS, sf.VgpuSchedReq),
}


def _program() -> str:
    """C that prints, per format, its list and the check's verdict on each changed field."""
    out = ['#include <stdio.h>', '#include <stdlib.h>', '#include <string.h>',
           '#include "vgpu_region.h"', '#include "vgpu_sched.h"',
           '#define PRINT(f, v) printf("%s[\\"%s\\", %llu]", n++ ? "," : "", #f, '
           '(unsigned long long)(v));',
           '#define SET(f, v) h->f = (v);',
           "int main(void) {", "    int n;", '    printf("{");']
    for i, (name, (lists, fns, struct, _, _)) in enumerate(FORMATS.items()):
        checks, check, init = f"{lists}_CHECKS", f"{fns}_check", f"{fns}_init"
        out += [
            "    {",
            f"        {struct} *h = calloc(1, sizeof(*h)), *made = calloc(1, sizeof(*h));",
            "        uint64_t got, want;",
            "        const char *bad;",
            f'        printf("%s\\"{name}\\": {{\\"list\\": [", "{"," if i else ""}");',
            "        n = 0;",
            f"        {checks}(PRINT)",
            f"        {checks}(SET)",
            f"        bad = {check}(h, &got, &want);",
            '        printf("], \\"good\\": \\"%s\\", ", bad ? bad : "");',
            # What a creator makes (init, then magic last) passes the check.
            f"        {init}(made);",
            "        made->magic = h->magic;",
            f"        bad = {check}(made, &got, &want);",
            '        printf("\\"made\\": \\"%s\\", \\"changed\\": {", bad ? bad : "");',
            "        n = 0;",
            f"#define FLIP(f, v) {{ {struct} c = *h; c.f = (v) + 1; "
            f'bad = {check}(&c, &got, &want); printf("%s\\"%s\\": \\"%s\\"", n++ ? "," : "", '
            f'#f, bad ? bad : ""); }}',
            f"        {checks}(FLIP)",
            "#undef FLIP",
            '        printf("}}");',
            "        free(h);",
            "        free(made);",
            "    }",
        ]
    out += ['    printf("}\\n");', "    return 0;", "}"]
    return "\n".join(out)


@pytest.fixture(scope="module")
def from_c(tmp_path_factory: pytest.TempPathFactory) -> dict:
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to read the headers' checks")
    d = tmp_path_factory.mktemp("checks")
    (d / "checks.c").write_text(_program())
    subprocess.run(["gcc", "-std=gnu11", "-Wall", "-Wextra", "-Werror", f"-I{INCLUDE}",
                    "-o", str(d / "checks"), str(d / "checks.c")], check=True,
                   capture_output=True, text=True)
    out = subprocess.run([str(d / "checks")], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_python_keeps_the_headers_list(from_c: dict, name: str) -> None:
    """Same fields, same order, same values."""
    assert [tuple(x) for x in from_c[name]["list"]] == list(FORMATS[name][3])


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_c_refuses_each_listed_field_and_names_it(from_c: dict, name: str) -> None:
    got = from_c[name]
    assert got["good"] == ""
    assert got["made"] == ""  # what the C creators write (VG_DEFINE_INIT) passes it
    assert got["changed"] == {field: field for field, _ in got["list"]}


def _header(cls: type[ctypes.Structure], checks: tuple[tuple[str, int], ...]):
    h = cls()
    for field, value in checks:
        setattr(h, field, value)
    return h


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_python_refuses_what_c_refuses(from_c: dict, name: str) -> None:
    """first_problem over the Python list, reading the headers' bytes as vgpud's readers
    do: the good one passes, each changed field fails with that field in the line, and an
    integer field outside the list changes nothing."""
    _, _, _, checks, cls = FORMATS[name]
    good = _header(cls, checks)
    assert first_problem(field_reader(cls, bytes(good)), checks, name) is None
    made = cls()  # what the Python creators write (fill), magic last
    made.magic = fill(made, checks)
    assert first_problem(field_reader(cls, bytes(made)), checks, name) is None
    for field, value in checks:
        bad = _header(cls, checks)
        setattr(bad, field, value + 1)
        line = first_problem(field_reader(cls, bytes(bad)), checks, name)
        assert line is not None, field
        assert from_c[name]["changed"][field] == field
        assert field.replace("_", " ") in line, line
    listed = {f for f, _ in checks}
    other = next(f for f, *_ in cls._fields_
                 if f not in listed and isinstance(getattr(good, f), int))
    loose = _header(cls, checks)
    setattr(loose, other, 7)
    assert first_problem(field_reader(cls, bytes(loose)), checks, name) is None


def test_the_readers_refuse_a_file_whose_listed_field_differs(tmp_path: Path) -> None:
    """The Python readers go through the lists: a region file with a wrong slot capacity
    and a .req with a wrong version are refused, as libvgpu and vgpu-broker refuse them."""
    path = tmp_path / "vgpu0"
    rf.create_region(path, uuid="GPU-x", device_index=0, memory_limit=1 << 30,
                     compute_share=50)
    with open(path, "r+b") as f:
        f.seek(rf.VgpuRegion.slot_capacity.offset)
        f.write((rf.REGION_SLOTS + 1).to_bytes(4, "little"))
    with pytest.raises(Exception, match="slot capacity"):
        rf.open_region(path)
    req = sf.VgpuSchedReq()
    for field, value in sf.REQ_CHECKS:
        setattr(req, field, value)
    req.key = 5
    (tmp_path / "ok.req").write_bytes(bytes(req))
    assert sf._whole_req(tmp_path / "ok.req", 5)
    req.version += 1
    (tmp_path / "bad.req").write_bytes(bytes(req))
    assert not sf._whole_req(tmp_path / "bad.req", 5)
