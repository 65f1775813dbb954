/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gpucheck.c - what the GPU itself does, measured without libvgpu (issue 24, part 1), and
 * the loads that measure compute shares under libvgpu on the GPU's own timeline (part 2).
 *
 *   gpucheck [OUTDIR]            (tests/gpu/gpucheck.sh builds and runs it)
 *   gpucheck load ... / gpucheck shares ... / gpucheck now
 *                                (tests/gpu/gpucheck-shares.sh; see load_main, shares_main)
 *   gpucheck coverage OUTDIR / meminfo OUTDIR / memory OUTDIR --limit-mib L ...
 *                                (parts 3 and 4: PASS/FAIL rows; see coverage_main,
 *                                meminfo_main, memory_main; tests/gpu/gpucheck-all.sh runs all)
 *
 * gcc alone, no CUDA toolkit: the few driver API types and entry points used are
 * declared here and taken from dlopen("libcuda.so.1"). The kernels are a PTX string at
 * .version 7.0 / .target sm_52, which any CUDA 12 or 13 driver JIT-compiles for its GPU.
 *
 * spin(ns, rec, gap) runs one thread that reads %globaltimer until it has run for ns and
 * writes its start and end stamps to rec. When two consecutive reads are more than gap
 * apart the thread was not running (another context had the GPU): the hole does not
 * count as running (a kernel's work is fixed, as simgpu's busy_<N>us kernels are), and
 * the first 61 holes are written too. Every process's kernels so land on one GPU-side timeline:
 * timeslices and the gaps between them are read off the merged stamps.
 *
 * Sections (each prints rows of the table and fills one object of OUTDIR/gpucheck.json):
 *   clock  %globaltimer <-> CLOCK_MONOTONIC offset, bracketed from below (a kernel
 *          publishes the timer into mapped host memory, the host reads it) and from
 *          above (the host publishes CLOCK_MONOTONIC, a kernel reads it), and by
 *          idle-stream round trips;
 *   a      launch, event record, event query, stream query, idle-stream sync costs;
 *   b      how late a waiting call returns after the kernel's end stamp;
 *   c      the queue depth at which cuLaunchKernel blocks;
 *   d      cuEventElapsedTime's resolution, the timer's tick, when an event recorded on
 *          an idle stream completes;
 *   e      two greedy processes (timeslice, switch gap), one process with two streams
 *          (overlap), a light process beside a greedy one (its wait), 20 ms kernels
 *          beside 200 us ones (preemption inside a kernel).
 *
 * On simgpu (LD_LIBRARY_PATH=build/simgpu) the spin kernel runs no code, so no stamps
 * come back: the program notices (a probe kernel writes nothing), says "host-only", and
 * uses simgpu's busy_<N>us kernels with host-side measurements only. Should simgpu
 * some day honour spin's duration and stamps, the probe passes and the GPU mode runs.
 *
 * Exit status: 0 when every section ran, 1 when one failed, 2 when nothing could run.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- the driver ABI used (values as in cuda.h) ---- */
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef int CUjit_option;

typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUarray_st *CUarray;
typedef struct {
    int type; /* CU_MEM_LOCATION_TYPE_DEVICE */
    int id;
} CUmemLocation;
typedef struct {
    int type;                 /* CU_MEM_ALLOCATION_TYPE_PINNED */
    int requestedHandleTypes; /* none */
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;
typedef struct {
    CUmemLocation location;
    int flags; /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE */
} CUmemAccessDesc;
typedef struct {
    size_t Width, Height;
    int Format; /* CU_AD_FORMAT_FLOAT */
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CU_MEM_ALLOCATION_TYPE_PINNED 1
#define CU_MEM_LOCATION_TYPE_DEVICE 1
#define CU_MEM_ACCESS_FLAGS_PROT_READWRITE 3
#define CU_MEMPOOL_ATTR_RELEASE_THRESHOLD 4
#define CU_AD_FORMAT_FLOAT 0x20
#define CU_MEM_ATTACH_GLOBAL 0x1
#define CU_GET_PROC_ADDRESS_DEFAULT 0
#define CU_STREAM_CAPTURE_MODE_GLOBAL 0
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2
#define CUDA_ERROR_NOT_READY 600
#define CU_CTX_SCHED_AUTO 0x00
#define CU_CTX_SCHED_SPIN 0x01
#define CU_CTX_SCHED_YIELD 0x02
#define CU_CTX_SCHED_BLOCKING_SYNC 0x04
#define CU_STREAM_NON_BLOCKING 0x1
#define CU_EVENT_DEFAULT 0x0
#define CU_EVENT_BLOCKING_SYNC 0x1
#define CU_EVENT_DISABLE_TIMING 0x2
#define CU_MEMHOSTALLOC_DEVICEMAP 0x02
#define CU_JIT_ERROR_LOG_BUFFER 5
#define CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES 6
#define CU_DEVICE_ATTRIBUTE_CLOCK_RATE 13
#define CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16
#define CU_DEVICE_ATTRIBUTE_COMPUTE_MODE 20
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76

#define CU_REQUIRED(X)                                                                                                \
    X(cuInit, (unsigned int))                                                                                         \
    X(cuDriverGetVersion, (int *))                                                                                    \
    X(cuDeviceGet, (CUdevice *, int))                                                                                 \
    X(cuDeviceGetCount, (int *))                                                                                      \
    X(cuDeviceGetName, (char *, int, CUdevice))                                                                       \
    X(cuDeviceGetAttribute, (int *, int, CUdevice))                                                                   \
    X(cuDeviceTotalMem_v2, (size_t *, CUdevice))                                                                      \
    X(cuCtxSetCurrent, (CUcontext))                                                                                   \
    X(cuCtxDestroy_v2, (CUcontext))                                                                                   \
    X(cuCtxSynchronize, (void))                                                                                       \
    X(cuModuleLoadDataEx, (CUmodule *, const void *, unsigned int, CUjit_option *, void **))                          \
    X(cuModuleGetFunction, (CUfunction *, CUmodule, const char *))                                                    \
    X(cuLaunchKernel, (CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,              \
                       unsigned int, unsigned int, CUstream, void **, void **))                                       \
    X(cuStreamCreate, (CUstream *, unsigned int))                                                                     \
    X(cuStreamSynchronize, (CUstream))                                                                                \
    X(cuStreamQuery, (CUstream))                                                                                      \
    X(cuEventCreate, (CUevent *, unsigned int))                                                                       \
    X(cuEventRecord, (CUevent, CUstream))                                                                             \
    X(cuEventQuery, (CUevent))                                                                                        \
    X(cuEventSynchronize, (CUevent))                                                                                  \
    X(cuMemAlloc_v2, (CUdeviceptr *, size_t))                                                                         \
    X(cuMemsetD8_v2, (CUdeviceptr, unsigned char, size_t))                                                            \
    X(cuMemcpyDtoH_v2, (void *, CUdeviceptr, size_t))                                                                 \
    X(cuGetErrorString, (CUresult, const char **))
/* Looked up too, but the program copes without them. */
#define CU_OPTIONAL(X)                                                                                                \
    X(cuCtxCreate_v2, (CUcontext *, unsigned int, CUdevice))                                                          \
    X(cuCtxCreate_v4, (CUcontext *, void *, unsigned int, CUdevice))                                                  \
    X(cuEventElapsedTime, (float *, CUevent, CUevent))                                                                \
    X(cuEventElapsedTime_v2, (float *, CUevent, CUevent))                                                             \
    X(cuMemHostAlloc, (void **, size_t, unsigned int))                                                                \
    X(cuMemHostGetDevicePointer_v2, (CUdeviceptr *, void *, unsigned int))                                            \
    X(cuGetErrorName, (CUresult, const char **))                                                                       \
    MEM_OPTIONAL(X)
/* The coverage and memory checks (issue 24, parts 3 and 4). */
#define MEM_OPTIONAL(X)                                                                                               \
    X(cuGetProcAddress, (const char *, void **, int, unsigned long long))                                             \
    X(cuGetProcAddress_v2, (const char *, void **, int, unsigned long long, int *))                                   \
    X(cuMemGetInfo_v2, (size_t *, size_t *))                                                                          \
    X(cuMemFree_v2, (CUdeviceptr))                                                                                    \
    X(cuMemAllocManaged, (CUdeviceptr *, size_t, unsigned int))                                                       \
    X(cuMemGetAllocationGranularity, (size_t *, const CUmemAllocationProp *, int))                                    \
    X(cuMemCreate, (unsigned long long *, size_t, const CUmemAllocationProp *, unsigned long long))                   \
    X(cuMemRelease, (unsigned long long))                                                                             \
    X(cuMemAddressReserve, (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long))                          \
    X(cuMemAddressFree, (CUdeviceptr, size_t))                                                                        \
    X(cuMemMap, (CUdeviceptr, size_t, size_t, unsigned long long, unsigned long long))                                \
    X(cuMemUnmap, (CUdeviceptr, size_t))                                                                              \
    X(cuMemSetAccess, (CUdeviceptr, size_t, const CUmemAccessDesc *, size_t))                                         \
    X(cuDeviceGetDefaultMemPool, (CUmemoryPool *, CUdevice))                                                          \
    X(cuMemPoolSetAttribute, (CUmemoryPool, int, void *))                                                             \
    X(cuMemPoolTrimTo, (CUmemoryPool, size_t))                                                                        \
    X(cuMemAllocAsync, (CUdeviceptr *, size_t, CUstream))                                                             \
    X(cuMemFreeAsync, (CUdeviceptr, CUstream))                                                                        \
    X(cuArrayCreate_v2, (CUarray *, const CUDA_ARRAY_DESCRIPTOR *))                                                   \
    X(cuArrayDestroy, (CUarray))                                                                                      \
    X(cuStreamBeginCapture_v2, (CUstream, int))                                                                       \
    X(cuStreamEndCapture, (CUstream, CUgraph *))                                                                      \
    X(cuGraphInstantiateWithFlags, (CUgraphExec *, CUgraph, unsigned long long))                                      \
    X(cuGraphLaunch, (CUgraphExec, CUstream))                                                                         \
    X(cuGraphExecDestroy, (CUgraphExec))                                                                              \
    X(cuGraphDestroy, (CUgraph))

#define DECLARE(name, args) static CUresult(*name) args;
CU_REQUIRED(DECLARE)
CU_OPTIONAL(DECLARE)
#undef DECLARE

/* ---- the kernels ---- */
/* rec: 128 u64 per kernel: start, end, holes, hole ns, smallest timer step, largest
 * timer step, then up to 61 holes as (last read before, first read after). */
#define REC_WORDS 128
#define REC_BYTES (REC_WORDS * 8)
#define R_START 0
#define R_END 1
#define R_NGAP 2
#define R_GAPNS 3
#define R_MINSTEP 4
#define R_MAXSTEP 5
#define R_GAP0 6
#define MAX_GAPS 61 /* the 61 in spin's PTX */

static const char PTX[] =
    ".version 7.0\n"
    ".target sm_52\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry spin(.param .u64 spin_ns, .param .u64 spin_rec, .param .u64 spin_gap)\n"
    "{\n"
    "  .reg .pred %p<8>;\n"
    "  .reg .b64 %rd<24>;\n"
    "  ld.param.u64 %rd1, [spin_ns];\n"
    "  ld.param.u64 %rd2, [spin_rec];\n"
    "  ld.param.u64 %rd3, [spin_gap];\n"
    "  setp.eq.u64 %p1, %rd2, 0;\n"
    "  cvta.to.global.u64 %rd11, %rd2;\n"
    "  mov.u64 %rd4, %globaltimer;\n"
    "  add.u64 %rd5, %rd4, %rd1;\n"
    "  mov.u64 %rd6, %rd4;\n"
    "  mov.u64 %rd7, 0;\n"
    "  mov.u64 %rd8, 0;\n"
    "  mov.u64 %rd9, -1;\n"
    "  mov.u64 %rd10, 0;\n"
    "  mov.u64 %rd12, %rd4;\n"
    "$S_loop:\n"
    "  setp.ge.u64 %p2, %rd12, %rd5;\n"
    "  @%p2 bra $S_done;\n"
    "  mov.u64 %rd12, %globaltimer;\n"
    "  sub.u64 %rd13, %rd12, %rd6;\n"
    "  setp.eq.u64 %p3, %rd13, 0;\n"
    "  @%p3 bra $S_loop;\n"
    "  mov.u64 %rd6, %rd12;\n"
    "  min.u64 %rd9, %rd9, %rd13;\n"
    "  max.u64 %rd10, %rd10, %rd13;\n"
    "  setp.le.u64 %p4, %rd13, %rd3;\n"
    "  @%p4 bra $S_loop;\n"
    "  add.u64 %rd5, %rd5, %rd13;\n"
    "  setp.ge.u64 %p5, %rd7, 61;\n"
    "  or.pred %p6, %p1, %p5;\n"
    "  @%p6 bra $S_count;\n"
    "  shl.b64 %rd14, %rd7, 4;\n"
    "  add.u64 %rd15, %rd11, %rd14;\n"
    "  sub.u64 %rd16, %rd12, %rd13;\n"
    "  st.global.u64 [%rd15+48], %rd16;\n"
    "  st.global.u64 [%rd15+56], %rd12;\n"
    "$S_count:\n"
    "  add.u64 %rd7, %rd7, 1;\n"
    "  add.u64 %rd8, %rd8, %rd13;\n"
    "  bra.uni $S_loop;\n"
    "$S_done:\n"
    "  @%p1 bra $S_ret;\n"
    "  st.global.u64 [%rd11], %rd4;\n"
    "  st.global.u64 [%rd11+8], %rd12;\n"
    "  st.global.u64 [%rd11+16], %rd7;\n"
    "  st.global.u64 [%rd11+24], %rd8;\n"
    "  st.global.u64 [%rd11+32], %rd9;\n"
    "  st.global.u64 [%rd11+40], %rd10;\n"
    "$S_ret:\n"
    "  ret;\n"
    "}\n"
    "\n"
    /* gtpub(buf, ns): keeps writing %globaltimer into mapped host memory for ns. */
    ".visible .entry gtpub(.param .u64 gtpub_buf, .param .u64 gtpub_ns)\n"
    "{\n"
    "  .reg .pred %p<2>;\n"
    "  .reg .b64 %rd<8>;\n"
    "  ld.param.u64 %rd1, [gtpub_buf];\n"
    "  ld.param.u64 %rd2, [gtpub_ns];\n"
    "  cvta.to.global.u64 %rd3, %rd1;\n"
    "  mov.u64 %rd4, %globaltimer;\n"
    "  add.u64 %rd5, %rd4, %rd2;\n"
    "$P_loop:\n"
    "  mov.u64 %rd6, %globaltimer;\n"
    "  st.volatile.global.u64 [%rd3], %rd6;\n"
    "  membar.sys;\n"
    "  setp.lt.u64 %p1, %rd6, %rd5;\n"
    "  @%p1 bra $P_loop;\n"
    "  ret;\n"
    "}\n"
    "\n"
    /* gtecho(host, out, ns, max): for ns, whenever the u64 at host changes, writes
     * (new value, %globaltimer read after it arrived) to out[1 + 2i]; out[0] = count. */
    ".visible .entry gtecho(.param .u64 gtecho_host, .param .u64 gtecho_out, .param .u64 gtecho_ns,\n"
    "                       .param .u64 gtecho_max)\n"
    "{\n"
    "  .reg .pred %p<4>;\n"
    "  .reg .b64 %rd<16>;\n"
    "  ld.param.u64 %rd1, [gtecho_host];\n"
    "  ld.param.u64 %rd2, [gtecho_out];\n"
    "  ld.param.u64 %rd3, [gtecho_ns];\n"
    "  ld.param.u64 %rd4, [gtecho_max];\n"
    "  cvta.to.global.u64 %rd1, %rd1;\n"
    "  cvta.to.global.u64 %rd2, %rd2;\n"
    "  mov.u64 %rd5, %globaltimer;\n"
    "  add.u64 %rd6, %rd5, %rd3;\n"
    "  ld.volatile.global.u64 %rd7, [%rd1];\n"
    "  mov.u64 %rd8, 0;\n"
    "$E_loop:\n"
    "  ld.volatile.global.u64 %rd9, [%rd1];\n"
    "  setp.ne.u64 %p1, %rd9, %rd7;\n"
    "  @%p1 bra $E_new;\n"
    "  mov.u64 %rd10, %globaltimer;\n"
    "  setp.lt.u64 %p2, %rd10, %rd6;\n"
    "  @%p2 bra $E_loop;\n"
    "  bra.uni $E_done;\n"
    "$E_new:\n"
    "  mov.u64 %rd10, %globaltimer;\n"
    "  mov.u64 %rd7, %rd9;\n"
    "  setp.ge.u64 %p3, %rd8, %rd4;\n"
    "  @%p3 bra $E_chk;\n"
    "  shl.b64 %rd11, %rd8, 4;\n"
    "  add.u64 %rd12, %rd2, %rd11;\n"
    "  st.global.u64 [%rd12+16], %rd9;\n"
    "  st.global.u64 [%rd12+24], %rd10;\n"
    "  add.u64 %rd8, %rd8, 1;\n"
    "$E_chk:\n"
    "  setp.lt.u64 %p2, %rd10, %rd6;\n"
    "  @%p2 bra $E_loop;\n"
    "$E_done:\n"
    "  st.global.u64 [%rd2], %rd8;\n"
    "  ret;\n"
    "}\n";

/* ---- state ---- */
static const char *g_outdir = "gpucheck-out";
static const char *g_outname = "gpucheck"; /* OUTDIR/<name>.json: gpucheck, coverage, memory, meminfo */
static char g_libpath[PATH_MAX] = "?";
static CUdevice g_dev;
static int g_devidx;
static int g_stamps;             /* 1: spin writes stamps (a GPU); 0: host-only (simgpu) */
static int g_sim;                /* the device's name says SimGPU */
static uint64_t g_gap_ns = 4000; /* a timer step above this is a hole in a kernel's run */
static int64_t g_off;            /* %globaltimer - CLOCK_MONOTONIC, ns */
static int g_off_known;
static double g_off_halfwidth;   /* half the width of the offset's bracket, ns */
static int g_failures;
static FILE *g_table;

static uint64_t mono(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static uint64_t realtime(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static void sleep_until(uint64_t t)
{
    struct timespec ts = {(time_t)(t / 1000000000ull), (long)(t % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

/* ---- JSON, built as the run goes and rewritten after every section ---- */
static char *jb;
static size_t jlen, jcap;
static int jdepth;
static int jfirst[32] = {1}; /* the top level has no comma before its object */
static char jcloser[32];

static void jput(const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int n = vsnprintf(jb ? jb + jlen : NULL, jb ? jcap - jlen : 0, fmt, ap);
        va_end(ap);
        if (n < 0)
            return;
        if (jb && jlen + (size_t)n < jcap) {
            jlen += (size_t)n;
            return;
        }
        size_t cap = (jcap ? jcap * 2 : 65536) + (size_t)n;
        char *nb = realloc(jb, cap);
        if (!nb)
            return;
        jb = nb;
        jcap = cap;
    }
}

static void jstrlit(const char *s)
{
    jput("\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            jput("\\%c", c);
        else if (c < 0x20)
            jput("\\u%04x", c);
        else
            jput("%c", c);
    }
    jput("\"");
}

static void jkey(const char *k)
{
    if (!jfirst[jdepth])
        jput(",");
    jfirst[jdepth] = 0;
    if (k) {
        jstrlit(k);
        jput(":");
    }
}

static void jopen(const char *k, char c)
{
    jkey(k);
    jput("%c", c);
    jdepth++;
    jfirst[jdepth] = 1;
    jcloser[jdepth] = c == '{' ? '}' : ']';
}

static void jclose(void)
{
    jput("%c", jcloser[jdepth]);
    jdepth--;
}

static void jnum(const char *k, double v)
{
    jkey(k);
    if (isfinite(v))
        jput("%.6g", v);
    else
        jput("null");
}

static void jint(const char *k, long long v)
{
    jkey(k);
    jput("%lld", v);
}

static void jstr(const char *k, const char *v)
{
    jkey(k);
    jstrlit(v);
}

static void jbool(const char *k, int v)
{
    jkey(k);
    jput(v ? "true" : "false");
}

static void json_flush(void)
{
    char path[PATH_MAX], tmp[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s.json", g_outdir, g_outname);
    snprintf(tmp, sizeof tmp, "%s/.%s.json.tmp", g_outdir, g_outname);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return;
    fwrite(jb, 1, jlen, f);
    for (int d = jdepth; d >= 1; d--)
        fputc(jcloser[d], f);
    fputc('\n', f);
    if (fclose(f) == 0)
        rename(tmp, path);
}

/* ---- errors ---- */
static char g_errors[8192];

static const char *cu_errstr(CUresult r)
{
    const char *s = NULL;
    if (cuGetErrorString && cuGetErrorString(r, &s) == CUDA_SUCCESS && s)
        return s;
    return "unknown error";
}

static void note_error(const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "gpucheck: %s\n", line);
    size_t n = strlen(g_errors);
    if (n + strlen(line) + 2 < sizeof g_errors)
        snprintf(g_errors + n, sizeof g_errors - n, "%s\n", line);
}

static void cu_fail(const char *call, CUresult r, int line)
{
    const char *name = NULL;
    if (cuGetErrorName)
        cuGetErrorName(r, &name);
    note_error("line %d: %s -> %d %s (%s)", line, call, r, name ? name : "", cu_errstr(r));
}

#define CK(call)                                                                                                      \
    do {                                                                                                              \
        CUresult r_ = (call);                                                                                         \
        if (r_ != CUDA_SUCCESS) {                                                                                     \
            cu_fail(#call, r_, __LINE__);                                                                             \
            return -1;                                                                                                \
        }                                                                                                             \
    } while (0)

#define CKQ(call) /* a query: CUDA_ERROR_NOT_READY is an answer */                                                    \
    do {                                                                                                              \
        CUresult r_ = (call);                                                                                         \
        if (r_ != CUDA_SUCCESS && r_ != CUDA_ERROR_NOT_READY) {                                                       \
            cu_fail(#call, r_, __LINE__);                                                                             \
            return -1;                                                                                                \
        }                                                                                                             \
    } while (0)

/* ---- statistics and the table ---- */
struct st {
    int n;
    double min, p10, p50, p90, p99, max, mean;
};

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct_sorted(const double *v, int n, double p)
{
    if (n <= 0)
        return NAN;
    double idx = p * (n - 1);
    int i = (int)idx;
    if (i >= n - 1)
        return v[n - 1];
    return v[i] + (idx - i) * (v[i + 1] - v[i]);
}

static struct st stats(const double *v, int n)
{
    struct st s = {0, NAN, NAN, NAN, NAN, NAN, NAN, NAN};
    if (n <= 0)
        return s;
    double *c = malloc(sizeof(double) * (size_t)n);
    if (!c)
        return s;
    memcpy(c, v, sizeof(double) * (size_t)n);
    qsort(c, (size_t)n, sizeof(double), cmp_d);
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += c[i];
    s.n = n;
    s.min = c[0];
    s.max = c[n - 1];
    s.p10 = pct_sorted(c, n, 0.10);
    s.p50 = pct_sorted(c, n, 0.50);
    s.p90 = pct_sorted(c, n, 0.90);
    s.p99 = pct_sorted(c, n, 0.99);
    s.mean = sum / n;
    free(c);
    return s;
}

static void out(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    if (g_table) {
        va_start(ap, fmt);
        vfprintf(g_table, fmt, ap);
        va_end(ap);
        fflush(g_table);
    }
}

static void fmtnum(char *b, size_t n, double v)
{
    if (!isfinite(v))
        snprintf(b, n, "-");
    else if (fabs(v) >= 1e6)
        snprintf(b, n, "%.4g", v);
    else if (fabs(v) >= 100)
        snprintf(b, n, "%.0f", v);
    else if (fabs(v) >= 10)
        snprintf(b, n, "%.1f", v);
    else
        snprintf(b, n, "%.2f", v);
}

static void table_head(const char *title)
{
    out("\n== %s\n", title);
    out("%-54s %9s %9s %9s %9s %6s  %s\n", "", "p50", "p99", "min", "max", "n", "unit");
}

/* A distribution: one row, one JSON object {p50, p99, ...}. v is in ns; scale divides. */
static void metric(const char *key, const char *label, const double *v, int n, double scale, const char *unit)
{
    double *w = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    for (int i = 0; i < n; i++)
        w[i] = v[i] / scale;
    struct st s = stats(w, n);
    free(w);
    char a[32], b[32], c[32], d[32];
    fmtnum(a, sizeof a, s.p50);
    fmtnum(b, sizeof b, s.p99);
    fmtnum(c, sizeof c, s.min);
    fmtnum(d, sizeof d, s.max);
    out("%-54s %9s %9s %9s %9s %6d  %s\n", label, a, b, c, d, s.n, unit);
    jopen(key, '{');
    jnum("p10", s.p10);
    jnum("p50", s.p50);
    jnum("p90", s.p90);
    jnum("p99", s.p99);
    jnum("min", s.min);
    jnum("max", s.max);
    jnum("mean", s.mean);
    jint("n", s.n);
    jstr("unit", unit);
    jclose();
}

/* One number: a row with the value in the p50 column. */
static void value(const char *key, const char *label, double v, const char *unit)
{
    char a[32];
    fmtnum(a, sizeof a, v);
    out("%-54s %9s %9s %9s %9s %6s  %s\n", label, a, "", "", "", "", unit);
    jnum(key, v);
}

static void note(const char *key, const char *label, const char *text)
{
    out("%-54s %s\n", label, text);
    if (key)
        jstr(key, text);
}

/* ---- driver, contexts, kernels ---- */
static void *g_cuda; /* the dlopen()ed libcuda.so.1 */
static int load_driver(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    g_cuda = h;
    if (!h) {
        fprintf(stderr, "gpucheck: dlopen(libcuda.so.1): %s\n", dlerror());
        return -1;
    }
    int missing = 0;
#define LOAD(name, args)                                                                                              \
    if (!(*(void **)&name = dlsym(h, #name))) {                                                                       \
        fprintf(stderr, "gpucheck: libcuda.so.1 lacks %s\n", #name);                                                  \
        missing = 1;                                                                                                  \
    }
    CU_REQUIRED(LOAD)
#undef LOAD
#define LOAD_OPT(name, args) *(void **)&name = dlsym(h, #name);
    CU_OPTIONAL(LOAD_OPT)
#undef LOAD_OPT
    if (!cuCtxCreate_v2 && !cuCtxCreate_v4) {
        fprintf(stderr, "gpucheck: libcuda.so.1 has neither cuCtxCreate_v2 nor cuCtxCreate_v4\n");
        missing = 1;
    }
    if (!cuEventElapsedTime)
        cuEventElapsedTime = cuEventElapsedTime_v2;
    Dl_info di;
    if (dladdr(*(void **)&cuInit, &di) && di.dli_fname)
        snprintf(g_libpath, sizeof g_libpath, "%s", di.dli_fname);
    return missing ? -1 : 0;
}

struct busyfn {
    unsigned us;
    CUfunction f;
};

struct gctx {
    CUcontext ctx;
    CUmodule mod;
    CUfunction spin, gtpub, gtecho;
    CUstream s;
    struct busyfn busy[32];
    int nbusy;
};

static int ctx_open(struct gctx *g, unsigned flags)
{
    memset(g, 0, sizeof *g);
    if (cuCtxCreate_v2)
        CK(cuCtxCreate_v2(&g->ctx, flags, g_dev));
    else
        CK(cuCtxCreate_v4(&g->ctx, NULL, flags, g_dev));
    CK(cuCtxSetCurrent(g->ctx));
    char log[8192] = "";
    CUjit_option opt[2] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *val[2] = {log, (void *)(uintptr_t)sizeof log};
    CUresult r = cuModuleLoadDataEx(&g->mod, PTX, 2, opt, val);
    if (r != CUDA_SUCCESS) {
        cu_fail("cuModuleLoadDataEx(PTX)", r, __LINE__);
        if (log[0])
            fprintf(stderr, "gpucheck: JIT log: %s\n", log);
        return -1;
    }
    CK(cuModuleGetFunction(&g->spin, g->mod, "spin"));
    if (cuModuleGetFunction(&g->gtpub, g->mod, "gtpub") != CUDA_SUCCESS)
        g->gtpub = NULL;
    if (cuModuleGetFunction(&g->gtecho, g->mod, "gtecho") != CUDA_SUCCESS)
        g->gtecho = NULL;
    CK(cuStreamCreate(&g->s, CU_STREAM_NON_BLOCKING));
    return 0;
}

static int use(struct gctx *g)
{
    CK(cuCtxSetCurrent(g->ctx));
    return 0;
}

/* The kernel that runs ns: spin on a GPU, simgpu's busy_<N>us in host-only mode. */
static CUresult kernel_for(struct gctx *g, uint64_t ns, CUfunction *f)
{
    if (g_stamps) {
        *f = g->spin;
        return CUDA_SUCCESS;
    }
    unsigned us = (unsigned)(ns / 1000);
    for (int i = 0; i < g->nbusy; i++)
        if (g->busy[i].us == us) {
            *f = g->busy[i].f;
            return CUDA_SUCCESS;
        }
    char name[32];
    snprintf(name, sizeof name, "busy_%uus", us);
    CUresult r = cuModuleGetFunction(f, g->mod, name);
    if (r == CUDA_SUCCESS && g->nbusy < 32) {
        g->busy[g->nbusy].us = us;
        g->busy[g->nbusy++].f = *f;
    }
    return r;
}

static CUresult launch(struct gctx *g, CUstream s, uint64_t ns, CUdeviceptr rec)
{
    CUfunction f;
    CUresult r = kernel_for(g, ns, &f);
    if (r != CUDA_SUCCESS)
        return r;
    uint64_t gap = g_gap_ns;
    void *args[3] = {&ns, &rec, &gap};
    return cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, args, NULL);
}

static int recs_alloc(CUdeviceptr *d, size_t n)
{
    *d = 0;
    if (!g_stamps || !n)
        return 0;
    CK(cuMemAlloc_v2(d, n * REC_BYTES));
    CK(cuMemsetD8_v2(*d, 0, n * REC_BYTES));
    CK(cuCtxSynchronize()); /* the memset is on the legacy stream; ours do not wait for it */
    return 0;
}

static int recs_fetch(uint64_t **h, CUdeviceptr d, size_t n)
{
    *h = calloc(n ? n : 1, REC_BYTES);
    if (!*h)
        return -1;
    if (!g_stamps || !d || !n)
        return 0;
    CK(cuMemcpyDtoH_v2(*h, d, n * REC_BYTES));
    return 0;
}

#define REC(base, i) ((base) + (size_t)(i) * REC_WORDS)

/* The offset is measured again and again (a "fix") and interpolated between fixes: on
 * the first GPU measured, %globaltimer ran about 5 ppm off CLOCK_MONOTONIC, so one
 * offset taken at the start was 40 us wrong eight seconds later. */
struct fix {
    uint64_t t;   /* CLOCK_MONOTONIC when taken */
    int64_t off;  /* %globaltimer - CLOCK_MONOTONIC */
    double half;  /* half the bracket's width */
};
static struct fix g_fix[64];
static int g_nfix;
static struct gctx *g_main;
static void *g_hostp;
static CUdeviceptr g_hostd, g_echo_out;
static int g_map_ok = -1;
#define ECHO_MAX 16384ull

static int64_t off_at_mono(double t)
{
    if (!g_nfix)
        return g_off;
    if (t <= (double)g_fix[0].t || g_nfix == 1)
        return g_fix[0].off;
    int i = 0;
    while (i + 1 < g_nfix && (double)g_fix[i + 1].t < t)
        i++;
    if (i + 1 >= g_nfix)
        return g_fix[g_nfix - 1].off;
    double f = (t - (double)g_fix[i].t) / (double)(g_fix[i + 1].t - g_fix[i].t);
    return g_fix[i].off + (int64_t)llround(f * (double)(g_fix[i + 1].off - g_fix[i].off));
}

static double gt_to_mono(uint64_t gt)
{
    int64_t first = g_nfix ? g_fix[0].off : g_off;
    double t = (double)((int64_t)gt - first); /* close enough to pick the fixes around it */
    return (double)((int64_t)gt - off_at_mono(t));
}

static double mono_to_gt_rel(uint64_t t, uint64_t gt_base) /* (t on the GPU timeline) - gt_base */
{
    return (double)((int64_t)t + off_at_mono((double)t) - (int64_t)gt_base);
}

static int map_init(void)
{
    if (g_map_ok >= 0)
        return 0;
    g_map_ok = 0;
    if (!g_main->gtpub || !g_main->gtecho || !cuMemHostAlloc || !cuMemHostGetDevicePointer_v2)
        return 0;
    if (cuMemHostAlloc(&g_hostp, 4096, CU_MEMHOSTALLOC_DEVICEMAP) != CUDA_SUCCESS ||
        cuMemHostGetDevicePointer_v2(&g_hostd, g_hostp, 0) != CUDA_SUCCESS)
        return 0;
    CK(cuMemAlloc_v2(&g_echo_out, (size_t)(2 + 2 * ECHO_MAX) * 8));
    g_map_ok = 1;
    return 0;
}

/* Brackets the offset through mapped host memory. From below: a kernel keeps writing
 * %globaltimer, the host reads it, then CLOCK_MONOTONIC (offset >= value - host time).
 * From above: the host keeps writing CLOCK_MONOTONIC, a kernel notes the timer when it
 * sees a new value (offset <= timer - value). */
static int bracket(uint64_t ns, int64_t *lo, int64_t *hi, long *nlo, long *nhi)
{
    *lo = INT64_MIN;
    *hi = INT64_MAX;
    *nlo = *nhi = 0;
    volatile uint64_t *pub = (volatile uint64_t *)g_hostp;
    volatile uint64_t *echo = (volatile uint64_t *)((char *)g_hostp + 256);
    *pub = 0;
    void *args[2] = {&g_hostd, &ns};
    CK(cuLaunchKernel(g_main->gtpub, 1, 1, 1, 1, 1, 1, 0, g_main->s, args, NULL));
    uint64_t tstop = mono() + 2000000000ull, last = 0;
    while (mono() < tstop) {
        uint64_t v = *pub;
        uint64_t t = mono();
        if (v && v != last) {
            last = v;
            (*nlo)++;
            int64_t b = (int64_t)v - (int64_t)t;
            if (b > *lo)
                *lo = b;
            tstop = t + 1000000; /* 1 ms after the last change: the kernel ended */
        }
    }
    CK(cuStreamSynchronize(g_main->s));

    uint64_t max = ECHO_MAX;
    CK(cuMemsetD8_v2(g_echo_out, 0, (size_t)(2 + 2 * max) * 8));
    CK(cuCtxSynchronize());
    CUdeviceptr echod = g_hostd + 256;
    uint64_t ens = ns / 2 > 1000000 ? ns / 2 : 1000000;
    void *eargs[4] = {&echod, &g_echo_out, &ens, &max};
    *echo = mono();
    CK(cuLaunchKernel(g_main->gtecho, 1, 1, 1, 1, 1, 1, 0, g_main->s, eargs, NULL));
    tstop = mono() + ens + 200000000ull;
    while (mono() < tstop) {
        *echo = mono();
        for (volatile int k = 0; k < 20; k++)
            ;
        if (cuStreamQuery(g_main->s) == CUDA_SUCCESS)
            break;
    }
    CK(cuStreamSynchronize(g_main->s));
    uint64_t *eo = calloc((size_t)(2 + 2 * max), 8);
    CK(cuMemcpyDtoH_v2(eo, g_echo_out, (size_t)(2 + 2 * max) * 8));
    *nhi = (long)(eo[0] < max ? eo[0] : max);
    for (long i = 0; i < *nhi; i++) {
        int64_t b = (int64_t)eo[3 + 2 * i] - (int64_t)eo[2 + 2 * i];
        if (b < *hi)
            *hi = b;
    }
    free(eo);
    return 0;
}

/* A fix between measurements (a few ms); the current context is the main one after. */
static int clock_fix(void)
{
    if (!g_stamps || g_map_ok != 1)
        return 0;
    CK(use(g_main));
    int64_t lo, hi;
    long a, b;
    if (bracket(2000000, &lo, &hi, &a, &b))
        return -1;
    if (!a || !b || lo > hi) {
        note_error("clock fix: no bracket (low %" PRId64 ", high %" PRId64 ", %ld/%ld reads)", lo, hi, a, b);
        return 0;
    }
    if (g_nfix < (int)(sizeof g_fix / sizeof g_fix[0]))
        g_fix[g_nfix++] = (struct fix){mono(), lo + (hi - lo) / 2, (double)(hi - lo) / 2};
    return 0;
}

/* ---- clock: %globaltimer against CLOCK_MONOTONIC ---- */
static int sec_clock(struct gctx *g, const char *key, int last)
{
    CK(use(g));
    if (map_init())
        return -1;
    jopen(key, '{');
    /* idle-stream round trips: the kernel starts after the launch call began and ends
     * before the synchronize returned */
    int n = last ? 50 : 200;
    CUdeviceptr d;
    if (recs_alloc(&d, (size_t)n))
        return -1;
    uint64_t *t0 = calloc((size_t)n, 8), *t1 = calloc((size_t)n, 8), *h;
    for (int i = 0; i < n; i++) {
        t0[i] = mono();
        CK(launch(g, g->s, 0, d + (CUdeviceptr)i * REC_BYTES));
        CK(cuStreamSynchronize(g->s));
        t1[i] = mono();
    }
    if (recs_fetch(&h, d, (size_t)n))
        return -1;
    int64_t rt_lo = INT64_MIN, rt_hi = INT64_MAX;
    double *lat = calloc((size_t)n, sizeof(double));
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (!REC(h, i)[R_END])
            continue;
        int64_t a = (int64_t)REC(h, i)[R_END] - (int64_t)t1[i], b = (int64_t)REC(h, i)[R_START] - (int64_t)t0[i];
        if (a > rt_lo)
            rt_lo = a;
        if (b < rt_hi)
            rt_hi = b;
        lat[m++] = (double)(t1[i] - t0[i]);
    }
    metric("roundtrip", "idle round trip: launch spin(0) + cuStreamSynchronize", lat, m, 1e3, "us");
    free(lat);
    free(h);
    free(t0);
    free(t1);
    if (!m) {
        note_error("clock: no round trip came back with stamps");
        jclose();
        return -1;
    }
    int64_t lo = rt_lo, hi = rt_hi, pub_lo = 0, echo_hi = 0;
    long npub = 0, necho = 0;
    if (g_map_ok == 1) {
        if (bracket(last ? 5000000 : 20000000, &pub_lo, &echo_hi, &npub, &necho))
            return -1;
        if (npub && pub_lo > lo)
            lo = pub_lo;
        if (necho && echo_hi < hi)
            hi = echo_hi;
    } else {
        out("%-54s %s\n", "mapped host memory", "not available: round trips only");
    }
    jint("roundtrip_low_ns", rt_lo);
    jint("roundtrip_high_ns", rt_hi);
    jint("published_low_ns", npub ? pub_lo : 0);
    jint("published_samples", npub);
    jint("echo_high_ns", necho ? echo_hi : 0);
    jint("echo_samples", necho);
    int consistent = lo <= hi;
    int64_t off = consistent ? lo + (hi - lo) / 2 : (npub ? pub_lo : rt_lo);
    double half = consistent ? (double)(hi - lo) / 2 : NAN;
    jint("offset_ns", off);
    jnum("offset_halfwidth_ns", half);
    jbool("consistent", consistent);
    int64_t rt_minus_mono = (int64_t)realtime() - (int64_t)mono();
    jint("realtime_minus_monotonic_ns", rt_minus_mono);
    char txt[160];
    snprintf(txt, sizeof txt, "%+.6f s (+/- %.2f us); round trips alone: [%+.1f, %+.1f] us around it",
             (double)off / 1e9, half / 1e3, (double)(rt_lo - off) / 1e3, (double)(rt_hi - off) / 1e3);
    note(NULL, "%globaltimer - CLOCK_MONOTONIC", txt);
    if (npub || necho) {
        snprintf(txt, sizeof txt, "from below %+.2f us (%ld reads), from above %+.2f us (%ld reads)",
                 (double)(pub_lo - off) / 1e3, npub, (double)(echo_hi - off) / 1e3, necho);
        note(NULL, "  mapped-memory bracket around it", txt);
    }
    snprintf(txt, sizeof txt, "%+.1f us", (double)(off - rt_minus_mono) / 1e3);
    note(NULL, "%globaltimer - CLOCK_REALTIME", txt);
    if (!consistent)
        note_error("clock: the bounds cross (low %" PRId64 " > high %" PRId64 "): offset from below only", lo, hi);
    if (!g_nfix)
        g_off = off;
    g_off_known = 1;
    if (consistent && g_nfix < (int)(sizeof g_fix / sizeof g_fix[0]))
        g_fix[g_nfix++] = (struct fix){mono(), off, half};
    g_off_halfwidth = consistent ? half : g_off_halfwidth;
    if (last && g_nfix >= 2) {
        /* drift: a least-squares line through every fix of the run */
        double st = 0, so = 0, stt = 0, sto = 0;
        int k = g_nfix;
        for (int i = 0; i < k; i++) {
            double t = (double)(g_fix[i].t - g_fix[0].t) / 1e9, o = (double)(g_fix[i].off - g_fix[0].off);
            st += t;
            so += o;
            stt += t * t;
            sto += t * o;
        }
        double slope = (k * sto - st * so) / (k * stt - st * st), icpt = (so - slope * st) / k, res = 0;
        for (int i = 0; i < k; i++) {
            double t = (double)(g_fix[i].t - g_fix[0].t) / 1e9, o = (double)(g_fix[i].off - g_fix[0].off);
            if (fabs(o - (icpt + slope * t)) > res)
                res = fabs(o - (icpt + slope * t));
        }
        double span = (double)(g_fix[k - 1].t - g_fix[0].t) / 1e9;
        value("drift_ppm", "%globaltimer drift against CLOCK_MONOTONIC", slope / 1e3, "ppm");
        value("drift_us", "  the offset moved, first fix to last", (double)(g_fix[k - 1].off - g_fix[0].off) / 1e3,
              "us");
        value("drift_span_s", "  over", span, "s");
        value("drift_residual_us", "  largest distance of a fix from the line", res / 1e3, "us");
        jint("fixes", k);
        jopen("fix_list", '[');
        for (int i = 0; i < k; i++) {
            jopen(NULL, '{');
            jnum("t_s", (double)(g_fix[i].t - g_fix[0].t) / 1e9);
            jnum("offset_us", (double)(g_fix[i].off - g_fix[0].off) / 1e3);
            jnum("halfwidth_us", g_fix[i].half / 1e3);
            jclose();
        }
        jclose();
    }
    jclose();
    return 0;
}

/* ---- a: costs of the calls libvgpu wraps ---- */
static int time_calls(double *v, int n, CUresult (*fn)(void *), void *arg, int queries)
{
    for (int i = 0; i < n; i++) {
        uint64_t a = mono();
        CUresult r = fn(arg);
        uint64_t b = mono();
        if (r != CUDA_SUCCESS && !(queries && r == CUDA_ERROR_NOT_READY)) {
            cu_fail("timed call", r, __LINE__);
            return -1;
        }
        v[i] = (double)(b - a);
    }
    return 0;
}

static CUresult q_event(void *e) { return cuEventQuery((CUevent)e); }
static CUresult q_stream(void *s) { return cuStreamQuery((CUstream)s); }
static CUresult sync_stream(void *s) { return cuStreamSynchronize((CUstream)s); }

struct recarg {
    CUevent e;
    CUstream s;
};
static CUresult rec_event(void *a) { return cuEventRecord(((struct recarg *)a)->e, ((struct recarg *)a)->s); }

static int sec_costs(struct gctx *g)
{
    CK(use(g));
    table_head("a: call costs (host CPU time per call)");
    jopen("a_costs", '{');
    enum { N = 4000 };
    double *v = calloc(N, sizeof(double));

    /* launches of a kernel that does nothing (spin(0)), asynchronous, 20 batches of 200 */
    int k = 0;
    for (int b = 0; b < 20; b++) {
        for (int i = 0; i < 200; i++) {
            uint64_t t0 = mono();
            CK(launch(g, g->s, 0, 0));
            v[k++] = (double)(mono() - t0);
        }
        CK(cuStreamSynchronize(g->s));
    }
    metric("launch_us", "cuLaunchKernel, empty kernel, async", v, k, 1e3, "us");
    /* launches while the GPU is busy with a long kernel (the queue holds them) */
    CK(launch(g, g->s, 50000000, 0));
    for (int i = 0; i < 500; i++) {
        uint64_t t0 = mono();
        CK(launch(g, g->s, 0, 0));
        v[i] = (double)(mono() - t0);
    }
    metric("launch_busy_us", "cuLaunchKernel behind a 50 ms kernel", v, 500, 1e3, "us");
    CK(cuStreamSynchronize(g->s));

    CUevent et, en, eb;
    CK(cuEventCreate(&et, CU_EVENT_DEFAULT));
    CK(cuEventCreate(&en, CU_EVENT_DISABLE_TIMING));
    CK(cuEventCreate(&eb, CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING));
    struct recarg ra = {et, g->s};
    if (time_calls(v, 2000, rec_event, &ra, 0))
        return -1;
    metric("event_record_timing_us", "cuEventRecord, timing event, idle stream", v, 2000, 1e3, "us");
    ra.e = en;
    if (time_calls(v, 2000, rec_event, &ra, 0))
        return -1;
    metric("event_record_notiming_us", "cuEventRecord, DISABLE_TIMING, idle stream", v, 2000, 1e3, "us");
    CK(launch(g, g->s, 50000000, 0));
    ra.e = et;
    if (time_calls(v, 2000, rec_event, &ra, 0))
        return -1;
    metric("event_record_busy_us", "cuEventRecord, timing event, busy stream", v, 2000, 1e3, "us");
    CK(cuStreamSynchronize(g->s));

    CK(cuEventRecord(en, g->s));
    CK(cuEventSynchronize(en));
    if (time_calls(v, 2000, q_event, en, 1))
        return -1;
    metric("event_query_done_us", "cuEventQuery, completed event", v, 2000, 1e3, "us");
    CK(launch(g, g->s, 50000000, 0));
    CK(cuEventRecord(en, g->s));
    if (time_calls(v, 2000, q_event, en, 1))
        return -1;
    metric("event_query_pending_us", "cuEventQuery, pending event (NOT_READY)", v, 2000, 1e3, "us");
    if (time_calls(v, 2000, q_stream, g->s, 1))
        return -1;
    metric("stream_query_busy_us", "cuStreamQuery, busy stream (NOT_READY)", v, 2000, 1e3, "us");
    CK(cuStreamSynchronize(g->s));
    if (time_calls(v, 2000, q_stream, g->s, 1))
        return -1;
    metric("stream_query_idle_us", "cuStreamQuery, idle stream", v, 2000, 1e3, "us");
    if (time_calls(v, 2000, sync_stream, g->s, 0))
        return -1;
    metric("stream_sync_idle_us", "cuStreamSynchronize, idle stream", v, 2000, 1e3, "us");
    jclose();
    free(v);
    return 0;
}

/* ---- b: how late a waiting call returns ---- */
enum { W_STREAM_SYNC, W_EVENT_SYNC, W_EVENT_POLL, W_STREAM_POLL };

static int wake_run(struct gctx *g, const char *key, const char *label, int how, unsigned evflags, int n)
{
    CK(use(g));
    CUevent ev = NULL;
    if (how == W_EVENT_SYNC || how == W_EVENT_POLL)
        CK(cuEventCreate(&ev, evflags));
    CUdeviceptr d;
    if (recs_alloc(&d, (size_t)n))
        return -1;
    uint64_t *tr = calloc((size_t)n, 8), *tw = calloc((size_t)n, 8), *dur = calloc((size_t)n, 8);
    for (int i = 0; i < n; i++) {
        dur[i] = 300000 + (uint64_t)((i * 7919) % 1000) * 1000; /* 0.3 to 1.3 ms */
        CK(launch(g, g->s, dur[i], d + (CUdeviceptr)i * REC_BYTES));
        if (ev)
            CK(cuEventRecord(ev, g->s));
        tr[i] = mono();
        switch (how) {
        case W_STREAM_SYNC:
            CK(cuStreamSynchronize(g->s));
            break;
        case W_EVENT_SYNC:
            CK(cuEventSynchronize(ev));
            break;
        case W_EVENT_POLL: {
            CUresult r;
            while ((r = cuEventQuery(ev)) == CUDA_ERROR_NOT_READY)
                ;
            CK(r);
            break;
        }
        case W_STREAM_POLL: {
            CUresult r;
            while ((r = cuStreamQuery(g->s)) == CUDA_ERROR_NOT_READY)
                ;
            CK(r);
            break;
        }
        }
        tw[i] = mono();
    }
    uint64_t *h;
    if (recs_fetch(&h, d, (size_t)n))
        return -1;
    double *late = calloc((size_t)n, sizeof(double));
    int m = 0;
    if (g_stamps) {
        for (int i = 0; i < n; i++)
            if (REC(h, i)[R_END])
                late[m++] = (double)tw[i] - gt_to_mono(REC(h, i)[R_END]);
    } else {
        for (int i = 0; i < n; i++)
            late[m++] = (double)tw[i] - (double)(tr[i] + dur[i]);
    }
    metric(key, label, late, m, 1e3, "us");
    free(late);
    free(h);
    free(tr);
    free(tw);
    free(dur);
    return 0;
}

static int sec_wake(struct gctx *g)
{
    table_head(g_stamps ? "b: wake-up lateness: the call's return - the kernel's end stamp (0.3-1.3 ms kernels)"
                        : "b: wake-up lateness: the call's return - (launch + kernel time), host-only");
    jopen("b_wake", '{');
    jstr("reference", g_stamps ? "kernel end stamp (%globaltimer) mapped to CLOCK_MONOTONIC" : "launch + duration");
    if (g_stamps)
        jnum("offset_halfwidth_us", g_off_halfwidth / 1e3);
    int n = 200, rc = 0;
    rc |= clock_fix();
    rc |= wake_run(g, "stream_sync_auto", "cuStreamSynchronize, ctx SCHED_AUTO", W_STREAM_SYNC, 0, n);
    rc |= clock_fix();
    rc |= wake_run(g, "event_sync_blocking", "cuEventSynchronize, BLOCKING_SYNC event", W_EVENT_SYNC,
                   CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING, n);
    rc |= clock_fix();
    rc |= wake_run(g, "event_sync_default", "cuEventSynchronize, default event", W_EVENT_SYNC,
                   CU_EVENT_DISABLE_TIMING, n);
    rc |= clock_fix();
    rc |= wake_run(g, "event_query_poll", "cuEventQuery in a busy loop", W_EVENT_POLL, CU_EVENT_DISABLE_TIMING, n);
    rc |= clock_fix();
    rc |= wake_run(g, "stream_query_poll", "cuStreamQuery in a busy loop", W_STREAM_POLL, 0, n);
    static const struct {
        unsigned flags;
        const char *key, *label;
    } ctxs[] = {
        {CU_CTX_SCHED_SPIN, "stream_sync_spin_ctx", "cuStreamSynchronize, ctx SCHED_SPIN"},
        {CU_CTX_SCHED_YIELD, "stream_sync_yield_ctx", "cuStreamSynchronize, ctx SCHED_YIELD"},
        {CU_CTX_SCHED_BLOCKING_SYNC, "stream_sync_blocking_ctx", "cuStreamSynchronize, ctx SCHED_BLOCKING_SYNC"},
    };
    for (size_t i = 0; i < sizeof ctxs / sizeof ctxs[0]; i++) {
        struct gctx c;
        if (ctx_open(&c, ctxs[i].flags)) {
            rc = -1;
            continue;
        }
        rc |= clock_fix();
        rc |= wake_run(&c, ctxs[i].key, ctxs[i].label, W_STREAM_SYNC, 0, n);
        if (cuCtxDestroy_v2(c.ctx) != CUDA_SUCCESS)
            rc = -1;
    }
    rc |= clock_fix();
    CK(use(g));
    jclose();
    return rc;
}

/* ---- c: the queue depth at which a launch blocks ---- */
static int sec_queue(struct gctx *g)
{
    CK(use(g));
    table_head("c: launch queue depth (200 us kernels launched without waiting)");
    jopen("c_queue", '{');
    const int maxn = g_stamps ? 16384 : 4096;
    const uint64_t ns = 200000;
    double *v = calloc((size_t)maxn, sizeof(double));
    int n = 0, first = -1, blocked = 0;
    uint64_t t0 = mono();
    for (; n < maxn && blocked < 32; n++) {
        uint64_t a = mono();
        CK(launch(g, g->s, ns, 0));
        v[n] = (double)(mono() - a);
        if (v[n] > ns / 2.0) {
            if (first < 0)
                first = n;
            blocked++;
        }
    }
    uint64_t t1 = mono();
    CK(cuStreamSynchronize(g->s));
    uint64_t t2 = mono();
    char txt[128];
    if (first >= 0) {
        snprintf(txt, sizeof txt, "launch #%d (0-based) was the first to block > 100 us", first);
        value("depth", "launches queued before one blocks", first, "kernels");
        metric("before_us", "launch time before the queue filled", v, first, 1e3, "us");
        metric("blocked_us", "launch time once full (next 31 launches)", v + first, n - first, 1e3, "us");
    } else {
        snprintf(txt, sizeof txt, "no launch blocked in %d", n);
        value("depth", "launches queued before one blocks (none blocked)", NAN, "kernels");
        metric("before_us", "launch time", v, n, 1e3, "us");
    }
    note("result", "  ", txt);
    jint("launched", n);
    value("drain_ms", "queued work drained in", (double)(t2 - t1) / 1e6, "ms");
    jnum("launch_loop_ms", (double)(t1 - t0) / 1e6);
    jclose();
    free(v);
    return 0;
}

/* ---- d: event timing resolution, the timer's tick, idle-stream event completion ---- */
static int sec_events(struct gctx *g)
{
    CK(use(g));
    table_head("d: events and timers");
    jopen("d_events", '{');
    CUevent e0, e1, en;
    CK(cuEventCreate(&e0, CU_EVENT_DEFAULT));
    CK(cuEventCreate(&e1, CU_EVENT_DEFAULT));
    CK(cuEventCreate(&en, CU_EVENT_DISABLE_TIMING));
    enum { N = 400 };
    CUdeviceptr d;
    if (recs_alloc(&d, N))
        return -1;
    double *el = calloc(N, sizeof(double)), *diff = calloc(N, sizeof(double));
    uint64_t *kns = calloc(N, 8);
    for (int i = 0; i < N; i++) {
        kns[i] = g_stamps ? (uint64_t)i * 53 : (uint64_t)(i % 20) * 1000; /* 0 to 21 us */
        CK(cuEventRecord(e0, g->s));
        CK(launch(g, g->s, kns[i], d + (CUdeviceptr)i * REC_BYTES));
        CK(cuEventRecord(e1, g->s));
        CK(cuEventSynchronize(e1));
        float ms = 0;
        CK(cuEventElapsedTime(&ms, e0, e1));
        el[i] = (double)ms * 1e6;
    }
    uint64_t *h;
    if (recs_fetch(&h, d, N))
        return -1;
    /* the quantum: the smallest step between distinct elapsed times */
    double *u = calloc(N, sizeof(double));
    memcpy(u, el, N * sizeof(double));
    qsort(u, N, sizeof(double), cmp_d);
    double q = INFINITY;
    for (int i = 1; i < N; i++) {
        double s = round(u[i]) - round(u[i - 1]);
        if (s > 0.5 && s < q)
            q = s;
    }
    int distinct = 1;
    for (int i = 1; i < N; i++)
        distinct += round(u[i]) != round(u[i - 1]);
    value("elapsed_quantum_ns", "cuEventElapsedTime: smallest step between values", isfinite(q) ? q : NAN, "ns");
    jint("elapsed_distinct_values", distinct);
    metric("elapsed_empty_us", "elapsed around an empty kernel (i=0..9)", el, 10, 1e3, "us");
    if (g_stamps) {
        int m = 0;
        for (int i = 0; i < N; i++)
            if (REC(h, i)[R_END])
                diff[m++] = el[i] - (double)(REC(h, i)[R_END] - REC(h, i)[R_START]);
        metric("elapsed_minus_kernel_us", "elapsed - kernel's own end-start (stamps)", diff, m, 1e3, "us");
        /* the timer's tick: the smallest nonzero step the kernels saw */
        m = 0;
        for (int i = 0; i < N; i++)
            if (REC(h, i)[R_END] && REC(h, i)[R_MINSTEP] != UINT64_MAX && REC(h, i)[R_MINSTEP])
                diff[m++] = (double)REC(h, i)[R_MINSTEP];
        metric("globaltimer_step_ns", "%globaltimer: smallest step seen in a kernel", diff, m, 1, "ns");
        m = 0;
        for (int i = 0; i < N; i++)
            if (REC(h, i)[R_END] && REC(h, i)[R_MAXSTEP])
                diff[m++] = (double)REC(h, i)[R_MAXSTEP];
        metric("globaltimer_maxstep_ns", "%globaltimer: largest step in a kernel (idle GPU)", diff, m, 1, "ns");
    }
    free(u);
    free(h);
    free(kns);

    /* an event recorded on an idle stream: when is it complete? */
    enum { M = 500 };
    double *after = calloc(M, sizeof(double)), *rec = calloc(M, sizeof(double));
    for (int pass = 0; pass < 2; pass++) {
        CUevent e = pass ? en : e0;
        int first_ok = 0;
        for (int i = 0; i < M; i++) {
            CK(cuStreamSynchronize(g->s));
            uint64_t t0 = mono();
            CK(cuEventRecord(e, g->s));
            uint64_t t1 = mono();
            CUresult r = cuEventQuery(e);
            if (r == CUDA_SUCCESS)
                first_ok++;
            while (r == CUDA_ERROR_NOT_READY)
                r = cuEventQuery(e);
            CK(r);
            uint64_t t2 = mono();
            after[i] = (double)(t2 - t1);
            rec[i] = (double)(t2 - t0);
        }
        jopen(pass ? "idle_record_notiming" : "idle_record_timing", '{');
        metric("done_after_record_returned_us",
               pass ? "idle stream, no-timing event: done after record returned"
                    : "idle stream, timing event: done after record returned",
               after, M, 1e3, "us");
        metric("done_after_record_called_us", "  ... after the record call began", rec, M, 1e3, "us");
        char txt[64];
        snprintf(txt, sizeof txt, "%d of %d", first_ok, M);
        note("first_query_success", "  first cuEventQuery already CUDA_SUCCESS", txt);
        jclose();
    }
    free(after);
    free(rec);
    free(el);
    free(diff);
    jclose();
    return 0;
}

/* ---- e: sharing between processes and streams ---- */
#define WMAGIC 0x6770756368656b31ull /* "gpuchek1" */

struct wres {
    uint64_t n, tgo, tend, ns;
    uint64_t *rec, *tl, *td;
};

static void wres_free(struct wres *w)
{
    free(w->rec);
    free(w->tl);
    free(w->td);
    memset(w, 0, sizeof *w);
}

static int greedy_loop(struct gctx *g, uint64_t ns, uint64_t dur, CUdeviceptr d, uint64_t max, uint64_t *n_out)
{
    CUevent ev[4];
    for (int i = 0; i < 4; i++)
        CK(cuEventCreate(&ev[i], CU_EVENT_DISABLE_TIMING));
    uint64_t batch = ns >= 3200000 ? 1 : 3200000 / ns; /* ~3 ms of work per batch */
    if (batch > 64)
        batch = 64;
    uint64_t tend = mono() + dur, i = 0, b = 0;
    while (i < max && mono() < tend) {
        for (uint64_t k = 0; k < batch && i < max; k++, i++)
            CK(launch(g, g->s, ns, d ? d + (CUdeviceptr)i * REC_BYTES : 0));
        CK(cuEventRecord(ev[b % 4], g->s));
        b++;
        if (b >= 3) /* keep two batches queued */
            CK(cuEventSynchronize(ev[(b - 3) % 4]));
    }
    CK(cuStreamSynchronize(g->s));
    *n_out = i;
    return 0;
}

static uint64_t g_lcg = 88172645463325252ull;
static uint64_t rnd(void)
{
    g_lcg = g_lcg * 6364136223846793005ull + 1442695040888963407ull;
    return g_lcg >> 33;
}

static int light_loop(struct gctx *g, uint64_t ns, uint64_t period, uint64_t dur, CUdeviceptr d, uint64_t max,
                      uint64_t *tl, uint64_t *td, uint64_t *n_out)
{
    uint64_t t0 = mono(), next = t0, i = 0;
    while (i < max) {
        /* 0.5 to 1.5 periods after the last one finished (not on a fixed schedule, which
         * a process that waits long falls behind and then catches up on after its
         * neighbour has gone) */
        next = (i ? td[i - 1] : t0) + period / 2 + rnd() % period;
        if (next >= t0 + dur)
            break;
        sleep_until(next);
        tl[i] = mono();
        CK(launch(g, g->s, ns, d ? d + (CUdeviceptr)i * REC_BYTES : 0));
        CK(cuStreamSynchronize(g->s));
        td[i] = mono();
        i++;
    }
    *n_out = i;
    return 0;
}

/* gpucheck --worker KIND NS DUR_MS PERIOD_US OUTFILE STAMPS GAP_NS DEVICE */
static int worker_main(int argc, char **argv)
{
    if (argc < 10)
        return 2;
    alarm(120);
    const char *kind = argv[2];
    uint64_t ns = strtoull(argv[3], NULL, 10), dur = strtoull(argv[4], NULL, 10) * 1000000ull;
    uint64_t period = strtoull(argv[5], NULL, 10) * 1000ull;
    const char *file = argv[6];
    g_stamps = atoi(argv[7]);
    g_gap_ns = strtoull(argv[8], NULL, 10);
    g_devidx = atoi(argv[9]);
    int light = strcmp(kind, "light") == 0;
    struct gctx g;
    if (load_driver() || cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&g_dev, g_devidx) != CUDA_SUCCESS ||
        ctx_open(&g, CU_CTX_SCHED_AUTO)) {
        printf("fail\n");
        return 1;
    }
    uint64_t max = light ? dur / (period / 2) + 16 : dur / ns * 3 / 2 + 256;
    if (max > 100000)
        max = 100000;
    CUdeviceptr d;
    uint64_t *tl = calloc(max, 8), *td = calloc(max, 8), n = 0, *h = NULL;
    if (recs_alloc(&d, max)) {
        printf("fail\n");
        return 1;
    }
    printf("ready\n");
    fflush(stdout);
    char line[32];
    if (!fgets(line, sizeof line, stdin) || strncmp(line, "go", 2) != 0)
        return 1;
    uint64_t tgo = mono();
    int rc = light ? light_loop(&g, ns, period, dur, d, max, tl, td, &n) : greedy_loop(&g, ns, dur, d, max, &n);
    uint64_t tend = mono();
    if (rc || recs_fetch(&h, d, n)) {
        printf("fail\n");
        return 1;
    }
    FILE *f = fopen(file, "wb");
    uint64_t hdr[5] = {WMAGIC, n, tgo, tend, ns};
    if (!f || fwrite(hdr, 8, 5, f) != 5 || fwrite(h, REC_BYTES, n, f) != n || fwrite(tl, 8, n, f) != n ||
        fwrite(td, 8, n, f) != n || fclose(f) != 0) {
        printf("fail\n");
        return 1;
    }
    printf("done %" PRIu64 "\n", n);
    return 0;
}

struct worker {
    pid_t pid;
    FILE *in, *out;
    char file[PATH_MAX];
};

static int spawn(struct worker *w, const char *kind, uint64_t ns, uint64_t dur_ms, uint64_t period_us,
                 const char *name)
{
    char self[PATH_MAX];
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    if (k <= 0) {
        note_error("readlink /proc/self/exe: %s", strerror(errno));
        return -1;
    }
    self[k] = 0;
    snprintf(w->file, sizeof w->file, "%s/worker-%s.bin", g_outdir, name);
    int a[2], b[2];
    if (pipe(a) || pipe(b)) {
        note_error("pipe: %s", strerror(errno));
        return -1;
    }
    char s_ns[32], s_dur[32], s_per[32], s_st[8], s_gap[32], s_dev[16];
    snprintf(s_ns, sizeof s_ns, "%" PRIu64, ns);
    snprintf(s_dur, sizeof s_dur, "%" PRIu64, dur_ms);
    snprintf(s_per, sizeof s_per, "%" PRIu64, period_us);
    snprintf(s_st, sizeof s_st, "%d", g_stamps);
    snprintf(s_gap, sizeof s_gap, "%" PRIu64, g_gap_ns);
    snprintf(s_dev, sizeof s_dev, "%d", g_devidx);
    fflush(NULL);
    w->pid = fork();
    if (w->pid < 0) {
        note_error("fork: %s", strerror(errno));
        return -1;
    }
    if (w->pid == 0) {
        dup2(a[0], 0);
        dup2(b[1], 1);
        close(a[0]);
        close(a[1]);
        close(b[0]);
        close(b[1]);
        char *args[] = {self, "--worker", (char *)kind, s_ns, s_dur, s_per, w->file, s_st, s_gap, s_dev, NULL};
        execv(self, args);
        _exit(127);
    }
    close(a[0]);
    close(b[1]);
    w->in = fdopen(a[1], "w");
    w->out = fdopen(b[0], "r");
    return 0;
}

static int expect(struct worker *w, const char *word)
{
    char line[64];
    if (!fgets(line, sizeof line, w->out) || strncmp(line, word, strlen(word)) != 0) {
        note_error("worker %d: expected '%s', got '%s'", (int)w->pid, word, feof(w->out) ? "EOF" : line);
        return -1;
    }
    return 0;
}

static int reap(struct worker *w, struct wres *r)
{
    int rc = expect(w, "done");
    fclose(w->in);
    fclose(w->out);
    int status;
    waitpid(w->pid, &status, 0);
    if (rc)
        return -1;
    memset(r, 0, sizeof *r);
    FILE *f = fopen(w->file, "rb");
    uint64_t hdr[5];
    if (!f || fread(hdr, 8, 5, f) != 5 || hdr[0] != WMAGIC) {
        note_error("worker file %s unreadable", w->file);
        if (f)
            fclose(f);
        return -1;
    }
    r->n = hdr[1];
    r->tgo = hdr[2];
    r->tend = hdr[3];
    r->ns = hdr[4];
    r->rec = calloc(r->n ? r->n : 1, REC_BYTES);
    r->tl = calloc(r->n ? r->n : 1, 8);
    r->td = calloc(r->n ? r->n : 1, 8);
    if (fread(r->rec, REC_BYTES, r->n, f) != r->n || fread(r->tl, 8, r->n, f) != r->n ||
        fread(r->td, 8, r->n, f) != r->n) {
        note_error("worker file %s short", w->file);
        fclose(f);
        return -1;
    }
    fclose(f);
    unlink(w->file);
    return 0;
}

/* Runs workers side by side: all get ready (contexts made, modules loaded), then go together. */
static int run_workers(int n, struct worker *w, struct wres *r)
{
    int rc = 0;
    for (int i = 0; i < n; i++)
        if (expect(&w[i], "ready"))
            rc = -1;
    for (int i = 0; i < n; i++) {
        fprintf(w[i].in, rc ? "stop\n" : "go\n");
        fflush(w[i].in);
    }
    for (int i = 0; i < n; i++)
        if (reap(&w[i], &r[i]))
            rc = -1;
    return rc;
}

/* Intervals in which a stream ran: each kernel's [start, end] less the holes it saw. */
struct seg {
    uint64_t a, b;
    int who;
};

static int cmp_seg(const void *x, const void *y)
{
    const struct seg *p = x, *q = y;
    return p->a < q->a ? -1 : p->a > q->a;
}

static size_t segments(const uint64_t *rec, uint64_t n, int who, struct seg *s, size_t k, uint64_t *truncated)
{
    for (uint64_t i = 0; i < n; i++) {
        const uint64_t *r = REC(rec, i);
        if (!r[R_END])
            continue;
        uint64_t cur = r[R_START], ng = r[R_NGAP];
        if (ng > MAX_GAPS)
            (*truncated)++;
        for (uint64_t j = 0; j < ng && j < MAX_GAPS; j++) {
            uint64_t ga = r[R_GAP0 + 2 * j], gb = r[R_GAP0 + 2 * j + 1];
            if (ga > cur)
                s[k++] = (struct seg){cur, ga, who};
            cur = gb;
        }
        if (r[R_END] > cur)
            s[k++] = (struct seg){cur, r[R_END], who};
    }
    return k;
}

static uint64_t seg_count(const uint64_t *rec, uint64_t n)
{
    uint64_t k = 0;
    for (uint64_t i = 0; i < n; i++)
        k += 1 + (REC(rec, i)[R_NGAP] < MAX_GAPS ? REC(rec, i)[R_NGAP] : MAX_GAPS);
    return k;
}

/* Length of the intersection of two sorted lists of disjoint intervals. */
static double intersect(const struct seg *x, size_t nx, const struct seg *y, size_t ny)
{
    double t = 0;
    size_t i = 0, j = 0;
    while (i < nx && j < ny) {
        uint64_t a = x[i].a > y[j].a ? x[i].a : y[j].a, b = x[i].b < y[j].b ? x[i].b : y[j].b;
        if (b > a)
            t += (double)(b - a);
        if (x[i].b < y[j].b)
            i++;
        else
            j++;
    }
    return t;
}

/* Two processes' kernels on the GPU timeline: who ran when. */
static void analyze_pair(const struct wres *A, const struct wres *B, const char *na, const char *nb)
{
    uint64_t trunc = 0;
    size_t cap = seg_count(A->rec, A->n) + seg_count(B->rec, B->n) + 1;
    struct seg *s = calloc(cap, sizeof *s), *sa = calloc(cap, sizeof *s), *sb = calloc(cap, sizeof *s);
    size_t na_ = segments(A->rec, A->n, 0, sa, 0, &trunc), nb_ = segments(B->rec, B->n, 1, sb, 0, &trunc);
    if (!na_ || !nb_) {
        note_error("pair %s/%s: no stamps", na, nb);
        free(s);
        free(sa);
        free(sb);
        return;
    }
    /* the window in which both ran */
    uint64_t w0 = sa[0].a > sb[0].a ? sa[0].a : sb[0].a;
    uint64_t w1 = sa[na_ - 1].b < sb[nb_ - 1].b ? sa[na_ - 1].b : sb[nb_ - 1].b;
    size_t k = 0;
    for (size_t i = 0; i < na_; i++)
        if (sa[i].b > w0 && sa[i].a < w1)
            s[k++] = sa[i];
    for (size_t i = 0; i < nb_; i++)
        if (sb[i].b > w0 && sb[i].a < w1)
            s[k++] = sb[i];
    qsort(s, k, sizeof *s, cmp_seg);
    /* runs of one owner's consecutive segments = its timeslices */
    size_t maxruns = k + 1;
    double *slice[2], *gap = calloc(maxruns, sizeof(double)), *kper[2], *kgap = calloc(maxruns, sizeof(double));
    int nkg = 0;
    slice[0] = calloc(maxruns, sizeof(double));
    slice[1] = calloc(maxruns, sizeof(double));
    kper[0] = calloc(maxruns, sizeof(double));
    kper[1] = calloc(maxruns, sizeof(double));
    int ns[2] = {0, 0}, ng = 0, overlaps = 0;
    size_t i = 0;
    int first = 1;
    uint64_t prev_end = 0;
    while (i < k) {
        size_t j = i;
        uint64_t end = s[i].b;
        while (j + 1 < k && s[j + 1].who == s[i].who) {
            j++;
            kgap[nkg++] = (double)((int64_t)s[j].a - (int64_t)s[j - 1].b);
            if (s[j].b > end)
                end = s[j].b;
        }
        int last = j + 1 >= k;
        if (!first) {
            double gp = (double)((int64_t)s[i].a - (int64_t)prev_end);
            gap[ng++] = gp;
            if (gp < 0)
                overlaps++;
        }
        if (!first && !last) { /* the first and last runs are cut by the window */
            slice[s[i].who][ns[s[i].who]] = (double)(end - s[i].a);
            kper[s[i].who][ns[s[i].who]++] = (double)(j - i + 1);
        }
        prev_end = end;
        first = 0;
        i = j + 1;
    }
    char l[128];
    snprintf(l, sizeof l, "timeslice of %s (a run of its kernels)", na);
    metric("slice_a_us", l, slice[0], ns[0], 1e3, "us");
    snprintf(l, sizeof l, "timeslice of %s", nb);
    metric("slice_b_us", l, slice[1], ns[1], 1e3, "us");
    snprintf(l, sizeof l, "  segments per slice, %s", na);
    metric("segments_per_slice_a", l, kper[0], ns[0], 1, "");
    metric("switch_gap_us", "switch gap: one's last stamp to the other's first", gap, ng, 1e3, "us");
    metric("back_to_back_gap_us", "gap between one process's kernels inside a slice", kgap, nkg, 1e3, "us");
    double win = (double)(w1 - w0);
    /* shares of the window */
    size_t ka = 0, kb = 0;
    for (size_t t = 0; t < k; t++)
        (s[t].who ? sb : sa)[s[t].who ? kb++ : ka++] = s[t];
    double busy_a = 0, busy_b = 0;
    for (size_t t = 0; t < ka; t++)
        busy_a += (double)((sa[t].b < w1 ? sa[t].b : w1) - (sa[t].a > w0 ? sa[t].a : w0));
    for (size_t t = 0; t < kb; t++)
        busy_b += (double)((sb[t].b < w1 ? sb[t].b : w1) - (sb[t].a > w0 ? sb[t].a : w0));
    double both = intersect(sa, ka, sb, kb);
    value("window_ms", "window in which both ran", win / 1e6, "ms");
    jint("switches", ng);
    jint("overlapping_switches", overlaps);
    snprintf(l, sizeof l, "share of the window: %s", na);
    value("share_a_pct", l, 100 * busy_a / win, "%");
    snprintf(l, sizeof l, "share of the window: %s", nb);
    value("share_b_pct", l, 100 * busy_b / win, "%");
    value("both_running_pct", "both running at once", 100 * both / win, "%");
    value("idle_pct", "neither running (switches, launch gaps)", 100 * (win - busy_a - busy_b + both) / win, "%");
    /* kernels that a switch cut in two */
    double *hole = calloc(A->n + B->n + 1, sizeof(double));
    int nh = 0;
    uint64_t cut[2] = {0, 0}, tot[2] = {0, 0};
    const struct wres *W[2] = {A, B};
    for (int p = 0; p < 2; p++)
        for (uint64_t t = 0; t < W[p]->n; t++) {
            const uint64_t *r = REC(W[p]->rec, t);
            if (!r[R_END])
                continue;
            tot[p]++;
            if (r[R_NGAP]) {
                cut[p]++;
                for (uint64_t q = 0; q < r[R_NGAP] && q < MAX_GAPS; q++)
                    hole[nh++] = (double)(r[R_GAP0 + 2 * q + 1] - r[R_GAP0 + 2 * q]);
            }
        }
    snprintf(l, sizeof l, "%s kernels preempted mid-run", na);
    value("preempted_a_pct", l, tot[0] ? 100.0 * cut[0] / tot[0] : NAN, "%");
    snprintf(l, sizeof l, "%s kernels preempted mid-run", nb);
    value("preempted_b_pct", l, tot[1] ? 100.0 * cut[1] / tot[1] : NAN, "%");
    metric("hole_us", "  a hole inside a kernel (the other's turn)", hole, nh, 1e3, "us");
    /* a kernel's end - start against its own duration */
    double *stretch = calloc(A->n + B->n + 1, sizeof(double));
    for (int p = 0; p < 2; p++) {
        int m = 0;
        for (uint64_t t = 0; t < W[p]->n; t++) {
            const uint64_t *r = REC(W[p]->rec, t);
            if (r[R_END])
                stretch[m++] = (double)(r[R_END] - r[R_START]);
        }
        snprintf(l, sizeof l, "%s kernel end-start (runs %.0f us)", p ? nb : na, W[p]->ns / 1e3);
        metric(p ? "kernel_wall_b_us" : "kernel_wall_a_us", l, stretch, m, 1e3, "us");
    }
    jint("holes_truncated", (long long)trunc);
    free(stretch);
    free(hole);
    free(s);
    free(sa);
    free(sb);
    free(gap);
    free(kgap);
    for (int p = 0; p < 2; p++) {
        free(slice[p]);
        free(kper[p]);
    }
}

static void host_share(const struct wres *r, const char *key, const char *label)
{
    double t = (double)(r->tend - r->tgo);
    value(key, label, t > 0 ? 100.0 * (double)r->n * (double)r->ns / t : NAN, "%");
}

static int sec_pair(const char *key, const char *title, const char *ka, uint64_t nsa, const char *kb, uint64_t nsb,
                    uint64_t dur_ms)
{
    table_head(title);
    jopen(key, '{');
    struct worker w[2];
    struct wres r[2];
    memset(r, 0, sizeof r);
    if (spawn(&w[0], "greedy", nsa, dur_ms, 0, ka) || spawn(&w[1], "greedy", nsb, dur_ms, 0, kb) ||
        run_workers(2, w, r)) {
        jclose();
        return -1;
    }
    jint("kernels_a", (long long)r[0].n);
    jint("kernels_b", (long long)r[1].n);
    if (g_stamps)
        analyze_pair(&r[0], &r[1], ka, kb);
    else {
        char l[128];
        snprintf(l, sizeof l, "%s: kernels x duration / its run time (host)", ka);
        host_share(&r[0], "share_a_pct", l);
        snprintf(l, sizeof l, "%s: kernels x duration / its run time (host)", kb);
        host_share(&r[1], "share_b_pct", l);
    }
    jclose();
    wres_free(&r[0]);
    wres_free(&r[1]);
    return 0;
}

static int sec_streams(struct gctx *g)
{
    CK(use(g));
    table_head("e2: one process, two streams, 200 us kernels on each");
    jopen("e2_two_streams", '{');
    CUstream s2;
    CK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    enum { N = 1500 };
    const uint64_t ns = 200000;
    CUdeviceptr d;
    if (recs_alloc(&d, 2 * N))
        return -1;
    uint64_t t0 = mono();
    for (int i = 0; i < N; i++) {
        CK(launch(g, g->s, ns, d ? d + (CUdeviceptr)(2 * i) * REC_BYTES : 0));
        CK(launch(g, s2, ns, d ? d + (CUdeviceptr)(2 * i + 1) * REC_BYTES : 0));
    }
    CK(cuStreamSynchronize(g->s));
    CK(cuStreamSynchronize(s2));
    uint64_t t1 = mono();
    double serial = 2.0 * N * ns;
    value("host_ms", "host: all launched to both synchronized", (double)(t1 - t0) / 1e6, "ms");
    value("serial_ms", "  the kernels' total if run one at a time", serial / 1e6, "ms");
    if (g_stamps) {
        uint64_t *h;
        if (recs_fetch(&h, d, 2 * N))
            return -1;
        struct seg *x = calloc(N, sizeof *x), *y = calloc(N, sizeof *y);
        size_t nx = 0, ny = 0;
        uint64_t lo = UINT64_MAX, hi = 0;
        for (int i = 0; i < 2 * N; i++) {
            const uint64_t *r = REC(h, i);
            if (!r[R_END])
                continue;
            struct seg sg = {r[R_START], r[R_END], i & 1};
            if (i & 1)
                y[ny++] = sg;
            else
                x[nx++] = sg;
            if (sg.a < lo)
                lo = sg.a;
            if (sg.b > hi)
                hi = sg.b;
        }
        double bx = 0, by = 0;
        for (size_t i = 0; i < nx; i++)
            bx += (double)(x[i].b - x[i].a);
        for (size_t i = 0; i < ny; i++)
            by += (double)(y[i].b - y[i].a);
        double both = intersect(x, nx, y, ny);
        value("makespan_ms", "GPU: first start to last end", (double)(hi - lo) / 1e6, "ms");
        value("overlap_pct", "time both streams ran / one stream's busy time",
              100 * both / (bx < by ? bx : by), "%");
        note("overlap", "  do two streams of one process overlap?", both > 0.5 * (bx < by ? bx : by) ? "yes" : "no");
        free(x);
        free(y);
        free(h);
    } else {
        note("overlap", "  do two streams of one process overlap?",
             (double)(t1 - t0) < 0.75 * serial ? "yes (host time)" : "no (host time)");
    }
    jclose();
    return 0;
}

/* A light process (20 us kernel, synchronized, every ~2 ms) alone and beside a greedy one. */
/* Only the launches made between w0 and w1 (CLOCK_MONOTONIC) count. */
static void light_metrics(const char *key, const char *label, const uint64_t *tl, const uint64_t *td,
                          const uint64_t *rec, uint64_t n, uint64_t ns, double w0, double w1)
{
    jopen(key, '{');
    double *v = calloc(n + 1, sizeof(double));
    int m = 0;
    char l[128];
    if (g_stamps) {
        for (uint64_t i = 0; i < n; i++)
            if (REC(rec, i)[R_END] && tl[i] >= w0 && tl[i] <= w1)
                v[m++] = gt_to_mono(REC(rec, i)[R_START]) - (double)tl[i];
        snprintf(l, sizeof l, "%s: launch call to kernel start", label);
        metric("start_delay_us", l, v, m, 1e3, "us");
    }
    m = 0;
    for (uint64_t i = 0; i < n; i++)
        if (tl[i] >= w0 && tl[i] <= w1)
            v[m++] = (double)(td[i] - tl[i]) - (double)ns;
    snprintf(l, sizeof l, "%s: launch+sync time - kernel time", label);
    metric("extra_us", l, v, m, 1e3, "us");
    free(v);
    jclose();
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Where each light kernel fell among the greedy one's slices. */
static void light_phase(const struct wres *G, const struct wres *L, double w0, double w1)
{
    uint64_t trunc = 0;
    size_t cap = seg_count(G->rec, G->n) + 1;
    struct seg *gs = calloc(cap, sizeof *gs);
    size_t ng = segments(G->rec, G->n, 0, gs, 0, &trunc);
    if (!ng || !L->n) {
        free(gs);
        return;
    }
    /* greedy's segment ends and starts, sorted, for binary searches */
    uint64_t *ends = calloc(ng, 8), *starts = calloc(ng, 8);
    for (size_t i = 0; i < ng; i++) {
        ends[i] = gs[i].b;
        starts[i] = gs[i].a;
    }
    qsort(ends, ng, 8, cmp_u64);
    qsort(starts, ng, 8, cmp_u64);
    double *kept = calloc(L->n, sizeof(double)), *sw = calloc(L->n, sizeof(double));
    double *back = calloc(L->n, sizeof(double)), *run = calloc(L->n, sizeof(double));
    int nk = 0, nb = 0, nr = 0;
    uint64_t prev_end = 0;
    for (uint64_t i = 0; i < L->n; i++) {
        const uint64_t *r = REC(L->rec, i);
        if (!r[R_END] || L->tl[i] < w0 || L->tl[i] > w1)
            continue;
        uint64_t ls = r[R_START], le = r[R_END];
        /* greedy's last segment end before the light kernel started */
        size_t lo = 0, hi = ng;
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (ends[mid] <= ls)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo > 0 && ends[lo - 1] > starts[0]) {
            uint64_t gend = ends[lo - 1];
            kept[nk] = -mono_to_gt_rel(L->tl[i], gend);
            sw[nk++] = (double)(ls - gend);
            /* the greedy run that ended there began at the first greedy start after the
             * previous light kernel */
            if (prev_end) {
                size_t a = 0, b = ng;
                while (a < b) {
                    size_t mid = (a + b) / 2;
                    if (starts[mid] < prev_end)
                        a = mid + 1;
                    else
                        b = mid;
                }
                if (a < ng && starts[a] < gend)
                    run[nr++] = (double)(gend - starts[a]);
            }
        }
        /* greedy's first segment start after the light kernel ended */
        lo = 0, hi = ng;
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (starts[mid] < le)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo < ng)
            back[nb++] = (double)(starts[lo] - le);
        prev_end = le;
    }
    metric("greedy_kept_gpu_after_launch_us", "greedy kept the GPU after the light launch call", kept, nk, 1e3, "us");
    metric("switch_to_light_us", "greedy's last stamp to the light kernel's start", sw, nk, 1e3, "us");
    metric("greedy_back_after_light_us", "light kernel's end to greedy's next start", back, nb, 1e3, "us");
    metric("greedy_run_between_us", "greedy's run between two light kernels", run, nr, 1e3, "us");
    free(kept);
    free(sw);
    free(back);
    free(run);
    free(ends);
    free(starts);
    free(gs);
}

static int sec_light(struct gctx *g)
{
    table_head("e3: a light process (20 us kernel + sync every ~2 ms) beside a greedy one (200 us kernels)");
    jopen("e3_light_beside_greedy", '{');
    const uint64_t ns = 20000, period = 2000000;
    /* alone, in this process */
    if (clock_fix())
        return -1;
    CK(use(g));
    uint64_t max = 400, n = 0;
    CUdeviceptr d;
    if (recs_alloc(&d, max))
        return -1;
    uint64_t *tl = calloc(max, 8), *td = calloc(max, 8), *h;
    if (light_loop(g, ns, period, 500000000ull, d, max, tl, td, &n) || recs_fetch(&h, d, n))
        return -1;
    if (clock_fix())
        return -1;
    light_metrics("alone", "alone", tl, td, h, n, ns, 0, INFINITY);
    free(tl);
    free(td);
    free(h);
    struct worker w[2];
    struct wres r[2];
    memset(r, 0, sizeof r);
    if (spawn(&w[0], "greedy", 200000, 2000, 0, "greedy") || spawn(&w[1], "light", ns, 2000, period / 1000, "light") ||
        run_workers(2, w, r)) {
        jclose();
        return -1;
    }
    if (clock_fix())
        return -1;
    /* beside greedy: the light launches made while the greedy one had work on the GPU */
    double w0 = (double)r[0].tgo, w1 = (double)r[0].tend;
    if (g_stamps && r[0].n) {
        uint64_t first = UINT64_MAX, last = 0;
        for (uint64_t i = 0; i < r[0].n; i++) {
            const uint64_t *q = REC(r[0].rec, i);
            if (!q[R_END])
                continue;
            if (q[R_START] < first)
                first = q[R_START];
            if (q[R_END] > last)
                last = q[R_END];
        }
        if (last) {
            w0 = gt_to_mono(first);
            w1 = gt_to_mono(last);
        }
    }
    light_metrics("beside_greedy", "beside greedy", r[1].tl, r[1].td, r[1].rec, r[1].n, ns, w0, w1);
    if (g_stamps)
        light_phase(&r[0], &r[1], w0, w1);
    host_share(&r[0], "greedy_share_pct", "greedy: kernels x 200 us / its run time");
    jclose();
    wres_free(&r[0]);
    wres_free(&r[1]);
    return 0;
}

/* ---- main ---- */
static int device_info(void)
{
    int v = 0, cnt = 0;
    char name[256] = "";
    CK(cuDriverGetVersion(&v));
    CK(cuDeviceGetCount(&cnt));
    CK(cuDeviceGet(&g_dev, g_devidx));
    CK(cuDeviceGetName(name, sizeof name, g_dev));
    int maj = 0, min = 0, sms = 0, clk = 0, cmode = 0;
    cuDeviceGetAttribute(&maj, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, g_dev);
    cuDeviceGetAttribute(&min, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, g_dev);
    cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, g_dev);
    cuDeviceGetAttribute(&clk, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, g_dev);
    cuDeviceGetAttribute(&cmode, CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, g_dev);
    size_t mem = 0;
    cuDeviceTotalMem_v2(&mem, g_dev);
    g_sim = strstr(name, "SimGPU") != NULL;
    struct utsname u;
    uname(&u);
    jopen("device", '{');
    jstr("name", name);
    jint("index", g_devidx);
    jint("count", cnt);
    jint("driver_api_version", v);
    jstr("libcuda", g_libpath);
    jint("cc_major", maj);
    jint("cc_minor", min);
    jint("sm_count", sms);
    jint("clock_khz", clk);
    jint("compute_mode", cmode);
    jint("memory_bytes", (long long)mem);
    jbool("simgpu", g_sim);
    jstr("kernel", u.release);
    jint("host_cpus", sysconf(_SC_NPROCESSORS_ONLN));
    jclose();
    out("device %d of %d: %s, sm_%d%d, %d SMs, %.1f GiB, compute mode %d; driver API %d.%d; %s\n", g_devidx, cnt, name,
        maj, min, sms, (double)mem / (1u << 30), cmode, v / 1000, v % 1000 / 10, g_libpath);
    out("host: Linux %s, %ld CPUs\n", u.release, sysconf(_SC_NPROCESSORS_ONLN));
    return 0;
}

/* Does spin write its stamps? On a GPU yes; simgpu runs no code. */
static int probe_stamps(struct gctx *g)
{
    g_stamps = 1;
    CUdeviceptr d;
    if (recs_alloc(&d, 1))
        return -1;
    CK(launch(g, g->s, 2000, d));
    CK(cuStreamSynchronize(g->s));
    uint64_t r[REC_WORDS];
    CK(cuMemcpyDtoH_v2(r, d, sizeof r));
    g_stamps = r[R_START] != 0 && r[R_END] >= r[R_START] + 1000;
    return 0;
}

typedef int (*section_fn)(struct gctx *);

static void section(const char *name, section_fn fn, struct gctx *g)
{
    uint64_t t0 = mono();
    int rc = fn(g);
    if (rc) {
        g_failures++;
        note_error("section %s failed", name);
        while (jdepth > 1) /* a section that failed half-way leaves its object open */
            jclose();
    }
    fprintf(stderr, "gpucheck: section %s: %.1f s\n", name, (double)(mono() - t0) / 1e9);
    json_flush();
}

static int s_clock(struct gctx *g)
{
    if (!g_stamps)
        return 0;
    table_head("clock: %globaltimer against CLOCK_MONOTONIC");
    return sec_clock(g, "clock", 0);
}

static int s_e1(struct gctx *g)
{
    (void)g;
    return sec_pair("e1_greedy_pair", "e1: two greedy processes, 200 us kernels back to back, 3 s", "A", 200000, "B",
                    200000, 3000);
}

static int s_e4(struct gctx *g)
{
    (void)g;
    return sec_pair("e4_long_vs_short", "e4: 20 ms kernels beside 200 us kernels, two processes, 2 s", "long",
                    20000000, "short", 200000, 2000);
}

static int s_clock_end(struct gctx *g)
{
    if (!g_stamps)
        return 0;
    table_head("clock again at the end (drift)");
    return sec_clock(g, "clock_end", 1);
}

/* ---- load mode: one process of a compute-share row (tests/gpu/gpucheck-shares.sh) ----
 *
 *   gpucheck load --kernel-us N [--sync-every K [--cpu-gap-us U] [--poll] | --streams M |
 *                 --graph G] [--queue-us Q] --seconds S [--start-at MONO_NS] --stamps FILE
 *
 * Greedy (no --sync-every): spin(N us) kernels back to back, at most about Q us (default
 * 4000) queued, waited for in batches of about 1 ms through events; --streams M spreads
 * them round-robin over M streams, each with that queue (a load's share then counts
 * the union of its kernels' pieces: what ran at once counts once); --graph G captures
 * each batch of G kernels into a graph (global capture mode, during the run), instantiates
 * and launches it (cuGraphLaunch), a graph at a time. A step loop: K
 * kernels, cuStreamSynchronize (--poll: cuStreamQuery until done), then U us of CPU
 * spinning. Every kernel stamps its start, its end and its holes (another context had the
 * GPU) into device memory, copied back in batches after the run, so what libvgpu adds
 * (its events, syncs) is the run's alone. FILE gets a header line, then one line per
 * piece of a kernel that ran: "start_ns end_ns kernel_index" on the GPU's %globaltimer.
 * In host-only mode (simgpu: no stamps) the pieces are launch-time accounting: a
 * busy_<N>us kernel runs N us from its launch's return or its predecessor's end. */

static volatile sig_atomic_t g_load_stop;

static void thread_cpu(char *buf, size_t n)
{
    /* Each thread's CPU time (user + system), by name: the app's, and libvgpu's holder
     * and broker threads when it is preloaded. */
    buf[0] = 0;
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%d/task", (int)getpid());
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    long hz = sysconf(_SC_CLK_TCK);
    size_t len = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char p[384], comm[64] = "?", st[1024];
        snprintf(p, sizeof p, "%s/%s/comm", dir, e->d_name);
        FILE *f = fopen(p, "r");
        if (f) {
            if (fgets(comm, sizeof comm, f))
                comm[strcspn(comm, "\n")] = 0;
            fclose(f);
        }
        for (char *c = comm; *c; c++)
            if (*c == ' ' || *c == ',' || *c == ':')
                *c = '_';
        snprintf(p, sizeof p, "%s/%s/stat", dir, e->d_name);
        f = fopen(p, "r");
        if (!f)
            continue;
        size_t k = fread(st, 1, sizeof st - 1, f);
        fclose(f);
        st[k] = 0;
        char *rp = strrchr(st, ')');
        unsigned long ut = 0, stt = 0;
        /* after ")": state(3) ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime(14) stime(15) */
        if (!rp || sscanf(rp + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &stt) != 2)
            continue;
        int w = snprintf(buf + len, n - len, "%s%s:%.2f", len ? "," : "", comm, (double)(ut + stt) / (double)hz);
        if (w < 0 || (size_t)w >= n - len)
            break;
        len += (size_t)w;
    }
    closedir(d);
}

static void spin_cpu(uint64_t ns)
{
    uint64_t end = mono() + ns;
    while (mono() < end)
        ;
}

static int load_main(int argc, char **argv)
{
    uint64_t kus = 0, sync_every = 0, gap_us = 0, queue_us = 4000, start_at = 0, nstreams = 1, graph_k = 0;
    double seconds = 0;
    int poll = 0;
    const char *stamps = NULL;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--poll")) {
            poll = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "gpucheck load: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--kernel-us"))
            kus = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--sync-every"))
            sync_every = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--cpu-gap-us"))
            gap_us = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--queue-us"))
            queue_us = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--streams"))
            nstreams = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--graph"))
            graph_k = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--seconds"))
            seconds = atof(v);
        else if (!strcmp(a, "--start-at"))
            start_at = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--stamps"))
            stamps = v;
        else {
            fprintf(stderr, "gpucheck load: unknown option %s\n", a);
            return 2;
        }
    }
    if (!kus || seconds <= 0 || !stamps || nstreams < 1 || nstreams > 4 || graph_k > 64 ||
        ((nstreams > 1 || graph_k) && sync_every) || (nstreams > 1 && graph_k)) {
        fprintf(stderr, "usage: gpucheck load --kernel-us N [--sync-every K [--cpu-gap-us U] [--poll] | "
                        "--streams 1-4 | --graph 1-64] [--queue-us Q] --seconds S [--start-at MONO_NS] "
                        "--stamps FILE\n");
        return 2;
    }
    if (getenv("GPUCHECK_DEVICE"))
        g_devidx = atoi(getenv("GPUCHECK_DEVICE"));
    alarm((unsigned)seconds + 90);
    uint64_t ns = kus * 1000, dur = (uint64_t)(seconds * 1e9);
    struct gctx g;
    g_main = &g;
    if (load_driver() || cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&g_dev, g_devidx) != CUDA_SUCCESS ||
        ctx_open(&g, CU_CTX_SCHED_AUTO) || probe_stamps(&g)) {
        fprintf(stderr, "gpucheck load: no context, or the kernels did not load\n");
        return 2;
    }
    /* Room for every kernel the run can hold (each runs at least N us), and a queue's worth. */
    uint64_t max = nstreams * (dur / ns + 4 * (queue_us * 1000 / ns + 1)) + 1024;
    CUdeviceptr d = 0;
    if (recs_alloc(&d, max))
        return 2;
    uint64_t *tl = g_stamps ? NULL : calloc(max, 8); /* host-only: when each launch returned */
    if (!g_stamps && !tl)
        return 2;
    uint64_t batch = 1000000 / ns, depth = queue_us * 1000 / ns; /* kernels per ~1 ms batch; queued */
    if (batch < 1)
        batch = 1;
    if (batch > 64)
        batch = 64;
    if (graph_k)
        batch = graph_k;
    if (graph_k && (!cuStreamBeginCapture_v2 || !cuStreamEndCapture || !cuGraphInstantiateWithFlags ||
                    !cuGraphLaunch || !cuGraphExecDestroy || !cuGraphDestroy)) {
        fprintf(stderr, "gpucheck load: the driver lacks the graph entry points\n");
        return 2;
    }
    if (depth < 1)
        depth = 1;
    uint64_t nb = depth / batch; /* batches kept in flight */
    if (nb < 1)
        nb = 1;
    CUevent ev[4][65];
    if (nb > 64)
        nb = 64;
    CUstream st[4] = {g.s};
    CUstream cs = NULL; /* --graph: the stream captured into */
    CUgraph gring[65] = {0};
    CUgraphExec xring[65] = {0};
    if (graph_k)
        CK(cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING));
    for (uint64_t k = 0; k < nstreams; k++) {
        if (k)
            CK(cuStreamCreate(&st[k], CU_STREAM_NON_BLOCKING));
        for (uint64_t i = 0; i <= nb; i++)
            CK(cuEventCreate(&ev[k][i], CU_EVENT_DISABLE_TIMING));
    }
    double late_ms = 0;
    if (start_at) {
        uint64_t now = mono();
        if (now > start_at)
            late_ms = (double)(now - start_at) / 1e6;
        else
            sleep_until(start_at);
    }
    uint64_t t0 = mono(), tend = t0 + dur, n = 0, b = 0, steps = 0;
#define LAUNCH_ONE()                                                                                                  \
    do {                                                                                                              \
        CK(launch(&g, st[n % nstreams], ns, d ? d + (CUdeviceptr)n * REC_BYTES : 0));                                 \
        if (tl)                                                                                                       \
            tl[n] = mono();                                                                                           \
        n++;                                                                                                          \
    } while (0)
    if (!sync_every) {
        while (n + batch * nstreams <= max && mono() < tend && !g_load_stop) {
            if (graph_k) {
                /* A graph of K kernels, captured in global mode now, while libvgpu's threads
                 * run, then launched. Its slot's previous graph has completed (its event
                 * was waited for at the end of the previous round). */
                uint64_t slot = b % (nb + 1), n0 = n;
                if (xring[slot])
                    CK(cuGraphExecDestroy(xring[slot]));
                if (gring[slot])
                    CK(cuGraphDestroy(gring[slot]));
                xring[slot] = NULL;
                gring[slot] = NULL;
                CK(cuStreamBeginCapture_v2(cs, CU_STREAM_CAPTURE_MODE_GLOBAL));
                for (uint64_t k = 0; k < batch; k++, n++)
                    CK(launch(&g, cs, ns, d ? d + (CUdeviceptr)n * REC_BYTES : 0));
                CK(cuStreamEndCapture(cs, &gring[slot]));
                CK(cuGraphInstantiateWithFlags(&xring[slot], gring[slot], 0));
                CK(cuGraphLaunch(xring[slot], st[0]));
                if (tl)
                    for (uint64_t i = n0; i < n; i++)
                        tl[i] = mono();
            } else {
                /* Each stream has its own ~queue_us queued: a batch per stream, its own events. */
                for (uint64_t k = 0; k < batch * nstreams; k++)
                    LAUNCH_ONE();
            }
            for (uint64_t k = 0; k < nstreams; k++)
                CK(cuEventRecord(ev[k][b % (nb + 1)], st[k]));
            b++;
            for (uint64_t k = 0; k < nstreams && b > nb; k++)
                CK(cuEventSynchronize(ev[k][(b - 1 - nb) % (nb + 1)]));
        }
    } else {
        while (n + sync_every <= max && mono() < tend && !g_load_stop) {
            for (uint64_t k = 0; k < sync_every; k++)
                LAUNCH_ONE();
            if (poll) {
                CUresult r;
                while ((r = cuStreamQuery(g.s)) == CUDA_ERROR_NOT_READY)
                    ;
                CK(r);
            } else {
                CK(cuStreamSynchronize(g.s));
            }
            steps++;
            if (gap_us)
                spin_cpu(gap_us * 1000);
        }
    }
#undef LAUNCH_ONE
    for (uint64_t k = 0; k < nstreams; k++)
        CK(cuStreamSynchronize(st[k]));
    for (uint64_t i = 0; i <= nb && graph_k; i++) {
        if (xring[i])
            CK(cuGraphExecDestroy(xring[i]));
        if (gring[i])
            CK(cuGraphDestroy(gring[i]));
    }
    uint64_t t1 = mono();
    char cpu[1024];
    thread_cpu(cpu, sizeof cpu);
    FILE *f = fopen(stamps, "w");
    if (!f) {
        fprintf(stderr, "gpucheck load: %s: %s\n", stamps, strerror(errno));
        return 2;
    }
    fprintf(f,
            "# gpucheck-load pid=%d mode=%s kernel_us=%" PRIu64 " sync_every=%" PRIu64 " cpu_gap_us=%" PRIu64
            " poll=%d streams=%" PRIu64 " graph=%" PRIu64 " queue_us=%" PRIu64 " kernels=%" PRIu64 " steps=%" PRIu64 " late_ms=%.3f run_s=%.3f"
            " preload=%s cpu_s=%s\n",
            (int)getpid(), g_stamps ? "gpu-timeline" : "host-only", kus, sync_every, gap_us, poll, nstreams, graph_k, queue_us, n,
            steps, late_ms, (double)(t1 - t0) / 1e9, getenv("LD_PRELOAD") && *getenv("LD_PRELOAD") ? "yes" : "no",
            cpu);
    uint64_t chunk = 8192, missing = 0; /* 8 MiB of records at a time */
    uint64_t *h = malloc(chunk * REC_BYTES);
    if (!h)
        return 2;
    uint64_t prev_end = 0;
    for (uint64_t i0 = 0; i0 < n; i0 += chunk) {
        uint64_t m = n - i0 < chunk ? n - i0 : chunk;
        if (g_stamps)
            CK(cuMemcpyDtoH_v2(h, d + (CUdeviceptr)i0 * REC_BYTES, m * REC_BYTES));
        for (uint64_t j = 0; j < m; j++) {
            uint64_t i = i0 + j;
            if (!g_stamps) {
                uint64_t s = tl[i] > prev_end ? tl[i] : prev_end;
                prev_end = s + ns;
                fprintf(f, "%" PRIu64 " %" PRIu64 " %" PRIu64 "\n", s, prev_end, i);
                continue;
            }
            const uint64_t *r = REC(h, j);
            if (!r[R_END]) {
                missing++;
                continue;
            }
            uint64_t cur = r[R_START], ng = r[R_NGAP];
            for (uint64_t k = 0; k < ng && k < MAX_GAPS; k++) {
                uint64_t ga = r[R_GAP0 + 2 * k], gb = r[R_GAP0 + 2 * k + 1];
                if (ga > cur)
                    fprintf(f, "%" PRIu64 " %" PRIu64 " %" PRIu64 "\n", cur, ga, i);
                cur = gb;
            }
            if (r[R_END] > cur)
                fprintf(f, "%" PRIu64 " %" PRIu64 " %" PRIu64 "\n", cur, r[R_END], i);
        }
    }
    free(h);
    if (fclose(f) != 0)
        return 2;
    if (missing)
        fprintf(stderr, "gpucheck load: %" PRIu64 " of %" PRIu64 " kernels wrote no stamps\n", missing, n);
    printf("load pid=%d kernels=%" PRIu64 " run_s=%.3f late_ms=%.3f cpu_s=%s\n", (int)getpid(), n,
           (double)(t1 - t0) / 1e9, late_ms, cpu);
    return 0;
}

