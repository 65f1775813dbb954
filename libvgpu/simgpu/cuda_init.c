/* SPDX-License-Identifier: Apache-2.0 */
/* cuda_init.c - cuInit, the driver version and device queries. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

/* The state mapping, set once by the first successful cuInit. */
static struct simgpu_state *_Atomic g_st;
/* CUDA ordinal -> simulated device index, from CUDA_VISIBLE_DEVICES; filled
 * before g_st is published and read-only after. */
static unsigned g_phys[SIMGPU_MAX_DEVICES];
static unsigned g_visible;

CUresult sg_check_init(void)
{
    return atomic_load(&g_st) ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

struct simgpu_state *sg_state(void)
{
    return atomic_load(&g_st);
}

CUresult sg_check_dev(CUdevice dev)
{
    struct simgpu_state *st = atomic_load(&g_st);
    if (!st)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || (unsigned)dev >= g_visible)
        return CUDA_ERROR_INVALID_DEVICE;
    return CUDA_SUCCESS;
}

unsigned sg_phys(CUdevice dev)
{
    return g_phys[dev];
}

/* One CUDA_VISIBLE_DEVICES entry: an index or a (prefix of a) UUID. -1 if none matches. */
static int visible_entry(const struct simgpu_state *st, const char *e, size_t len)
{
    char buf[64];
    if (len == 0 || len >= sizeof(buf))
        return -1;
    memcpy(buf, e, len);
    buf[len] = '\0';
    char *end;
    long idx = strtol(buf, &end, 10);
    if (end != buf && *end == '\0')
        return idx >= 0 && (unsigned long)idx < st->ndev ? (int)idx : -1;
    int found = -1;
    for (unsigned i = 0; i < st->ndev; i++) {
        if (strncmp(st->dev[i].uuid, buf, len) == 0) {
            if (found >= 0)
                return -1; /* ambiguous prefix */
            found = (int)i;
        }
    }
    return found;
}

/* Like the real driver: the devices listed, in that order; parsing stops at
 * the first entry that names no device (or one already listed). */
static void parse_visible(const struct simgpu_state *st)
{
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    g_visible = 0;
    if (!v) {
        for (unsigned i = 0; i < st->ndev; i++)
            g_phys[g_visible++] = i;
        return;
    }
    while (*v && g_visible < SIMGPU_MAX_DEVICES) {
        while (*v == ' ')
            v++;
        size_t len = strcspn(v, ",");
        int idx = visible_entry(st, v, len);
        for (unsigned i = 0; idx >= 0 && i < g_visible; i++)
            if (g_phys[i] == (unsigned)idx)
                idx = -1;
        if (idx < 0)
            break;
        g_phys[g_visible++] = (unsigned)idx;
        v += len;
        if (*v == ',')
            v++;
    }
}

SIMGPU_API CUresult cuInit(unsigned int flags)
{
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    /* simgpu_state() prints its own one-line reason when the file is unusable. */
    struct simgpu_state *st = simgpu_state();
    if (!st || st->ndev == 0 || simgpu_wake_check() != 0)
        return CUDA_ERROR_NO_DEVICE;
    if (!atomic_load(&g_st)) {
        parse_visible(st);
        if (g_visible == 0)
            return CUDA_ERROR_NO_DEVICE;
    }
    atomic_store(&g_st, st);
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuDriverGetVersion(int *driverVersion)
{
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = SG_DRIVER_VERSION;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuDeviceGetCount(int *count)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = (int)g_visible;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if ((rc = sg_check_dev(ordinal)) != CUDA_SUCCESS)
        return rc;
    *device = ordinal;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if ((rc = sg_check_dev(dev)) != CUDA_SUCCESS)
        return rc;
    snprintf(name, (size_t)len, "%s", sg_state()->dev[sg_phys(dev)].name);
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    if ((rc = sg_check_dev(dev)) != CUDA_SUCCESS)
        return rc;
    memcpy(uuid->bytes, sg_state()->dev[sg_phys(dev)].uuid_bytes, sizeof(uuid->bytes));
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    return cuDeviceGetUuid(uuid, dev);
}

SIMGPU_API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    if ((rc = sg_check_dev(dev)) != CUDA_SUCCESS)
        return rc;
    *bytes = (size_t)sg_state()->dev[sg_phys(dev)].total_bytes;
    return CUDA_SUCCESS;
}

/* The pre-CUDA-3.2 ABI: a 32-bit count, saturated like the old driver did. */
SIMGPU_API CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    size_t b;
    if (!bytes)
        return sg_check_init() != CUDA_SUCCESS ? CUDA_ERROR_NOT_INITIALIZED : CUDA_ERROR_INVALID_VALUE;
    CUresult rc = cuDeviceTotalMem_v2(&b, dev);
    if (rc == CUDA_SUCCESS)
        *bytes = b > 0xffffffffu ? 0xffffffffu : (unsigned int)b;
    return rc;
}

