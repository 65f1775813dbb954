# SPDX-License-Identifier: Apache-2.0
"""Checks that a ctypes mirror matches its C struct, field by field, as the compiler lays
it out from the real header.

The fields are read from the header itself (every member of each struct, in order), a C
program generated from them prints each struct's size and alignment, every field's
offset and size, and the value of every integer constant the headers define (object-like
macros and enum constants); the tests compare all of it with the Python mirror. A field
or constant added to the header without its Python twin fails.
"""
from __future__ import annotations

import ctypes
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from support.paths import ROOT

INCLUDE_DIRS = (ROOT / "libvgpu" / "include", ROOT / "libvgpu" / "common",
                ROOT / "arbiter" / "files" / "native")

_STRUCT = re.compile(r"\bstruct\s+(\w+)\s*\{(.*?)\}\s*;", re.S)
_ENUM = re.compile(r"\benum\s+\w+\s*\{(.*?)\}\s*;", re.S)
_MACRO = re.compile(r"^#define[ \t]+([A-Z][A-Z0-9_]*)[ \t]+\(?(0x[0-9a-fA-F]+|\d+)u?\)?[ \t]*$",
                    re.M)
_DECLARATOR = re.compile(r"^\**\s*(\w+)\s*(?:\[[^\]]*\]\s*)*$")


def _code(text: str) -> str:
    """The header without comments."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def header_structs(header: Path) -> dict[str, list[str]]:
    """struct name -> its member names in declaration order, read from the header."""
    structs: dict[str, list[str]] = {}
    for name, body in _STRUCT.findall(_code(header.read_text())):
        fields: list[str] = []
        for decl in body.split(";"):
            decl = " ".join(decl.split())
            if not decl:
                continue
            # `uint32_t a, b[4]`: the type is every word before the first declarator.
            first, *rest = decl.split(",")
            words = re.match(r"^(.*?)(\**\s*\w+\s*(?:\[[^\]]*\]\s*)*)$", first.strip())
            assert words, f"{header}: cannot read the member declaration {decl!r}"
            for declarator in (words.group(2), *rest):
                m = _DECLARATOR.match(declarator.strip())
                assert m, f"{header}: cannot read the member declaration {decl!r}"
                fields.append(m.group(1))
        structs[name] = fields
    return structs


def header_constants(header: Path) -> list[str]:
    """Names of the integer macros and enum constants the header defines."""
    code = _code(header.read_text())
    names = _MACRO.findall(code)
    macros = [name for name, _ in names]
    enums = [item.split("=")[0].strip() for body in _ENUM.findall(code)
             for item in body.split(",") if item.strip()]
    return macros + enums


def read_layout(headers: list[str], structs: list[str]) -> dict[str, Any]:
    """The layout of `structs` and the headers' constants, as the C compiler sees them."""
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to read the C layout")
    paths = [next(d / h for d in INCLUDE_DIRS if (d / h).is_file()) for h in headers]
    declared: dict[str, list[str]] = {}
    constants: list[str] = []
    for path in paths:
        declared.update(header_structs(path))
        constants += header_constants(path)
    lines = ["#include <stdalign.h>", "#include <stddef.h>", "#include <stdio.h>",
             *(f'#include "{h}"' for h in headers),
             "int main(void) {", '    printf("{\\"structs\\": {");']
    for i, name in enumerate(structs):
        fields = declared[name]
        t = f"struct {name}"
        lines.append(f'    printf("%s\\"{name}\\": {{\\"size\\": %zu, \\"align\\": %zu, '
                     f'\\"fields\\": [", "{"," if i else ""}", sizeof({t}), alignof({t}));')
        for j, field in enumerate(fields):
            lines.append(f'    printf("%s[\\"{field}\\", %zu, %zu]", "{"," if j else ""}", '
                         f"offsetof({t}, {field}), sizeof((({t} *)0)->{field}));")
        lines.append('    printf("]}");')
    lines.append('    printf("}, \\"constants\\": {");')
    for i, name in enumerate(constants):
        lines.append(f'    printf("%s\\"{name}\\": %lld", "{"," if i else ""}", '
                     f"(long long)({name}));")
    lines += ['    printf("}}\\n");', "    return 0;", "}"]
    with tempfile.TemporaryDirectory(prefix="vgpu-layout-") as d:
        source, program = Path(d) / "layout.c", Path(d) / "layout"
        source.write_text("\n".join(lines) + "\n")
        subprocess.run(["gcc", "-std=gnu11", "-Wall", "-Werror",
                        *(f"-I{p}" for p in INCLUDE_DIRS), "-o", str(program), str(source)],
                       check=True, capture_output=True, text=True, timeout=120)
        out = subprocess.run([str(program)], check=True, capture_output=True, text=True,
                             timeout=30).stdout
    layout: dict[str, Any] = json.loads(out)
    return layout


def assert_size_and_alignment(layout: dict[str, Any], struct_name: str,
                              cls: type[ctypes.Structure]) -> None:
    c = layout["structs"][struct_name]
    assert (ctypes.sizeof(cls), ctypes.alignment(cls)) == (c["size"], c["align"])


def assert_fields(layout: dict[str, Any], struct_name: str, cls: type[ctypes.Structure]) -> None:
    """Every field of the C struct, in order, at the same offset with the same size."""
    c_fields = [tuple(f) for f in layout["structs"][struct_name]["fields"]]
    py_fields = [(name, getattr(cls, name).offset, getattr(cls, name).size)
                 for name, *_ in cls._fields_]
    assert py_fields == c_fields
