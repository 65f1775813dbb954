/* SPDX-License-Identifier: Apache-2.0 */
/*
 * regions.c - the slice's accounting: one region per CUDA device ordinal.
 *
 * SLICE and SHARED modes map a slice's files (vgpu_region.h) that other
 * processes map too: the limits read-only, the usage read-write; PRIVATE mode
 * uses the same structs in anonymous memory, so one code path enforces every mode.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "vgpu_internal.h"

struct vg_dev_region {
    struct vgpu_region *r; /* limits (read-only where the arbiter made them); NULL: not limited */
    struct vgpu_usage *u;  /* the slice's usage, one slot per process */
    int slot;              /* this process's slot in u, -1 until claimed */
    _Atomic uint64_t mine; /* what this process charged: its slot is rewritten from this */
};

/* Filled once by vg_regions_init (under g_init_lock), read without a lock after g_ready. */
static struct vg_dev_region g_dev[VG_MAX_DEVICES];
static int g_ndev;
/* 1 once the regions are mapped; init is retried until the driver is up. */
static _Atomic int g_ready;
static pthread_mutex_t g_init_lock = PTHREAD_MUTEX_INITIALIZER;
/* Serialises slot claims (first charge per device, and after fork). */
static pthread_mutex_t g_slot_lock = PTHREAD_MUTEX_INITIALIZER;

static void region_error(const char *path, const char *why)
{
    snprintf(vg_cfg.error, sizeof(vg_cfg.error), "%s: %s", path, why);
    vg_cfg.error_result = CUDA_ERROR_OPERATING_SYSTEM;
}

static void *map_file(int fd, const char *path, size_t size, int writable, const char *what)
{
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        region_error(path, strerror(errno));
        return NULL;
    }
    if ((size_t)sb.st_size < size) {
        char why[128];
        snprintf(why, sizeof(why), "not a vgpu %s (%lld bytes, expected %zu)", what, (long long)sb.st_size, size);
        region_error(path, why);
        return NULL;
    }
    void *m = mmap(NULL, size, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        region_error(path, strerror(errno));
        return NULL;
    }
    return m;
}

static int region_valid(const struct vgpu_region *r, const char *path)
{
    char why[160];
    uint64_t got, want;
    const char *field = vgpu_region_check(r, &got, &want); /* the list in vgpu_region.h */
    if (field)
        snprintf(why, sizeof(why), "not a vgpu region of this version: %s 0x%llx, this libvgpu reads 0x%llx",
                 field, (unsigned long long)got, (unsigned long long)want);
    else if (!atomic_load(&r->slice_key))
        snprintf(why, sizeof(why), "region has no slice key");
    else
        return 1;
    region_error(path, why);
    return 0;
}

static int usage_valid(const struct vgpu_usage *u, const char *path)
{
    char why[160];
    uint64_t got, want;
    const char *field = vgpu_usage_check(u, &got, &want); /* the list in vgpu_region.h */
    if (field)
        snprintf(why, sizeof(why), "not a vgpu usage file of this version: %s 0x%llx, this libvgpu reads 0x%llx",
                 field, (unsigned long long)got, (unsigned long long)want);
    else
        return 1;
    region_error(path, why);
    return 0;
}

/* The limits: read-only, whoever made them (a container's mount is read-only too). */
static struct vgpu_region *open_region(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        region_error(path, strerror(errno));
        return NULL;
    }
    struct vgpu_region *r = map_file(fd, path, sizeof(*r), 0, "region");
    close(fd);
    if (r && !region_valid(r, path)) {
        munmap(r, sizeof(*r));
        return NULL;
    }
    return r;
}

static struct vgpu_usage *open_usage(const char *path)
{
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        region_error(path, strerror(errno));
        return NULL;
    }
    struct vgpu_usage *u = map_file(fd, path, sizeof(*u), 1, "usage file");
    close(fd);
    if (u && !usage_valid(u, path)) {
        munmap(u, sizeof(*u));
        return NULL;
    }
    return u;
}

