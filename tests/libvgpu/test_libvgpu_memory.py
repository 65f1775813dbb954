# SPDX-License-Identifier: Apache-2.0
"""libvgpu memory isolation, driven through real processes on simgpu.

Every test runs build/tests/vgpu_probe (a C driver-API client) with
LD_PRELOAD=build/libvgpu.so on a private simulated GPU and reads its JSON lines.
"""
from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time

import pytest
from support.paths import LIBVGPU, TEST_BIN
from support.process import run

MiB = 1 << 20
PROBE = str(TEST_BIN / "vgpu_probe")
KINDS = ["mem", "pitch", "managed", "vmm", "async", "pool", "array", "array3d", "mipmap"]
VIAS = ["direct", "dlsym", "procaddr"]


def probe(env: dict[str, str], *ops: str, via: str = "direct", device: int = 0,
          check: bool = True) -> list[dict]:
    p = run([PROBE, "--via", via, "--device", str(device), *ops], env=env, check=check)
    return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]


def last(lines: list[dict], op: str) -> dict:
    return [entry for entry in lines if entry["op"] == op][-1]


@pytest.fixture
def vgpu_env(simgpu_env: dict[str, str]) -> dict[str, str]:
    env = dict(simgpu_env)
    env["LD_PRELOAD"] = str(LIBVGPU)
    return env


