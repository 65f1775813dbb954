/* SPDX-License-Identifier: Apache-2.0 */
/* state.c - simgpu's shared state file: creation, memory accounting, engine timeline. */
#include "simgpu_state.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../common/vg_quantity.h"

/* The process's mapping, made once (g_once) and kept for its life. */
static struct simgpu_state *g_state;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
/* Slot index of this process per device, -1 = none yet; g_slot_pid detects fork. */
static int g_slot[SIMGPU_MAX_DEVICES];
static pid_t g_slot_pid;
static pthread_mutex_t g_slot_lock = PTHREAD_MUTEX_INITIALIZER;

uint64_t simgpu_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#define SYNC_SPIN_NS 100000ull
#define WAKE_MAX_US 1000000ul /* SIMGPU_WAKE_US's largest MAX: 1 s */

/* SIMGPU_WAKE_US (this process's): parsed once; min/max in ns, wake_bad when refused. */
static pthread_once_t g_wake_once = PTHREAD_ONCE_INIT;
static uint64_t g_wake_min, g_wake_max;
static int g_wake_set, g_wake_bad;
/* SIMGPU_WAKE_SEED: the draws repeat from run to run (tests, benchmarks); threads are
 * numbered in the order they first sync. */
static int g_seeded;
static uint64_t g_seed;
static _Atomic uint64_t g_threads;

static int parse_us(const char *s, const char **end, unsigned long *out)
{
    if (*s < '0' || *s > '9')
        return -1;
    errno = 0;
    char *e;
    *out = strtoul(s, &e, 10);
    *end = e;
    return errno ? -1 : 0;
}

static void wake_init(void)
{
    const char *v = getenv("SIMGPU_WAKE_US");
    if (!v || !*v)
        return;
    unsigned long lo, hi;
    const char *e;
    if (parse_us(v, &e, &lo) != 0) {
        g_wake_bad = 1;
    } else if (*e == '\0') {
        hi = lo; /* one number: a fixed latency */
    } else if (*e != '-' || parse_us(e + 1, &e, &hi) != 0 || *e != '\0') {
        g_wake_bad = 1;
    }
    if (g_wake_bad) {
        fprintf(stderr, "simgpu: SIMGPU_WAKE_US=\"%s\": not MIN-MAX in whole microseconds (e.g. 20-200)\n", v);
        return;
    }
    if (lo > hi || hi > WAKE_MAX_US) {
        fprintf(stderr, "simgpu: SIMGPU_WAKE_US=\"%s\": %s\n", v,
                lo > hi ? "MIN is above MAX" : "MAX is above 1000000 (1 s)");
        g_wake_bad = 1;
        return;
    }
    g_wake_min = lo * 1000ull;
    g_wake_max = hi * 1000ull;
    g_wake_set = 1;
    const char *seed = getenv("SIMGPU_WAKE_SEED");
    if (seed && *seed) {
        g_seed = strtoull(seed, NULL, 0);
        g_seeded = 1;
    }
}

int simgpu_wake_check(void)
{
    pthread_once(&g_wake_once, wake_init);
    return g_wake_bad ? -1 : 0;
}

/* A per-thread xorshift64*: wake-up latencies need spread, not quality. Seeded from
 * SIMGPU_WAKE_SEED and the thread's number (splitmix64), else from getrandom. */
static uint64_t wake_random(void)
{
    static __thread uint64_t x;
    if (!x) {
        if (g_seeded) {
            uint64_t z = g_seed + (atomic_fetch_add(&g_threads, 1) + 1) * 0x9E3779B97F4A7C15ull;
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
            x = z ^ (z >> 31);
        } else if (getrandom(&x, sizeof(x), GRND_NONBLOCK) != (ssize_t)sizeof(x)) {
            x = simgpu_now_ns() ^ ((uint64_t)gettid() << 32);
        }
        x |= 1;
    }
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    return x * 0x2545F4914F6CDD1Dull;
}

/* When a thread that waits for work ending at t_ns resumes: a host's wake-up latency
 * after it (SIMGPU_WAKE_US). Every sync draws one, whether it waits or not, so that a
 * thread's n-th sync has the n-th draw. */
static uint64_t wake_time(uint64_t t_ns)
{
    pthread_once(&g_wake_once, wake_init);
    if (!g_wake_set)
        return t_ns;
    return t_ns + g_wake_min + wake_random() % (g_wake_max - g_wake_min + 1);
}

