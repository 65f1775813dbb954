/* SPDX-License-Identifier: Apache-2.0 */
/*
 * broker.c - grants one GPU's token to the slices on it (vgpu_sched.h): the I/O
 * around the rules of policy.c.
 *
 * The broker is the only writer of the per-GPU file; each slice writes only
 * its own .req file, which the broker reads with pread (a file a tenant
 * truncates reads short, it cannot fault us) and checks field by field. Each
 * step reads the clock and every slice's claims, lets policy.c decide, and
 * publishes the decision: the grant word (with a futex wake), the accounting of
 * each slice and the heartbeat. A slice's settings come from vgpud's .conf
 * (standalone: from its .req); slices come and go as their files do.
 */
#include "broker.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <linux/futex.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../include/vgpu_region.h"
#include "../include/vgpu_timing.h"
#include "broker_record.h"
#include "policy.h"

#define RESCAN_NS (20 * VGPU_MS)     /* new, changed and gone slices are seen within this */
#define RESCAN_RUNG_NS (2 * VGPU_MS) /* ... and within this when a slice rings */
/* vgpud's broker lists its directory and stats each slice's .conf only when inotify says
 * a slice file of its GPU was made, renamed or deleted there (vgpud makes and removes
 * them so, and writes a .conf beside and renames it over), and in any case once per
 * RESCAN_FULL_NS (a hand-edited .conf, events lost to a full queue). Polling every
 * RESCAN_NS cost an idle broker a listing per GPU and a stat per slice each time: 56 ms
 * of CPU a second with 50 slices on one of 4 GPUs, 20 ms with none. Tenants cannot make
 * events there (the directory is vgpud's, 0700). */
#define RESCAN_FULL_NS (1000 * VGPU_MS)
#define WATCH_MASK (IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | \
                    IN_MOVE_SELF | IN_ONLYDIR)
/* The doorbell is in the GPU file, which every container maps, and a FUTEX_WAKE needs only
 * a read-only mapping: anyone can ring it, as often as it likes. A ring makes the broker
 * step early only when a slice's requests changed, and each slice's changes may do so
 * RING_BURST times at once, then once per RING_REFILL_NS (a slice rings a few times per
 * hold); a change past that waits for the next step that is due anyway. Rings that changed
 * nothing cost a read of the requests; after EMPTY_RINGS_MAX of them, each within
 * EMPTY_GAP_NS of the last, the broker stops listening for QUIET_SPAN_NS and looks at the
 * requests every QUIET_NS instead (a real request then waits at most that long). */
#define RING_BURST 8u
#define RING_REFILL_NS (100 * VGPU_US)
#define EMPTY_RINGS_MAX 8u
#define EMPTY_GAP_NS (1 * VGPU_MS)
#define QUIET_SPAN_NS (10 * VGPU_MS)
#define QUIET_NS (250 * VGPU_US)

_Static_assert(VG_POL_SLICES == VGPU_SCHED_ENTRIES, "one policy slice per entry of the GPU file");

/* A slice's files; its settings, claims and accounting are in the policy (same index). */
struct bslice {
    uint64_t key;                  /* 0 = free slot */
    int fd;                        /* the .req, read with pread; -1 in private mode */
    struct vgpu_sched_req *mem;    /* private mode: the req itself */
    /* The .req mapped read-only, never read through (a tenant may truncate it): only the
     * address of its wake word, for FUTEX_WAKE (which fails with EFAULT past the end of a
     * file, never faults the broker). The word itself is written with pwrite. */
    const struct vgpu_sched_req *wmap;
    uint32_t wake_seq;
    uint64_t sig;                  /* its requests' signature at the last step */
    uint32_t ring_tokens;          /* early steps its changes may still cause (RING_BURST) */
    uint64_t ring_refill_ns;
    ino_t conf_ino;
    struct timespec conf_mtime;
    int seen;
};

