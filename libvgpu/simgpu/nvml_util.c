/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nvml_util.c - utilisation from the device's engine timeline.
 *
 * Every kernel simgpu runs leaves an interval {start, end, pid} in the
 * device's ring. Kernels on one device never overlap (one engine), so the
 * busy time of a window is the plain sum of the intervals' overlaps with it.
 */
#include <time.h>

#include "nvml_internal.h"

uint64_t vg_nvml_busy_ns(struct simgpu_device *dev, uint64_t from_ns, uint64_t to_ns, uint32_t pid)
{
    if (to_ns <= from_ns)
        return 0;
    uint64_t head = atomic_load(&dev->ring_head);
    uint64_t n = head < SIMGPU_RING ? head : SIMGPU_RING;
    uint64_t busy = 0;
    for (uint64_t k = 0; k < n; k++) {
        struct simgpu_interval *iv = &dev->ring[(head - 1 - k) % SIMGPU_RING];
        uint64_t s = atomic_load(&iv->start_ns), e = atomic_load(&iv->end_ns);
        /* A writer fills start, end and pid one after another: a torn entry
         * shows end <= start, or belongs to the other owner for one instant. */
        if (e <= s || (pid && atomic_load(&iv->pid) != pid))
            continue;
        uint64_t lo = s > from_ns ? s : from_ns, hi = e < to_ns ? e : to_ns;
        if (hi > lo)
            busy += hi - lo;
    }
    return busy < to_ns - from_ns ? busy : to_ns - from_ns;
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

    uint64_t now = simgpu_now_ns();
    uint64_t off = realtime_offset_ns();
    uint64_t from = now > NVML_SIM_WINDOW_NS ? now - NVML_SIM_WINDOW_NS : 0;
    uint64_t seen_ns = (uint64_t)lastSeenTimeStamp * 1000ull;
    if (lastSeenTimeStamp && seen_ns > off && seen_ns - off > from)
        from = seen_ns - off;

    struct pid_sample s[SIMGPU_SLOTS];
    unsigned n = 0;
    uint64_t head = atomic_load(&d->ring_head);
    uint64_t total = head < SIMGPU_RING ? head : SIMGPU_RING;
    for (uint64_t k = 0; k < total && from < now; k++) {
        struct simgpu_interval *iv = &d->ring[(head - 1 - k) % SIMGPU_RING];
        uint64_t st = atomic_load(&iv->start_ns), en = atomic_load(&iv->end_ns);
        uint32_t pid = atomic_load(&iv->pid);
        uint64_t lo = st > from ? st : from, hi = en < now ? en : now;
        if (en <= st || hi <= lo || pid == 0)
            continue;
        unsigned j = 0;
        while (j < n && s[j].pid != pid)
            j++;
        if (j == n) {
            if (n == SIMGPU_SLOTS)
                continue;
            s[n++] = (struct pid_sample){.pid = pid};
        }
        s[j].busy_ns += hi - lo;
        if (hi > s[j].last_ns)
            s[j].last_ns = hi;
    }
    /* Only samples newer than what the caller has seen, as NVML promises. */
    for (unsigned j = 0; j < n;) {
        if ((s[j].last_ns + off) / 1000ull <= (uint64_t)lastSeenTimeStamp)
            s[j] = s[--n];
        else
            j++;
    }
    if (n == 0) {
        *processSamplesCount = 0;
        return NVML_ERROR_NOT_FOUND; /* the real driver's answer when nothing ran */
    }
    if (!utilization || *processSamplesCount < n) {
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
    *processSamplesCount = n;
    return NVML_SUCCESS;
}