static void sleep_until(uint64_t t_ns)
{
    struct timespec ts = {.tv_sec = (time_t)(t_ns / 1000000000ull), .tv_nsec = (long)(t_ns % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

/* Sleep through all but the last stretch (a sleep wakes up to its 50 us timer slack
 * late), then yield until the time: how the driver's default sync waits, spinning or
 * yielding, not sleeping. */
static void yield_until(uint64_t t_ns)
{
    if (t_ns > SYNC_SPIN_NS)
        sleep_until(t_ns - SYNC_SPIN_NS);
    while (simgpu_now_ns() < t_ns)
        sched_yield();
}

void simgpu_wait_raw(uint64_t t_ns, enum simgpu_how how)
{
    if (how == SIMGPU_SLEEP)
        sleep_until(t_ns);
    else if (how == SIMGPU_YIELD)
        yield_until(t_ns);
    else
        while (simgpu_now_ns() < t_ns)
            ;
}

void simgpu_wait_for(uint64_t t_ns, uint64_t called_ns, enum simgpu_how how)
{
    uint64_t t = wake_time(t_ns);
    if (t_ns <= called_ns)
        return; /* done before the sync was called: no wake-up to wait for */
    /* A plain sleep wakes up as late as this host makes it; with SIMGPU_WAKE_US the
     * latency is the drawn one, so the wait aims at its time. */
    simgpu_wait_raw(t, how == SIMGPU_SLEEP && t != t_ns ? SIMGPU_YIELD : how);
}

/* ---- engine settings: fixed by the creator of the state file ---- */

#define SLICE_MAX_US 1000000ul
#define SWITCH_MAX_US 100000ul

/* One SIMGPU_* setting from the environment, a whole number in lo..hi: 0 unset, 1 set
 * (*out), -1 malformed (after one line that says what it should be). */
static int env_setting(const char *name, unsigned long lo, unsigned long hi, const char *what, unsigned long *out)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return 0;
    const char *e;
    if (parse_us(v, &e, out) != 0 || *e != '\0' || *out < lo || *out > hi) {
        fprintf(stderr, "simgpu: %s=\"%s\": not %s\n", name, v, what);
        return -1;
    }
    return 1;
}

struct cfg_env {
    int slice_set, switch_set, conc_set;
    unsigned long slice_us, switch_us, conc;
};

static int read_cfg_env(struct cfg_env *c)
{
    c->slice_set = env_setting("SIMGPU_TIMESLICE_US", 1, SLICE_MAX_US, "whole microseconds from 1 to 1000000",
                               &c->slice_us);
    c->switch_set = env_setting("SIMGPU_SWITCH_US", 0, SWITCH_MAX_US, "whole microseconds from 0 to 100000",
                                &c->switch_us);
    c->conc_set = env_setting("SIMGPU_CONCURRENT_STREAMS", 0, 1, "0 or 1", &c->conc);
    return c->slice_set < 0 || c->switch_set < 0 || c->conc_set < 0 ? -1 : 0;
}

static void cfg_from_env(struct simgpu_config *cfg, const struct cfg_env *c)
{
    cfg->slice_ns = c->slice_set ? c->slice_us * 1000ull : 0;
    cfg->switch_ns = c->switch_set ? c->switch_us * 1000ull : 0;
    cfg->concurrent = c->conc_set ? (uint32_t)c->conc : 0;
    cfg->timed = cfg->slice_ns || cfg->switch_ns || cfg->concurrent;
}

/* A process whose environment asks for other settings than the state file's is refused:
 * one engine, one way of running it, for every process on the simulated GPU. */
static int check_cfg(const struct simgpu_state *st, const char *path)
{
    struct cfg_env c;
    if (read_cfg_env(&c) != 0)
        return -1;
    const struct { int set; unsigned long want; uint64_t have; const char *name; } s[] = {
        {c.slice_set, c.slice_us, st->cfg.slice_ns / 1000, "SIMGPU_TIMESLICE_US"},
        {c.switch_set, c.switch_us, st->cfg.switch_ns / 1000, "SIMGPU_SWITCH_US"},
        {c.conc_set, c.conc, st->cfg.concurrent, "SIMGPU_CONCURRENT_STREAMS"},
    };
    for (unsigned i = 0; i < sizeof(s) / sizeof(s[0]); i++) {
        if (s[i].set && s[i].want != s[i].have) {
            fprintf(stderr,
                    "simgpu: %s=\"%lu\": the simulated GPU of SIMGPU_STATE=%s runs with %llu (set when it "
                    "was created; every process on it shares its engine)\n",
                    s[i].name, s[i].want, path, (unsigned long long)s[i].have);
            return -1;
        }
    }
    return 0;
}

static int init_engines(struct simgpu_state *st)
{
    pthread_mutexattr_t a;
    if (pthread_mutexattr_init(&a) != 0 || pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED) != 0 ||
        pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST) != 0)
        return -1;
    for (unsigned i = 0; i < st->ndev; i++) {
        struct simgpu_engine *E = &st->eng[i];
        if (pthread_mutex_init(&E->lock, &a) != 0)
            return -1;
        for (int k = 0; k < 2; k++) {
            E->c[k].owner = E->c[k].last = -1;
            E->c[k].t = st->created_ns;
        }
    }
    pthread_mutexattr_destroy(&a);
    return 0;
}

