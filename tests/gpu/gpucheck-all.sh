#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# tests/gpu/gpucheck-all.sh [OUTDIR] - the real-GPU check in one command (issue 24): the GPU
# without libvgpu, compute shares under libvgpu, interception coverage, memory limits. About
# 3 minutes on one GPU (hardware ~12 s and share rows 1-9 ~70 s measured on an H200; rows
# 10-21 about 95 s more, estimated; 175 s on simgpu); no network, no Python.
#
#   1. hardware   tests/gpu/gpucheck.sh OUTDIR/hardware           (no libvgpu)
#   2. shares     tests/gpu/gpucheck-shares.sh OUTDIR/shares      (libvgpu, VGPU_SCHED_DIR)
#   3. coverage   gpucheck coverage OUTDIR   under LD_PRELOAD=$LIBVGPU, VGPU_MEMORY_LIMIT:
#                 every hooked name's cuGetProcAddress answer at CUDA 11.3/12.0/12.8/13.0,
#                 default and per-thread stream, is a libvgpu hook; cuInit passes libvgpu's
#                 start-up self-check (or it refuses, with one line, where one is not)
#   4. memory     gpucheck meminfo OUTDIR (no libvgpu, CUDA_MODULE_LOADING=LAZY: the card's
#                 free memory, what a context and a lazily loaded module take), then
#                 gpucheck memory OUTDIR under libvgpu with a limit of GPUCHECK_LIMIT_MIB
#
# OUTDIR (default ./gpucheck-all-out) gets gpucheck-all.json (every part, one object:
# hardware, shares, coverage, meminfo, memory, runtime_s, exit codes) and gpucheck-all.txt
# (the tables, as printed), beside each part's own files.
#
# GPUCHECK_PARTS (default "hardware shares coverage memory") picks parts; GPUCHECK_WINDOW,
# GPUCHECK_WARM and GPUCHECK_ROWS go to the shares part; GPUCHECK_LIMIT_MIB (1024) is the
# memory limit; GPUCHECK_CONTEXT_RESERVE (bytes; default: defaults.context_reserve of
# configs/vgpu.yaml) is what a context and its module must fit in; LIBVGPU
# (build/libvgpu.so) and GPUCHECK_BIN as in the other scripts.
#
# On simgpu: LD_LIBRARY_PATH=build/simgpu tests/gpu/gpucheck-all.sh /tmp/out (tests/libvgpu/
# test_gpucheck.py runs it so, with short windows). SIMGPU_STATE defaults to a file in OUTDIR.
# Exit status: 0 every part passed, 1 a part failed, 2 nothing could run.
set -u -o pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-gpucheck-all-out}
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
SRC=$ROOT/tests/gpu/gpucheck.c
LIBVGPU=${LIBVGPU:-$ROOT/build/libvgpu.so}
PARTS=${GPUCHECK_PARTS:-hardware shares coverage memory}
LIMIT_MIB=${GPUCHECK_LIMIT_MIB:-1024}

