#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Generate simgpu's driver entry-point table and "not supported" stubs.

Run by hand when the CUDA toolkit headers move to a new release; the outputs
are committed, so the build never needs a CUDA toolkit:

    python3 tools/gen_cuda_procs.py [--include /usr/local/cuda/include] [--check]

Reads
    cudaTypedefs.h (+ cudaGLTypedefs.h, cudaEGLTypedefs.h, cudaVDPAUTypedefs.h,
    cudaProfilerTypedefs.h when present): one `PFN_<base>_v<version>[_ptds|_ptsz]`
    typedef per entry point the driver serves through cuGetProcAddress;
    cuda.h (+ cudaGL.h, cudaVDPAU.h): the `#define cuX cuX_vN` lines that name
    the newest exported symbol of each base name, and the CUDAAPI declarations.
Writes
    libvgpu/simgpu/cuda_stubs.c  a weak `CUresult sym(void)` returning
                                 CUDA_ERROR_NOT_SUPPORTED for every exported
                                 symbol (a real definition elsewhere wins);
    libvgpu/simgpu/cuda_procs.c  simgpu_proc_lookup(): the sorted table
                                 {base, version, flavour, symbol, pointer} and
                                 a binary search on the base name.
--check writes nothing and exits 1 when the committed files differ.

How a typedef maps to an exported symbol (the rule, verified against cuda.h):
  * Default-stream variants of one base, sorted by version, are exported as
    base, base_v2, base_v3, ...  (cuCtxCreate: v2000 -> cuCtxCreate,
    v3020 -> cuCtxCreate_v2, v11040 -> cuCtxCreate_v3, v12050 -> cuCtxCreate_v4).
    Old variants only declared under __CUDA_API_VERSION_INTERNAL still count:
    they are why cuMemAlloc@3010 resolves to the v1 symbol cuMemAlloc.
  * A _ptds/_ptsz variant is the per-thread-stream flavour of the newest
    default variant not newer than it, and is exported under that variant's
    name plus the suffix (PFN_cuMemcpyHtoD_v7000_ptds -> cuMemcpyHtoD_v2_ptds,
    because cuMemcpyHtoD_v2 is v3020). In the table a per-thread row carries
    the version of the default variant it shadows, so the lookup picks the
    entry point by version first and then its flavour: the real driver serves
    cuMemcpy_ptds for ("cuMemcpy", 4000, PER_THREAD_DEFAULT_STREAM) although
    the _ptds typedef says 7000 (cuda-bindings asks exactly that).
  * Every `#define cuX cuY` / `#define cuX __CUDA_API_PT??(cuY)` in cuda.h
    must name the symbol the rule gives for the newest variant of cuX, and
    every versioned CUDAAPI declaration must be a generated symbol. Where the
    header disagrees, an entry in EXCEPTIONS says what to do, and the
    generator prints it; an unexplained disagreement is an error.
