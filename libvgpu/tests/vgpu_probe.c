/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vgpu_probe - a scriptable CUDA driver-API client for libvgpu's tests and
 * benchmarks. Each argument is one operation; each operation prints one JSON
 * line. Entry points come from one of the three ways real applications get
 * them (--via): the linked symbols, dlopen+dlsym, or cuGetProcAddress_v2.
 *
 *   vgpu_probe [--via direct|dlsym|procaddr] [--device N] OP...
 *   OP: alloc:KIND:BYTES  free  freeall  sync  info  count  fill:KIND:BYTES
 *       churn:KIND:BYTES:N  ctx:create  ctx:destroy  device:N  nvml
 *       hold  sleep:MS  launch:KERNEL:N  bench_launch:N  bench_alloc:BYTES:N  over_alloc:BYTES:N
 *   KIND: mem pitch managed vmm async pool array array3d mipmap
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "vgpu_cuda.h"

#define FN(name, ret, args) ret(*name) args
static struct {
    FN(Init, CUresult, (unsigned));
    FN(DeviceGetCount, CUresult, (int *));
    FN(DeviceGet, CUresult, (CUdevice *, int));
    FN(DeviceTotalMem, CUresult, (size_t *, CUdevice));
    FN(PrimaryCtxRetain, CUresult, (CUcontext *, CUdevice));
    FN(CtxSetCurrent, CUresult, (CUcontext));
    FN(CtxCreate, CUresult, (CUcontext *, unsigned, CUdevice));
    FN(CtxDestroy, CUresult, (CUcontext));
    FN(CtxSynchronize, CUresult, (void));
    FN(MemGetInfo, CUresult, (size_t *, size_t *));
    FN(MemAlloc, CUresult, (CUdeviceptr *, size_t));
    FN(MemFree, CUresult, (CUdeviceptr));
    FN(MemAllocPitch, CUresult, (CUdeviceptr *, size_t *, size_t, size_t, unsigned));
    FN(MemAllocManaged, CUresult, (CUdeviceptr *, size_t, unsigned));
    FN(MemCreate, CUresult, (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long));
    FN(MemRelease, CUresult, (CUmemGenericAllocationHandle));
    FN(MemAllocAsync, CUresult, (CUdeviceptr *, size_t, CUstream));
    FN(MemFreeAsync, CUresult, (CUdeviceptr, CUstream));
    FN(MemPoolCreate, CUresult, (CUmemoryPool *, const CUmemPoolProps *));
    FN(MemAllocFromPoolAsync, CUresult, (CUdeviceptr *, size_t, CUmemoryPool, CUstream));
    FN(ArrayCreate, CUresult, (CUarray *, const CUDA_ARRAY_DESCRIPTOR *));
    FN(Array3DCreate, CUresult, (CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *));
    FN(ArrayDestroy, CUresult, (CUarray));
    FN(MipmappedArrayCreate, CUresult, (CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned));
    FN(MipmappedArrayDestroy, CUresult, (CUmipmappedArray));
    FN(ModuleLoadData, CUresult, (CUmodule *, const void *));
    FN(ModuleGetFunction, CUresult, (CUfunction *, CUmodule, const char *));
    FN(LaunchKernel, CUresult, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                CUstream, void **, void **));
    FN(GetErrorName, CUresult, (CUresult, const char **));
} cu;

struct alloc {
    char kind;
    uint64_t key;
};
static struct alloc g_allocs[1 << 16];
static int g_nallocs;
static CUdevice g_dev;
static CUmemoryPool g_pool;
static CUcontext g_ctx_created;

static const char *errname(CUresult r)
{
    const char *s = NULL;
    if (!cu.GetErrorName || cu.GetErrorName(r, &s) != CUDA_SUCCESS || !s)
        return "CUDA_ERROR_?";
    return s;
}

