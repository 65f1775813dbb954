# SPDX-License-Identifier: Apache-2.0
"""Every value the compiled programs share with Python is the same in both languages.

A tiny C program, compiled against the real headers, prints each shared macro as the
compiler sees it; each is compared with its one Python definition. Every macro of
oci_hook/native/vg_defaults.h (the C side's one place for them) must have a Python twin
below: a value added there without one fails here. The region and sched layouts and
their constants (VG_SLOTS_MAX too) are pinned field by field in
tests/arbiter/files/test_region_file.py and
tests/arbiter/files/test_sched_files.py.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from support.paths import ROOT

from arbiter import defaults
from arbiter.config import Config
from arbiter.files import region_file as rg
from arbiter.files import sched_files as sched
from arbiter.files.slice_dirs import region_name
from arbiter.native import PROGRAMS
from oci_hook import cdi
from oci_hook.mounts import CONTAINER_SCHED_DIR
from oci_hook.request import ANNOTATION_PREFIX, CONTAINER_TYPE_KEYS, ENV_KEYS, SANDBOX
from shim import lifecycle

DEFAULTS_H = ROOT / "oci_hook" / "native" / "vg_defaults.h"
INCLUDE_DIRS = (ROOT / "oci_hook" / "native", ROOT / "shim" / "native",
                ROOT / "libvgpu" / "include")
_DEFINE = re.compile(r"^#define[ \t]+(VG_[A-Z0-9_]+)[ \t]+\S", re.MULTILINE)


def _shim_dir() -> str:
    """containerd-shim-vgpu-v2's private dir, as the Python side ships it (PROGRAMS)."""
    (runc,) = (p for p in PROGRAMS if p.endswith("/runc"))
    return runc.removesuffix("/runc")


def _env_prefix() -> str:
    """The one prefix (up to its first `_`) of every env request name Python accepts."""
    (prefix,) = {name.split("_", 1)[0] + "_" for name in ENV_KEYS}
    return prefix


def _lifecycle_suffix() -> str:
    grpc = Path("/x/vgpud.sock")
    return str(lifecycle.lifecycle_socket(grpc)).removeprefix(str(grpc))


#: vg_defaults.h macro -> its Python definition.
TWINS: dict[str, object] = {
    "VG_DEFAULT_CONFIG": str(defaults.DEFAULT_CONFIG_PATH),
    "VG_DEFAULT_RUN_DIR": str(defaults.DEFAULT_RUN_DIR),
    "VG_SOCKET_NAME": defaults.SOCKET_NAME,
    "VG_LIFECYCLE_SUFFIX": _lifecycle_suffix(),
    "VG_DEFAULT_WAIT_S": defaults.DEFAULT_WAIT_S,
    "VG_PROTOCOL_VERSION": lifecycle.VERSION,
    "VG_DEFAULT_LOWER": defaults.DEFAULT_LOWER_RUNTIME,
    "VG_ANNOTATION_PREFIX": ANNOTATION_PREFIX,
    "VG_CDI_ANNOTATION_PREFIX": cdi.ANNOTATION_PREFIX,
    # A pod's sandbox asks for nothing: containerd's CRI plugin's key, then CRI-O's.
    "VG_CRI_TYPE_KEY": CONTAINER_TYPE_KEYS[0],
    "VG_CRIO_TYPE_KEY": CONTAINER_TYPE_KEYS[1],
    "VG_SANDBOX_TYPE": SANDBOX,
    # The C pre-check's superset of the env requests Python accepts (VGPU_MEMORY, ...).
    "VG_ENV_PREFIX": _env_prefix(),
    "VG_SHIM_BIN_DIR": _shim_dir(),
}
#: vg_defaults.h macros only C needs, and why.
C_ONLY = {
    "VG_RUNC_SHIM": "containerd's runc shim: only containerd-shim-vgpu-v2 runs it",
}
#: Shared values that live in another header (its own concern), -> their Python twin.
ELSEWHERE: dict[str, object] = {
    # A lifecycle frame's largest body: vg_msg.c and shim.lifecycle refuse the same.
    "VG_MSG_MAX": lifecycle.MAX_FRAME,
    # libvgpu finds a slice's files and the scheduling files where vgpud and the hook
    # put them (the headers' integer constants are pinned by the layout tests).
    "VGPU_REGION_FILE_PREFIX": region_name(0).removesuffix("0"),
    "VGPU_USAGE_SUFFIX": rg.USAGE_SUFFIX,
    "VGPU_SCHED_CONTAINER_DIR": CONTAINER_SCHED_DIR,
    "VGPU_ENV_REGION_DIR": defaults.ENV_REGION_DIR,
    "VGPU_ENV_SCHED_DIR": defaults.ENV_SCHED_DIR,
    "VGPU_BROKER_LOCK_NAME": sched.BROKER_LOCK_NAME,
}
HEADERS = ("vg_defaults.h", "vg_msg.h", "vgpu_region.h", "vgpu_sched.h")


