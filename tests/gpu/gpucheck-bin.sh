# SPDX-License-Identifier: Apache-2.0
# Sourced by tests/gpu/gpucheck.sh and gpucheck-shares.sh (with ROOT, SRC, OUT and NAME set):
# sets BIN to the gpucheck program: $GPUCHECK_BIN, else built from SRC where gcc is (into
# build/tests, or OUT when that is not writable), else the prebuilt build/tests/gpucheck
# carried to a machine without gcc. Exits 2 with one line when there is none.
BIN=${GPUCHECK_BIN:-}
if [ -z "$BIN" ]; then
    if command -v gcc >/dev/null 2>&1; then
        BIN=$ROOT/build/tests/gpucheck
        mkdir -p "$ROOT/build/tests" 2>/dev/null && [ -w "$ROOT/build/tests" ] || BIN=$OUT/gpucheck
        if [ ! -x "$BIN" ] || [ "$SRC" -nt "$BIN" ]; then
            echo "== gcc -O2 -o $BIN tests/gpu/gpucheck.c"
            gcc -O2 -g -std=gnu11 -Wall -Wextra -o "$BIN" "$SRC" -ldl -lm || exit 2
        fi
    elif [ -x "$ROOT/build/tests/gpucheck" ]; then
        BIN=$ROOT/build/tests/gpucheck
        echo "== no gcc here: using the prebuilt $BIN"
    else
        echo "$NAME: no gcc and no prebuilt build/tests/gpucheck (make gpucheck where gcc is)" >&2
        exit 2
    fi
fi
