# SPDX-License-Identifier: Apache-2.0
"""arbiter.slices.inventory: GPUs and their usage through nvidia-ml-py, on simgpu's libnvidia-ml.

A process binds to one NVML library and one simulated machine for its life, so
every check runs in a fresh Python subprocess (tests/conftest.py's simgpu_env
gives each test a private SIMGPU_STATE).
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.paths import ROOT, SIMGPU_DIR, TEST_BIN
from support.process import clean_env, run

from arbiter.config import Config
from arbiter.errors import InventoryError
from arbiter.model import Gpu
from arbiter.slices.inventory import _restrict

GI, MI = 1 << 30, 1 << 20
NVML = SIMGPU_DIR / "libnvidia-ml.so.1"
PROBE = TEST_BIN / "vgpu_probe"

# Runs in the subprocess: argv[1] is a JSON {"config": {...Config kwargs}, "sample": bool}.
SCRIPT = textwrap.dedent("""
    import dataclasses, json, sys
    from pathlib import Path
    from arbiter.config import Config
    from arbiter.errors import InventoryError
    from arbiter.slices.inventory import discover, sample, shutdown

    args = json.loads(sys.argv[1])
    kw = args["config"]
    if kw.get("nvml_library"):
        kw["nvml_library"] = Path(kw["nvml_library"])
    if kw.get("devices_include") is not None:
        kw["devices_include"] = tuple(kw["devices_include"])
    if kw.get("device_nodes"):
        kw["device_nodes"] = {int(k): tuple(v) for k, v in kw["device_nodes"].items()}
    try:
        gpus = discover(Config(**kw))
    except InventoryError as e:
        print(json.dumps({"error": str(e)}))
        sys.exit(0)
    out = {"gpus": [dataclasses.asdict(g) for g in gpus]}
    if args.get("sample"):
        out["sample"] = {str(i): dataclasses.asdict(s) for i, s in sample(gpus).items()}
    shutdown()
    print(json.dumps(out))