struct vg_bgpu {
    struct vgpu_sched *s;
    char dir[256], uuid[VGPU_SCHED_UUID_LEN];
    int confs, priv;
    struct bslice sl[VGPU_SCHED_ENTRIES];
    struct vg_pol pol;
    uint64_t last_scan;            /* the last look at the directory (a scan or its events) */
    uint64_t last_full;            /* the last scan (RESCAN_FULL_NS) */
    int watch;                     /* inotify fd watching dir (vgpud's broker); -1: poll */
    int fresh;                     /* every slice's claims were read since the last step */
    uint32_t empty_rings;          /* rings in a row that changed nothing (EMPTY_RINGS_MAX) */
    uint64_t empty_ns, quiet_until; /* the last of them; not listening until then */
    int rung;                      /* woken by a ring: a new slice may be asking */
    struct vg_record *rec;         /* VGPU_BROKER_RECORD: the policy's inputs, written down */
};

uint64_t vg_broker_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int vg_broker_lock(int gpu_fd, const char *path)
{
    struct stat sb;
    if (fstat(gpu_fd, &sb) != 0)
        return -1;
    char lock[PATH_MAX];
    const char *slash = strrchr(path, '/');
    int dirlen = slash ? (int)(slash - path) : 1;
    if (snprintf(lock, sizeof(lock), "%.*s/%s", dirlen, slash ? path : ".", VGPU_BROKER_LOCK_NAME) >=
        (int)sizeof(lock)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    /* 0666: standalone, every user's processes that share the directory may elect one of
     * theirs (a write lock needs a writable fd); vgpud's directory is its own, 0700. */
    int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0666);
    if (fd < 0)
        return -1;
    struct stat lb;
    /* A lock on a FIFO or device someone put there would be no lock at all. */
    if (fstat(fd, &lb) != 0 || !S_ISREG(lb.st_mode)) {
        close(fd);
        errno = EINVAL;
        return -1;
    }
    /* One byte per GPU file, at its inode number (kept below 2^62: off_t is signed). An
     * open-file-description lock: released when the last fd of this open goes, by a
     * crash too, and exclusive between threads of one process (a POSIX lock is not). */
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET,
                       .l_start = (off_t)(sb.st_ino & ((1ull << 62) - 1)), .l_len = 1};
    if (fcntl(fd, F_OFD_SETLK, &fl) != 0) {
        int e = errno;
        close(fd);
        errno = e == EACCES ? EAGAIN : e;
        return -1;
    }
    return fd;
}

static long futex(_Atomic uint32_t *w, int op, uint32_t val, uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    /* Shared mappings: process-shared futexes (no FUTEX_PRIVATE_FLAG). */
    return syscall(SYS_futex, (uint32_t *)w, op, val, op == FUTEX_WAIT ? &ts : NULL, NULL, 0);
}

void vg_futex_wait(_Atomic uint32_t *w, uint32_t val, uint64_t ns)
{
    futex(w, FUTEX_WAIT, val, ns);
}

void vg_broker_ring(struct vgpu_sched *s)
{
    /* The broker sets the doorbell, checks every request once more, then
     * sleeps: a wake that finds nobody asleep yet is retried until it finds
     * the broker asleep or awake (bounded: a dead broker never sleeps). */
    for (int i = 0; i < 64 && atomic_load(&s->doorbell); i++) {
        if (futex(&s->doorbell, FUTEX_WAKE, INT_MAX, 0) > 0)
            return;
        sched_yield();
    }
}

int vg_sched_header_ok(const struct vgpu_sched *s)
{
    uint64_t got, want;
    return vgpu_sched_check(s, &got, &want) == NULL; /* the list in vgpu_sched.h */
}

/* ---- publishing ---- */

/* Wake slice i's waiters through its own .req (struct vgpu_sched wake_epoch). */
static void wake_slice(struct vg_bgpu *g, int i)
{
    struct bslice *b = &g->sl[i];
    if (b->mem) {
        atomic_fetch_add(&b->mem->wake, 1);
        futex(&b->mem->wake, FUTEX_WAKE, INT_MAX, 0);
        return;
    }
    uint32_t seq = ++b->wake_seq;
    if (b->fd < 0 || pwrite(b->fd, &seq, sizeof(seq), offsetof(struct vgpu_sched_req, wake)) != sizeof(seq))
        return; /* its own file, gone bad: its waiters renew within VGPU_WANT_RENEW_NS */
    if (b->wmap)
        futex((_Atomic uint32_t *)&b->wmap->wake, FUTEX_WAKE, INT_MAX, 0);
}

