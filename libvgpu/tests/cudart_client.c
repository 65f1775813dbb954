/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cudart_client - a CUDA runtime API client (NVIDIA's libcudart, dlopen()ed from the
 * path given) for libvgpu's runtime tests: tests/libvgpu/test_cudart.py, on simgpu and,
 * through tests/gpu/run.sh, on a real GPU. Each argument after the library is one
 * operation; each prints one JSON line. It declares the few runtime entry points it
 * calls itself (the runtime API's C ABI), so it builds with gcc alone.
 *
 *   cudart_client LIBCUDART OP...
 *   OP: init             device count, driver and runtime versions
 *       info             cudaMemGetInfo
 *       malloc:BYTES     cudaMalloc (kept until exit)
 *       fill:BYTES       cudaMalloc BYTES at a time until refused (kept)
 *       freeall          cudaFree everything kept
 *       pool:BYTES:N     the device's default pool, release threshold raised to the
 *                        maximum; N rounds of cudaMallocAsync BYTES at a time until
 *                        refused, then cudaFreeAsync all and sync; the most one round
 *                        got, and what the pool holds after (ReservedMemCurrent)
 *       launch:US:MS     launch busy_<US>us kernels through cudaLaunchKernel for 0.5 s
 *                        and then MS ms (two in flight); how many ran in the MS ms
 *                        and the exact wall time they took
 *
 * The kernel is PTX that the driver compiles: `busy_<US>us(u64 ns)` reads %globaltimer
 * until ns have passed. On simgpu, which runs no code, the name alone makes it US
 * microseconds of engine time.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int cudaError_t;
typedef void *cudaStream_t, *cudaMemPool_t, *cudaLibrary_t, *cudaKernel_t;
typedef struct {
    unsigned x, y, z;
} dim3;
enum { RT_MEM_POOL_ATTR_RELEASE_THRESHOLD = 4, RT_MEM_POOL_ATTR_RESERVED_MEM_CURRENT = 5 };

#define FN(name, args) cudaError_t(*name) args
static struct {
    FN(GetDeviceCount, (int *));
    FN(DriverGetVersion, (int *));
    FN(RuntimeGetVersion, (int *));
    FN(SetDevice, (int));
    FN(MemGetInfo, (size_t *, size_t *));
    FN(Malloc, (void **, size_t));
    FN(Free, (void *));
    FN(DeviceGetDefaultMemPool, (cudaMemPool_t *, int));
    FN(MemPoolSetAttribute, (cudaMemPool_t, int, void *));
    FN(MemPoolGetAttribute, (cudaMemPool_t, int, void *));
    FN(MallocAsync, (void **, size_t, cudaStream_t));
    FN(FreeAsync, (void *, cudaStream_t));
    FN(StreamCreate, (cudaStream_t *));
    FN(StreamSynchronize, (cudaStream_t));
    FN(LibraryLoadData, (cudaLibrary_t *, const void *, int *, void **, unsigned, int *, void **, unsigned));
    FN(LibraryGetKernel, (cudaKernel_t *, cudaLibrary_t, const char *));
    FN(LaunchKernel, (const void *, dim3, dim3, void **, size_t, cudaStream_t));
    const char *(*GetErrorName)(cudaError_t);
} rt;

static const char *err_name(cudaError_t e)
{
    const char *n = rt.GetErrorName ? rt.GetErrorName(e) : NULL;
    return n ? n : "?";
}

static void *must(void *h, const char *name)
{
    void *p = dlsym(h, name);
    if (!p) {
        printf("{\"op\":\"load\",\"error\":\"%s not found\"}\n", name);
        exit(2);
    }
    return p;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#define MAX_KEPT 65536
static void *g_kept[MAX_KEPT]; /* what malloc/fill allocated, freed by freeall */
static unsigned g_nkept;

static void op_fill(size_t chunk, int once)
{
    size_t got = 0;
    cudaError_t rc = 0;
    while (g_nkept < MAX_KEPT) {
        void *p = NULL;
        rc = rt.Malloc(&p, chunk);
        if (rc != 0)
            break;
        g_kept[g_nkept++] = p;
        got += chunk;
        if (once)
            break;
    }
    printf("{\"op\":\"%s\",\"bytes\":%zu,\"allocated\":%zu,\"rc\":%d,\"result\":\"%s\"}\n", once ? "malloc" : "fill",
           chunk, got, rc, err_name(rc));
}

static void op_pool(size_t chunk, unsigned rounds)
{
    cudaMemPool_t pool;
    cudaStream_t s;
    cudaError_t rc = rt.DeviceGetDefaultMemPool(&pool, 0);
    uint64_t thr = UINT64_MAX, reserved = 0;
    if (rc == 0)
        rc = rt.MemPoolSetAttribute(pool, RT_MEM_POOL_ATTR_RELEASE_THRESHOLD, &thr);
    if (rc == 0)
        rc = rt.StreamCreate(&s);
    if (rc != 0) {
        printf("{\"op\":\"pool\",\"setup_rc\":%d,\"result\":\"%s\"}\n", rc, err_name(rc));
        return;
    }
    static void *ptr[MAX_KEPT];
    size_t most = 0;
    cudaError_t last = 0;
    for (unsigned r = 0; r < rounds; r++) {
        unsigned n = 0;
        while (n < MAX_KEPT && (last = rt.MallocAsync(&ptr[n], chunk, s)) == 0)
            n++;
        if ((size_t)n * chunk > most)
            most = (size_t)n * chunk;
        for (unsigned i = 0; i < n; i++)
            rt.FreeAsync(ptr[i], s);
        rt.StreamSynchronize(s);
    }
    cudaError_t arc = rt.MemPoolGetAttribute(pool, RT_MEM_POOL_ATTR_RESERVED_MEM_CURRENT, &reserved);
    printf("{\"op\":\"pool\",\"chunk\":%zu,\"rounds\":%u,\"most\":%zu,\"rc\":%d,\"result\":\"%s\","
           "\"reserved\":%llu,\"reserved_rc\":%d}\n",
           chunk, rounds, most, last, err_name(last), (unsigned long long)reserved, arc);
}

static const char PTX_FMT[] = ".version 7.0\n"
                              ".target sm_52\n"
                              ".address_size 64\n"
                              ".visible .entry %s(.param .u64 ns)\n"
                              "{\n"
                              "  .reg .pred %%p;\n"
                              "  .reg .u64 %%n, %%t0, %%t1, %%d;\n"
                              "  ld.param.u64 %%n, [ns];\n"
                              "  mov.u64 %%t0, %%globaltimer;\n"
                              "SPIN:\n"
                              "  mov.u64 %%t1, %%globaltimer;\n"
                              "  sub.u64 %%d, %%t1, %%t0;\n"
                              "  setp.lt.u64 %%p, %%d, %%n;\n"
                              "  @%%p bra SPIN;\n"
                              "  ret;\n"
                              "}\n";

#define WARM_MS 500ull

static void op_launch(unsigned us, unsigned ms)
{
    char name[64], ptx[sizeof(PTX_FMT) + 64];
    snprintf(name, sizeof(name), "busy_%uus", us);
    snprintf(ptx, sizeof(ptx), PTX_FMT, name);
    cudaLibrary_t lib;
    cudaKernel_t k;
    cudaStream_t s;
    cudaError_t rc = rt.LibraryLoadData(&lib, ptx, NULL, NULL, 0, NULL, NULL, 0);
    if (rc == 0)
        rc = rt.LibraryGetKernel(&k, lib, name);
    if (rc == 0)
        rc = rt.StreamCreate(&s);
    if (rc != 0) {
        printf("{\"op\":\"launch\",\"setup_rc\":%d,\"result\":\"%s\"}\n", rc, err_name(rc));
        return;
    }
    uint64_t ns = (uint64_t)us * 1000u;
    void *args[] = {&ns};
    dim3 one = {1, 1, 1};
    /* Counted from WARM_MS on (the first token, the first launches' set-up left out). */
    unsigned long n = 0, n0 = 0;
    uint64_t t0 = now_ns(), warm = t0 + WARM_MS * 1000000ull, end = warm + (uint64_t)ms * 1000000u, tw = 0;
    while (rc == 0 && now_ns() < end) {
        rc = rt.LaunchKernel(k, one, one, args, 0, s);
        if (rc == 0 && ++n % 2 == 0) /* two in flight: the GPU never waits for the host */
            rc = rt.StreamSynchronize(s);
        if (!tw && now_ns() >= warm) {
            if (rc == 0)
                rc = rt.StreamSynchronize(s);
            tw = now_ns();
            n0 = n;
        }
    }
    if (rc == 0)
        rc = rt.StreamSynchronize(s);
    uint64_t wall = now_ns() - tw;
    printf("{\"op\":\"launch\",\"us\":%u,\"launches\":%lu,\"wall_ns\":%llu,\"rc\":%d,\"result\":\"%s\"}\n", us,
           n - n0, (unsigned long long)wall, rc, err_name(rc));
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: cudart_client LIBCUDART OP...\n");
        return 2;
    }
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("{\"op\":\"load\",\"error\":\"%s\"}\n", dlerror());
        return 2;
    }
    *(void **)&rt.GetErrorName = must(h, "cudaGetErrorName");
    *(void **)&rt.GetDeviceCount = must(h, "cudaGetDeviceCount");
    *(void **)&rt.DriverGetVersion = must(h, "cudaDriverGetVersion");
    *(void **)&rt.RuntimeGetVersion = must(h, "cudaRuntimeGetVersion");
    *(void **)&rt.SetDevice = must(h, "cudaSetDevice");
    *(void **)&rt.MemGetInfo = must(h, "cudaMemGetInfo");
    *(void **)&rt.Malloc = must(h, "cudaMalloc");
    *(void **)&rt.Free = must(h, "cudaFree");
    *(void **)&rt.DeviceGetDefaultMemPool = must(h, "cudaDeviceGetDefaultMemPool");
    *(void **)&rt.MemPoolSetAttribute = must(h, "cudaMemPoolSetAttribute");
    *(void **)&rt.MemPoolGetAttribute = must(h, "cudaMemPoolGetAttribute");
    *(void **)&rt.MallocAsync = must(h, "cudaMallocAsync");
    *(void **)&rt.FreeAsync = must(h, "cudaFreeAsync");
    *(void **)&rt.StreamCreate = must(h, "cudaStreamCreate");
    *(void **)&rt.StreamSynchronize = must(h, "cudaStreamSynchronize");
    *(void **)&rt.LibraryLoadData = must(h, "cudaLibraryLoadData");
    *(void **)&rt.LibraryGetKernel = must(h, "cudaLibraryGetKernel");
    *(void **)&rt.LaunchKernel = must(h, "cudaLaunchKernel");

    for (int i = 2; i < argc; i++) {
        const char *op = argv[i];
        unsigned long long a = 0, b = 0;
        if (strcmp(op, "init") == 0) {
            int n = -1, dv = -1, rv = -1;
            cudaError_t rc = rt.GetDeviceCount(&n);
            rt.DriverGetVersion(&dv);
            rt.RuntimeGetVersion(&rv);
            printf("{\"op\":\"init\",\"rc\":%d,\"result\":\"%s\",\"count\":%d,\"driver\":%d,\"runtime\":%d}\n", rc,
                   err_name(rc), n, dv, rv);
            if (rc != 0)
                return 1; /* nothing else can run */
        } else if (strcmp(op, "info") == 0) {
            size_t free_b = 0, total = 0;
            cudaError_t rc = rt.MemGetInfo(&free_b, &total);
            printf("{\"op\":\"info\",\"rc\":%d,\"result\":\"%s\",\"free\":%zu,\"total\":%zu}\n", rc, err_name(rc),
                   free_b, total);
        } else if (sscanf(op, "malloc:%llu", &a) == 1) {
            op_fill((size_t)a, 1);
        } else if (sscanf(op, "fill:%llu", &a) == 1 && a > 0) {
            op_fill((size_t)a, 0);
        } else if (strcmp(op, "freeall") == 0) {
            cudaError_t rc = 0;
            while (g_nkept > 0 && rc == 0)
                rc = rt.Free(g_kept[--g_nkept]);
            printf("{\"op\":\"freeall\",\"rc\":%d,\"result\":\"%s\"}\n", rc, err_name(rc));
        } else if (sscanf(op, "pool:%llu:%llu", &a, &b) == 2 && a > 0) {
            op_pool((size_t)a, (unsigned)b);
        } else if (sscanf(op, "launch:%llu:%llu", &a, &b) == 2 && a > 0) {
            op_launch((unsigned)a, (unsigned)b);
        } else {
            fprintf(stderr, "cudart_client: unknown operation %s\n", op);
            return 2;
        }
        fflush(stdout);
    }
    return 0;
}
