#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""libvgpu's memory limit on a real NVIDIA GPU, seen through PyTorch (or CuPy).

Needs a real GPU, so it is not part of the pytest suite (no file in tests/gpu/
is named test_*.py, so pytest collects nothing here). tests/gpu/run.sh builds
libvgpu and runs it:

  LD_PRELOAD=$PWD/build/libvgpu.so VGPU_MEMORY_LIMIT=2Gi \\
      python3 tests/gpu/check_memory.py --limit 2Gi
      limited: mem_get_info total == limit, free <= limit; work under the limit
      computes right; one allocation past it and filling up to it raise
      OutOfMemoryError; freeing makes room again; NVML (nvidia-ml-py and a
      direct ctypes call) shows total == limit. Then the same again in a child
      process with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, PyTorch's
      VMM allocator (cuMemCreate/cuMemMap), unless --no-vmm.
  LD_PRELOAD=$PWD/build/libvgpu.so python3 tests/gpu/check_memory.py --inert --limit 2Gi
      no VGPU_* env: the library is loaded but inert, the totals are the
      physical ones (measured by a child process without LD_PRELOAD) and more
      than the limit can be allocated.

Prints a table (check, expected, got, PASS/FAIL/SKIP). Exit status: 0 all
passed, 1 a check failed, 2 it could not run (no GPU, no PyTorch or CuPy).
Dependencies: PyTorch or CuPy; nvidia-ml-py is optional (its rows are SKIP
without it; the ctypes NVML rows run regardless).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from arbiter.quantity import format_memory, parse_memory  # noqa: E402

MI, GI = 1 << 20, 1 << 30
CHUNK = 128 * MI          # fill-up step
SLACK = 512 * MI          # what the fill may fall short of the limit (cuBLAS handles, rounding)
ROWS_MARK = "VGPU_CHECK_ROWS "


def mib(n: int | None) -> str:
    return "-" if n is None else f"{n / MI:.1f} MiB"


class Report:
    def __init__(self, prefix: str = "") -> None:
        self.rows: list[list[str]] = []
        self.prefix = prefix

    def add(self, check: str, expected: str, got: str, ok: bool | None) -> None:
        status = "SKIP" if ok is None else ("PASS" if ok else "FAIL")
        self.rows.append([self.prefix + check, expected, got, status])

    def guard(self, check: str, expected: str, fn: Callable[[], tuple[str, bool | None]]) -> None:
        """Run one check; an exception is a FAIL row, never an aborted run."""
        try:
            got, ok = fn()
        except Exception as e:
            got, ok = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}", False
        self.add(check, expected, got, ok)

    def failed(self) -> bool:
        return any(r[3] == "FAIL" for r in self.rows)

    def print(self) -> None:
        head = ["check", "expected", "got", "result"]
        widths = [max(len(r[i]) for r in [*self.rows, head]) for i in range(4)]
        line = "  ".join(f"{{:<{w}}}" for w in widths)
        print(line.format(*head))
        print(line.format(*("-" * w for w in widths)))
        for r in self.rows:
            print(line.format(*r))
        n = {s: sum(r[3] == s for r in self.rows) for s in ("PASS", "FAIL", "SKIP")}
        print(f"\n{n['PASS']} passed, {n['FAIL']} failed, {n['SKIP']} skipped")


# ---------------------------------------------------------------------------
# Backends: the few operations the checks need
# ---------------------------------------------------------------------------

class NoGpuError(Exception):
    pass


