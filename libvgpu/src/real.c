/* SPDX-License-Identifier: Apache-2.0 */
/*
 * real.c - boot: read the configuration, find the real driver's entry points.
 *
 * Nothing happens at load time: /etc/ld.so.preload maps this library into
 * every process of a container, and most of them never touch CUDA. The first
 * intercepted call boots the library.
 */
#include <dlfcn.h>
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

/* For tests/gpu/gpucheck.c's coverage check: the driver API names libvgpu hooks and its
 * hooks, from hooks.def (NVML's are not reached through cuGetProcAddress). */
VG_EXPORT int vgpu_hooked_entry_points(const char *const **names, void *const **hooks)
{
    if (names)
        *names = vg_hook_name;
    if (hooks)
        *hooks = vg_hook;
    return VG_nvmlInit_v2;
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

/* ---- the start-up self-check of cuGetProcAddress ----
 *
 * vg_translate maps what the driver's cuGetProcAddress hands out back to our hooks by
 * address: an answer is mapped when it is the address dlsym gives for one of the hooked
 * names (vg_real) or one of our hooks. An answer that is neither (an entry point the
 * driver exports under no hooked name, such as a new versioned variant) would reach the
 * application unhooked, and its calls would bypass the limits. So, before the real
 * cuInit of a process with limits, every hooked name's base (cuMemAlloc for
 * cuMemAlloc_v2, cuLaunchKernel for cuLaunchKernel_ptsz) is asked for at the CUDA
 * versions below and the driver's own, with each stream flag; a successful answer that
 * is not mapped makes cuInit fail closed with one line naming the base, the version and
 * the flag. An answer "not found" or "version not sufficient" hands nothing out. */
static const int g_check_versions[] = {11030, 12000, 12080, 13000};
static const cuuint64_t g_check_flags[] = {CU_GET_PROC_ADDRESS_DEFAULT, CU_GET_PROC_ADDRESS_LEGACY_STREAM,
                                           CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM};
static pthread_once_t g_check_once = PTHREAD_ONCE_INIT;
static int g_check_failed;

/* name without its _ptsz/_ptds and then its _v<N> suffix, into base. */
static void base_name(const char *name, char *base, size_t len)
{
    snprintf(base, len, "%s", name);
    size_t n = strlen(base);
    if (n > 5 && (strcmp(base + n - 5, "_ptsz") == 0 || strcmp(base + n - 5, "_ptds") == 0))
        base[n -= 5] = '\0';
    size_t d = n;
    while (d > 0 && base[d - 1] >= '0' && base[d - 1] <= '9')
        d--;
    if (d < n && d >= 2 && base[d - 1] == 'v' && base[d - 2] == '_')
        base[d - 2] = '\0';
}

static int mapped(void *fn)
{
    for (int i = 0; i < VG_nvmlInit_v2; i++)
        if (fn == vg_real[i] || fn == vg_hook[i])
            return 1;
    return 0;
}

static void check_once(void)
{
    CUresult (*v2)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *) = NULL;
    CUresult (*v1)(const char *, void **, int, cuuint64_t) = NULL;
    if (vg_real[VG_cuGetProcAddress_v2] != (void *)missing_cuda)
        v2 = REAL(cuGetProcAddress_v2);
    else if (vg_real[VG_cuGetProcAddress] != (void *)missing_cuda)
        v1 = REAL(cuGetProcAddress);
    else
        return; /* a driver without cuGetProcAddress hands nothing out */
    int versions[sizeof(g_check_versions) / sizeof(g_check_versions[0]) + 1];
    size_t nv = 0;
    for (; nv < sizeof(g_check_versions) / sizeof(g_check_versions[0]); nv++)
        versions[nv] = g_check_versions[nv];
    CUresult (*get_version)(int *) = (CUresult(*)(int *))vg_driver_sym("cuDriverGetVersion");
    int own = 0;
    if (get_version && get_version(&own) == CUDA_SUCCESS && own > versions[nv - 1])
        versions[nv++] = own;
    char base[128];
    for (int i = 0; i < VG_nvmlInit_v2; i++) {
        base_name(vg_hook_name[i], base, sizeof(base));
        for (size_t v = 0; v < nv; v++)
            for (size_t f = 0; f < sizeof(g_check_flags) / sizeof(g_check_flags[0]); f++) {
                void *fn = NULL;
                CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
                CUresult r = v2 ? v2(base, &fn, versions[v], g_check_flags[f], &st)
                                : v1(base, &fn, versions[v], g_check_flags[f]);
                if (r != CUDA_SUCCESS || st != CU_GET_PROC_ADDRESS_SUCCESS || !fn || mapped(fn))
                    continue;
                snprintf(vg_cfg.error, sizeof(vg_cfg.error),
                         "cuGetProcAddress(\"%s\", %d, flags %llu) answers an entry point that is not %s nor "
                         "any other hooked name: refusing to run unenforced",
                         base, versions[v], (unsigned long long)g_check_flags[f], vg_hook_name[i]);
                vg_cfg.error_result = CUDA_ERROR_NOT_SUPPORTED;
                g_check_failed = 1;
                return;
            }
    }
}

int vg_procaddr_check(void)
{
    pthread_once(&g_check_once, check_once);
    return g_check_failed ? -1 : 0;
}

/* ---- dlsym interposition ---- */

static void *no_dlsym(void *handle, const char *name)
{
    (void)handle;
    (void)name;
    return NULL;
}

static void *(*dlsym_fn(void))(void *, const char *)
{
    pthread_once(&g_dlsym_once, find_dlsym);
    return g_dlsym ? g_dlsym : no_dlsym;
}

/* Our hook when `name` is a hooked entry point, limits apply and the library
 * the caller asked really has it; else NULL. */
static void *hook_for(void *handle, const char *name)
{
    if (!((name[0] == 'c' && name[1] == 'u') || strncmp(name, "nvml", 4) == 0))
        return NULL;
    int id = vg_hook_lookup(name);
    if (id < 0)
        return NULL;
    vg_boot();
    if (!atomic_load(&vg_active))
        return NULL;
    return vg_real_dlsym(handle == RTLD_NEXT ? RTLD_DEFAULT : handle, name) ? vg_hook[id] : NULL;
}

/* Everything else goes to glibc's dlsym as a tail call, so glibc still sees
 * the caller's return address: RTLD_NEXT keeps meaning "after the caller",
 * not "after libvgpu". glibc declares name nonnull, but a NULL from a buggy
 * caller must reach glibc rather than crash here. */
#pragma GCC diagnostic ignored "-Wnonnull-compare"
__attribute__((optimize("optimize-sibling-calls"))) VG_EXPORT void *dlsym(void *handle, const char *name)
{
    void *hook = name ? hook_for(handle, name) : NULL;
    if (hook)
        return hook;
    return dlsym_fn()(handle, name);
}