static const char *state_path(char *buf, size_t len)
{
    const char *p = getenv("SIMGPU_STATE");
    if (p && *p)
        return p;
    snprintf(buf, len, "/dev/shm/simgpu-%u.state", (unsigned)getuid());
    return buf;
}

static int init_devices(struct simgpu_state *st)
{
    const char *spec = getenv("SIMGPU_DEVICES");
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", spec && *spec ? spec : "16Gi");
    unsigned n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ')
            tok++;
        uint64_t bytes;
        if (n >= SIMGPU_MAX_DEVICES) {
            fprintf(stderr, "simgpu: SIMGPU_DEVICES=\"%s\": more than %u devices\n", spec, SIMGPU_MAX_DEVICES);
            return -1;
        }
        if (vg_parse_quantity(tok, &bytes) != 0) {
            fprintf(stderr, "simgpu: SIMGPU_DEVICES=\"%s\": \"%s\" is not %s\n", spec, tok, VG_QUANTITY_FORMS);
            return -1;
        }
        struct simgpu_device *d = &st->dev[n];
        d->total_bytes = bytes;
        if (getrandom(d->uuid_bytes, sizeof(d->uuid_bytes), 0) != (ssize_t)sizeof(d->uuid_bytes)) {
            for (unsigned i = 0; i < sizeof(d->uuid_bytes); i++)
                d->uuid_bytes[i] = (uint8_t)(rand() ^ (int)(i * 31 + n));
        }
        const uint8_t *u = d->uuid_bytes;
        snprintf(d->uuid, sizeof(d->uuid),
                 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2],
                 u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
        snprintf(d->name, sizeof(d->name), "NVIDIA SimGPU %lluGiB", (unsigned long long)(bytes >> 30));
        d->pci_bus = 0x10 + n;
        d->minor = n;
        n++;
    }
    if (n == 0) {
        fprintf(stderr, "simgpu: SIMGPU_DEVICES=\"%s\": no devices listed\n", spec ? spec : "");
        return -1;
    }
    st->ndev = n;
    return 0;
}

static struct simgpu_state *map_fd(int fd, const char *path)
{
    struct stat sb;
    uint32_t head[2];
    if (fstat(fd, &sb) != 0 || (size_t)sb.st_size < sizeof(struct simgpu_state)) {
        if (pread(fd, head, sizeof(head), 0) == (ssize_t)sizeof(head) && head[0] == SIMGPU_MAGIC)
            fprintf(stderr, "simgpu: SIMGPU_STATE=%s: made by another simgpu build (layout %u, this one %u): "
                    "remove it once no process uses it, or name another file\n", path, head[1], SIMGPU_VERSION);
        else
            fprintf(stderr, "simgpu: SIMGPU_STATE=%s: not a simgpu state file (size %lld)\n", path,
                    (long long)sb.st_size);
        return NULL;
    }
    void *m = mmap(NULL, sizeof(struct simgpu_state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        fprintf(stderr, "simgpu: SIMGPU_STATE=%s: mmap: %s\n", path, strerror(errno));
        return NULL;
    }
    return m;
}

static int wait_ready(struct simgpu_state *st, const char *path)
{
    /* A creator links the file only after writing magic, but be tolerant. */
    for (int i = 0; i < 1000 && atomic_load((_Atomic uint32_t *)&st->magic) != SIMGPU_MAGIC; i++)
        usleep(1000);
    if (st->magic != SIMGPU_MAGIC || st->version != SIMGPU_VERSION || st->size != sizeof(*st)) {
        fprintf(stderr, "simgpu: SIMGPU_STATE=%s: wrong magic/version/size (made by another simgpu build? "
                "remove it once no process uses it, or name another file)\n", path);
        return -1;
    }
    return 0;
}

static struct simgpu_state *open_or_create(void)
{
    char buf[256];
    const char *path = state_path(buf, sizeof(buf));
    for (int attempt = 0; attempt < 3; attempt++) {
        int fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd >= 0) {
            struct simgpu_state *st = map_fd(fd, path);
            close(fd);
            if (st && (wait_ready(st, path) != 0 || check_cfg(st, path) != 0)) {
                munmap(st, sizeof(*st));
                return NULL;
            }
            return st;
        }
        if (errno != ENOENT) {
            fprintf(stderr, "simgpu: SIMGPU_STATE=%s: %s\n", path, strerror(errno));
            return NULL;
        }
        char tmp[300];
        snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
        fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0) {
            fprintf(stderr, "simgpu: SIMGPU_STATE=%s: cannot create: %s\n", path, strerror(errno));
            return NULL;
        }
        fchmod(fd, 0666); /* shared by every user of the simulated GPU, like /dev/nvidia* */
        if (ftruncate(fd, sizeof(struct simgpu_state)) != 0) {
            fprintf(stderr, "simgpu: SIMGPU_STATE=%s: %s\n", path, strerror(errno));
            close(fd);
            unlink(tmp);
            return NULL;
        }
        struct simgpu_state *st = map_fd(fd, tmp);
        close(fd);
        struct cfg_env c;
        if (st)
            st->created_ns = simgpu_now_ns();
        if (!st || init_devices(st) != 0 || read_cfg_env(&c) != 0 || init_engines(st) != 0) {
            if (st)
                munmap(st, sizeof(*st));
            unlink(tmp);
            return NULL;
        }
        cfg_from_env(&st->cfg, &c);
        st->version = SIMGPU_VERSION;
        st->size = sizeof(*st);
        atomic_store((_Atomic uint32_t *)&st->magic, SIMGPU_MAGIC);
        int rc = link(tmp, path);
        int err = errno;
        unlink(tmp);
        if (rc == 0)
            return st;
        munmap(st, sizeof(*st));
        if (err != EEXIST) {
            fprintf(stderr, "simgpu: SIMGPU_STATE=%s: %s\n", path, strerror(err));
            return NULL;
        }
        /* Lost the race to another creator: use theirs. */
    }
    return NULL;
}

