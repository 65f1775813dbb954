# SPDX-License-Identifier: Apache-2.0
"""simgpu's libcuda.so.1, driven through build/tests/cuda_client in real processes."""
from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest
from support.paths import TEST_BIN
from support.process import run

CLIENT = str(TEST_BIN / "cuda_client")
VIAS = ["direct", "dlsym", "procaddr"]
GiB = 1 << 30
MiB = 1 << 20


def client(env: dict[str, str], *args: str, via: str = "direct", check: bool = True) -> dict:
    """Run one cuda_client command and return its JSON object."""
    p = run([CLIENT, "--via", via, *args], env, timeout=60, check=check)
    return json.loads(p.stdout)


@pytest.fixture
def two_devices(simgpu_env: dict[str, str]) -> dict[str, str]:
    simgpu_env["SIMGPU_DEVICES"] = "1Gi,2Gi"
    return simgpu_env


def free_of(env: dict[str, str], index: int = 0) -> int:
    return client(env, "info")["devices"][index]["free"]


def start_hold(env: dict[str, str], nbytes: int,
               path: str = "mem") -> tuple[subprocess.Popen, dict]:
    """A process that allocates nbytes and sleeps; returns it with its report."""
    p = subprocess.Popen([CLIENT, "hold", str(nbytes), path], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    assert line, f"hold exited early: {p.stderr.read()}"
    return p, json.loads(line)


@pytest.mark.parametrize("via", VIAS)
def test_info_lists_the_configured_devices(two_devices: dict[str, str], via: str) -> None:
    info = client(two_devices, "info", via=via)
    assert info["driver_version"] == 13000
    assert info["count"] == 2
    for i, total in enumerate([GiB, 2 * GiB]):
        d = info["devices"][i]
        assert d["total"] == d["info_total"] == d["free"] == total
        assert d["name"].startswith("NVIDIA")
        assert d["uuid"].startswith("GPU-") and len(d["uuid"]) == 40
        assert d["pci_bus_id"] == f"0000:{0x10 + i:02x}:00.0"
        assert (d["sms"], d["cc"], d["clock_khz"], d["warp"]) == (132, "9.0", 1980000, 32)
    assert info["devices"][0]["uuid"] != info["devices"][1]["uuid"]


def test_every_process_sees_the_same_devices(two_devices: dict[str, str]) -> None:
    a, b = client(two_devices, "info"), client(two_devices, "info", via="procaddr")
    assert [d["uuid"] for d in a["devices"]] == [d["uuid"] for d in b["devices"]]


ALLOC_PATHS = {
    # path: bytes charged for a 1,000,000-byte request
    "mem": 1_000_000,
    "pitch": 1_000_448,  # pitch rounded up to 512
    "managed": 1_000_000,
    "async": 1_000_000,
    "pool": 1_000_000,
    "array": 1_000_000,
    "array3d": 1_000_000,
    "vmm": 2 * MiB,  # rounded up to the 2 MiB granularity
    "host": 0,  # pinned host memory is not device memory
}


@pytest.mark.parametrize("via", VIAS)
@pytest.mark.parametrize("path", sorted(ALLOC_PATHS))
def test_allocation_path_charges_and_frees(simgpu_env: dict[str, str], path: str, via: str) -> None:
    r = client(simgpu_env, "alloc", path, "1000000", via=via)
    assert r["result"] == "CUDA_SUCCESS"
    assert r["charged"] == ALLOC_PATHS[path]
    assert r["free_after"] == r["free_before"] == 16 * GiB


@pytest.mark.parametrize("path", ["mem", "managed", "async", "pool", "array", "vmm"])
def test_out_of_memory_at_the_device_size(two_devices: dict[str, str], path: str) -> None:
    ok = client(two_devices, "alloc", path, str(GiB))
    assert ok["result"] == "CUDA_SUCCESS" and ok["free_during"] == 0
    over = GiB + (2 * MiB if path == "vmm" else 1)
    r = client(two_devices, "alloc", path, str(over))
    assert r["result"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert r["free_during"] == r["free_after"] == GiB  # nothing was allocated


def test_second_device_has_its_own_memory(two_devices: dict[str, str]) -> None:
    r = client(two_devices, "--device", "1", "alloc", "mem", str(2 * GiB))
    assert r["result"] == "CUDA_SUCCESS" and r["free_before"] == 2 * GiB


def test_processes_see_each_others_memory(two_devices: dict[str, str]) -> None:
    holder, rep = start_hold(two_devices, 256 * MiB)
    try:
        assert rep["result"] == "CUDA_SUCCESS"
        assert free_of(two_devices) == GiB - 256 * MiB
        # Only what is left can be allocated by another process.
        r = client(two_devices, "alloc", "mem", str(GiB - 255 * MiB))
        assert r["result"] == "CUDA_ERROR_OUT_OF_MEMORY"
        assert free_of(two_devices, 1) == 2 * GiB
    finally:
        holder.terminate()
        holder.wait(timeout=10)


@pytest.mark.parametrize("path", ["mem", "vmm", "array"])
def test_killed_process_gives_its_memory_back(simgpu_env: dict[str, str], path: str) -> None:
    holder, rep = start_hold(simgpu_env, 4 * GiB, path)
    assert rep["result"] == "CUDA_SUCCESS"
    assert free_of(simgpu_env) == 12 * GiB
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)  # reaped: a zombie would still look alive
    deadline = time.monotonic() + 1.0
    while free_of(simgpu_env) != 16 * GiB:
        assert time.monotonic() < deadline, \
            "memory of a SIGKILLed process was not reclaimed within 1 s"
        time.sleep(0.05)


def test_context_memory_is_charged_while_the_context_lives(simgpu_env: dict[str, str]) -> None:
    simgpu_env["SIMGPU_CONTEXT_MEMORY"] = "300Mi"
    assert free_of(simgpu_env) == 16 * GiB - 300 * MiB  # info's own primary context
    holder, rep = start_hold(simgpu_env, 100 * MiB)
    try:
        assert rep["free"] == 16 * GiB - 400 * MiB
        assert free_of(simgpu_env) == 16 * GiB - 700 * MiB
    finally:
        holder.terminate()
        holder.wait(timeout=10)


@pytest.mark.parametrize("via", VIAS)
def test_exercise_copies_streams_events_graphs(simgpu_env: dict[str, str], via: str) -> None:
    r = client(simgpu_env, "exercise", via=via)
    assert r["copy_ok"] and r["memset_ok"] and r["pinned_ok"]
    assert 0.95 <= r["kernel_ms"] <= 1.5  # events around one busy_1000us
    assert r["launch_ms"] < 5  # launches are asynchronous
    assert r["query_pending"] == r["event_query_pending"] == "CUDA_ERROR_NOT_READY"
    assert r["query_done"] == r["event_query_done"] == "CUDA_SUCCESS"
    assert 19.5 <= r["sync_ms"] <= 60
    assert 1.95 <= r["ex_coop_ms"] <= 3  # cuLaunchKernelEx + cooperative launch, 1 ms each
    assert r["ctx_sync_ms"] >= 1.95
    assert r["capture_ms"] < 4  # captured launches are recorded, not run
    assert 4.95 <= r["captured_graph_ms"] <= 7
    assert 3.95 <= r["explicit_graph_ms"] <= 6


def test_kernels_from_two_processes_serialise_on_one_engine(simgpu_env: dict[str, str]) -> None:
    client(simgpu_env, "info")  # create the state before the clock starts
    start = time.monotonic_ns() + 400_000_000  # both start together, after process start-up
    procs = [subprocess.Popen([CLIENT, "launch", "200", "1000", str(start)], env=simgpu_env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=30)
        assert p.returncode == 0, err
        reports.append(json.loads(out))
    wall = (max(r["end_ns"] for r in reports) - start) / 1e9
    assert 0.39 <= wall <= 0.7, f"two processes x 200 x 1 ms took {wall:.3f} s"
    assert all(r["launch_s"] < 0.1 for r in reports)


def test_one_process_alone_runs_at_full_speed(simgpu_env: dict[str, str]) -> None:
    r = client(simgpu_env, "launch", "200", "1000")
    assert 0.195 <= r["elapsed_s"] <= 0.35


EXPECTED_ERRORS = {
    "count_before_init": "CUDA_ERROR_NOT_INITIALIZED",
    "alloc_before_init": "CUDA_ERROR_NOT_INITIALIZED",
    "init_bad_flags": "CUDA_ERROR_INVALID_VALUE",
    "count_null": "CUDA_ERROR_INVALID_VALUE",
    "device_get_99": "CUDA_ERROR_INVALID_DEVICE",
    "name_bad_device": "CUDA_ERROR_INVALID_DEVICE",
    "attribute_out_of_range": "CUDA_ERROR_INVALID_VALUE",
    "alloc_no_context": "CUDA_ERROR_INVALID_CONTEXT",
    "meminfo_no_context": "CUDA_ERROR_INVALID_CONTEXT",
    "ctx_sync_no_context": "CUDA_ERROR_INVALID_CONTEXT",
    "pop_empty": "CUDA_ERROR_INVALID_CONTEXT",
    "set_current_bogus": "CUDA_ERROR_INVALID_CONTEXT",
    "ctx_destroy_bogus": "CUDA_ERROR_INVALID_CONTEXT",
    "alloc_null": "CUDA_ERROR_INVALID_VALUE",
    "alloc_zero": "CUDA_ERROR_INVALID_VALUE",
    "free_unknown": "CUDA_ERROR_INVALID_VALUE",
    "free_twice": "CUDA_ERROR_INVALID_VALUE",
    "free_host_unknown": "CUDA_ERROR_INVALID_VALUE",
    "memcpy_unknown_dst": "CUDA_ERROR_INVALID_VALUE",
    "memcpy_null_src": "CUDA_ERROR_INVALID_VALUE",
    "meminfo_null": "CUDA_ERROR_INVALID_VALUE",
    "pitch_bad_elem": "CUDA_ERROR_INVALID_VALUE",
    "mem_create_unaligned": "CUDA_ERROR_INVALID_VALUE",
    "mem_create_null_prop": "CUDA_ERROR_INVALID_VALUE",
    "mem_release_bogus": "CUDA_ERROR_INVALID_VALUE",
    "granularity_null": "CUDA_ERROR_INVALID_VALUE",
    "map_unreserved": "CUDA_ERROR_INVALID_VALUE",
    "pool_destroy_default": "CUDA_ERROR_INVALID_VALUE",
    "pool_destroy_bogus": "CUDA_ERROR_INVALID_VALUE",
    "pool_alloc_bogus": "CUDA_ERROR_INVALID_VALUE",
    "array_null_desc": "CUDA_ERROR_INVALID_VALUE",
    "array_destroy_bogus": "CUDA_ERROR_INVALID_HANDLE",
    "module_load_missing": "CUDA_ERROR_FILE_NOT_FOUND",
    "module_load_null": "CUDA_ERROR_INVALID_VALUE",
    "get_function_bogus_module": "CUDA_ERROR_INVALID_HANDLE",
    "get_function_null_name": "CUDA_ERROR_INVALID_VALUE",
    "launch_bogus_func": "CUDA_ERROR_INVALID_HANDLE",
    "launch_zero_grid": "CUDA_ERROR_INVALID_VALUE",
    "launch_too_many_threads": "CUDA_ERROR_INVALID_VALUE",
    "launch_bogus_stream": "CUDA_ERROR_INVALID_HANDLE",
    "launch_ex_null_config": "CUDA_ERROR_INVALID_VALUE",
    "stream_destroy_twice": "CUDA_ERROR_INVALID_HANDLE",
    "stream_sync_destroyed": "CUDA_ERROR_INVALID_HANDLE",
    "stream_query_bogus": "CUDA_ERROR_INVALID_HANDLE",
    "stream_create_null": "CUDA_ERROR_INVALID_VALUE",
    "elapsed_unrecorded": "CUDA_ERROR_INVALID_HANDLE",
    "elapsed_null": "CUDA_ERROR_INVALID_VALUE",
    "event_record_bogus": "CUDA_ERROR_INVALID_HANDLE",
    "event_query_unrecorded": "CUDA_SUCCESS",
    "event_destroy_twice": "CUDA_ERROR_INVALID_HANDLE",
    "end_capture_not_capturing": "CUDA_ERROR_ILLEGAL_STATE",
    "capture_legacy_stream": "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
    "capture_twice": "CUDA_ERROR_ILLEGAL_STATE",
    "sync_while_capturing": "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
    "end_capture_invalidated": "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",  # by that sync
    "invalidated_graph_null": True,
    "graph_launch_bogus": "CUDA_ERROR_INVALID_HANDLE",
    "graph_instantiate_bogus": "CUDA_ERROR_INVALID_VALUE",
    "graph_add_node_null_params": "CUDA_ERROR_INVALID_VALUE",
    "module_unload_twice": "CUDA_ERROR_INVALID_HANDLE",
    "launch_unloaded_func": "CUDA_ERROR_INVALID_HANDLE",
    "error_name_bogus": "CUDA_ERROR_INVALID_VALUE",
    "error_string_null": "CUDA_ERROR_INVALID_VALUE",
    "procaddr_missing": "CUDA_ERROR_NOT_FOUND",
    "procaddr_missing_status": 1,  # CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
    "procaddr_missing_pfn_null": True,
    "procaddr_null_symbol": "CUDA_ERROR_INVALID_VALUE",
    "procaddr_too_old": "CUDA_ERROR_NOT_FOUND",
    "procaddr_too_old_status": 2,  # CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
    "procaddr_v1": "CUDA_SUCCESS",
    "procaddr_v1_found": True,
    "oom_name": "CUDA_ERROR_OUT_OF_MEMORY",
    "oom_string": "out of memory",
}


@pytest.mark.parametrize("via", VIAS)
def test_bad_arguments_give_error_codes_not_crashes(simgpu_env: dict[str, str], via: str) -> None:
    r = client(simgpu_env, "errors", via=via)
    got = {k: r.get(k) for k in EXPECTED_ERRORS}
    assert got == EXPECTED_ERRORS


def test_unusable_state_makes_cuinit_fail_with_one_line(simgpu_env: dict[str, str]) -> None:
    simgpu_env["SIMGPU_DEVICES"] = "lots"
    p = run([CLIENT, "info"], simgpu_env, check=False)
    assert p.returncode == 1 and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert any("SIMGPU_DEVICES" in line for line in lines)
    assert "CUDA_ERROR_NO_DEVICE" in lines[-1]


def test_bad_usage_exits_2(simgpu_env: dict[str, str]) -> None:
    assert run([CLIENT, "frobnicate"], simgpu_env, check=False).returncode == 2
    p = run([CLIENT, "alloc", "nowhere", "10"], simgpu_env, check=False)
    assert p.returncode == 1 and "unknown path" in p.stderr
