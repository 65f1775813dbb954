/* SPDX-License-Identifier: Apache-2.0 */
/*
 * policy.c - the broker's rules (policy.h), pure: state, claims and `now` in,
 * decisions out. docs/compute.md's rules table maps each rule to its function
 * here, its constant and its trace test.
 *
 * Credit: a slice earns credit at its share of wall time (refill); `fixed` slices
 * take the token only on credit, `burst` slices also when no slice with credit
 * waits; among waiters a higher priority wins, then a slice with credit, then the
 * one owed most per share; a slice that keeps its floor beats priority (better).
 * Charges: a hold is charged from the grant (or from the end of the previous
 * holder's queued work) to its end, less the time the holder claims its GPU queue
 * sat empty -- honoured in full only for the part of the hold in which no other
 * slice waited, so no claim moves time onto another slice (idle_allowed).
 * A holder that stays past its quantum while others wait, runs out of credit or is
 * outranked loses the token (should_revoke); the work it had queued is charged to
 * it until it reports the drain (latched per hold when first seen: a later report
 * of its own cannot hide it). A tail never reported costs VGPU_TAIL_MAX_NS and does
 * not hold back the next holder's clock; a grant no process takes within
 * VGPU_TAKE_NS (a made-up request) is taken back.
 */
#include "policy.h"

#include <string.h>

#include "../include/vgpu_region.h"

/* now - d, or 0: the monotonic clock of a host up for less than d (a fresh VM, a
 * container's time namespace) is smaller than d, and a wrapped bound believes nothing. */
static uint64_t ago(uint64_t now, uint64_t d)
{
    return now > d ? now - d : 0;
}

/* A claimed time: within [lo, now + VGPU_FUTURE_NS], else not believed (0). */
static uint64_t believed(uint64_t t, uint64_t lo, uint64_t now)
{
    return t >= lo && t <= now + VGPU_FUTURE_NS ? t : 0;
}

/* ---- slices ---- */

void vg_pol_init(struct vg_pol *p, uint32_t epoch)
{
    memset(p, 0, sizeof(*p));
    p->epoch = epoch;
    p->holder = -1;
}

void vg_pol_settings(struct vg_pol *p, int i, uint32_t share, uint32_t prio, uint32_t policy, uint32_t floor)
{
    struct vg_pol_settings *s = &p->sl[i].set;
    s->share = share < 2 ? 2 : share > 100 ? 100 : share;
    s->prio = prio > VGPU_PRIORITY_HIGH ? VGPU_PRIORITY_NORMAL : prio;
    s->policy = policy == VGPU_POLICY_BURST ? VGPU_POLICY_BURST : VGPU_POLICY_FIXED;
    s->floor = floor > 100 ? 0 : floor;
}

void vg_pol_take_on(struct vg_pol *p, int i, uint64_t now)
{
    struct vg_pol_slice *b = &p->sl[i];
    struct vg_pol_settings set = b->set;
    memset(b, 0, sizeof(*b));
    b->set = set;
    b->in_use = 1;
    b->credit = (int64_t)VG_POL_START_CREDIT_NS;
    b->credit_ts = b->last_active = b->registered = b->last_seen = now;
}

int vg_pol_stale(const struct vg_pol *p, int i, uint64_t now)
{
    const struct vg_pol_slice *b = &p->sl[i];
    if (!b->in_use || now - b->last_seen <= VG_POL_STALE_NS || p->holder == i)
        return 0;
    for (int k = 0; k < p->nseg; k++)
        if (p->seg[k].slice == i)
            return 0;
    return 1;
}

int vg_pol_left_behind(const struct vg_pol_claims *c, uint64_t now)
{
    return !believed(c->want_ns, ago(now, VG_POL_STALE_NS), now) && !believed(c->active_ns, ago(now, VG_POL_STALE_NS), now);
}

/* ---- credit ---- */

/* Add to a balance up to cap (one already past it keeps what it has); returns what the
 * cap took. */
static int64_t add_capped(int64_t *b, int64_t add, int64_t cap)
{
    int64_t next = *b + add, lost = 0;
    if (next > cap) {
        int64_t kept = *b > cap ? *b : cap;
        lost = next - kept;
        next = kept;
    }
    *b = next;
    return lost;
}

static uint64_t quantum_of(const struct vg_pol_slice *b);

/* The most credit slice b banks: VG_POL_CREDIT_CAP_NS, or its quantum when its tails make
 * that longer (Hold worth its tail: 4 tails, at most 50 ms). A fixed slice whose one launch
 * outlasts the bare cap must bank a launch's worth while its neighbour's long launch runs:
 * at 20 ms, two fixed slices of 50 ms launches both waited for credit the cap had taken,
 * and the GPU idled (a 30:70 split got 29.8 and 66.6 %, 3.6 % idle). */
static int64_t credit_cap(const struct vg_pol_slice *b)
{
    uint64_t q = quantum_of(b);
    return (int64_t)(q > VG_POL_CREDIT_CAP_NS ? q : VG_POL_CREDIT_CAP_NS);
}

/* Earn share% (and floor%) of the wall time since the last refill. The cap applies
 * to credit net of what is charged but not settled yet (unsettled): a long hold
 * earns while it runs and pays at its end, and must not lose what it earned. A slice
 * that waited for another's hold meanwhile (waiting: as of the last step) banks up to
 * `bank` more, that hold's quantum: what it earns while the hold runs to its end is its share,
 * not idle time's (at the bare cap a step loop beside a greedy neighbour lost part of
 * every wait, and the more, the later the hand-overs a loaded host made). */
