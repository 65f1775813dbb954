/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nvml_util.c - utilisation from the device's engine timeline.
 *
 * Every kernel simgpu runs leaves an interval {start, end, pid} in the device's
 * ring (on the timed engine, one per run of it between preemptions, the one in
 * progress with its end so far). Kernels of one context's streams may overlap
 * (SIMGPU_CONCURRENT_STREAMS), so busy time is the length of the union of the
 * intervals' overlaps with the window, not their sum.
 */
#include <stdlib.h>
#include <time.h>

#include "nvml_internal.h"

struct span {
    uint64_t lo, hi;
    uint32_t pid;
};

static int by_pid_start(const void *a, const void *b)
{
    const struct span *x = a, *y = b;
    if (x->pid != y->pid)
        return x->pid < y->pid ? -1 : 1;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* The intervals' parts inside [from, to), of pid (0: all, then pid is ignored in sorting
 * so that they merge across processes), among the newest SIMGPU_UTIL_SCAN; returns how
 * many, into out (SIMGPU_UTIL_SCAN). */
static unsigned spans(struct simgpu_device *dev, uint64_t from, uint64_t to, uint32_t pid, int by_pid,
                      struct span *out)
{
    uint64_t head = atomic_load(&dev->ring_head);
    uint64_t n = head < SIMGPU_UTIL_SCAN ? head : SIMGPU_UTIL_SCAN;
    unsigned k = 0;
    for (uint64_t i = 0; i < n; i++) {
        struct simgpu_interval *iv = &dev->ring[(head - 1 - i) % SIMGPU_RING];
        uint64_t s = atomic_load(&iv->start_ns), e = atomic_load(&iv->end_ns);
        uint32_t p = atomic_load(&iv->pid);
        /* A writer fills start, end and pid one after another: a torn entry
         * shows end <= start, or belongs to the other owner for one instant. */
        if (e <= s || (pid && p != pid))
            continue;
        uint64_t lo = s > from ? s : from, hi = e < to ? e : to;
        if (hi > lo)
            out[k++] = (struct span){lo, hi, by_pid ? p : 0};
    }
    qsort(out, k, sizeof(out[0]), by_pid_start);
    return k;
}

/* Merge sorted spans of one pid each run: busy time per pid, through cb. */
static void merge(const struct span *sp, unsigned n, void (*cb)(void *, uint32_t, uint64_t, uint64_t), void *arg)
{
    for (unsigned i = 0; i < n;) {
        uint32_t pid = sp[i].pid;
        uint64_t busy = 0, last = 0, lo = sp[i].lo, hi = sp[i].hi;
        for (i++; i < n && sp[i].pid == pid; i++) {
            if (sp[i].lo > hi) {
                busy += hi - lo;
                lo = sp[i].lo;
            }
            if (sp[i].hi > hi)
                hi = sp[i].hi;
        }
        busy += hi - lo;
        last = hi;
        cb(arg, pid, busy, last);
    }
}

static void add_busy(void *arg, uint32_t pid, uint64_t busy, uint64_t last)
{
    (void)pid;
    (void)last;
    *(uint64_t *)arg += busy;
}

uint64_t vg_nvml_busy_ns(struct simgpu_device *dev, uint64_t from_ns, uint64_t to_ns, uint32_t pid)
{
    if (to_ns <= from_ns)
        return 0;
    struct span *sp = malloc(SIMGPU_UTIL_SCAN * sizeof(*sp));
    if (!sp)
        return 0;
    unsigned n = spans(dev, from_ns, to_ns, pid, 0, sp);
    uint64_t busy = 0;
    merge(sp, n, add_busy, &busy);
    free(sp);
    return busy < to_ns - from_ns ? busy : to_ns - from_ns;
}

/* The timed engine works out what ran only when someone looks: look now. */
static void touch(struct simgpu_device *dev)
{
    struct simgpu_state *st = vg_nvml_state();
    if (st && dev >= st->dev && dev < st->dev + st->ndev)
        simgpu_engine_touch((unsigned)(dev - st->dev));
}

static unsigned percent(uint64_t part, uint64_t whole)
{
    if (whole == 0)
        return 0;
    uint64_t p = (part * 100 + whole / 2) / whole;
    return p > 100 ? 100 : (unsigned)p;
}

unsigned vg_nvml_gpu_percent(struct simgpu_device *dev)
{
    touch(dev);
    uint64_t now = simgpu_now_ns();
    uint64_t from = now > NVML_SIM_WINDOW_NS ? now - NVML_SIM_WINDOW_NS : 0;
    return percent(vg_nvml_busy_ns(dev, from, now, 0), now - from);
}

