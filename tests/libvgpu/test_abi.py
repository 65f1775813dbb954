# SPDX-License-Identifier: Apache-2.0
"""libvgpu/include/vgpu_cuda.h matches the real CUDA driver API (cuda.h).

vgpu builds without a CUDA toolkit, so vgpu_cuda.h declares the driver ABI it
needs itself. Where a toolkit is installed these tests prove the declarations
match the real cuda.h:

* prototypes: every ``CUresult cu...(...);`` in vgpu_cuda.h's CUDA section is
  re-declared, text unchanged, after ``#include <cuda.h>``. C rejects a
  redeclaration whose type conflicts with cuda.h's, so a clean ``-Werror``
  compile proves each signature matches. Legacy ABI names that a current
  cuda.h only declares for the driver's own build (``cuGetProcAddress``,
  ``cuDeviceGetUuid``, ...) are checked with ``__CUDA_API_VERSION_INTERNAL``
  defined, which is how cuda.h exposes them.
* layouts and values: one program built against vgpu_cuda.h alone and one
  against cuda.h alone print sizeof/_Alignof of every struct and typedef,
  offsetof/sizeof of every struct field, and the value of every enum constant
  and object-like macro that vgpu_cuda.h's CUDA section defines; both must agree.

The lists are parsed from vgpu_cuda.h, so anything added to it is covered.
NVML declarations are not checked: no nvml.h is installed alongside cuda.h.

When CUDA headers are expected and none is found, the suite fails instead of skipping
(tests/support/prereq.py): they are expected in CI ($CI set; .ci/run sets it: CI hosts carry a
toolkit under /usr/local/cuda) and wherever $CUDA_HOME or $CUDA_PATH names a toolkit.
A CI host without a toolkit says so with VGPU_NO_CUDA_TOOLKIT=1 and the suite skips
there. vgpu vendors no NVIDIA header: without cuda.h nothing can be compared.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.cuda_headers import cuda_include_dirs, find_cuda_include
from support.prereq import cuda_headers_expected, require

ROOT = Path(__file__).resolve().parents[2]
VGPU_INCLUDE = ROOT / "libvgpu" / "include"
VGPU_CUDA_H = VGPU_INCLUDE / "vgpu_cuda.h"
NVML_MARKER = "/* ---- NVML ---- */"
CFLAGS = ["-Werror", "-std=gnu11"]


# ---------------------------------------------------------------------------
# Finding the toolkit
# ---------------------------------------------------------------------------

def _cuda_include_dirs() -> list[Path]:
    return cuda_include_dirs()


@pytest.fixture(scope="module")
def cuda_include() -> Path:
    d = find_cuda_include()
    if d is None:
        reason = ("no CUDA toolkit cuda.h found (looked in "
                  + ", ".join(str(p) for p in _cuda_include_dirs())
                  + "); set CUDA_HOME to check vgpu_cuda.h against it")
        if cuda_headers_expected():
            pytest.fail(f"{reason}; CUDA headers are expected here (CI, or CUDA_HOME/"
                        "CUDA_PATH set; a CI host without a toolkit sets "
                        "VGPU_NO_CUDA_TOOLKIT=1)", pytrace=False)
        pytest.skip(reason)
    require(shutil.which("gcc") is not None, "gcc not found")
    return d


# ---------------------------------------------------------------------------
# Parsing vgpu_cuda.h
# ---------------------------------------------------------------------------

def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def cuda_section() -> str:
    """vgpu_cuda.h up to the NVML part, comments removed."""
    src = VGPU_CUDA_H.read_text()
    assert NVML_MARKER in src, f"{VGPU_CUDA_H} lost its {NVML_MARKER!r} divider"
    return _strip_comments(src[:src.index(NVML_MARKER)])


def parse_prototypes(text: str) -> dict[str, str]:
    """name -> the declaration text, exactly as written (first one wins)."""
    protos: dict[str, str] = {}
    for m in re.finditer(r"\bCUresult\s+(cu\w+)\s*\([^;{}]*\)\s*;", text):
        protos.setdefault(m.group(1), m.group(0))
    return protos


def parse_enum_constants(text: str) -> list[str]:
    names = []
    for m in re.finditer(r"\benum\s*\w*\s*\{([^}]*)\}", text):
        for item in m.group(1).split(","):
            item = item.strip()
            if item:
                name = re.match(r"([A-Za-z_]\w*)", item)
                assert name, f"cannot parse enumerator {item!r}"
                names.append(name.group(1))
    return names


def parse_macros(text: str) -> list[str]:
    """Object-like macros with a value (the include guard has none)."""
    return re.findall(r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)[ \t]+\S", text, flags=re.M)


def _split_top(body: str, sep: str) -> list[str]:
    """Split on sep outside braces/brackets/parentheses."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in body:
        if ch in "{[(":
            depth += 1
        elif ch in "}])":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _declarator_name(decl: str) -> str:
    assert "(" not in decl, f"function-pointer fields are not handled: {decl!r}"
    decl = re.sub(r"\[[^\]]*\]", "", decl).strip()
    m = re.search(r"([A-Za-z_]\w*)\s*$", decl)
    assert m, f"cannot parse field declarator {decl!r}"
    return m.group(1)


