# SPDX-License-Identifier: Apache-2.0
"""The real-GPU check (tests/gpu/gpucheck-all.sh, issue 24) run on simgpu, as CI can.

The same program and runner a GPU machine runs: here with 1 s share windows and five of
the share rows, so that a first run on a GPU only measures. About 30 s on two cores.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support.paths import LIBVGPU, ROOT, SIMGPU_DIR
from support.process import clean_env, run

RUNNER = ROOT / "tests" / "gpu" / "gpucheck-all.sh"

MEMORY_CHECKS = {
    "cuInit under libvgpu",
    "cuMemGetInfo total == limit, free <= total",
    "cuDeviceTotalMem == limit",
    "cuMemAlloc(limit + 64 MiB)",
    "cuMemAlloc 64 MiB at a time",
    "cuMemCreate 64 MiB handles",
    "... cuMemMap + cuMemSetAccess + memset of one",
    "cuMemAllocAsync 64 MiB, threshold raised",
    "... freed into the pool, filled again",
    "cuArrayCreate 2048x2048 float4 (64 MiB)",
    "cuMemAllocManaged(limit + 64 MiB)",
    "nvmlDeviceGetMemoryInfo total == limit",
    "nvmlDeviceGetMemoryInfo_v2 total == limit",
    "context + lazy module memory (NVML, no libvgpu)",
}


def gpucheck_all(env: dict[str, str], out: Path, timeout: float = 240,
                 **extra: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    env = dict(env, GPUCHECK_WINDOW="1", GPUCHECK_WARM="0.3", GPUCHECK_ROWS="1 4 5 18 21",
               GPUCHECK_LIMIT_MIB="512", LIBVGPU=str(LIBVGPU), **extra)
    p = run([str(RUNNER), str(out)], env=env, timeout=timeout, check=False)
    return p, json.loads((out / "gpucheck-all.json").read_text())


def results(part: dict) -> dict[str, str]:
    return {c["check"]: c["result"] for c in part["checks"]}


@pytest.fixture(scope="module")
def full_run(
        tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], dict, Path]:
    """One run of the whole runner for the module's tests (its own simulated GPU: the
    runner puts SIMGPU_STATE in its output directory)."""
    tmp = tmp_path_factory.mktemp("gpucheck")
    env = clean_env()
    env["LD_LIBRARY_PATH"] = str(SIMGPU_DIR)
    p, j = gpucheck_all(env, tmp / "out")
    return p, j, tmp / "out"


def test_one_command_gives_every_part_in_one_json(full_run):
    p, j, out = full_run
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    assert j["exit"] == {"hardware": 0, "shares": 0, "coverage": 0, "meminfo": 0, "memory": 0}
    # 1. the hardware, without libvgpu: every section, host-only on simgpu
    hw = j["hardware"]
    assert hw["failed_sections"] == 0 and hw["mode"] == "host-only"
    assert set(hw) >= {"device", "a_costs", "b_wake", "c_queue", "d_events", "e1_greedy_pair",
                       "e2_two_streams", "e3_light_beside_greedy", "e4_long_vs_short"}
    assert hw["device"]["simgpu"] is True
    # 2. the share rows asked for, each load with its achieved share
    loads = {(r["row"].split(".")[0], r["load"]): r for r in j["shares"]}
    assert set(loads) == {("1", "fixed30"), ("1", "burst70"), ("4", "step"), ("5", "step"),
                          ("18", "high"), ("18", "low"), ("21", "graph"), ("21", "burst60")}
    assert all(r["achieved"] is not None for r in j["shares"])
    # the priority pair: the high one has the GPU, the low one waits
    assert loads["18", "high"]["achieved"] > loads["18", "low"]["achieved"]
    # graphs captured in global mode during the run, under a limit: captured, launched, run
    assert loads["21", "graph"]["kernels"] > 0
    # the tables beside the JSON
    text = (out / "gpucheck-all.txt").read_text()
    for title in ("1. the GPU without libvgpu", "2. compute shares", "3. interception coverage",
                  "4. memory"):
        assert title in text
    assert j["runtime_s"] < 300


def test_coverage_every_hooked_name_maps_at_every_version(full_run):
    _, j, _ = full_run
    cov = j["coverage"]
    assert set(results(cov).values()) == {"PASS"}, cov["checks"]
    assert cov["cuinit"] == 0
    assert cov["bases"] >= 35 and cov["lookups"] == cov["bases"] * 4 * 2
    # what the answers were: the hook of the versioned name the driver hands out
    assert cov["answers"]["cuMemAlloc"]["12000"] == ["cuMemAlloc_v2", "cuMemAlloc_v2"]
    assert cov["answers"]["cuLaunchKernel"]["12080"] == ["cuLaunchKernel", "cuLaunchKernel_ptsz"]
    assert cov["answers"]["cuCtxCreate"]["13000"][0] == "cuCtxCreate_v4"
    assert cov["answers"]["cuLaunchKernelEx"]["11030"] == ["-", "-"]


def test_memory_checks_pass_under_libvgpu(full_run):
    _, j, _ = full_run
    mem = j["memory"]
    res = results(mem)
    assert set(res) >= MEMORY_CHECKS
    assert {k: v for k, v in res.items() if v != "PASS"} == {}
    assert mem["limit"] == 512 << 20
    assert j["meminfo"]["card_free"] == 16 << 30


def test_an_unmappable_answer_fails_coverage_and_libvgpu_refuses(simgpu_env, tmp_path):
    p, j = gpucheck_all(simgpu_env, tmp_path / "out", GPUCHECK_PARTS="coverage",
                        SIMGPU_PROCADDR_UNEXPORTED="cuMemAllocAsync")
    assert p.returncode == 1
    res = results(j["coverage"])
    assert res["cuGetProcAddress(_v2): every answer is a hook"] == "FAIL"
    assert res["cuInit under libvgpu (start-up self-check)"] == "PASS"  # refused, as it must
    assert j["coverage"]["cuinit"] == 801
    refusals = [line for line in p.stdout.splitlines() if line.startswith("vgpu: ")]
    assert len(refusals) == 1 and '"cuMemAllocAsync"' in refusals[0]


@pytest.fixture(scope="module")
def gpucheck_bin() -> Path:
    subprocess.run(["make", "-s", "-C", str(ROOT), "gpucheck"], check=True)
    return ROOT / "build" / "tests" / "gpucheck"


def test_memory_checks_fail_without_libvgpu(simgpu_env, tmp_path, gpucheck_bin):
    """The checks see a missing limit: without libvgpu the card's 16 GiB shows."""
    p = run([str(gpucheck_bin), "memory", str(tmp_path), "--limit-mib", "512"], env=simgpu_env,
            check=False, timeout=120)
    assert p.returncode == 1
    res = results(json.loads((tmp_path / "memory.json").read_text()))
    assert res["cuMemGetInfo total == limit, free <= total"] == "FAIL"
    assert res["cuMemAlloc(limit + 64 MiB)"] == "FAIL"
    assert res["nvmlDeviceGetMemoryInfo total == limit"] == "FAIL"


