/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pools.c - what stream-ordered memory pools keep reserved, charged to the slice.
 *
 * A pool keeps what cuMemFreeAsync gives it reserved on the GPU (up to its release
 * threshold, released only at syncs above it or by cuMemPoolTrimTo), so a free into
 * a pool does not uncharge: its bytes move from the pool's *in use* to its *held*.
 * The slice is charged in use + held for each pool, which is never less than what
 * the driver reports reserved (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) as long as an
 * allocation reserves no more than it asked for. Held bytes are given back only
 * when the driver says the pool no longer reserves them: held becomes
 * min(held, reserved - in use) (vg_pools_reconcile), at syncs, cuMemGetInfo,
 * cuMemPoolTrimTo, and when an allocation does not fit (vg_pools_make_room, which
 * first trims the device's pools, then syncs the context if pending frees still
 * hold memory). The driver is the authority; the application never reports a number.
 *
 * Process-local state, documented here: g_slots (one per pool this process
 * allocated from, at most VG_POOL_SLOTS live; a slot is filled under g_lock, its
 * handle stored last, and reused only once its pool was destroyed and nothing of
 * it is in use or held, so no allocation names it; its amounts are atomics),
 * g_default (each device's default pool, looked up once), g_current (the pool
 * cuDeviceSetMemPool made current, 0 = the default one), g_held (sum of held over
 * all slots: the syncs' one-load fast path).
 */
#include <pthread.h>
#include <string.h>

#include "vgpu_internal.h"

#define VG_POOL_SLOTS 256
#define ATTR_RESERVED_MEM_CURRENT 5 /* CUmemPool_attribute */

struct slot {
    _Atomic uint64_t handle; /* 0: unused; the pool otherwise */
    int dev;
    _Atomic int dead;        /* the pool was destroyed: its reservation cannot be read */
    _Atomic uint64_t inuse;  /* bytes allocated from it and not freed */
    _Atomic uint64_t held;   /* bytes freed into it and still charged */
};

static struct slot g_slots[VG_POOL_SLOTS];
static _Atomic int g_nslots;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic uint64_t g_default[VG_MAX_DEVICES];
static _Atomic uint64_t g_current[VG_MAX_DEVICES];
static _Atomic uint64_t g_held;

typedef CUresult (*get_attr_fn)(CUmemoryPool, int, void *);

/* The slot of pool (registered on first sight on dev), or -1 when the table is full. */
int vg_pools_slot(CUmemoryPool pool, int dev)
{
    uint64_t h = (uint64_t)(uintptr_t)pool;
    if (!h)
        return -1;
    int n = atomic_load(&g_nslots);
    for (int i = 0; i < n; i++)
        if (atomic_load(&g_slots[i].handle) == h && !atomic_load(&g_slots[i].dead))
            return i;
    pthread_mutex_lock(&g_lock);
    int found = -1, spare = -1;
    n = atomic_load(&g_nslots);
    for (int i = 0; i < n && found < 0; i++) {
        struct slot *s = &g_slots[i];
        if (atomic_load(&s->handle) == h && !atomic_load(&s->dead))
            found = i;
        else if (spare < 0 && atomic_load(&s->dead) && !atomic_load(&s->inuse) && !atomic_load(&s->held))
            spare = i; /* a destroyed pool with nothing left: no allocation names it */
    }
    if (found < 0) {
        if (spare < 0 && n < VG_POOL_SLOTS)
            spare = n;
        if (spare >= 0) {
            struct slot *s = &g_slots[spare];
            atomic_store(&s->handle, 0);
            s->dev = dev;
            atomic_store(&s->inuse, 0);
            atomic_store(&s->held, 0);
            atomic_store(&s->dead, 0);
            atomic_store(&s->handle, h);
            if (spare == n)
                atomic_store(&g_nslots, n + 1);
            found = spare;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return found;
}

int vg_pools_slot_dev(int slot)
{
    return g_slots[slot].dev;
}

/* The pool cuMemAllocAsync takes from on dev: the one set current, else the default. */
CUmemoryPool vg_pools_current(int dev)
{
    if (dev < 0 || dev >= VG_MAX_DEVICES)
        return NULL;
    uint64_t h = atomic_load(&g_current[dev]);
    if (h)
        return (CUmemoryPool)(uintptr_t)h;
    if (!(h = atomic_load(&g_default[dev]))) {
        static CUresult (*get_default)(CUmemoryPool *, CUdevice);
        if (!get_default)
            get_default = (CUresult(*)(CUmemoryPool *, CUdevice))vg_driver_sym("cuDeviceGetDefaultMemPool");
        CUmemoryPool p;
        if (get_default && get_default(&p, dev) == CUDA_SUCCESS)
            atomic_store(&g_default[dev], h = (uint64_t)(uintptr_t)p);
    }
    return (CUmemoryPool)(uintptr_t)h;
}

void vg_pools_set_current(int dev, CUmemoryPool pool)
{
    if (dev >= 0 && dev < VG_MAX_DEVICES)
        atomic_store(&g_current[dev], (uint64_t)(uintptr_t)pool);
}

void vg_pools_allocated(int slot, uint64_t bytes)
{
    atomic_fetch_add(&g_slots[slot].inuse, bytes);
}

/* A free into the pool: the bytes stay charged, as held. */
void vg_pools_freed(int slot, uint64_t bytes)
{
    atomic_fetch_sub(&g_slots[slot].inuse, bytes);
    atomic_fetch_add(&g_slots[slot].held, bytes);
    atomic_fetch_add(&g_held, bytes);
}

static void give_back(struct slot *s, uint64_t bytes)
{
    uint64_t h = atomic_load(&s->held);
    do {
        if (bytes > h)
            bytes = h;
        if (bytes == 0)
            return;
    } while (!atomic_compare_exchange_weak(&s->held, &h, h - bytes));
    atomic_fetch_sub(&g_held, bytes);
    vg_uncharge(s->dev, bytes);
}

/* Re-read one slot's reservation from the driver and give back what it no longer holds. */
static void reconcile(struct slot *s, int trim)
{
    static get_attr_fn get_attr;
    static CUresult (*trim_to)(CUmemoryPool, size_t);
    if (!get_attr)
        get_attr = (get_attr_fn)vg_driver_sym("cuMemPoolGetAttribute");
    if (!trim_to)
        trim_to = (CUresult(*)(CUmemoryPool, size_t))vg_driver_sym("cuMemPoolTrimTo");
    if (atomic_load(&s->held) == 0)
        return;
    CUmemoryPool pool = (CUmemoryPool)(uintptr_t)atomic_load(&s->handle);
    if (atomic_load(&s->dead)) {
        /* The driver released its unused memory at the destroy and releases each
         * outstanding allocation as it is freed: once none is left, nothing is held. */
        if (atomic_load(&s->inuse) == 0)
            give_back(s, UINT64_MAX);
        return;
    }
    if (trim && trim_to)
        trim_to(pool, 0); /* releases what no outstanding or unobserved free holds */
    uint64_t reserved;
    if (!get_attr || get_attr(pool, ATTR_RESERVED_MEM_CURRENT, &reserved) != CUDA_SUCCESS)
        return; /* unknown: keep charging it */
    uint64_t inuse = atomic_load(&s->inuse), held = atomic_load(&s->held);
    uint64_t keep = reserved > inuse ? reserved - inuse : 0;
    if (held > keep)
        give_back(s, held - keep);
}

void vg_pools_reconcile(int dev, int trim)
{
    if (atomic_load(&g_held) == 0)
        return;
    int n = atomic_load(&g_nslots);
    for (int i = 0; i < n; i++)
        if (atomic_load(&g_slots[i].handle) && (dev < 0 || g_slots[i].dev == dev))
            reconcile(&g_slots[i], trim);
}

void vg_pools_reconcile_pool(CUmemoryPool pool)
{
    uint64_t h = (uint64_t)(uintptr_t)pool;
    int n = atomic_load(&g_nslots);
    for (int i = 0; i < n; i++)
        if (h && atomic_load(&g_slots[i].handle) == h && !atomic_load(&g_slots[i].dead))
            reconcile(&g_slots[i], 0);
}

void vg_pools_destroyed(CUmemoryPool pool)
{
    uint64_t h = (uint64_t)(uintptr_t)pool;
    int n = atomic_load(&g_nslots);
    for (int i = 0; i < n; i++)
        if (h && atomic_load(&g_slots[i].handle) == h && !atomic_load(&g_slots[i].dead)) {
            atomic_store(&g_slots[i].dead, 1);
            reconcile(&g_slots[i], 0);
        }
    for (int d = 0; d < VG_MAX_DEVICES; d++) {
        uint64_t cur = h;
        atomic_compare_exchange_strong(&g_current[d], &cur, 0); /* the default is current again */
    }
}

int vg_pools_make_room(int dev, uint64_t bytes)
{
    if (vg_charge(dev, bytes) == 0)
        return 0;
    if (atomic_load(&g_held) == 0)
        return -1;
    vg_pools_reconcile(dev, 1);
    if (vg_charge(dev, bytes) == 0)
        return 0;
    /* Frees no sync has observed count as outstanding for a trim. Observe them, unless a
     * capture is open (a sync would invalidate it) or the context is another device's. */
    static CUresult (*ctx_sync)(void);
    if (!ctx_sync)
        ctx_sync = (CUresult(*)(void))vg_driver_sym("cuCtxSynchronize");
    if (atomic_load(&g_held) == 0 || atomic_load(&vg_captures_open) != 0 || vg_current_device() != dev ||
        !ctx_sync || ctx_sync() != CUDA_SUCCESS)
        return -1;
    vg_pools_reconcile(dev, 1);
    return vg_charge(dev, bytes);
}
