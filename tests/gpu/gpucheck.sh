#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# tests/gpu/gpucheck.sh [OUTDIR] - measure the GPU itself, without libvgpu (about 12 s on an H200).
#
# Runs gpucheck (built from tests/gpu/gpucheck.c, see below) and leaves in OUTDIR
# (default ./gpucheck-out): gpucheck.json, gpucheck.txt (the tables and anything the
# program said), nvidia-smi.txt when nvidia-smi exists.
#
# The binary: with gcc on the machine, it is compiled from the source into
# build/tests/gpucheck (or OUTDIR when build/ is not writable); without gcc, a prebuilt
# build/tests/gpucheck is used (`make gpucheck` where gcc is, then copy it
# with the tree). GPUCHECK_BIN=/path/to/gpucheck overrides both.
#
# On simgpu: LD_LIBRARY_PATH=build/simgpu tests/gpu/gpucheck.sh /tmp/out. SIMGPU_STATE
# defaults to a file in OUTDIR, so the run has a simulated GPU of its own.
#
# Exit status: the program's: 0 every section ran, 1 one failed, 2 nothing could run.
set -u -o pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-gpucheck-out}
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
SRC=$ROOT/tests/gpu/gpucheck.c

# Measure the hardware alone: no libvgpu, no vgpu configuration from the caller.
for v in $(env | sed -n 's/^\(VGPU_[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$v"; done
unset LD_PRELOAD
export SIMGPU_STATE=${SIMGPU_STATE:-$OUT/simgpu.state}

NAME=gpucheck
. "$ROOT/tests/gpu/gpucheck-bin.sh"

{
    echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) $(uname -srm)"
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi -q >"$OUT/nvidia-smi.txt" 2>&1
        nvidia-smi -L 2>&1
        nvidia-smi --query-gpu=name,driver_version,compute_mode,persistence_mode,clocks.sm,clocks.max.sm \
            --format=csv 2>&1
    fi
    echo "== $BIN $OUT"
    timeout -k 10 290 "$BIN" "$OUT"
} 2>&1 | tee "$OUT/gpucheck.txt"
exit "${PIPESTATUS[0]}"
