# SPDX-License-Identifier: Apache-2.0
"""The glibc baseline: libvgpu.so (preloaded into workload images) and the compiled
programs (run on the node) need no glibc symbol version newer than the Makefile's
GLIBC_BASELINE, which docs/kubernetes.md states; scripts/check-glibc.py tells."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import ROOT

CHECK = ROOT / "scripts" / "check-glibc.py"


def baseline() -> str:
    m = re.search(r"^GLIBC_BASELINE\s*:=\s*(\S+)$", (ROOT / "Makefile").read_text(),
                  re.MULTILINE)
    assert m, "the Makefile sets no GLIBC_BASELINE"
    return m.group(1)


def check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CHECK), *args], capture_output=True,
                          text=True, timeout=60)


def test_the_build_needs_no_glibc_newer_than_the_baseline() -> None:
    p = subprocess.run(["make", "-s", "-C", str(ROOT), "check-glibc"], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"(baseline {baseline()})" in p.stdout


def test_the_docs_state_the_makefiles_baseline() -> None:
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    assert f"glibc {baseline()}" in text


@pytest.fixture(scope="module")
def memcpy_2_14(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A program bound to memcpy@GLIBC_2.14 (x86-64's current memcpy) and nothing newer."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    d = tmp_path_factory.mktemp("glibc")
    src = d / "prog.c"
    src.write_text('#include <string.h>\n'
                   '__asm__(".symver memcpy, memcpy@GLIBC_2.14");\n'
                   'int main(int argc, char **argv) {\n'
                   '    char buf[8];\n'
                   '    memcpy(buf, argv[0], sizeof(buf));\n'
                   '    return buf[argc] == 0;\n'
                   '}\n')
    # A shared object: no __libc_start_main@GLIBC_2.34 from the start files.
    out = d / "libprog.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-fno-builtin", "-o", str(out), str(src)],
                   check=True)
    return out


@pytest.mark.parametrize(("base", "rc"), [("2.13", 1), ("2.14", 0), ("2.9", 1), ("3.0", 0)],
                         ids=["older-fails", "same-passes", "2.9-is-older", "newer-passes"])
def test_a_file_fails_exactly_when_it_needs_more_than_the_baseline(memcpy_2_14, base,
                                                                   rc) -> None:
    p = check(base, str(memcpy_2_14))
    assert p.returncode == rc, p.stdout + p.stderr
    if rc:
        [line] = p.stderr.splitlines()
        assert line == (f"check-glibc: {memcpy_2_14} needs a glibc newer than the baseline "
                        f"{base}: memcpy@GLIBC_2.14"), line


@pytest.mark.parametrize(("args", "message"), [
    (["2.x", "prog"], "check-glibc: baseline '2.x' is not a glibc version such as 2.34"),
    (["2.34", "/nonexistent/prog"], "check-glibc: failed to read /nonexistent/prog: "),
    ([], "usage: check-glibc.py BASELINE FILE..."),
], ids=["bad-baseline", "missing-file", "no-arguments"])
def test_bad_arguments_get_one_line_and_exit_2(args, message) -> None:
    p = check(*args)
    assert p.returncode == 2
    [line] = p.stderr.splitlines()
    assert line.startswith(message), line