static void die(const char *what, CUresult r)
{
    fprintf(stderr, "vgpu_probe: %s: %s (%d)\n", what, errname(r), r);
    exit(1);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- three ways to get entry points ---- */
#define ALL_FNS(X)                                                                                                \
    X(Init, cuInit, cuInit) X(DeviceGetCount, cuDeviceGetCount, cuDeviceGetCount)                                  \
    X(DeviceGet, cuDeviceGet, cuDeviceGet) X(DeviceTotalMem, cuDeviceTotalMem_v2, cuDeviceTotalMem)                \
    X(PrimaryCtxRetain, cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain)                                        \
    X(CtxSetCurrent, cuCtxSetCurrent, cuCtxSetCurrent) X(CtxCreate, cuCtxCreate_v2, cuCtxCreate)                   \
    X(CtxDestroy, cuCtxDestroy_v2, cuCtxDestroy) X(MemGetInfo, cuMemGetInfo_v2, cuMemGetInfo)                      \
    X(CtxSynchronize, cuCtxSynchronize, cuCtxSynchronize)                                                          \
    X(MemAlloc, cuMemAlloc_v2, cuMemAlloc) X(MemFree, cuMemFree_v2, cuMemFree)                                     \
    X(MemAllocPitch, cuMemAllocPitch_v2, cuMemAllocPitch) X(MemAllocManaged, cuMemAllocManaged, cuMemAllocManaged) \
    X(MemCreate, cuMemCreate, cuMemCreate) X(MemRelease, cuMemRelease, cuMemRelease)                               \
    X(MemAllocAsync, cuMemAllocAsync, cuMemAllocAsync) X(MemFreeAsync, cuMemFreeAsync, cuMemFreeAsync)             \
    X(MemPoolCreate, cuMemPoolCreate, cuMemPoolCreate)                                                             \
    X(MemAllocFromPoolAsync, cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync)                                     \
    X(ArrayCreate, cuArrayCreate_v2, cuArrayCreate) X(Array3DCreate, cuArray3DCreate_v2, cuArray3DCreate)          \
    X(ArrayDestroy, cuArrayDestroy, cuArrayDestroy)                                                                \
    X(MipmappedArrayCreate, cuMipmappedArrayCreate, cuMipmappedArrayCreate)                                        \
    X(MipmappedArrayDestroy, cuMipmappedArrayDestroy, cuMipmappedArrayDestroy) X(ModuleLoadData, cuModuleLoadData, cuModuleLoadData)          \
    X(ModuleGetFunction, cuModuleGetFunction, cuModuleGetFunction)                                                 \
    X(LaunchKernel, cuLaunchKernel, cuLaunchKernel) X(GetErrorName, cuGetErrorName, cuGetErrorName)

static void bind(const char *via)
{
    if (strcmp(via, "direct") == 0) {
#define DIRECT(field, sym, base) cu.field = (void *)&sym;
        ALL_FNS(DIRECT)
        return;
    }
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        fprintf(stderr, "vgpu_probe: dlopen libcuda.so.1: %s\n", dlerror());
        exit(1);
    }
    if (strcmp(via, "dlsym") == 0) {
#define DLSYM(field, sym, base) cu.field = dlsym(h, #sym);
        ALL_FNS(DLSYM)
        return;
    }
    if (strcmp(via, "procaddr") == 0) {
        CUresult (*gpa)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *) =
            (CUresult(*)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *))dlsym(
                h, "cuGetProcAddress_v2");
        if (!gpa) {
            fprintf(stderr, "vgpu_probe: no cuGetProcAddress_v2\n");
            exit(1);
        }
        CUdriverProcAddressQueryResult st;
#define PROCADDR(field, sym, base) gpa(#base, (void **)&cu.field, 13000, 0, &st);
        ALL_FNS(PROCADDR)
        return;
    }
    fprintf(stderr, "vgpu_probe: --via %s: use direct, dlsym or procaddr\n", via);
    exit(2);
}

/* ---- operations ---- */
static CUresult do_alloc(char kind, uint64_t bytes, uint64_t *key)
{
    CUdeviceptr p = 0;
    CUresult r;
    switch (kind) {
    case 'm':
        r = cu.MemAlloc(&p, bytes);
        break;
    case 'p': {
        size_t pitch;
        r = cu.MemAllocPitch(&p, &pitch, 4096, bytes / 4096, 4);
        break;
    }
    case 'g':
        r = cu.MemAllocManaged(&p, bytes, 1);
        break;
    case 'v': {
        CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                    .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = g_dev}};
        CUmemGenericAllocationHandle hnd = 0;
        r = cu.MemCreate(&hnd, bytes, &prop, 0);
        *key = hnd;
        return r;
    }
    case 'a':
        r = cu.MemAllocAsync(&p, bytes, NULL);
        break;
    case 'o':
        if (!g_pool) {
            CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                                    .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = g_dev}};
            if ((r = cu.MemPoolCreate(&g_pool, &props)) != CUDA_SUCCESS)
                return r;
        }
        r = cu.MemAllocFromPoolAsync(&p, bytes, g_pool, NULL);
        break;
    case 'r': {
        CUDA_ARRAY_DESCRIPTOR d = {.Width = 1024, .Height = bytes / 4096, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
        CUarray arr = NULL;
        r = cu.ArrayCreate(&arr, &d);
        *key = (uint64_t)(uintptr_t)arr;
        return r;
    }
    case '3': {
        CUDA_ARRAY3D_DESCRIPTOR d = {.Width = 1024, .Height = 16, .Depth = bytes / (4096 * 16),
                                     .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
        CUarray arr = NULL;
        r = cu.Array3DCreate(&arr, &d);
        *key = (uint64_t)(uintptr_t)arr;
        return r;
    }
    case 'i': {
        /* Two levels of 1024 x H floats: level 1 is a quarter of level 0, so
         * H = bytes / 5120 makes the whole array `bytes`. */
        CUDA_ARRAY3D_DESCRIPTOR d = {.Width = 1024, .Height = bytes / 5120, .Format = CU_AD_FORMAT_FLOAT,
                                     .NumChannels = 1};
        CUmipmappedArray arr = NULL;
        r = cu.MipmappedArrayCreate(&arr, &d, 2);
        *key = (uint64_t)(uintptr_t)arr;
        return r;
    }
    default:
        fprintf(stderr, "vgpu_probe: unknown kind\n");
        exit(2);
    }
    *key = p;
    return r;
}