"""
from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT_STUBS = ROOT / "libvgpu/simgpu/cuda_stubs.c"
OUT_PROCS = ROOT / "libvgpu/simgpu/cuda_procs.c"

# (typedef header, header with the #define lines and declarations)
HEADERS = [
    ("cudaTypedefs.h", "cuda.h"),
    ("cudaProfilerTypedefs.h", "cudaProfiler.h"),
    ("cudaGLTypedefs.h", "cudaGL.h"),
    ("cudaEGLTypedefs.h", "cudaEGL.h"),
    ("cudaVDPAUTypedefs.h", "cudaVDPAU.h"),
]

# Implemented by the hand-written part of simgpu with prototypes that are not
# `CUresult f(void)`-compatible in spirit (they are the lookup machinery
# itself); no stub is generated, and the table refers to them weakly.
NO_STUB = {"cuGetProcAddress", "cuGetProcAddress_v2", "cuGetErrorName", "cuGetErrorString"}

# Header facts the numbering rule does not explain, keyed by base name.
#   alias: (version, symbol) - from `version` on, the base resolves to another
#          exported entry point (an extra default-flavour table row).
EXCEPTIONS = {
    # cuda.h: `#define cuGraphInstantiate cuGraphInstantiateWithFlags` since
    # CUDA 12.0, and the 5-argument PFN_cuGraphInstantiate_v10000/_v11000
    # typedefs moved under __CUDA_API_VERSION_INTERNAL. A caller built
    # against 12.x that asks for "cuGraphInstantiate" expects the 3-argument
    # (exec, graph, flags) signature, i.e. cuGraphInstantiateWithFlags.
    "cuGraphInstantiate": {"alias": (12000, "cuGraphInstantiateWithFlags")},
}

PFN_RE = re.compile(r"\bPFN_(cu\w+?)_v(\d+)(_ptds|_ptsz)?\)\s*\(")
DEFINE_RE = re.compile(
    r"^\s*#define\s+(cu\w+)\s+(?:__CUDA_API_PT(DS|SZ)\(\s*(cu\w+)\s*\)|(cu\w+))\s*$")
DECL_RE = re.compile(r"\bCUDAAPI\s+(cu\w+)\s*\(")

FLAVOURS = {"": "SG_DEFAULT", "_ptds": "SG_PTDS", "_ptsz": "SG_PTSZ"}


def active_lines(text: str):
    """Lines outside `#ifdef _WIN32` blocks (Windows-only entry points)."""
    stack: list[bool] = []  # True = this block is Windows-only
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#if"):
            stack.append(bool(re.match(r"#if(def\s+_WIN32\b|\s+defined\s*\(?\s*_WIN32\b)", s)))
            continue
        if s.startswith("#else") and stack:
            stack[-1] = False  # the #else of a Windows-only block is not
            continue
        if s.startswith("#endif"):
            if stack:
                stack.pop()
            continue
        if not any(stack):
            yield line


def read_typedefs(inc: Path):
    """{base: [(version, suffix)]} over all typedef headers present."""
    variants: dict[str, set[tuple[int, str]]] = defaultdict(set)
    sources = []
    for tdh, _ in HEADERS:
        p = inc / tdh
        if not p.exists():
            if tdh == "cudaTypedefs.h":
                sys.exit(f"{p}: not found (pass --include DIR)")
            continue
        sources.append(tdh)
        for line in active_lines(p.read_text()):
            for base, ver, suf in PFN_RE.findall(line):
                variants[base].add((int(ver), suf or ""))
    return {b: sorted(v) for b, v in variants.items()}, sources


def read_defines_and_decls(inc: Path):
    defines: dict[str, str] = {}
    decls: set[str] = set()
    for _, hdr in HEADERS:
        p = inc / hdr
        if not p.exists():
            continue
        text = p.read_text()
        # The mapping #defines sit before the API declarations; the later
        # cuGetProcAddress_v2 -> cuGetProcAddress_v2_ptsz define names a
        # static inline helper, not an export.
        head = text.split("#define CUDA_VERSION", 1)[0] if hdr == "cuda.h" else text
        for line in head.splitlines():
            m = DEFINE_RE.match(line)
            if m:
                name, pt, inner, plain = m.groups()
                defines[name] = inner if pt else plain
        decls |= set(DECL_RE.findall("\n".join(active_lines(text))))
    return defines, decls


def build(variants):
    """Rows (base, version, flavour suffix, symbol) and the symbol list."""
    rows = []
    for base, vs in variants.items():
        defaults = [v for v, s in vs if s == ""]
        if not defaults:
            sys.exit(f"{base}: only per-thread variants {vs}")
        names = {}
        for i, v in enumerate(defaults):
            names[v] = base if i == 0 else f"{base}_v{i + 1}"
            rows.append((base, v, "", names[v]))
        seen = set()
        for v, suf in vs:
            if not suf:
                continue
            shadow = max((d for d in defaults if d <= v), default=None)
            if shadow is None:
                sys.exit(f"{base}: {suf} variant v{v} older than every default variant")
            if (shadow, suf) in seen:
                sys.exit(f"{base}: two {suf} variants shadow v{shadow}")
            seen.add((shadow, suf))
            rows.append((base, shadow, suf, names[shadow] + suf))
    return rows


def check(rows, variants, defines, decls):
    """Compare the rule with the headers; return (exceptions report, errors)."""
    symbols = {r[3] for r in rows}
    newest = {}
    for base, ver, suf, sym in rows:
        if suf == "" and (base not in newest or ver > newest[base][0]):
            newest[base] = (ver, sym)
    report, errors = [], []
    for name, target in sorted(defines.items()):
        if name == target:
            # `#define cuX __CUDA_API_PTSZ(cuX)` (per-thread block): only says
            # cuX_ptsz exists; ptds_defines_check() verifies that.
            continue
        if name in variants:
            want = newest[name][1]
            if target == want:
                continue
            errors.append(f"#define {name} {target}: rule gives {want}")
        elif target not in symbols:
            # e.g. #define cuStreamGetCtx_v2 __CUDA_API_PTSZ(cuStreamGetCtx_v2)
            errors.append(f"#define {name} -> {target}: not a generated symbol")
    for name, exc in EXCEPTIONS.items():
        if name not in variants:
            errors.append(f"EXCEPTIONS names unknown base {name}")
        if "alias" in exc and exc["alias"][1] not in symbols:
            errors.append(f"EXCEPTIONS alias target {exc['alias'][1]} is not a symbol")
    for base, exc in sorted(EXCEPTIONS.items()):
        if "alias" in exc:
            ver, target = exc["alias"]
            numbered = max(((v, n) for b, v, f, n in rows if b == base and not f and n != target))
            report.append(f"{base}: cuda.h maps it to {target}, which the numbering rule "
                          f"cannot give (its own newest is {numbered[1]}, v{numbered[0]}); "
                          f"table row {base}@{ver} -> {target}")
    for base, (ver, sym) in sorted(newest.items()):
        if sym != base and defines.get(base, base) == base:
            report.append(f"{base}: newest variant {sym} (v{ver}) is a separately named API, "
                          f"cuda.h keeps the plain name on the old one; served for "
                          f"requests >= {ver} (as the PFN_{base}_v{ver} typedef says)")
    for d in sorted(decls):
        if d not in symbols and d not in variants:
            errors.append(f"cuda.h declares {d}, which no typedef produces")
    return report, errors


def ptds_defines_check(inc: Path, symbols):
    """Every __CUDA_API_PT??(x) in the headers must be an exported x_pt?? symbol."""
    errs = []
    for _, hdr in HEADERS:
        p = inc / hdr
        if p.exists():
            for pt, inner in re.findall(r"__CUDA_API_PT(DS|SZ)\(\s*(cu\w+)\s*\)", p.read_text()):
                if f"{inner}_pt{pt.lower()}" not in symbols:
                    errs.append(f"{hdr}: {inner}_pt{pt.lower()} is not generated")
    return errs


HEADER_NOTE = """\
/* SPDX-License-Identifier: Apache-2.0 */
/* GENERATED by tools/gen_cuda_procs.py from the CUDA {cuda} headers
 * ({sources}). Do not edit; rerun the generator. */
