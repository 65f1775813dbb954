/* SPDX-License-Identifier: Apache-2.0 */
/* nvml_init.c - nvmlInit, nvmlInitWithFlags, nvmlShutdown (reference counted) and device handles. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "nvml_internal.h"

/* Like the real library: each successful init adds one, each shutdown takes
 * one, and the library is usable while the count is above zero. */
static pthread_mutex_t g_init_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned g_init_count;
static _Atomic(struct simgpu_state *) g_ready_state;

static struct nvmlDevice_st g_handles[SIMGPU_MAX_DEVICES];

int vg_nvml_ready(void)
{
    return atomic_load(&g_ready_state) != NULL;
}

struct simgpu_state *vg_nvml_state(void)
{
    return atomic_load(&g_ready_state);
}

nvmlDevice_t vg_nvml_handle(unsigned i)
{
    return &g_handles[i];
}

nvmlReturn_t vg_nvml_device(nvmlDevice_t h, struct simgpu_device **dev, unsigned *index)
{
    struct simgpu_state *st = vg_nvml_state();
    if (!st)
        return NVML_ERROR_UNINITIALIZED;
    /* Compare addresses as integers: a stray pointer is rejected without being read. */
    uintptr_t p = (uintptr_t)h, base = (uintptr_t)g_handles;
    if (p < base || p >= base + sizeof(g_handles) || (p - base) % sizeof(g_handles[0]) != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned i = (unsigned)((p - base) / sizeof(g_handles[0]));
    if (i >= st->ndev)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (atomic_load(&st->dev[i].lost))
        return NVML_ERROR_GPU_IS_LOST;
    if (dev)
        *dev = &st->dev[i];
    if (index)
        *index = i;
    return NVML_SUCCESS;
}

nvmlReturn_t vg_nvml_copy_str(char *dst, unsigned len, const char *src)
{
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    size_t n = strlen(src);
    if ((size_t)len < n + 1)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, n + 1);
    return NVML_SUCCESS;
}

SIMGPU_API nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags; /* NO_GPUS / NO_ATTACH change nothing for a simulated device */
    nvmlReturn_t rc = NVML_SUCCESS;
    pthread_mutex_lock(&g_init_lock);
    if (g_init_count == 0) {
        /* simgpu_state() says why on stderr when the state file is unusable. */
        struct simgpu_state *st = simgpu_state();
        if (!st) {
            rc = NVML_ERROR_DRIVER_NOT_LOADED;
            goto out;
        }
        for (unsigned i = 0; i < SIMGPU_MAX_DEVICES; i++)
            g_handles[i].index = i;
        atomic_store(&g_ready_state, st);
    }
    g_init_count++;
out:
    pthread_mutex_unlock(&g_init_lock);
    return rc;
}

SIMGPU_API nvmlReturn_t nvmlInit_v2(void)
{
    return nvmlInitWithFlags(0);
}

/* The pre-v2 symbol; old binaries link it directly. */
SIMGPU_API nvmlReturn_t nvmlInit(void)
{
    return nvmlInitWithFlags(0);
}

SIMGPU_API nvmlReturn_t nvmlShutdown(void)
{
    nvmlReturn_t rc = NVML_SUCCESS;
    pthread_mutex_lock(&g_init_lock);
    if (g_init_count == 0)
        rc = NVML_ERROR_UNINITIALIZED;
    else if (--g_init_count == 0)
        atomic_store(&g_ready_state, NULL); /* the mapping itself stays for the process */
    pthread_mutex_unlock(&g_init_lock);
    return rc;
}
