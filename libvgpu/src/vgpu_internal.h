/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vgpu_internal.h - libvgpu's private interfaces.
 *
 * Intercepted cu and nvml functions keep their exact CUDA names and are the
 * only places that turn an internal failure into a CUresult/nvmlReturn_t.
 * Everything internal carries the vg_ prefix.
 */
#ifndef VGPU_INTERNAL_H
#define VGPU_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "../include/vgpu_cuda.h"
#include "../include/vgpu_region.h"

#define VG_EXPORT __attribute__((visibility("default")))
#define VG_LIKELY(x) __builtin_expect(!!(x), 1)
#define VG_UNLIKELY(x) __builtin_expect(!!(x), 0)

#define VG_MAX_DEVICES 64

/* ---- real.c: the real driver's entry points, looked up in one place ---- */
enum vg_hook_id {
#define VG_HOOK(name) VG_##name,
#include "hooks.def"
    VG_HOOK_COUNT
};

/* Set once vg_boot() finished; read on every hook entry. */
extern _Atomic int vg_booted;
/* Real entry points, indexed by enum vg_hook_id (NULL where the driver lacks one). */
extern void *vg_real[VG_HOOK_COUNT];
/* Our hook for each id. */
extern void *const vg_hook[VG_HOOK_COUNT];
extern const char *const vg_hook_name[VG_HOOK_COUNT];

void vg_boot_slow(void);
static inline void vg_boot(void)
{
    if (VG_UNLIKELY(!atomic_load_explicit(&vg_booted, memory_order_acquire)))
        vg_boot_slow();
}
/* The real function for a hooked name, typed like our declaration of it. */
#define REAL(fn) ((__typeof__(&fn))vg_real[VG_##fn])

/* A driver entry point we call but do not hook (looked up once by the caller). */
void *vg_driver_sym(const char *name);
void *vg_nvml_sym(const char *name);
/* Boot, then find the real NVML entry points (NVML hooks only). */
void vg_boot_nvml(void);
/* glibc's dlsym, not our interposer. */
void *vg_real_dlsym(void *handle, const char *name);
/* Hook id for a symbol name, or -1. */
int vg_hook_lookup(const char *name);
/* Our hook for a real entry point the driver handed out, or the pointer itself. */
void *vg_translate(void *real_fn);

/* ---- config.c: what this process was asked to enforce ---- */
enum vg_mode {
    VG_MODE_INERT = 0,   /* nothing configured: every call passes straight through */
    VG_MODE_PRIVATE,     /* env limits, accounted in this process alone */
    VG_MODE_SHARED,      /* VGPU_REGION_DIR: processes naming the same dir share one slice */
    VG_MODE_SLICE        /* /dev/vgpu<i> from the hook: the arbiter's slice, env ignored */
};

struct vg_config {
    enum vg_mode mode;
    char region_dir[256];             /* SHARED and SLICE */
    uint64_t limit_all;               /* VGPU_MEMORY_LIMIT, 0 = unset */
    uint64_t limit_dev[VG_MAX_DEVICES];/* VGPU_MEMORY_LIMIT_<i>, 0 = unset */
    uint64_t context_reserve;         /* VGPU_CONTEXT_RESERVE */
    unsigned slice_devices;           /* SLICE: number of /dev/vgpu<i> files */
    uint32_t compute_all;             /* VGPU_COMPUTE_LIMIT, percent, 0 = unset */
    uint32_t compute_dev[VG_MAX_DEVICES];/* VGPU_COMPUTE_LIMIT_<i>, 0 = unset */
    int priority;                     /* VGPU_PRIORITY (enum vgpu_priority), -1 = unset */
    int policy;                       /* VGPU_POLICY (enum vgpu_policy), -1 = unset */
    int floor;                        /* VGPU_PRIORITY_FLOOR, percent, -1 = unset */
    char sched_dir[256];              /* per-GPU scheduling regions; "" = this process alone */
    int sched_from_arbiter;           /* sched_dir holds the arbiter's files: never create them */
    char error[1024];                 /* non-empty: fail closed with this line */
    CUresult error_result;            /* what cuInit returns then */
};

/* Parse the environment and probe the paths. Pure apart from getenv/stat. */
void vg_config_load(struct vg_config *cfg, const char *dev_dir);

/* The process-wide configuration (loaded by vg_boot). */
extern struct vg_config vg_cfg;
/* Non-zero when a limit applies (mode != INERT and no error). */
extern _Atomic int vg_active;

/* The start-up self-check (real.c): 0 when every answer cuGetProcAddress gives for a
 * hooked name maps to a hook; -1, with vg_cfg.error set, when one does not. Run once. */
int vg_procaddr_check(void);

/* Print the configuration error once; returns CUresult to hand back. */
CUresult vg_fail_closed(void);

/* ---- regions.c: the slice's accounting, one region per device ---- */
/* Open or create the regions of all devices (after the real cuInit).
 * 0, or -1 with vg_cfg.error set. */
int vg_regions_init(void);
/* Region of CUDA device ordinal dev, or NULL when the device is not limited. */
struct vgpu_region *vg_region(int dev);
/* Charge bytes to device dev's slice for this process; 0 or -1 (would pass the limit). */
int vg_charge(int dev, uint64_t bytes);
void vg_uncharge(int dev, uint64_t bytes);
/* Slice usage (live processes) and limit on dev. */
uint64_t vg_used(int dev);
uint64_t vg_limit(int dev);
/* Number of CUDA ordinals the slice covers (SLICE mode), else -1. */
int vg_slice_device_count(void);
/* Add GPU time this process was charged on dev to its slot (for attribution). */
void vg_note_busy(int dev, uint64_t ns, uint64_t now);
/* A random non-zero 64-bit key (slice identities). */
uint64_t vg_random_key(void);
/* Number of devices with regions mapped (0 before init). */
int vg_region_count(void);
/* Ordinal whose region names this GPU UUID ("GPU-..."), or -1. */
int vg_region_by_uuid(const char *uuid);