/* ---- shares mode: a row's stamps merged on one timeline ----
 *
 *   gpucheck shares [--warm S] [--window S] [--title T] [--timeline FILE] [--tsv FILE]
 *                   NAME TARGET STAMPS [NAME TARGET STAMPS ...]
 *
 * The window starts --warm (0.5) s after the row's first kernel and lasts --window (5) s.
 * For each load: its share of the window (the pieces its kernels ran, holes taken out),
 * against TARGET (a percent, or "-"); then the GPU's idle time, the time two loads ran at
 * once, and the hand-over gaps: the GPU idle between one load's piece and another's (a
 * switch with no gap counts 0). A load's "runs" are its spells on the GPU between two
 * hand-overs; its kernels that started in the window, and the % of them cut by a switch
 * (a hole: the GPU ran another context in the middle of the kernel, i.e. both had work
 * queued and the hardware time-sliced them). --timeline FILE ("start end pid" per kernel, CLOCK_MONOTONIC, as
 * build/tests/simgpu_timeline prints) takes the hand-overs from simgpu's engine instead, in
 * host-only mode, where the stamps are launch-time accounting on the same clock. --tsv appends one line per load:
 * title, name, target, achieved, idle %, overlap %, hand-overs, gap p50 us, gap p99 us,
 * kernels, cut %. */

