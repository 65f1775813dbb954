/* SPDX-License-Identifier: Apache-2.0 */
/*
 * policy_trace.c - play the broker's rules (libvgpu/src/policy.c) on a trace.
 *
 * Reads lines "T SLICE EVENT [ARGS]" on stdin, T in ms (any decimals), in order; '#'
 * starts a comment. SLICE is any name (the first `settings` takes it on); `-` names
 * no slice. The program plays a perfect broker: it steps at every line's time (the
 * slice rang) and whenever the last step asked to look again, and plays each slice's
 * libvgpu side as far as the trace leaves it to it: a waiter renews its request, a
 * holder its lease, at every step (until `silence`), and a waiter takes the grant as
 * soon as it is made (unless `notake`).
 *
 * Slice events:
 *   settings share=N [policy=fixed|burst] [prio=low|normal|high] [floor=N]
 *                       take the slice on (or change its settings)
 *   want [notake] [tail=MS]
 *                       one request: granted and taken, it stops waiting. notake:
 *                       nobody takes the grant (a request that was a lie); tail=MS:
 *                       from now on each revoked hold of its reports its drain MS
 *                       later (without: by hand, `drain`)
 *   greedy [tail=MS]    it wants the token again as soon as a hold ends
 *   stop                it no longer waits
 *   take                take the grant it was given (after `want notake`)
 *   release [at=T]      give the hold back, its queue drained (dated T)
 *   yield               offer the hold back (it syncs, CPU work follows)
 *   drain [at=T] [hold=K]
 *                       report the drain of its last revoked hold (or its K-th hold)
 *   empty / busy        its GPU queue is empty from now (idle_since) / has work again
 *                       (the empty spell is added to the hold's idle claim)
 *   idle MS             claim MS of empty queue in the current hold (idle_ns)
 *   silence             its processes stop renewing anything (killed, stopped)
 *   claim F=V ...       write claims by hand: want, want_ns, owner_seq, release_seq,
 *                       release_ns, drain_seq, drain_ns, yield_seq, idle_ns, active_ns,
 *                       idle_since, start_seq, start_ns, launch_seq, launch_ns, turn_seq,
 *                       turn_ns; times in
 *                       trace ms (`never` = 0), seqs as the slice's K-th hold (0 = none),
 *                       idle_ns in ms
 *   leave               the slice is gone (its files removed)
 * Events of no slice:
 *   account             print every slice's accounting
 *   end                 run the broker up to T, print the accounting, stop
 *
 * Output, times in ms:
 *   T grant S                    S is granted the token
 *   T end S WHY                  S's hold ended (vg_pol_end_name: released, quantum, ...)
 *   T charge S MS                S was charged MS of GPU time in this step
 *   T refund S MS                ... or given MS back (what it was charged was another's)
 *   T account S used=MS credit=MS holds=N waiting=W
 * Used by tests/libvgpu/test_policy_traces.py.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/policy.h"
#include "../include/vgpu_region.h"

#define T0 (1000000 * VGPU_MS) /* trace time 0 on the broker's clock: every window fits before it */
#define NAMES 16
#define MAX_HOLDS 256

struct tslice {
    char name[32];
    int slot;               /* -1: not on the GPU */
    int silenced;
    int wants, greedy, notake;
    double tail_ms;         /* < 0: drains are reported by hand */
    int holding;
    uint32_t seqs[MAX_HOLDS];
    unsigned nholds;
    uint32_t last_revoked;
    double drain_at;        /* an automatic drain report due then (< 0: none) ... */
    uint32_t drain_seq;     /* ... of this hold */
    uint64_t used_before;
};

static struct vg_pol pol;
static struct tslice ts[NAMES];
static int nts;
static uint64_t wake;       /* the broker looks again then (0: not yet asked) */

static uint64_t ns_of(double ms)
{
    return T0 + (uint64_t)(ms * 1e6 + 0.5);
}

static double ms_of(uint64_t ns)
{
    return ((double)ns - (double)T0) / 1e6;
}

static void die(const char *what, const char *line)
{
    fprintf(stderr, "policy_trace: %s: %s", what, line);
    exit(2);
}

static struct tslice *slice_named(const char *name)
{
    for (int i = 0; i < nts; i++)
        if (!strcmp(ts[i].name, name))
            return &ts[i];
    if (nts == NAMES)
        return NULL;
    struct tslice *t = &ts[nts++];
    memset(t, 0, sizeof(*t));
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->slot = -1;
    t->tail_ms = -1;
    t->drain_at = -1;
    return t;
}

