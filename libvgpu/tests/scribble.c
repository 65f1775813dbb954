/* SPDX-License-Identifier: Apache-2.0 */
/*
 * scribble.c - a hostile tenant for the compute tests (tests/e2e/test_hostile_compute.py).
 *
 *   scribble MODE SECONDS [--from NS] [--until NS] [--seed N] [--gap-us U] [--nice N]
 *
 * Run inside a vGPU container. Finds every file vgpu mounted into it (from
 * /proc/self/mountinfo: mount points under /dev/vgpu*, /run/vgpu/,
 * /usr/lib/vgpu/ and /etc/ld.so.preload), prints them, then attacks each one
 * in a loop (from CLOCK_MONOTONIC time --from, so the slice's own processes
 * can set up first) for SECONDS or until time --until, the later, with
 * U us (default 500) between rounds, by MODE:
 *
 *   lease     in the slice's .req (header kept valid, so the broker reads it):
 *             want = 1, want_ns / active_ns / release_ns / drain_ns far in the
 *             future (now + 10^15) or "now" over and over, owner/release/drain
 *             seqs random, idle_ns huge; far-future values at every offset too
 *   priority  the .req's settings share=100 priority=2 policy=1 floor=100
 *             (header valid) and the region's compute_share / priority /
 *             policy / priority_floor where writable
 *   index     random 32- and 64-bit words at every 4-byte offset, all-ones
 *             everywhere, half the rounds with the header kept valid (so the
 *             random body is parsed, not rejected)
 *   truncate  ftruncate / truncate to 0 and to odd sizes, then back to size
 *   magic     zero the magic of every file
 *   yield     in the slice's .req: offer back the hold the GPU's grant word names
 *             (its own or a neighbour's), or a random one, and ring the broker's
 *             doorbell, every round (each hold it is granted is revoked at once
 *             while others wait: its queued work must stay its own)
 *   full      create as many files as it can named like other slices' requests
 *             (<uuid>.<16 hex>.req, the neighbours' keys read from the GPU
 *             file first) beside the GPU file; rename / link / unlink /
 *             symlink over the GPU file
 *   limits    the region's memory_limit / share / priority / slice key raised
 *             (refused: read-only), every slot of the usage file zeroed and its
 *             high water cleared (the slice's own file: the limit must hold anyway)
 *   wake      FUTEX_WAKE the grant word and the doorbell in a loop (wake_mode)
 *   lock      flock, a read lock and a read lease on the GPU file and the .req,
 *             taken again whenever free (lock_mode)
 *   none      a control: find the files and probe them, write nothing
 *
 * Every mode also tries to open every file read-write and write-only (the
 * GPU's file must refuse: EROFS or EACCES), and to map it writable
 * (libvgpu.so is only probed so, never written: a writable mount would
 * otherwise wreck the host's copy). Writes go
 * through pwrite, never a mapping: a file that shrinks cannot SIGBUS us.
 * Prints one JSON object: the files, what was tried, what succeeded.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <linux/futex.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "vgpu_region.h"
#include "vgpu_sched.h"

#define MAX_FILES 64
#define FAR_NS 1000000000000000ull /* 10^15 ns: ~11.6 days */
#define SCHED_DIR "/run/vgpu/sched"
#define MAX_CREATED 20000 /* made-up request files: plenty, without filling the host's disk */

enum kind { K_GPU, K_REQ, K_REGION, K_USAGE, K_LIB, K_PRELOAD, K_OTHER };
static const char *kind_name[] = {"gpu", "req", "region", "usage", "lib", "preload", "other"};

struct file {
    char path[512];
    enum kind kind;
    int mount_ro;       /* the mount says "ro" */
    long long size0;    /* size when found */
    int open_rw, open_wo, map_rw; /* 0 = succeeded, else the errno */
    int fd;             /* read-write fd (-1: none) */
    long long writes, writes_ok, truncs, truncs_ok;
    int write_errno, trunc_errno;
};

static struct file g_files[MAX_FILES];
static int g_nfiles;
static uint64_t g_rng = 0x9E3779B97F4A7C15ull;