class TorchBackend:
    name = "torch"

    def __init__(self) -> None:
        import torch
        self.torch = torch
        if not torch.cuda.is_available():
            raise NoGpuError("no CUDA GPU available: torch.cuda.is_available() is False "
                             f"(torch {torch.__version__}, built for CUDA {torch.version.cuda})")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        self.oom = torch.cuda.OutOfMemoryError
        self.dev = torch.device("cuda", 0)

    def describe(self) -> str:
        t = self.torch
        conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        return (f"torch {t.__version__} (CUDA {t.version.cuda}), {t.cuda.get_device_name(0)}, "
                f"PYTORCH_CUDA_ALLOC_CONF={conf!r}")

    def mem_get_info(self) -> tuple[int, int]:
        free, total = self.torch.cuda.mem_get_info(0)
        return int(free), int(total)

    def device_total(self) -> int:
        return int(self.torch.cuda.get_device_properties(0).total_memory)

    def alloc(self, nbytes: int) -> Any:
        return self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.dev)

    def fill_and_sum(self, buf: Any) -> int:
        buf.fill_(1)
        return int(buf.sum(dtype=self.torch.int64).item())

    def matmul_error(self, n: int) -> float:
        t = self.torch
        g = t.Generator().manual_seed(1234)
        a = t.randn(n, n, generator=g, dtype=t.float32)
        b = t.randn(n, n, generator=g, dtype=t.float32)
        want = (a.double() @ b.double())
        got = (a.to(self.dev) @ b.to(self.dev)).cpu().double()
        t.cuda.synchronize()
        return float((got - want).abs().max() / want.abs().max())

    def release(self) -> None:
        self.torch.cuda.synchronize()
        self.torch.cuda.empty_cache()

    def reserved(self) -> int:
        return int(self.torch.cuda.memory_reserved(0))


class CupyBackend:
    name = "cupy"

    def __init__(self) -> None:
        import cupy
        import numpy
        self.cp, self.np = cupy, numpy
        try:
            n = cupy.cuda.runtime.getDeviceCount()
        except cupy.cuda.runtime.CUDARuntimeError as e:
            raise NoGpuError(
                f"no CUDA GPU available: cupy.cuda.runtime.getDeviceCount() failed: {e}") from e
        if n < 1:
            raise NoGpuError("no CUDA GPU available: CuPy sees no CUDA device")
        self.oom = cupy.cuda.memory.OutOfMemoryError
        self.pool = cupy.get_default_memory_pool()

    def describe(self) -> str:
        props = self.cp.cuda.runtime.getDeviceProperties(0)
        return f"cupy {self.cp.__version__}, {props['name'].decode()}"

    def mem_get_info(self) -> tuple[int, int]:
        free, total = self.cp.cuda.runtime.memGetInfo()
        return int(free), int(total)

    def device_total(self) -> int:
        return int(self.cp.cuda.runtime.getDeviceProperties(0)["totalGlobalMem"])

    def alloc(self, nbytes: int) -> Any:
        return self.cp.empty(nbytes, dtype=self.cp.uint8)

    def fill_and_sum(self, buf: Any) -> int:
        buf.fill(1)
        return int(buf.sum(dtype=self.cp.int64).get())

    def matmul_error(self, n: int) -> float:
        rng = self.np.random.default_rng(1234)
        a = rng.standard_normal((n, n), dtype=self.np.float32)
        b = rng.standard_normal((n, n), dtype=self.np.float32)
        want = a.astype(self.np.float64) @ b.astype(self.np.float64)
        got = self.cp.asnumpy(self.cp.asarray(a) @ self.cp.asarray(b)).astype(self.np.float64)
        return float(abs(got - want).max() / abs(want).max())

    def release(self) -> None:
        self.cp.cuda.Device(0).synchronize()
        self.pool.free_all_blocks()

    def reserved(self) -> int:
        return int(self.pool.total_bytes())


def make_backend(which: str) -> Any:
    errors = []
    for cls in (TorchBackend, CupyBackend):
        if which not in ("auto", cls.name):
            continue
        try:
            return cls()
        except ImportError as e:
            errors.append(f"{cls.name} ({e})")
    raise NoGpuError("neither PyTorch nor CuPy can be imported: " + "; ".join(errors))


