/* SPDX-License-Identifier: Apache-2.0 */
/*
 * real.c - boot: read the configuration, find the real driver's entry points.
 *
 * Nothing happens at load time: /etc/ld.so.preload maps this library into
 * every process of a container, and most of them never touch CUDA. The first
 * intercepted call boots the library.
 */
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "vgpu_internal.h"

_Atomic int vg_booted;
_Atomic int vg_active;
struct vg_config vg_cfg;
void *vg_real[VG_HOOK_COUNT];

const char *const vg_hook_name[VG_HOOK_COUNT] = {
#define VG_HOOK(name) #name,
#include "hooks.def"
};

void *const vg_hook[VG_HOOK_COUNT] = {
#define VG_HOOK(name) (void *)&name,
#include "hooks.def"
};

/* glibc's own dlsym; found through dlvsym, which we do not interpose. */
static void *(*g_dlsym)(void *, const char *);
static pthread_once_t g_dlsym_once = PTHREAD_ONCE_INIT;
static pthread_once_t g_boot_once = PTHREAD_ONCE_INIT;
static pthread_once_t g_nvml_once = PTHREAD_ONCE_INIT;

static void find_dlsym(void)
{
    /* The default version differs per glibc release and architecture. */
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0", NULL};
    for (int i = 0; versions[i] && !g_dlsym; i++)
        g_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", versions[i]);
}

void *vg_real_dlsym(void *handle, const char *name)
{
    pthread_once(&g_dlsym_once, find_dlsym);
    return g_dlsym ? g_dlsym(handle, name) : NULL;
}

int vg_hook_lookup(const char *name)
{
    /* A short list and a rare call (dlsym, cuGetProcAddress): a scan is enough. */
    for (int i = 0; i < VG_HOOK_COUNT; i++)
        if (strcmp(vg_hook_name[i], name) == 0)
            return i;
    return -1;
}

void *vg_translate(void *real_fn)
{
    if (!real_fn || !atomic_load(&vg_active))
        return real_fn;
    for (int i = 0; i < VG_nvmlInit_v2; i++)
        if (vg_real[i] == real_fn)
            return vg_hook[i];
    return real_fn;
}

static void *open_lib(const char *soname)
{
    /* Already loaded by the application (linked or dlopen'ed): same handle. */
    void *h = dlopen(soname, RTLD_LAZY | RTLD_NOLOAD);
    return h ? h : dlopen(soname, RTLD_LAZY);
}

/* Stand-ins for entry points the installed driver lacks, so a hook called
 * directly (the app linked against a newer driver) returns an error instead of
 * jumping to NULL. No-argument functions are safe to call with arguments in
 * the x86-64 and aarch64 C ABIs. */
static CUresult missing_cuda(void)
{
    return CUDA_ERROR_NOT_SUPPORTED;
}

static nvmlReturn_t missing_nvml(void)
{
    return NVML_ERROR_FUNCTION_NOT_FOUND;
}

static void resolve(int first, int last, const char *soname, void *missing)
{
    void *h = open_lib(soname);
    for (int i = first; i < last; i++) {
        vg_real[i] = h ? vg_real_dlsym(h, vg_hook_name[i]) : NULL;
        if (!vg_real[i])
            vg_real[i] = missing;
    }
}

void *vg_driver_sym(const char *name)
{
    void *h = open_lib("libcuda.so.1");
    return h ? vg_real_dlsym(h, name) : NULL;
}

void *vg_nvml_sym(const char *name)
{
    void *h = open_lib("libnvidia-ml.so.1");
    return h ? vg_real_dlsym(h, name) : NULL;
}

static void boot_once(void)
{
    vg_config_load(&vg_cfg, "/dev");
    resolve(0, VG_nvmlInit_v2, "libcuda.so.1", (void *)missing_cuda);
    atomic_store(&vg_active, vg_cfg.mode != VG_MODE_INERT && vg_cfg.error[0] == '\0');
    atomic_store_explicit(&vg_booted, 1, memory_order_release);
}

static void nvml_once(void)
{
    resolve(VG_nvmlInit_v2, VG_HOOK_COUNT, "libnvidia-ml.so.1", (void *)missing_nvml);
}

void vg_boot_slow(void)
{
    pthread_once(&g_boot_once, boot_once);
}

void vg_boot_nvml(void)
{
    vg_boot();
    pthread_once(&g_nvml_once, nvml_once);
}

CUresult vg_fail_closed(void)
{
    static _Atomic int printed;
    if (!atomic_exchange(&printed, 1))
        fprintf(stderr, "vgpu: %s\n", vg_cfg.error);
    return vg_cfg.error_result;
}

/* ---- dlsym interposition ---- */

/* RTLD_NEXT means "after the caller", which glibc works out from the return
 * address; forwarding it from here would search after libvgpu instead. Walk
 * the link map after the caller's object ourselves. */
static void *dlsym_next(const void *caller, const char *name)
{
    Dl_info info;
    struct link_map *lm = NULL;
    if (!dladdr1(caller, &info, (void **)&lm, RTLD_DL_LINKMAP) || !lm)
        return vg_real_dlsym(RTLD_NEXT, name);
    for (lm = lm->l_next; lm; lm = lm->l_next) {
        void *h = dlopen(lm->l_name && lm->l_name[0] ? lm->l_name : NULL, RTLD_LAZY | RTLD_NOLOAD);
        if (!h)
            continue;
        void *sym = vg_real_dlsym(h, name);
        dlclose(h);
        if (sym)
            return sym;
    }
    return NULL;
}

/* glibc declares name nonnull, but a NULL from a buggy caller must not crash
 * here when it would not crash in glibc's own dlsym. */
#pragma GCC diagnostic ignored "-Wnonnull-compare"
VG_EXPORT void *dlsym(void *handle, const char *name)
{
    const void *caller = __builtin_return_address(0);
    if (name && ((name[0] == 'c' && name[1] == 'u') || strncmp(name, "nvml", 4) == 0)) {
        int id = vg_hook_lookup(name);
        if (id >= 0) {
            vg_boot();
            if (atomic_load(&vg_active)) {
                /* Only hand out a hook for a symbol the library really has. */
                void *real = handle == RTLD_NEXT ? dlsym_next(caller, name) : vg_real_dlsym(handle, name);
                return real ? vg_hook[id] : NULL;
            }
        }
    }
    if (handle == RTLD_NEXT)
        return dlsym_next(caller, name);
    return vg_real_dlsym(handle, name);
}
