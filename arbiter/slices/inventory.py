# SPDX-License-Identifier: Apache-2.0
"""The host's GPUs through NVML (nvidia-ml-py): what exists, and how busy each GPU is.

Real GPUs and simgpu take the same path: pynvml loads `libnvidia-ml.so.1` by soname,
so when the config names a library (nvml.library, e.g. build/simgpu/libnvidia-ml.so.1)
it is loaded first with RTLD_GLOBAL and pynvml's dlopen finds that object already
in the process under its soname. A process talks to one NVML library for its
whole life: the first one loaded stays.
"""
from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pynvml  # type: ignore[import-untyped]  # nvidia-ml-py ships no type hints

from arbiter.config import Config
from arbiter.errors import InventoryError
from arbiter.model import Gpu

__all__ = ["DeviceSample", "DriverVersions", "discover", "driver_versions", "process_utilisation",
           "sample", "shutdown", "unhealthy"]

T = TypeVar("T")

_lock = threading.Lock()
_initialised = False
_preloaded: dict[Path, ctypes.CDLL] = {}   # kept referenced so they are never unloaded


@dataclass(frozen=True)
class DeviceSample:
    """One GPU's usage at one instant, as NVML measures it (all processes, not only slices)."""

    index: int
    used: int                         # bytes of device memory in use
    total: int                        # bytes of device memory
    utilization: int | None           # % of time a kernel ran lately; None: not supported
    processes: Mapping[int, int] = field(default_factory=dict)  # pid -> bytes in use
    process_util: Mapping[int, int] = field(default_factory=dict)  # pid -> SM % over the window


def _text(value: str | bytes) -> str:
    # Old nvidia-ml-py releases return bytes, newer ones str.
    return value.decode() if isinstance(value, bytes) else value


def _init(library: Path | None) -> None:
    """Load NVML (the configured library first, if any) and initialise it once."""
    global _initialised
    with _lock:
        if library is not None and library not in _preloaded:
            try:
                _preloaded[library] = ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
            except OSError as e:
                raise InventoryError(f"load NVML library {library}", str(e)) from e
        if _initialised:
            return
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound as e:
            raise InventoryError(
                "load NVML",
                "libnvidia-ml.so.1 not found: install the NVIDIA driver, or set nvml.library "
                "in the config (build/simgpu/libnvidia-ml.so.1 for simulated GPUs)") from e
        except pynvml.NVMLError as e:
            raise InventoryError("initialise NVML", str(e)) from e
        _initialised = True


def shutdown() -> None:
    """Release NVML (discover() or sample() initialise it again when called)."""
    global _initialised
    with _lock:
        if _initialised:
            _initialised = False
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()


def _optional(fn: Callable[..., T], *args: Any) -> T | None:
    """fn(*args), or None where this GPU or driver does not support the query."""
    try:
        return fn(*args)
    except pynvml.NVMLError_NotSupported:
        return None


def discover(config: Config) -> list[Gpu]:
    """The GPUs vgpud may use: NVML's devices, restricted to config.devices_include."""
    _init(config.nvml_library)
    try:
        gpus: list[Gpu] = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            minor = _optional(pynvml.nvmlDeviceGetMinorNumber, handle)
            minor = index if minor is None else int(minor)
            gpus.append(Gpu(
                index=index,
                uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                name=_text(pynvml.nvmlDeviceGetName(handle)),
                memory=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                minor=minor,
                device_nodes=config.nodes_for(index, minor),
            ))
    except pynvml.NVMLError as e:
        raise InventoryError("list GPUs through NVML", str(e)) from e
    return _restrict(gpus, config.devices_include)


@dataclass(frozen=True)
class DriverVersions:
    """The driver's version ("570.86.15") and the CUDA version it supports ("12.8")."""

    driver: str = ""
    cuda: str = ""


def driver_versions() -> DriverVersions:
    """NVML's nvmlSystemGetDriverVersion and nvmlSystemGetCudaDriverVersion_v2 (as
    "major.minor"); "" for one NVML cannot tell. Needs NVML initialised by discover()."""
    _init(None)
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
    except pynvml.NVMLError:
        driver = ""
    try:
        cuda = int(pynvml.nvmlSystemGetCudaDriverVersion_v2())  # e.g. 12080
        cuda_text = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda > 0 else ""
    except pynvml.NVMLError:
        cuda_text = ""
    return DriverVersions(driver, cuda_text)