static void publish_grant(struct vg_bgpu *g, uint32_t v, uint64_t now)
{
    atomic_store(&g->s->grant_ns, now);
    atomic_store(&g->s->grant, v);
    /* Slices of an older libvgpu wait on the grant word itself. */
    futex(&g->s->grant, FUTEX_WAKE, INT_MAX, 0);
    unsigned e = v & 0xFFu;
    if (e && e <= VGPU_SCHED_ENTRIES && g->sl[e - 1].key)
        wake_slice(g, (int)e - 1);
}

/* Carry out a decision's grant changes: the hold's end (grant 0), then a new grant. */
static void apply(struct vg_bgpu *g, const struct vg_pol_decision *d, uint64_t now)
{
    if (d->ended != VG_POL_HELD) {
        if (d->revoked)
            atomic_fetch_add(&g->s->revocations, 1);
        publish_grant(g, 0, now);
    }
    if (d->granted) {
        atomic_fetch_add(&g->s->handoffs, 1);
        publish_grant(g, d->word, now);
    }
}

static void publish_settings(struct vg_bgpu *g, int i)
{
    const struct vg_pol_settings *set = &g->pol.sl[i].set;
    struct vgpu_sched_entry *e = &g->s->entries[i];
    atomic_store(&e->share, set->share);
    atomic_store(&e->priority, set->prio);
    atomic_store(&e->policy, set->policy);
    atomic_store(&e->floor, set->floor);
}

static void publish(struct vg_bgpu *g, const struct vg_pol_summary *sum, uint64_t now)
{
    struct vgpu_sched *s = g->s;
    for (unsigned i = 0; i < VGPU_SCHED_ENTRIES; i++) {
        if (!g->sl[i].key)
            continue;
        const struct vg_pol_slice *b = &g->pol.sl[i];
        struct vgpu_sched_entry *e = &s->entries[i];
        publish_settings(g, (int)i);
        atomic_store(&e->credit_ns, b->credit);
        atomic_store(&e->used_ns, b->used);
        atomic_store(&e->last_active_ns, b->last_active);
        atomic_store(&e->waiting, (uint32_t)b->waiting);
        atomic_store(&e->holds, b->holds);
    }
    for (int p = 0; p < 3; p++)
        atomic_store(&s->present[p], sum->present[p]);
    atomic_store(&s->active_mask, sum->active_mask);
    atomic_store(&s->contended, sum->contended);
    atomic_store(&s->active, sum->active);
    atomic_store(&s->broker_beat_ns, now);
}

/* ---- slices: settings, registration ---- */

/* vgpud's .conf of a slice: "share=30 priority=1 policy=0 floor=0". */
static int read_conf(struct vg_bgpu *g, int i, const char *path, int force)
{
    struct bslice *b = &g->sl[i];
    struct stat sb;
    if (stat(path, &sb) != 0)
        return -1;
    if (!force && sb.st_ino == b->conf_ino && sb.st_mtim.tv_sec == b->conf_mtime.tv_sec &&
        sb.st_mtim.tv_nsec == b->conf_mtime.tv_nsec)
        return 0;
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    unsigned share = 0, prio = VGPU_PRIORITY_NORMAL, policy = 0, floor = 0;
    int n = fscanf(f, "share=%u priority=%u policy=%u floor=%u", &share, &prio, &policy, &floor);
    fclose(f);
    if (n != 4)
        return -1;
    vg_pol_settings(&g->pol, i, share, prio, policy, floor);
    b->conf_ino = sb.st_ino;
    b->conf_mtime = sb.st_mtim;
    return 0;
}

/* The claims of a .req read whole (the policy's plain copy). */
static void claims_of(const struct vgpu_sched_req *r, struct vg_pol_claims *c)
{
    c->want = r->want;
    c->want_ns = r->want_ns;
    c->owner_seq = r->owner_seq;
    c->release_seq = r->release_seq;
    c->release_ns = r->release_ns;
    c->drain_seq = r->drain_seq;
    c->drain_ns = r->drain_ns;
    c->yield_seq = r->yield_seq;
    c->idle_ns = r->idle_ns;
    c->active_ns = r->active_ns;
    c->idle_since = r->idle_since;
    c->start_seq = r->start_seq;
    c->start_ns = r->start_ns;
    c->launch_seq = r->launch_seq;
    c->launch_ns = r->launch_ns;
    c->turn_seq = r->turn_seq;
    c->turn_ns = r->turn_ns;
}

