/* SPDX-License-Identifier: Apache-2.0 */
/*
 * policy_replay.c - play a broker's record (VGPU_BROKER_RECORD, broker_record.h) through
 * the broker's rules again and print what it decided.
 *
 *   policy_replay [-v] < DIR/<GPU uuid>.rec
 *
 * The policy is pure, so the replay makes the grants, ends and charges the broker made,
 * in the same order. Output, times in ms from the record's first line, slices by their
 * entry index in the GPU file:
 *   T broker EPOCH           (another broker took over: the policy starts afresh)
 *   T slice I share=N policy=fixed|burst prio=N floor=N   (its settings, when they change)
 *   T grant I / T end I WHY / T charge I MS / T refund I MS
 *   T claims I FIELD=V ...   (-v: the claims that changed; times in ms, seqs as read)
 *   T account I used=MS credit=MS holds=N                 (at the end)
 * Claims and charges beside one another show where a charge came from; a run cut down to
 * the lines that matter becomes a trace test (tests/libvgpu/test_policy_traces.py).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/policy.h"
#include "../include/vgpu_region.h"

static struct vg_pol pol;
static uint64_t t0;
static uint64_t used_before[VG_POL_SLICES];
static int verbose;

static double ms_of(uint64_t ns)
{
    return ((double)ns - (double)t0) / 1e6;
}

/* A claimed time in ms of the record (0 stays "never"). */
static double claim_ms(uint64_t ns)
{
    return ns ? ms_of(ns) : 0.0;
}

static void die(const char *what, const char *line)
{
    fprintf(stderr, "policy_replay: %s: %s", what, line);
    exit(2);
}

static void print_charges(uint64_t now)
{
    for (int i = 0; i < (int)VG_POL_SLICES; i++) {
        uint64_t used = pol.sl[i].used;
        if (used > used_before[i])
            printf("%.3f charge %d %.3f\n", ms_of(now), i, (double)(used - used_before[i]) / 1e6);
        else if (used < used_before[i])
            printf("%.3f refund %d %.3f\n", ms_of(now), i, (double)(used_before[i] - used) / 1e6);
        used_before[i] = used;
    }
}