def _restrict(gpus: list[Gpu], include: Iterable[int | str] | None) -> list[Gpu]:
    if include is None:
        return gpus
    by_key: dict[int | str, Gpu] = {g.index: g for g in gpus}
    by_key.update({g.uuid.lower(): g for g in gpus})
    chosen: set[int] = set()
    for item in include:
        key = item.lower() if isinstance(item, str) else item
        gpu = by_key.get(key)
        if gpu is None:
            have = f"0-{len(gpus) - 1}" if gpus else "none"
            raise InventoryError(
                "select GPUs", f"devices.include names GPU {item}, which does not exist "
                f"(have {have}: {', '.join(g.uuid for g in gpus) or 'no GPU'})")
        chosen.add(gpu.index)
    return [g for g in gpus if g.index in chosen]


def sample(gpus: Iterable[Gpu]) -> dict[int, DeviceSample]:
    """Memory in use, utilisation and per-process memory of each GPU, keyed by GPU index.

    Needs NVML initialised by discover() first. A GPU that vanished or fails is
    left out rather than failing the whole sample (the caller keeps last values).
    """
    _init(None)
    out: dict[int, DeviceSample] = {}
    for gpu in gpus:
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(gpu.index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            rates = _optional(pynvml.nvmlDeviceGetUtilizationRates, handle)
            running = _optional(pynvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
        except pynvml.NVMLError:
            continue
        processes: dict[int, int] = {}
        util: dict[int, int] = {}
        for smp in _process_samples(handle):
            util[int(smp.pid)] = max(util.get(int(smp.pid), 0), int(smp.smUtil))
        for proc in running:
            # usedGpuMemory is None where the driver cannot tell (e.g. under WDDM/MIG).
            used = getattr(proc, "usedGpuMemory", None)
            processes[int(proc.pid)] = processes.get(int(proc.pid), 0) + int(used or 0)
        out[gpu.index] = DeviceSample(
            index=gpu.index,
            used=int(memory.used),
            total=int(memory.total),
            utilization=int(rates.gpu) if rates is not None else None,
            processes=processes,
            process_util=util,
        )
    return out


def unhealthy(gpus: Iterable[Gpu]) -> dict[int, str]:
    """GPU index -> why NVML cannot use it now, for each GPU it cannot use.

    A GPU that fell off the bus answers NVML_ERROR_GPU_IS_LOST to any query, its
    handle included; one whose index now names another board (a reset, a re-plug)
    is no longer the GPU vgpud placed slices on. Needs NVML initialised by discover().
    """
    _init(None)
    out: dict[int, str] = {}
    for gpu in gpus:
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(gpu.index)
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            pynvml.nvmlDeviceGetMemoryInfo(handle)
        except pynvml.NVMLError as e:
            out[gpu.index] = str(e)
            continue
        if uuid.lower() != gpu.uuid.lower():
            out[gpu.index] = f"index {gpu.index} is now GPU {uuid}, not {gpu.uuid}"
    return out


#: How far back per-process utilisation samples are read.
UTIL_WINDOW_S = 1.0


def process_utilisation(gpus: Iterable[Gpu],
                        window_s: float = UTIL_WINDOW_S) -> dict[int, dict[int, int]]:
    """GPU index -> pid -> SM % over the last window_s (the mean of its NVML samples).

    The compute guard's measure. A mean, not the max that sample() reports: a
    driver samples every ~1/6 s and one busy sample is not a busy window.
    """
    _init(None)
    out: dict[int, dict[int, int]] = {}
    for gpu in gpus:
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(gpu.index)
        except pynvml.NVMLError:
            continue
        per_pid: dict[int, list[int]] = {}
        for smp in _process_samples(handle, window_s):
            per_pid.setdefault(int(smp.pid), []).append(int(smp.smUtil))
        out[gpu.index] = {pid: round(sum(v) / len(v)) for pid, v in per_pid.items()}
    return out


def _process_samples(handle: Any, window_s: float = UTIL_WINDOW_S) -> list[Any]:
    """NVML's per-process utilisation samples of the last window_s ([] when none)."""
    since_us = int((time.time() - window_s) * 1_000_000)
    try:
        return list(pynvml.nvmlDeviceGetProcessUtilization(handle, since_us))
    except pynvml.NVMLError:  # NOT_FOUND: nothing ran lately; NOT_SUPPORTED: no such counter
        return []