uint64_t vg_random_key(void)
{
    uint64_t k = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (read(fd, &k, sizeof(k)) != (ssize_t)sizeof(k))
            k = 0;
        close(fd);
    }
    if (!k) /* no urandom: pid and time still tell slices apart */
        k = ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)&k;
    return k | 1;
}

static void fill_region(struct vgpu_region *r, int dev, uint64_t limit, const char *uuid)
{
    vgpu_region_init(r); /* the checked fields (vgpu_region.h) */
    r->device_index = (uint32_t)dev;
    snprintf(r->uuid, sizeof(r->uuid), "%s", uuid);
    atomic_store(&r->memory_limit, limit);
    atomic_store(&r->context_reserve, vg_cfg.context_reserve);
    uint32_t share = vg_cfg.compute_dev[dev] ? vg_cfg.compute_dev[dev] : vg_cfg.compute_all;
    atomic_store(&r->compute_share, share ? share : 100);
    atomic_store(&r->priority, vg_cfg.priority >= 0 ? (uint32_t)vg_cfg.priority : VGPU_PRIORITY_NORMAL);
    atomic_store(&r->policy, vg_cfg.policy >= 0 ? (uint32_t)vg_cfg.policy : VGPU_POLICY_FIXED);
    atomic_store(&r->priority_floor, vg_cfg.floor >= 0 ? (uint32_t)vg_cfg.floor : 0);
    atomic_store(&r->slice_key, vg_random_key());
    /* Readers check magic first: publish it last. */
    atomic_store((_Atomic uint32_t *)&r->magic, VGPU_REGION_MAGIC);
}

static void fill_usage(struct vgpu_usage *u)
{
    vgpu_usage_init(u); /* the checked fields (vgpu_region.h) */
    atomic_store((_Atomic uint32_t *)&u->magic, VGPU_USAGE_MAGIC);
}

struct region_fill {
    int dev;
    uint64_t limit;
    const char *uuid;
};

static void fill_new_region(void *map, void *arg)
{
    const struct region_fill *a = arg;
    fill_region(map, a->dev, a->limit, a->uuid);
}

static void fill_new_usage(void *map, void *arg)
{
    (void)arg;
    fill_usage(map);
}

/* SHARED mode: the first process creates each file from its env; link() makes
 * creation atomic, so racing first processes agree on one file. The files are
 * this user's (0660): cooperative processes, not tenants. */
static void *open_or_create(const char *path, size_t size, void (*fill)(void *, void *), void *arg,
                            int is_usage)
{
    for (int attempt = 0; attempt < 3; attempt++) {
        if (access(path, F_OK) == 0)
            return is_usage ? (void *)open_usage(path) : (void *)open_region(path);
        void *m = vg_create_linked(path, size, 0660, 0, fill, arg);
        if (m)
            return m;
        if (errno != EEXIST) {
            region_error(path, strerror(errno));
            return NULL;
        }
    }
    region_error(path, "could not be created");
    return NULL;
}

static void *private_map(size_t size)
{
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        region_error("anonymous region", strerror(errno));
        return NULL;
    }
    return m;
}

static void after_fork_child(void)
{
    /* The child is a new process: it needs slots of its own. */
    for (int i = 0; i < g_ndev; i++) {
        g_dev[i].slot = -1;
        g_dev[i].mine = 0; /* the parent's memory is the parent's */
    }
    pthread_mutex_init(&g_slot_lock, NULL);
}

