/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cuda_internal.h - simgpu's driver API internals shared by the cuda_*.c files.
 *
 * Handles are heap objects whose first field is a magic number; every live
 * handle is also in a registry (cuda_registry.c), so a stale or made-up handle
 * is rejected with CUDA_ERROR_INVALID_HANDLE without being dereferenced.
 * Device pointers are real host addresses (anonymous NORESERVE mappings), so
 * copies are plain memcpy and untouched device memory costs nothing.
 */
#ifndef SIMGPU_CUDA_INTERNAL_H
#define SIMGPU_CUDA_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "../include/vgpu_cuda.h"
#include "simgpu_api.h"
#include "simgpu_state.h"

#define SG_DRIVER_VERSION 13000
/* Driver results vgpu_cuda.h (libvgpu's view of the ABI) does not name. */
#define SG_ERROR_CAPTURED_EVENT ((CUresult)907) /* CUDA_ERROR_CAPTURED_EVENT */
#define SG_GRANULARITY (2u << 20) /* VMM granularity, like the real driver's 2 MiB */

enum {
    SG_MAGIC_CTX = 0x53474358,    /* "SGCX" */
    SG_MAGIC_STREAM = 0x53475354, /* "SGST" */
    SG_MAGIC_EVENT = 0x53474556,
    SG_MAGIC_MODULE = 0x53474d44,
    SG_MAGIC_FUNC = 0x53474655,
    SG_MAGIC_GRAPH = 0x53474752,
    SG_MAGIC_GNODE = 0x53474e44,
    SG_MAGIC_GEXEC = 0x53474758,
    SG_MAGIC_POOL = 0x5347504c,
    SG_MAGIC_ARRAY = 0x53474152,
    SG_MAGIC_MIPMAP = 0x53474d4d,
    SG_MAGIC_VMM = 0x5347564d,
    SG_MAGIC_DEAD = 0x44454144
};

/* ---- init and devices (cuda_init.c) ---- */
/* CUDA_SUCCESS once cuInit succeeded, else CUDA_ERROR_NOT_INITIALIZED. */
CUresult sg_check_init(void);
/* sg_check_init, then CUDA_ERROR_INVALID_DEVICE for an ordinal out of range. */
CUresult sg_check_dev(CUdevice dev);
/* The simulated device behind CUDA ordinal dev (CUDA_VISIBLE_DEVICES applied). */
unsigned sg_phys(CUdevice dev);
/* The mapped state; only valid after sg_check_init succeeded. */
struct simgpu_state *sg_state(void);

/* ---- handle registry and device address ranges (cuda_registry.c) ---- */
/* 0, or -1 when out of memory. */
int sg_handle_add(const void *h);
void sg_handle_del(const void *h);
/* 1 when h is a live handle whose first field is magic. */
int sg_handle_ok(const void *h, uint32_t magic);
/* Like sg_handle_ok, and removes it in the same step (so only one destroyer wins). */
int sg_handle_take(const void *h, uint32_t magic);

enum sg_kind {
    SG_KIND_MEM = 1 << 0,     /* cuMemAlloc */
    SG_KIND_PITCH = 1 << 1,   /* cuMemAllocPitch */
    SG_KIND_MANAGED = 1 << 2, /* cuMemAllocManaged */
    SG_KIND_ASYNC = 1 << 3,   /* cuMemAllocAsync / FromPool */
    SG_KIND_HOST = 1 << 4,    /* cuMemAllocHost / HostAlloc: not charged */
    SG_KIND_RESERVE = 1 << 5  /* cuMemAddressReserve: VA only, not charged */
};
#define SG_KIND_DEVICE (SG_KIND_MEM | SG_KIND_PITCH | SG_KIND_MANAGED | SG_KIND_ASYNC)

