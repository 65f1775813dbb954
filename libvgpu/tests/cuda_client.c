/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cuda_client - a CUDA driver API client that tests drive from Python.
 *
 *   cuda_client [--via direct|dlsym|procaddr] [--device N] COMMAND [ARGS]
 *
 *   info                      devices: name, uuid, PCI id, total and free memory
 *   alloc PATH BYTES          allocate and free through PATH (mem pitch managed
 *                             vmm async pool array array3d host) and report
 *                             what cuMemGetInfo saw
 *   hold BYTES [PATH]         allocate, print, then sleep until killed
 *   launch N US [START_NS]    at CLOCK_MONOTONIC START_NS, launch N busy_<US>us
 *                             kernels on one stream and synchronise
 *   exercise                  copies, memset, streams, events, launches, graphs
 *   errors                    NULLs, bogus handles, wrong states -> result names
 *
 * --via chooses how entry points are found: linked symbols (direct),
 * dlopen("libcuda.so.1") + dlsym of the versioned names, or
 * cuGetProcAddress_v2 with base names and version 13000, the three ways real
 * applications use. Each command prints one JSON object on stdout and exits 0;
 * an unexpected failure prints one line on stderr and exits 1. Expected
 * failures (an OOM asked for) are results in the JSON, not errors.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "vgpu_cuda.h"

