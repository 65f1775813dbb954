#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# tests/gpu/gpucheck-shares.sh [OUTDIR] - compute shares under libvgpu, read from the GPU's
# own timeline (issue 24, part 2; about 70 s on an H200 for rows 1-9, about 2.5 min for rows 1-21).
#
# Each row starts its loads together (`gpucheck load`, tests/gpu/gpucheck.c: spin kernels
# that stamp %globaltimer), each under LD_PRELOAD=$LIBVGPU (default build/libvgpu.so) with its own
# VGPU_COMPUTE_LIMIT and VGPU_POLICY, all in one fresh VGPU_SCHED_DIR per row (libvgpu runs
# its broker standalone: nothing else of vgpu is needed). `gpucheck shares` then merges
# the stamps and prints, over a window that starts 0.5 s after the row's first kernel,
# each load's share of GPU time against its target, the GPU's idle time and the hand-over
# gaps (GPU idle between one load's kernel and another's), p50/p99.
#
#   1-3  greedy 200 us kernels: fixed 30 + burst 70, fixed 50 + burst 50, fixed 10 + burst 90
#   4-6  a step loop (8 x 500 us, sync, 2 ms of CPU): alone without libvgpu (its use U),
#        fixed 50 alone (target min(50, U)), fixed 50 beside a greedy burst 50
#   7-8  50 us kernels synced every 8: alone without libvgpu (U), fixed 70 alone
#   9    greedy 2 ms kernels: fixed 30 + burst 70
#   10-12 greedy 200 us: fixed 70 + burst 30; splits 10:90 and 20:30:50, all fixed
#   13-14 10 us kernels polled (cuStreamQuery) every 8, 20 us of CPU: alone (U), fixed 50
#   15   50 us kernels fixed 30 beside 5 ms kernels burst 70
#   16-17 greedy 50 ms and 1 s kernels: fixed 30 + burst 70 (1 s: GPUCHECK_LONG_WINDOW, 10 s)
#   18   a priority pair: high burst 50 + low burst 50, both greedy (high should get it all)
#   19   one process on two streams (500 us kernels), fixed 40, beside a greedy burst 60
#   20   priority hand-over: high arrives 1.5 s into low's run; how long low's work ran on
#        after high's first kernel began, and high's share from then
#   21   graph launches: each 16 x 500 us kernels, captured in global mode while libvgpu's
#        holder thread runs, fixed 40, beside a greedy burst 60
#
# OUTDIR (default ./gpucheck-shares-out) receives shares.txt (what was printed),
# shares.tsv (title, load, target, achieved, idle %, overlap %, hand-overs, gap p50 us,
# gap p99 us, kernels, % of them cut by a switch, for a load that arrived late the ms the
# others ran on after it and its share from then; one line per load) and rowN/ (each
# load's stamps, stdout and stderr, the scheduling dir).
#
# On simgpu (LD_LIBRARY_PATH=build/simgpu; SIMGPU_STATE defaults to a file in OUTDIR)
# the kernels are busy_<N>us and write no stamps: shares come from launch-time accounting
# and the hand-overs from simgpu's engine timeline (build/tests/simgpu_timeline, its last
# 4096 kernels).
#
# GPUCHECK_WINDOW (5) and GPUCHECK_WARM (0.5) set the window in seconds; GPUCHECK_ROWS
# (e.g. "1 4 5") runs only those rows (a step loop's target needs its "alone" row).
# Exit status: 0 every row ran, 1 a load failed, 2 nothing could run.
set -u -o pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-gpucheck-shares-out}
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
SRC=$ROOT/tests/gpu/gpucheck.c
LIBVGPU=${LIBVGPU:-$ROOT/build/libvgpu.so}
WARM=${GPUCHECK_WARM:-0.5}
WINDOW=${GPUCHECK_WINDOW:-5}
LONG_WINDOW=${GPUCHECK_LONG_WINDOW:-10} # the row of 1 s kernels
ROWS=${GPUCHECK_ROWS:-}
RUN_S=$(awk -v w="$WARM" -v d="$WINDOW" 'BEGIN { print w + d + 0.3 }')
LEAD_NS=1500000000 # every load has made its context and loaded its kernels by then