static struct tslice *slice_at(int slot)
{
    for (int i = 0; i < nts; i++)
        if (ts[i].slot == slot)
            return &ts[i];
    return NULL;
}

static void print_charges(uint64_t now)
{
    for (int i = 0; i < nts; i++) {
        struct tslice *t = &ts[i];
        if (t->slot < 0)
            continue;
        uint64_t used = pol.sl[t->slot].used;
        if (used > t->used_before)
            printf("%.3f charge %s %.3f\n", ms_of(now), t->name, (double)(used - t->used_before) / 1e6);
        else if (used < t->used_before)
            printf("%.3f refund %s %.3f\n", ms_of(now), t->name, (double)(t->used_before - used) / 1e6);
        t->used_before = used;
    }
}

/* Print a hold's end; 1 when its slice answers at once (reports an empty tail). */
static int print_ended(const struct vg_pol_decision *d, uint64_t now)
{
    struct tslice *t = slice_at(d->ended_slice);
    int answered = 0;
    if (!t)
        return 0;
    printf("%.3f end %s %s\n", ms_of(now), t->name, vg_pol_end_name(d->ended));
    if (t->holding && d->revoked) {
        t->last_revoked = t->seqs[t->nholds - 1];
        if (t->tail_ms == 0) { /* its queue was empty: the report comes with the revocation */
            pol.sl[t->slot].req.drain_seq = t->last_revoked;
            pol.sl[t->slot].req.drain_ns = now;
            answered = 1;
        } else if (t->tail_ms > 0) {
            t->drain_at = ms_of(now) + t->tail_ms;
            t->drain_seq = t->last_revoked;
        }
    }
    t->holding = 0;
    return answered;
}

static void take(struct tslice *t, uint64_t now)
{
    struct vg_pol_claims *r = &pol.sl[t->slot].req;
    r->owner_seq = t->seqs[t->nholds - 1];
    r->want = 0;
    r->active_ns = now;
    r->idle_ns = 0;
    r->idle_since = 0;
    t->holding = 1;
    t->wants = 0;
}

/* One broker step at now, after the slices renewed what they renew; again at the same
 * time while a slice answers it at once (takes a grant, asks again). */
static void step(uint64_t now)
{
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < nts; i++) {
            struct tslice *t = &ts[i];
            if (t->slot < 0 || t->silenced)
                continue;
            struct vg_pol_claims *r = &pol.sl[t->slot].req;
            if (t->wants || (t->greedy && !t->holding)) {
                r->want = 1;
                r->want_ns = now;
            }
            if (t->holding)
                r->active_ns = now;
        }
        struct vg_pol_decision d;
        vg_pol_step(&pol, now, &d);
        int again = 0;
        if (d.ended != VG_POL_HELD) {
            again = print_ended(&d, now);
            struct tslice *t = slice_at(d.ended_slice);
            again |= t && t->greedy && !t->silenced;
        }
        if (d.granted) {
            struct tslice *t = slice_at((int)(d.word & 0xFF) - 1);
            printf("%.3f grant %s\n", ms_of(now), t ? t->name : "?");
            if (t && t->nholds < MAX_HOLDS) {
                t->seqs[t->nholds++] = d.word >> 8;
                if ((t->wants || t->greedy) && !t->notake && !t->silenced) {
                    take(t, now);
                    again = 1;
                }
            }
        }
        print_charges(now);
        wake = now + d.sleep_ns;
        if (!again)
            return;
    }
}

/* The slices' automatic drain reports and the broker's own looks, up to (not at) until. */
static void run_until(uint64_t until)
{
    for (;;) {
        uint64_t next = wake ? wake : until;
        struct tslice *due = NULL;
        for (int i = 0; i < nts; i++)
            if (ts[i].drain_at >= 0 && ts[i].slot >= 0 && ns_of(ts[i].drain_at) <= next &&
                (!due || ts[i].drain_at < due->drain_at))
                due = &ts[i];
        if (due)
            next = ns_of(due->drain_at);
        if (next >= until || !wake)
            return;
        if (due) {
            struct vg_pol_claims *r = &pol.sl[due->slot].req;
            r->drain_seq = due->drain_seq;
            r->drain_ns = next;
            due->drain_at = -1;
        }
        step(next);
    }
}

