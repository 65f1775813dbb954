#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Check that ELF files need no glibc newer than a baseline.

    check-glibc.py BASELINE FILE...     (e.g. check-glibc.py 2.34 build/libvgpu.so)

libvgpu.so is preloaded into workload images and the compiled programs run on the node,
so neither may need a glibc symbol version (GLIBC_x.y) newer than the oldest glibc vgpu
says it supports: the Makefile's GLIBC_BASELINE (`make check-glibc`). A compiler or base
image that binds a newer version (Debian 13's C23 headers bind strtol to
__isoc23_strtol@GLIBC_2.38) fails here instead of on a user's node. Prints one line per
file that needs more, naming the symbols; exit 0 when none does, 1 when one does, 2 on
bad arguments. Reads the dynamic symbols with binutils' readelf (gcc brings it).
"""
from __future__ import annotations

import re
import subprocess
import sys

_VERSION = re.compile(r"@GLIBC_(\d+)\.(\d+)(?:\.(\d+))?\b")
_BASELINE = re.compile(r"(\d+)\.(\d+)")


def needed(path: str) -> dict[tuple[int, ...], set[str]]:
    """GLIBC version -> the undefined dynamic symbols of `path` bound to it."""
    out = subprocess.run(["readelf", "--dyn-syms", "--wide", path], capture_output=True,
                         text=True, check=True).stdout
    found: dict[tuple[int, ...], set[str]] = {}
    for line in out.splitlines():
        fields = line.split()
        # Num: Value Size Type Bind Vis Ndx Name; only what the file takes from glibc (UND).
        if len(fields) < 8 or fields[6] != "UND":
            continue
        m = _VERSION.search(fields[7])
        if m:
            version = tuple(int(g) for g in m.groups() if g is not None)
            found.setdefault(version, set()).add(fields[7].split("@")[0])
    return found


def main(argv: list[str]) -> int:
    """Check every file named; one line per file that needs more than the baseline."""
    if len(argv) < 2:
        print("usage: check-glibc.py BASELINE FILE...", file=sys.stderr)
        return 2
    m = _BASELINE.fullmatch(argv[0])
    if m is None:
        print(f"check-glibc: baseline {argv[0]!r} is not a glibc version such as 2.34",
              file=sys.stderr)
        return 2
    baseline = (int(m.group(1)), int(m.group(2)))
    failed = 0
    top: tuple[int, ...] = ()
    for path in argv[1:]:
        try:
            versions = needed(path)
        except (OSError, subprocess.CalledProcessError) as e:
            cause = e.stderr.strip() if isinstance(e, subprocess.CalledProcessError) else e
            print(f"check-glibc: failed to read {path}: {cause}", file=sys.stderr)
            return 2
        over = {v: s for v, s in versions.items() if v > baseline}
        if versions:
            top = max(top, *versions)
        if over:
            failed += 1
            names = ", ".join(f"{sym}@GLIBC_{'.'.join(map(str, v))}"
                              for v in sorted(over) for sym in sorted(over[v]))
            print(f"check-glibc: {path} needs a glibc newer than the baseline {argv[0]}: "
                  f"{names}", file=sys.stderr)
    if failed:
        return 1
    shown = ".".join(map(str, top)) if top else "none"
    print(f"check-glibc: {len(argv) - 1} files need at most GLIBC_{shown} "
          f"(baseline {argv[0]})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
