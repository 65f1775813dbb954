/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hooks_nvml.c - NVML's memory view of a limited device is the slice's:
 * nvidia-smi and pynvml inside a container show the limit as the total.
 * NVML indexes physical GPUs, so devices are matched to regions by UUID.
 */
#include <stdio.h>

#include "vgpu_internal.h"

static nvmlReturn_t fail_closed_nvml(void)
{
    vg_fail_closed();
    return NVML_ERROR_UNKNOWN;
}

VG_EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    vg_boot_nvml();
    if (vg_cfg.error[0])
        return fail_closed_nvml();
    return REAL(nvmlInit_v2)();
}

VG_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    vg_boot_nvml();
    if (vg_cfg.error[0])
        return fail_closed_nvml();
    return REAL(nvmlInitWithFlags)(flags);
}

/* Region ordinal of an NVML device, or -1 when it is not limited. */
static int nvml_region(nvmlDevice_t device)
{
    static nvmlReturn_t (*get_uuid)(nvmlDevice_t, char *, unsigned int);
    if (!get_uuid)
        get_uuid = (nvmlReturn_t(*)(nvmlDevice_t, char *, unsigned int))vg_nvml_sym("nvmlDeviceGetUUID");
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    if (!get_uuid || get_uuid(device, uuid, sizeof(uuid)) != NVML_SUCCESS)
        return -1;
    /* An NVML-only process (nvidia-smi) has not initialised CUDA: the
     * regions are keyed by CUDA ordinal, so bring the driver up quietly. */
    if (vg_regions_init() == 1) {
        REAL(cuInit)(0);
        if (vg_regions_init() != 0)
            return -1;
    }
    return vg_region_by_uuid(uuid);
}

static void slice_view(int idx, unsigned long long *total, unsigned long long *free, unsigned long long *used)
{
    uint64_t limit = vg_limit(idx);
    uint64_t t = limit < *total ? limit : *total;
    vg_pools_reconcile(idx, 0); /* what pools hold counts, as the driver reports it now */
    uint64_t u = vg_used(idx);
    *total = t;
    *used = u < t ? u : t;
    *free = t - *used;
}

VG_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    vg_boot_nvml();
    nvmlReturn_t r = REAL(nvmlDeviceGetMemoryInfo)(device, memory);
    if (r != NVML_SUCCESS || !atomic_load(&vg_active))
        return r;
    int idx = nvml_region(device);
    if (idx >= 0)
        slice_view(idx, &memory->total, &memory->free, &memory->used);
    return r;
}

VG_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    vg_boot_nvml();
    nvmlReturn_t r = REAL(nvmlDeviceGetMemoryInfo_v2)(device, memory);
    if (r != NVML_SUCCESS || !atomic_load(&vg_active))
        return r;
    int idx = nvml_region(device);
    if (idx >= 0) {
        slice_view(idx, &memory->total, &memory->free, &memory->used);
        memory->reserved = 0;
    }
    return r;
}