struct piece {
    uint64_t a, b, k; /* k: the kernel's index in its load (a kernel cut by holes has several pieces) */
    int who;
};

static int cmp_piece(const void *x, const void *y)
{
    const struct piece *p = x, *q = y;
    return p->a < q->a ? -1 : p->a > q->a ? 1 : p->who - q->who;
}

struct pieces {
    struct piece *v;
    size_t n, cap;
};

static int pieces_add(struct pieces *p, uint64_t a, uint64_t b, uint64_t k, int who)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 65536;
        struct piece *v = realloc(p->v, cap * sizeof *v);
        if (!v)
            return -1;
        p->v = v;
        p->cap = cap;
    }
    p->v[p->n++] = (struct piece){a, b, k, who};
    return 0;
}

#define SH_MAX 8

/* Hand-overs in a sorted list of pieces over [w0, w1): gaps (ns) into *gaps, runs per load. */
static size_t handovers(const struct piece *v, size_t n, uint64_t w0, uint64_t w1, double **gaps, double **runs,
                        size_t *nruns)
{
    size_t ng = 0;
    *gaps = malloc(sizeof(double) * (n + 1));
    for (int k = 0; k < SH_MAX; k++) {
        runs[k] = malloc(sizeof(double) * (n + 1));
        nruns[k] = 0;
    }
    uint64_t reach = 0, run0 = 0;
    int owner = -1;
    for (size_t i = 0; i < n; i++) {
        if (v[i].b <= w0 || v[i].a >= w1)
            continue;
        if (owner < 0) {
            owner = v[i].who;
            run0 = v[i].a;
        } else if (v[i].who != owner) {
            (*gaps)[ng++] = v[i].a > reach ? (double)(v[i].a - reach) : 0;
            runs[owner][nruns[owner]++] = (double)(reach - run0);
            owner = v[i].who;
            run0 = v[i].a;
        }
        if (v[i].b > reach)
            reach = v[i].b;
    }
    return ng;
}