/* Entry points used: field, versioned symbol (dlsym), base name (procaddr). */
#define CU_FUNCS(X)                                                        \
    X(cuInit, "cuInit", "cuInit")                                          \
    X(cuDriverGetVersion, "cuDriverGetVersion", "cuDriverGetVersion")      \
    X(cuDeviceGetCount, "cuDeviceGetCount", "cuDeviceGetCount")            \
    X(cuDeviceGet, "cuDeviceGet", "cuDeviceGet")                           \
    X(cuDeviceGetName, "cuDeviceGetName", "cuDeviceGetName")               \
    X(cuDeviceGetUuid_v2, "cuDeviceGetUuid_v2", "cuDeviceGetUuid")         \
    X(cuDeviceTotalMem_v2, "cuDeviceTotalMem_v2", "cuDeviceTotalMem")      \
    X(cuDeviceGetAttribute, "cuDeviceGetAttribute", "cuDeviceGetAttribute") \
    X(cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId", "cuDeviceGetPCIBusId")   \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain") \
    X(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease") \
    X(cuCtxSetCurrent, "cuCtxSetCurrent", "cuCtxSetCurrent")               \
    X(cuCtxGetCurrent, "cuCtxGetCurrent", "cuCtxGetCurrent")               \
    X(cuCtxDestroy_v2, "cuCtxDestroy_v2", "cuCtxDestroy")                  \
    X(cuCtxPushCurrent_v2, "cuCtxPushCurrent_v2", "cuCtxPushCurrent")      \
    X(cuCtxPopCurrent_v2, "cuCtxPopCurrent_v2", "cuCtxPopCurrent")         \
    X(cuCtxSynchronize_v2, "cuCtxSynchronize_v2", "cuCtxSynchronize")      \
    X(cuCtxGetDevice_v2, "cuCtxGetDevice_v2", "cuCtxGetDevice")            \
    X(cuMemAlloc_v2, "cuMemAlloc_v2", "cuMemAlloc")                        \
    X(cuMemFree_v2, "cuMemFree_v2", "cuMemFree")                           \
    X(cuMemAllocPitch_v2, "cuMemAllocPitch_v2", "cuMemAllocPitch")         \
    X(cuMemAllocManaged, "cuMemAllocManaged", "cuMemAllocManaged")         \
    X(cuMemAllocHost_v2, "cuMemAllocHost_v2", "cuMemAllocHost")            \
    X(cuMemFreeHost, "cuMemFreeHost", "cuMemFreeHost")                     \
    X(cuMemGetInfo_v2, "cuMemGetInfo_v2", "cuMemGetInfo")                  \
    X(cuMemcpyHtoD_v2, "cuMemcpyHtoD_v2", "cuMemcpyHtoD")                  \
    X(cuMemcpyDtoH_v2, "cuMemcpyDtoH_v2", "cuMemcpyDtoH")                  \
    X(cuMemcpyDtoD_v2, "cuMemcpyDtoD_v2", "cuMemcpyDtoD")                  \
    X(cuMemsetD8_v2, "cuMemsetD8_v2", "cuMemsetD8")                        \
    X(cuMemCreate, "cuMemCreate", "cuMemCreate")                           \
    X(cuMemRelease, "cuMemRelease", "cuMemRelease")                        \
    X(cuMemAddressReserve, "cuMemAddressReserve", "cuMemAddressReserve")   \
    X(cuMemAddressFree, "cuMemAddressFree", "cuMemAddressFree")            \
    X(cuMemMap, "cuMemMap", "cuMemMap")                                    \
    X(cuMemUnmap, "cuMemUnmap", "cuMemUnmap")                              \
    X(cuMemSetAccess, "cuMemSetAccess", "cuMemSetAccess")                  \
    X(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity", "cuMemGetAllocationGranularity") \
    X(cuMemAllocAsync, "cuMemAllocAsync", "cuMemAllocAsync")               \
    X(cuMemFreeAsync, "cuMemFreeAsync", "cuMemFreeAsync")                  \
    X(cuMemPoolCreate, "cuMemPoolCreate", "cuMemPoolCreate")               \
    X(cuMemPoolDestroy, "cuMemPoolDestroy", "cuMemPoolDestroy")            \
    X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync") \
    X(cuMemPoolTrimTo, "cuMemPoolTrimTo", "cuMemPoolTrimTo")               \
    X(cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", "cuDeviceGetDefaultMemPool") \
    X(cuArrayCreate_v2, "cuArrayCreate_v2", "cuArrayCreate")               \
    X(cuArray3DCreate_v2, "cuArray3DCreate_v2", "cuArray3DCreate")         \
    X(cuArrayDestroy, "cuArrayDestroy", "cuArrayDestroy")                  \
    X(cuModuleLoadData, "cuModuleLoadData", "cuModuleLoadData")            \
    X(cuModuleLoad, "cuModuleLoad", "cuModuleLoad")                        \
    X(cuModuleGetFunction, "cuModuleGetFunction", "cuModuleGetFunction")   \
    X(cuModuleUnload, "cuModuleUnload", "cuModuleUnload")                  \
    X(cuLaunchKernel, "cuLaunchKernel", "cuLaunchKernel")                  \
    X(cuLaunchKernelEx, "cuLaunchKernelEx", "cuLaunchKernelEx")            \
    X(cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel") \
    X(cuStreamCreate, "cuStreamCreate", "cuStreamCreate")                  \
    X(cuStreamDestroy_v2, "cuStreamDestroy_v2", "cuStreamDestroy")         \
    X(cuStreamSynchronize, "cuStreamSynchronize", "cuStreamSynchronize")   \
    X(cuStreamQuery, "cuStreamQuery", "cuStreamQuery")                     \
    X(cuEventCreate, "cuEventCreate", "cuEventCreate")                     \
    X(cuEventRecord, "cuEventRecord", "cuEventRecord")                     \
    X(cuEventSynchronize, "cuEventSynchronize", "cuEventSynchronize")      \
    X(cuEventQuery, "cuEventQuery", "cuEventQuery")                        \
    X(cuEventElapsedTime_v2, "cuEventElapsedTime_v2", "cuEventElapsedTime") \
    X(cuEventDestroy_v2, "cuEventDestroy_v2", "cuEventDestroy")            \
    X(cuStreamBeginCapture_v2, "cuStreamBeginCapture_v2", "cuStreamBeginCapture") \
    X(cuStreamEndCapture, "cuStreamEndCapture", "cuStreamEndCapture")      \
    X(cuGraphCreate, "cuGraphCreate", "cuGraphCreate")                     \
    X(cuGraphAddKernelNode_v2, "cuGraphAddKernelNode_v2", "cuGraphAddKernelNode") \
    X(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", "cuGraphInstantiateWithFlags") \
    X(cuGraphLaunch, "cuGraphLaunch", "cuGraphLaunch")                     \
    X(cuGraphExecDestroy, "cuGraphExecDestroy", "cuGraphExecDestroy")      \
    X(cuGraphDestroy, "cuGraphDestroy", "cuGraphDestroy")                  \
    X(cuGetErrorName, "cuGetErrorName", "cuGetErrorName")                  \
    X(cuGetErrorString, "cuGetErrorString", "cuGetErrorString")

static struct {
#define FIELD(f, sym, base) __typeof__(f) *f;
    CU_FUNCS(FIELD)
#undef FIELD
} cu;

static const char *g_via = "direct";
static int g_dev_index;

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("cuda_client: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static const char *rname(CUresult r)
{
    static __thread char buf[32];
    const char *s = NULL;
    if (cu.cuGetErrorName && cu.cuGetErrorName(r, &s) == CUDA_SUCCESS && s)
        return s;
    snprintf(buf, sizeof(buf), "CUresult_%d", r);
    return buf;
}

#define CK(call)                                                                                   \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS)                                                                    \
            die("%s failed: %s", #call, rname(r_));                                                \
    } while (0)

static void resolve(void)
{
    if (strcmp(g_via, "direct") == 0) {
#define DIRECT(f, sym, base) cu.f = f;
        CU_FUNCS(DIRECT)
#undef DIRECT
    } else if (strcmp(g_via, "dlsym") == 0) {
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!h)
            die("dlopen libcuda.so.1: %s", dlerror());
#define DLSYM(f, sym, base)                                                                        \
    if (!(*(void **)&cu.f = dlsym(h, sym)))                                                        \
        die("dlsym %s: not found", sym);
        CU_FUNCS(DLSYM)
#undef DLSYM
    } else if (strcmp(g_via, "procaddr") == 0) {
        CUdriverProcAddressQueryResult st;
#define PROCADDR(f, sym, base)                                                                     \
    {                                                                                              \
        CUresult r_ = cuGetProcAddress_v2(base, (void **)&cu.f, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &st); \
        if (r_ != CUDA_SUCCESS || !cu.f)                                                           \
            die("cuGetProcAddress_v2(%s, 13000) = %d, status %d", base, r_, st);                    \
    }
        CU_FUNCS(PROCADDR)
#undef PROCADDR
    } else {
        die("--via must be direct, dlsym or procaddr, not \"%s\"", g_via);
    }
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static unsigned long long parse_u64(const char *s, const char *what)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s || *end)
        die("%s: \"%s\" is not a number", what, s);
    return v;
}

