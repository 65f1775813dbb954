# SPDX-License-Identifier: Apache-2.0
"""libvgpu under NVIDIA's CUDA runtime API (libcudart from the PyPI wheels, the `test` extra).

build/tests/cudart_client (libvgpu/tests/cudart_client.c) dlopens the runtime and calls
it as an application does; libvgpu is preloaded with a slice. The same tests run on
simgpu (`make test`) and on a real GPU (tests/gpu/run.sh sets VGPU_TEST_REAL_GPU=1: the
driver is then the system's, not simgpu).

On simgpu the runtime does not start today: it needs the driver's private export tables,
one of which tests the driver's authenticity (docs/simgpu.md, "NVIDIA's CUDA runtime";
test_simgpu_cudart.py pins that). These tests then skip, saying so; on a real GPU a
runtime that does not start fails them.
"""
from __future__ import annotations

import json
import os

import pytest
from support.cudart import runtime_libs
from support.measure import TOL, fixed, timing
from support.paths import LIBVGPU, TEST_BIN
from support.process import clean_env, run

RUNTIMES = runtime_libs()
CLIENT = str(TEST_BIN / "cudart_client")
REAL_GPU = os.environ.get("VGPU_TEST_REAL_GPU") == "1"
MiB = 1 << 20
LIMIT = 512 * MiB



def test_a_runtime_is_there():
    """The other tests run once per runtime found: none found is a failure on a GPU."""
    if not RUNTIMES:
        why = "no CUDA runtime: install the test extra or set VGPU_TEST_CUDART"
        (pytest.fail if REAL_GPU else pytest.skip)(why)


def client(env: dict[str, str], cudart, *ops: str, timeout: float = 60) -> dict[str, dict]:
    """Run cudart_client; {op: its last JSON line}."""
    p = run([CLIENT, str(cudart), "init", *ops], env=env, timeout=timeout, check=False)
    lines = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    out = {x["op"]: x for x in lines}
    assert "init" in out, (p.stdout, p.stderr)
    if out["init"]["rc"] != 0:
        why = (f"NVIDIA's CUDA runtime {cudart.name} does not start on this driver: "
               f"cudaGetDeviceCount = {out['init']['result']}")
        if REAL_GPU:
            pytest.fail(why)
        pytest.skip(why + " (simgpu cannot answer its driver authenticity test: "
                    "docs/simgpu.md)")
    assert p.returncode == 0, (p.stdout, p.stderr)
    return out


@pytest.fixture(params=sorted(RUNTIMES), ids=str)
def cudart(request):
    return RUNTIMES[request.param]


@pytest.fixture
def rt_env(simgpu_env: dict[str, str]) -> dict[str, str]:
    """simgpu's environment, or on a real GPU the system's driver; libvgpu preloaded."""
    env = clean_env() if REAL_GPU else simgpu_env
    env["LD_PRELOAD"] = str(LIBVGPU)
    env["VGPU_MEMORY_LIMIT"] = str(LIMIT // MiB)
    return env


def test_mem_get_info_shows_the_slice(rt_env, cudart):
    info = client(rt_env, cudart, "info")["info"]
    assert info["rc"] == 0
    assert info["total"] == LIMIT
    assert 0 < info["free"] <= LIMIT


def test_malloc_is_refused_past_the_limit(rt_env, cudart):
    out = client(rt_env, cudart, f"malloc:{LIMIT + 64 * MiB}")
    assert out["malloc"]["result"] == "cudaErrorMemoryAllocation"
    out = client(rt_env, cudart, f"fill:{32 * MiB}", "freeall", f"malloc:{LIMIT // 2}")
    fill = out["fill"]
    assert fill["result"] == "cudaErrorMemoryAllocation"
    # Stopped at the limit (less the context's own reservation), not before it.
    assert LIMIT // 2 <= fill["allocated"] <= LIMIT
    assert out["freeall"]["rc"] == 0
    assert out["malloc"]["rc"] == 0  # what was freed is the slice's again


def test_malloc_async_pool_with_raised_threshold_stays_inside_the_limit(rt_env, cudart):
    """The default pool keeps freed memory when its release threshold is raised (PyTorch and
    RAPIDS raise it): what the pool holds plus what is allocated after must fit the slice."""
    out = client(rt_env, cudart, f"pool:{32 * MiB}:3", f"malloc:{LIMIT // 2}")
    pool, after = out["pool"], out["malloc"]
    assert pool["result"] == "cudaErrorMemoryAllocation"
    assert LIMIT // 2 <= pool["most"] <= LIMIT
    assert pool["reserved_rc"] == 0
    held = pool["reserved"] + (after["bytes"] if after["rc"] == 0 else 0)
    assert held <= LIMIT, out


@timing
def test_compute_share_holds_for_runtime_launches(tmp_path, rt_env, cudart):
    """1 ms kernels launched through cudaLaunchKernel, alone on the GPU: a fixed 30 % slice
    gets 30 % of the time; without a compute limit the same loop gets nearly all of it."""
    env = dict(rt_env)
    if not REAL_GPU:
        env["SIMGPU_STATE"] = str(tmp_path / "simgpu.state")  # each attempt its own GPU

    def share(env):
        launch = client(env, cudart, "launch:1000:3000")["launch"]
        assert launch["rc"] == 0, launch
        return 100 * launch["launches"] * 1e6 / launch["wall_ns"]

    assert share(env) >= 80
    assert share({**env, **fixed(30)}) == pytest.approx(30, abs=TOL)