# Only what each row sets: no libvgpu or vgpu configuration from the caller.
for v in $(env | sed -n 's/^\(VGPU_[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$v"; done
unset LD_PRELOAD
export SIMGPU_STATE=${SIMGPU_STATE:-$OUT/simgpu.state}

case $LIBVGPU in /*) ;; *) LIBVGPU=$PWD/$LIBVGPU ;; esac
if [ ! -f "$LIBVGPU" ]; then
    echo "gpucheck-shares: no $LIBVGPU (run make, or set LIBVGPU)" >&2
    exit 2
fi

NAME=gpucheck-shares
. "$ROOT/tests/gpu/gpucheck-bin.sh"
TIMELINE=${SIMGPU_TIMELINE:-$ROOT/build/tests/simgpu_timeline}

: >"$OUT/shares.tsv"
FAILED=0
ROWN=0

# row TITLE SPEC... ; SPEC = "NAME[+DELAY] PCT POLICY[/PRIORITY] TARGET LOAD-ARGS..." (PCT "-":
# no libvgpu; +DELAY: that load starts DELAY seconds after the others). ROW_WINDOW=S row ...
# measures that row over S seconds instead of WINDOW.
row() {
    local title=$1 window=${ROW_WINDOW:-$WINDOW}
    local run_s
    run_s=$(awk -v w="$WARM" -v d="$window" 'BEGIN { print w + d + 0.3 }')
    shift
    ROWN=$((ROWN + 1))
    if [ -n "$ROWS" ] && ! [[ " $ROWS " == *" $ROWN "* ]]; then
        return 0
    fi
    local dir=$OUT/row$ROWN
    rm -rf "$dir"
    mkdir -p "$dir/sched"
    local start now
    now=$("$BIN" now) || return 1
    start=$((now + LEAD_NS))
    local pids=() names=() args=() spec name pct policy target rest
    for spec in "$@"; do
        read -r name pct policy target rest <<<"$spec"
        local delay=0
        if [[ $name == *+* ]]; then
            delay=${name#*+}
            name=${name%%+*}
        fi
        local l_start l_run
        l_start=$(awk -v s="$start" -v d="$delay" 'BEGIN { printf "%.0f", s + d * 1e9 }')
        l_run=$(awk -v r="$run_s" -v d="$delay" 'BEGIN { print r - d }')
        local envs=()
        if [ "$pct" != "-" ]; then
            envs=(LD_PRELOAD="$LIBVGPU" VGPU_SCHED_DIR="$dir/sched" VGPU_COMPUTE_LIMIT="$pct"
                VGPU_POLICY="${policy%%/*}")
            [[ $policy == */* ]] && envs+=(VGPU_PRIORITY="${policy#*/}")
        fi
        # shellcheck disable=SC2086 # rest: the load's own arguments, split on purpose
        env "${envs[@]}" timeout -k 5 $((${run_s%.*} + 30)) "$BIN" load $rest --seconds "$l_run" \
            --start-at "$l_start" --stamps "$dir/$name.stamps" >"$dir/$name.out" 2>"$dir/$name.err" &
        pids+=($!)
        names+=("$name")
        args+=("$name" "$target" "$dir/$name.stamps")
    done
    local i rc=0
    for i in "${!pids[@]}"; do
        if ! wait "${pids[$i]}"; then
            echo "row $ROWN ($title): load ${names[$i]} failed:" >&2
            rc=1
        fi
    done
    local targs=()
    if grep -qs "mode=host-only" "$dir/${names[0]}.stamps" && [ -x "$TIMELINE" ]; then
        "$TIMELINE" "$SIMGPU_STATE" >"$dir/timeline.txt" 2>/dev/null && targs=(--timeline "$dir/timeline.txt")
    fi
    if [ "$rc" = 0 ]; then
        "$BIN" shares --warm "$WARM" --window "$window" --title "$ROWN. $title" --tsv "$OUT/shares.tsv" \
            "${targs[@]}" "${args[@]}" || rc=1
    fi
    # Whatever a load or libvgpu said (libvgpu speaks only when something is wrong).
    for name in "${names[@]}"; do
        if [ -s "$dir/$name.err" ]; then
            echo "  $name said:"
            head -20 "$dir/$name.err" | sed 's/^/    /'
        fi
    done
    [ "$rc" = 0 ] || FAILED=1
    return 0
}

# The share the load in row N, named NAME, had (from shares.tsv); "" when that row did not run.
share_of() {
    awk -F'\t' -v r="$1. " -v n="$2" 'index($1, r) == 1 && $2 == n { print $4 }' "$OUT/shares.tsv" | tail -1
}

# min(share, use alone), or the share where the use was not measured.
target_of() {
    local use
    use=$(share_of "$2" "$3")
    if [ -z "$use" ]; then echo "$1"; else awk -v s="$1" -v u="$use" 'BEGIN { print (u < s ? u : s) }'; fi
}