/* 0 done, 1 driver not initialised yet (retry later), -1 failed (vg_cfg.error set). */
static int init_regions(void)
{
    CUresult (*get_count)(int *) = (CUresult(*)(int *))vg_real[VG_cuDeviceGetCount];
    CUresult (*get_uuid)(CUuuid *, CUdevice) = (CUresult(*)(CUuuid *, CUdevice))vg_driver_sym("cuDeviceGetUuid_v2");
    CUresult (*total_mem)(size_t *, CUdevice) = (CUresult(*)(size_t *, CUdevice))vg_real[VG_cuDeviceTotalMem_v2];
    int count = 0;
    if (!get_count)
        return 1;
    CUresult rc = get_count(&count);
    if (rc == CUDA_ERROR_NOT_INITIALIZED)
        return 1;
    if (rc != CUDA_SUCCESS) {
        region_error("libcuda.so.1", "cuDeviceGetCount failed");
        return -1;
    }
    if (count > VG_MAX_DEVICES)
        count = VG_MAX_DEVICES;
    if (vg_cfg.mode == VG_MODE_SLICE && (unsigned)count > vg_cfg.slice_devices)
        count = (int)vg_cfg.slice_devices;
    for (int i = 0; i < count; i++) {
        char path[300], uuid[VGPU_REGION_UUID_LEN] = "";
        CUuuid cu;
        size_t total = 0;
        if (get_uuid && get_uuid(&cu, i) == CUDA_SUCCESS)
            vg_format_uuid(&cu, uuid, sizeof(uuid));
        if (total_mem)
            total_mem(&total, i);
        uint64_t limit = vg_cfg.limit_dev[i] ? vg_cfg.limit_dev[i] : vg_cfg.limit_all;
        struct vgpu_region *r = NULL;
        struct vgpu_usage *u = NULL;
        char upath[320];
        snprintf(path, sizeof(path), "%s/" VGPU_REGION_FILE_PREFIX "%d", vg_cfg.region_dir, i);
        snprintf(upath, sizeof(upath), "%s" VGPU_USAGE_SUFFIX, path);
        struct region_fill args = {i, limit ? limit : total, uuid};
        switch (vg_cfg.mode) {
        case VG_MODE_SLICE:
            r = open_region(path);
            if (r && r->uuid[0] && uuid[0] && strcmp(r->uuid, uuid) != 0) {
                char why[400];
                snprintf(why, sizeof(why),
                         "is for GPU %s but CUDA device %d is %s: CUDA_VISIBLE_DEVICES must list the slice's GPUs "
                         "in order",
                         r->uuid, i, uuid);
                region_error(path, why);
                return -1;
            }
            if (r)
                u = open_usage(upath);
            break;
        case VG_MODE_SHARED:
            r = open_or_create(path, sizeof(*r), fill_new_region, &args, 0);
            if (r)
                u = open_or_create(upath, sizeof(*u), fill_new_usage, NULL, 1);
            break;
        case VG_MODE_PRIVATE:
            if (!(limit || vg_cfg.context_reserve || vg_cfg.compute_dev[i] || vg_cfg.compute_all ||
                  vg_cfg.priority >= 0 || vg_cfg.policy >= 0 || vg_cfg.floor >= 0))
                continue; /* no limit for this device */
            r = private_map(sizeof(*r));
            u = r ? private_map(sizeof(*u)) : NULL;
            if (u) {
                fill_region(r, i, args.limit, uuid);
                fill_usage(u);
            }
            break;
        case VG_MODE_INERT:
            continue;
        }
        if (!r || !u)
            return -1;
        g_dev[i].r = r;
        g_dev[i].u = u;
        g_dev[i].slot = -1;
    }
    g_ndev = count;
    pthread_atfork(NULL, NULL, after_fork_child);
    return 0;
}

int vg_regions_init(void)
{
    if (VG_LIKELY(atomic_load_explicit(&g_ready, memory_order_acquire)))
        return 0;
    if (vg_cfg.error[0])
        return -1;
    pthread_mutex_lock(&g_init_lock);
    int rc = g_ready ? 0 : vg_cfg.error[0] ? -1 : init_regions();
    if (rc == 0)
        atomic_store_explicit(&g_ready, 1, memory_order_release);
    pthread_mutex_unlock(&g_init_lock);
    return rc;
}

CUresult vg_ready(void)
{
    int rc = vg_regions_init();
    if (VG_LIKELY(rc == 0))
        return CUDA_SUCCESS;
    return rc < 0 ? vg_fail_closed() : CUDA_ERROR_NOT_INITIALIZED;
}