/* cuInit, device g_dev_index, its primary context made current. */
static CUdevice setup(CUcontext *ctx)
{
    CUdevice dev;
    CK(cu.cuInit(0));
    CK(cu.cuDeviceGet(&dev, g_dev_index));
    CK(cu.cuDevicePrimaryCtxRetain(ctx, dev));
    CK(cu.cuCtxSetCurrent(*ctx));
    return dev;
}

static size_t free_mem(void)
{
    size_t f, t;
    CK(cu.cuMemGetInfo_v2(&f, &t));
    return f;
}

/* ---- info ---- */
static int cmd_info(void)
{
    int n, ver;
    CK(cu.cuInit(0));
    CK(cu.cuDriverGetVersion(&ver));
    CK(cu.cuDeviceGetCount(&n));
    printf("{\"via\": \"%s\", \"driver_version\": %d, \"count\": %d, \"devices\": [", g_via, ver, n);
    for (int i = 0; i < n; i++) {
        CUdevice d;
        CUcontext c;
        char name[128], bus[32];
        CUuuid u;
        size_t total, fr, t2;
        int sms, ccmaj, ccmin, clock, warp;
        CK(cu.cuDeviceGet(&d, i));
        CK(cu.cuDeviceGetName(name, sizeof(name), d));
        CK(cu.cuDeviceGetUuid_v2(&u, d));
        CK(cu.cuDeviceTotalMem_v2(&total, d));
        CK(cu.cuDeviceGetPCIBusId(bus, sizeof(bus), d));
        CK(cu.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d));
        CK(cu.cuDeviceGetAttribute(&ccmaj, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d));
        CK(cu.cuDeviceGetAttribute(&ccmin, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d));
        CK(cu.cuDeviceGetAttribute(&clock, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, d));
        CK(cu.cuDeviceGetAttribute(&warp, CU_DEVICE_ATTRIBUTE_WARP_SIZE, d));
        CK(cu.cuDevicePrimaryCtxRetain(&c, d));
        CK(cu.cuCtxSetCurrent(c));
        CK(cu.cuMemGetInfo_v2(&fr, &t2));
        const unsigned char *b = (const unsigned char *)u.bytes;
        printf("%s{\"index\": %d, \"name\": \"%s\", \"uuid\": \"GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
               "%02x%02x%02x%02x%02x%02x\", \"pci_bus_id\": \"%s\", \"total\": %zu, \"free\": %zu, "
               "\"info_total\": %zu, \"sms\": %d, \"cc\": \"%d.%d\", \"clock_khz\": %d, \"warp\": %d}",
               i ? ", " : "", i, name, b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
               b[12], b[13], b[14], b[15], bus, total, fr, t2, sms, ccmaj, ccmin, clock, warp);
        CK(cu.cuCtxSetCurrent(NULL));
        CK(cu.cuDevicePrimaryCtxRelease_v2(d));
    }
    printf("]}\n");
    return 0;
}

/* ---- alloc ---- */

/* One allocation through `path`; *undo frees it. Returns the CUresult. */
struct held {
    const char *path;
    CUdeviceptr p;
    size_t size;
    CUmemGenericAllocationHandle h;
    CUmemoryPool pool;
    CUarray arr;
    CUstream stream;
};

