/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cuda_vmm.c - virtual memory management (cuMemCreate/Map/SetAccess...).
 *
 * Physical memory is a memfd of the allocation's size, charged when created.
 * A reservation is a PROT_NONE anonymous mapping; cuMemMap maps the memfd
 * MAP_SHARED|MAP_FIXED over part of it, cuMemSetAccess mprotects it, and
 * cuMemUnmap puts PROT_NONE anonymous memory back. As on a real GPU the
 * physical memory stays charged until it is both released and unmapped.
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cuda_internal.h"

struct sg_vmm {
    uint32_t magic;
    int fd;          /* -1 once released */
    size_t size;
    int dev;
    int refs;        /* 1 for the handle + one per mapping; under g_vlock */
};

/* A mapping of physical memory into a reservation. */
struct sg_vmap {
    uintptr_t va;
    size_t size;
    struct sg_vmm *mem;
    struct sg_vmap *next;
};

/* Guards every sg_vmm.refs and the mapping list. */
static pthread_mutex_t g_vlock = PTHREAD_MUTEX_INITIALIZER;
static struct sg_vmap *g_vmaps;

static int prop_ok(const CUmemAllocationProp *prop)
{
    return prop && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED &&
           prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && sg_check_dev(prop->location.id) == CUDA_SUCCESS;
}

/* Drop one reference (caller holds g_vlock); the last one frees and uncharges. */
static void vmm_put(struct sg_vmm *m)
{
    if (--m->refs > 0)
        return;
    simgpu_mem_uncharge(sg_phys(m->dev), m->size);
    m->magic = SG_MAGIC_DEAD;
    free(m);
}