/* Attribute values of an H100-class device (CC 9.0); the PCI ids come from the state. */
static const struct {
    int attr;
    int value;
} g_attrs[] = {
    {1, 1024},        /* MAX_THREADS_PER_BLOCK */
    {2, 1024},        /* MAX_BLOCK_DIM_X */
    {3, 1024},        /* MAX_BLOCK_DIM_Y */
    {4, 64},          /* MAX_BLOCK_DIM_Z */
    {5, 2147483647},  /* MAX_GRID_DIM_X */
    {6, 65535},       /* MAX_GRID_DIM_Y */
    {7, 65535},       /* MAX_GRID_DIM_Z */
    {8, 49152},       /* MAX_SHARED_MEMORY_PER_BLOCK */
    {9, 65536},       /* TOTAL_CONSTANT_MEMORY */
    {10, 32},         /* WARP_SIZE */
    {11, 2147483647}, /* MAX_PITCH */
    {12, 65536},      /* MAX_REGISTERS_PER_BLOCK */
    {13, 1980000},    /* CLOCK_RATE, kHz */
    {14, 512},        /* TEXTURE_ALIGNMENT */
    {15, 1},          /* GPU_OVERLAP */
    {16, 132},        /* MULTIPROCESSOR_COUNT */
    {19, 1},          /* CAN_MAP_HOST_MEMORY */
    {30, 512},        /* SURFACE_ALIGNMENT */
    {31, 1},          /* CONCURRENT_KERNELS */
    {32, 1},          /* ECC_ENABLED */
    {36, 2619000},    /* MEMORY_CLOCK_RATE, kHz */
    {37, 5120},       /* GLOBAL_MEMORY_BUS_WIDTH */
    {38, 52428800},   /* L2_CACHE_SIZE */
    {39, 2048},       /* MAX_THREADS_PER_MULTIPROCESSOR */
    {40, 3},          /* ASYNC_ENGINE_COUNT */
    {41, 1},          /* UNIFIED_ADDRESSING */
    {51, 32},         /* TEXTURE_PITCH_ALIGNMENT */
    {75, 9},          /* COMPUTE_CAPABILITY_MAJOR */
    {76, 0},          /* COMPUTE_CAPABILITY_MINOR */
    {78, 1},          /* STREAM_PRIORITIES_SUPPORTED */
    {79, 1},          /* GLOBAL_L1_CACHE_SUPPORTED */
    {80, 1},          /* LOCAL_L1_CACHE_SUPPORTED */
    {81, 233472},     /* MAX_SHARED_MEMORY_PER_MULTIPROCESSOR */
    {82, 65536},      /* MAX_REGISTERS_PER_MULTIPROCESSOR */
    {83, 1},          /* MANAGED_MEMORY */
    {89, 1},          /* CONCURRENT_MANAGED_ACCESS */
    {90, 1},          /* COMPUTE_PREEMPTION_SUPPORTED */
    {95, 1},          /* COOPERATIVE_LAUNCH */
    {97, 232448},     /* MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
    {99, 1},          /* HOST_REGISTER_SUPPORTED */
    {102, 1},         /* VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED */
    {103, 1},         /* HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED */
    {106, 32},        /* MAX_BLOCKS_PER_MULTIPROCESSOR */
    {108, 32505856},  /* MAX_PERSISTING_L2_CACHE_SIZE */
    {109, 134213632}, /* MAX_ACCESS_POLICY_WINDOW_SIZE */
    {111, 1024},      /* RESERVED_SHARED_MEMORY_PER_BLOCK */
    {115, 1},         /* MEMORY_POOLS_SUPPORTED */
    {119, 1},         /* MEMPOOL_SUPPORTED_HANDLE_TYPES: POSIX fd */
    {120, 1},         /* CLUSTER_LAUNCH */
    {126, 4},         /* MEM_SYNC_DOMAIN_COUNT */
    {127, 1},         /* TENSOR_MAP_ACCESS_SUPPORTED */
    {129, 1},         /* UNIFIED_FUNCTION_POINTERS */
    {131, -1},        /* NUMA_ID */
    {134, -1},        /* HOST_NUMA_ID */
};
/* CU_DEVICE_ATTRIBUTE_MAX in the CUDA 13 cuda.h: larger values are invalid. */
#define SG_ATTR_MAX 146

SIMGPU_API CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pi || attrib <= 0 || attrib >= SG_ATTR_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    if ((rc = sg_check_dev(dev)) != CUDA_SUCCESS)
        return rc;
    const struct simgpu_device *d = &sg_state()->dev[sg_phys(dev)];
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
        *pi = (int)d->pci_bus;
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
        *pi = 0;
        return CUDA_SUCCESS;
    }
    /* Anything in range that a simulated device has no value for reads 0 (unsupported). */
    *pi = 0;
    for (size_t i = 0; i < sizeof(g_attrs) / sizeof(g_attrs[0]); i++) {
        if (g_attrs[i].attr == attrib) {
            *pi = g_attrs[i].value;
            break;
        }
    }
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pciBusId || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if ((rc = sg_check_dev(dev)) != CUDA_SUCCESS)
        return rc;
    snprintf(pciBusId, (size_t)len, "0000:%02x:00.0", sg_state()->dev[sg_phys(dev)].pci_bus);
    return CUDA_SUCCESS;
}
