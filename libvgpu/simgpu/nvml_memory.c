/* SPDX-License-Identifier: Apache-2.0 */
/* nvml_memory.c - nvmlDeviceGetMemoryInfo(_v2): the device's live used memory. */
#include "nvml_internal.h"

/* used = sum of the live processes' slots (dead ones are reaped on the way). */
static void mem_view(struct simgpu_device *d, unsigned index, uint64_t *total, uint64_t *used)
{
    *total = d->total_bytes;
    *used = simgpu_mem_used(index);
    if (*used > *total) /* charges are capped at total; keeps free from wrapping regardless */
        *used = *total;
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    struct simgpu_device *d;
    unsigned i;
    nvmlReturn_t rc = vg_nvml_device(device, &d, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t total, used;
    mem_view(d, i, &total, &used);
    memory->total = total;
    memory->used = used;
    memory->free = total - used;
    return NVML_SUCCESS;
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    struct simgpu_device *d;
    unsigned i;
    nvmlReturn_t rc = vg_nvml_device(device, &d, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* The version word says which layout the caller allocated; never write past it. */
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    uint64_t total, used;
    mem_view(d, i, &total, &used);
    memory->total = total;
    memory->reserved = 0; /* no driver/firmware reservation on a simulated device */
    memory->used = used;
    memory->free = total - used;
    return NVML_SUCCESS;
}