SIMGPU_API CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                                  CUmemAllocationGranularity_flags option)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!granularity || !prop_ok(prop) ||
        (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    *granularity = SG_GRANULARITY;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                                unsigned long long flags)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!handle || !prop_ok(prop) || flags != 0 || size == 0 || size % SG_GRANULARITY)
        return CUDA_ERROR_INVALID_VALUE;
    int dev = prop->location.id;
    struct sg_vmm *m = calloc(1, sizeof(*m));
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (simgpu_mem_charge(sg_phys(dev), size) != 0) {
        free(m);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    m->fd = memfd_create("simgpu-vmm", MFD_CLOEXEC);
    if (m->fd < 0 || ftruncate(m->fd, (off_t)size) != 0 || sg_handle_add(m) != 0) {
        if (m->fd >= 0)
            close(m->fd);
        simgpu_mem_uncharge(sg_phys(dev), size);
        free(m);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    m->magic = SG_MAGIC_VMM;
    m->size = size;
    m->dev = dev;
    m->refs = 1;
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)m;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sg_vmm *m = (struct sg_vmm *)(uintptr_t)handle;
    pthread_mutex_lock(&g_vlock);
    if (!m || !sg_handle_ok(m, SG_MAGIC_VMM)) {
        pthread_mutex_unlock(&g_vlock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    sg_handle_del(m);
    close(m->fd); /* existing mappings keep the pages alive */
    m->fd = -1;
    vmm_put(m);
    pthread_mutex_unlock(&g_vlock);
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                        unsigned long long flags)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!ptr || size == 0 || size % SG_GRANULARITY || flags != 0 || (alignment & (alignment - 1)))
        return CUDA_ERROR_INVALID_VALUE;
    size_t align = alignment > SG_GRANULARITY ? alignment : SG_GRANULARITY;
    size_t len = size + align;
    if (len < size)
        return CUDA_ERROR_OUT_OF_MEMORY;
    char *p = MAP_FAILED;
    if (addr && (addr % align) == 0) {
        /* Honour the hint when that exact range is free. */
        p = mmap((void *)(uintptr_t)addr, size, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
        if (p != MAP_FAILED && (uintptr_t)p != addr) {
            munmap(p, size);
            p = MAP_FAILED;
        }
    }
    if (p == MAP_FAILED) {
        char *raw = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (raw == MAP_FAILED)
            return CUDA_ERROR_OUT_OF_MEMORY;
        uintptr_t a = ((uintptr_t)raw + align - 1) & ~(uintptr_t)(align - 1);
        if (a > (uintptr_t)raw)
            munmap(raw, a - (uintptr_t)raw);
        size_t tail = (uintptr_t)raw + len - (a + size);
        if (tail)
            munmap((void *)(a + size), tail);
        p = (char *)a;
    }
    struct sg_range r = {.base = (uintptr_t)p, .size = size, .maplen = size, .dev = -1, .kind = SG_KIND_RESERVE};
    if (sg_range_add(&r) != 0) {
        munmap(p, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *ptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sg_range r;
    if (sg_range_find((uintptr_t)ptr, 1, &r) != 0 || r.kind != SG_KIND_RESERVE || r.base != ptr || r.size != size)
        return CUDA_ERROR_INVALID_VALUE;
    if (sg_range_take((uintptr_t)ptr, SG_KIND_RESERVE, &r) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    /* Mappings still inside are dropped with it, as the application forgot them. */
    pthread_mutex_lock(&g_vlock);
    for (struct sg_vmap **pp = &g_vmaps; *pp;) {
        struct sg_vmap *v = *pp;
        if (v->va >= r.base && v->va < r.base + r.size) {
            *pp = v->next;
            vmm_put(v->mem);
            free(v);
        } else {
            pp = &v->next;
        }
    }
    pthread_mutex_unlock(&g_vlock);
    munmap((void *)r.base, r.size);
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                             unsigned long long flags)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sg_range r;
    if (!ptr || size == 0 || flags != 0 || size % SG_GRANULARITY || offset % SG_GRANULARITY ||
        ptr % SG_GRANULARITY)
        return CUDA_ERROR_INVALID_VALUE;
    if (sg_range_find((uintptr_t)ptr, size, &r) != 0 || r.kind != SG_KIND_RESERVE)
        return CUDA_ERROR_INVALID_VALUE;
    struct sg_vmm *m = (struct sg_vmm *)(uintptr_t)handle;
    pthread_mutex_lock(&g_vlock);
    if (!m || !sg_handle_ok(m, SG_MAGIC_VMM)) {
        rc = CUDA_ERROR_INVALID_HANDLE;
        goto out;
    }
    if (offset > m->size || size > m->size - offset) {
        rc = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    for (struct sg_vmap *v = g_vmaps; v; v = v->next) {
        if (v->va < ptr + size && ptr < v->va + v->size) {
            rc = CUDA_ERROR_ALREADY_MAPPED;
            goto out;
        }
    }
    struct sg_vmap *v = malloc(sizeof(*v));
    if (!v) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    /* No access until cuMemSetAccess, like the real driver. */
    void *p = mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, m->fd, (off_t)offset);
    if (p == MAP_FAILED) {
        free(v);
        rc = errno == ENOMEM ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_OPERATING_SYSTEM;
        goto out;
    }
    *v = (struct sg_vmap){.va = (uintptr_t)ptr, .size = size, .mem = m, .next = g_vmaps};
    g_vmaps = v;
    m->refs++;
out:
    pthread_mutex_unlock(&g_vlock);
    return rc;
}

SIMGPU_API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!ptr || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    /* The range must cover whole mappings, and at least one. */
    pthread_mutex_lock(&g_vlock);
    int found = 0;
    for (struct sg_vmap *v = g_vmaps; v; v = v->next) {
        if (v->va < ptr + size && ptr < v->va + v->size) {
            if (v->va < ptr || v->va + v->size > ptr + size) {
                pthread_mutex_unlock(&g_vlock);
                return CUDA_ERROR_INVALID_VALUE;
            }
            found = 1;
        }
    }
    if (!found) {
        pthread_mutex_unlock(&g_vlock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (struct sg_vmap **pp = &g_vmaps; *pp;) {
        struct sg_vmap *v = *pp;
        if (v->va >= ptr && v->va < ptr + size) {
            *pp = v->next;
            mmap((void *)v->va, v->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
                 0);
            vmm_put(v->mem);
            free(v);
        } else {
            pp = &v->next;
        }
    }
    pthread_mutex_unlock(&g_vlock);
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!ptr || size == 0 || !desc || count == 0)
        return CUDA_ERROR_INVALID_VALUE;
    int prot = -1;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
            sg_check_dev(desc[i].location.id) != CUDA_SUCCESS)
            return CUDA_ERROR_INVALID_DEVICE;
        int p;
        switch (desc[i].flags) {
        case CU_MEM_ACCESS_FLAGS_PROT_NONE: p = PROT_NONE; break;
        case CU_MEM_ACCESS_FLAGS_PROT_READ: p = PROT_READ; break;
        case CU_MEM_ACCESS_FLAGS_PROT_READWRITE: p = PROT_READ | PROT_WRITE; break;
        default: return CUDA_ERROR_INVALID_VALUE;
        }
        /* One address space stands for every device: the widest access wins. */
        if (p > prot)
            prot = p;
    }
    /* Every page of the range must be mapped physical memory. */
    pthread_mutex_lock(&g_vlock);
    size_t covered = 0;
    for (struct sg_vmap *v = g_vmaps; v; v = v->next) {
        uintptr_t lo = v->va > ptr ? v->va : ptr;
        uintptr_t hi = v->va + v->size < ptr + size ? v->va + v->size : ptr + size;
        if (lo < hi)
            covered += hi - lo;
    }
    if (covered != size)
        rc = CUDA_ERROR_INVALID_VALUE;
    else if (mprotect((void *)(uintptr_t)ptr, size, prot) != 0)
        rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&g_vlock);
    return rc;
}