/* This step's copy of a slice's requests: whole and its own, or zeros. */
static void read_req(struct vg_bgpu *g, int i)
{
    struct bslice *b = &g->sl[i];
    struct vg_pol_claims *c = &g->pol.sl[i].req;
    struct vgpu_sched_req r;
    if (b->mem) {
        memcpy(&r, b->mem, sizeof(r));
    } else if (pread(b->fd, &r, sizeof(r), 0) != (ssize_t)sizeof(r)) {
        memset(c, 0, sizeof(*c));
        return;
    }
    uint64_t got, want;
    if (vgpu_sched_req_check(&r, &got, &want) || r.key != b->key) {
        memset(c, 0, sizeof(*c));
        return;
    }
    claims_of(&r, c);
    if (!g->confs)
        vg_pol_settings(&g->pol, i, r.share, r.priority, r.policy, r.floor);
}

static void take_on(struct vg_bgpu *g, int i, uint64_t key, uint64_t now)
{
    vg_pol_take_on(&g->pol, i, now);
    vg_record_take_on(g->rec, now, i);
    g->sl[i].key = key;
    read_req(g, i); /* standalone: the slice's own settings */
    struct vgpu_sched_entry *e = &g->s->entries[i];
    /* Settings before the key: a slice that finds its entry reads them at once. */
    publish_settings(g, i);
    atomic_store(&e->registered_ns, now);
    atomic_store(&e->used_ns, 0);
    atomic_store(&e->holds, 0);
    atomic_store(&e->key, key);
    wake_slice(g, i); /* waiting for its entry (await_entry) */
}

static void drop(struct vg_bgpu *g, int i, uint64_t now)
{
    struct bslice *b = &g->sl[i];
    struct vg_pol_decision d;
    vg_pol_drop(&g->pol, i, now, &d);
    vg_record_drop(g->rec, now, i);
    apply(g, &d, now);
    if (b->fd >= 0)
        close(b->fd);
    if (b->wmap)
        munmap((void *)b->wmap, sizeof(*b->wmap));
    b->fd = -1;
    b->wmap = NULL;
    b->key = 0;
    atomic_store(&g->s->entries[i].key, 0);
}

static int slot_of(const struct vg_bgpu *g, uint64_t key)
{
    for (unsigned i = 0; i < VGPU_SCHED_ENTRIES; i++)
        if (g->sl[i].key == key)
            return (int)i;
    return -1;
}

/* Whether a name in the directory is one of this GPU's slice files (<uuid>.<key>.req or
 * .conf; vgpud's temporary files start with a dot). */
static int names_ours(const struct vg_bgpu *g, const char *n)
{
    size_t ulen = strlen(g->uuid);
    return strncmp(n, g->uuid, ulen) == 0 && n[ulen] == '.';
}

/* Find .req files beside the GPU file (and their .conf when vgpud runs us); returns how
 * many slices it took on. */