case $LIBVGPU in /*) ;; *) LIBVGPU=$PWD/$LIBVGPU ;; esac
export LIBVGPU
export SIMGPU_STATE=${SIMGPU_STATE:-$OUT/simgpu.state}
# The parts set what they need: nothing of vgpu's configuration from the caller.
for v in $(env | sed -n 's/^\(VGPU_[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$v"; done
unset LD_PRELOAD

# defaults.context_reserve of configs/vgpu.yaml, in bytes (a bare number is MiB).
reserve_default() {
    awk '/^defaults:/ { d = 1; next } /^[^ #]/ { d = 0 }
         d && $1 == "context_reserve:" {
             v = $2; m = 1048576
             if (v ~ /Gi$/) m = 1073741824; else if (v ~ /Ki$/) m = 1024; else if (v ~ /Mi$/) m = 1048576
             sub(/[A-Za-z]+$/, "", v); print v * m; exit }' "$ROOT/configs/vgpu.yaml" 2>/dev/null
}
RESERVE=${GPUCHECK_CONTEXT_RESERVE:-$(reserve_default)}
RESERVE=${RESERVE:-0}

NAME=gpucheck-all
. "$ROOT/tests/gpu/gpucheck-bin.sh"
export GPUCHECK_BIN=$BIN
if [ ! -f "$LIBVGPU" ]; then
    echo "gpucheck-all: no $LIBVGPU (run make, or set LIBVGPU)" >&2
    exit 2
fi

T0=$(date +%s.%N)
declare -A RC
want() { [[ " $PARTS " == *" $1 "* ]]; }

{
    echo "== gpucheck-all $(date -u +%Y-%m-%dT%H:%M:%SZ) $(uname -srm); $BIN; libvgpu $LIBVGPU; parts: $PARTS"
    if want hardware; then
        echo
        echo "==== 1. the GPU without libvgpu"
        "$ROOT/tests/gpu/gpucheck.sh" "$OUT/hardware"
        RC[hardware]=$?
    fi
    if want shares; then
        echo
        echo "==== 2. compute shares under libvgpu"
        "$ROOT/tests/gpu/gpucheck-shares.sh" "$OUT/shares"
        RC[shares]=$?
    fi
    if want coverage; then
        echo
        echo "==== 3. interception coverage (LD_PRELOAD=$LIBVGPU VGPU_MEMORY_LIMIT=$LIMIT_MIB)"
        LD_PRELOAD=$LIBVGPU VGPU_MEMORY_LIMIT=$LIMIT_MIB timeout -k 5 60 "$BIN" coverage "$OUT"
        RC[coverage]=$?
    fi
    if want memory; then
        echo
        echo "==== 4. memory: the card without libvgpu (CUDA_MODULE_LOADING=LAZY), then a $LIMIT_MIB MiB limit"
        rm -f "$OUT/meminfo.env"
        CUDA_MODULE_LOADING=LAZY timeout -k 5 60 "$BIN" meminfo "$OUT"
        RC[meminfo]=$?
        card_free=0 context_bytes=-1 module_bytes=-1
        # shellcheck disable=SC1091 # written by gpucheck meminfo just now
        [ -f "$OUT/meminfo.env" ] && . "$OUT/meminfo.env"
        LD_PRELOAD=$LIBVGPU VGPU_MEMORY_LIMIT=$LIMIT_MIB CUDA_MODULE_LOADING=LAZY timeout -k 5 120 "$BIN" memory \
            "$OUT" --limit-mib "$LIMIT_MIB" --card-free "$card_free" --context-bytes "$context_bytes" \
            --module-bytes "$module_bytes" --context-reserve "$RESERVE"
        RC[memory]=$?
    fi
    declare -p RC >"$OUT/.rc"
} 2>&1 | tee "$OUT/gpucheck-all.txt"
# shellcheck disable=SC1091
. "$OUT/.rc" 2>/dev/null || declare -A RC
rm -f "$OUT/.rc"

# One JSON: each part's own file as it is, the shares' TSV as objects.
part_json() { if [ -s "$1" ]; then cat "$1"; else echo null; fi; }
shares_json() {
    [ -s "$OUT/shares/shares.tsv" ] || { echo null; return; }
    awk -F'\t' 'function s(x) { gsub(/\\/, "\\\\", x); gsub(/"/, "\\\"", x); return "\"" x "\"" }
        function n(x) { return (x ~ /^-?[0-9.]+$/) ? x : "null" }
        BEGIN { printf "[" }
        { printf "%s{\"row\":%s,\"load\":%s,\"target\":%s,\"achieved\":%s,\"idle_pct\":%s,\"overlap_pct\":%s,\"handovers\":%s,\"gap_p50_us\":%s,\"gap_p99_us\":%s,\"kernels\":%s,\"cut_pct\":%s,\"others_ran_on_ms\":%s,\"share_after_arrival\":%s}",
                 (NR > 1 ? "," : ""), s($1), s($2), n($3), n($4), n($5), n($6), n($7), n($8), n($9), n($10), n($11),
                 n($12), n($13) }
        END { printf "]" }' "$OUT/shares/shares.tsv"
}
FAILED=0
{
    printf '{"gpucheck_all_version":1,"parts":"%s","limit_mib":%s,"context_reserve":%s,\n' "$PARTS" "$LIMIT_MIB" "$RESERVE"
    printf '"hardware":'; part_json "$OUT/hardware/gpucheck.json"
    printf ',\n"shares":'; shares_json
    printf ',\n"coverage":'; part_json "$OUT/coverage.json"
    printf ',\n"meminfo":'; part_json "$OUT/meminfo.json"
    printf ',\n"memory":'; part_json "$OUT/memory.json"
    printf ',\n"exit":{'
    sep=
    for k in "${!RC[@]}"; do
        printf '%s"%s":%s' "$sep" "$k" "${RC[$k]}"
        sep=,
        [ "${RC[$k]}" = 0 ] || FAILED=1
    done
    printf '},\n"runtime_s":%s}\n' "$(awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')"
} >"$OUT/.gpucheck-all.json.tmp" && mv "$OUT/.gpucheck-all.json.tmp" "$OUT/gpucheck-all.json"

{
    echo
    for k in hardware shares coverage meminfo memory; do
        [ -n "${RC[$k]+x}" ] && printf '%-10s exit %s\n' "$k" "${RC[$k]}"
    done
    echo "$([ "$FAILED" = 0 ] && echo done || echo FAILED): $OUT/gpucheck-all.json, $OUT/gpucheck-all.txt"
} | tee -a "$OUT/gpucheck-all.txt"
[ "${#RC[@]}" -gt 0 ] || exit 2
exit "$FAILED"