static uint64_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static const char *errname(int e)
{
    switch (e) {
    case 0: return "ok";
    case EROFS: return "EROFS";
    case EACCES: return "EACCES";
    case EPERM: return "EPERM";
    case EBUSY: return "EBUSY";
    case EXDEV: return "EXDEV";
    case ENOENT: return "ENOENT";
    case EEXIST: return "EEXIST";
    case EINVAL: return "EINVAL";
    case ENOSPC: return "ENOSPC";
    case EISDIR: return "EISDIR";
    case ENOTDIR: return "ENOTDIR";
    case EMFILE: return "EMFILE";
    case ENFILE: return "ENFILE";
    case EDQUOT: return "EDQUOT";
    case ETXTBSY: return "ETXTBSY";
    case ENODEV: return "ENODEV";
    default: {
        static char buf[8][24];
        static int k;
        char *b = buf[k++ & 7];
        snprintf(b, 24, "errno%d", e);
        return b;
    }
    }
}

/* Unescape mountinfo's octal escapes (\040 for a space) in place. */
static void unescape(char *s)
{
    char *w = s;
    for (char *r = s; *r; r++) {
        if (r[0] == '\\' && r[1] >= '0' && r[1] <= '7' && r[2] && r[3]) {
            *w++ = (char)(((r[1] - '0') << 6) | ((r[2] - '0') << 3) | (r[3] - '0'));
            r += 3;
        } else {
            *w++ = *r;
        }
    }
    *w = 0;
}

static int ours(const char *p)
{
    return !strncmp(p, "/dev/vgpu", 9) || !strncmp(p, "/run/vgpu/", 10) || !strncmp(p, "/usr/lib/vgpu/", 14) ||
           !strcmp(p, "/etc/ld.so.preload");
}

static enum kind kind_of(const char *p)
{
    size_t n = strlen(p);
    if (!strncmp(p, "/dev/vgpu", 9))
        return n > 6 && !strcmp(p + n - 6, ".usage") ? K_USAGE : K_REGION;
    if (!strncmp(p, SCHED_DIR "/", sizeof(SCHED_DIR)))
        return n > 4 && !strcmp(p + n - 4, ".req") ? K_REQ : K_GPU;
    if (!strncmp(p, "/usr/lib/vgpu/", 14))
        return K_LIB;
    if (!strcmp(p, "/etc/ld.so.preload"))
        return K_PRELOAD;
    return K_OTHER;
}

static void find_files(void)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (!f) {
        perror("scribble: /proc/self/mountinfo");
        exit(2);
    }
    char line[4096];
    while (fgets(line, sizeof(line), f) && g_nfiles < MAX_FILES) {
        /* id parent maj:min root mountpoint options ... */
        char *save = NULL, *tok = strtok_r(line, " ", &save);
        char *field[6] = {0};
        for (int i = 0; i < 6 && tok; i++, tok = strtok_r(NULL, " ", &save))
            field[i] = tok;
        if (!field[5])
            continue;
        unescape(field[4]);
        if (!ours(field[4]))
            continue;
        struct stat sb;
        if (stat(field[4], &sb) != 0 || S_ISDIR(sb.st_mode))
            continue;
        int dup = 0;
        for (int i = 0; i < g_nfiles; i++)
            dup |= !strcmp(g_files[i].path, field[4]);
        if (dup)
            continue;
        struct file *x = &g_files[g_nfiles++];
        snprintf(x->path, sizeof(x->path), "%s", field[4]);
        x->kind = kind_of(x->path);
        x->mount_ro = !strncmp(field[5], "ro", 2) && (field[5][2] == ',' || !field[5][2]);
        x->size0 = (long long)sb.st_size;
        x->fd = -1;
    }
    fclose(f);
}

