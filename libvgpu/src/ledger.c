/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ledger.c - a slice's GPU time dated by the GPU's clock (ledger.h has the rules).
 */
#include "ledger.h"

#include <string.h>

void vg_ledger_init(struct vg_ledger *l)
{
    memset(l, 0, sizeof(*l));
}

static int64_t map_base(const struct vg_ledger *l)
{
    return l->base > l->base_prev ? l->base : l->base_prev;
}

/* The clock map: the tightest bound any event in the last two windows gives. */
static void note_map(struct vg_ledger *l, int64_t gpu, uint64_t rec)
{
    int64_t b = (int64_t)rec - gpu;
    if (!l->mapped) {
        l->mapped = 1;
        l->base = l->base_prev = b;
        l->window_from = rec;
        return;
    }
    if (rec - l->window_from >= VG_LEDGER_MAP_WINDOW_NS) {
        l->base_prev = l->base;
        l->base = b;
        l->window_from = rec;
    } else if (b > l->base) {
        l->base = b;
    }
}

static void sample(struct vg_ledger *l, uint64_t per)
{
    l->samples[l->nsamples++ % VG_LEDGER_SAMPLES] = per ? per : 1;
    unsigned n = l->nsamples < VG_LEDGER_SAMPLES ? l->nsamples : VG_LEDGER_SAMPLES;
    uint64_t v[VG_LEDGER_SAMPLES];
    memcpy(v, l->samples, n * sizeof(v[0]));
    for (unsigned i = 1; i < n; i++) /* (insertion sort of at most VG_LEDGER_SAMPLES) */
        for (unsigned j = i; j > 0 && v[j - 1] > v[j]; j--) {
            uint64_t t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    l->per_ns = v[n / 2];
    l->shortest_ns = v[0];
}

int vg_ledger_at_record(uint64_t ran, uint64_t ret)
{
    return ran <= ret + VG_LEDGER_AT_RECORD_NS;
}

int vg_ledger_held_back(const struct vg_ledger *l, int64_t prev, int64_t gpu, uint64_t rec, uint64_t launches,
                        int64_t *held)
{
    /* Launched after the work before them ended, they may have waited for the app: a poller's
     * CPU work between its steps is no other context's turn (a polled loop beside a burst
     * claimed such a gap and paid its neighbour's whole tail: 47.2 % of 50). */
    if (!l->mapped || vg_ledger_gpu(l, rec) > prev)
        return 0;
    /* The shortest sample, not the median: on a GPU that time-slices contexts many samples
     * hold another context's turns, and a length that long hides the very turn to find
     * (a burst's first turn beside a fixed 70 %'s tail of 2 ms kernels was found turns
     * later, and the fixed slice got 71.7 %). One too short finds a turn too early: that
     * claim is worth less to the broker, never more than no claim. */
    if (!l->shortest_ns || !launches || gpu <= prev)
        return 0;
    uint64_t work = launches * l->shortest_ns;
    if ((uint64_t)(gpu - prev) <= work + VG_LEDGER_AT_RECORD_NS + work / 8)
        return 0;
    *held = prev;
    return 1;
}

int vg_ledger_start_late(const struct vg_ledger *l, int64_t gpu, uint64_t ret, int waited)
{
    return waited || !vg_ledger_at_record(vg_ledger_cpu(l, gpu), ret);
}

int64_t vg_ledger_event(struct vg_ledger *l, int64_t gpu, uint64_t rec, uint64_t ret, uint64_t launches)
{
    int first = !l->mapped;
    note_map(l, gpu, rec);
    if (!launches) {
        /* A start: recorded before a launch on an empty queue, so the work came again then. */
        if (l->gap_since)
            l->restart = gpu;
        return l->last_end;
    }
    /* Completed as it was recorded: its stream was idle, its launches ended before. (The
     * first event of all makes the map and so cannot tell.) */
    int at_record = !first && vg_ledger_at_record(vg_ledger_cpu(l, gpu), ret > rec ? ret : rec);
    int64_t from = l->have_end ? l->last_end : l->gap_since ? l->restart : gpu;
    if (l->gap_since && l->restart > from)
        from = l->restart;
    int64_t end = gpu;
    if (at_record && l->per_ns) {
        int64_t est = from + (int64_t)(launches * l->per_ns);
        end = est < gpu ? est : gpu;
    }
    if (l->have_end && end < l->last_end)
        end = l->last_end; /* (events of several streams: the later end stands) */
    if (!at_record && l->last_exact && !l->gap_since && l->have_end && gpu > l->last_end) {
        sample(l, (uint64_t)(gpu - l->last_end) / launches);
    } else if (!at_record && l->gap_since && gpu > from) {
        sample(l, (uint64_t)(gpu - from) / launches); /* (from the restart: back to back since) */
    } else if (at_record && gpu >= from) {
        /* Its launches ran within [from, gpu]: a bound, a sample only when it says the
         * length is shorter than we think (kernels shorter than a launch never give an
         * exact sample, and an unknown length would put an event on every launch). */
        uint64_t bound = (uint64_t)(gpu - from) / launches;
        if (!l->per_ns || bound < l->per_ns)
            sample(l, bound);
    }
    if (end > from)
        l->busy_ns += (uint64_t)(end - from);
    l->last_end = end;
    l->have_end = 1;
    l->last_exact = !at_record;
    l->gap_since = 0;
    return end;
}

void vg_ledger_gap(struct vg_ledger *l, uint64_t at)
{
    l->gap_since = 1;
    l->restart = l->mapped ? (int64_t)at - map_base(l) : (int64_t)at;
}

uint64_t vg_ledger_cpu(const struct vg_ledger *l, int64_t gpu)
{
    int64_t t = l->mapped ? gpu + map_base(l) : gpu;
    return t > 0 ? (uint64_t)t : 0;
}

int64_t vg_ledger_gpu(const struct vg_ledger *l, uint64_t cpu)
{
    return l->mapped ? (int64_t)cpu - map_base(l) : (int64_t)cpu;
}

uint64_t vg_ledger_end_cpu(const struct vg_ledger *l, uint64_t otherwise)
{
    return l->have_end ? vg_ledger_cpu(l, l->last_end) : otherwise;
}