static int rescan(struct vg_bgpu *g, uint64_t now)
{
    int taken = 0;
    g->last_scan = g->last_full = now;
    DIR *d = opendir(g->dir);
    if (!d)
        return 0;
    for (unsigned i = 0; i < VGPU_SCHED_ENTRIES; i++)
        g->sl[i].seen = 0;
    size_t ulen = strlen(g->uuid);
    struct dirent *de;
    char path[600];
    while ((de = readdir(d)) != NULL) {
        const char *n = de->d_name;
        size_t len = strlen(n);
        /* <uuid>.<16 hex>.req */
        if (len != ulen + 1 + 16 + 4 || !names_ours(g, n) || strcmp(n + len - 4, ".req") != 0)
            continue;
        char hex[17];
        memcpy(hex, n + ulen + 1, 16);
        hex[16] = 0;
        char *endp;
        uint64_t key = strtoull(hex, &endp, 16);
        if (*endp || !key)
            continue;
        int i = slot_of(g, key);
        int fresh = i < 0;
        if (fresh) {
            for (unsigned j = 0; j < VGPU_SCHED_ENTRIES && i < 0; j++)
                if (!g->sl[j].key)
                    i = (int)j;
            if (i < 0)
                continue; /* full: the slice waits (and says so) until one leaves */
        }
        struct bslice *b = &g->sl[i];
        if (g->confs) {
            snprintf(path, sizeof(path), "%s/%.*s.%s.conf", g->dir, (int)ulen, g->uuid, hex);
            if (read_conf(g, i, path, fresh) != 0) {
                if (!fresh)
                    drop(g, i, now);
                continue; /* vgpud has not (or no longer) set it up */
            }
        }
        if (fresh) {
            snprintf(path, sizeof(path), "%s/%s", g->dir, n);
            /* Writable: the broker writes the slice's wake word (a tenant's own file: what
             * it does to it can only cost its own slice). O_NOATIME: it is read at every wait
             * (a hundred times a second), and each read would otherwise ask whether its
             * access time is due (6 % of a busy broker's CPU); only the file's owner or
             * CAP_FOWNER may (vgpud's root broker may; a standalone one opens it plainly). */
            int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOATIME);
            if (fd < 0 && errno == EPERM)
                fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
            struct stat sb;
            if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
                if (fd >= 0)
                    close(fd);
                continue;
            }
            struct vgpu_sched_req r;
            struct vg_pol_claims c;
            if (!g->confs) {
                int whole = pread(fd, &r, sizeof(r), 0) == (ssize_t)sizeof(r);
                if (whole)
                    claims_of(&r, &c);
                if (!whole || vg_pol_left_behind(&c, now)) {
                    close(fd); /* standalone: a file a process left behind long ago */
                    continue;
                }
            }
            b->fd = fd;
            b->mem = NULL;
            void *w = mmap(NULL, sizeof(struct vgpu_sched_req), PROT_READ, MAP_SHARED, fd, 0);
            b->wmap = w == MAP_FAILED ? NULL : w;
            /* Go on from its word as it is: a waiter that read it must see it change. */
            if (pread(fd, &b->wake_seq, sizeof(b->wake_seq), offsetof(struct vgpu_sched_req, wake)) !=
                sizeof(b->wake_seq))
                b->wake_seq = 0;
            take_on(g, i, key, now);
            taken++;
        }
        b->seen = 1;
    }
    closedir(d);
    for (unsigned i = 0; i < VGPU_SCHED_ENTRIES; i++) {
        struct bslice *b = &g->sl[i];
        if (b->key && (!b->seen || (!g->confs && vg_pol_stale(&g->pol, (int)i, now))))
            drop(g, (int)i, now);
    }
    return taken;
}

/* Stop watching the directory: the broker polls it from then on. */
static void unwatch(struct vg_bgpu *g)
{
    if (g->watch >= 0)
        close(g->watch);
    g->watch = -1;
}

/* Empty the watch's queue: 1 when a slice file of this GPU was made, renamed or deleted,
 * or what happened is not known (a full queue); 0 when nothing of ours. When the
 * directory itself went (deleted, moved, unmounted) the watch is given up: the broker
 * polls it from then on, as a standalone one does. */
static int dir_changed(struct vg_bgpu *g)
{
    int ours = 0;
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    for (;;) {
        ssize_t n = read(g->watch, buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return ours;
        if (n <= 0) {
            unwatch(g);
            return 1;
        }
        for (char *p = buf; p < buf + n;) {
            const struct inotify_event *e = (const struct inotify_event *)p;
            p += sizeof(*e) + e->len;
            if (e->mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED | IN_UNMOUNT)) {
                unwatch(g);
                return 1;
            }
            if ((e->mask & IN_Q_OVERFLOW) || (e->len && names_ours(g, e->name)))
                ours = 1;
        }
    }
}

/* Look at the directory: scan it when one of our slice files came, went or was replaced
 * since the last look, when it is not watched, and at least every RESCAN_FULL_NS. The
 * events are read before the scan: whatever happens during it makes the next look scan.
 * Returns how many slices it took on. */
static int look(struct vg_bgpu *g, uint64_t now)
{
    g->last_scan = now;
    if (g->watch < 0 || dir_changed(g) || now - g->last_full >= RESCAN_FULL_NS)
        return rescan(g, now);
    return 0;
}

/* ---- one step ---- */