static int shares_main(int argc, char **argv)
{
    double warm = 0.5, window = 5;
    const char *title = "", *timeline = NULL, *tsv = NULL;
    const char *name[SH_MAX], *target[SH_MAX], *file[SH_MAX];
    int nl = 0;
    for (int i = 2; i < argc; i++) {
        if (!strncmp(argv[i], "--", 2)) {
            if (i + 1 >= argc) {
                fprintf(stderr, "gpucheck shares: %s needs a value\n", argv[i]);
                return 2;
            }
            const char *a = argv[i], *v = argv[++i];
            if (!strcmp(a, "--warm"))
                warm = atof(v);
            else if (!strcmp(a, "--window"))
                window = atof(v);
            else if (!strcmp(a, "--title"))
                title = v;
            else if (!strcmp(a, "--timeline"))
                timeline = v;
            else if (!strcmp(a, "--tsv"))
                tsv = v;
            else {
                fprintf(stderr, "gpucheck shares: unknown option %s\n", a);
                return 2;
            }
            continue;
        }
        if (i + 2 >= argc || nl == SH_MAX) {
            fprintf(stderr, "usage: gpucheck shares [--warm S] [--window S] [--title T] [--timeline FILE] "
                            "[--tsv FILE] NAME TARGET STAMPS ... (at most %d loads)\n", SH_MAX);
            return 2;
        }
        name[nl] = argv[i];
        target[nl] = argv[i + 1];
        file[nl] = argv[i + 2];
        nl++;
        i += 2;
    }
    if (!nl) {
        fprintf(stderr, "gpucheck shares: no loads\n");
        return 2;
    }
    struct pieces P = {0};
    int pid[SH_MAX], host_only = 0;
    char cpu[SH_MAX][256], mode[SH_MAX][32];
    double late[SH_MAX];
    for (int k = 0; k < nl; k++) {
        FILE *f = fopen(file[k], "r");
        if (!f) {
            fprintf(stderr, "gpucheck shares: %s: %s\n", file[k], strerror(errno));
            return 2;
        }
        char line[2048];
        pid[k] = -1;
        late[k] = 0;
        snprintf(cpu[k], sizeof cpu[k], "?");
        snprintf(mode[k], sizeof mode[k], "?");
        while (fgets(line, sizeof line, f)) {
            if (line[0] == '#') {
                char *p;
                if ((p = strstr(line, " pid=")))
                    pid[k] = atoi(p + 5);
                if ((p = strstr(line, " late_ms=")))
                    late[k] = atof(p + 9);
                if ((p = strstr(line, " mode=")))
                    sscanf(p + 6, "%31s", mode[k]);
                if ((p = strstr(line, " cpu_s=")))
                    sscanf(p + 7, "%255s", cpu[k]);
                continue;
            }
            unsigned long long a, b, idx = UINT64_MAX;
            if (sscanf(line, "%llu %llu %llu", &a, &b, &idx) >= 2 && b > a && pieces_add(&P, a, b, idx, k))
                return 2;
        }
        fclose(f);
        if (!strcmp(mode[k], "host-only"))
            host_only = 1;
    }
    if (!P.n) {
        fprintf(stderr, "gpucheck shares: no stamps in the files\n");
        return 2;
    }
    qsort(P.v, P.n, sizeof *P.v, cmp_piece);
    uint64_t first = P.v[0].a, last = 0;
    for (size_t i = 0; i < P.n; i++)
        if (P.v[i].b > last)
            last = P.v[i].b;
    uint64_t w0 = first + (uint64_t)(warm * 1e9), w1 = w0 + (uint64_t)(window * 1e9);
    double W = (double)(w1 - w0);
    int short_run = last < w1;
    double busy[SH_MAX] = {0}, uni = 0;
    uint64_t reach = w0, nk[SH_MAX] = {0}, ncut[SH_MAX] = {0}, lastk[SH_MAX], reach_w[SH_MAX];
    int marked[SH_MAX] = {0};
    for (int k = 0; k < SH_MAX; k++) {
        lastk[k] = UINT64_MAX;
        reach_w[k] = w0;
    }
    for (size_t i = 0; i < P.n; i++) {
        uint64_t a = P.v[i].a < w0 ? w0 : P.v[i].a, b = P.v[i].b > w1 ? w1 : P.v[i].b;
        if (b <= a)
            continue;
        /* Kernels in the window, and those cut by a switch: a kernel's pieces are in order,
         * and another load's pieces may come between them. */
        int w = P.v[i].who;
        if (P.v[i].k != UINT64_MAX) {
            if (P.v[i].k != lastk[w]) {
                nk[w]++;
                lastk[w] = P.v[i].k;
                marked[w] = 0;
            } else if (!marked[w]) {
                ncut[w]++;
                marked[w] = 1;
            }
        }
        /* A load's busy time is the union of its pieces: kernels of its streams that ran
         * at once count once (one stream's pieces never overlap). */
        if (b > reach_w[w]) {
            busy[w] += (double)(b - (a > reach_w[w] ? a : reach_w[w]));
            reach_w[w] = b;
        }
        if (b > reach) {
            uni += (double)(b - (a > reach ? a : reach));
            reach = b;
        }
    }
    /* Hand-overs: from the stamps, or from simgpu's engine timeline in host-only mode. */
    struct pieces T = {0};
    const struct piece *hv = P.v;
    size_t hn = P.n;
    const char *hfrom = host_only ? "launch-time accounting (not the engine)" : "the GPU's stamps";
    if (timeline) {
        FILE *f = fopen(timeline, "r");
        unsigned long long a, b;
        int p;
        while (f && fscanf(f, "%llu %llu %d", &a, &b, &p) == 3)
            for (int k = 0; k < nl; k++)
                if (p == pid[k] && b > a && pieces_add(&T, a, b, UINT64_MAX, k))
                    return 2;
        if (f)
            fclose(f);
        if (T.n) {
            qsort(T.v, T.n, sizeof *T.v, cmp_piece);
            hv = T.v;
            hn = T.n;
            hfrom = "simgpu's engine timeline: its last 4096 kernels, in the window";
        }
    }
    double *gaps, *runs[SH_MAX];
    size_t nruns[SH_MAX];
    size_t ng = handovers(hv, hn, w0, w1, &gaps, runs, nruns);
    struct st gs = stats(gaps, (int)ng);
    /* Two loads at once: the loads' own busy times (each a union) beyond the GPU's. */
    double sum_busy = 0;
    for (int k = 0; k < nl; k++)
        sum_busy += busy[k];
    double idle = 100 - uni / W * 100, overlap = (sum_busy - uni) / W * 100;
    printf("\n== %s\n", title);
    printf("%-22s %7s %8s %7s %9s %9s %6s  %s\n", "load", "target", "achieved", "error", "runs p50", "kernels",
           "cut %", "CPU s by thread");
    /* A load that arrives late (its first piece 200 ms or more after the row's first): how
     * long the others' work ran on after its first piece began, until they paused 50 ms
     * (a higher priority's hand-over latency), and its share from its first piece on. */
    double arrive_s[SH_MAX], pause_ms[SH_MAX], after[SH_MAX];
    for (int k = 0; k < nl; k++) {
        uint64_t fk = 0;
        for (size_t i = 0; i < P.n && !fk; i++)
            if (P.v[i].who == k)
                fk = P.v[i].a;
        arrive_s[k] = pause_ms[k] = after[k] = NAN;
        if (!fk || fk < first + 200000000ull || fk >= w1)
            continue;
        uint64_t pause_end = fk, reach_k = fk;
        double mine = 0;
        int paused = 0;
        for (size_t i = 0; i < P.n; i++) {
            const struct piece *q = &P.v[i];
            if (q->who == k) {
                uint64_t a = q->a > reach_k ? q->a : reach_k, b = q->b < w1 ? q->b : w1;
                if (b > a) {
                    mine += (double)(b - a);
                    reach_k = b;
                }
            } else if (!paused && q->b > fk) {
                if (q->a > pause_end + 50000000ull)
                    paused = 1;
                else if (q->b > pause_end)
                    pause_end = q->b;
            }
        }
        arrive_s[k] = (double)(fk - first) / 1e9;
        pause_ms[k] = (double)(pause_end - fk) / 1e6;
        after[k] = mine / (double)(w1 - fk) * 100;
    }
    FILE *t = tsv ? fopen(tsv, "a") : NULL;
    for (int k = 0; k < nl; k++) {
        struct st rs = stats(runs[k], (int)nruns[k]);
        double got = busy[k] / W * 100;
        char tg[16] = "-", er[16] = "-", rp[32] = "-";
        if (strcmp(target[k], "-")) {
            snprintf(tg, sizeof tg, "%.2f", atof(target[k]));
            snprintf(er, sizeof er, "%+.2f", got - atof(target[k]));
        }
        if (rs.n)
            snprintf(rp, sizeof rp, "%.2f ms", rs.p50 / 1e6);
        char cut[16] = "-";
        if (nk[k] && !host_only)
            snprintf(cut, sizeof cut, "%.1f", 100.0 * (double)ncut[k] / (double)nk[k]);
        printf("%-22s %7s %8.2f %7s %9s %9" PRIu64 " %6s  %s%s\n", name[k], tg, got, er, rp, nk[k], cut, cpu[k],
               late[k] > 0 ? "  (started late)" : "");
        if (t)
            fprintf(t, "%s\t%s\t%s\t%.2f\t%.2f\t%.2f\t%zu\t%.1f\t%.1f\t%" PRIu64 "\t%s\t%.3f\t%.2f\n", title, name[k],
                    target[k], got, idle, overlap, ng, gs.p50 / 1e3, gs.p99 / 1e3, nk[k], cut, pause_ms[k], after[k]);
    }
    if (t)
        fclose(t);
    printf("GPU idle %.2f %%, two loads at once %.2f %%, window %.1f s after %.1f s (%s)\n", idle, overlap,
           window, warm, host_only ? "host-only: launch-time accounting" : "from the GPU's stamps");
    if (ng)
        printf("hand-overs %zu: GPU idle between loads p50 %.1f us, p90 %.1f, p99 %.1f, max %.1f (from %s)\n", ng,
               gs.p50 / 1e3, gs.p90 / 1e3, gs.p99 / 1e3, gs.max / 1e3, hfrom);
    for (int k = 0; k < nl; k++)
        if (isfinite(arrive_s[k]))
            printf("%s arrives at +%.2f s: the others' work ran on %.2f ms after its first kernel began (until "
                   "a 50 ms pause); its share from then %.2f %%\n",
                   name[k], arrive_s[k], pause_ms[k], after[k]);
    if (short_run)
        printf("WARNING: the stamps end %.3f s before the window does\n", (double)(w1 - last) / 1e9);
    free(gaps);
    for (int k = 0; k < SH_MAX; k++)
        free(runs[k]);
    free(P.v);
    free(T.v);
    return 0;
}

