#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# tests/gpu/run.sh - libvgpu's memory limit on a real NVIDIA GPU (not for CI).
#
#   tests/gpu/run.sh [LIMIT]          LIMIT defaults to 2Gi
#
# Builds libvgpu (make), prints the GPU and driver, then runs
# tests/gpu/check_memory.py under LD_PRELOAD=build/libvgpu.so twice:
#   1. VGPU_MEMORY_LIMIT=LIMIT: PyTorch (or CuPy) sees total == LIMIT, is stopped
#      at it with OutOfMemoryError, recovers after freeing, NVML agrees; the same
#      again with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (the VMM path);
#   2. no VGPU_* variables: the library is loaded but inert, totals are physical;
# then tests/libvgpu/test_cudart.py on this GPU: NVIDIA's CUDA runtime API (libcudart) under
# libvgpu (cudaMemGetInfo, cudaMalloc, a cudaMallocAsync pool, a compute share).
# Exit status: 0 when every check passed, 1 when one failed, 2 when it could not run.
# Takes about a minute on an H200 (each run is bounded by `timeout`).
#
# Needs: gcc, make, python3 with PyTorch (or CuPy) that can see the GPU.
# It installs nothing, with one exception: when nvidia-ml-py (import pynvml) is
# missing it tries `pip install --user nvidia-ml-py` once (set VGPU_GPU_NO_PIP=1
# to skip; without it the nvidia-ml-py rows are SKIP, the ctypes NVML rows still run).
# PYTHON=/path/to/python picks the interpreter (default python3).
set -u -o pipefail

cd "$(dirname "$0")/../.."
LIMIT=${1:-2Gi}
PY=${PYTHON:-python3}
LIB=$PWD/build/libvgpu.so
CHECK=tests/gpu/check_memory.py

# Start from a clean slate: no vgpu config or preload inherited from the caller.
for v in $(env | sed -n 's/^\(VGPU_[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$v"; done
unset LD_PRELOAD PYTORCH_CUDA_ALLOC_CONF

echo "== GPU"
if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "nvidia-smi not found: this needs a real NVIDIA GPU and driver" >&2
    exit 2
fi
nvidia-smi -L || exit 2
nvidia-smi --query-gpu=driver_version,name,memory.total --format=csv || exit 2
if [ -e /dev/vgpu0 ]; then
    echo "/dev/vgpu0 exists: libvgpu would use that slice and ignore VGPU_MEMORY_LIMIT; run outside a vgpu container" >&2
    exit 2
fi

echo "== build"
make -s || exit 2
[ -f "$LIB" ] || { echo "$LIB was not built" >&2; exit 2; }

echo "== python"
"$PY" -c 'import sys; print(sys.version.split()[0])' || exit 2
if ! "$PY" -c 'import pynvml' 2>/dev/null && [ "${VGPU_GPU_NO_PIP:-0}" != 1 ]; then
    echo "nvidia-ml-py missing: trying pip install --user nvidia-ml-py"
    "$PY" -m pip install -q --user --retries 0 --timeout 15 nvidia-ml-py \
        || echo "(pip install failed: the nvidia-ml-py rows will be SKIP)"
fi

status=0
run() {  # run NAME ENV... -- ARGS...
    local name=$1; shift
    local envs=()
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    echo
    echo "== $name"
    env "${envs[@]}" timeout 280 "$PY" "$CHECK" "$@"
    local rc=$?
    echo "(exit $rc)"
    if [ $rc -gt $status ]; then status=$rc; fi
    if [ $rc -ne 0 ] && [ $rc -ne 1 ]; then status=2; fi
}

run "limited: VGPU_MEMORY_LIMIT=$LIMIT" LD_PRELOAD="$LIB" VGPU_MEMORY_LIMIT="$LIMIT" -- --limit "$LIMIT"
run "inert: no VGPU_* env" LD_PRELOAD="$LIB" -- --inert --limit "$LIMIT"

# NVIDIA's CUDA runtime API under libvgpu: the suite's own tests/libvgpu/test_cudart.py,
# on this GPU's driver (VGPU_TEST_REAL_GPU=1), with the runtime wheels' libcudart (the
# `test` extra) or the copies in build/cudart/ (tests/gpu/README.md).
echo
echo "== CUDA runtime API: tests/libvgpu/test_cudart.py"
cudart=$(ls build/cudart/libcudart.so.* 2>/dev/null | paste -sd, -)
if ! "$PY" -c 'import pytest, grpc, yaml' 2>/dev/null; then
    echo "SKIP: $PY lacks the test dependencies (pip install -e '.[test]')"
else
    env VGPU_TEST_REAL_GPU=1 VGPU_TEST_NO_BUILD=1 ${cudart:+VGPU_TEST_CUDART=$cudart} \
        timeout 280 "$PY" -m pytest -q -rs -p no:cacheprovider tests/libvgpu/test_cudart.py
    rc=$?
    echo "(exit $rc)"
    case $rc in
        0) ;;
        1) [ $status -gt 1 ] || status=1;;
        *) status=2;;
    esac
fi

echo
case $status in
    0) echo "ALL PASSED";;
    1) echo "SOME CHECKS FAILED";;
    *) echo "COULD NOT RUN EVERY CHECK (exit $status)";;
esac
exit $status