static uint64_t sig_of(const struct vg_pol_claims *r)
{
    return ((uint64_t)r->want << 48) ^ ((uint64_t)r->release_seq << 24) ^ r->drain_seq ^
           ((uint64_t)r->owner_seq << 32);
}

/* Every slice's requests for this step, each one's signature noted: as `changed` read
 * them just before (as the wait ended), else read now; a slice taken on since was read as
 * it was (take_on). A wait reads each .req as the bell is set and as it ends, and the
 * step no third time: a pread per slice is most of what an idle broker does (50 slices,
 * ~100 waits a second). */
static void read_all(struct vg_bgpu *g)
{
    for (unsigned i = 0; i < VGPU_SCHED_ENTRIES; i++) {
        if (!g->sl[i].key)
            continue;
        if (!g->fresh)
            read_req(g, (int)i);
        g->sl[i].sig = sig_of(&g->pol.sl[i].req);
    }
    g->fresh = 0;
}

/* Whether a slice may make the broker step early once more (RING_BURST, RING_REFILL_NS). */
static int ring_token(struct bslice *b, uint64_t now)
{
    if (now - b->ring_refill_ns >= RING_REFILL_NS) {
        uint64_t add = (now - b->ring_refill_ns) / RING_REFILL_NS;
        b->ring_tokens = add >= RING_BURST - b->ring_tokens ? RING_BURST : b->ring_tokens + (uint32_t)add;
        b->ring_refill_ns = add >= RING_BURST ? now : b->ring_refill_ns + add * RING_REFILL_NS;
    }
    if (!b->ring_tokens)
        return 0;
    b->ring_tokens--;
    return 1;
}

/* Whether a slice's requests changed since the last step, and its budget lets it cause a
 * step now (the others' changes are read again at the next step). */
static int changed(struct vg_bgpu *g, uint64_t now)
{
    int cause = 0;
    for (unsigned i = 0; i < VGPU_SCHED_ENTRIES; i++) {
        struct bslice *b = &g->sl[i];
        if (!b->key)
            continue;
        read_req(g, (int)i);
        if (sig_of(&g->pol.sl[i].req) != b->sig && ring_token(b, now))
            cause = 1;
    }
    g->fresh = 1;
    return cause;
}

/* Read, decide, publish; returns how long to sleep at most. */
static uint64_t step(struct vg_bgpu *g)
{
    uint64_t now = vg_broker_now();
    if (!g->priv && now - g->last_scan >= (g->rung ? RESCAN_RUNG_NS : RESCAN_NS))
        look(g, now);
    g->rung = 0;
    read_all(g);
    struct vg_pol_decision d;
    vg_record_step(g->rec, &g->pol, now);
    vg_pol_step(&g->pol, now, &d);
    vg_record_stepped(g->rec, &g->pol);
    apply(g, &d, now);
    publish(g, &d.sum, now);
    return d.sleep_ns;
}

/* A ring that changed nothing: enough of them close together, and the doorbell is not
 * listened to for a while (EMPTY_RINGS_MAX). */
static void note_empty_ring(struct vg_bgpu *g, uint64_t now)
{
    g->empty_rings = now - g->empty_ns <= EMPTY_GAP_NS ? g->empty_rings + 1 : 1;
    g->empty_ns = now;
    if (g->empty_rings >= EMPTY_RINGS_MAX) {
        g->quiet_until = now + QUIET_SPAN_NS;
        g->empty_rings = 0;
    }
}

/* Sleep until the next step is due (until) or a slice's changed requests call for one
 * sooner (RING_BURST: rings that changed nothing cause no step). */