struct sg_ctx;
struct sg_pool;
struct sg_range {
    uintptr_t base;
    size_t size;   /* what the caller asked for (and was charged) */
    size_t maplen; /* what was mmapped */
    int dev;
    int kind;
    struct sg_ctx *ctx; /* owning context (freed with it), NULL for none */
    struct sg_pool *pool; /* the memory pool it came from (SG_KIND_ASYNC), else NULL */
};
int sg_range_add(const struct sg_range *r);
/* Remove the range starting exactly at base whose kind is in kinds. 0 or -1. */
int sg_range_take(uintptr_t base, int kinds, struct sg_range *out);
/* Remove any one range owned by ctx. 0 or -1 when none is left. */
int sg_range_take_ctx(const struct sg_ctx *ctx, struct sg_range *out);
/* The range that contains [addr, addr+len). 0 or -1. */
int sg_range_find(uintptr_t addr, size_t len, struct sg_range *out);

/* ---- device memory (cuda_mem.c) ---- */
CUresult sg_dev_alloc(int dev, size_t size, int kind, struct sg_ctx *ctx, CUdeviceptr *out);
/* sg_dev_alloc of an allocation from pool (counted in it until released). */
CUresult sg_dev_alloc_in(int dev, size_t size, int kind, struct sg_ctx *ctx, struct sg_pool *pool, CUdeviceptr *out);
/* Unmap and uncharge an allocation; CUDA_ERROR_INVALID_VALUE when unknown. */
CUresult sg_dev_free(CUdeviceptr ptr, int kinds);
void sg_range_release(const struct sg_range *r);
/* Memory overhead of a context (SIMGPU_CONTEXT_MEMORY, default 0). */
uint64_t sg_context_overhead(void);

/* ---- memory pools (cuda_pool.c) ---- */
/* Count an allocation of size bytes in pool p, charging the device for what the
 * pool's freed bytes do not cover: 0, or -1 (device out of memory). */
int sg_pool_charge(struct sg_pool *p, size_t size);
/* Uncount it when freed: the bytes stay reserved in the pool (pending). */
void sg_pool_release(struct sg_pool *p, size_t size);
/* A stream, event or context sync: pending frees are observed, and every pool
 * above its release threshold gives cached bytes back to the device. */
void sg_pool_sync(void);

/* ---- contexts and streams (cuda_ctx.c, cuda_stream.c) ---- */
struct sg_graph;
struct sg_stream {
    uint32_t magic;
    struct sg_ctx *ctx;
    unsigned flags;
    _Atomic uint64_t last_end;  /* FIFO engine: when the work queued on this stream ends */
    pthread_mutex_t lock;       /* keeps one stream's submissions in order; guards q, last */
    uint32_t q;                 /* timed engine, concurrent streams: its queue (NIL: none yet) */
    struct simgpu_ticket last;  /* timed engine: its last work (seq 0: none) */
    /* The capture sequence, under cuda_graph.c's capture lock. */
    struct sg_graph *capture;   /* non-NULL while capturing */
    uint64_t cap_id;            /* the sequence's id (process-unique, never 0) */
    int cap_mode;               /* its CUstreamCaptureMode */
    int cap_invalid;            /* a prohibited call invalidated it */
    const void *cap_thread;     /* the thread that began it */
    struct sg_stream *cap_next; /* the process's list of capturing streams */
};

struct sg_ctx {
    uint32_t magic;
    int dev;
    int primary;
    unsigned flags;
    int active;                 /* primary: retained (refs > 0) */
    int refs;                   /* primary: retain count (under the primary lock) */
    uint64_t overhead;          /* bytes charged for the context itself */
    _Atomic uint64_t last_end;  /* when the work of all its streams ends */
    struct sg_stream null_stream; /* the legacy default stream (not a registered handle) */
};

/* The calling thread's current context, or CUDA_ERROR_INVALID_CONTEXT. */
CUresult sg_current_ctx(struct sg_ctx **out);
void sg_stream_init(struct sg_stream *s, struct sg_ctx *ctx, unsigned flags);
/* NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD mean the current context's
 * default stream; anything else must be a live stream handle. */