def test_a_load_on_two_streams_counts_what_ran_at_once_once(tmp_path, gpucheck_bin):
    """`gpucheck shares` on GPU stamps: two kernels of one load that overlap (two streams)
    are 2 s of its GPU time, not 4, and not two loads at once."""
    t = 10**12
    a = tmp_path / "a.stamps"
    a.write_text(f"# gpucheck-load pid=1 mode=gpu-timeline streams=2\n"
                 f"{t} {t + 2 * 10**9} 0\n{t} {t + 2 * 10**9} 1\n")
    b = tmp_path / "b.stamps"
    b.write_text(f"# gpucheck-load pid=2 mode=gpu-timeline\n{t + 2 * 10**9} {t + 4 * 10**9} 0\n")
    tsv = tmp_path / "shares.tsv"
    run([str(gpucheck_bin), "shares", "--warm", "0", "--window", "4", "--tsv", str(tsv),
         "A", "50", str(a), "B", "50", str(b)], env={})
    rows = {r[1]: r for r in (line.split("\t") for line in tsv.read_text().splitlines())}
    assert float(rows["A"][3]) == 50 and float(rows["B"][3]) == 50
    assert float(rows["A"][5]) == 0  # two loads at once: never


def test_a_late_arrival_gives_the_hand_over_and_its_share_from_then(tmp_path, gpucheck_bin):
    """`gpucheck shares`, priority hand-over: high's first kernel begins at +2 s; low's work
    runs on 5 ms, then pauses 295 ms (more than 50 ms: the hand-over is over)."""
    t, ms = 10**12, 10**6
    low = tmp_path / "low.stamps"
    pieces = [(t + i * 100 * ms, t + (i + 1) * 100 * ms, i) for i in range(20)]
    pieces += [(t + 2000 * ms, t + 2005 * ms, 20), (t + 2300 * ms, t + 2400 * ms, 21)]
    low.write_text("# gpucheck-load pid=1 mode=gpu-timeline\n"
                   + "".join(f"{a} {b} {k}\n" for a, b, k in pieces))
    high = tmp_path / "high.stamps"
    high.write_text(f"# gpucheck-load pid=2 mode=gpu-timeline\n{t + 2000 * ms} {t + 4000 * ms} 0\n")
    tsv = tmp_path / "shares.tsv"
    p = run([str(gpucheck_bin), "shares", "--warm", "0", "--window", "4", "--tsv", str(tsv),
             "low", "-", str(low), "high", "-", str(high)], env={})
    rows = {r[1]: r for r in (line.split("\t") for line in tsv.read_text().splitlines())}
    assert float(rows["high"][11]) == 5.0 and float(rows["high"][12]) == 100.0
    assert rows["low"][11] == "nan"  # low was there first
    assert "high arrives at +2.00 s: the others' work ran on 5.00 ms" in p.stdout
