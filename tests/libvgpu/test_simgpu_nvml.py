# SPDX-License-Identifier: Apache-2.0
"""simgpu's libnvidia-ml.so.1 seen through a C client (build/tests/nvml_client).

Every test runs real processes on a private state file. Processes that use the
device are driven through simgpu's libcuda (build/tests/cuda_client); those
tests skip until that client is built.
"""
from __future__ import annotations

import json
import re
import select
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.paths import TEST_BIN
from support.process import run

NVML_CLIENT = TEST_BIN / "nvml_client"
CUDA_CLIENT = TEST_BIN / "cuda_client"
GI, MI = 1 << 30, 1 << 20

# nvmlReturn_t values (nvml.h)
SUCCESS, UNINITIALIZED, INVALID_ARGUMENT, NOT_SUPPORTED = 0, 1, 2, 3
NOT_FOUND, INSUFFICIENT_SIZE, DRIVER_NOT_LOADED, VERSION_MISMATCH = 6, 7, 9, 25

needs_cuda_client = pytest.mark.skipif(
    not CUDA_CLIENT.exists(), reason="build/tests/cuda_client (simgpu libcuda) not built yet")


def info(env: dict[str, str], last_seen_us: int | None = None) -> dict[str, Any]:
    """One `nvml_client info` snapshot."""
    cmd = [str(NVML_CLIENT), "info"] + ([str(last_seen_us)] if last_seen_us is not None else [])
    return json.loads(run(cmd, env).stdout)


def wait_for(env: dict[str, str], pred: Callable[[dict[str, Any]], bool], what: str,
             timeout: float = 10.0) -> dict[str, Any]:
    """Poll snapshots until pred holds; fail naming what was awaited and the last view."""
    deadline = time.monotonic() + timeout
    while True:
        snap = info(env)
        if pred(snap):
            return snap
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last view:\n"
                                 f"{json.dumps(snap, indent=1)}")
        time.sleep(0.05)


@pytest.fixture
def two_gpus(simgpu_env: dict[str, str]) -> dict[str, str]:
    simgpu_env["SIMGPU_DEVICES"] = "1Gi,3Gi"
    return simgpu_env