static void await_cause(struct vg_bgpu *g, uint64_t until)
{
    int woken = 0;
    for (;;) {
        uint64_t now = vg_broker_now();
        /* Not listening: 0 tells a ringer not to try (vg_broker_ring) while it is polled. */
        int quiet = now < g->quiet_until;
        atomic_store(&g->s->doorbell, quiet ? 0 : 1);
        /* (Also a request made after the step and before the bell.) */
        if (changed(g, now) || now >= until)
            break;
        /* A ring may come from a slice the broker does not know yet (a new container's
         * first request: a high priority one preempts at once): its .req is found by a
         * scan, at most one per RESCAN_RUNG_NS however often anyone rings. */
        uint64_t scan_at = g->last_scan + RESCAN_RUNG_NS;
        if (g->rung && !g->priv && now >= scan_at) {
            g->rung = 0;
            if (look(g, now))
                break;
        }
        if (woken)
            note_empty_ring(g, now);
        woken = 0;
        uint64_t left = until - now;
        if (g->rung && !g->priv && scan_at - now < left)
            left = scan_at - now; /* a ring waits for its scan no longer than that */
        if (quiet) {
            struct timespec ts = {0, (long)(left < QUIET_NS ? left : QUIET_NS)};
            nanosleep(&ts, NULL);
            continue;
        }
        woken = futex(&g->s->doorbell, FUTEX_WAIT, 1, left) == 0;
        g->rung |= woken;
    }
    atomic_store(&g->s->doorbell, 0);
}

void vg_bgpu_run(struct vg_bgpu *g, volatile int *stop)
{
    atomic_store(&g->s->broker_pid, (uint32_t)getpid());
    /* A broker that was stopped (SIGSTOP) and replaced must not come back to it. */
    while (!*stop && atomic_load(&g->s->broker_epoch) == g->pol.epoch) {
        uint64_t sleep = step(g);
        await_cause(g, vg_broker_now() + sleep);
    }
    unwatch(g);
}

/* ---- setting up ---- */

static struct vg_bgpu *bgpu_new(struct vgpu_sched *s)
{
    struct vg_bgpu *g = calloc(1, sizeof(*g));
    if (!g)
        return NULL;
    g->s = s;
    g->watch = -1;
    /* Taken first: an older broker still running stops at its next step. */
    vg_pol_init(&g->pol, atomic_fetch_add(&s->broker_epoch, 1) + 1);
    atomic_store(&s->wake_epoch, g->pol.epoch); /* this broker wakes each slice in its .req */
    for (unsigned i = 0; i < VGPU_SCHED_ENTRIES; i++)
        g->sl[i].fd = -1;
    /* Whatever a former broker left: a fresh start (slices re-request). */
    for (unsigned i = 0; i < VGPU_SCHED_ENTRIES; i++)
        atomic_store(&s->entries[i].key, 0);
    atomic_store(&s->grant, 0);
    futex(&s->grant, FUTEX_WAKE, INT_MAX, 0);
    return g;
}

struct vg_bgpu *vg_bgpu_open(const char *path, int confs, const char **why)
{
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK); /* a lease: no wait */
    if (fd < 0) {
        *why = strerror(errno);
        return NULL;
    }
    struct stat sb;
    void *m = MAP_FAILED;
    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && (size_t)sb.st_size >= sizeof(struct vgpu_sched))
        m = mmap(NULL, sizeof(struct vgpu_sched), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED || !vg_sched_header_ok(m)) {
        if (m != MAP_FAILED)
            munmap(m, sizeof(struct vgpu_sched));
        *why = "not a vgpu scheduling region of this version";
        return NULL;
    }
    struct vg_bgpu *g = bgpu_new(m);
    if (!g) {
        munmap(m, sizeof(struct vgpu_sched));
        *why = "out of memory";
        return NULL;
    }
    const char *slash = strrchr(path, '/');
    snprintf(g->dir, sizeof(g->dir), "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    snprintf(g->uuid, sizeof(g->uuid), "%s", slash ? slash + 1 : path);
    g->confs = confs;
    g->rec = vg_record_open(g->uuid, g->pol.epoch);
    if (confs) {
        /* Watched before the first scan: nothing made in between goes unseen. Without a
         * watch (inotify's per-user limits reached) the directory is polled. */
        g->watch = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
        if (g->watch >= 0 && inotify_add_watch(g->watch, g->dir, WATCH_MASK) < 0)
            unwatch(g);
    }
    rescan(g, vg_broker_now());
    return g;
}

struct vg_bgpu *vg_bgpu_private(struct vgpu_sched *s, struct vgpu_sched_req *req, uint64_t key)
{
    struct vg_bgpu *g = bgpu_new(s);
    if (!g)
        return NULL;
    g->priv = 1;
    g->sl[0].mem = req;
    take_on(g, 0, key, vg_broker_now());
    return g;
}