CUresult sg_stream_resolve(CUstream h, struct sg_stream **out);
/* Record that work on s ends at end_ns. */
void sg_stream_note_end(struct sg_stream *s, uint64_t end_ns);
/* Run (or, while capturing, record) a kernel of dur_ns on s. */
CUresult sg_stream_submit(struct sg_stream *s, uint64_t dur_ns);
/* Wait, as a context sync does, for the work queued in context c. */
void sg_ctx_wait(struct sg_ctx *c);

/* ---- modules and kernels (cuda_module.c) ---- */
struct sg_module;
struct sg_func {
    uint32_t magic;
    struct sg_module *mod;
    uint64_t dur_ns;
    struct sg_func *next;
    char name[];
};

/* ---- graphs (cuda_graph.c) ---- */
struct sg_graph *sg_graph_new(void);
CUresult sg_graph_append(struct sg_graph *g, uint64_t dur_ns, CUgraphNode *node_out);

/* ---- stream capture (cuda_graph.c) ---- */
/* While s captures: 1, with *rc the result of adding a kernel of dur_ns to its graph
 * (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED once invalidated). 0 when s does not capture. */
int sg_capture_add(struct sg_stream *s, uint64_t dur_ns, CUresult *rc);
/* The id of the capture sequence s is in, 0 for none; *invalid (if not NULL) whether
 * it was invalidated. */
uint64_t sg_capture_id(struct sg_stream *s, int *invalid);
/* Before a sync or query (potentially unsafe during capture) by the calling thread:
 * CUDA_SUCCESS, or CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (CUDA_ERROR_CAPTURED_EVENT for an
 * event recorded into a capture) after invalidating each capture
 * it conflicts with: one the thread's capture mode forbids it to run beside, or one it
 * necessarily conflicts with: s's (the stream it syncs or queries, NULL: none), one in
 * context ctx (the context it syncs, NULL: none), or sequence cap_id (an event recorded
 * into that capture, 0: none). */
CUresult sg_capture_guard(const struct sg_stream *s, const struct sg_ctx *ctx, uint64_t cap_id);
/* s is being destroyed: end its capture, if any. */
void sg_capture_drop(struct sg_stream *s);

/* ---- legacy and per-thread-stream entry points (not in vgpu_cuda.h because
 * the real cuda.h maps these names to other signatures via macros) ---- */
CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxDestroy(CUcontext ctx);
CUresult cuCtxPushCurrent(CUcontext ctx);
CUresult cuCtxPopCurrent(CUcontext *pctx);
CUresult cuDevicePrimaryCtxRelease(CUdevice dev);
CUresult cuDevicePrimaryCtxReset(CUdevice dev);
CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev);
CUresult cuMemAllocHost(void **pp, size_t bytesize);
CUresult cuMemGetInfo(unsigned int *free, unsigned int *total);
CUresult cuStreamDestroy(CUstream hStream);
CUresult cuEventDestroy(CUevent hEvent);
CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer,
                            size_t bufferSize);
CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer,
                               size_t bufferSize);
CUresult cuStreamBeginCapture_ptsz(CUstream hStream);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode);
CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph);
CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus);
CUresult cuStreamGetCtx_ptsz(CUstream hStream, CUcontext *pctx);
CUresult cuStreamGetCtx_v2_ptsz(CUstream hStream, CUcontext *pCtx, CUgreenCtx *pGreenCtx);
CUresult cuStreamSynchronize_ptsz(CUstream hStream);
CUresult cuStreamQuery_ptsz(CUstream hStream);
CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags);
CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream);
CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode);
CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags);
CUresult cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int flags);
CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream);
CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream);
CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream);
CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream);
CUresult cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream);
CUresult cuMemsetD32Async_ptsz(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream);
CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount);
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount);
CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount);
CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount);
CUresult cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N);
CUresult cuMemsetD32_v2_ptds(CUdeviceptr dstDevice, unsigned int ui, size_t N);

#endif