static CUresult do_alloc(struct held *a, CUdevice dev)
{
    const char *path = a->path;
    size_t bytes = a->size;
    if (strcmp(path, "mem") == 0)
        return cu.cuMemAlloc_v2(&a->p, bytes);
    if (strcmp(path, "pitch") == 0) {
        size_t pitch;
        return cu.cuMemAllocPitch_v2(&a->p, &pitch, bytes, 1, 4);
    }
    if (strcmp(path, "managed") == 0)
        return cu.cuMemAllocManaged(&a->p, bytes, CU_MEM_ATTACH_GLOBAL);
    if (strcmp(path, "host") == 0)
        return cu.cuMemAllocHost_v2((void **)&a->p, bytes);
    if (strcmp(path, "async") == 0)
        return cu.cuMemAllocAsync(&a->p, bytes, NULL);
    if (strcmp(path, "pool") == 0) {
        CUmemPoolProps pp;
        memset(&pp, 0, sizeof(pp));
        pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        pp.location.id = dev;
        CK(cu.cuMemPoolCreate(&a->pool, &pp));
        CK(cu.cuStreamCreate(&a->stream, CU_STREAM_NON_BLOCKING));
        return cu.cuMemAllocFromPoolAsync(&a->p, bytes, a->pool, a->stream);
    }
    if (strcmp(path, "array") == 0) {
        CUDA_ARRAY_DESCRIPTOR d = {.Width = bytes, .Height = 1, .Format = CU_AD_FORMAT_UNSIGNED_INT8, .NumChannels = 1};
        return cu.cuArrayCreate_v2(&a->arr, &d);
    }
    if (strcmp(path, "array3d") == 0) {
        /* 4-byte texels, 4 channels: bytes must be a multiple of 16 for an exact size */
        CUDA_ARRAY3D_DESCRIPTOR d = {.Width = bytes / 16 ? bytes / 16 : 1, .Height = 1, .Depth = 1,
                                     .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 4};
        return cu.cuArray3DCreate_v2(&a->arr, &d);
    }
    if (strcmp(path, "vmm") == 0) {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof(prop));
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = dev;
        size_t gran;
        CK(cu.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        size_t size = (bytes + gran - 1) / gran * gran;
        CUresult r = cu.cuMemCreate(&a->h, size, &prop, 0);
        if (r != CUDA_SUCCESS)
            return r;
        a->size = size;
        CK(cu.cuMemAddressReserve(&a->p, size, 0, 0, 0));
        CK(cu.cuMemMap(a->p, size, 0, a->h, 0));
        CUmemAccessDesc acc = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        CK(cu.cuMemSetAccess(a->p, size, &acc, 1));
        /* The mapping is real memory: write through it and read back. */
        CK(cu.cuMemsetD8_v2(a->p, 0x5a, 4096));
        unsigned char b[16];
        CK(cu.cuMemcpyDtoH_v2(b, a->p + 100, sizeof(b)));
        if (b[0] != 0x5a || b[15] != 0x5a)
            die("vmm: read back 0x%02x, expected 0x5a", b[0]);
        return CUDA_SUCCESS;
    }
    die("alloc: unknown path \"%s\" (mem pitch managed host async pool array array3d vmm)", path);
    return CUDA_ERROR_INVALID_VALUE;
}

static void do_free(struct held *a, CUresult allocated)
{
    const char *path = a->path;
    if (allocated == CUDA_SUCCESS) {
        if (!strcmp(path, "mem") || !strcmp(path, "pitch") || !strcmp(path, "managed"))
            CK(cu.cuMemFree_v2(a->p));
        else if (!strcmp(path, "host"))
            CK(cu.cuMemFreeHost((void *)(uintptr_t)a->p));
        else if (!strcmp(path, "async")) {
            CK(cu.cuMemFreeAsync(a->p, NULL));
            CK(cu.cuCtxSynchronize_v2(NULL));
        } else if (!strcmp(path, "pool")) {
            CK(cu.cuMemFreeAsync(a->p, a->stream));
            CK(cu.cuStreamSynchronize(a->stream));
            CK(cu.cuMemPoolTrimTo(a->pool, 0));
        } else if (!strcmp(path, "array") || !strcmp(path, "array3d"))
            CK(cu.cuArrayDestroy(a->arr));
        else if (!strcmp(path, "vmm")) {
            CK(cu.cuMemUnmap(a->p, a->size));
            CK(cu.cuMemAddressFree(a->p, a->size));
            CK(cu.cuMemRelease(a->h));
        }
    }
    if (a->stream)
        CK(cu.cuStreamDestroy_v2(a->stream));
    if (a->pool)
        CK(cu.cuMemPoolDestroy(a->pool));
}

static int cmd_alloc(const char *path, size_t bytes)
{
    CUcontext ctx;
    CUdevice dev = setup(&ctx);
    struct held a = {.path = path, .size = bytes};
    size_t before = free_mem();
    CUresult r = do_alloc(&a, dev);
    size_t during = free_mem();
    do_free(&a, r);
    size_t after = free_mem();
    printf("{\"via\": \"%s\", \"path\": \"%s\", \"bytes\": %zu, \"result\": \"%s\", \"free_before\": %zu, "
           "\"free_during\": %zu, \"free_after\": %zu, \"charged\": %lld}\n",
           g_via, path, bytes, rname(r), before, during, after, (long long)before - (long long)during);
    return 0;
}

static int cmd_hold(const char *path, size_t bytes)
{
    CUcontext ctx;
    CUdevice dev = setup(&ctx);
    struct held a = {.path = path, .size = bytes};
    CUresult r = do_alloc(&a, dev);
    printf("{\"via\": \"%s\", \"path\": \"%s\", \"held\": %zu, \"result\": \"%s\", \"free\": %zu, \"pid\": %d}\n",
           g_via, path, bytes, rname(r), free_mem(), (int)getpid());
    fflush(stdout);
    if (r != CUDA_SUCCESS)
        return 0;
    for (;;)
        pause();
}