static CUresult do_free(char kind, uint64_t key)
{
    switch (kind) {
    case 'v':
        return cu.MemRelease(key);
    case 'a':
    case 'o':
        return cu.MemFreeAsync(key, NULL);
    case 'r':
    case '3':
        return cu.ArrayDestroy((CUarray)(uintptr_t)key);
    case 'i':
        return cu.MipmappedArrayDestroy((CUmipmappedArray)(uintptr_t)key);
    default:
        return cu.MemFree(key);
    }
}

static char kind_code(const char *k)
{
    static const struct {
        const char *name;
        char code;
    } kinds[] = {{"mem", 'm'},   {"pitch", 'p'}, {"managed", 'g'}, {"vmm", 'v'},
                 {"async", 'a'}, {"pool", 'o'},  {"array", 'r'},   {"array3d", '3'}, {"mipmap", 'i'}};
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
        if (strcmp(k, kinds[i].name) == 0)
            return kinds[i].code;
    fprintf(stderr, "vgpu_probe: unknown kind %s\n", k);
    exit(2);
}

static void use_device(int ordinal)
{
    CUcontext ctx;
    CUresult r;
    if ((r = cu.DeviceGet(&g_dev, ordinal)) != CUDA_SUCCESS)
        die("cuDeviceGet", r);
    if ((r = cu.PrimaryCtxRetain(&ctx, g_dev)) != CUDA_SUCCESS)
        die("cuDevicePrimaryCtxRetain", r);
    if ((r = cu.CtxSetCurrent(ctx)) != CUDA_SUCCESS)
        die("cuCtxSetCurrent", r);
    g_pool = NULL;
}

static void op_info(void)
{
    size_t free = 0, total = 0, dev_total = 0;
    CUresult r = cu.MemGetInfo(&free, &total);
    CUresult r2 = cu.DeviceTotalMem(&dev_total, g_dev);
    printf("{\"op\":\"info\",\"device\":%d,\"result\":\"%s\",\"free\":%zu,\"total\":%zu,\"device_total\":%zu,"
           "\"device_total_result\":\"%s\"}\n",
           g_dev, errname(r), free, total, dev_total, errname(r2));
}

static void op_nvml(void)
{
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!h) {
        printf("{\"op\":\"nvml\",\"error\":\"no libnvidia-ml.so.1\"}\n");
        return;
    }
    nvmlReturn_t (*init)(void) = (nvmlReturn_t(*)(void))dlsym(h, "nvmlInit_v2");
    nvmlReturn_t (*count)(unsigned *) = (nvmlReturn_t(*)(unsigned *))dlsym(h, "nvmlDeviceGetCount_v2");
    nvmlReturn_t (*byidx)(unsigned, nvmlDevice_t *) =
        (nvmlReturn_t(*)(unsigned, nvmlDevice_t *))dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    nvmlReturn_t (*mem1)(nvmlDevice_t, nvmlMemory_t *) =
        (nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_t *))dlsym(h, "nvmlDeviceGetMemoryInfo");
    nvmlReturn_t (*mem2)(nvmlDevice_t, nvmlMemory_v2_t *) =
        (nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_v2_t *))dlsym(h, "nvmlDeviceGetMemoryInfo_v2");
    nvmlReturn_t r = init();
    unsigned n = 0;
    if (r == NVML_SUCCESS)
        count(&n);
    printf("{\"op\":\"nvml\",\"init\":%d,\"devices\":[", r);
    for (unsigned i = 0; i < n; i++) {
        nvmlDevice_t d;
        nvmlMemory_t m1 = {0};
        nvmlMemory_v2_t m2 = {.version = nvmlMemory_v2};
        byidx(i, &d);
        nvmlReturn_t r1 = mem1(d, &m1), r2 = mem2(d, &m2);
        printf("%s{\"r1\":%d,\"total\":%llu,\"used\":%llu,\"free\":%llu,\"r2\":%d,\"total2\":%llu,\"used2\":%llu,"
               "\"free2\":%llu}",
               i ? "," : "", r1, m1.total, m1.used, m1.free, r2, m2.total, m2.used, m2.free);
    }
    printf("]}\n");
}