def test_every_macro_of_vg_defaults_has_a_python_twin() -> None:
    names = set(_DEFINE.findall(DEFAULTS_H.read_text()))
    assert names, f"no `#define VG_...` found in {DEFAULTS_H}"
    assert names - TWINS.keys() - C_ONLY.keys() == set(), "macros without a Python twin"
    assert TWINS.keys() - names == set(), "twins of macros vg_defaults.h no longer has"


@pytest.fixture(scope="module")
def c_values(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Each shared macro as the C compiler sees it through the real headers."""
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to read the C side's values")
    d = tmp_path_factory.mktemp("constants")
    names = [*TWINS, *ELSEWHERE]
    source = d / "print_constants.c"
    source.write_text(
        "#include <stdio.h>\n"
        + "".join(f'#include "{h}"\n' for h in HEADERS)
        + 'static void s(const char *n, const char *v) { printf("%s\\ts\\t%s\\n", n, v); }\n'
        + 'static void i(const char *n, long long v) { printf("%s\\ti\\t%lld\\n", n, v); }\n'
        + "#define SHOW(x) _Generic((x), char *: s, const char *: s, default: i)(#x, x)\n"
        + "int main(void) {\n"
        + "".join(f"    SHOW({n});\n" for n in names)
        + "    return 0;\n}\n")
    program = d / "print_constants"
    subprocess.run(["gcc", "-std=gnu11", "-Wall", "-Werror",
                    *(f"-I{p}" for p in INCLUDE_DIRS), "-o", str(program), str(source)],
                   check=True, capture_output=True, text=True, timeout=120)
    out = subprocess.run([str(program)], check=True, capture_output=True, text=True,
                         timeout=30).stdout
    values: dict[str, object] = {}
    for line in out.splitlines():
        name, kind, value = line.split("\t", 2)
        values[name] = value if kind == "s" else int(value)
    return values


@pytest.mark.parametrize("name", [*TWINS, *ELSEWHERE])
def test_c_and_python_agree(c_values: dict[str, object], name: str) -> None:
    python = {**TWINS, **ELSEWHERE}[name]
    assert c_values[name] == python, f"{name}: C {c_values[name]!r}, Python {python!r}"


def test_python_defaults_are_the_shared_ones() -> None:
    """arbiter.config's built-in config is made of the shared values (no copy of its own)."""
    c = Config()
    assert c.socket == defaults.DEFAULT_RUN_DIR / defaults.SOCKET_NAME == defaults.DEFAULT_SOCKET
    assert c.run_dir == defaults.DEFAULT_RUN_DIR
    assert c.hook_wait_s == defaults.DEFAULT_WAIT_S
    assert c.runtime_lower == defaults.DEFAULT_LOWER_RUNTIME


def test_the_environment_names_are_the_ones_c_reads() -> None:
    """The C programs read $VGPU_CONFIG and $VGPU_SOCKET with getenv (no header holds them)."""
    read = set()
    for source in [*(ROOT / "oci_hook" / "native").glob("*.c"),
                   *(ROOT / "shim" / "native").glob("*.c")]:
        read |= set(re.findall(r'getenv\("([A-Z_]+)"\)', source.read_text()))
    assert {defaults.ENV_CONFIG, defaults.ENV_SOCKET} <= read, sorted(read)