# ---------------------------------------------------------------------------
# NVML and the physical totals, without PyTorch
# ---------------------------------------------------------------------------

class NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


def nvml_ctypes_total(index: int = 0) -> int:
    """nvmlDeviceGetMemoryInfo through dlopen/dlsym, as C clients do."""
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    rc = nvml.nvmlInit_v2()
    if rc != 0:
        raise RuntimeError(f"nvmlInit_v2 returned {rc}")
    try:
        h = ctypes.c_void_p()
        rc = nvml.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(h))
        if rc != 0:
            raise RuntimeError(f"nvmlDeviceGetHandleByIndex_v2 returned {rc}")
        m = NvmlMemory()
        rc = nvml.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m))
        if rc != 0:
            raise RuntimeError(f"nvmlDeviceGetMemoryInfo returned {rc}")
        return int(m.total)
    finally:
        nvml.nvmlShutdown()


def pynvml_totals(index: int = 0) -> dict[str, int] | None:
    """{'v1': total, 'v2': total (when nvidia-ml-py has it)}; None without nvidia-ml-py."""
    try:
        import pynvml
    except ImportError:
        return None
    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        out = {"v1": int(pynvml.nvmlDeviceGetMemoryInfo(h).total)}
        if hasattr(pynvml, "nvmlMemory_v2"):
            out["v2"] = int(pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).total)
        return out
    finally:
        pynvml.nvmlShutdown()


