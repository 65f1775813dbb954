/* SPDX-License-Identifier: Apache-2.0 */
/*
 * dlmopen_load.c - a greedy GPU workload that bypasses libvgpu.
 *
 *   dlmopen_load [--library libcuda.so.1] [--kernel busy_1000us] [--queue N]
 *                [--device N] [--seconds S] [--report-ms MS] [--alloc BYTES]
 *
 * Loads the driver with dlmopen(LM_ID_NEWLM, ...): a new link-map namespace
 * has its own copy of every library, and LD_PRELOAD applies to the base
 * namespace only, so a preloaded libvgpu never sees these calls (symbols are
 * looked up with that namespace's own dlsym, past libvgpu's). This is the
 * out-of-band case vgpud's guard must catch through NVML: compute, and with
 * --alloc BYTES device memory (cuMemAlloc_v2 of BYTES before the ready line,
 * held until the end; --queue 0 launches nothing and only holds it).
 *
 * Launches KERNEL (simgpu: busy_<N>us occupies the engine N us) in batches of
 * --queue and synchronises after each batch, as fast as the GPU takes them.
 * Prints {"op":"ready","pid":P,"allocated":BYTES} once the driver is set up, a progress line
 * {"op":"progress","t":NS,"gpu_ns":NS} every --report-ms (GPU time of the
 * kernels completed so far, CLOCK_MONOTONIC t), and a summary at the end.
 * Built without linking the driver (see the Makefile).
 */
#include "vgpu_cuda.h"
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct driver {
    CUresult (*init)(unsigned int);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*ctx_retain)(CUcontext *, CUdevice);
    CUresult (*ctx_set)(CUcontext);
    CUresult (*module_load)(CUmodule *, const void *);
    CUresult (*get_function)(CUfunction *, CUmodule, const char *);
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       CUstream, void **, void **);
    CUresult (*sync)(void);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void die(const char *what, CUresult r)
{
    fprintf(stderr, "dlmopen_load: %s failed: %d\n", what, (int)r);
    exit(1);
}

/* glibc's dlsym of the driver's namespace: a preloaded libvgpu interposes
 * dlsym in the base namespace (and would hand out its own cuInit), not dlvsym,
 * and not the copy of libc inside the new namespace. */
static void *(*g_dlsym)(void *, const char *);

static void find_dlsym(void *h)
{
    Lmid_t lmid;
    void *libc = dlinfo(h, RTLD_DI_LMID, &lmid) == 0 ? dlmopen(lmid, "libc.so.6", RTLD_NOW) : NULL;
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0", NULL};
    for (int i = 0; libc && versions[i] && !g_dlsym; i++)
        *(void **)&g_dlsym = dlvsym(libc, "dlsym", versions[i]);
    if (!g_dlsym) {
        fprintf(stderr, "dlmopen_load: no dlsym in the driver's namespace: %s\n", dlerror());
        exit(1);
    }
}

/* One symbol of the driver in its own namespace; missing is fatal. */
static void *sym(void *h, const char *name)
{
    void *p = g_dlsym(h, name);
    if (!p) {
        fprintf(stderr, "dlmopen_load: %s: %s\n", name, dlerror());
        exit(1);
    }
    return p;
}

static void load(const char *library, struct driver *d)
{
    void *h = dlmopen(LM_ID_NEWLM, library, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlmopen_load: dlmopen %s: %s\n", library, dlerror());
        exit(1);
    }
    find_dlsym(h);
    *(void **)&d->init = sym(h, "cuInit");
    *(void **)&d->device_get = sym(h, "cuDeviceGet");
    *(void **)&d->ctx_retain = sym(h, "cuDevicePrimaryCtxRetain");
    *(void **)&d->ctx_set = sym(h, "cuCtxSetCurrent");
    *(void **)&d->module_load = sym(h, "cuModuleLoadData");
    *(void **)&d->get_function = sym(h, "cuModuleGetFunction");
    *(void **)&d->launch = sym(h, "cuLaunchKernel");
    *(void **)&d->sync = sym(h, "cuCtxSynchronize");
    *(void **)&d->mem_alloc = sym(h, "cuMemAlloc_v2");
}

int main(int argc, char **argv)
{
    const char *library = "libcuda.so.1", *kernel = "busy_1000us";
    int queue = 4, device = 0;
    unsigned long long alloc = 0;
    double seconds = 2.0, report_ms = 100.0;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--library"))
            library = v;
        else if (!strcmp(k, "--kernel"))
            kernel = v;
        else if (!strcmp(k, "--queue"))
            queue = atoi(v);
        else if (!strcmp(k, "--device"))
            device = atoi(v);
        else if (!strcmp(k, "--seconds"))
            seconds = atof(v);
        else if (!strcmp(k, "--report-ms"))
            report_ms = atof(v);
        else if (!strcmp(k, "--alloc"))
            alloc = strtoull(v, NULL, 0);
        else {
            fprintf(stderr, "dlmopen_load: unknown option %s\n", k);
            return 2;
        }
    }
    unsigned us = 0;
    if (sscanf(kernel, "busy_%uus", &us) != 1 || queue < 0 || report_ms <= 0) {
        fprintf(stderr, "dlmopen_load: --kernel busy_<N>us, --queue >= 0, --report-ms > 0\n");
        return 2;
    }
    struct driver d;
    load(library, &d);
    CUresult r;
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    static const char image[] = "simgpu";
    if ((r = d.init(0)))
        die("cuInit", r);
    if ((r = d.device_get(&dev, device)) || (r = d.ctx_retain(&ctx, dev)) || (r = d.ctx_set(ctx)) ||
        (r = d.module_load(&mod, image)) || (r = d.get_function(&f, mod, kernel)))
        die("setup", r);
    CUdeviceptr held = 0;
    if (alloc && (r = d.mem_alloc(&held, (size_t)alloc)))
        die("cuMemAlloc_v2", r);
    printf("{\"op\":\"ready\",\"pid\":%d,\"allocated\":%llu}\n", (int)getpid(), alloc);
    fflush(stdout);

    uint64_t start = now_ns(), until = start + (uint64_t)(seconds * 1e9);
    uint64_t every = (uint64_t)(report_ms * 1e6), next = start + every;
    uint64_t launches = 0, gpu_ns = 0, kernel_ns = (uint64_t)us * 1000;
    while (now_ns() < until) {
        if (queue == 0) { /* hold the memory, launch nothing */
            usleep(10000);
            continue;
        }
        for (int i = 0; i < queue; i++)
            if ((r = d.launch(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL)))
                die("cuLaunchKernel", r);
        if ((r = d.sync()))
            die("cuCtxSynchronize", r);
        launches += (uint64_t)queue;
        gpu_ns += (uint64_t)queue * kernel_ns;
        uint64_t t = now_ns();
        if (t >= next) {
            printf("{\"op\":\"progress\",\"t\":%llu,\"gpu_ns\":%llu}\n", (unsigned long long)t,
                   (unsigned long long)gpu_ns);
            fflush(stdout);
            next = t + every;
        }
    }
    printf("{\"op\":\"done\",\"launches\":%llu,\"gpu_ns\":%llu,\"start\":%llu,\"end\":%llu}\n",
           (unsigned long long)launches, (unsigned long long)gpu_ns, (unsigned long long)start,
           (unsigned long long)now_ns());
    return 0;
}