static void account(uint64_t now)
{
    for (int i = 0; i < nts; i++) {
        const struct tslice *t = &ts[i];
        if (t->slot < 0)
            continue;
        const struct vg_pol_slice *b = &pol.sl[t->slot];
        printf("%.3f account %s used=%.3f credit=%.3f holds=%u waiting=%d\n", ms_of(now), t->name,
               (double)b->used / 1e6, (double)b->credit / 1e6, b->holds, b->waiting);
    }
}

/* The value of "key=value" in args (NULL when absent). */
static const char *arg(char *const *args, int n, const char *key)
{
    size_t k = strlen(key);
    for (int i = 0; i < n; i++)
        if (!strncmp(args[i], key, k) && args[i][k] == '=')
            return args[i] + k + 1;
    return NULL;
}

static int has(char *const *args, int n, const char *word)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(args[i], word))
            return 1;
    return 0;
}

static uint32_t seq_of(const struct tslice *t, const char *v, const char *line)
{
    unsigned k = (unsigned)strtoul(v, NULL, 10);
    if (!k)
        return 0;
    if (k > t->nholds)
        die("no such hold", line);
    return t->seqs[k - 1];
}

static void settings(struct tslice *t, char *const *args, int n, uint64_t now, const char *line)
{
    int fresh = t->slot < 0;
    if (fresh) {
        for (unsigned i = 0; i < VG_POL_SLICES && t->slot < 0; i++)
            if (!pol.sl[i].in_use)
                t->slot = (int)i;
        memset(&pol.sl[t->slot], 0, sizeof(pol.sl[t->slot]));
        pol.sl[t->slot].set = (struct vg_pol_settings){50, VGPU_PRIORITY_NORMAL, VGPU_POLICY_FIXED, 0};
    }
    struct vg_pol_settings s = pol.sl[t->slot].set;
    const char *v;
    if ((v = arg(args, n, "share")))
        s.share = (uint32_t)atoi(v);
    if ((v = arg(args, n, "floor")))
        s.floor = (uint32_t)atoi(v);
    if ((v = arg(args, n, "policy")))
        s.policy = !strcmp(v, "burst") ? VGPU_POLICY_BURST : !strcmp(v, "fixed") ? VGPU_POLICY_FIXED : 9;
    if ((v = arg(args, n, "prio")))
        s.prio = !strcmp(v, "low") ? VGPU_PRIORITY_LOW : !strcmp(v, "normal") ? VGPU_PRIORITY_NORMAL
               : !strcmp(v, "high") ? VGPU_PRIORITY_HIGH : 9;
    if (s.policy == 9 || s.prio == 9)
        die("bad settings", line);
    vg_pol_settings(&pol, t->slot, s.share, s.prio, s.policy, s.floor);
    if (fresh) {
        vg_pol_take_on(&pol, t->slot, now);
        t->used_before = 0;
    }
}

static void claim(struct tslice *t, char *const *args, int n, const char *line)
{
    struct vg_pol_claims *r = &pol.sl[t->slot].req;
    for (int i = 0; i < n; i++) {
        char *eq = strchr(args[i], '=');
        if (!eq)
            die("claim wants F=V", line);
        *eq = 0;
        const char *f = args[i], *v = eq + 1;
        uint64_t when = !strcmp(v, "never") ? 0 : ns_of(atof(v));
        if (!strcmp(f, "want"))
            r->want = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(f, "want_ns"))
            r->want_ns = when;
        else if (!strcmp(f, "release_ns"))
            r->release_ns = when;
        else if (!strcmp(f, "drain_ns"))
            r->drain_ns = when;
        else if (!strcmp(f, "active_ns"))
            r->active_ns = when;
        else if (!strcmp(f, "idle_since"))
            r->idle_since = when;
        else if (!strcmp(f, "idle_ns"))
            r->idle_ns = (uint64_t)(atof(v) * 1e6 + 0.5);
        else if (!strcmp(f, "owner_seq"))
            r->owner_seq = seq_of(t, v, line);
        else if (!strcmp(f, "release_seq"))
            r->release_seq = seq_of(t, v, line);
        else if (!strcmp(f, "drain_seq"))
            r->drain_seq = seq_of(t, v, line);
        else if (!strcmp(f, "yield_seq"))
            r->yield_seq = seq_of(t, v, line);
        else if (!strcmp(f, "start_seq"))
            r->start_seq = seq_of(t, v, line);
        else if (!strcmp(f, "start_ns"))
            r->start_ns = when;
        else if (!strcmp(f, "turn_seq"))
            r->turn_seq = seq_of(t, v, line);
        else if (!strcmp(f, "turn_ns"))
            r->turn_ns = when;
        else if (!strcmp(f, "launch_seq"))
            r->launch_seq = seq_of(t, v, line);
        else if (!strcmp(f, "launch_ns"))
            r->launch_ns = when;
        else
            die("no such claim", line);
    }
}