def start_holder(env: dict[str, str], *ops: str) -> subprocess.Popen[str]:
    """A probe that runs ops, then holds what it allocated until killed."""
    p = subprocess.Popen([PROBE, *ops, "hold"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    for line in p.stdout:
        if '"hold"' in line:
            return p
    p.kill()
    raise AssertionError(f"holder did not start: {p.stderr.read() if p.stderr else ''}")


def device_used(simgpu_env: dict[str, str], device: int = 0) -> int:
    """Memory in use on the simulated GPU, seen by a process without libvgpu."""
    info = last(probe(simgpu_env, "info", device=device), "info")
    return info["total"] - info["free"]


# ---- pass-through ---------------------------------------------------------

def test_unconfigured_library_changes_nothing(simgpu_env, vgpu_env):
    ops = ("info", "alloc:mem:1073741824", "info", "count")
    plain = probe(simgpu_env, *ops)
    preloaded = probe(vgpu_env, *ops)
    assert preloaded == plain
    assert last(preloaded, "info")["total"] == 16 << 30


def test_non_cuda_process_never_loads_the_driver(vgpu_env):
    vgpu_env["VGPU_MEMORY_LIMIT"] = "256Mi"
    maps = run(["cat", "/proc/self/maps"], env=vgpu_env).stdout
    assert "libvgpu.so" in maps
    assert "libcuda" not in maps and "libnvidia-ml" not in maps


# ---- limits on every allocation path ----------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_every_allocation_path_stops_at_the_limit(kind, simgpu_env, vgpu_env):
    vgpu_env["VGPU_MEMORY_LIMIT"] = "256Mi"
    holder = start_holder(vgpu_env, f"fill:{kind}:{16 * MiB}", f"alloc:{kind}:{16 * MiB}")
    try:
        # The device really holds exactly the 16 allocations that fit: the
        # refused one allocated nothing.
        held = device_used(simgpu_env)
    finally:
        holder.kill()
        holder.wait()
    # The sync: a memory pool keeps stream-ordered frees until one (docs/libvgpu.md).
    lines = probe(vgpu_env, f"fill:{kind}:{16 * MiB}", "info", "freeall", "sync", "info")
    fill = last(lines, "fill")
    assert fill["count"] == 16
    assert fill["result"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert held == 16 * fill["bytes_each"] > 15 * MiB * 16
    full, empty = [entry for entry in lines if entry["op"] == "info"]
    assert (full["result"], full["total"]) == ("CUDA_SUCCESS", 256 * MiB)
    assert full["free"] == 256 * MiB - held
    assert (empty["total"], empty["free"]) == (256 * MiB, 256 * MiB)


@pytest.mark.parametrize("via", VIAS)
def test_limit_holds_whichever_way_entry_points_are_found(via, vgpu_env):
    vgpu_env["VGPU_MEMORY_LIMIT"] = "128Mi"
    lines = probe(vgpu_env, f"fill:mem:{8 * MiB}", "info", via=via)
    assert last(lines, "fill")["count"] == 16
    info = last(lines, "info")
    assert (info["total"], info["free"], info["device_total"]) == (128 * MiB, 0, 128 * MiB)


def test_limit_down_to_one_mib_reports_without_errors(vgpu_env):
    vgpu_env["VGPU_MEMORY_LIMIT"] = "1"
    lines = probe(vgpu_env, "info", f"alloc:mem:{MiB}", "info", "alloc:mem:1", "nvml")
    before, after = [entry for entry in lines if entry["op"] == "info"]
    assert (before["total"], before["free"]) == (MiB, MiB)
    assert (after["result"], after["total"], after["free"]) == ("CUDA_SUCCESS", MiB, 0)
    assert last(lines, "alloc")["result"] == "CUDA_ERROR_OUT_OF_MEMORY"
    dev = last(lines, "nvml")["devices"][0]
    assert (dev["r1"], dev["total"], dev["used"], dev["free"]) == (0, MiB, MiB, 0)
    assert (dev["r2"], dev["total2"], dev["used2"], dev["free2"]) == (0, MiB, MiB, 0)


def test_per_device_limits(simgpu_env, vgpu_env):
    simgpu_env["SIMGPU_DEVICES"] = vgpu_env["SIMGPU_DEVICES"] = "1Gi,1Gi,1Gi"
    vgpu_env["VGPU_MEMORY_LIMIT"] = "64Mi"
    vgpu_env["VGPU_MEMORY_LIMIT_1"] = "256Mi"
    fills = {}
    for dev in range(3):
        lines = probe(vgpu_env, f"fill:mem:{16 * MiB}", "info", device=dev)
        fills[dev] = (last(lines, "fill")["count"], last(lines, "info")["total"])
    assert fills == {0: (4, 64 * MiB), 1: (16, 256 * MiB), 2: (4, 64 * MiB)}


def test_context_reservation_is_charged(vgpu_env):
    vgpu_env["VGPU_MEMORY_LIMIT"] = "256Mi"
    vgpu_env["VGPU_CONTEXT_RESERVE"] = "64Mi"
    lines = probe(vgpu_env, "info", "ctx:create", "info", "ctx:destroy", "info")
    primary, created, destroyed = [entry["free"] for entry in lines if entry["op"] == "info"]
    assert (primary, created, destroyed) == (192 * MiB, 128 * MiB, 192 * MiB)


# ---- NVML ------------------------------------------------------------------

def test_nvml_only_process_sees_the_slice(vgpu_env, tmp_path):
    vgpu_env["VGPU_MEMORY_LIMIT"] = "512Mi"
    vgpu_env["VGPU_REGION_DIR"] = str(tmp_path / "slice")
    holder = start_holder(vgpu_env, f"alloc:mem:{96 * MiB}")
    try:
        dev = last(probe(vgpu_env, "nvml"), "nvml")["devices"][0]
    finally:
        holder.kill()
        holder.wait()
    assert (dev["total"], dev["used"], dev["free"]) == (512 * MiB, 96 * MiB, 416 * MiB)
    assert (dev["total2"], dev["used2"], dev["free2"]) == (512 * MiB, 96 * MiB, 416 * MiB)


# ---- malformed configuration fails closed ---------------------------------------

@pytest.mark.parametrize("key,value", [
    ("VGPU_MEMORY_LIMIT", "lots"),
    ("VGPU_MEMORY_LIMIT", "1.5Gi"),
    ("VGPU_MEMORY_LIMIT", "0"),
    ("VGPU_MEMORY_LIMIT_1", "-4"),
    ("VGPU_MEMORY_LIMIT_X", "1Gi"),
    ("VGPU_CONTEXT_RESERVE", "a lot"),
], ids=lambda v: v)
def test_malformed_variable_fails_closed(key, value, vgpu_env):
    vgpu_env[key] = value
    p = run([PROBE, "info"], env=vgpu_env, check=False)
    assert p.returncode == 3, p.stdout
    assert json.loads(p.stdout.splitlines()[0])["result"] != "CUDA_SUCCESS"
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vgpu: ")
    assert key in lines[0] and value in lines[0]


@pytest.mark.parametrize("content", ["garbage", "", None], ids=["garbage", "empty", "directory"])
def test_unreadable_region_file_fails_closed(content, vgpu_env, tmp_path):
    region_dir = tmp_path / "slice"
    region_dir.mkdir()
    target = region_dir / "vgpu0"
    if content is None:
        target.mkdir()
    else:
        target.write_text(content)
    vgpu_env["VGPU_REGION_DIR"] = str(region_dir)
    vgpu_env["VGPU_MEMORY_LIMIT"] = "1Gi"
    p = run([PROBE, "info"], env=vgpu_env, check=False)
    assert p.returncode == 3
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and str(target) in lines[0], p.stderr


# ---- one slice, several processes -------------------------------------------

def test_processes_in_one_region_dir_share_one_limit(vgpu_env, tmp_path):
    vgpu_env["VGPU_MEMORY_LIMIT"] = "256Mi"
    vgpu_env["VGPU_REGION_DIR"] = str(tmp_path / "slice")
    holder = start_holder(vgpu_env, f"alloc:mem:{192 * MiB}")
    try:
        # The first process made the slice: a later one's env does not change it.
        other = dict(vgpu_env, VGPU_MEMORY_LIMIT="8Gi")
        lines = probe(other, f"fill:mem:{16 * MiB}", "info")
    finally:
        holder.kill()
        holder.wait()
    assert last(lines, "fill")["count"] == 4
    assert last(lines, "info")["total"] == 256 * MiB
    # The holder is gone: its 192 MiB is back.
    assert last(probe(vgpu_env, "info"), "info")["free"] == 256 * MiB


def test_sigkill_in_allocation_loops_never_hangs_or_leaks(vgpu_env, tmp_path):
    vgpu_env["VGPU_MEMORY_LIMIT"] = "64Mi"
    vgpu_env["VGPU_REGION_DIR"] = str(tmp_path / "slice")
    rng = random.Random(1234)
    kinds = ["mem", "vmm", "async", "pitch"]
    for round_ in range(12):
        procs = [subprocess.Popen([PROBE, f"churn:{rng.choice(kinds)}:{MiB * 4}:100000000"],
                                  env=vgpu_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                 for _ in range(4)]
        time.sleep(rng.uniform(0.05, 0.3))
        for p in procs:
            p.send_signal(signal.SIGKILL)
        for p in procs:
            p.wait(timeout=10)
        # Every process was killed mid-loop, so the slice must be back to zero
        # within a second, and a new process must not block on anything.
        deadline = time.monotonic() + 1.0
        while True:
            info = last(probe(vgpu_env, "info"), "info")
            if info["free"] == 64 * MiB or time.monotonic() > deadline:
                break
        assert info["free"] == 64 * MiB, f"round {round_}: {info}"
    fill = last(probe(vgpu_env, f"fill:mem:{4 * MiB}", "freeall"), "fill")
    assert fill["count"] == 16
    from arbiter.files.region_file import open_region
    with open_region(tmp_path / "slice" / "vgpu0") as region:
        assert region.used_bytes(live_only=False) == 0  # exactly zero, nothing left to reap


def test_concurrent_processes_never_pass_the_limit(simgpu_env, vgpu_env, tmp_path):
    vgpu_env["VGPU_MEMORY_LIMIT"] = "100Mi"
    vgpu_env["VGPU_REGION_DIR"] = str(tmp_path / "slice")
    procs = [subprocess.Popen([PROBE, f"fill:mem:{MiB}", "hold"], env=vgpu_env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(6)]
    try:
        counts = []
        for p in procs:
            assert p.stdout is not None
            for line in p.stdout:
                entry = json.loads(line)
                if entry["op"] == "fill":
                    counts.append(entry["count"])
                if entry["op"] == "hold":
                    break
        assert sum(counts) == 100
        assert device_used(simgpu_env) == 100 * MiB
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_forked_child_gets_its_own_accounting(vgpu_env, tmp_path):
    """A child of a CUDA process is a new process: its slot is its own."""
    vgpu_env["VGPU_MEMORY_LIMIT"] = "64Mi"
    vgpu_env["VGPU_REGION_DIR"] = str(tmp_path / "slice")
    script = (
        f"import subprocess,sys; subprocess.run([{PROBE!r}, 'alloc:mem:{32 * MiB}'], check=True);"
        f"print(subprocess.run([{PROBE!r}, 'info'], capture_output=True, text=True).stdout)"
    )
    out = run([sys.executable, "-c", script], env=vgpu_env).stdout
    info = [json.loads(x) for x in out.splitlines() if '"info"' in x][-1]
    assert info["free"] == 64 * MiB


# ---- slices made by the arbiter (region files written from Python) -------------

def test_arbiter_made_slice_ignores_env_and_reports_usage(vgpu_env, tmp_path):
    from arbiter.files.region_file import create_region, open_region

    slice_dir = tmp_path / "slice"
    slice_dir.mkdir()
    create_region(slice_dir / "vgpu0", uuid="", device_index=0, memory_limit=128 * MiB)
    vgpu_env["VGPU_REGION_DIR"] = str(slice_dir)
    vgpu_env["VGPU_MEMORY_LIMIT"] = "4Gi"  # an image's env must not widen the slice
    holder = start_holder(vgpu_env, f"fill:mem:{16 * MiB}", "info")
    with open_region(slice_dir / "vgpu0") as region:
        try:
            assert region.used_bytes() == 128 * MiB
            assert [p.used for p in region.processes()] == [128 * MiB]
        finally:
            holder.kill()
            holder.wait()
        assert region.used_bytes() == 0


def test_limit_changed_in_place_reaches_a_running_process(vgpu_env, tmp_path):
    from arbiter.files.region_file import create_region, open_region

    slice_dir = tmp_path / "slice"
    slice_dir.mkdir()
    create_region(slice_dir / "vgpu0", uuid="", device_index=0, memory_limit=256 * MiB)
    vgpu_env["VGPU_REGION_DIR"] = str(slice_dir)
    p = subprocess.Popen([PROBE, f"alloc:mem:{32 * MiB}", "info", "sleep:1500", "info",
                          f"fill:mem:{16 * MiB}"], env=vgpu_env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    lines = []
    for line in p.stdout:
        lines.append(json.loads(line))
        if lines[-1]["op"] == "info":
            with open_region(slice_dir / "vgpu0") as region:
                generation = region.generation
                region.set_limits(memory_limit=96 * MiB)
                assert region.generation > generation
            break
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    lines += [json.loads(x) for x in out.splitlines()]
    before, after = [entry for entry in lines if entry["op"] == "info"]
    assert (before["total"], before["free"]) == (256 * MiB, 224 * MiB)
    assert (after["total"], after["free"]) == (96 * MiB, 64 * MiB)
    assert last(lines, "fill")["count"] == 4


# ---- dlsym interposition keeps glibc's meaning -------------------------------

@pytest.mark.parametrize("limit", [None, "1Gi"], ids=["inert", "limited"])
def test_dlsym_rtld_next_is_relative_to_the_caller(limit, vgpu_env):
    """RTLD_NEXT from the executable finds the first definition after it: libvgpu's
    hook for a hooked name (libvgpu is preloaded), libc's for anything else."""
    if limit:
        vgpu_env["VGPU_MEMORY_LIMIT"] = limit
    out = run([str(TEST_BIN / "dlsym_next"), "cuMemGetInfo_v2", "atoi"], env=vgpu_env).stdout
    found = json.loads(out)
    assert found["cuMemGetInfo_v2"]["object"].endswith("libvgpu.so")
    assert found["atoi"]["object"].startswith("/") and "libc" in found["atoi"]["object"]
    assert all(entry["same"] and entry["found"] for entry in found.values())


def test_arbiter_made_slice_covers_only_its_devices(simgpu_env, vgpu_env, tmp_path):
    from arbiter.files.region_file import create_region

    simgpu_env["SIMGPU_DEVICES"] = vgpu_env["SIMGPU_DEVICES"] = "1Gi,1Gi"
    slice_dir = tmp_path / "slice"
    slice_dir.mkdir()
    create_region(slice_dir / "vgpu0", uuid="", device_index=0, memory_limit=64 * MiB)
    vgpu_env["VGPU_REGION_DIR"] = str(slice_dir)
    assert last(probe(simgpu_env, "count"), "count")["count"] == 2
    assert last(probe(vgpu_env, "count"), "count")["count"] == 1
    p = run([PROBE, "--device", "1", "info"], env=vgpu_env, check=False)
    assert p.returncode != 0 and "cuDeviceGet" in p.stderr
    assert not (slice_dir / "vgpu1").exists()  # nothing made up for a device outside the slice


def test_slice_for_another_gpu_fails_closed(vgpu_env, tmp_path):
    from arbiter.files.region_file import create_region

    slice_dir = tmp_path / "slice"
    slice_dir.mkdir()
    wrong = "GPU-00000000-0000-0000-0000-000000000000"
    create_region(slice_dir / "vgpu0", uuid=wrong, device_index=0, memory_limit=64 * MiB)
    vgpu_env["VGPU_REGION_DIR"] = str(slice_dir)
    p = run([PROBE, "info"], env=vgpu_env, check=False)
    assert p.returncode == 3
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1
    assert str(slice_dir / "vgpu0") in lines[0] and wrong in lines[0]
    assert "CUDA_VISIBLE_DEVICES" in lines[0]