/* ---- launch ---- */
static CUfunction get_kernel(CUmodule *mod, const char *name)
{
    static const char image[] = "simgpu module image";
    CUfunction f;
    if (!*mod)
        CK(cu.cuModuleLoadData(mod, image));
    CK(cu.cuModuleGetFunction(&f, *mod, name));
    return f;
}

static CUresult launch1(CUfunction f, CUstream s)
{
    return cu.cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL);
}

static int cmd_launch(unsigned long long n, unsigned long long us, unsigned long long start_at)
{
    CUcontext ctx;
    CUmodule mod = NULL;
    CUstream s;
    char name[64];
    setup(&ctx);
    snprintf(name, sizeof(name), "busy_%lluus", us);
    CUfunction f = get_kernel(&mod, name);
    CK(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    if (start_at) {
        struct timespec ts = {.tv_sec = (time_t)(start_at / 1000000000ull), .tv_nsec = (long)(start_at % 1000000000ull)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
            ;
    }
    uint64_t t0 = now_ns();
    for (unsigned long long i = 0; i < n; i++)
        CK(launch1(f, s));
    uint64_t t_launched = now_ns();
    CK(cu.cuStreamSynchronize(s));
    uint64_t t1 = now_ns();
    CK(cu.cuStreamDestroy_v2(s));
    CK(cu.cuModuleUnload(mod));
    printf("{\"via\": \"%s\", \"n\": %llu, \"us\": %llu, \"start_ns\": %" PRIu64 ", \"end_ns\": %" PRIu64
           ", \"launch_s\": %.6f, \"elapsed_s\": %.6f}\n",
           g_via, n, us, t0, t1, (t_launched - t0) / 1e9, (t1 - t0) / 1e9);
    return 0;
}

/* ---- exercise ---- */
static float time_events(CUevent a, CUevent b)
{
    float ms;
    CK(cu.cuEventSynchronize(b));
    CK(cu.cuEventElapsedTime_v2(&ms, a, b));
    return ms;
}

static int cmd_exercise(void)
{
    CUcontext ctx, cur;
    CUdevice dev = setup(&ctx), cdev;
    CK(cu.cuCtxGetCurrent(&cur));
    CK(cu.cuCtxGetDevice_v2(&cdev, NULL));
    if (cur != ctx || cdev != dev)
        die("current context/device mismatch");

    /* copies and memset */
    enum { N = 1 << 20 };
    unsigned char *h = malloc(N), *back = malloc(N);
    if (!h || !back)
        die("malloc");
    for (int i = 0; i < N; i++)
        h[i] = (unsigned char)(i * 7 + 3);
    CUdeviceptr d1, d2;
    CK(cu.cuMemAlloc_v2(&d1, N));
    CK(cu.cuMemAlloc_v2(&d2, N));
    CK(cu.cuMemcpyHtoD_v2(d1, h, N));
    CK(cu.cuMemcpyDtoD_v2(d2, d1, N));
    CK(cu.cuMemcpyDtoH_v2(back, d2, N));
    int copy_ok = memcmp(h, back, N) == 0;
    CK(cu.cuMemsetD8_v2(d1, 0xab, N));
    CK(cu.cuMemcpyDtoH_v2(back, d1, N));
    int memset_ok = back[0] == 0xab && back[N - 1] == 0xab && back[N / 2] == 0xab;
    void *pinned;
    CK(cu.cuMemAllocHost_v2(&pinned, 4096));
    CK(cu.cuMemcpyDtoH_v2(pinned, d1, 4096));
    int pinned_ok = ((unsigned char *)pinned)[4095] == 0xab;
    CK(cu.cuMemFreeHost(pinned));

    /* streams, events, launches */
    CUmodule mod = NULL;
    CUfunction k1 = get_kernel(&mod, "busy_1000us"), k20 = get_kernel(&mod, "busy_20000us"),
               k2 = get_kernel(&mod, "busy_2000us");
    CUstream s;
    CUevent e0, e1;
    CK(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CK(cu.cuEventCreate(&e0, CU_EVENT_DEFAULT));
    CK(cu.cuEventCreate(&e1, CU_EVENT_DEFAULT));
    CK(cu.cuEventRecord(e0, s));
    CK(launch1(k1, s));
    CK(cu.cuEventRecord(e1, s));
    float kernel_ms = time_events(e0, e1);

    uint64_t t0 = now_ns();
    CK(launch1(k20, s));
    double launch_ms = (now_ns() - t0) / 1e6;
    CUresult q_pending = cu.cuStreamQuery(s);
    CK(cu.cuEventRecord(e1, s));
    CUresult eq_pending = cu.cuEventQuery(e1);
    CK(cu.cuStreamSynchronize(s));
    double sync_ms = (now_ns() - t0) / 1e6;
    CUresult q_done = cu.cuStreamQuery(s);
    CUresult eq_done = cu.cuEventQuery(e1);

    /* cuLaunchKernelEx and cooperative launches cost engine time too */
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = 128;
    cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.hStream = s;
    CK(cu.cuEventRecord(e0, s));
    CK(cu.cuLaunchKernelEx(&cfg, k1, NULL, NULL));
    CK(cu.cuLaunchCooperativeKernel(k1, 1, 1, 1, 64, 1, 1, 0, s, NULL));
    CK(cu.cuEventRecord(e1, s));
    float ex_coop_ms = time_events(e0, e1);

    /* default stream and context synchronisation */
    t0 = now_ns();
    CK(launch1(k2, NULL));
    CK(cu.cuCtxSynchronize_v2(NULL));
    double ctx_sync_ms = (now_ns() - t0) / 1e6;

    /* stream capture: recorded, not run, then launched as a graph */
    CUgraph g;
    CUgraphExec ge;
    t0 = now_ns();
    CK(cu.cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    for (int i = 0; i < 5; i++)
        CK(launch1(k1, s));
    CK(cu.cuStreamEndCapture(s, &g));
    CK(cu.cuStreamSynchronize(s));
    double capture_ms = (now_ns() - t0) / 1e6;
    CK(cu.cuGraphInstantiateWithFlags(&ge, g, 0));
    CK(cu.cuEventRecord(e0, s));
    CK(cu.cuGraphLaunch(ge, s));
    CK(cu.cuEventRecord(e1, s));
    float captured_graph_ms = time_events(e0, e1);
    CK(cu.cuGraphExecDestroy(ge));
    CK(cu.cuGraphDestroy(g));

    /* an explicit graph: two dependent kernel nodes */
    CUgraphNode n1, n2;
    CUDA_KERNEL_NODE_PARAMS_v2 kp;
    memset(&kp, 0, sizeof(kp));
    kp.func = k2;
    kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
    kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1;
    CK(cu.cuGraphCreate(&g, 0));
    CK(cu.cuGraphAddKernelNode_v2(&n1, g, NULL, 0, &kp));
    CK(cu.cuGraphAddKernelNode_v2(&n2, g, &n1, 1, &kp));
    CK(cu.cuGraphInstantiateWithFlags(&ge, g, 0));
    CK(cu.cuEventRecord(e0, s));
    CK(cu.cuGraphLaunch(ge, s));
    CK(cu.cuEventRecord(e1, s));
    float explicit_graph_ms = time_events(e0, e1);
    CK(cu.cuGraphExecDestroy(ge));
    CK(cu.cuGraphDestroy(g));

    CK(cu.cuEventDestroy_v2(e0));
    CK(cu.cuEventDestroy_v2(e1));
    CK(cu.cuStreamDestroy_v2(s));
    CK(cu.cuModuleUnload(mod));
    CK(cu.cuMemFree_v2(d1));
    CK(cu.cuMemFree_v2(d2));
    CK(cu.cuDevicePrimaryCtxRelease_v2(dev));
    free(h);
    free(back);
    printf("{\"via\": \"%s\", \"copy_ok\": %s, \"memset_ok\": %s, \"pinned_ok\": %s, \"kernel_ms\": %.4f, "
           "\"launch_ms\": %.4f, \"sync_ms\": %.4f, \"query_pending\": \"%s\", \"event_query_pending\": \"%s\", "
           "\"query_done\": \"%s\", \"event_query_done\": \"%s\", \"ex_coop_ms\": %.4f, \"ctx_sync_ms\": %.4f, "
           "\"capture_ms\": %.4f, \"captured_graph_ms\": %.4f, \"explicit_graph_ms\": %.4f}\n",
           g_via, copy_ok ? "true" : "false", memset_ok ? "true" : "false", pinned_ok ? "true" : "false",
           kernel_ms, launch_ms, sync_ms, rname(q_pending), rname(eq_pending), rname(q_done), rname(eq_done),
           ex_coop_ms, ctx_sync_ms, capture_ms, captured_graph_ms, explicit_graph_ms);
    return 0;
}

/* ---- errors ---- */
static int g_nerr;
static void report(const char *key, CUresult r)
{
    printf("%s\"%s\": \"%s\"", g_nerr++ ? ", " : "", key, rname(r));
}

static int cmd_errors(void)
{
    /* Not a handle of anything: readable memory, so a driver that dereferenced it would not crash either. */
    static uint64_t bogus[16] = {0x5a5a5a5a5a5a5a5aull};
    void *bp = bogus;
    int n;
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p;
    printf("{\"via\": \"%s\", ", g_via);
    report("count_before_init", cu.cuDeviceGetCount(&n));
    report("alloc_before_init", cu.cuMemAlloc_v2(&p, 16));
    report("init_bad_flags", cu.cuInit(1));
    CK(cu.cuInit(0));
    report("count_null", cu.cuDeviceGetCount(NULL));
    report("device_get_99", cu.cuDeviceGet(&dev, 99));
    report("name_bad_device", cu.cuDeviceGetName((char[8]){0}, 8, 99));
    report("attribute_out_of_range", cu.cuDeviceGetAttribute(&n, 100000, 0));
    report("alloc_no_context", cu.cuMemAlloc_v2(&p, 16));
    report("meminfo_no_context", cu.cuMemGetInfo_v2(&(size_t){0}, &(size_t){0}));
    report("ctx_sync_no_context", cu.cuCtxSynchronize_v2(NULL));
    report("pop_empty", cu.cuCtxPopCurrent_v2(&ctx));
    report("set_current_bogus", cu.cuCtxSetCurrent((CUcontext)bp));
    report("ctx_destroy_bogus", cu.cuCtxDestroy_v2((CUcontext)bp));
    setup(&ctx);
    CK(cu.cuDeviceGet(&dev, g_dev_index));
    report("alloc_null", cu.cuMemAlloc_v2(NULL, 16));
    report("alloc_zero", cu.cuMemAlloc_v2(&p, 0));
    report("free_unknown", cu.cuMemFree_v2((CUdeviceptr)(uintptr_t)bp));
    CK(cu.cuMemAlloc_v2(&p, 4096));
    CK(cu.cuMemFree_v2(p));
    report("free_twice", cu.cuMemFree_v2(p));
    report("free_host_unknown", cu.cuMemFreeHost(bp));
    report("memcpy_unknown_dst", cu.cuMemcpyHtoD_v2((CUdeviceptr)(uintptr_t)bp, bogus, 8));
    report("memcpy_null_src", cu.cuMemcpyDtoH_v2(NULL, (CUdeviceptr)(uintptr_t)bp, 8));
    report("meminfo_null", cu.cuMemGetInfo_v2(NULL, NULL));
    report("pitch_bad_elem", cu.cuMemAllocPitch_v2(&p, &(size_t){0}, 100, 10, 3));
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    CUmemGenericAllocationHandle mh;
    report("mem_create_unaligned", cu.cuMemCreate(&mh, 12345, &prop, 0));
    report("mem_create_null_prop", cu.cuMemCreate(&mh, 2 << 20, NULL, 0));
    report("mem_release_bogus", cu.cuMemRelease((CUmemGenericAllocationHandle)(uintptr_t)bp));
    report("granularity_null", cu.cuMemGetAllocationGranularity(NULL, &prop, 0));
    report("map_unreserved", cu.cuMemMap((CUdeviceptr)(uintptr_t)bp & ~(CUdeviceptr)0x1fffff, 2 << 20, 0, 0, 0));
    CUmemoryPool pool;
    CK(cu.cuDeviceGetDefaultMemPool(&pool, dev));
    report("pool_destroy_default", cu.cuMemPoolDestroy(pool));
    report("pool_destroy_bogus", cu.cuMemPoolDestroy((CUmemoryPool)bp));
    report("pool_alloc_bogus", cu.cuMemAllocFromPoolAsync(&p, 16, (CUmemoryPool)bp, NULL));
    report("array_null_desc", cu.cuArrayCreate_v2((CUarray *)&p, NULL));
    report("array_destroy_bogus", cu.cuArrayDestroy((CUarray)bp));
    CUmodule mod;
    CUfunction f;
    report("module_load_missing", cu.cuModuleLoad(&mod, "/nonexistent/simgpu.cubin"));
    report("module_load_null", cu.cuModuleLoadData(&mod, NULL));
    report("get_function_bogus_module", cu.cuModuleGetFunction(&f, (CUmodule)bp, "busy_1us"));
    CK(cu.cuModuleLoadData(&mod, "image"));
    report("get_function_null_name", cu.cuModuleGetFunction(&f, mod, NULL));
    CK(cu.cuModuleGetFunction(&f, mod, "busy_10us"));
    report("launch_bogus_func", cu.cuLaunchKernel((CUfunction)bp, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
    report("launch_zero_grid", cu.cuLaunchKernel(f, 0, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
    report("launch_too_many_threads", cu.cuLaunchKernel(f, 1, 1, 1, 1025, 1, 1, 0, NULL, NULL, NULL));
    report("launch_bogus_stream", cu.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, (CUstream)bp, NULL, NULL));
    report("launch_ex_null_config", cu.cuLaunchKernelEx(NULL, f, NULL, NULL));
    CUstream s;
    CK(cu.cuStreamCreate(&s, 0));
    CK(cu.cuStreamDestroy_v2(s));
    report("stream_destroy_twice", cu.cuStreamDestroy_v2(s));
    report("stream_sync_destroyed", cu.cuStreamSynchronize(s));
    report("stream_query_bogus", cu.cuStreamQuery((CUstream)bp));
    report("stream_create_null", cu.cuStreamCreate(NULL, 0));
    CUevent e0, e1;
    CK(cu.cuEventCreate(&e0, 0));
    CK(cu.cuEventCreate(&e1, 0));
    float ms;
    report("elapsed_unrecorded", cu.cuEventElapsedTime_v2(&ms, e0, e1));
    report("elapsed_null", cu.cuEventElapsedTime_v2(NULL, e0, e1));
    report("event_record_bogus", cu.cuEventRecord((CUevent)bp, NULL));
    report("event_query_unrecorded", cu.cuEventQuery(e0));
    CK(cu.cuEventDestroy_v2(e0));
    CK(cu.cuEventDestroy_v2(e1));
    report("event_destroy_twice", cu.cuEventDestroy_v2(e0));
    CUgraph g;
    CK(cu.cuStreamCreate(&s, 0));
    report("end_capture_not_capturing", cu.cuStreamEndCapture(s, &g));
    report("capture_legacy_stream", cu.cuStreamBeginCapture_v2(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CK(cu.cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    report("capture_twice", cu.cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    report("sync_while_capturing", cu.cuStreamSynchronize(s));
    g = (CUgraph)bp;
    report("end_capture_invalidated", cu.cuStreamEndCapture(s, &g));
    printf(", \"invalidated_graph_null\": %s", g ? "false" : "true");
    CK(cu.cuStreamDestroy_v2(s));
    report("graph_launch_bogus", cu.cuGraphLaunch((CUgraphExec)bp, NULL));
    report("graph_instantiate_bogus", cu.cuGraphInstantiateWithFlags((CUgraphExec *)&p, (CUgraph)bp, 0));
    report("graph_add_node_null_params", cu.cuGraphAddKernelNode_v2((CUgraphNode *)&p, (CUgraph)bp, NULL, 0, NULL));
    CK(cu.cuModuleUnload(mod));
    report("module_unload_twice", cu.cuModuleUnload(mod));
    report("launch_unloaded_func", cu.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
    const char *str = NULL;
    report("error_name_bogus", cu.cuGetErrorName(123456, &str));
    report("error_string_null", cu.cuGetErrorString(CUDA_SUCCESS, NULL));
    CUdriverProcAddressQueryResult st = -1;
    void *fn = bp;
    CUresult pr = cuGetProcAddress_v2("cuNoSuchEntryPoint", &fn, 13000, 0, &st);
    report("procaddr_missing", pr);
    printf(", \"procaddr_missing_status\": %d, \"procaddr_missing_pfn_null\": %s", st, fn ? "false" : "true");
    report("procaddr_null_symbol", cuGetProcAddress_v2(NULL, &fn, 13000, 0, &st));
    st = -1;
    pr = cuGetProcAddress_v2("cuMemCreate", &fn, 10000, 0, &st);
    report("procaddr_too_old", pr);
    printf(", \"procaddr_too_old_status\": %d", st);
    pr = cuGetProcAddress("cuMemAlloc", &fn, 13000, 0);
    report("procaddr_v1", pr);
    printf(", \"procaddr_v1_found\": %s", fn ? "true" : "false");
    CK(cu.cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &str));
    printf(", \"oom_name\": \"%s\"", str);
    CK(cu.cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &str));
    printf(", \"oom_string\": \"%s\"}\n", str);
    return 0;
}

static void usage(void)
{
    fprintf(stderr, "usage: cuda_client [--via direct|dlsym|procaddr] [--device N] "
                    "info | alloc PATH BYTES | hold BYTES [PATH] | launch N US [START_NS] | exercise | errors\n");
    exit(2);
}

int main(int argc, char **argv)
{
    int i = 1;
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
        if (!strcmp(argv[i], "--via") && i + 1 < argc)
            g_via = argv[++i];
        else if (!strcmp(argv[i], "--device") && i + 1 < argc)
            g_dev_index = (int)parse_u64(argv[++i], "--device");
        else
            usage();
    }
    if (i >= argc)
        usage();
    resolve();
    const char *cmd = argv[i++];
    int nargs = argc - i;
    char **a = argv + i;
    if (!strcmp(cmd, "info") && nargs == 0)
        return cmd_info();
    if (!strcmp(cmd, "alloc") && nargs == 2)
        return cmd_alloc(a[0], (size_t)parse_u64(a[1], "BYTES"));
    if (!strcmp(cmd, "hold") && (nargs == 1 || nargs == 2))
        return cmd_hold(nargs == 2 ? a[1] : "mem", (size_t)parse_u64(a[0], "BYTES"));
    if (!strcmp(cmd, "launch") && (nargs == 2 || nargs == 3))
        return cmd_launch(parse_u64(a[0], "N"), parse_u64(a[1], "US"), nargs == 3 ? parse_u64(a[2], "START_NS") : 0);
    if (!strcmp(cmd, "exercise") && nargs == 0)
        return cmd_exercise();
    if (!strcmp(cmd, "errors") && nargs == 0)
        return cmd_errors();
    usage();
    return 2;
}