static void refill(struct vg_pol_slice *b, uint64_t now, int64_t unsettled, uint64_t bank)
{
    if (now <= b->credit_ts)
        return;
    uint64_t dt = now - b->credit_ts;
    b->credit_ts = now;
    if (dt > 10 * VG_POL_CREDIT_CAP_NS)
        dt = 10 * VG_POL_CREDIT_CAP_NS;
    int64_t lost = add_capped(&b->credit, (int64_t)(dt * b->set.share / 100),
                              credit_cap(b) + unsettled + (int64_t)bank);
    if (b->late_seq)
        b->late_lost += (uint64_t)lost; /* (its tail runs on: given back when it drains) */
    if (b->set.floor)
        add_capped(&b->floor_credit, (int64_t)(dt * b->set.floor / 100), (int64_t)VG_POL_CREDIT_CAP_NS + unsettled);
}

/* Charge slice i dt of GPU time: a burst slice owes at most VG_POL_DEBT_CAP_NS. */
static void charge(struct vg_pol *p, int i, uint64_t dt, int on_floor)
{
    struct vg_pol_slice *b = &p->sl[i];
    int64_t lo = b->set.policy == VGPU_POLICY_BURST ? -(int64_t)VG_POL_DEBT_CAP_NS : -(int64_t)VG_POL_FIXED_DEBT_CAP_NS;
    b->credit -= (int64_t)dt;
    if (b->credit < lo)
        b->credit = lo;
    if (on_floor) {
        b->floor_credit -= (int64_t)dt;
        if (b->floor_credit < -(int64_t)VG_POL_DEBT_CAP_NS)
            b->floor_credit = -(int64_t)VG_POL_DEBT_CAP_NS;
    }
    b->used += dt;
}

/* ---- who goes next ---- */

/* The longest slice b holds the token while a better waiter of equal claim waits: the
 * quantum, or VG_POL_HOLDS_PER_TAIL times its tail when that is longer. Each hand-over
 * costs what its revoked tail costs the GPU: a GPU that time-slices contexts switches
 * between that tail and the next holder's work until the tail ends (2 ms kernels ran
 * interleaved half of the time with a 10 ms quantum, losing a switch per time slice), so
 * the longer a slice's tails, the fewer hand-overs it should cost. A slice that reports
 * its drains late to hold longer pays for its tail and holds at most
 * VG_POL_QUANTUM_MAX_NS; the waiter banks what it earns meanwhile (refill). */