/* ---- checks (issue 24, parts 3 and 4): PASS/FAIL/SKIP rows ---- */
static int g_check_fail, g_check_pass, g_check_skip;
static int g_checks_open; /* the JSON array "checks" is open: nothing else may be written until checks_end */

static void check_row(const char *name, const char *expected, const char *got, const char *result)
{
    out("%-52s %-28s %-36s %s\n", name, expected, got, result);
    if (!g_checks_open) {
        jopen("checks", '[');
        g_checks_open = 1;
    }
    jopen(NULL, '{');
    jstr("check", name);
    jstr("expected", expected);
    jstr("got", got);
    jstr("result", result);
    jclose();
    if (strcmp(result, "FAIL") == 0)
        g_check_fail++;
    else if (strcmp(result, "PASS") == 0)
        g_check_pass++;
    else
        g_check_skip++;
}

static void check(const char *name, int ok, const char *expected, const char *gotfmt, ...)
{
    char got[256];
    va_list ap;
    va_start(ap, gotfmt);
    vsnprintf(got, sizeof got, gotfmt, ap);
    va_end(ap);
    check_row(name, expected, got, ok ? "PASS" : "FAIL");
}

static void checks_head(const char *title)
{
    out("\n== %s\n", title);
    out("%-52s %-28s %-36s %s\n", "check", "expected", "got", "result");
}

