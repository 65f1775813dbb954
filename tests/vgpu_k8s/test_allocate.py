# SPDX-License-Identifier: Apache-2.0
"""The device plugin's pure decisions: IDs, Allocate's annotations, GetPreferredAllocation."""
from __future__ import annotations

import pytest

from vgpu_k8s.deviceplugin.allocate import container_annotations, preferred
from vgpu_k8s.deviceplugin.gpus import HEALTHY, UNHEALTHY, Gpu, device_list
from vgpu_k8s.deviceplugin.ids import COMPUTE, MEMORY, Kind, device_id, parse_id
from vgpu_k8s.errors import AllocationError

A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
B = "GPU-bbbbbbbb-1111-2222-3333-444444444444"
MI = 1 << 20


def mem(gpu: str, *ns: int) -> list[str]:
    return [device_id(MEMORY, gpu, n) for n in ns]


def comp(gpu: str, *ns: int) -> list[str]:
    return [device_id(COMPUTE, gpu, n) for n in ns]


# ---- IDs ---------------------------------------------------------------------------

@pytest.mark.parametrize(("resource", "text", "kind"), [
    (MEMORY, f"{A}-mem-0", Kind(MEMORY, A, 0)),
    (MEMORY, f"{A}-mem-63", Kind(MEMORY, A, 63)),
    (COMPUTE, f"{B}-compute-99", Kind(COMPUTE, B, 99)),
    (MEMORY, f"{A}-compute-1", None),
    (COMPUTE, f"{A}-mem-1", None),
    (MEMORY, f"{A}-mem-01", None),
    (MEMORY, f"{A}-mem-", None),
    (MEMORY, "-mem-1", None),
    (MEMORY, f"{A}-mem-1 ", None),
    (MEMORY, "GPU-" + "x" * 60 + "-mem-1", None),
], ids=["memory", "memory-last", "compute", "compute-as-memory", "memory-as-compute",
        "leading-zero", "no-number", "no-gpu", "trailing-space", "over-63"])
def test_parse_id(resource, text, kind):
    assert parse_id(resource, text) == kind


def test_device_list_per_gpu_and_health():
    gpus = [Gpu(0, A, 1024 * MI), Gpu(1, B, 600 * MI, unhealthy="GPU is lost")]
    memory = device_list(MEMORY, gpus, 256 * MI)
    assert memory == [(i, HEALTHY) for i in mem(A, 0, 1, 2, 3)] + \
        [(i, UNHEALTHY) for i in mem(B, 0, 1)]          # 600Mi: 2 whole units
    compute = device_list(COMPUTE, gpus, 256 * MI)
    assert len(compute) == 200 and compute[100] == (comp(B, 0)[0], UNHEALTHY)
    assert {h for _, h in device_list(MEMORY, gpus[:1], 256 * MI, down=True)} == {UNHEALTHY}


# ---- Allocate ------------------------------------------------------------------------

@pytest.mark.parametrize(("resource", "ids", "expected"), [
    (MEMORY, mem(A, 0), {MEMORY: "256Mi", "vgpu.io/devices": A}),
    (MEMORY, mem(B, 7, 3, 4, 5), {MEMORY: "1Gi", "vgpu.io/devices": B}),
    (COMPUTE, comp(A, *range(2)), {COMPUTE: "2"}),
    (COMPUTE, comp(A, *range(50)) + comp(B, *range(50)), {COMPUTE: "100"}),
    (MEMORY, [], {}),
], ids=["one-unit", "four-units", "compute-min", "compute-from-two-gpus", "none"])
def test_annotations(resource, ids, expected):
    assert container_annotations(resource, ids, 256 * MI) == expected


@pytest.mark.parametrize(("resource", "ids", "message"), [
    (MEMORY, mem(A, 0) + mem(B, 0),
     f"failed to allocate vgpu.io/memory {A}-mem-0,{B}-mem-0: the IDs span 2 GPUs ({A}, {B}): "
     "one container's vGPU memory must come from one GPU; ask for at most one GPU's worth"),
    (MEMORY, [*mem(A, 0), "nvidia0"],
     f"failed to allocate vgpu.io/memory {A}-mem-0,nvidia0: 'nvidia0' is not a "
     "vgpu.io/memory device ID of this plugin"),
    (MEMORY, mem(A, 1, 1),
     f"failed to allocate vgpu.io/memory {A}-mem-1,{A}-mem-1: an ID is listed twice"),
    (COMPUTE, comp(A, 0),
     f"failed to allocate vgpu.io/compute {A}-compute-0: 1 IDs: the compute share must be "
     "a percent from 2 to 100"),
    (COMPUTE, comp(A, *range(60)) + comp(B, *range(60)),
     f"failed to allocate vgpu.io/compute {A}-compute-0,{A}-compute-1,{A}-compute-2,"
     f"{A}-compute-3 (+116 more): 120 IDs: the compute share must be a percent from 2 to 100"),
], ids=["memory-across-gpus", "foreign-id", "twice", "compute-below-min", "compute-above-max"])
def test_annotations_refused(resource, ids, message):
    with pytest.raises(AllocationError) as e:
        container_annotations(resource, ids, 256 * MI)
    assert str(e.value) == message


# ---- GetPreferredAllocation ----------------------------------------------------------

@pytest.mark.parametrize(("available", "must", "size", "expected"), [
    # Best fit: both fit 2; B has fewer free (3 < 5).
    (mem(A, 0, 1, 2, 3, 4) + mem(B, 0, 1, 2), [], 2, mem(B, 0, 1)),
    # Only A fits 4.
    (mem(B, 0, 1, 2) + mem(A, 4, 3, 2, 1, 0), [], 4, mem(A, 0, 1, 2, 3)),
    # Ties go to the lowest UUID.
    (mem(B, 0, 1) + mem(A, 0, 1), [], 1, mem(A, 0)),
    # must_include pins the GPU even where another fits better.
    (mem(A, 0, 1, 2, 3, 4) + mem(B, 0, 1, 2), mem(A, 3), 2, [*mem(A, 3), *mem(A, 0)]),
    # No single GPU fits: span, the GPU with most free first (Allocate will refuse it).
    (mem(A, 0, 1) + mem(B, 0, 1, 2), [], 4, mem(B, 0, 1, 2) + mem(A, 0)),
    # must_include alone fills the request.
    (mem(A, 0, 1), mem(A, 1), 1, mem(A, 1)),
], ids=["best-fit", "only-one-fits", "tie", "must-include", "span", "must-only"])
def test_preferred_memory(available, must, size, expected):
    assert preferred(MEMORY, available, must, size) == expected


def test_preferred_compute_takes_any():
    available = comp(A, 0, 1, 2) + comp(B, 0, 1, 2, 3)
    got = preferred(COMPUTE, available, [], 5)
    assert len(got) == 5 and set(got) <= set(available)
