/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ledger_trace.c - drive the GPU-time ledger (libvgpu/src/ledger.c) with a trace.
 *
 * Reads lines on stdin, times in microseconds (GPU times on any origin, CPU times
 * on CLOCK_MONOTONIC's), and prints one line per input line:
 *
 *   ev GPU REC N [RET]
 *                   an event completed at GPU time GPU, recorded by a call at CPU
 *                   time REC that returned at RET (default REC), closing N launches
 *                   (0: a start)
 *   gap AT          the queue was empty and a launch came at CPU time AT
 *   cpu GPU         the CPU time of GPU time GPU
 *   held PREV GPU REC N
 *                   an event completed at GPU time GPU, recorded at CPU time REC, closing
 *                   N launches queued behind work that ended at PREV: was that work held
 *                   back in between?
 *   start GPU RET WAITED
 *                   a hold's first start event completed at GPU time GPU, its record
 *                   returned at RET; WAITED 1: it was not done when asked right after
 *
 * Output: "end=E busy=B per=P endcpu=C" after ev and gap (end: GPU time the closed
 * launches ended; endcpu: its CPU time, -1 when none), "cpu=C" after cpu, "late=L" after
 * start (1: a start claim, its work ran later than the record; 0: a launch claim),
 * "held=H at=T" after held (T: where the held-back spell began, GPU time; -1 when H is 0).
 * Used by tests/libvgpu/test_ledger_traces.py.
 */
#include <stdio.h>
#include <string.h>

#include "../src/ledger.h"

int main(void)
{
    struct vg_ledger l;
    vg_ledger_init(&l);
    char line[256];
    while (fgets(line, sizeof(line), stdin)) {
        char op[16];
        double a = 0, b = 0, c = 0, r = -1;
        int n = sscanf(line, "%15s %lf %lf %lf %lf", op, &a, &b, &c, &r);
        if (n < 1 || op[0] == '#')
            continue;
        if (!strcmp(op, "ev") && (n == 4 || n == 5)) {
            vg_ledger_event(&l, (int64_t)(a * 1000), (uint64_t)(b * 1000), (uint64_t)((n == 5 ? r : b) * 1000),
                            (uint64_t)c);
        } else if (!strcmp(op, "gap") && n == 2) {
            vg_ledger_gap(&l, (uint64_t)(a * 1000));
        } else if (!strcmp(op, "held") && n == 5) {
            int64_t at = -1000;
            int held = vg_ledger_held_back(&l, (int64_t)(a * 1000), (int64_t)(b * 1000), (uint64_t)(c * 1000),
                                           (uint64_t)r, &at);
            printf("held=%d at=%.3f\n", held, held ? at / 1000.0 : -1.0);
            continue;
        } else if (!strcmp(op, "start") && n == 4) {
            printf("late=%d\n", vg_ledger_start_late(&l, (int64_t)(a * 1000), (uint64_t)(b * 1000), c != 0));
            continue;
        } else if (!strcmp(op, "cpu") && n == 2) {
            printf("cpu=%.3f\n", vg_ledger_cpu(&l, (int64_t)(a * 1000)) / 1000.0);
            continue;
        } else {
            fprintf(stderr, "ledger_trace: bad line: %s", line);
            return 2;
        }
        printf("end=%.3f busy=%.3f per=%.3f endcpu=%.3f\n", l.have_end ? l.last_end / 1000.0 : -1.0,
               l.busy_ns / 1000.0, l.per_ns / 1000.0, l.have_end ? vg_ledger_end_cpu(&l, 0) / 1000.0 : -1.0);
    }
    return 0;
}
