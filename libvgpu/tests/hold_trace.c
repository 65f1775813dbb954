/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hold_trace.c - drive the holder's empty-queue rules (libvgpu/src/hold.c) with a trace.
 *
 * Reads lines on stdin, CPU times in microseconds, and keeps what sched.c keeps:
 *
 *   contended 0|1   whether another slice waits for the token
 *   launch T        the app launches at T; after `end`, that ends the empty spell and
 *                   prints "long=0|1" (a long gap: its next sync offers the hold back)
 *   end T           the queue ran empty: the work ended at T (the GPU's clock, mapped)
 *   sync T          an app thread enters a blocking sync ...
 *   back T          ... and returns from it
 *   query T busy    a query found the work running (the app polls until it launches)
 *   query T ready   a query found it done
 *   look T          the holder thread looks: prints "keep look=L" (look again in L us)
 *                   or "give" (it gives the token back; the spell goes on)
 *
 * Used by tests/libvgpu/test_hold_traces.py.
 */
#include <stdio.h>
#include <string.h>

#include "../src/hold.h"

int main(void)
{
    struct vg_hold_view v = {0};
    int syncs_in = 0, empty = 0;
    unsigned long launches = 0, polled = 0; /* polled: 1 + launches at a busy query (sched.c) */
    char line[256];
    while (fgets(line, sizeof(line), stdin)) {
        char op[16], what[16] = "";
        double a = 0;
        int n = sscanf(line, "%15s %lf %15s", op, &a, what);
        if (n < 1 || op[0] == '#')
            continue;
        uint64_t t = (uint64_t)(a * 1000);
        if (!strcmp(op, "contended") && n == 2) {
            v.contended = a != 0;
        } else if (!strcmp(op, "launch") && n == 2) {
            if (empty)
                printf("long=%d\n", vg_hold_long_gap(v.idle_from, t, v.back));
            empty = 0;
            launches++;
            v.last_launch = t;
        } else if (!strcmp(op, "end") && n == 2) {
            empty = 1;
            v.idle_from = t;
        } else if (!strcmp(op, "sync") && n == 2) {
            syncs_in++;
        } else if (!strcmp(op, "back") && n == 2 && syncs_in > 0) {
            syncs_in--;
            v.back = t;
        } else if (!strcmp(op, "query") && n == 3 && !strcmp(what, "busy")) {
            polled = 1 + launches;
        } else if (!strcmp(op, "query") && n == 3 && !strcmp(what, "ready")) {
            if (polled)
                v.back = t;
            polled = 0;
        } else if (!strcmp(op, "look") && n == 2 && empty) {
            uint64_t look = 0;
            v.waiting = syncs_in > 0 || (polled && polled - 1 == launches);
            if (vg_hold_give_back(&v, t, &look))
                printf("give\n");
            else
                printf("keep look=%.3f\n", look / 1000.0);
        } else {
            fprintf(stderr, "hold_trace: bad line: %s", line);
            return 2;
        }
    }
    return 0;
}
