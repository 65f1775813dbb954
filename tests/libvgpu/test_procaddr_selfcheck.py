# SPDX-License-Identifier: Apache-2.0
"""libvgpu's start-up self-check of cuGetProcAddress (issue 24, part 3).

Before the real cuInit of a process with limits, libvgpu asks the driver's
cuGetProcAddress(_v2) for the base name of every hooked driver entry point (cuMemAlloc
for cuMemAlloc_v2) at CUDA 11.3, 12.0, 12.8, 13.0 and the driver's own version, with
each stream flag. An answer that is neither a hooked name's exported address nor a hook
cannot be mapped: the application would get an unhooked entry point. cuInit then fails
closed (CUDA_ERROR_NOT_SUPPORTED) with one stderr line naming the base name.
simgpu's SIMGPU_PROCADDR_UNEXPORTED=name answers such an entry point for `name`.
"""
from __future__ import annotations

import json
import re

import pytest
from support.paths import LIBVGPU, ROOT, TEST_BIN
from support.process import run

PROBE = TEST_BIN / "vgpu_probe"
HOOKS_DEF = ROOT / "libvgpu" / "src" / "hooks.def"


def hooked_bases() -> list[str]:
    """The base names of every driver entry point in hooks.def (NVML's are not looked up
    through cuGetProcAddress)."""
    bases: list[str] = []
    for name in re.findall(r"^VG_HOOK\((\w+)\)", HOOKS_DEF.read_text(), re.M):
        base = re.sub(r"_v\d+$", "", re.sub(r"_pt(sz|ds)$", "", name))
        if base not in bases:
            bases.append(base)
    return bases


def probe(env: dict[str, str], *ops: str, via: str = "direct"):
    p = run([str(PROBE), "--via", via, *ops], env=env, check=False)
    return p, [json.loads(line) for line in p.stdout.splitlines()]


def test_the_list_covers_what_limits_depend_on():
    assert {"cuMemAlloc", "cuMemCreate", "cuMemAllocAsync", "cuArrayCreate", "cuLaunchKernel",
            "cuGraphLaunch", "cuCtxCreate", "cuStreamBeginCapture", "cuInit"} <= set(hooked_bases())


@pytest.mark.parametrize("base", hooked_bases())
def test_an_unmappable_answer_makes_cuinit_refuse_with_one_line(simgpu_env, base):
    env = dict(simgpu_env, LD_PRELOAD=str(LIBVGPU), VGPU_MEMORY_LIMIT="1Gi",
               SIMGPU_PROCADDR_UNEXPORTED=base)
    p, out = probe(env, "info")
    assert out[0] == {"op": "init", "result": "CUDA_ERROR_NOT_SUPPORTED"}
    lines = p.stderr.splitlines()
    assert len(lines) == 1, p.stderr
    assert re.fullmatch(
        rf'vgpu: cuGetProcAddress\("{base}", \d+, flags 0\) answers an entry point that is not '
        rf"{base}\w* nor any other hooked name: refusing to run unenforced", lines[0]), lines[0]


@pytest.mark.parametrize("via", ["direct", "dlsym", "procaddr"])
def test_every_way_to_cuinit_refuses_and_says_it_once(simgpu_env, via):
    env = dict(simgpu_env, LD_PRELOAD=str(LIBVGPU), VGPU_MEMORY_LIMIT="1Gi",
               SIMGPU_PROCADDR_UNEXPORTED="cuFoo,cuMemAlloc")
    p, out = probe(env, "info", "alloc:mem:1048576", via=via)
    assert out[0]["result"] == "CUDA_ERROR_NOT_SUPPORTED"
    assert p.returncode != 0
    assert p.stderr.count("vgpu: ") == 1 and '"cuMemAlloc"' in p.stderr


def test_every_answer_maps_on_simgpu(simgpu_env):
    """The self-check passes on the table of a CUDA 13.0 driver: nothing is refused."""
    env = dict(simgpu_env, LD_PRELOAD=str(LIBVGPU), VGPU_MEMORY_LIMIT="1Gi")
    p, out = probe(env, "info", "alloc:mem:1048576")
    assert out[0] == {"op": "init", "result": "CUDA_SUCCESS"}
    assert out[1]["total"] == 1 << 30
    assert p.stderr == ""


def test_without_limits_nothing_is_checked(simgpu_env):
    """An inert libvgpu (no configuration) passes everything through, unmappable or not."""
    env = dict(simgpu_env, LD_PRELOAD=str(LIBVGPU), SIMGPU_PROCADDR_UNEXPORTED="cuMemAlloc")
    p, out = probe(env, "info")
    assert out[0] == {"op": "init", "result": "CUDA_SUCCESS"}
    assert p.stderr == ""