def _struct_fields(body: str, prefix: str = "") -> list[str]:
    """Field paths of a struct body; members of nested structs as a.b."""
    out: list[str] = []
    for stmt in _split_top(body, ";"):
        if "{" in stmt:  # struct { ... } name  (or union)
            inner = stmt[stmt.index("{") + 1:stmt.rindex("}")]
            names = [_declarator_name(d) for d in _split_top(stmt[stmt.rindex("}") + 1:], ",")]
            for n in names:
                out.append(prefix + n)
                out.extend(_struct_fields(inner, prefix + n + "."))
        else:
            decls = _split_top(stmt, ",")
            out.extend(prefix + _declarator_name(d) for d in decls)
    return out


def parse_structs(text: str) -> dict[str, list[str]]:
    """typedef struct TAG { ... } Name;  ->  Name -> field paths."""
    structs: dict[str, list[str]] = {}
    for m in re.finditer(r"\btypedef\s+(?:struct|union)\s*\w*\s*\{", text):
        depth, i = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        body = text[m.end():i - 1]
        name = re.match(r"\s*([A-Za-z_]\w*)\s*;", text[i:])
        assert name, f"cannot parse typedef name after struct at {text[m.start():m.start() + 60]!r}"
        structs[name.group(1)] = _struct_fields(body)
    return structs


def parse_typedefs(text: str) -> list[str]:
    """Names of complete single-line typedefs (incomplete struct types skipped)."""
    names = []
    for m in re.finditer(r"\btypedef\s+([^;{}]+?)\b([A-Za-z_]\w*)\s*;", text):
        target = m.group(1).strip()
        if re.fullmatch(r"(struct|union)\s+\w+", target):
            continue  # opaque here; cuda.h may define it, nothing to compare
        names.append(m.group(2))
    return names


def parsed() -> dict[str, Any]:
    text = cuda_section()
    return {
        "prototypes": parse_prototypes(text),
        "enums": parse_enum_constants(text),
        "macros": parse_macros(text),
        "structs": parse_structs(text),
        "typedefs": parse_typedefs(text) + list(parse_structs(text)),
    }


# ---------------------------------------------------------------------------
# Compiling
# ---------------------------------------------------------------------------

