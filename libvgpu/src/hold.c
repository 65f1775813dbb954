/* SPDX-License-Identifier: Apache-2.0 */
/* hold.c - the holder's rules for an empty queue (hold.h). Pure. */
#include "hold.h"

uint64_t vg_hold_gap_from(uint64_t t, uint64_t back)
{
    return back > t ? back : t;
}

int vg_hold_give_back(const struct vg_hold_view *v, uint64_t now, uint64_t *look_ns)
{
    *look_ns = 0;
    if (v->contended && v->waiting && now - v->idle_from < VG_HOLD_IDLE_NS) {
        *look_ns = VG_HOLD_POLL_NS; /* an app thread still waits for its work: no gap yet */
        return 0;
    }
    uint64_t since = vg_hold_gap_from(v->last_launch > v->idle_from ? v->last_launch : v->idle_from,
                                      v->back);
    uint64_t hold = v->contended ? VG_HOLD_GAP_NS : VG_HOLD_IDLE_NS;
    if (now < since)
        since = now;
    if (now - since >= hold)
        return 1;
    *look_ns = hold - (now - since);
    return 0;
}

int vg_hold_long_gap(uint64_t from, uint64_t to, uint64_t back)
{
    uint64_t start = vg_hold_gap_from(from, back);
    return to > start && to - start > VG_HOLD_GAP_NS;
}