{
    echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) $(uname -srm); $BIN; LD_PRELOAD=$LIBVGPU"
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi -L 2>&1
        nvidia-smi --query-gpu=name,driver_version,compute_mode,persistence_mode --format=csv,noheader 2>&1
    fi
    echo "window ${WINDOW} s after ${WARM} s of warm-up; each load runs ${RUN_S} s"

    G200="--kernel-us 200"
    row "greedy 200 us: fixed 30 + burst 70" "fixed30 30 fixed 30 $G200" "burst70 70 burst 70 $G200"
    row "greedy 200 us: fixed 50 + burst 50" "fixed50 50 fixed 50 $G200" "burst50 50 burst 50 $G200"
    row "greedy 200 us: fixed 10 + burst 90" "fixed10 10 fixed 10 $G200" "burst90 90 burst 90 $G200"

    STEP="--kernel-us 500 --sync-every 8 --cpu-gap-us 2000"
    row "step loop (8 x 500 us, sync, 2 ms CPU) alone, without libvgpu: its use U" "step - - - $STEP"
    T=$(target_of 50 4 step)
    row "step loop, fixed 50 alone: target min(50, U)" "step 50 fixed $T $STEP"
    row "step loop, fixed 50 + greedy burst 50 (200 us)" "step 50 fixed $T $STEP" "burst50 50 burst 50 $G200"

    SYNC8="--kernel-us 50 --sync-every 8"
    row "50 us kernels synced every 8, alone, without libvgpu: its use U" "sync8 - - - $SYNC8"
    T=$(target_of 70 7 sync8)
    row "50 us kernels synced every 8, fixed 70 alone: target min(70, U)" "sync8 70 fixed $T $SYNC8"

    G2MS="--kernel-us 2000"
    row "greedy 2 ms: fixed 30 + burst 70" "fixed30 30 fixed 30 $G2MS" "burst70 70 burst 70 $G2MS"

    row "greedy 200 us: fixed 70 + burst 30" "fixed70 70 fixed 70 $G200" "burst30 30 burst 30 $G200"
    row "greedy 200 us: split 10:90, both fixed" "fixed10 10 fixed 10 $G200" "fixed90 90 fixed 90 $G200"
    row "greedy 200 us: split 20:30:50, all fixed" "fixed20 20 fixed 20 $G200" "fixed30 30 fixed 30 $G200" \
        "fixed50 50 fixed 50 $G200"

    POLL="--kernel-us 10 --sync-every 8 --cpu-gap-us 20 --poll"
    row "10 us kernels polled every 8, 20 us CPU, alone, without libvgpu: its use U" "poll - - - $POLL"
    T=$(target_of 50 13 poll)
    row "10 us kernels polled every 8, fixed 50 alone: target min(50, U)" "poll 50 fixed $T $POLL"

    row "50 us fixed 30 + 5 ms burst 70, both greedy" "us50 30 fixed 30 --kernel-us 50" \
        "ms5 70 burst 70 --kernel-us 5000"
    row "greedy 50 ms: fixed 30 + burst 70" "fixed30 30 fixed 30 --kernel-us 50000" \
        "burst70 70 burst 70 --kernel-us 50000"
    ROW_WINDOW=$LONG_WINDOW row "greedy 1 s: fixed 30 + burst 70 (${LONG_WINDOW} s window)" \
        "fixed30 30 fixed 30 --kernel-us 1000000" "burst70 70 burst 70 --kernel-us 1000000"
    row "priority pair, greedy 200 us: high burst 50 + low burst 50 (floor 0)" \
        "high 50 burst/high 100 $G200" "low 50 burst/low 0 $G200"
    row "two streams of 500 us kernels, fixed 40 + burst 60 (200 us)" \
        "streams2 40 fixed 40 --kernel-us 500 --streams 2" "burst60 60 burst 60 $G200"
    row "priority hand-over, greedy 200 us: low burst 50, high burst 50 arrives 1.5 s later" \
        "low 50 burst/low - $G200" "high+1.5 50 burst/high - $G200"
    row "graphs of 16 x 500 us kernels captured (global mode) during the run, fixed 40 + burst 60" \
        "graph 40 fixed 40 --kernel-us 500 --graph 16" "burst60 60 burst 60 $G200"

    echo
    echo "$([ "$FAILED" = 0 ] && echo done || echo FAILED): $OUT/shares.tsv"
} 2>&1 | tee "$OUT/shares.txt"
[ "${PIPESTATUS[0]}" = 0 ] || exit 2
grep -q '^FAILED' "$OUT/shares.txt" && exit 1
exit 0