def cuda_ctypes_totals(index: int = 0) -> dict[str, int]:
    """cuMemGetInfo_v2 / cuDeviceTotalMem_v2 straight from libcuda.so.1."""
    cuda = ctypes.CDLL("libcuda.so.1")

    def ok(rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what} returned {rc}")

    ok(cuda.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    ok(cuda.cuDeviceGet(ctypes.byref(dev), index), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    ok(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    ok(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    free, total, dtotal = ctypes.c_size_t(), ctypes.c_size_t(), ctypes.c_size_t()
    ok(cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo_v2")
    ok(cuda.cuDeviceTotalMem_v2(ctypes.byref(dtotal), dev), "cuDeviceTotalMem_v2")
    cuda.cuDevicePrimaryCtxRelease_v2(dev)
    return {"cuMemGetInfo": total.value, "cuDeviceTotalMem": dtotal.value}


def physical_probe() -> int:
    """Child mode: print the physical totals (run without LD_PRELOAD)."""
    out: dict[str, Any] = {}
    try:
        out.update(cuda_ctypes_totals())
    except Exception as e:
        out["cuda_error"] = str(e)
    try:
        out["nvml"] = nvml_ctypes_total()
    except Exception as e:
        out["nvml_error"] = str(e)
    print(json.dumps(out))
    return 0


def physical_totals() -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPU_")}
    env.pop("LD_PRELOAD", None)
    p = subprocess.run([sys.executable, __file__, "--physical-probe"], env=env,
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"physical probe exited {p.returncode}: {p.stderr.strip()[-300:]}")
    result: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return result


def libvgpu_loaded() -> bool:
    with open("/proc/self/maps") as f:
        return "libvgpu.so" in f.read()


# ---------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------

def check_nvml(rep: Report, want: int, what: str) -> None:
    rep.guard("NVML total (ctypes, dlsym path)", f"== {what} {mib(want)}",
              lambda: (mib(t := nvml_ctypes_total()), t == want))
    try:
        totals = pynvml_totals()
    except Exception as e:
        rep.add("NVML total (nvidia-ml-py)", f"== {what}", f"{type(e).__name__}: {e}", False)
        return
    if totals is None:
        rep.add("NVML total (nvidia-ml-py)", f"== {what}", "nvidia-ml-py not installed", None)
        return
    for ver, total in totals.items():
        rep.add(f"NVML total (nvidia-ml-py, memory info {ver})", f"== {what} {mib(want)}",
                mib(total), total == want)


def limited_checks(be: Any, rep: Report, limit: int) -> None:
    rep.add("libvgpu.so loaded", "yes", "yes" if libvgpu_loaded() else "no", libvgpu_loaded())
    env_limit = os.environ.get("VGPU_MEMORY_LIMIT")
    rep.add("VGPU_MEMORY_LIMIT", format_memory(limit), repr(env_limit),
            env_limit is not None and parse_memory(env_limit) == limit)

    free0, total0 = be.mem_get_info()
    rep.add("mem_get_info total", f"== limit {mib(limit)}", mib(total0), total0 == limit)
    rep.add("mem_get_info free", "<= limit, > 0", mib(free0), 0 < free0 <= limit)
    rep.guard("device total_memory", f"== limit {mib(limit)}",
              lambda: (mib(t := be.device_total()), t == limit))

    def under_limit() -> tuple[str, bool]:
        n = limit // 4
        buf = be.alloc(n)
        s = be.fill_and_sum(buf)
        del buf
        return f"sum {s}", s == n
    rep.guard("alloc limit/4, fill, sum", f"sum {limit // 4}", under_limit)
    rep.guard("matmul 1024x1024 fp32 vs CPU", "max rel err < 1e-4",
              lambda: (f"{(e := be.matmul_error(1024)):.2e}", e < 1e-4))
    be.release()

    def one_past() -> tuple[str, bool]:
        try:
            buf = be.alloc(limit + 64 * MI)
        except be.oom:
            return "OutOfMemoryError", True
        del buf
        return "allocated", False
    rep.guard("alloc limit + 64 MiB", "OutOfMemoryError", one_past)
    be.release()

    held: list[Any] = []

    def fill() -> tuple[str, bool]:
        # Bounded, so a limit that does not hold cannot eat the physical GPU.
        for _ in range(limit // CHUNK + 8):
            try:
                held.append(be.alloc(CHUNK))
            except be.oom:
                return f"OOM after {len(held)} x {CHUNK // MI} MiB", True
        return f"{len(held)} x {CHUNK // MI} MiB, no OOM", False
    rep.guard(f"fill in {CHUNK // MI} MiB steps", "OutOfMemoryError", fill)
    reserved = be.reserved()
    rep.add("reserved when full", f"in ({mib(limit - SLACK)}, {mib(limit)}]", mib(reserved),
            limit - SLACK < reserved <= limit)
    rep.guard("mem_get_info free when full", f"< {mib(CHUNK + 64 * MI)}",
              lambda: (mib(f := be.mem_get_info()[0]), f < CHUNK + 64 * MI))
    rep.guard("mem_get_info total when full", f"== limit {mib(limit)}",
              lambda: (mib(t := be.mem_get_info()[1]), t == limit))
    held.clear()
    be.release()

    rep.guard("free after release", f"> {mib(limit - SLACK)}",
              lambda: (mib(f := be.mem_get_info()[0]), f > limit - SLACK))

    def again() -> tuple[str, bool]:
        n = limit * 3 // 4
        buf = be.alloc(n)
        s = be.fill_and_sum(buf)
        del buf
        be.release()
        return f"sum {s}", s == n
    rep.guard("alloc 3/4 limit after release", f"sum {limit * 3 // 4}", again)
    check_nvml(rep, limit, "limit")


def inert_checks(be: Any, rep: Report, limit: int) -> None:
    rep.add("libvgpu.so loaded", "yes", "yes" if libvgpu_loaded() else "no", libvgpu_loaded())
    vg = sorted(k for k in os.environ if k.startswith("VGPU_"))
    rep.add("VGPU_* env", "none", ",".join(vg) or "none", not vg)
    try:
        phys = physical_totals()
    except Exception as e:
        rep.add("physical totals (child, no LD_PRELOAD)", "measured", str(e)[:120], False)
        return
    cuda_total = phys.get("cuMemGetInfo")
    rep.add("physical cuMemGetInfo total (no preload)", "> limit",
            mib(cuda_total) if cuda_total else phys.get("cuda_error", "?"),
            bool(cuda_total and cuda_total > limit))
    _, total = be.mem_get_info()
    rep.add("mem_get_info total", f"== physical {mib(cuda_total)}", mib(total), total == cuda_total)
    rep.guard("device total_memory", f"== physical {mib(phys.get('cuDeviceTotalMem'))}",
              lambda: (mib(t := be.device_total()), t == phys.get("cuDeviceTotalMem")))

    def past_limit() -> tuple[str, bool]:
        n = limit + GI
        buf = be.alloc(n)
        s = be.fill_and_sum(buf)
        del buf
        be.release()
        return f"sum {s}", s == n
    rep.guard(f"alloc limit + 1 GiB ({mib(limit + GI)})", "works (no limit)", past_limit)
    rep.guard("matmul 1024x1024 fp32 vs CPU", "max rel err < 1e-4",
              lambda: (f"{(e := be.matmul_error(1024)):.2e}", e < 1e-4))
    nvml_phys = phys.get("nvml")
    if nvml_phys is None:
        rep.add("NVML total", "== physical", phys.get("nvml_error", "?"), False)
    else:
        check_nvml(rep, nvml_phys, "physical")


def run_vmm_child(args: argparse.Namespace) -> list[list[str]]:
    env = dict(os.environ)
    env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    cmd = [sys.executable, __file__, "--limit", args.limit, "--backend", "torch", "--rows-json"]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        return [["vmm: child process", "finishes", "timed out after 240 s", "FAIL"]]
    for line in reversed(p.stdout.splitlines()):
        if line.startswith(ROWS_MARK):
            rows: list[list[str]] = json.loads(line[len(ROWS_MARK):])
            return rows
    tail = (p.stderr.strip() or p.stdout.strip())[-200:].replace("\n", " | ")
    return [["vmm: child process", "exit 0", f"exit {p.returncode}: {tail}", "FAIL"]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", default="2Gi", help="the VGPU_MEMORY_LIMIT in force (default 2Gi)")
    ap.add_argument("--inert", action="store_true",
                    help="no VGPU_* env: expect the physical totals and no limit")
    ap.add_argument("--backend", choices=("auto", "torch", "cupy"), default="auto")
    ap.add_argument("--no-vmm", action="store_true",
                    help="skip the PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True child run")
    ap.add_argument("--rows-json", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--physical-probe", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.physical_probe:
        return physical_probe()
    limit = parse_memory(args.limit)

    t0 = time.monotonic()
    try:
        be = make_backend(args.backend)
    except NoGpuError as e:
        print(f"check_memory.py: cannot run: {e}.\nIt needs a real NVIDIA GPU with PyTorch "
              "(or CuPy) installed; see tests/gpu/README.md.",
              file=sys.stderr)
        return 2

    vmm = "expandable_segments:true" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").lower()
    rep = Report("vmm: " if args.rows_json and vmm else "")
    if not args.rows_json:
        mode = "inert (no VGPU_* env)" if args.inert else f"limited to {format_memory(limit)}"
        print(f"== check_memory.py: {mode}; {be.describe()}")
    if args.inert:
        inert_checks(be, rep, limit)
    else:
        limited_checks(be, rep, limit)

    if args.rows_json:
        print(ROWS_MARK + json.dumps(rep.rows))
        return 0
    if not args.inert:
        if args.no_vmm:
            rep.add("vmm: expandable_segments run", "run", "--no-vmm", None)
        elif be.name != "torch":
            rep.add("vmm: expandable_segments run", "run", "PyTorch only (backend is CuPy)", None)
        else:
            rep.rows += run_vmm_child(args)
    rep.print()
    print(f"({time.monotonic() - t0:.1f} s)")
    return 1 if rep.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