static void open_all(void)
{
    for (int i = 0; i < g_nfiles; i++) {
        struct file *x = &g_files[i];
        int fd = open(x->path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
        x->open_rw = fd < 0 ? errno : 0;
        x->fd = fd;
        int wo = open(x->path, O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
        x->open_wo = wo < 0 ? errno : 0;
        if (wo >= 0)
            close(wo);
        /* A writable shared mapping of a read-only fd is refused (EACCES). */
        int ro = open(x->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        x->map_rw = EBADF;
        if (ro >= 0) {
            size_t len = x->size0 > 0 ? (size_t)x->size0 : 4096;
            void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, ro, 0);
            x->map_rw = m == MAP_FAILED ? errno : 0;
            if (m != MAP_FAILED)
                munmap(m, len); /* never written through: a shrinking file cannot fault us */
            close(ro);
        }
    }
}

/* One pwrite; counted. */
static void put(struct file *x, const void *buf, size_t len, off_t off)
{
    x->writes++;
    int fd = x->fd;
    int tmp = -1;
    if (fd < 0) {
        /* Not writable at open: try again each time (a remount would change that). */
        tmp = fd = open(x->path, O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0) {
            x->write_errno = errno;
            return;
        }
    }
    ssize_t n = pwrite(fd, buf, len, off);
    if (n == (ssize_t)len)
        x->writes_ok++;
    else
        x->write_errno = n < 0 ? errno : EIO;
    if (tmp >= 0)
        close(tmp);
}

static void put32(struct file *x, off_t off, uint32_t v) { put(x, &v, sizeof(v), off); }
static void put64(struct file *x, off_t off, uint64_t v) { put(x, &v, sizeof(v), off); }

static long long size_for(const struct file *x)
{
    if (x->kind == K_GPU)
        return sizeof(struct vgpu_sched);
    if (x->kind == K_REQ)
        return sizeof(struct vgpu_sched_req);
    if (x->kind == K_REGION)
        return sizeof(struct vgpu_region);
    if (x->kind == K_USAGE)
        return sizeof(struct vgpu_usage);
    return x->size0 > 0 ? x->size0 : 64;
}

/* Valid request header, so the broker parses the rest. */
static uint64_t g_key; /* our slice's key, from the .req's name */

static void req_header(struct file *x)
{
    struct {
        uint32_t magic, version, size, pad;
        uint64_t key;
    } h = {VGPU_SCHED_REQ_MAGIC, VGPU_SCHED_VERSION, sizeof(struct vgpu_sched_req), 0, g_key};
    put(x, &h, sizeof(h), 0);
}

static void sweep(struct file *x, int how)
{
    long long n = size_for(x);
    uint64_t far = now_ns() + FAR_NS;
    for (long long off = 0; off + 4 <= n; off += 4) {
        switch (how) {
        case 0: put32(x, off, (uint32_t)rnd()); break;
        case 1: if (off + 8 <= n) put64(x, off, rnd()); break;
        case 2: put32(x, off, 0xFFFFFFFFu); break;
        case 3: if (off + 8 <= n) put64(x, off, far); break;
        }
    }
}

#define REQ_OFF(f) ((off_t)offsetof(struct vgpu_sched_req, f))
#define REG_OFF(f) ((off_t)offsetof(struct vgpu_region, f))
#define GPU_OFF(f) ((off_t)offsetof(struct vgpu_sched, f))
#define USE_OFF(f) ((off_t)offsetof(struct vgpu_usage, f))

static void lease(struct file *x, unsigned round)
{
    uint64_t now = now_ns();
    uint64_t t = (round & 1) ? now : now + FAR_NS;
    if (x->kind == K_REQ) {
        if (round % 8 == 7) {
            sweep(x, 3); /* far future at every offset */
            return;
        }
        req_header(x);
        put32(x, REQ_OFF(want), (round & 2) ? 1 : 0xFFFFFu);
        put64(x, REQ_OFF(want_ns), t);
        put64(x, REQ_OFF(active_ns), t);
        put64(x, REQ_OFF(release_ns), t);
        put64(x, REQ_OFF(drain_ns), t);
        put64(x, REQ_OFF(idle_ns), (round & 4) ? ~0ull : FAR_NS);
        put32(x, REQ_OFF(owner_seq), (uint32_t)rnd());
        put32(x, REQ_OFF(release_seq), (uint32_t)rnd());
        put32(x, REQ_OFF(drain_seq), (uint32_t)rnd());
        put32(x, REQ_OFF(owner), (uint32_t)rnd());
    } else if (x->kind == K_GPU) {
        /* The grant word to our entry, a far-future grant and beat: must be refused. */
        put32(x, GPU_OFF(grant), (uint32_t)((rnd() & 0xFFFFFF) << 8) | 1u);
        put64(x, GPU_OFF(grant_ns), now + FAR_NS);
        put64(x, GPU_OFF(broker_beat_ns), now + FAR_NS);
    } else if (x->kind == K_REGION) {
        sweep(x, 3);
    }
}

static void priority(struct file *x, unsigned round)
{
    (void)round;
    if (x->kind == K_REQ) {
        req_header(x);
        put32(x, REQ_OFF(share), 100);
        put32(x, REQ_OFF(priority), VGPU_PRIORITY_HIGH);
        put32(x, REQ_OFF(policy), VGPU_POLICY_BURST);
        put32(x, REQ_OFF(floor), 100);
        put32(x, REQ_OFF(want), 1);
        put64(x, REQ_OFF(want_ns), now_ns());
        put64(x, REQ_OFF(active_ns), now_ns());
    } else if (x->kind == K_REGION) {
        put32(x, REG_OFF(compute_share), 100);
        put32(x, REG_OFF(priority), VGPU_PRIORITY_HIGH);
        put32(x, REG_OFF(policy), VGPU_POLICY_BURST);
        put32(x, REG_OFF(priority_floor), 100);
    } else if (x->kind == K_GPU) {
        /* Every entry high priority, share 100, floor 100; the present/active counts. */
        for (unsigned i = 0; i < VGPU_SCHED_ENTRIES; i++) {
            off_t e = GPU_OFF(entries) + (off_t)(i * sizeof(struct vgpu_sched_entry));
            put32(x, e + (off_t)offsetof(struct vgpu_sched_entry, priority), VGPU_PRIORITY_HIGH);
            put32(x, e + (off_t)offsetof(struct vgpu_sched_entry, share), 100);
            if (i > 2)
                break; /* refused anyway: a few are enough to count */
        }
        put32(x, GPU_OFF(active_mask), 1u << VGPU_PRIORITY_HIGH);
        put32(x, GPU_OFF(present) + 2 * 4, 100);
    }
}

static void index_mode(struct file *x, unsigned round)
{
    int how = (int)(round % 3); /* random 32, random 64, all-ones */
    sweep(x, how);
    if (x->kind == K_REQ && (round & 1))
        req_header(x); /* a random body the broker parses */
    if (x->kind == K_GPU) {
        put32(x, GPU_OFF(grant), (uint32_t)rnd());
        for (unsigned i = 0; i < 4; i++) {
            off_t e = GPU_OFF(entries) + (off_t)(i * sizeof(struct vgpu_sched_entry));
            put32(x, e + (off_t)offsetof(struct vgpu_sched_entry, priority), (uint32_t)rnd());
            put64(x, e + (off_t)offsetof(struct vgpu_sched_entry, key), rnd());
        }
    }
}

/* Mode limits: raise the slice's own limits and hide what it uses. */
static void limits_mode(struct file *x, unsigned round)
{
    if (x->kind == K_REGION) {
        put64(x, REG_OFF(memory_limit), ~0ull);
        put32(x, REG_OFF(compute_share), 100);
        put32(x, REG_OFF(priority), VGPU_PRIORITY_HIGH);
        put64(x, REG_OFF(slice_key), rnd() | 1);
    } else if (x->kind == K_USAGE) {
        /* Every slot's usage zeroed, and half the rounds the table hidden too. */
        for (unsigned i = 0; i < VGPU_REGION_SLOTS; i++) {
            off_t slot = USE_OFF(slots) + (off_t)(i * sizeof(struct vg_slot));
            uint64_t used = 0;
            if (pread(x->fd, &used, sizeof(used), slot + (off_t)offsetof(struct vg_slot, used)) == sizeof(used) &&
                used)
                put64(x, slot + (off_t)offsetof(struct vg_slot, used), 0);
        }
        if (round & 1)
            put32(x, USE_OFF(slot_high_water), 0);
    }
}

/* Mode lock: hold every lock a read-only fd allows on the GPU file and the .req,
 * taken again each round once free (a broker that restarts must not find them in
 * its way): flock (shared and exclusive), an open-file-description read lock on
 * the whole file, and a read lease (the owner's right: container root owns what
 * root made). Counted per kind, printed in the summary. */
static int g_lock_fd[MAX_FILES];
static long long g_flocks, g_rdlocks, g_leases;

static void lock_mode(struct file *x, unsigned round)
{
    (void)round;
    if (x->kind != K_GPU && x->kind != K_REQ)
        return;
    int i = (int)(x - g_files);
    if (g_lock_fd[i] <= 0) {
        g_lock_fd[i] = open(x->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
        if (g_lock_fd[i] < 0)
            return;
    }
    int fd = g_lock_fd[i];
    if (flock(fd, LOCK_EX | LOCK_NB) == 0)
        g_flocks++;
    struct flock fl = {.l_type = F_RDLCK, .l_whence = SEEK_SET};
    if (fcntl(fd, F_OFD_SETLK, &fl) == 0)
        g_rdlocks++;
    if (fcntl(fd, F_GETLEASE) != F_RDLCK && fcntl(fd, F_SETLEASE, F_RDLCK) == 0)
        g_leases++;
}

/* Mode none (a control): find and probe the files, write nothing. */
static void probe_only(struct file *x, unsigned round)
{
    (void)x;
    (void)round;
}

static void trunc_one(struct file *x, long long len, int by_path)
{
    x->truncs++;
    int rc;
    if (by_path || x->fd < 0)
        rc = truncate(x->path, (off_t)len);
    else
        rc = ftruncate(x->fd, (off_t)len);
    if (rc == 0)
        x->truncs_ok++;
    else
        x->trunc_errno = errno;
}

static void truncate_mode(struct file *x, unsigned round)
{
    long long n = size_for(x);
    long long sizes[] = {0, 1, 3, 7, 13, 255, n - 1, n / 2 + 1, 4097, n + 4096 * 3 + 5, 0};
    for (unsigned i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        trunc_one(x, sizes[i] < 0 ? 0 : sizes[i], (int)((i + round) & 1));
    if (round & 1) /* half the time it stays short until the next round */
        trunc_one(x, x->size0, 0);
}

/* The GPU's file, mapped read-only (what every container may do): its grant word is
 * readable and its doorbell can be rung (a futex wake only reads). */
static const struct vgpu_sched *gpu_map(void)
{
    static const struct vgpu_sched *m;
    static int tried;
    for (int i = 0; i < g_nfiles && !tried; i++) {
        if (g_files[i].kind != K_GPU)
            continue;
        tried = 1;
        int fd = open(g_files[i].path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            break;
        void *p = mmap(NULL, sizeof(struct vgpu_sched), PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
        m = p == MAP_FAILED ? NULL : p;
    }
    return m;
}

static void yield_mode(struct file *x, unsigned round)
{
    const struct vgpu_sched *m = gpu_map();
    if (x->kind != K_REQ || !m)
        return;
    uint32_t g = atomic_load(&m->grant);
    put32(x, REQ_OFF(yield_seq), round % 4 == 3 ? (uint32_t)rnd() : g >> 8);
    syscall(SYS_futex, &m->doorbell, FUTEX_WAKE, 1, NULL, NULL, 0);
}

/* Mode wake: FUTEX_WAKE every waiter of the GPU file's grant word and the broker's
 * doorbell, 64 times a round (a wake needs only the read-only mapping). */
static void wake_mode(struct file *x, unsigned round)
{
    (void)round;
    const struct vgpu_sched *m = gpu_map();
    if (x->kind != K_GPU || !m)
        return;
    for (int i = 0; i < 64; i++) {
        syscall(SYS_futex, &m->grant, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
        syscall(SYS_futex, &m->doorbell, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
    }
}

static void magic_mode(struct file *x, unsigned round)
{
    (void)round;
    put32(x, 0, 0);
}

/* Keys of the slices the GPU file lists (read through pread: it may shrink). */
static int other_keys(uint64_t *keys, int max)
{
    int n = 0;
    for (int i = 0; i < g_nfiles && n < max; i++) {
        if (g_files[i].kind != K_GPU)
            continue;
        int fd = open(g_files[i].path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        for (unsigned e = 0; e < VGPU_SCHED_ENTRIES && n < max; e++) {
            uint64_t k = 0;
            off_t off = GPU_OFF(entries) + (off_t)(e * sizeof(struct vgpu_sched_entry));
            if (pread(fd, &k, sizeof(k), off) == (ssize_t)sizeof(k) && k && k != g_key)
                keys[n++] = k;
        }
        close(fd);
    }
    return n;
}

struct full_stats {
    long long created, create_fail;
    int create_errno;
    int rename_over, link_from, unlink_gpu, symlink_over, rename_gpu_away, mknod_over;
};

static void full_mode(struct full_stats *st, unsigned round)
{
    const char *gpu = NULL;
    for (int i = 0; i < g_nfiles; i++)
        if (g_files[i].kind == K_GPU)
            gpu = g_files[i].path;
    if (!gpu)
        return;
    const char *uuid = strrchr(gpu, '/') + 1;
    uint64_t keys[VGPU_SCHED_ENTRIES];
    int nk = round == 0 ? other_keys(keys, VGPU_SCHED_ENTRIES) : 0;
    char path[640], tmp[640];
    /* The neighbours' own names first (on the first round), then made-up keys. */
    for (int i = 0; i < 64 && st->created < MAX_CREATED; i++) {
        uint64_t key = i < nk ? keys[i] : rnd();
        snprintf(path, sizeof(path), SCHED_DIR "/%s.%016llx.req", uuid, (unsigned long long)key);
        int fd = open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0666);
        if (fd < 0) {
            st->create_fail++;
            st->create_errno = errno;
            continue;
        }
        struct vgpu_sched_req r;
        memset(&r, 0, sizeof(r));
        r.magic = VGPU_SCHED_REQ_MAGIC;
        r.version = VGPU_SCHED_VERSION;
        r.size = sizeof(r);
        r.key = key;
        r.share = 100;
        r.priority = VGPU_PRIORITY_HIGH;
        r.policy = VGPU_POLICY_BURST;
        r.floor = 100;
        r.want = 1;
        r.want_ns = now_ns();
        r.active_ns = now_ns() + FAR_NS;
        if (write(fd, &r, sizeof(r)) == (ssize_t)sizeof(r))
            st->created++;
        close(fd);
    }
    /* Over the GPU file: rename, link, unlink, symlink, mknod. */
    snprintf(tmp, sizeof(tmp), SCHED_DIR "/.scribble-%u", round);
    int fd = open(tmp, O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0666);
    if (fd >= 0) {
        char junk[sizeof(struct vgpu_sched)];
        memset(junk, 0xFF, sizeof(junk));
        ssize_t w = write(fd, junk, sizeof(junk));
        (void)w;
        close(fd);
    }
    st->rename_over = rename(tmp, gpu) == 0 ? 0 : errno;
    unlink(tmp);
    snprintf(tmp, sizeof(tmp), SCHED_DIR "/.scribble-link-%u", round);
    st->link_from = link(gpu, tmp) == 0 ? 0 : errno;
    unlink(tmp);
    st->rename_gpu_away = rename(gpu, tmp) == 0 ? 0 : errno;
    st->unlink_gpu = unlink(gpu) == 0 ? 0 : errno;
    st->symlink_over = symlink("/dev/zero", gpu) == 0 ? 0 : errno;
    st->mknod_over = mknod(gpu, S_IFREG | 0666, 0) == 0 ? 0 : errno;
}

static void print_summary(const char *mode, double seconds, unsigned rounds, const struct full_stats *st)
{
    printf("{\"mode\":\"%s\",\"seconds\":%.3f,\"rounds\":%u,\"files\":[", mode, seconds, rounds);
    for (int i = 0; i < g_nfiles; i++) {
        const struct file *x = &g_files[i];
        printf("%s{\"path\":\"%s\",\"kind\":\"%s\",\"mount_ro\":%s,\"size\":%lld,"
               "\"open_rw\":\"%s\",\"open_wo\":\"%s\",\"map_rw\":\"%s\","
               "\"writes\":%lld,\"writes_ok\":%lld,\"write_errno\":\"%s\","
               "\"truncates\":%lld,\"truncates_ok\":%lld,\"truncate_errno\":\"%s\"}",
               i ? "," : "", x->path, kind_name[x->kind], x->mount_ro ? "true" : "false", x->size0,
               errname(x->open_rw), errname(x->open_wo), errname(x->map_rw), x->writes, x->writes_ok,
               errname(x->write_errno), x->truncs, x->truncs_ok, errname(x->trunc_errno));
    }
    printf("]");
    if (!strcmp(mode, "full"))
        printf(",\"full\":{\"created\":%lld,\"create_failed\":%lld,\"create_errno\":\"%s\","
               "\"rename_over_gpu\":\"%s\",\"link_gpu\":\"%s\",\"rename_gpu_away\":\"%s\","
               "\"unlink_gpu\":\"%s\",\"symlink_over_gpu\":\"%s\",\"mknod_over_gpu\":\"%s\"}",
               st->created, st->create_fail, errname(st->create_errno), errname(st->rename_over),
               errname(st->link_from), errname(st->rename_gpu_away), errname(st->unlink_gpu),
               errname(st->symlink_over), errname(st->mknod_over));
    if (!strcmp(mode, "lock"))
        printf(",\"lock\":{\"flocks\":%lld,\"read_locks\":%lld,\"leases\":%lld}", g_flocks,
               g_rdlocks, g_leases);
    printf("}\n");
    fflush(stdout);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: scribble lease|priority|index|truncate|magic|yield|full|limits|lock|wake|none SECONDS [--from NS] "
                        "[--until NS] [--seed N] [--gap-us U] [--nice N]\n");
        return 2;
    }
    const char *mode = argv[1];
    double seconds = atof(argv[2]);
    unsigned gap_us = 500;
    uint64_t until_at = 0, from_at = 0;
    for (int i = 3; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--seed"))
            g_rng ^= strtoull(argv[i + 1], NULL, 0) * 0xBF58476D1CE4E5B9ull;
        else if (!strcmp(argv[i], "--from"))
            from_at = strtoull(argv[i + 1], NULL, 0);
        else if (!strcmp(argv[i], "--until"))
            until_at = strtoull(argv[i + 1], NULL, 0);
        else if (!strcmp(argv[i], "--gap-us"))
            gap_us = (unsigned)strtoul(argv[i + 1], NULL, 0);
        else if (!strcmp(argv[i], "--nice") && setpriority(PRIO_PROCESS, 0, atoi(argv[i + 1])) != 0)
            perror("scribble: setpriority");
    }
    if (!g_rng)
        g_rng = 1;
    void (*attack)(struct file *, unsigned) = NULL;
    if (!strcmp(mode, "lease"))
        attack = lease;
    else if (!strcmp(mode, "priority"))
        attack = priority;
    else if (!strcmp(mode, "index"))
        attack = index_mode;
    else if (!strcmp(mode, "truncate"))
        attack = truncate_mode;
    else if (!strcmp(mode, "magic"))
        attack = magic_mode;
    else if (!strcmp(mode, "yield"))
        attack = yield_mode;
    else if (!strcmp(mode, "none"))
        attack = probe_only;
    else if (!strcmp(mode, "limits"))
        attack = limits_mode;
    else if (!strcmp(mode, "lock"))
        attack = lock_mode;
    else if (!strcmp(mode, "wake"))
        attack = wake_mode;
    else if (strcmp(mode, "full") != 0) {
        fprintf(stderr, "scribble: unknown mode %s\n", mode);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    signal(SIGXFSZ, SIG_IGN); /* a size limit answers EFBIG instead */
    find_files();
    for (int i = 0; i < g_nfiles; i++) {
        const char *p = g_files[i].path;
        size_t n = strlen(p);
        if (g_files[i].kind == K_REQ && n > 21) {
            char hex[17];
            memcpy(hex, p + n - 20, 16);
            hex[16] = 0;
            g_key = strtoull(hex, NULL, 16);
        }
        fprintf(stderr, "scribble: found %s (%s, %s, %lld bytes)\n", p, kind_name[g_files[i].kind],
                g_files[i].mount_ro ? "ro" : "rw", g_files[i].size0);
    }
    open_all();
    while (now_ns() < from_at) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    struct full_stats st;
    memset(&st, 0, sizeof(st));
    uint64_t t0 = now_ns(), until = t0 + (uint64_t)(seconds * 1e9);
    if (until_at > until)
        until = until_at;
    unsigned rounds = 0;
    struct timespec gap = {0, (long)gap_us * 1000L};
    while (now_ns() < until) {
        if (attack) {
            /* libvgpu.so itself is only probed (open for writing above): were its
             * mount ever writable, writing would wreck the host's copy. */
            for (int i = 0; i < g_nfiles; i++)
                if (g_files[i].kind != K_LIB)
                    attack(&g_files[i], rounds);
        } else {
            full_mode(&st, rounds);
            /* The made-up requests stay; every file's header is zeroed too. */
            for (int i = 0; i < g_nfiles; i++)
                if (g_files[i].kind == K_REQ || g_files[i].kind == K_GPU)
                    put32(&g_files[i], 0, (uint32_t)rnd());
        }
        rounds++;
        if (gap_us)
            nanosleep(&gap, NULL);
    }
    print_summary(mode, (double)(now_ns() - t0) / 1e9, rounds, &st);
    return 0;
}