"""


def emit_stubs(symbols, cuda, sources) -> str:
    out = [HEADER_NOTE.format(cuda=cuda, sources=", ".join(sources)), """\
/*
 * cuda_stubs.c - one weak "not supported" definition per driver entry point.
 *
 * simgpu exports every symbol a real libcuda.so.1 exports (so that dlsym,
 * direct linking and third-party bindings that resolve every name all
 * work). Entry points simgpu implements are defined, with their real
 * prototypes, in the other cuda_*.c files: those strong definitions replace
 * these weak ones at link time. The rest return CUDA_ERROR_NOT_SUPPORTED,
 * as a real driver does for a feature the device lacks.
 *
 * The stubs take no parameters. Calling them through a pointer of the real
 * type, with arguments, is safe in the x86-64 System V and AArch64 (AAPCS64)
 * C ABIs: arguments travel in registers or in the caller's stack area, the
 * caller owns and cleans up that area, and the callee ignores what it does
 * not read; the CUresult comes back in eax/w0 either way.
 *
 * This file deliberately does not include vgpu_cuda.h: its prototypes would
 * conflict with these (void) definitions.
 */
#include "simgpu_api.h"

typedef int CUresult;
enum { CUDA_ERROR_NOT_SUPPORTED = 801 };

"""]
    for s in symbols:
        out.append(f"SIMGPU_STUB CUresult {s}(void) {{ return CUDA_ERROR_NOT_SUPPORTED; }}\n")
    return "".join(out)


def emit_procs(rows, cuda, sources) -> str:
    rows = sorted(rows, key=lambda r: (r[0].encode(), r[1], r[2]))
    syms = sorted({r[3] for r in rows})
    out = [HEADER_NOTE.format(cuda=cuda, sources=", ".join(sources)), """\