int main(int argc, char **argv)
{
    const char *via = "direct";
    int device = 0, i = 1;
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (; i + 1 < argc && argv[i][0] == '-'; i += 2) {
        if (strcmp(argv[i], "--via") == 0)
            via = argv[i + 1];
        else if (strcmp(argv[i], "--device") == 0)
            device = atoi(argv[i + 1]);
    }
    bind(via);
    if (i < argc && strcmp(argv[i], "nvml") == 0 && argc == i + 1) {
        op_nvml(); /* NVML alone: no CUDA in this process */
        return 0;
    }
    CUresult r = cu.Init(0);
    printf("{\"op\":\"init\",\"result\":\"%s\"}\n", errname(r));
    if (r != CUDA_SUCCESS)
        return 3;
    use_device(device);
    for (; i < argc; i++) {
        char *op = argv[i], kind[16] = "";
        unsigned long long bytes = 0, n = 0;
        if (sscanf(op, "alloc:%15[^:]:%llu", kind, &bytes) == 2) {
            uint64_t key = 0;
            char k = kind_code(kind);
            r = do_alloc(k, bytes, &key);
            if (r == CUDA_SUCCESS)
                g_allocs[g_nallocs++] = (struct alloc){k, key};
            printf("{\"op\":\"alloc\",\"kind\":\"%s\",\"bytes\":%llu,\"result\":\"%s\"}\n", kind, bytes, errname(r));
        } else if (strcmp(op, "free") == 0 && g_nallocs > 0) {
            struct alloc a = g_allocs[--g_nallocs];
            printf("{\"op\":\"free\",\"result\":\"%s\"}\n", errname(do_free(a.kind, a.key)));
        } else if (strcmp(op, "freeall") == 0) {
            while (g_nallocs > 0) {
                struct alloc a = g_allocs[--g_nallocs];
                if ((r = do_free(a.kind, a.key)) != CUDA_SUCCESS)
                    die("free", r);
            }
            printf("{\"op\":\"freeall\"}\n");
        } else if (strcmp(op, "sync") == 0) {
            /* a sync observes stream-ordered frees: pools release what they keep then */
            printf("{\"op\":\"sync\",\"result\":\"%s\"}\n", errname(cu.CtxSynchronize()));
        } else if (sscanf(op, "fill:%15[^:]:%llu", kind, &bytes) == 2) {
            char k = kind_code(kind);
            unsigned count = 0;
            uint64_t key;
            while (g_nallocs < (int)(sizeof(g_allocs) / sizeof(g_allocs[0])) &&
                   (r = do_alloc(k, bytes, &key)) == CUDA_SUCCESS) {
                g_allocs[g_nallocs++] = (struct alloc){k, key};
                count++;
            }
            /* What one allocation really holds (a mipmap's levels do not add up to round sizes). */
            unsigned long long each = k == 'i' ? bytes / 5120 * 5120 : bytes;
            printf("{\"op\":\"fill\",\"kind\":\"%s\",\"count\":%u,\"bytes_each\":%llu,\"result\":\"%s\"}\n", kind,
                   count, each, errname(r));
        } else if (sscanf(op, "churn:%15[^:]:%llu:%llu", kind, &bytes, &n) == 3) {
            char k = kind_code(kind);
            uint64_t key;
            unsigned long long ok = 0, oom = 0;
            for (unsigned long long j = 0; j < n; j++) {
                r = do_alloc(k, bytes, &key);
                if (r == CUDA_SUCCESS) {
                    ok++;
                    do_free(k, key);
                } else if (r == CUDA_ERROR_OUT_OF_MEMORY) {
                    oom++;
                } else {
                    die("churn alloc", r);
                }
            }
            printf("{\"op\":\"churn\",\"ok\":%llu,\"oom\":%llu}\n", ok, oom);
        } else if (strcmp(op, "info") == 0) {
            op_info();
        } else if (strcmp(op, "count") == 0) {
            int c = -1;
            r = cu.DeviceGetCount(&c);
            printf("{\"op\":\"count\",\"result\":\"%s\",\"count\":%d}\n", errname(r), c);
        } else if (strcmp(op, "ctx:create") == 0) {
            r = cu.CtxCreate(&g_ctx_created, 0, g_dev);
            printf("{\"op\":\"ctx:create\",\"result\":\"%s\"}\n", errname(r));
        } else if (strcmp(op, "ctx:destroy") == 0) {
            r = cu.CtxDestroy(g_ctx_created);
            printf("{\"op\":\"ctx:destroy\",\"result\":\"%s\"}\n", errname(r));
        } else if (sscanf(op, "device:%llu", &n) == 1) {
            use_device((int)n);
            printf("{\"op\":\"device\",\"device\":%llu}\n", n);
        } else if (strcmp(op, "nvml") == 0) {
            op_nvml();
        } else if (strcmp(op, "hold") == 0) {
            printf("{\"op\":\"hold\",\"pid\":%d}\n", (int)getpid());
            for (;;)
                pause();
        } else if (sscanf(op, "sleep:%llu", &n) == 1) {
            usleep((useconds_t)(n * 1000));
        } else if (sscanf(op, "launch:%15[^:]:%llu", kind, &n) == 2) {
            /* N launches of KERNEL (simgpu: busy_<N>us occupies the engine N us), queued. */
            CUmodule mod;
            CUfunction f;
            static const char image[] = "simgpu";
            if ((r = cu.ModuleLoadData(&mod, image)) != CUDA_SUCCESS || (r = cu.ModuleGetFunction(&f, mod, kind)))
                die("module", r);
            for (unsigned long long j = 0; j < n; j++)
                if ((r = cu.LaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL)) != CUDA_SUCCESS)
                    die("launch", r);
            printf("{\"op\":\"launch\",\"kernel\":\"%s\",\"n\":%llu}\n", kind, n);
        } else if (sscanf(op, "bench_launch:%llu", &n) == 1) {
            /* bench_launch:N[:KERNEL]: N launches of KERNEL (default noop, 1 us on simgpu) */
            CUmodule mod;
            CUfunction f;
            static const char image[] = "simgpu";
            const char *kernel = strchr(op + strlen("bench_launch:"), ':');
            kernel = kernel ? kernel + 1 : "noop";
            if ((r = cu.ModuleLoadData(&mod, image)) != CUDA_SUCCESS || (r = cu.ModuleGetFunction(&f, mod, kernel)))
                die("module", r);
            /* Wall time per call, and this thread's CPU time per call (what a launch costs
             * the caller, without the time it waits for a full queue to drain). */
            struct timespec c0, c1;
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
            uint64_t t0 = now_ns();
            for (unsigned long long j = 0; j < n; j++)
                cu.LaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
            uint64_t wall = now_ns() - t0;
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
            double cpu = (double)(c1.tv_sec - c0.tv_sec) * 1e9 + (double)(c1.tv_nsec - c0.tv_nsec);
            printf("{\"op\":\"bench_launch\",\"n\":%llu,\"ns_per_call\":%.1f,\"cpu_ns_per_call\":%.1f}\n", n,
                   (double)wall / n, cpu / n);
        } else if (sscanf(op, "over_alloc:%llu:%llu", &bytes, &n) == 2) {
            /* over_alloc:BYTES:N: N tries at an allocation that must not fit; how many did */
            CUdeviceptr p;
            unsigned long long fit = 0;
            for (unsigned long long j = 0; j < n; j++) {
                if (cu.MemAlloc(&p, bytes) == CUDA_SUCCESS) {
                    fit++;
                    cu.MemFree(p);
                }
            }
            printf("{\"op\":\"over_alloc\",\"n\":%llu,\"fit\":%llu}\n", n, fit);
        } else if (sscanf(op, "bench_alloc:%llu:%llu", &bytes, &n) == 2) {
            CUdeviceptr p;
            uint64_t t0 = now_ns();
            for (unsigned long long j = 0; j < n; j++) {
                if ((r = cu.MemAlloc(&p, bytes)) != CUDA_SUCCESS)
                    die("bench alloc", r);
                cu.MemFree(p);
            }
            printf("{\"op\":\"bench_alloc\",\"n\":%llu,\"ns_per_pair\":%.1f}\n", n, (double)(now_ns() - t0) / n);
        } else {
            fprintf(stderr, "vgpu_probe: unknown operation %s\n", op);
            return 2;
        }
    }
    return 0;
}