static const char *errname(CUresult r)
{
    const char *n = NULL;
    if (cuGetErrorName && cuGetErrorName(r, &n) == CUDA_SUCCESS && n)
        return n;
    return "?";
}

static int checks_begin(const char *name, const char *outdir)
{
    g_outname = name;
    g_outdir = outdir;
    setvbuf(stdout, NULL, _IOLBF, 0);
    mkdir(g_outdir, 0755);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s-table.txt", g_outdir, name);
    g_table = fopen(path, "w");
    jopen(NULL, '{');
    jint("gpucheck_version", 1);
    if (getenv("GPUCHECK_DEVICE"))
        g_devidx = atoi(getenv("GPUCHECK_DEVICE"));
    const char *pre = getenv("LD_PRELOAD");
    jstr("ld_preload", pre ? pre : "");
    if (load_driver()) {
        jstr("error", "libcuda.so.1 could not be loaded");
        json_flush();
        return -1;
    }
    return 0;
}

static int checks_end(void)
{
    if (g_checks_open)
        jclose();
    g_checks_open = 0;
    jint("passed", g_check_pass);
    jint("failed", g_check_fail);
    jint("skipped", g_check_skip);
    jstr("errors", g_errors);
    jclose();
    json_flush();
    out("\n%s: %d passed, %d failed, %d skipped; %s/%s.json\n", g_check_fail ? "FAILED" : "done", g_check_pass,
        g_check_fail, g_check_skip, g_outdir, g_outname);
    return g_check_fail ? 1 : 0;
}

/* ---- coverage: is every hooked name's cuGetProcAddress answer a libvgpu hook? ----
 *
 *   LD_PRELOAD=libvgpu.so VGPU_MEMORY_LIMIT=... gpucheck coverage OUTDIR
 *
 * Needs no kernel and no context. libvgpu exports vgpu_hooked_entry_points() (its
 * hooks.def: the driver API names and its hooks). For each hooked name: dlsym of the name
 * in libcuda.so.1 (libvgpu interposes dlsym) must be the hook; and for the name's base
 * (cuMemAlloc for cuMemAlloc_v2; cuLaunchKernel for cuLaunchKernel_ptsz), at each CUDA
 * version and with the default and the per-thread default stream, cuGetProcAddress and
 * cuGetProcAddress_v2 (as the application calls them: through libvgpu) must answer one of
 * libvgpu's hooks, or nothing (not found / version not sufficient). Then cuInit: libvgpu's
 * own start-up self-check refuses there, with one line, when the driver answers an entry
 * point it cannot map. */
static const int g_cov_versions[] = {11030, 12000, 12080, 13000};

static void cov_base(const char *name, char *base, size_t len)
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

static int coverage_main(int argc, char **argv)
{
    if (checks_begin("coverage", argc > 2 ? argv[2] : "gpucheck-out"))
        return 2;
    int (*table)(const char *const **, void *const **) =
        (int (*)(const char *const **, void *const **))dlsym(RTLD_DEFAULT, "vgpu_hooked_entry_points");
    checks_head("coverage: cuGetProcAddress's answers for every hooked name, through libvgpu");
    if (!table) {
        check("libvgpu is preloaded (vgpu_hooked_entry_points)", 0, "found", "not found");
        return checks_end();
    }
    const char *const *names;
    void *const *hooks;
    int n = table(&names, &hooks);
    jint("hooked_names", n);
    if (!cuGetProcAddress && !cuGetProcAddress_v2) {
        check("the driver has cuGetProcAddress", 0, "yes", "no");
        return checks_end();
    }
    int bad_dlsym = 0, bases = 0, lookups = 0, unmapped = 0, disagree = 0, wrong = 0;
    char first_bad[256] = "";
    jopen("answers", '{'); /* base -> {"version": [default, per-thread]} */
    for (int i = 0; i < n; i++) {
        void *d = dlsym(g_cuda, names[i]);
        Dl_info di;
        if (d && d != hooks[i]) {
            bad_dlsym++;
            note_error("dlsym(libcuda, %s) is not libvgpu's hook", names[i]);
        }
        char base[128], prev[128] = "";
        cov_base(names[i], base, sizeof base);
        int seen = 0;
        for (int k = 0; k < i && !seen; k++) {
            cov_base(names[k], prev, sizeof prev);
            seen = strcmp(prev, base) == 0;
        }
        if (seen)
            continue;
        bases++;
        jopen(base, '{');
        for (size_t v = 0; v < sizeof g_cov_versions / sizeof g_cov_versions[0]; v++) {
            char vk[16];
            snprintf(vk, sizeof vk, "%d", g_cov_versions[v]);
            jopen(vk, '[');
            for (int f = 0; f < 2; f++) {
                unsigned long long flags = f ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_DEFAULT;
                void *a1 = NULL, *a2 = NULL;
                int st = -1;
                CUresult r1 = cuGetProcAddress ? cuGetProcAddress(base, &a1, g_cov_versions[v], flags) : -1;
                CUresult r2 = cuGetProcAddress_v2 ? cuGetProcAddress_v2(base, &a2, g_cov_versions[v], flags, &st) : -1;
                lookups++;
                if (r1 != CUDA_SUCCESS)
                    a1 = NULL;
                if (r2 != CUDA_SUCCESS || st != 0)
                    a2 = NULL;
                if (cuGetProcAddress && cuGetProcAddress_v2 && a1 != a2)
                    disagree++;
                void *a = a2 ? a2 : a1;
                const char *what = "-";
                if (a) {
                    int h = -1;
                    for (int k = 0; k < n && h < 0; k++)
                        if (hooks[k] == a)
                            h = k;
                    if (h < 0) {
                        unmapped++;
                        what = dladdr(a, &di) && di.dli_sname && di.dli_saddr == a ? di.dli_sname : "(unexported)";
                        if (!first_bad[0])
                            snprintf(first_bad, sizeof first_bad, "%s@%d/%llu -> %s", base, g_cov_versions[v], flags,
                                     what);
                        note_error("cuGetProcAddress(%s, %d, %llu) -> %s: not a libvgpu hook", base,
                                   g_cov_versions[v], flags, what);
                    } else {
                        what = names[h];
                        char hb[128];
                        cov_base(names[h], hb, sizeof hb);
                        if (strcmp(hb, base) != 0) {
                            wrong++;
                            note_error("cuGetProcAddress(%s, %d, %llu) -> the hook of %s", base, g_cov_versions[v],
                                       flags, names[h]);
                        }
                    }
                }
                jkey(NULL);
                jstrlit(what);
            }
            jclose();
        }
        jclose();
    }
    jclose();
    jint("bases", bases);
    jint("lookups", lookups);
    /* libvgpu's self-check runs in cuInit: refusal is one line and an error. */
    CUresult r = cuInit(0);
    jint("cuinit", r);
    char exp[64], got[64];
    snprintf(exp, sizeof exp, "%d names", n);
    check("dlsym(libcuda.so.1, name) is libvgpu's hook", bad_dlsym == 0, exp, "%d not", bad_dlsym);
    snprintf(exp, sizeof exp, "0 of %d lookups", lookups);
    check("cuGetProcAddress(_v2): every answer is a hook", unmapped == 0, exp, "%d unmapped %s", unmapped, first_bad);
    check("... the hook of the name asked for", wrong == 0, "0", "%d", wrong);
    check("cuGetProcAddress and _v2 agree", disagree == 0, "0", "%d", disagree);
    snprintf(got, sizeof got, "%d %s", r, errname(r));
    check_row("cuInit under libvgpu (start-up self-check)", unmapped ? "refused (801)" : "0 CUDA_SUCCESS", got,
              (unmapped ? r == 801 : r == CUDA_SUCCESS) ? "PASS" : "FAIL");
    return checks_end();
}

/* ---- meminfo: what the card has and a context costs, without libvgpu ----
 *
 *   gpucheck meminfo OUTDIR    (CUDA_MODULE_LOADING=LAZY from the runner)
 *
 * NVML's used memory before a context, after it, after loading the PTX module and after
 * its first launch (lazy loading allocates then); the card's free memory. Writes
 * meminfo.json and meminfo.env (card_free=, context_bytes=, module_bytes=) for the
 * memory check. */
typedef struct {
    unsigned long long total, free, used;
} nvml_memory;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvml_memory_v2;
static int (*nvmlInit_v2)(void);
static int (*nvmlDeviceGetHandleByIndex_v2)(unsigned int, void **);
static int (*nvmlDeviceGetMemoryInfo)(void *, nvml_memory *);
static int (*nvmlDeviceGetMemoryInfo_v2)(void *, nvml_memory_v2 *);
static void *g_nvml_dev;

static int nvml_open(void)
{
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return -1;
    *(void **)&nvmlInit_v2 = dlsym(h, "nvmlInit_v2");
    *(void **)&nvmlDeviceGetHandleByIndex_v2 = dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    *(void **)&nvmlDeviceGetMemoryInfo = dlsym(h, "nvmlDeviceGetMemoryInfo");
    *(void **)&nvmlDeviceGetMemoryInfo_v2 = dlsym(h, "nvmlDeviceGetMemoryInfo_v2");
    if (!nvmlInit_v2 || !nvmlDeviceGetHandleByIndex_v2 || !nvmlDeviceGetMemoryInfo || nvmlInit_v2() != 0 ||
        nvmlDeviceGetHandleByIndex_v2((unsigned)g_devidx, &g_nvml_dev) != 0)
        return -1;
    return 0;
}

static long long nvml_used(void)
{
    nvml_memory m;
    if (!g_nvml_dev || nvmlDeviceGetMemoryInfo(g_nvml_dev, &m) != 0)
        return -1;
    return (long long)m.used;
}