static uint64_t clamp(uint64_t v, uint64_t lo, uint64_t hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

static uint64_t quantum_of(const struct vg_pol_slice *b)
{
    return clamp(b->tail_ns * VG_POL_HOLDS_PER_TAIL, VG_POL_QUANTUM_NS, VG_POL_QUANTUM_MAX_NS);
}

/* A revoked hold of slice b drained `tail` after it ended: a running average, weighted
 * 1/4 to the newest (a tail is the launch running at the revocation, at any point of
 * it, and those queued behind), the first one taken as it is. */
static void note_tail(struct vg_pol_slice *b, uint64_t tail)
{
    b->tail_ns = b->tail_ns ? (3 * b->tail_ns + tail) / 4 : tail;
}

struct standing {
    int eligible, on_floor, floor_due, credit;
    uint32_t prio;
    int64_t norm;
};

static int higher_active(const struct vg_pol *p, uint32_t prio, uint64_t now)
{
    for (unsigned i = 0; i < VG_POL_SLICES; i++) {
        const struct vg_pol_slice *b = &p->sl[i];
        if (b->in_use && b->set.prio > prio && now - b->last_active < VGPU_ACTIVE_NS)
            return 1;
    }
    return 0;
}

/* The credit fixed slice b needs to take the token: a little when it is alone on the GPU
 * (its CPU work between steps then overlaps the time it earns credit in); beside other
 * slices, enough for a hold of VG_POL_HOLDS_PER_TAIL of its tails (quantum_of: a hold on c
 * of credit lasts c / (1 - share), as it earns while it holds), at least
 * VG_POL_MIN_HOLD_NS and at most a quantum, so a small share still gets a turn every
 * quantum / share. */
static int64_t min_hold(const struct vg_pol *p, const struct vg_pol_slice *b)
{
    if (p->active <= 1)
        return (int64_t)VG_POL_MIN_HOLD_ALONE_NS;
    uint64_t q = b->tail_ns * VG_POL_HOLDS_PER_TAIL * (100 - b->set.share) / 100;
    return (int64_t)clamp(q, VG_POL_MIN_HOLD_NS, VG_POL_QUANTUM_NS);
}

static struct standing standing_of(const struct vg_pol *p, const struct vg_pol_slice *b, int64_t credit, uint64_t now)
{
    struct standing st = {0};
    st.prio = b->set.prio;
    st.credit = credit > 0;
    st.norm = credit * 100 / b->set.share;
    if (higher_active(p, b->set.prio, now)) {
        st.on_floor = 1;
        st.eligible = st.floor_due = b->set.floor && b->floor_credit >= (int64_t)VG_POL_MIN_HOLD_NS;
    } else if (b->set.policy == VGPU_POLICY_FIXED) {
        st.eligible = credit >= min_hold(p, b);
    } else {
        st.eligible = 1;
    }
    return st;
}

static int better(const struct standing *a, const struct standing *b)
{
    if (a->floor_due != b->floor_due)
        return a->floor_due; /* the floor is a guarantee: it beats priority */
    if (a->prio != b->prio)
        return a->prio > b->prio;
    if (a->credit != b->credit)
        return a->credit > b->credit;
    return a->norm > b->norm;
}

/* The best eligible waiter other than `self` (-1: none). */
static int best_waiter(const struct vg_pol *p, int self, uint64_t now, struct standing *out)
{
    int best = -1;
    for (unsigned i = 0; i < VG_POL_SLICES; i++) {
        const struct vg_pol_slice *b = &p->sl[i];
        if ((int)i == self || !b->in_use || !b->waiting)
            continue;
        struct standing st = standing_of(p, b, b->credit, now);
        if (st.eligible && (best < 0 || better(&st, out))) {
            *out = st;
            best = (int)i;
        }
    }
    return best;
}

/* ---- charges ---- */

/* Idle time the current holder claims: what it reported, and the empty spell it is in
 * now (its end is not known yet). */
static uint64_t idle_claimed(const struct vg_pol *p, uint64_t now)
{
    const struct vg_pol_claims *r = &p->sl[p->holder].req;
    if (r->owner_seq != p->seq)
        return 0;
    uint64_t since = believed(r->idle_since, p->granted, now);
    return r->idle_ns + (since && since < now ? now - since : 0);
}

/* The most of its claims a hold may deduct: in full for the part of the hold in which
 * nobody else waited, and at most a quarter of the rest (the short sync gaps of a step
 * loop that keeps the token through them: a false claim gains at most that, and the
 * out-of-band guard sees the rest). */
static uint64_t idle_cap(const struct vg_pol *p, uint64_t now)
{
    uint64_t span = now > p->granted ? now - p->granted : 0;
    uint64_t contended = span > p->uncontended ? span - p->uncontended : 0;
    return p->uncontended + contended / VG_POL_CONTENDED_IDLE_DIV;
}

/* A time the holder's slice claims for the current hold (seq names the hold it is about):
 * believed within that hold only (0: none). */
static uint64_t hold_claim(const struct vg_pol *p, uint32_t seq, uint64_t t, uint64_t now)
{
    return seq == p->seq && p->sl[p->holder].req.owner_seq == p->seq ? believed(t, p->granted, now) : 0;
}

/* When the current hold's work first ran on the GPU, as its slice claims (0: unknown). */
static uint64_t first_claimed(const struct vg_pol *p, uint64_t now)
{
    const struct vg_pol_claims *r = &p->sl[p->holder].req;
    return hold_claim(p, r->start_seq, r->start_ns, now);
}

/* When the current hold's first launch found its queue empty, as its slice claims (0:
 * unknown). Its work ran no earlier; behind a tail still running, later. */
static uint64_t launch_claimed(const struct vg_pol *p, uint64_t now)
{
    const struct vg_pol_claims *r = &p->sl[p->holder].req;
    return hold_claim(p, r->launch_seq, r->launch_ns, now);
}

/* When the current hold's first turn on the GPU ended, as its slice claims (0: unknown). */
static uint64_t turn_claimed(const struct vg_pol *p, uint64_t now)
{
    const struct vg_pol_claims *r = &p->sl[p->holder].req;
    return hold_claim(p, r->turn_seq, r->turn_ns, now);
}

/* What a hold may deduct from its span [start, fin): its idle claims and the time before
 * its work could first run: from its start claim (the previous tail is not in the span;
 * the GPU's switch to its context is, and is not its GPU time) or its launch claim (the
 * GPU sat idle from the previous tail's end, where the span begins, to its launch),
 * together within the cap. */
static uint64_t deductible(uint64_t idle, uint64_t cap, uint64_t first, uint64_t launch, uint64_t start, uint64_t fin)
{
    uint64_t began = first > launch ? first : launch;
    uint64_t before = began > start ? (began < fin ? began : fin) - start : 0;
    uint64_t all = idle + before;
    return all > cap ? cap : all;
}

/* Idle time of the current hold that counts so far. */
static uint64_t idle_allowed(const struct vg_pol *p, uint64_t now)
{
    const struct vg_pol_seg *c = &p->seg[p->nseg - 1];
    return deductible(idle_claimed(p, now), idle_cap(p, now), first_claimed(p, now), launch_claimed(p, now),
                      c->start ? c->start : c->granted, now);
}

static uint64_t live_charge(const struct vg_pol *p, uint64_t now)
{
    const struct vg_pol_seg *c = &p->seg[p->nseg - 1];
    if (p->nseg != 1 || now <= c->start)
        return 0;
    uint64_t span = now - c->start, idle = idle_allowed(p, now);
    return span - (idle > span ? span : idle);
}

/* GPU time slice i ran in holds not settled yet, at most, as far as known now: a hold
 * queued behind another's unreported tail earns while it waits to be settled and must
 * not lose what it earned to the cap meanwhile. */
static uint64_t unsettled(const struct vg_pol *p, int i, uint64_t now)
{
    uint64_t sum = 0;
    for (int k = 0; k < p->nseg; k++) {
        const struct vg_pol_seg *c = &p->seg[k];
        if (c->slice != i)
            continue;
        if (!c->end) { /* the current hold */
            sum += k == 0 ? live_charge(p, now) : (now > c->granted ? now - c->granted : 0);
            continue;
        }
        uint64_t from = k == 0 && c->start ? c->start : c->granted;
        uint64_t end = c->end > from ? c->end : from;
        sum += (now > end ? now : end) - from;
    }
    return sum;
}

/* Segment k's start claim: latched when its hold ended, read live while it is the current
 * hold (0: not known). */
static uint64_t seg_first(const struct vg_pol *p, int k, uint64_t now)
{
    const struct vg_pol_seg *c = &p->seg[k];
    if (c->end)
        return c->first;
    return p->holder == c->slice && k == p->nseg - 1 ? first_claimed(p, now) : 0;
}

/* Half of the time a tail ran alongside the next hold: from the later of the next hold's
 * first work (first; 0: never known, no overlap) and lo, to till. */
static uint64_t half_overlap(uint64_t first, uint64_t lo, uint64_t till)
{
    uint64_t from = first > lo ? first : lo;
    return first && from < till ? (till - from) / 2 : 0;
}

/* Take back up to dt of what slice i was charged (what it ran was another's). */
static void uncharge(struct vg_pol *p, int i, uint64_t dt)
{
    struct vg_pol_slice *b = &p->sl[i];
    add_capped(&b->credit, (int64_t)dt, credit_cap(b));
    b->used -= dt < b->used ? dt : b->used;
}

/* Charge slice i `due` less `back`, or give it back the difference. */
static void charge_net(struct vg_pol *p, int i, uint64_t due, uint64_t back, int on_floor)
{
    if (due >= back)
        charge(p, i, due - back, on_floor);
    else
        uncharge(p, i, back - due);
}

/* The hold after a late tail, settled now: what it claimed and when it ended are kept for
 * the drain report. A hold given back ended with its work; a revoked one's work ran on as
 * its own tail (0: ended no earlier than the late tail before it; its drain report is its
 * own claim and must not move charge onto that tail's slice). */
static void note_next_of_late(struct vg_pol *p, const struct vg_pol_seg *s0)
{
    for (unsigned i = 0; i < VG_POL_SLICES; i++) {
        struct vg_pol_slice *b = &p->sl[i];
        if (b->in_use && b->late_seq && b->late_next_seq == s0->seq && b->late_next == s0->slice) {
            b->late_next_settled = 1;
            b->late_next_first = s0->first;
            b->late_next_end = s0->revoked ? 0 : s0->end;
        }
    }
}

/* Of segment 0's tail, which ended at fin, what the next hold ran alongside it: half of
 * the time from when the next hold's work first ran (its start claim) to fin. A GPU that
 * time-slices between contexts runs a revoked hold's queued work and the next holder's in
 * turns of equal length, so each had half of that time; a GPU that runs them one after
 * the other gets to the next hold's start event only after the tail (no overlap). The
 * claim is the next hold's own: an early one moves charge onto it, a late one gains
 * nothing over no claim. */
static uint64_t shared_tail(const struct vg_pol *p, uint64_t fin, uint64_t now)
{
    if (p->nseg < 2)
        return 0;
    return half_overlap(seg_first(p, 1, now), p->seg[1].granted, fin);
}

/* Of the overlap [first, fin) with the tail before it, what a hold pays beyond the half it
 * was charged: as much more as its own claim says its first turn ran (to turn). A GPU that
 * time-slices contexts lets the tail's owner finish its current turn, then runs the next
 * holder's first turn whole (its work is queued ready), then the tail's rest: with tails
 * shorter than a turn, most of the overlap was the next holder's (a fixed 30 % beside a
 * greedy burst, 100 us kernels, 1 ms turns, paid 1.07 times what it ran, half of every
 * tail it followed). The claim costs only its maker: at most the rest of the overlap. */
static uint64_t turn_extra(const struct vg_pol_seg *c)
{
    if (!c->ovl_half || c->turn <= c->ovl_first)
        return 0;
    uint64_t ran = (c->turn < c->ovl_fin ? c->turn : c->ovl_fin) - c->ovl_first;
    return ran > c->ovl_half ? ran - c->ovl_half : 0;
}

/* Settle segment 0, whose work ended at fin, and date the next one's start. */
static void settle(struct vg_pol *p, uint64_t fin, uint64_t now)
{
    struct vg_pol_seg *s0 = &p->seg[0];
    if (fin < s0->start)
        fin = s0->start;
    uint64_t shared = shared_tail(p, fin, now);
    if (shared > fin - s0->start)
        shared = fin - s0->start;
    uint64_t span = fin - s0->start - shared;
    uint64_t idle = deductible(s0->idle, s0->idle_cap, s0->first, s0->launch, s0->start, fin);
    uint64_t extra = turn_extra(s0);
    if (s0->slice >= 0)
        charge_net(p, s0->slice, span - (idle > span ? span : idle) + s0->penalty + extra, s0->refund,
                   s0->on_floor);
    if (extra && s0->ovl_slice >= 0 && p->sl[s0->ovl_slice].in_use)
        uncharge(p, s0->ovl_slice, extra);
    note_next_of_late(p, s0);
    if (shared) { /* the next hold ran alongside from here; its first turn may say more (turn_extra) */
        struct vg_pol_seg *n = &p->seg[1];
        uint64_t first = seg_first(p, 1, now), from = first > n->granted ? first : n->granted;
        n->ovl_first = from > s0->start ? from : s0->start;
        n->ovl_fin = fin;
        n->ovl_half = shared;
        n->ovl_slice = s0->slice;
    }
    memmove(&p->seg[0], &p->seg[1], (size_t)(p->nseg - 1) * sizeof(p->seg[0]));
    p->nseg--;
    if (p->nseg) {
        struct vg_pol_seg *n = &p->seg[0];
        n->start = fin - shared > n->granted ? fin - shared : n->granted;
    }
}

/* Latch each revoked hold's drain report the first time it is seen. A slice reports
 * only its latest drain, and a hold queued behind another's unsettled tail may wait
 * for it up to VGPU_TAIL_MAX_NS: by then a later hold of its own may have reported over
 * it, and a slice that scrambles its reports would make its neighbours pay missing tails. */
static void note_drains(struct vg_pol *p, uint64_t now)
{
    for (int k = 0; k < p->nseg; k++) {
        struct vg_pol_seg *c = &p->seg[k];
        if (!c->end || !c->revoked || c->slice < 0 || c->drained)
            continue;
        const struct vg_pol_claims *r = &p->sl[c->slice].req;
        /* A slice gives a hold back only with its queue empty: one that gave it back as we
         * took it (the two crossed) has nothing left to drain and reports no drain. */
        int drain = r->drain_seq == c->seq, release = r->release_seq == c->seq;
        if (drain || release) {
            c->drained = 1;
            c->drain_claim = drain ? r->drain_ns : r->release_ns;
            c->drain_seen = now;
        }
    }
}

/* When a revoked hold's tail began: its end, or its start if its work waited longer. */
static uint64_t tail_from(const struct vg_pol_seg *c)
{
    return c->start > c->end ? c->start : c->end;
}

/* Settle segment 0, a revoked hold whose drain was not reported, from `from` (when its
 * tail began), charging its slice `tail`: the holds after it are charged from their own
 * grants, not from behind what may be a made-up tail, and a drain it reports later pays
 * the rest of a real one. */
static void give_up_tail(struct vg_pol *p, uint64_t from, uint64_t tail, uint64_t now)
{
    struct vg_pol_seg *s0 = &p->seg[0];
    struct vg_pol_slice *b = &p->sl[s0->slice];
    s0->penalty = tail;
    b->late_seq = s0->seq;
    b->late_from = from + tail;
    b->late_lost = 0;
    b->late_began = from;
    b->late_start = s0->start;
    b->late_ready = 0;
    b->late_back = 0;
    b->late_next_seq = p->nseg > 1 ? p->seg[1].seq : 0;
    b->late_next = p->nseg > 1 ? p->seg[1].slice : -1;
    b->late_next_settled = 0;
    b->late_next_first = b->late_next_end = 0;
    uint64_t used = b->used;
    settle(p, from, now);
    b->late_paid = b->used > used ? b->used - used : 0;
}

/* A late tail that drained at `end`: the hold after it in GPU order gets its part. Where
 * it ran alongside the tail (half > 0, from its start claim), half of the overlap back:
 * one still queued when it settles, one whose own tail was settled late from its drain
 * report's charge, one settled at once. Where it did not (a GPU that runs contexts one
 * after the other), it could start only at `end`: one still queued is charged from there,
 * and one whose own tail was settled late pays, when it drains, from there (a chain of
 * launches longer than the broker's wait, each queued behind the one before: the time
 * each waited was charged to it and to the tail ahead, twice). */
static void late_next_part(struct vg_pol *p, const struct vg_pol_slice *b, uint64_t end, uint64_t half,
                           struct vg_pol_seg *next)
{
    if (next) {
        if (half)
            next->refund += half; /* (from its charge when it settles) */
        else if (next == &p->seg[0] && next->start && next->start < end)
            next->start = end;
        return;
    }
    if (b->late_next < 0 || !p->sl[b->late_next].in_use)
        return;
    struct vg_pol_slice *n = &p->sl[b->late_next];
    if (n->late_seq != b->late_next_seq) {
        if (half)
            uncharge(p, b->late_next, half);
    } else if (half) {
        n->late_back += half; /* (from its own late charge) */
    } else if (n->late_ready < end) {
        n->late_ready = end;
    }
}

/* What a late tail that drained at `end` still owes, less what it paid for time before
 * its work could run (late_ready: in all it pays from the later of its hold's start and
 * late_ready to `end`), less its halves of the overlaps with the late tail before it
 * (late_back) and the hold after it (half). */
static void charge_late(struct vg_pol *p, int i, uint64_t end, uint64_t half)
{
    const struct vg_pol_slice *b = &p->sl[i];
    uint64_t ready = b->late_ready, from = b->late_from > ready ? b->late_from : ready;
    uint64_t early = 0;
    if (ready > b->late_start) {
        early = (ready < b->late_from ? ready : b->late_from) - b->late_start;
        if (early > b->late_paid)
            early = b->late_paid;
    }
    charge_net(p, i, end > from ? end - from : 0, half + early + b->late_back, 0);
}

/* A late tail drained at end; what of [late_began, end) the hold after it ran alongside
 * (from its start claim to its end, or to the tail's end when it was revoked: its work ran
 * on as its own tail) both were charged in full: each gets half of it back (shared tail,
 * for a tail past the broker's wait). */
static uint64_t late_shared(struct vg_pol *p, const struct vg_pol_slice *b, uint64_t end, uint64_t now,
                            struct vg_pol_seg **unsettled_next)
{
    *unsettled_next = NULL;
    if (!b->late_next_seq || b->late_next < 0)
        return 0;
    uint64_t first = b->late_next_first, to = b->late_next_end;
    if (!b->late_next_settled) { /* still queued, or the current hold (both 0 until then) */
        for (int k = 0; k < p->nseg; k++) {
            struct vg_pol_seg *c = &p->seg[k];
            if (c->seq != b->late_next_seq || c->slice != b->late_next)
                continue;
            first = seg_first(p, k, now);
            to = c->end && !c->revoked ? c->end : 0;
            *unsettled_next = c;
        }
    }
    return half_overlap(first, b->late_began, to && to < end ? to : end);
}

/* Settle what can be: segments whose work is known to have ended, in the order they
 * ran on the GPU. */
static void settle_ready(struct vg_pol *p, uint64_t now)
{
    note_drains(p, now);
    while (p->nseg) {
        struct vg_pol_seg *s0 = &p->seg[0];
        if (!s0->end)
            return; /* the current hold */
        uint64_t fin = 0;
        if (!s0->revoked || s0->slice < 0) {
            fin = s0->end; /* released drained, or revoked before any process took it */
        } else {
            uint64_t from = tail_from(s0);
            if (s0->drained) {
                fin = believed(s0->drain_claim, s0->start, s0->drain_seen);
                if (!fin)
                    fin = from; /* an impossible date: nothing was queued */
                else if (fin < s0->end)
                    fin = s0->end; /* it held the token until then */
                note_tail(&p->sl[s0->slice], fin > from ? fin - from : 0);
            } else if (now >= from + VGPU_TAIL_MAX_NS) {
                /* Never reported (a waiter that died, or a tenant that scrambles its
                 * reports): it pays the longest tail. */
                note_tail(&p->sl[s0->slice], VGPU_TAIL_MAX_NS);
                give_up_tail(p, from, VGPU_TAIL_MAX_NS, now);
                continue;
            } else {
                return;
            }
        }
        settle(p, fin > now ? now : fin, now);
    }
}

/* End the current hold at `end` (seen at now) for reason `why`. */
static void end_hold(struct vg_pol *p, uint64_t end, uint64_t now, enum vg_pol_end why, struct vg_pol_decision *d)
{
    if (p->holder < 0)
        return;
    int revoked = why != VG_POL_RELEASED && why != VG_POL_GONE;
    struct vg_pol_seg *c = &p->seg[p->nseg - 1];
    c->end = end > c->granted ? end : c->granted;
    /* A grant no process took before we took it back left nothing queued. Taken is
     * latched the first time we see it (a taker rings us at once), so a tenant that
     * scrambles owner_seq afterwards cannot make its tail look like a grant nobody took. */
    c->revoked = revoked && (c->taken || p->sl[p->holder].req.owner_seq == p->seq);
    c->idle = idle_claimed(p, end);
    c->idle_cap = idle_cap(p, end);
    c->first = first_claimed(p, end);
    c->launch = launch_claimed(p, end);
    c->turn = turn_claimed(p, end);
    d->ended = why;
    d->ended_slice = p->holder;
    d->revoked = revoked;
    p->holder = -1;
    settle_ready(p, now);
}

void vg_pol_drop(struct vg_pol *p, int i, uint64_t now, struct vg_pol_decision *d)
{
    memset(d, 0, sizeof(*d));
    if (p->holder == i)
        end_hold(p, now, now, VG_POL_GONE, d);
    for (int k = 0; k < p->nseg; k++) {
        if (p->seg[k].slice == i)
            p->seg[k].slice = -1; /* gone: its time is nobody's */
        if (p->seg[k].ovl_half && p->seg[k].ovl_slice == i)
            p->seg[k].ovl_slice = -1; /* (nor is anything given back to it) */
    }
    p->sl[i].in_use = 0;
}

/* ---- the current hold ---- */

/* Credit this close to the cap is lost while its slice waits (a step loop that cannot
 * spend it for the holder's credit-backed hold): such a waiter goes before a holder that
 * is not so close, or its share drains away into the cap. */
static int capped(const struct vg_pol_slice *b, int64_t credit)
{
    return credit >= credit_cap(b) - (int64_t)VG_POL_CAP_MARGIN_NS;
}

/* The holder's credit net of the current hold's charge so far. While an earlier hold's
 * tail is unsettled our work's start is not known: count the hold from its grant (our
 * credit runs out no later than it would). */
static int64_t live_credit(const struct vg_pol *p, uint64_t now)
{
    const struct vg_pol_slice *b = &p->sl[p->holder];
    return b->credit - (int64_t)(p->nseg == 1 ? live_charge(p, now) : now - p->granted);
}

static enum vg_pol_end should_revoke(const struct vg_pol *p, uint64_t now)
{
    int h = p->holder;
    const struct vg_pol_slice *b = &p->sl[h];
    int64_t live = live_credit(p, now);
    if (!p->seg[p->nseg - 1].taken && b->req.owner_seq != p->seq && now - p->granted >= VGPU_TAKE_NS)
        return VG_POL_UNTAKEN; /* nobody took it (a want that was a lie, or a waiter gone) */
    struct standing me = standing_of(p, b, live, now), other;
    if (me.on_floor && !p->on_floor)
        return VG_POL_OUTRANKED; /* preempted by a higher priority */
    if (p->on_floor && b->floor_credit - (int64_t)live_charge(p, now) <= 0)
        return VG_POL_FLOOR_SPENT;
    if (b->set.policy == VGPU_POLICY_FIXED && live <= 0)
        return VG_POL_NO_CREDIT;
    int quantum = now - p->granted >= quantum_of(b);
    uint64_t beat = believed(b->req.active_ns, p->granted, now);
    if ((beat ? beat : p->granted) + VGPU_LEASE_NS < now)
        return VG_POL_LEASE; /* its processes died or stopped: the lease lapsed */
    int w = best_waiter(p, h, now, &other);
    if (w >= 0 && better(&other, &me)) {
        if (other.prio > me.prio)
            return VG_POL_PRIORITY;
        if (other.floor_due)
            return VG_POL_FLOOR;
        if (!me.credit)
            return VG_POL_OWES;
        if (quantum)
            return VG_POL_QUANTUM;
        if (capped(&p->sl[w], p->sl[w].credit) > capped(b, live))
            return VG_POL_CAP;
        return VG_POL_HELD;
    }
    /* Other processes of this slice take turns too. */
    return quantum && b->waiting ? VG_POL_TURN : VG_POL_HELD;
}

/* A hold granted with no hold unsettled before it comes next in GPU order after the last
 * one settled. If that was a tail settled unreported when no hold followed it yet (two
 * slices each blocked behind their own long launch: nobody asked), this one is what it
 * runs alongside: without it, the tail's slice paid the overlap in full when it drained,
 * and so did this hold (each launch of 1 s beside another slice's, time-sliced, was
 * charged 1.4 s). */
static void follow_late(struct vg_pol *p, int i)
{
    for (unsigned j = 0; j < VG_POL_SLICES; j++) {
        struct vg_pol_slice *b = &p->sl[j];
        if (b->in_use && b->late_seq && !b->late_next_seq) {
            b->late_next_seq = p->seq;
            b->late_next = i;
        }
    }
}

static void grant(struct vg_pol *p, int i, uint64_t now, struct vg_pol_decision *d)
{
    struct vg_pol_slice *b = &p->sl[i];
    /* The epoch in the seq's top 4 bits: two brokers that overlap for a moment (an
     * election race, a stopped broker replaced) never publish the same grant word, so a
     * process that took one broker's grant cannot mistake another's for its own. */
    uint32_t count = (p->seq + 1) & 0xFFFFFu;
    p->seq = ((p->epoch & 0xFu) << 20) | (count ? count : 1);
    if (p->nseg == VG_POL_SEG_MAX) {
        /* The oldest, a tail not reported yet, makes room: charged its tail so far (had it
         * ended now, the holds after it would be charged only from now, their GPU time
         * before it lost: a tenant that never reports gave its neighbours free time). */
        struct vg_pol_seg *s0 = &p->seg[0];
        uint64_t from = tail_from(s0);
        if (s0->slice >= 0 && s0->revoked && !s0->drained)
            give_up_tail(p, from, now > from ? now - from : 0, now);
        else
            settle(p, from, now); /* (a gone slice's: nobody pays it) */
    }
    p->holder = i;
    p->granted = p->last_step = now;
    p->uncontended = 0;
    p->on_floor = standing_of(p, b, b->credit, now).on_floor;
    int k = p->nseg++;
    p->seg[k] = (struct vg_pol_seg){.slice = i, .seq = p->seq, .on_floor = p->on_floor, .granted = now,
                                    .start = k ? 0 : now};
    b->holds++;
    if (!k)
        follow_late(p, i);
    d->granted = 1;
    d->word = (p->seq << 8) | (uint32_t)(i + 1);
}

/* ---- one step ---- */

static void summarize(struct vg_pol *p, uint64_t now, struct vg_pol_summary *sum)
{
    memset(sum, 0, sizeof(*sum));
    for (unsigned i = 0; i < VG_POL_SLICES; i++) {
        const struct vg_pol_slice *b = &p->sl[i];
        if (!b->in_use)
            continue;
        if (now - b->last_active < VGPU_ACTIVE_NS) {
            sum->active_mask |= 1u << b->set.prio;
            sum->active++;
        }
        if (now - b->last_seen < VGPU_PRESENT_NS)
            sum->present[b->set.prio]++;
        if (b->waiting && (int)i != p->holder)
            sum->contended = 1;
    }
    p->active = sum->active;
}

/* When to look again without being rung. */
static uint64_t next_look(const struct vg_pol *p, uint64_t now)
{
    uint64_t sleep = VGPU_BEAT_NS;
    if (p->nseg && p->seg[0].end && p->seg[0].revoked) {
        uint64_t from = tail_from(&p->seg[0]);
        uint64_t t = from + VGPU_TAIL_MAX_NS > now ? from + VGPU_TAIL_MAX_NS - now : 50 * VGPU_US;
        if (t < sleep)
            sleep = t;
    }
    int waiters = 0;
    for (unsigned i = 0; i < VG_POL_SLICES; i++) {
        const struct vg_pol_slice *b = &p->sl[i];
        if (!b->in_use || !b->waiting || (int)i == p->holder)
            continue;
        waiters = 1;
        if (b->set.policy == VGPU_POLICY_FIXED && b->credit < min_hold(p, b)) {
            uint64_t t = (uint64_t)(min_hold(p, b) - b->credit) * 100 / b->set.share;
            if (t < sleep)
                sleep = t;
        }
    }
    if (p->holder >= 0) {
        const struct vg_pol_slice *b = &p->sl[p->holder];
        int64_t live = live_credit(p, now);
        if (!p->seg[p->nseg - 1].taken && now - p->granted < VGPU_TAKE_NS && VGPU_TAKE_NS - (now - p->granted) < sleep)
            sleep = VGPU_TAKE_NS - (now - p->granted); /* look again when an untaken grant lapses */
        if (b->set.policy == VGPU_POLICY_FIXED || p->on_floor) {
            uint64_t t = live > 0 ? (uint64_t)live : 0;
            if (t < sleep)
                sleep = t;
        }
        if (waiters && sleep > VGPU_MS)
            sleep = VGPU_MS; /* standings change as credit accrues */
    }
    return sleep < 20 * VGPU_US ? 20 * VGPU_US : sleep;
}

void vg_pol_step(struct vg_pol *p, uint64_t now, struct vg_pol_decision *d)
{
    memset(d, 0, sizeof(*d));
    int others_wait = 0;
    uint64_t bank = p->holder >= 0 ? quantum_of(&p->sl[p->holder]) : VG_POL_QUANTUM_NS;
    for (unsigned i = 0; i < VG_POL_SLICES; i++) {
        struct vg_pol_slice *b = &p->sl[i];
        if (!b->in_use)
            continue;
        refill(b, now, (int64_t)unsettled(p, (int)i, now), b->waiting && (int)i != p->holder ? bank : 0);
        const struct vg_pol_claims *r = &b->req;
        b->waiting = r->want > 0 && r->want < (1u << 20) && believed(r->want_ns, ago(now, VGPU_ACTIVE_NS), now);
        /* Active: waiting, or renewing its lease or its 100% activity (a lapsed
         * holder is not: a dead high-priority slice must not hold the others back). */
        if (b->waiting || ((int)i == p->holder && now - p->granted < VGPU_ACTIVE_NS))
            b->last_active = now;
        uint64_t seen = believed(r->want_ns, ago(now, VGPU_PRESENT_NS), now);
        uint64_t rep = believed(r->active_ns, ago(now, VGPU_PRESENT_NS), now);
        seen = rep > seen ? rep : seen;
        if (b->waiting || (int)i == p->holder)
            seen = now;
        if (seen > b->last_seen)
            b->last_seen = seen > now ? now : seen;
        uint64_t a = believed(r->active_ns, ago(now, VGPU_ACTIVE_NS), now);
        if (a > b->last_active)
            b->last_active = a > now ? now : a;
        if (b->waiting && (int)i != p->holder)
            others_wait = 1;
        if (b->late_seq && r->drain_seq == b->late_seq) {
            /* A tail longer than VGPU_TAIL_MAX_NS (one long launch) drained at last: its
             * slice pays the rest of it (a false date costs only itself). A report seen
             * after the wait but dated within it (a tail of about the wait's length, one
             * 50 ms launch, reported as the broker gave up on it) owes nothing more, and
             * still says when the hold queued behind it could start: dropped, that hold
             * paid the wait a second time. A date earlier than the truth moves nothing onto
             * that hold, which is charged from no earlier than its grant. */
            uint64_t end = believed(r->drain_ns, b->late_began, now);
            if (end) {
                /* What it earned while its launch ran on was its own, though the cap took
                 * it: a tail that is never reported gets nothing back. */
                b->credit += (int64_t)b->late_lost;
                struct vg_pol_seg *next;
                uint64_t half = late_shared(p, b, end, now, &next);
                charge_late(p, (int)i, end, half);
                late_next_part(p, b, end, half, next);
            }
            b->late_seq = 0;
            b->late_lost = 0;
        }
    }
    /* Holds before the current one: settled as their queued work reports its end. */
    settle_ready(p, now);
    if (p->holder >= 0) {
        if (!others_wait)
            p->uncontended += now - p->last_step;
        p->last_step = now;
        const struct vg_pol_claims *r = &p->sl[p->holder].req;
        if (r->owner_seq == p->seq)
            p->seg[p->nseg - 1].taken = 1;
        enum vg_pol_end why;
        if (r->release_seq == p->seq) {
            uint64_t lo = ago(now, VG_POL_RELEASE_SLACK_NS);
            uint64_t end = believed(r->release_ns, lo > p->granted ? lo : p->granted, now);
            end_hold(p, end ? (end > now ? now : end) : now, now, VG_POL_RELEASED, d);
        } else if (r->yield_seq == p->seq && best_waiter(p, p->holder, now, &(struct standing){0}) >= 0) {
            /* It syncs with its CPU work to follow: its tail runs out with the next
             * holder's work queued behind it (charged to it until it reports the drain). */
            end_hold(p, now, now, VG_POL_YIELDED, d);
        } else if ((why = should_revoke(p, now)) != VG_POL_HELD) {
            end_hold(p, now, now, why, d);
        }
    }
    if (p->holder < 0) {
        struct standing st;
        int next = best_waiter(p, -1, now, &st);
        if (next >= 0)
            grant(p, next, now, d);
    }
    summarize(p, now, &d->sum);
    d->sleep_ns = next_look(p, now);
}

const char *vg_pol_end_name(enum vg_pol_end e)
{
    static const char *const names[] = {
        [VG_POL_HELD] = "held",         [VG_POL_RELEASED] = "released", [VG_POL_YIELDED] = "yielded",
        [VG_POL_UNTAKEN] = "untaken",   [VG_POL_OUTRANKED] = "outranked", [VG_POL_FLOOR_SPENT] = "floor-spent",
        [VG_POL_NO_CREDIT] = "credit",  [VG_POL_LEASE] = "lease",       [VG_POL_PRIORITY] = "priority",
        [VG_POL_FLOOR] = "floor",       [VG_POL_OWES] = "owes",         [VG_POL_QUANTUM] = "quantum",
        [VG_POL_CAP] = "cap",           [VG_POL_TURN] = "turn",         [VG_POL_GONE] = "gone",
    };
    return (unsigned)e < sizeof(names) / sizeof(names[0]) && names[e] ? names[e] : "?";
}