def _compile(src: str, path: Path, cuda_inc: Path,
             link: bool = False) -> subprocess.CompletedProcess[str]:
    path.write_text(src)
    out = path.with_suffix("" if link else ".o")
    cmd = ["gcc", *CFLAGS, f"-I{cuda_inc}", f"-I{VGPU_INCLUDE}"]
    cmd += ["-o", str(out), str(path)] if link else ["-c", "-o", str(out), str(path)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def declared_by_cuda_h(cuda_inc: Path, tmp: Path, legacy: bool) -> set[str]:
    """Names of the CUresult functions cuda.h declares (in plain or legacy mode)."""
    src = ("#define __CUDA_API_VERSION_INTERNAL\n" if legacy else "") + "#include <cuda.h>\n"
    f = tmp / ("legacy_probe.c" if legacy else "probe.c")
    f.write_text(src)
    p = subprocess.run(["gcc", "-E", *CFLAGS, "-DCUDAAPI=", f"-I{cuda_inc}", str(f)],
                       capture_output=True, text=True, timeout=120, check=True)
    return set(re.findall(r"\bCUresult\s+(cu\w+)\s*\(", p.stdout))


def redeclaration_source(protos: dict[str, str], legacy: bool) -> str:
    lines = ["/* generated by tests/libvgpu/test_abi.py */"]
    if legacy:
        lines.append("#define __CUDA_API_VERSION_INTERNAL")
    lines.append("#include <cuda.h>")
    for name, text in protos.items():
        lines += [
            f"#undef {name}",
            # Refers to cuda.h's declaration: an error if cuda.h declares no such
            # function, so the redeclaration below can never be the first one.
            f"extern __typeof__({name}) {name};",
            text,
        ]
    return "\n".join(lines) + "\n"


def _conflicts(stderr: str) -> list[str]:
    return sorted(set(re.findall(r"conflicting types for .(cu\w+).", stderr)))


def check_redeclarations(protos: dict[str, str], cuda_inc: Path, tmp: Path,
                         legacy: bool) -> subprocess.CompletedProcess[str]:
    name = "redeclare_legacy.c" if legacy else "redeclare.c"
    return _compile(redeclaration_source(protos, legacy), tmp / name, cuda_inc)


def layout_source(include: str, info: dict[str, Any]) -> str:
    """A program printing the layout/value JSON for vgpu_cuda.h's declarations."""
    out = ["/* generated by tests/libvgpu/test_abi.py */",
           "#include <stddef.h>", "#include <stdint.h>", "#include <stdio.h>",
           include, "int main(void) {", '    printf("{\\"struct\\": {");']
    for si, (sname, fields) in enumerate(info["structs"].items()):
        sep = ", " if si else ""
        head = f'{sep}\\"{sname}\\": {{\\"size\\": %zu, \\"align\\": %zu, \\"fields\\": {{'
        out.append(f'    printf("{head}", sizeof({sname}), (size_t)_Alignof({sname}));')
        for fi, f in enumerate(fields):
            fsep = ", " if fi else ""
            out.append(f'    printf("{fsep}\\"{f}\\": [%zu, %zu]", offsetof({sname}, {f}),'
                       f" sizeof((({sname} *)0)->{f}));")
        out.append('    printf("}}");')
    out.append('    printf("}, \\"typedef\\": {");')
    for i, t in enumerate(info["typedefs"]):
        sep = ", " if i else ""
        out.append(f'    printf("{sep}\\"{t}\\": [%zu, %zu]", sizeof({t}), (size_t)_Alignof({t}));')
    out.append('    printf("}, \\"enum\\": {");')
    for i, e in enumerate(info["enums"]):
        sep = ", " if i else ""
        out.append(f'    printf("{sep}\\"{e}\\": %lld", (long long)({e}));')
    out.append('    printf("}, \\"macro\\": {");')
    for i, mname in enumerate(info["macros"]):
        sep = ", " if i else ""
        out.append(f'    printf("{sep}\\"{mname}\\": %lld", (long long)(intptr_t)({mname}));')
    out += ['    printf("}}\\n");', "    return 0;", "}"]
    return "\n".join(out) + "\n"


def layout_json(include: str, info: dict[str, Any], cuda_inc: Path, path: Path) -> dict[str, Any]:
    p = _compile(layout_source(include, info), path, cuda_inc, link=True)
    assert p.returncode == 0, f"compiling {path.name} ({include}) failed:\n{p.stderr}"
    run = subprocess.run([str(path.with_suffix(""))], capture_output=True, text=True,
                         timeout=60, check=True)
    result: dict[str, Any] = json.loads(run.stdout)
    return result


def _diff(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in list(a) + [k for k in b if k not in a]:
            if k not in a or k not in b:
                out.append(f"{path}{k}: vgpu_cuda.h={a.get(k)!r} cuda.h={b.get(k)!r}")
            else:
                out.extend(_diff(a[k], b[k], f"{path}{k}."))
        return out
    return [] if a == b else [f"{path.rstrip('.')}: vgpu_cuda.h={a!r} cuda.h={b!r}"]


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------

def test_header_parse_covers_known_declarations() -> None:
    """The parser finds what we know is there (so coverage cannot quietly shrink)."""
    info = parsed()
    assert {"cuMemAlloc_v2", "cuMemCreate", "cuLaunchKernel", "cuGraphAddKernelNode_v2",
            "cuGetProcAddress_v2", "cuMemGetInfo_v2"} <= set(info["prototypes"])
    assert len(info["prototypes"]) >= 100
    assert not any(n.startswith("nvml") for n in info["prototypes"])
    assert {"CUuuid", "CUmemLocation", "CUmemAllocationProp", "CUmemAccessDesc",
            "CUmemPoolProps", "CUDA_ARRAY_DESCRIPTOR", "CUDA_ARRAY3D_DESCRIPTOR",
            "CUlaunchConfig", "CUDA_KERNEL_NODE_PARAMS_v2"} <= set(info["structs"])
    assert "allocFlags.usage" in info["structs"]["CUmemAllocationProp"]
    assert info["structs"]["CUuuid"] == ["bytes"]
    assert {"CUDA_ERROR_OUT_OF_MEMORY", "CU_DEVICE_ATTRIBUTE_WARP_SIZE",
            "CU_GET_PROC_ADDRESS_SUCCESS", "CU_MEM_ALLOC_GRANULARITY_RECOMMENDED",
            "CU_AD_FORMAT_FLOAT", "CU_STREAM_CAPTURE_STATUS_INVALIDATED"} <= set(info["enums"])
    assert {"CUresult", "CUdevice", "CUdeviceptr"} <= set(info["typedefs"])
    assert "CU_STREAM_LEGACY" in info["macros"] and "VGPU_CUDA_H" not in info["macros"]


def test_prototypes_match_cuda_h(cuda_include: Path, tmp_path: Path) -> None:
    protos = parsed()["prototypes"]
    plain = declared_by_cuda_h(cuda_include, tmp_path, legacy=False)
    legacy = declared_by_cuda_h(cuda_include, tmp_path, legacy=True)
    undeclared = sorted(n for n in protos if n not in plain and n not in legacy)
    assert not undeclared, (f"cuda.h in {cuda_include} declares none of {undeclared}, "
                            "so their prototypes cannot be checked")

    failures = []
    for is_legacy, names in ((False, [n for n in protos if n in plain]),
                             (True, [n for n in protos if n not in plain])):
        if not names:
            continue
        p = check_redeclarations({n: protos[n] for n in names}, cuda_include, tmp_path, is_legacy)
        if p.returncode != 0:
            mode = " (with __CUDA_API_VERSION_INTERNAL)" if is_legacy else ""
            bad = _conflicts(p.stderr)
            detail = "".join(f"\n  {n}: vgpu_cuda.h has `{' '.join(protos[n].split())}`"
                             for n in bad)
            failures.append(f"prototypes conflict with cuda.h{mode}: {bad}{detail}\n"
                            f"gcc said:\n{p.stderr}")
    assert not failures, "\n\n".join(failures)


def test_wrong_prototype_is_rejected(cuda_include: Path, tmp_path: Path) -> None:
    """The redeclaration check does catch a mismatch (it cannot pass vacuously)."""
    wrong = {"cuMemAlloc_v2": "CUresult cuMemAlloc_v2(CUdeviceptr *dptr, int bytesize);"}
    p = check_redeclarations(wrong, cuda_include, tmp_path, legacy=False)
    assert p.returncode != 0, "a wrong cuMemAlloc_v2 prototype compiled against cuda.h"
    assert _conflicts(p.stderr) == ["cuMemAlloc_v2"], p.stderr

    # A function cuda.h does not declare is an error too, not a free pass.
    ghost = {"cuVgpuNoSuchFunction": "CUresult cuVgpuNoSuchFunction(int x);"}
    p = check_redeclarations(ghost, cuda_include, tmp_path, legacy=False)
    assert p.returncode != 0 and "cuVgpuNoSuchFunction" in p.stderr, p.stderr

    # And the real prototype compiles.
    right = {"cuMemAlloc_v2": "CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);"}
    p = check_redeclarations(right, cuda_include, tmp_path, legacy=False)
    assert p.returncode == 0, p.stderr


def test_layouts_and_values_match_cuda_h(cuda_include: Path, tmp_path: Path) -> None:
    info = parsed()
    ours = layout_json('#include "vgpu_cuda.h"', info, cuda_include, tmp_path / "layout_vgpu.c")
    theirs = layout_json("#include <cuda.h>", info, cuda_include, tmp_path / "layout_cuda.c")
    # Both programs print exactly what was parsed.
    assert set(ours["struct"]) == set(info["structs"])
    assert len(ours["enum"]) == len(set(info["enums"]))
    for key in ("CUresult", "CUdevice", "CUdeviceptr"):
        assert ours["typedef"][key] == theirs["typedef"][key], key
    diffs = _diff(ours, theirs)
    assert not diffs, "vgpu_cuda.h differs from cuda.h:\n  " + "\n  ".join(diffs)