static int meminfo_main(int argc, char **argv)
{
    if (checks_begin("meminfo", argc > 2 ? argv[2] : "gpucheck-out"))
        return 2;
    CUresult r = cuInit(0);
    if (r != CUDA_SUCCESS || device_info()) {
        note_error("cuInit -> %d", r);
        return checks_end() | 2;
    }
    int have_nvml = nvml_open() == 0;
    long long u0 = nvml_used();
    CUcontext ctx;
    if (cuCtxCreate_v2)
        CK(cuCtxCreate_v2(&ctx, 0, g_dev));
    else
        CK(cuCtxCreate_v4(&ctx, NULL, 0, g_dev));
    long long u1 = nvml_used();
    CUmodule mod;
    CK(cuModuleLoadDataEx(&mod, PTX, 0, NULL, NULL));
    long long u2 = nvml_used();
    CUfunction f;
    CK(cuModuleGetFunction(&f, mod, "spin"));
    uint64_t ns = 1000, rec = 0, gap = g_gap_ns;
    void *args[3] = {&ns, &rec, &gap};
    CK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
    CK(cuCtxSynchronize());
    long long u3 = nvml_used();
    size_t fr = 0, tot = 0;
    if (cuMemGetInfo_v2)
        cuMemGetInfo_v2(&fr, &tot);
    const char *lazy = getenv("CUDA_MODULE_LOADING");
    jstr("cuda_module_loading", lazy ? lazy : "");
    jbool("nvml", have_nvml);
    jint("card_total", (long long)tot);
    jint("card_free", (long long)fr);
    jint("nvml_used_before", u0);
    jint("context_bytes", u1 - u0);
    jint("module_bytes", u3 - u1);
    jint("module_load_bytes", u2 - u1);
    out("card: %.0f MiB free of %.0f MiB; NVML used: %lld MiB before a context, +%lld MiB the context, "
        "+%lld MiB the module (%s; +%lld MiB at its load)\n",
        fr / 1048576.0, tot / 1048576.0, u0 >> 20, (u1 - u0) >> 20, (u3 - u1) >> 20, lazy ? lazy : "default",
        (u2 - u1) >> 20);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/meminfo.env", g_outdir);
    FILE *e = fopen(path, "w");
    if (e) {
        fprintf(e, "card_free=%zu\ncontext_bytes=%lld\nmodule_bytes=%lld\n", fr, have_nvml ? u1 - u0 : -1,
                have_nvml ? u3 - u1 : -1);
        fclose(e);
    }
    cuCtxDestroy_v2(ctx);
    return checks_end();
}

/* ---- memory: libvgpu's limit, under LD_PRELOAD and VGPU_MEMORY_LIMIT=<MiB> ----
 *
 *   gpucheck memory OUTDIR --limit-mib L [--card-free B] [--context-bytes C --module-bytes M
 *                   --context-reserve R]
 *
 * Totals (cuMemGetInfo, cuDeviceTotalMem, NVML v1 and v2) equal the limit; cuMemAlloc,
 * VMM (cuMemCreate, then cuMemMap of one), cuMemAllocAsync from the default pool with its
 * release threshold raised, 2D arrays and managed memory stop at the limit. Managed memory
 * asks for the limit + 64 MiB only where the card has that much free (--card-free, from
 * meminfo). The context and lazily loaded module memory meminfo measured must fit in R. */
#define MIB (1024ull * 1024ull)
#define MAXA 4096

static void fill_row(const char *name, uint64_t limit, uint64_t got, uint64_t step, CUresult last, int n)
{
    char exp[64];
    snprintf(exp, sizeof exp, "(%llu, %llu] MiB, then OOM", (unsigned long long)((limit - step) / MIB),
             (unsigned long long)(limit / MIB));
    check(name, got <= limit && got + step > limit && last == CUDA_ERROR_OUT_OF_MEMORY && n > 0, exp,
          "%llu MiB in %d, then %d %s", (unsigned long long)(got / MIB), n, last, errname(last));
}

static int memory_main(int argc, char **argv)
{
    uint64_t limit = 0, card_free = 0, reserve = 0;
    long long ctx_bytes = -1, mod_bytes = -1;
    const char *outdir = "gpucheck-out";
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--limit-mib") == 0 && i + 1 < argc)
            limit = strtoull(argv[++i], NULL, 10) * MIB;
        else if (strcmp(argv[i], "--card-free") == 0 && i + 1 < argc)
            card_free = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--context-bytes") == 0 && i + 1 < argc)
            ctx_bytes = strtoll(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--module-bytes") == 0 && i + 1 < argc)
            mod_bytes = strtoll(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--context-reserve") == 0 && i + 1 < argc)
            reserve = strtoull(argv[++i], NULL, 10);
        else if (argv[i][0] != '-')
            outdir = argv[i];
    }
    if (checks_begin("memory", outdir))
        return 2;
    if (!limit) {
        fprintf(stderr, "gpucheck memory: --limit-mib is required\n");
        return 2;
    }
    jint("limit", (long long)limit);
    char exp[64], got[128];
    CUresult r = cuInit(0);
    int info = r == CUDA_SUCCESS ? device_info() : -1; /* before the rows: the JSON's "device" */
    checks_head("memory: the limit under libvgpu");
    snprintf(got, sizeof got, "%d %s", r, errname(r));
    check_row("cuInit under libvgpu", "0 CUDA_SUCCESS", got, r == CUDA_SUCCESS ? "PASS" : "FAIL");
    if (r != CUDA_SUCCESS || info)
        return checks_end();
    struct gctx g;
    if (ctx_open(&g, CU_CTX_SCHED_AUTO)) {
        check_row("a context and the PTX module", "made", "failed", "FAIL");
        return checks_end();
    }
    snprintf(exp, sizeof exp, "%llu MiB", (unsigned long long)(limit / MIB));
    size_t fr = 0, tot = 0, dt = 0;
    r = cuMemGetInfo_v2 ? cuMemGetInfo_v2(&fr, &tot) : -1;
    check("cuMemGetInfo total == limit, free <= total", r == 0 && tot == limit && fr <= tot, exp,
          "total %.1f MiB, free %.1f MiB", tot / (double)MIB, fr / (double)MIB);
    r = cuDeviceTotalMem_v2(&dt, g_dev);
    check("cuDeviceTotalMem == limit", r == 0 && dt == limit, exp, "%.1f MiB", dt / (double)MIB);

    static CUdeviceptr p[MAXA];
    int n = 0;
    uint64_t sum = 0, step = 64 * MIB;
    CUresult last;
    last = cuMemAlloc_v2(&p[0], limit + step);
    if (last == CUDA_SUCCESS)
        cuMemFree_v2(p[0]);
    snprintf(got, sizeof got, "%d %s", last, errname(last));
    check_row("cuMemAlloc(limit + 64 MiB)", "2 CUDA_ERROR_OUT_OF_MEMORY", got,
              last == CUDA_ERROR_OUT_OF_MEMORY ? "PASS" : "FAIL");
    while (n < MAXA && (last = cuMemAlloc_v2(&p[n], step)) == CUDA_SUCCESS)
        sum += step, n++;
    fill_row("cuMemAlloc 64 MiB at a time", limit, sum, step, last, n);
    while (n > 0)
        cuMemFree_v2(p[--n]);
    last = cuMemAlloc_v2(&p[0], limit / 4 * 3);
    check("... freed: 3/4 of the limit allocates again", last == CUDA_SUCCESS, "0 CUDA_SUCCESS", "%d %s", last,
          errname(last));
    if (last == CUDA_SUCCESS)
        cuMemFree_v2(p[0]);

    /* VMM: physical handles count at cuMemCreate. */
    if (cuMemCreate && cuMemGetAllocationGranularity && cuMemMap && cuMemAddressReserve) {
        static unsigned long long hnd[MAXA];
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = g_dev;
        size_t gran = 0;
        r = cuMemGetAllocationGranularity(&gran, &prop, 0);
        uint64_t vstep = gran ? (step + gran - 1) / gran * gran : step;
        sum = 0;
        n = 0;
        while (r == 0 && n < MAXA && (last = cuMemCreate(&hnd[n], vstep, &prop, 0)) == CUDA_SUCCESS)
            sum += vstep, n++;
        fill_row("cuMemCreate 64 MiB handles", limit, sum, vstep, r ? r : last, n);
        if (n > 0) {
            CUdeviceptr va = 0;
            CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, g_dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
            CUresult a = cuMemAddressReserve(&va, vstep, 0, 0, 0), m = -1, s2 = -1, w = -1;
            if (a == 0)
                m = cuMemMap(va, vstep, 0, hnd[0], 0);
            if (m == 0)
                s2 = cuMemSetAccess(va, vstep, &acc, 1);
            if (s2 == 0)
                w = cuMemsetD8_v2(va, 0x5a, vstep);
            check("... cuMemMap + cuMemSetAccess + memset of one", a == 0 && m == 0 && s2 == 0 && w == 0,
                  "all 0", "reserve %d, map %d, access %d, memset %d", a, m, s2, w);
            if (m == 0)
                cuMemUnmap(va, vstep);
            if (a == 0)
                cuMemAddressFree(va, vstep);
        }
        while (n > 0)
            cuMemRelease(hnd[--n]);
    } else {
        check_row("cuMemCreate 64 MiB handles", "", "driver lacks VMM", "SKIP");
    }

    /* A pool that keeps what is freed (release threshold raised). */
    CUmemoryPool pool = NULL;
    if (cuMemAllocAsync && cuDeviceGetDefaultMemPool && cuDeviceGetDefaultMemPool(&pool, g_dev) == 0) {
        unsigned long long thr = ~0ull;
        r = cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr);
        check("cuMemPoolSetAttribute(RELEASE_THRESHOLD, max)", r == 0, "0", "%d %s", r, errname(r));
        sum = 0;
        n = 0;
        while (n < MAXA && (last = cuMemAllocAsync(&p[n], step, g.s)) == CUDA_SUCCESS)
            sum += step, n++;
        CUresult sy = cuStreamSynchronize(g.s);
        if (last == CUDA_SUCCESS)
            last = sy;
        fill_row("cuMemAllocAsync 64 MiB, threshold raised", limit, sum, step, last, n);
        while (n > 0)
            cuMemFreeAsync(p[--n], g.s);
        cuStreamSynchronize(g.s);
        int m = 0;
        while (m < MAXA && cuMemAllocAsync(&p[m], step, g.s) == CUDA_SUCCESS)
            m++;
        cuStreamSynchronize(g.s);
        uint64_t again = (uint64_t)m * step;
        snprintf(exp, sizeof exp, "(%llu, %llu] MiB", (unsigned long long)((limit - step) / MIB),
                 (unsigned long long)(limit / MIB));
        check("... freed into the pool, filled again", again <= limit && again + step > limit, exp, "%llu MiB",
              (unsigned long long)(again / MIB));
        while (m > 0)
            cuMemFreeAsync(p[--m], g.s);
        cuStreamSynchronize(g.s);
        thr = 0;
        cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr);
        if (cuMemPoolTrimTo)
            cuMemPoolTrimTo(pool, 0);
    } else {
        check_row("cuMemAllocAsync 64 MiB, threshold raised", "", "driver lacks memory pools", "SKIP");
    }

    /* 2D arrays: 2048 x 2048 float4 = 64 MiB each. */
    if (cuArrayCreate_v2 && cuArrayDestroy) {
        static CUarray arr[MAXA];
        CUDA_ARRAY_DESCRIPTOR d = {2048, 2048, CU_AD_FORMAT_FLOAT, 4};
        sum = 0;
        n = 0;
        while (n < MAXA && (last = cuArrayCreate_v2(&arr[n], &d)) == CUDA_SUCCESS)
            sum += step, n++;
        fill_row("cuArrayCreate 2048x2048 float4 (64 MiB)", limit, sum, step, last, n);
        while (n > 0)
            cuArrayDestroy(arr[--n]);
    }

    /* Managed memory: never more than the card has free. */
    if (cuMemAllocManaged) {
        uint64_t want = limit + step;
        if (card_free && want + 256 * MIB > card_free) {
            snprintf(got, sizeof got, "card has %llu MiB free", (unsigned long long)(card_free / MIB));
            check_row("cuMemAllocManaged(limit + 64 MiB)", "OOM", got, "SKIP");
        } else {
            last = cuMemAllocManaged(&p[0], want, CU_MEM_ATTACH_GLOBAL);
            if (last == CUDA_SUCCESS)
                cuMemFree_v2(p[0]);
            snprintf(got, sizeof got, "%d %s", last, errname(last));
            check_row("cuMemAllocManaged(limit + 64 MiB)", "2 CUDA_ERROR_OUT_OF_MEMORY", got,
                      last == CUDA_ERROR_OUT_OF_MEMORY ? "PASS" : "FAIL");
        }
        last = cuMemAllocManaged(&p[0], limit / 2, CU_MEM_ATTACH_GLOBAL);
        if (last == CUDA_SUCCESS)
            cuMemFree_v2(p[0]);
        check("cuMemAllocManaged(limit / 2)", last == CUDA_SUCCESS, "0 CUDA_SUCCESS", "%d %s", last, errname(last));
    }

    /* NVML, as nvidia-smi and monitoring read it. */
    snprintf(exp, sizeof exp, "%llu MiB", (unsigned long long)(limit / MIB));
    if (nvml_open() == 0) {
        nvml_memory m1;
        int e1 = nvmlDeviceGetMemoryInfo(g_nvml_dev, &m1);
        check("nvmlDeviceGetMemoryInfo total == limit", e1 == 0 && m1.total == limit, exp, "%d, %.1f MiB", e1,
              e1 ? 0.0 : m1.total / (double)MIB);
        if (nvmlDeviceGetMemoryInfo_v2) {
            nvml_memory_v2 m2;
            memset(&m2, 0, sizeof m2);
            m2.version = (unsigned)(sizeof m2 | (2u << 24));
            int e2 = nvmlDeviceGetMemoryInfo_v2(g_nvml_dev, &m2);
            check("nvmlDeviceGetMemoryInfo_v2 total == limit", e2 == 0 && m2.total == limit, exp, "%d, %.1f MiB",
                  e2, e2 ? 0.0 : m2.total / (double)MIB);
        }
    } else {
        check_row("nvmlDeviceGetMemoryInfo total == limit", exp, "no NVML", "SKIP");
    }

    /* What a context and a lazily loaded module take (meminfo, without libvgpu). */
    if (ctx_bytes >= 0 && mod_bytes >= 0) {
        snprintf(exp, sizeof exp, "<= context_reserve %llu MiB", (unsigned long long)(reserve / MIB));
        check("context + lazy module memory (NVML, no libvgpu)", (uint64_t)(ctx_bytes + mod_bytes) <= reserve, exp,
              "%lld + %lld MiB", ctx_bytes >> 20, mod_bytes >> 20);
    } else {
        check_row("context + lazy module memory (NVML, no libvgpu)", "", "not measured", "SKIP");
    }
    cuCtxDestroy_v2(g.ctx);
    return checks_end();
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--worker") == 0)
        return worker_main(argc, argv);
    if (argc > 1 && strcmp(argv[1], "load") == 0)
        return load_main(argc, argv);
    if (argc > 1 && strcmp(argv[1], "shares") == 0)
        return shares_main(argc, argv);
    if (argc > 1 && strcmp(argv[1], "coverage") == 0)
        return coverage_main(argc, argv);
    if (argc > 1 && strcmp(argv[1], "meminfo") == 0)
        return meminfo_main(argc, argv);
    if (argc > 1 && strcmp(argv[1], "memory") == 0)
        return memory_main(argc, argv);
    if (argc > 1 && strcmp(argv[1], "now") == 0) { /* CLOCK_MONOTONIC ns, for load --start-at */
        printf("%" PRIu64 "\n", mono());
        return 0;
    }
    if (argc > 1 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        printf("usage: %s [OUTDIR]   (GPUCHECK_DEVICE=N picks the device; default 0)\n"
               "       %s load --kernel-us N [--sync-every K [--cpu-gap-us U] [--poll] | --streams M | --graph G]\n"
               "                [--queue-us Q] --seconds S [--start-at MONO_NS] --stamps FILE\n"
               "       %s shares [--warm S] [--window S] [--title T] [--timeline FILE] [--tsv FILE]\n"
               "                NAME TARGET STAMPS [NAME TARGET STAMPS ...]\n"
               "       %s coverage OUTDIR    (under LD_PRELOAD=libvgpu.so with a limit)\n"
               "       %s meminfo OUTDIR     (without libvgpu)\n"
               "       %s memory OUTDIR --limit-mib L [--card-free B] [--context-bytes C --module-bytes M\n"
               "                --context-reserve R]   (under LD_PRELOAD=libvgpu.so, VGPU_MEMORY_LIMIT=L)\n"
               "       %s now\n",
               argv[0], argv[0], argv[0], argv[0], argv[0], argv[0], argv[0]);
        return 0;
    }
    if (argc > 1)
        g_outdir = argv[1];
    if (getenv("GPUCHECK_DEVICE"))
        g_devidx = atoi(getenv("GPUCHECK_DEVICE"));
    setvbuf(stdout, NULL, _IOLBF, 0);
    alarm(280); /* the whole run takes well under two minutes */
    mkdir(g_outdir, 0755);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/gpucheck-table.txt", g_outdir);
    g_table = fopen(path, "w");
    uint64_t t_start = mono();

    jopen(NULL, '{');
    jint("gpucheck_version", 1);
    {
        time_t now = time(NULL);
        char ts[64];
        strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
        jstr("started_utc", ts);
    }
    if (load_driver()) {
        jstr("error", "libcuda.so.1 could not be loaded");
        json_flush();
        return 2;
    }
    CUresult r = cuInit(0);
    if (r != CUDA_SUCCESS) {
        cu_fail("cuInit(0)", r, __LINE__);
        jstr("error", "cuInit failed");
        json_flush();
        return 2;
    }
    if (device_info()) {
        json_flush();
        return 2;
    }
    struct gctx g;
    g_main = &g;
    if (ctx_open(&g, CU_CTX_SCHED_AUTO) || probe_stamps(&g)) {
        jstr("error", "no context or the kernels did not load");
        json_flush();
        return 2;
    }
    const char *mode = g_stamps ? "gpu-timeline" : "host-only";
    jstr("mode", mode);
    jint("hole_threshold_ns", (long long)g_gap_ns);
    out("mode: %s (%s)\n", mode,
        g_stamps ? "spin kernels stamp %globaltimer" : "no stamps came back: busy_<N>us kernels, host-side times");
    json_flush();

    section("clock", s_clock, &g);
    section("a", sec_costs, &g);
    section("b", sec_wake, &g);
    section("c", sec_queue, &g);
    section("d", sec_events, &g);
    section("e1", s_e1, &g);
    section("e2", sec_streams, &g);
    section("e3", sec_light, &g);
    section("e4", s_e4, &g);
    section("clock_end", s_clock_end, &g);

    jnum("runtime_s", (double)(mono() - t_start) / 1e9);
    jint("failed_sections", g_failures);
    jstr("errors", g_errors);
    jclose();
    json_flush();
    out("\n%s: %d section(s) failed; %.1f s; %s/gpucheck.json\n", g_failures ? "FAILED" : "done", g_failures,
        (double)(mono() - t_start) / 1e9, g_outdir);
    return g_failures ? 1 : 0;
}