static void print_claims(uint64_t now, int i, const struct vg_pol_claims *was, const struct vg_pol_claims *c)
{
    char out[512];
    int n = 0;
#define SEQ(f)                                                                                                    \
    if (c->f != was->f)                                                                                            \
        n += snprintf(out + n, sizeof(out) - (size_t)n, " " #f "=%u", c->f);
#define TIME(f)                                                                                                   \
    if (c->f != was->f)                                                                                            \
        n += snprintf(out + n, sizeof(out) - (size_t)n, " " #f "=%.3f", claim_ms(c->f));
    SEQ(want) SEQ(owner_seq) SEQ(release_seq) TIME(release_ns) SEQ(drain_seq) TIME(drain_ns) SEQ(yield_seq)
    if (c->idle_ns != was->idle_ns)
        n += snprintf(out + n, sizeof(out) - (size_t)n, " idle_ns=%.3f", (double)c->idle_ns / 1e6);
    TIME(idle_since) SEQ(start_seq) TIME(start_ns) SEQ(launch_seq) TIME(launch_ns) SEQ(turn_seq) TIME(turn_ns)
#undef SEQ
#undef TIME
    if (n)
        printf("%.3f claims %d%s\n", ms_of(now), i, out);
}

int main(int argc, char **argv)
{
    verbose = argc > 1 && !strcmp(argv[1], "-v");
    vg_pol_init(&pol, 1);
    char line[1024];
    uint64_t now = 0;
    int started = 0;
    struct vg_pol_claims pending[VG_POL_SLICES];
    int has_pending[VG_POL_SLICES] = {0};
    while (fgets(line, sizeof(line), stdin)) {
        char op[8];
        unsigned long long a = 0;
        int i = -1;
        if (sscanf(line, "%7s", op) != 1)
            continue;
        if (!strcmp(op, "take") || !strcmp(op, "drop") || !strcmp(op, "step")) {
            if (sscanf(line, "%*s %llu %d", &a, &i) < 1)
                die("a line without its time", line);
            now = a;
            if (!started) {
                t0 = now;
                started = 1;
            }
        }
        if (!strcmp(op, "broker")) {
            unsigned epoch;
            if (sscanf(line, "%*s %u", &epoch) != 1)
                die("a broker line is broker EPOCH", line);
            vg_pol_init(&pol, epoch);
            memset(used_before, 0, sizeof(used_before));
            memset(has_pending, 0, sizeof(has_pending));
            if (started)
                printf("%.3f broker %u\n", ms_of(now), epoch);
        } else if (!strcmp(op, "take")) {
            if (i < 0 || i >= (int)VG_POL_SLICES)
                die("no such slice", line);
            vg_pol_take_on(&pol, i, now);
            used_before[i] = 0;
        } else if (!strcmp(op, "drop")) {
            if (i < 0 || i >= (int)VG_POL_SLICES)
                die("no such slice", line);
            struct vg_pol_decision d;
            vg_pol_drop(&pol, i, now, &d);
            printf("%.3f drop %d\n", ms_of(now), i);
            used_before[i] = pol.sl[i].used;
        } else if (!strcmp(op, "set")) {
            unsigned share, prio, policy, floor;
            if (sscanf(line, "%*s %d %u %u %u %u", &i, &share, &prio, &policy, &floor) != 5 || i < 0 ||
                i >= (int)VG_POL_SLICES)
                die("a set line is set I SHARE PRIO POLICY FLOOR", line);
            vg_pol_settings(&pol, i, share, prio, policy, floor);
            printf("%.3f slice %d share=%u policy=%s prio=%u floor=%u\n", ms_of(now), i, share,
                   policy == VGPU_POLICY_BURST ? "burst" : "fixed", prio, floor);
        } else if (!strcmp(op, "req")) {
            struct vg_pol_claims c;
            unsigned long long t[10];
            if (sscanf(line, "%*s %d %u %llu %u %u %llu %u %llu %u %llu %llu %llu %u %llu %u %llu %u %llu", &i,
                       &c.want, &t[0], &c.owner_seq, &c.release_seq, &t[1], &c.drain_seq, &t[2], &c.yield_seq,
                       &t[3], &t[4], &t[5], &c.start_seq, &t[6], &c.launch_seq, &t[7], &c.turn_seq, &t[8]) != 18 ||
                i < 0 || i >= (int)VG_POL_SLICES)
                die("a req line has an index and 17 claims", line);
            c.want_ns = t[0], c.release_ns = t[1], c.drain_ns = t[2], c.idle_ns = t[3], c.active_ns = t[4];
            c.idle_since = t[5], c.start_ns = t[6], c.launch_ns = t[7], c.turn_ns = t[8];
            pending[i] = c; /* printed against the claims before, at the step that reads it */
            has_pending[i] = 1;
        } else if (!strcmp(op, "step")) {
            for (int k = 0; k < (int)VG_POL_SLICES; k++) {
                if (!has_pending[k])
                    continue;
                if (verbose)
                    print_claims(now, k, &pol.sl[k].req, &pending[k]);
                pol.sl[k].req = pending[k];
                has_pending[k] = 0;
            }
            struct vg_pol_decision d;
            vg_pol_step(&pol, now, &d);
            if (d.ended != VG_POL_HELD)
                printf("%.3f end %d %s\n", ms_of(now), d.ended_slice, vg_pol_end_name(d.ended));
            if (d.granted)
                printf("%.3f grant %d\n", ms_of(now), (int)(d.word & 0xFF) - 1);
            print_charges(now);
        } else {
            die("not a record line", line);
        }
    }
    for (int i = 0; i < (int)VG_POL_SLICES; i++)
        if (pol.sl[i].in_use)
            printf("%.3f account %d used=%.3f credit=%.3f holds=%u\n", ms_of(now), i,
                   (double)pol.sl[i].used / 1e6, (double)pol.sl[i].credit / 1e6, pol.sl[i].holds);
    return 0;
}