/*
 * cuda_procs.c - simgpu_proc_lookup(): what cuGetProcAddress(_v2) returns.
 *
 * One row per exported entry point: {base name, version, flavour, symbol,
 * pointer}, sorted by base name (strcmp order) and then version. For a
 * default-stream row the version is the CUDA version that introduced that
 * variant; a per-thread-stream row (_ptds/_ptsz) carries the version of the
 * default-stream variant it is the per-thread flavour of.
 *
 * Lookup, as the real driver does it: binary-search the base name; take the
 * newest default row whose version <= the requested one (none: the caller
 * asked for a version older than the entry point); with
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (and not LEGACY_STREAM) use
 * that variant's _ptds/_ptsz row when it has one.
 *
 * The pointers refer to the weak stubs in cuda_stubs.c or, where simgpu
 * implements the entry point, to the real definition that replaced the stub.
 * The symbols are declared here with a dummy type; only their addresses are
 * used. cuGetProcAddress(_v2) and cuGetErrorName/String have no stubs and are
 * referenced weakly: if absent, their rows read as "not found".
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cuda_procs.h"

enum { SG_DEFAULT = 0, SG_PTDS = 1, SG_PTSZ = 2 };
enum { SG_PROC_SUCCESS = 0, SG_PROC_SYMBOL_NOT_FOUND = 1, SG_PROC_VERSION_NOT_SUFFICIENT = 2 };
enum { SG_FLAG_LEGACY_STREAM = 1, SG_FLAG_PER_THREAD_DEFAULT_STREAM = 2 };

typedef int CUresult;

"""]
    for s in syms:
        weak = " __attribute__((weak))" if s in NO_STUB else ""
        out.append(f"extern CUresult {s}(void){weak};\n")
    out.append("""
struct sg_proc {
    const char *base;
    int version;
    int flavour;
    const char *symbol;
    CUresult (*fn)(void);
};

static const struct sg_proc sg_procs[] = {
""")
    for base, ver, suf, sym in rows:
        out.append(f'    {{"{base}", {ver}, {FLAVOURS[suf]}, "{sym}", {sym}}},\n')
    out.append("""};

#define SG_NPROCS (sizeof(sg_procs) / sizeof(sg_procs[0]))

int simgpu_proc_lookup(const char *symbol, int cuda_version, uint64_t flags, void **pfn)
{
    size_t lo = 0, hi = SG_NPROCS;
    const struct sg_proc *best = NULL, *p;
    int per_thread;

    if (pfn)
        *pfn = NULL;
    if (!symbol || !pfn)
        return SG_PROC_SYMBOL_NOT_FOUND;

    /* lower bound: first row whose base is >= symbol */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(sg_procs[mid].base, symbol) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == SG_NPROCS || strcmp(sg_procs[lo].base, symbol) != 0)
        return SG_PROC_SYMBOL_NOT_FOUND;

    for (p = &sg_procs[lo]; p < sg_procs + SG_NPROCS && strcmp(p->base, symbol) == 0; p++) {
        if (p->flavour == SG_DEFAULT && p->fn && p->version <= cuda_version &&
            (!best || p->version > best->version))
            best = p;
    }
    if (!best) {
        for (p = &sg_procs[lo]; p < sg_procs + SG_NPROCS && strcmp(p->base, symbol) == 0; p++)
            if (p->fn)
                return SG_PROC_VERSION_NOT_SUFFICIENT;
        return SG_PROC_SYMBOL_NOT_FOUND;
    }

    per_thread = (flags & SG_FLAG_PER_THREAD_DEFAULT_STREAM) && !(flags & SG_FLAG_LEGACY_STREAM);
    if (per_thread) {
        for (p = &sg_procs[lo]; p < sg_procs + SG_NPROCS && strcmp(p->base, symbol) == 0; p++) {
            if (p->flavour != SG_DEFAULT && p->version == best->version && p->fn) {
                best = p;
                break;
            }
        }
    }
    *pfn = (void *)best->fn;
    return SG_PROC_SUCCESS;
}
""")
    return "".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--include", default="/usr/local/cuda/include", type=Path)
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 if the committed files are stale")
    a = ap.parse_args()

    inc = a.include
    variants, sources = read_typedefs(inc)
    m = re.search(r"#define\s+CUDA_VERSION\s+(\d+)", (inc / "cuda.h").read_text())
    cuda_num = int(m.group(1)) if m else 0
    cuda = f"{cuda_num // 1000}.{cuda_num % 1000 // 10}"
    defines, decls = read_defines_and_decls(inc)
    rows = build(variants)
    for base, exc in EXCEPTIONS.items():
        if "alias" in exc:
            ver, target = exc["alias"]
            rows.append((base, ver, "", target))
    symbols = sorted({r[3] for r in rows})
    report, errors = check(rows, variants, defines, decls)
    errors += ptds_defines_check(inc, set(symbols))
    if errors:
        print("gen_cuda_procs: the headers disagree with the mapping rule:", file=sys.stderr)
        for e in errors:
            print("  " + e, file=sys.stderr)
        return 2

    print(f"CUDA {cuda} ({', '.join(sources)}): {len(variants)} base names, "
          f"{len(rows)} table rows, {len(symbols)} exported symbols, "
          f"{len([s for s in symbols if s not in NO_STUB])} stubs")
    print("version-mapping exceptions:")
    for r in report:
        print("  " + r)
    multi = sum(1 for vs in variants.values() if len({v for v, s in vs if not s}) > 1)
    print(f"  (rule base, base_v2, ... confirmed for {multi} multi-version base names "
          f"and {len(defines)} #define lines)")

    outputs = {OUT_STUBS: emit_stubs([s for s in symbols if s not in NO_STUB], cuda, sources),
               OUT_PROCS: emit_procs(rows, cuda, sources)}
    stale = [p for p, t in outputs.items() if not p.exists() or p.read_text() != t]
    if a.check:
        for p in stale:
            print(f"stale: {p.relative_to(ROOT)}", file=sys.stderr)
        return 1 if stale else 0
    for p in stale:
        p.write_text(outputs[p])
        print(f"wrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