unsigned vg_nvml_mem_percent(unsigned gpu_percent)
{
    return gpu_percent * 2 / 5;
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    struct simgpu_device *d;
    nvmlReturn_t rc = vg_nvml_device(device, &d, NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!utilization)
        return NVML_ERROR_INVALID_ARGUMENT;
    utilization->gpu = vg_nvml_gpu_percent(d);
    utilization->memory = vg_nvml_mem_percent(utilization->gpu);
    return NVML_SUCCESS;
}

/* NVML's sample timestamps are CPU time in microseconds since the epoch;
 * the ring is CLOCK_MONOTONIC. Offset = realtime - monotonic, rounded to the
 * millisecond so that every call and every process converts one kernel's end
 * to the same stamp (a client passes the stamp back as lastSeenTimeStamp).
 * The realtime read is bracketed by two monotonic reads, tightest of a few
 * tries: a caller descheduled between the reads (a loaded machine) would
 * otherwise skew the offset by a millisecond or more and hand out new stamps
 * for samples already seen. */
static uint64_t realtime_offset_ns(void)
{
    uint64_t off = 0, best_gap = UINT64_MAX;
    for (int i = 0; i < 8 && best_gap > 20000; i++) {
        struct timespec ts;
        uint64_t m0 = simgpu_now_ns();
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t m1 = simgpu_now_ns();
        if (m1 - m0 >= best_gap)
            continue;
        best_gap = m1 - m0;
        uint64_t real = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
        uint64_t mid = m0 + best_gap / 2;
        off = real > mid ? real - mid : 0;
    }
    return (off + 500000ull) / 1000000ull * 1000000ull;
}

struct pid_sample {
    uint32_t pid;
    uint64_t busy_ns;
    uint64_t last_ns; /* end of its latest kernel inside the window */
};

struct samples {
    struct pid_sample s[SIMGPU_SLOTS];
    unsigned n;
};

static void add_sample(void *arg, uint32_t pid, uint64_t busy, uint64_t last)
{
    struct samples *ss = arg;
    if (pid && ss->n < SIMGPU_SLOTS)
        ss->s[ss->n++] = (struct pid_sample){.pid = pid, .busy_ns = busy, .last_ns = last};
}

/* One sample per process: its share of the engine since lastSeenTimeStamp
 * (at most the last window), stamped with the end of its latest kernel, so a
 * client that passes back the newest stamp it saw gets only newer work. */
SIMGPU_API nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                                        nvmlProcessUtilizationSample_t *utilization,
                                                        unsigned int *processSamplesCount,
                                                        unsigned long long lastSeenTimeStamp)
{
    struct simgpu_device *d;
    nvmlReturn_t rc = vg_nvml_device(device, &d, NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!processSamplesCount)
        return NVML_ERROR_INVALID_ARGUMENT;

    touch(d);
    uint64_t now = simgpu_now_ns();
    uint64_t off = realtime_offset_ns();
    uint64_t from = now > NVML_SIM_WINDOW_NS ? now - NVML_SIM_WINDOW_NS : 0;
    uint64_t seen_ns = (uint64_t)lastSeenTimeStamp * 1000ull;
    if (lastSeenTimeStamp && seen_ns > off && seen_ns - off > from)
        from = seen_ns - off;

    struct samples *ss = calloc(1, sizeof(*ss));
    struct span *sp = malloc(SIMGPU_UTIL_SCAN * sizeof(*sp));
    if (!ss || !sp) {
        free(ss);
        free(sp);
        return NVML_ERROR_MEMORY;
    }
    if (from < now)
        merge(sp, spans(d, from, now, 0, 1, sp), add_sample, ss);
    free(sp);
    struct pid_sample *s = ss->s;
    unsigned n = ss->n;
/* Only samples newer than what the caller has seen, as NVML promises. */
    for (unsigned j = 0; j < n;) {
        if ((s[j].last_ns + off) / 1000ull <= (uint64_t)lastSeenTimeStamp)
            s[j] = s[--n];
        else
            j++;
    }
    if (n == 0) {
        free(ss);
        *processSamplesCount = 0;
        return NVML_ERROR_NOT_FOUND; /* the real driver's answer when nothing ran */
    }
    if (!utilization || *processSamplesCount < n) {
        free(ss);
        *processSamplesCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned j = 0; j < n; j++) {
        unsigned sm = percent(s[j].busy_ns, now - from);
        utilization[j] = (nvmlProcessUtilizationSample_t){
            .pid = s[j].pid,
            .timeStamp = (s[j].last_ns + off) / 1000ull,
            .smUtil = sm,
            .memUtil = vg_nvml_mem_percent(sm),
            .encUtil = 0,
            .decUtil = 0,
        };
    }
    free(ss);
    *processSamplesCount = n;
    return NVML_SUCCESS;
}