/* Apply one slice event at now. */
static void event(struct tslice *t, const char *ev, char **args, int n, uint64_t now, const char *line)
{
    if (!strcmp(ev, "settings")) {
        settings(t, args, n, now, line);
        return;
    }
    if (t->slot < 0)
        die("the slice has no settings yet", line);
    struct vg_pol_claims *r = &pol.sl[t->slot].req;
    uint32_t held = t->nholds ? t->seqs[t->nholds - 1] : 0;
    const char *v;
    if (!strcmp(ev, "want") || !strcmp(ev, "greedy")) {
        t->wants = ev[0] == 'w';
        t->greedy = ev[0] == 'g';
        t->notake = has(args, n, "notake");
        if ((v = arg(args, n, "tail")))
            t->tail_ms = atof(v);
        t->silenced = 0;
    } else if (!strcmp(ev, "stop")) {
        t->wants = t->greedy = 0;
        r->want = 0;
    } else if (!strcmp(ev, "take")) {
        if (!t->nholds)
            die("nothing to take", line);
        take(t, now);
    } else if (!strcmp(ev, "release")) {
        r->release_seq = held;
        r->release_ns = (v = arg(args, n, "at")) ? ns_of(atof(v)) : now;
        t->holding = 0;
    } else if (!strcmp(ev, "yield")) {
        r->yield_seq = held;
    } else if (!strcmp(ev, "drain")) {
        r->drain_seq = (v = arg(args, n, "hold")) ? seq_of(t, v, line) : t->last_revoked;
        r->drain_ns = (v = arg(args, n, "at")) ? ns_of(atof(v)) : now;
    } else if (!strcmp(ev, "empty")) {
        r->idle_since = now;
    } else if (!strcmp(ev, "busy")) {
        if (r->idle_since && r->idle_since < now)
            r->idle_ns += now - r->idle_since;
        r->idle_since = 0;
    } else if (!strcmp(ev, "idle") && n == 1) {
        r->idle_ns = (uint64_t)(atof(args[0]) * 1e6 + 0.5);
    } else if (!strcmp(ev, "silence")) {
        t->silenced = 1;
    } else if (!strcmp(ev, "claim")) {
        claim(t, args, n, line);
    } else if (!strcmp(ev, "leave")) {
        struct vg_pol_decision d;
        vg_pol_drop(&pol, t->slot, now, &d);
        if (d.ended != VG_POL_HELD)
            print_ended(&d, now);
        print_charges(now);
        t->slot = -1;
        t->holding = t->wants = t->greedy = 0;
        return;
    } else {
        die("no such event", line);
    }
}

int main(void)
{
    vg_pol_init(&pol, 1);
    char line[512];
    double last = 0;
    while (fgets(line, sizeof(line), stdin)) {
        char copy[512], *words[32];
        char *hash = strchr(line, '#');
        snprintf(copy, sizeof(copy), "%.*s", hash ? (int)(hash - line) : (int)strlen(line), line);
        int n = 0;
        for (char *w = strtok(copy, " \t\r\n"); w && n < 32; w = strtok(NULL, " \t\r\n"))
            words[n++] = w;
        if (n == 0)
            continue;
        if (n < 3)
            die("want T SLICE EVENT", line);
        char *endp;
        double t = strtod(words[0], &endp);
        if (*endp || t < last)
            die("bad or earlier time", line);
        last = t;
        uint64_t now = ns_of(t);
        run_until(now);
        if (!strcmp(words[1], "-")) {
            if (!strcmp(words[2], "account")) {
                account(now);
            } else if (!strcmp(words[2], "end")) {
                run_until(now + 1); /* what falls due at T too */
                account(now);
                return 0;
            } else {
                die("no such event", line);
            }
            continue;
        }
        struct tslice *s = slice_named(words[1]);
        if (!s)
            die("too many slices", line);
        event(s, words[2], words + 3, n - 3, now, line);
        step(now);
    }
    return 0;
}