struct vgpu_region *vg_region(int dev)
{
    if (dev < 0 || dev >= g_ndev || !atomic_load_explicit(&g_ready, memory_order_acquire))
        return NULL;
    return g_dev[dev].r;
}

static int my_slot(int dev)
{
    struct vg_dev_region *d = &g_dev[dev];
    int slot = __atomic_load_n(&d->slot, __ATOMIC_ACQUIRE);
    if (VG_LIKELY(slot >= 0))
        return slot;
    pthread_mutex_lock(&g_slot_lock);
    if (d->slot < 0)
        __atomic_store_n(&d->slot, vg_slots_claim(d->u->slots, VGPU_REGION_SLOTS, &d->u->slot_high_water),
                         __ATOMIC_RELEASE);
    slot = d->slot;
    pthread_mutex_unlock(&g_slot_lock);
    return slot;
}

/* Our slot as we left it: the usage file is writable by the whole slice, so a
 * process that zeroed or hid our slot does not make our memory disappear. */
static void reassert_slot(struct vg_dev_region *d, int slot)
{
    struct vg_slot *s = &d->u->slots[slot];
    uint64_t mine = atomic_load(&d->mine);
    if (atomic_load(&s->used) != mine)
        atomic_store(&s->used, mine);
    uint32_t hw = atomic_load(&d->u->slot_high_water);
    while (hw <= (uint32_t)slot && !atomic_compare_exchange_weak(&d->u->slot_high_water, &hw, (uint32_t)slot + 1))
        ;
}

int vg_charge(int dev, uint64_t bytes)
{
    struct vgpu_region *r = vg_region(dev);
    if (!r)
        return 0;
    struct vg_dev_region *d = &g_dev[dev];
    int slot = my_slot(dev);
    if (slot < 0)
        return -1; /* every slot held by a live process: refuse rather than go unaccounted */
    reassert_slot(d, slot);
    return vg_slots_charge_own(d->u->slots, &d->u->slot_high_water, slot, bytes, atomic_load(&r->memory_limit),
                               &d->mine);
}

void vg_uncharge(int dev, uint64_t bytes)
{
    struct vgpu_region *r = vg_region(dev);
    if (!r)
        return;
    struct vg_dev_region *d = &g_dev[dev];
    int slot = my_slot(dev);
    if (slot < 0)
        return;
    uint64_t cur = atomic_load(&d->mine), next;
    do {
        next = cur > bytes ? cur - bytes : 0;
    } while (!atomic_compare_exchange_weak(&d->mine, &cur, next));
    vg_slots_uncharge(d->u->slots, slot, bytes);
    reassert_slot(d, slot);
}

uint64_t vg_used(int dev)
{
    struct vgpu_region *r = vg_region(dev);
    return r ? vg_slots_used_live(g_dev[dev].u->slots, &g_dev[dev].u->slot_high_water) : 0;
}

uint64_t vg_limit(int dev)
{
    struct vgpu_region *r = vg_region(dev);
    return r ? atomic_load(&r->memory_limit) : 0;
}

int vg_slice_device_count(void)
{
    return vg_cfg.mode == VG_MODE_SLICE ? g_ndev : -1;
}

int vg_region_by_uuid(const char *uuid)
{
    for (int i = 0; i < g_ndev; i++)
        if (g_dev[i].r && strcmp(g_dev[i].r->uuid, uuid) == 0)
            return i;
    return -1;
}

int vg_region_count(void)
{
    return atomic_load_explicit(&g_ready, memory_order_acquire) ? g_ndev : 0;
}

void vg_note_busy(int dev, uint64_t ns, uint64_t now)
{
    struct vgpu_region *r = vg_region(dev);
    if (!r)
        return;
    int slot = my_slot(dev);
    if (slot < 0)
        return;
    atomic_fetch_add(&g_dev[dev].u->slots[slot].busy_ns, ns);
    atomic_store(&g_dev[dev].u->slots[slot].last_active_ns, now);
}