""")


def inventory(env: dict[str, str], sample: bool = False, **config: Any) -> dict[str, Any]:
    env = dict(env, PYTHONPATH=str(ROOT))
    p = run([sys.executable, "-c", SCRIPT, json.dumps({"config": config, "sample": sample})],
            env, cwd=str(ROOT))
    result: dict[str, Any] = json.loads(p.stdout)
    return result


@pytest.fixture
def two_gpus(simgpu_env: dict[str, str]) -> dict[str, str]:
    simgpu_env["SIMGPU_DEVICES"] = "2Gi,4Gi"
    return simgpu_env


@pytest.fixture
def configured_only(two_gpus: dict[str, str]) -> dict[str, str]:
    """simgpu reachable only through nvml.library: no LD_LIBRARY_PATH."""
    env = dict(two_gpus)
    env.pop("LD_LIBRARY_PATH")
    return env


def test_discover_via_ld_library_path(two_gpus: dict[str, str]) -> None:
    gpus = inventory(two_gpus)["gpus"]
    assert [g["index"] for g in gpus] == [0, 1]
    assert [g["memory"] for g in gpus] == [2 * GI, 4 * GI]
    assert [g["minor"] for g in gpus] == [0, 1]
    assert all(g["uuid"].startswith("GPU-") for g in gpus)
    assert len({g["uuid"] for g in gpus}) == 2
    assert all(g["name"] and isinstance(g["name"], str) for g in gpus)
    # Real GPUs: their own node plus the control and UVM nodes.
    assert gpus[1]["device_nodes"] == ["/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm",
                                       "/dev/nvidia-uvm-tools"]


def test_discover_via_configured_library(configured_only: dict[str, str]) -> None:
    gpus = inventory(configured_only, nvml_library=str(NVML))["gpus"]
    assert [g["memory"] for g in gpus] == [2 * GI, 4 * GI]


def test_same_machine_same_uuids(two_gpus: dict[str, str]) -> None:
    """Two processes on one SIMGPU_STATE see the same GPUs (the arbiter restarts safely)."""
    assert inventory(two_gpus)["gpus"] == inventory(two_gpus)["gpus"]


def test_device_nodes_from_config(configured_only: dict[str, str]) -> None:
    gpus = inventory(configured_only, nvml_library=str(NVML),
                     device_nodes={"1": ["/dev/null"], "-1": ["/dev/zero", "/dev/full"]})["gpus"]
    assert gpus[0]["device_nodes"] == ["/dev/zero", "/dev/full"]
    assert gpus[1]["device_nodes"] == ["/dev/null"]


def test_include_by_index_and_uuid(configured_only: dict[str, str]) -> None:
    every = inventory(configured_only, nvml_library=str(NVML))["gpus"]
    only1 = inventory(configured_only, nvml_library=str(NVML), devices_include=[1])["gpus"]
    assert only1 == [every[1]]                        # keeps NVML's index, not a renumbering
    by_uuid = inventory(configured_only, nvml_library=str(NVML),
                        devices_include=[every[0]["uuid"].upper()])
    assert by_uuid["gpus"] == [every[0]]


def test_include_unknown_gpu(configured_only: dict[str, str]) -> None:
    out = inventory(configured_only, nvml_library=str(NVML), devices_include=[0, 7])
    assert out["error"].startswith(
        "failed to select GPUs: devices.include names GPU 7, which does not exist (have 0-1: GPU-")


def test_library_missing(tmp_path: Path) -> None:
    env = clean_env()
    env.pop("LD_LIBRARY_PATH", None)
    check = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True)
    if "libnvidia-ml.so.1" in check.stdout:
        pytest.skip("this host has a real libnvidia-ml.so.1")
    out = inventory(env)
    assert out["error"] == (
        "failed to load NVML: libnvidia-ml.so.1 not found: install the NVIDIA driver, or set "
        "nvml.library in the config (build/simgpu/libnvidia-ml.so.1 for simulated GPUs)")


def test_configured_library_missing(configured_only: dict[str, str], tmp_path: Path) -> None:
    out = inventory(configured_only, nvml_library=str(tmp_path / "libnvidia-ml.so.1"))
    assert out["error"].startswith(
        f"failed to load NVML library {tmp_path / 'libnvidia-ml.so.1'}: ")
    assert "No such file" in out["error"]


def test_unusable_state_file(configured_only: dict[str, str], tmp_path: Path) -> None:
    env = dict(configured_only, SIMGPU_STATE=str(tmp_path / "no-such-dir" / "state"))
    out = inventory(env, nvml_library=str(NVML))
    assert out["error"].startswith("failed to initialise NVML: ")


@pytest.fixture
def holder(two_gpus: dict[str, str]) -> Iterator[tuple[int, int]]:
    """A CUDA process on the same simulated machine holding 256 MiB on GPU 1: (pid, bytes)."""
    if not PROBE.exists():
        pytest.skip("build/tests/vgpu_probe not built")
    size = 256 * MI
    p = subprocess.Popen([str(PROBE), "--device", "1", f"alloc:mem:{size}", "hold"],
                         env=two_gpus, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        for line in p.stdout:
            if json.loads(line).get("op") == "hold":
                break
        else:
            raise AssertionError(f"vgpu_probe exited early: {p.stderr.read() if p.stderr else ''}")
        yield p.pid, size
    finally:
        p.kill()
        p.wait()


def test_sample_idle(two_gpus: dict[str, str]) -> None:
    out = inventory(two_gpus, sample=True)
    assert set(out["sample"]) == {"0", "1"}
    for i, total in (("0", 2 * GI), ("1", 4 * GI)):
        s = out["sample"][i]
        assert s["index"] == int(i)
        assert s["total"] == total
        assert s["used"] == 0
        assert s["processes"] == {}
        assert s["utilization"] in (0, None)


def test_sample_sees_a_process(two_gpus: dict[str, str], holder: tuple[int, int]) -> None:
    pid, size = holder
    out = inventory(two_gpus, sample=True)
    s1 = out["sample"]["1"]
    assert s1["processes"].keys() == {str(pid)}
    assert s1["processes"][str(pid)] >= size
    assert s1["used"] >= size
    assert out["sample"]["0"]["processes"] == {}


def test_sample_of_included_gpus_only(two_gpus: dict[str, str], holder: tuple[int, int]) -> None:
    out = inventory(two_gpus, sample=True, devices_include=[1])
    assert set(out["sample"]) == {"1"}


# --- pure helper ----------------------------------------------------------------------------

GPUS = [Gpu(0, "GPU-aa", "a", GI, 0), Gpu(1, "GPU-bb", "b", GI, 1), Gpu(2, "GPU-cc", "c", GI, 2)]


@pytest.mark.parametrize(("include", "expected"), [
    pytest.param(None, [0, 1, 2], id="all"),
    pytest.param((2, 0), [0, 2], id="indices-keep-order"),
    pytest.param(("GPU-BB",), [1], id="uuid-any-case"),
    pytest.param((1, "GPU-bb"), [1], id="same-gpu-twice"),
])
def test_restrict(include: tuple[int | str, ...] | None, expected: list[int]) -> None:
    assert [g.index for g in _restrict(GPUS, include)] == expected


@pytest.mark.parametrize(("include", "message"), [
    pytest.param((3,), "devices.include names GPU 3, which does not exist (have 0-2: ", id="idx"),
    pytest.param(("GPU-zz",), "devices.include names GPU GPU-zz, which does not exist",
                 id="uuid"),
])
def test_restrict_unknown(include: tuple[int | str, ...], message: str) -> None:
    with pytest.raises(InventoryError, match=r"^failed to select GPUs: " + message.replace(
            "(", r"\(")):
        _restrict(GPUS, include)


def test_config_default_nodes_match_inventory_default() -> None:
    assert Config().nodes_for(0, 5)[0] == "/dev/nvidia5"
