/* SPDX-License-Identifier: Apache-2.0 */
/* nvml_procs.c - nvmlDevice*RunningProcesses: who holds memory or ran kernels on a device. */
#include "nvml_internal.h"

struct proc_entry {
    uint32_t pid;
    uint64_t used;
};

/* Live owners of the device's slots that hold memory or submitted a kernel
 * within the last window (a context that just computes still shows up). */
static unsigned collect(struct simgpu_device *d, struct proc_entry *out)
{
    uint64_t now = simgpu_now_ns();
    uint32_t hw = atomic_load(&d->slot_high_water);
    unsigned n = 0;
    for (uint32_t i = 0; i < hw && i < SIMGPU_SLOTS; i++) {
        struct vg_slot *s = &d->slots[i];
        uint32_t pid = atomic_load(&s->pid);
        if (pid == 0 || (pid & VG_SLOT_REAPING))
            continue;
        uint64_t used = atomic_load(&s->used);
        uint64_t last = atomic_load(&s->last_active_ns);
        if (used == 0 && last + NVML_SIM_WINDOW_NS < now)
            continue;
        /* NVML names processes by the caller's pids (host pids, seen from the host). */
        pid = vg_pid_visible(pid, atomic_load(&s->start_time), atomic_load(&s->pid_ns));
        if (pid == 0)
            continue;
        out[n++] = (struct proc_entry){.pid = pid, .used = used};
    }
    return n;
}

/* The shared contract of the _v1/_v2/_v3 calls: *infoCount in = capacity,
 * out = entries written or, with NVML_ERROR_INSUFFICIENT_SIZE, entries needed;
 * capacity 0 with no process is a plain success (pynvml's first call). */
static nvmlReturn_t running(nvmlDevice_t device, unsigned *infoCount, void *infos, int v1)
{
    struct simgpu_device *d;
    unsigned index;
    nvmlReturn_t rc = vg_nvml_device(device, &d, &index);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!infoCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    simgpu_engine_touch(index); /* the timed engine: who computed lately */
    struct proc_entry e[SIMGPU_SLOTS];
    unsigned n = collect(d, e);
    if (*infoCount < n) {
        *infoCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (n > 0 && !infos)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < n; i++) {
        if (v1) {
            ((nvmlProcessInfo_v1_t *)infos)[i] = (nvmlProcessInfo_v1_t){.pid = e[i].pid, .usedGpuMemory = e[i].used};
        } else {
            /* Not a MIG device: instance ids are "not available", as on real GPUs. */
            ((nvmlProcessInfo_t *)infos)[i] = (nvmlProcessInfo_t){.pid = e[i].pid,
                                                                  .usedGpuMemory = e[i].used,
                                                                  .gpuInstanceId = NVML_VALUE_NOT_AVAILABLE,
                                                                  .computeInstanceId = NVML_VALUE_NOT_AVAILABLE};
        }
    }
    *infoCount = n;
    return NVML_SUCCESS;
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                             nvmlProcessInfo_v1_t *infos)
{
    return running(device, infoCount, infos, 1);
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                                nvmlProcessInfo_t *infos)
{
    return running(device, infoCount, infos, 0);
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                                nvmlProcessInfo_t *infos)
{
    return running(device, infoCount, infos, 0);
}

/* simgpu has no graphics or MPS clients: these lists are always empty, which
 * monitoring tools that ask for every kind expect rather than an error. */
static nvmlReturn_t none_running(nvmlDevice_t device, unsigned *infoCount)
{
    nvmlReturn_t rc = vg_nvml_device(device, NULL, NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!infoCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    *infoCount = 0;
    return NVML_SUCCESS;
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                              nvmlProcessInfo_v1_t *infos)
{
    (void)infos;
    return none_running(device, infoCount);
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                                 nvmlProcessInfo_t *infos)
{
    (void)infos;
    return none_running(device, infoCount);
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                                 nvmlProcessInfo_t *infos)
{
    (void)infos;
    return none_running(device, infoCount);
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                                   nvmlProcessInfo_t *infos)
{
    (void)infos;
    return none_running(device, infoCount);
}