@pytest.fixture
def spawn(two_gpus: dict[str, str]) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start cuda_client processes on the test's GPUs; all are killed at the end."""
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str) -> subprocess.Popen[str]:
        p = subprocess.Popen([str(CUDA_CLIENT), *args], env=two_gpus, text=True,
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
        p.communicate(timeout=10)


def held(p: subprocess.Popen[str], timeout: float = 30.0) -> dict[str, Any]:
    """The report `cuda_client hold` prints once its allocation has returned.

    Until then its memory may be half-way in: one nvml_client snapshot reads
    the memory figures before the process list, so a holder charging between
    the two reads shows in the list but not in `used`.
    """
    assert p.stdout is not None
    ready, _, _ = select.select([p.stdout], [], [], timeout)
    line = p.stdout.readline() if ready else ""
    if not line:
        p.kill()
        raise AssertionError(f"cuda_client hold printed no report; stderr:\n{p.communicate()[1]}")
    report: dict[str, Any] = json.loads(line)
    assert report["result"] == "CUDA_SUCCESS", report
    return report


def procs_by_pid(dev: dict[str, Any]) -> dict[int, int]:
    return {p["pid"]: p["used_memory"] for p in dev["processes"]}


# ---------------------------------------------------------------- devices


def test_devices_come_from_simgpu_devices(two_gpus: dict[str, str]) -> None:
    snap = info(two_gpus)
    assert snap["count"] == snap["count_v1"] == 2
    version = [int(x) for x in snap["driver_version"].split(".")]  # parseable like a real one
    assert len(version) == 3 and version[0] >= 500
    assert snap["cuda_driver_version"] == 13000
    devs = snap["devices"]
    assert [d["memory"]["total"] for d in devs] == [1 * GI, 3 * GI]
    for i, d in enumerate(devs):
        assert d["index"] == d["minor"] == i
        assert re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", d["uuid"]), d["uuid"]
        assert d["name"].startswith("NVIDIA ")
        assert re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:00\.0", d["pci_bus_id"]), d["pci_bus_id"]
        assert d["by_uuid"] == d["by_pci_bus_id"] == i
        total = d["memory"]["total"]
        assert d["memory"] == {"total": total, "free": total, "used": 0}
        assert d["memory_v2"] == {**d["memory"], "reserved": 0}
        assert d["utilization"] == {"gpu": 0, "memory": 0}
        assert d["compute_capability"] == [9, 0]
        assert d["processes"] == [] and d["process_utilization"] == []
    assert devs[0]["uuid"] != devs[1]["uuid"]
    assert devs[0]["pci_bus_id"] != devs[1]["pci_bus_id"]


def test_later_processes_see_the_same_devices(two_gpus: dict[str, str]) -> None:
    first = info(two_gpus)
    # The first process created the devices; a different list no longer matters.
    two_gpus["SIMGPU_DEVICES"] = "8Gi"
    second = info(two_gpus)
    assert [d["uuid"] for d in second["devices"]] == [d["uuid"] for d in first["devices"]]
    assert [d["memory"]["total"] for d in second["devices"]] == [1 * GI, 3 * GI]


# ---------------------------------------------------------------- errors

ERROR_CASES: list[tuple[str, int]] = [
    ("before_init_count", UNINITIALIZED),
    ("before_init_driver_version", UNINITIALIZED),
    ("before_init_handle", UNINITIALIZED),
    ("before_init_memory", UNINITIALIZED),
    ("before_init_shutdown", UNINITIALIZED),
    ("init", SUCCESS),
    ("handle", SUCCESS),
    ("count", SUCCESS),
    ("count_null", INVALID_ARGUMENT),
    ("handle_out_of_range", INVALID_ARGUMENT),
    ("handle_null_out", INVALID_ARGUMENT),
    ("uuid_unknown", NOT_FOUND),
    ("uuid_null", INVALID_ARGUMENT),
    ("pci_unknown", NOT_FOUND),
    ("pci_garbage", INVALID_ARGUMENT),
    ("bogus_handle_memory", INVALID_ARGUMENT),
    ("null_handle_memory", INVALID_ARGUMENT),
    ("null_handle_name", INVALID_ARGUMENT),
    ("memory_null", INVALID_ARGUMENT),
    ("memory_v2_version_0", VERSION_MISMATCH),
    ("memory_v2_version_1", VERSION_MISMATCH),
    ("memory_v2_ok", SUCCESS),
    ("name_short_buffer", INSUFFICIENT_SIZE),
    ("uuid_short_buffer", INSUFFICIENT_SIZE),
    ("driver_version_short_buffer", INSUFFICIENT_SIZE),
    ("utilization_null", INVALID_ARGUMENT),
    ("procs_null_count", INVALID_ARGUMENT),
    ("procs_query_idle", SUCCESS),
    ("procs_query_idle_count", 0),
    ("process_utilization_null_count", INVALID_ARGUMENT),
    ("process_utilization_idle", NOT_FOUND),
    ("unimplemented_fan_speed", NOT_SUPPORTED),
    ("init_again", SUCCESS),
    ("shutdown_1", SUCCESS),
    ("count_after_one_shutdown", SUCCESS),
    ("shutdown_2", SUCCESS),
    ("count_after_shutdown", UNINITIALIZED),
    ("memory_after_shutdown", UNINITIALIZED),
    ("shutdown_3", UNINITIALIZED),
    ("string_2", "Invalid Argument"),
    ("string_25", "Argument version mismatch"),
    ("string_unknown", "Unknown Error"),
]


@pytest.fixture
def errors(two_gpus: dict[str, str]) -> dict[str, Any]:
    return json.loads(run([str(NVML_CLIENT), "errors"], two_gpus).stdout)


@pytest.mark.parametrize(("case", "expected"), ERROR_CASES, ids=[c for c, _ in ERROR_CASES])
def test_error_codes(errors: dict[str, Any], case: str, expected: int | str) -> None:
    assert errors[case] == expected


def test_every_error_case_is_checked(errors: dict[str, Any]) -> None:
    assert set(errors) == {c for c, _ in ERROR_CASES}


@pytest.mark.parametrize("state", ["missing_dir", "too_small", "bad_devices"])
def test_init_without_usable_state_is_driver_not_loaded(simgpu_env: dict[str, str],
                                                        tmp_path: Path, state: str) -> None:
    if state == "missing_dir":
        simgpu_env["SIMGPU_STATE"] = str(tmp_path / "no" / "such" / "dir" / "simgpu.state")
    elif state == "too_small":
        (tmp_path / "junk.state").write_bytes(b"not a state file")
        simgpu_env["SIMGPU_STATE"] = str(tmp_path / "junk.state")
    else:
        simgpu_env["SIMGPU_DEVICES"] = "lots"
    p = run([str(NVML_CLIENT), "info"], simgpu_env, check=False)
    assert p.returncode == 1
    expected = {"error": DRIVER_NOT_LOADED, "message": "Driver Not Loaded"}
    assert json.loads(p.stdout)["init"] == expected
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("simgpu: "), p.stderr


def test_usage(two_gpus: dict[str, str]) -> None:
    p = run([str(NVML_CLIENT), "frobnicate"], two_gpus, check=False)
    assert p.returncode == 2 and "usage" in p.stderr


# ---------------------------------------------------------------- live views


@needs_cuda_client
def test_memory_and_processes_follow_holders(two_gpus: dict[str, str], spawn) -> None:
    a = spawn("hold", str(256 * MI))
    b = spawn("hold", str(128 * MI))
    # Both allocations have returned: from here on the device holds still.
    assert held(a)["pid"] == a.pid and held(b)["pid"] == b.pid
    snap = info(two_gpus)
    dev = snap["devices"][0]
    procs = procs_by_pid(dev)
    assert set(procs) == {a.pid, b.pid}
    assert procs[a.pid] >= 256 * MI and procs[b.pid] >= 128 * MI
    assert dev["memory"]["used"] == sum(procs.values())
    assert dev["memory"]["free"] == dev["memory"]["total"] - dev["memory"]["used"]
    assert dev["memory_v2"] == {**dev["memory"], "reserved": 0}
    assert snap["devices"][1]["memory"]["used"] == 0 and snap["devices"][1]["processes"] == []

    # A killed process's memory comes back: dead slots are reaped on the next look.
    a.send_signal(signal.SIGKILL)
    a.wait(timeout=10)
    snap = info(two_gpus)
    dev = snap["devices"][0]
    assert set(procs_by_pid(dev)) == {b.pid}
    assert dev["memory"]["used"] == procs_by_pid(dev)[b.pid]


@needs_cuda_client
def test_utilisation_follows_kernels(two_gpus: dict[str, str], spawn) -> None:
    p = spawn("exercise")

    def busy(s: dict[str, Any]) -> bool:
        d = s["devices"][0]
        return d["utilization"]["gpu"] > 0 and any(
            u["pid"] == p.pid and u["sm_util"] > 0 for u in d["process_utilization"])

    snap = wait_for(two_gpus, busy, "kernels of cuda_client exercise on device 0")
    dev = snap["devices"][0]
    assert 0 < dev["utilization"]["gpu"] <= 100
    assert 0 <= dev["utilization"]["memory"] <= dev["utilization"]["gpu"]
    sample = next(u for u in dev["process_utilization"] if u["pid"] == p.pid)
    # NVML stamps samples in microseconds of wall-clock time.
    assert abs(sample["timestamp"] / 1e6 - time.time()) < 60
    assert snap["devices"][1]["utilization"]["gpu"] == 0

    p.communicate(timeout=60)
    assert p.returncode == 0
    # A sample up to the newest stamp already seen is not reported again.
    seen = [u["timestamp"] for u in info(two_gpus)["devices"][0]["process_utilization"]
            if u["pid"] == p.pid]
    if seen:  # empty when the last kernel ended more than a window ago
        later = info(two_gpus, last_seen_us=max(seen))
        assert all(u["pid"] != p.pid for u in later["devices"][0]["process_utilization"])
    # Once the engine has been idle for a whole window, the device reads idle.
    time.sleep(1.2)
    idle = info(two_gpus)["devices"][0]
    assert idle["utilization"]["gpu"] == 0 and idle["process_utilization"] == []