/* ---- allocs.c: what this process allocated, to uncharge exactly ---- */
/* VG_ALLOC_ASYNC: allocations from a memory pool, whose dev field is the pool's slot (pools.c). */
enum vg_alloc_kind { VG_ALLOC_PTR = 0, VG_ALLOC_VMM, VG_ALLOC_ARRAY, VG_ALLOC_CTX, VG_ALLOC_ASYNC, VG_ALLOC_KINDS };
int vg_allocs_put(enum vg_alloc_kind kind, uint64_t key, int dev, uint64_t bytes);
/* Remove key; returns 0 and fills dev/bytes, or -1 when unknown. */
int vg_allocs_take(enum vg_alloc_kind kind, uint64_t key, int *dev, uint64_t *bytes);

/* ---- pools.c: what memory pools keep reserved stays charged ---- */
/* The slot of pool (registered on first sight, on dev), or -1 (NULL pool, table full). */
int vg_pools_slot(CUmemoryPool pool, int dev);
int vg_pools_slot_dev(int slot);
/* The pool cuMemAllocAsync takes from on dev (the current one, else the default), or NULL. */
CUmemoryPool vg_pools_current(int dev);
void vg_pools_set_current(int dev, CUmemoryPool pool);
/* An allocation from the slot's pool succeeded / was freed into it (it stays charged). */
void vg_pools_allocated(int slot, uint64_t bytes);
void vg_pools_freed(int slot, uint64_t bytes);
/* Give back what the driver says pools on dev (-1: all) no longer reserve; trim: ask
 * them to release what they can first. */
void vg_pools_reconcile(int dev, int trim);
void vg_pools_reconcile_pool(CUmemoryPool pool);
void vg_pools_destroyed(CUmemoryPool pool);
/* vg_charge, and when it does not fit, trim and re-read the pools (syncing the context
 * for frees not yet observed) and charge again: 0 or -1. */
int vg_pools_make_room(int dev, uint64_t bytes);

/* ---- shared_file.c ---- */
/* Create `path` (size bytes, filled by fill(map, arg)) under a temporary name and
 * link it into place. Returns its mapping; NULL with errno EEXIST when another
 * process made it first (open that one), or with errno set on failure.
 * exact_mode: the file gets `mode` whatever the umask. */
void *vg_create_linked(const char *path, size_t size, mode_t mode, int exact_mode, void (*fill)(void *, void *),
                       void *arg);

/* ---- sched.c: compute shares and priority, per device (vgpu_sched.h) ---- */
/* Before a launch on stream s of device dev (-1: the current context's):
 * waits until this process may submit. Returns a ticket for vg_sched_done. */
struct vg_ticket {
    int dev;       /* -1: not throttled, nothing to do after the launch */
    CUstream stream;
    int refused;   /* no scheduling file where one must be: the launch is refused */
    uint64_t idle_to; /* the launch ends an empty spell claimed to this time: the GPU is idle
                       * until the driver has it, so the rest up to vg_sched_done is claimed too */
    uint64_t nth;     /* ... if no other launch came meanwhile: this was launch number nth */
    uint64_t start_serial; /* ... unless this is the hold's first launch, after its start event
                            * (this serial): the GPU may be running another slice's tail */
};
struct vg_ticket vg_sched_admit(CUstream s);
/* After the launch: rc is what the driver returned. */
void vg_sched_done(struct vg_ticket t, CUresult rc);
/* Before and after the app waits for its queued work (a stream, context or event sync,
 * or a query): vg_sched_sync returns the device and its launch count for vg_sched_synced
 * (offer: a sync, which may offer the token back; close: the wait is for a stream's or
 * the context's work, whose end an event recorded now dates); ok: the wait found the
 * work done. */
struct vg_sync {
    int dev;           /* -1: nothing scheduled on the current device */
    uint64_t launches; /* UINT64_MAX: one was mid-launch */
    int waiting;       /* a blocking sync, counted in the device's syncs_in */
};
struct vg_sync vg_sched_sync(int offer, int close);
void vg_sched_synced(struct vg_sync s, int ok);
/* After a query that found the work still running (the app polls for it). */
void vg_sched_polling(struct vg_sync s);
/* Stream captures open in this process (hooks_launch.c counts them as they begin and
 * end): while there are none, no stream is capturing and a launch need not ask the
 * driver (the question is most of a throttled launch's cost). A capture that ends
 * unseen leaves the count high: the launch asks, never a wrong answer. */
extern _Atomic int vg_captures_open;
int vg_stream_capturing(CUstream s);
void vg_capture_closed(void);

/* ---- helpers shared by hooks ---- */
/* Regions ready (retried until the driver is initialised); CUDA_SUCCESS or
 * the fail-closed result. */
CUresult vg_ready(void);
/* Hook prologue: boot, and take the plain path when nothing is enforced. */
#define VG_PASSTHROUGH_IF_INERT(fn, ...)                                        \
    do {                                                                        \
        vg_boot();                                                              \
        if (VG_LIKELY(!atomic_load_explicit(&vg_active, memory_order_relaxed))) \
            return REAL(fn)(__VA_ARGS__);                                       \
    } while (0)
/* Device of the calling thread's current context, or -1. */
int vg_current_device(void);
/* Format a CUuuid as "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx". */
void vg_format_uuid(const CUuuid *u, char *out, size_t len);

#endif