static void reset_slots(void)
{
    for (unsigned i = 0; i < SIMGPU_MAX_DEVICES; i++)
        g_slot[i] = -1;
    g_slot_pid = getpid();
}

static void init_once(void)
{
    reset_slots();
    g_state = open_or_create();
}

struct simgpu_state *simgpu_state(void)
{
    pthread_once(&g_once, init_once);
    return g_state;
}

/* This process's slot on dev, claimed on first use (and again after fork). */
static int my_slot(unsigned dev)
{
    struct simgpu_state *st = simgpu_state();
    if (!st || dev >= st->ndev)
        return -1;
    pthread_mutex_lock(&g_slot_lock);
    if (g_slot_pid != getpid())
        reset_slots();
    if (g_slot[dev] < 0) {
        struct simgpu_device *d = &st->dev[dev];
        g_slot[dev] = vg_slots_claim(d->slots, SIMGPU_SLOTS, &d->slot_high_water);
    }
    int idx = g_slot[dev];
    pthread_mutex_unlock(&g_slot_lock);
    return idx;
}

int simgpu_slot(unsigned dev)
{
    return my_slot(dev);
}

int simgpu_mem_charge(unsigned dev, uint64_t bytes)
{
    int idx = my_slot(dev);
    if (idx < 0)
        return -1;
    struct simgpu_device *d = &g_state->dev[dev];
    return vg_slots_charge(d->slots, &d->slot_high_water, idx, bytes, d->total_bytes);
}

void simgpu_mem_uncharge(unsigned dev, uint64_t bytes)
{
    int idx = my_slot(dev);
    if (idx < 0)
        return;
    vg_slots_uncharge(g_state->dev[dev].slots, idx, bytes);
}

uint64_t simgpu_mem_used(unsigned dev)
{
    struct simgpu_state *st = simgpu_state();
    if (!st || dev >= st->ndev)
        return 0;
    struct simgpu_device *d = &st->dev[dev];
    return vg_slots_used_live(d->slots, &d->slot_high_water);
}

uint64_t simgpu_engine_submit(unsigned dev, uint64_t dur_ns)
{
    struct simgpu_device *d = &simgpu_state()->dev[dev];
    uint64_t now = simgpu_now_ns();
    uint64_t tail = atomic_load(&d->tail_ns);
    uint64_t start, end;
    do {
        start = tail > now ? tail : now;
        end = start + dur_ns;
    } while (!atomic_compare_exchange_weak(&d->tail_ns, &tail, end));
    atomic_fetch_add(&d->busy_total_ns, dur_ns);
    struct simgpu_interval *iv = &d->ring[atomic_fetch_add(&d->ring_head, 1) % SIMGPU_RING];
    atomic_store(&iv->start_ns, start);
    atomic_store(&iv->end_ns, end);
    atomic_store(&iv->pid, (uint32_t)getpid());
    int idx = my_slot(dev);
    if (idx >= 0) {
        atomic_fetch_add(&d->slots[idx].busy_ns, dur_ns);
        atomic_store(&d->slots[idx].last_active_ns, end);
    }
    return end;
}
