/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hooks_launch.c - kernel and graph launches: every launch path (direct,
 * dlsym, cuGetProcAddress, per-thread default stream) reaches the compute
 * scheduler (sched.c) here. A graph launch is one submission whose GPU time
 * is charged like a kernel's, so captured work cannot escape the share.
 */
#include "vgpu_internal.h"

/* The stream a _ptsz entry point means by 0. */
#define PTSZ(s) ((s) ? (s) : CU_STREAM_PER_THREAD)

#define SCHEDULED(stream, call)                                                 \
    do {                                                                        \
        vg_boot();                                                              \
        if (VG_LIKELY(!atomic_load_explicit(&vg_active, memory_order_relaxed))) \
            return call;                                                        \
        struct vg_ticket t_ = vg_sched_admit(stream);                           \
        if (VG_UNLIKELY(t_.refused))                                            \
            return CUDA_ERROR_NOT_PERMITTED;                                    \
        CUresult rc_ = call;                                                    \
        vg_sched_done(t_, rc_);                                                 \
        return rc_;                                                             \
    } while (0)

VG_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                  unsigned int by, unsigned int bz, unsigned int shmem, CUstream s, void **params,
                                  void **extra)
{
    SCHEDULED(s, REAL(cuLaunchKernel)(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra));
}

VG_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                       unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                                       CUstream s, void **params, void **extra)
{
    SCHEDULED(PTSZ(s), REAL(cuLaunchKernel_ptsz)(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra));
}

VG_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)
{
    if (!config) {
        vg_boot();
        return REAL(cuLaunchKernelEx)(config, f, params, extra); /* the driver's own error */
    }
    SCHEDULED(config->hStream, REAL(cuLaunchKernelEx)(config, f, params, extra));
}

VG_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)
{
    if (!config) {
        vg_boot();
        return REAL(cuLaunchKernelEx_ptsz)(config, f, params, extra);
    }
    SCHEDULED(PTSZ(config->hStream), REAL(cuLaunchKernelEx_ptsz)(config, f, params, extra));
}

VG_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                             unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                                             CUstream s, void **params)
{
    SCHEDULED(s, REAL(cuLaunchCooperativeKernel)(f, gx, gy, gz, bx, by, bz, shmem, s, params));
}

VG_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                                  unsigned int bx, unsigned int by, unsigned int bz,
                                                  unsigned int shmem, CUstream s, void **params)
{
    SCHEDULED(PTSZ(s), REAL(cuLaunchCooperativeKernel_ptsz)(f, gx, gy, gz, bx, by, bz, shmem, s, params));
}

VG_EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream s)
{
    SCHEDULED(s, REAL(cuGraphLaunch)(exec, s));
}

VG_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream s)
{
    SCHEDULED(PTSZ(s), REAL(cuGraphLaunch_ptsz)(exec, s));
}

/* ---- stream capture: counted so that launches ask the driver only while one is open ---- */

#define CAPTURE_BEGIN(call)                                    \
    do {                                                       \
        vg_boot();                                             \
        CUresult rc_ = call;                                   \
        if (rc_ == CUDA_SUCCESS)                               \
            atomic_fetch_add(&vg_captures_open, 1);            \
        return rc_;                                            \
    } while (0)

/* Ended, whatever the result (an invalidated capture ends with an error): by the
 * stream's state before and after. */
#define CAPTURE_END(stream, call)                              \
    do {                                                       \
        vg_boot();                                             \
        int was_ = vg_stream_capturing(stream);                \
        CUresult rc_ = call;                                   \
        if (was_ && !vg_stream_capturing(stream))              \
            vg_capture_closed();                               \
        return rc_;                                            \
    } while (0)

VG_EXPORT CUresult cuStreamBeginCapture(CUstream s)
{
    CAPTURE_BEGIN(REAL(cuStreamBeginCapture)(s));
}

VG_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream s)
{
    CAPTURE_BEGIN(REAL(cuStreamBeginCapture_ptsz)(s));
}

VG_EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode)
{
    CAPTURE_BEGIN(REAL(cuStreamBeginCapture_v2)(s, mode));
}

VG_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode)
{
    CAPTURE_BEGIN(REAL(cuStreamBeginCapture_v2_ptsz)(s, mode));
}

VG_EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode *deps,
                                               const CUgraphEdgeData *data, size_t n, CUstreamCaptureMode mode)
{
    CAPTURE_BEGIN(REAL(cuStreamBeginCaptureToGraph)(s, g, deps, data, n, mode));
}

VG_EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph g, const CUgraphNode *deps,
                                                    const CUgraphEdgeData *data, size_t n,
                                                    CUstreamCaptureMode mode)
{
    CAPTURE_BEGIN(REAL(cuStreamBeginCaptureToGraph_ptsz)(s, g, deps, data, n, mode));
}

VG_EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *graph)
{
    CAPTURE_END(s, REAL(cuStreamEndCapture)(s, graph));
}

VG_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *graph)
{
    CAPTURE_END(PTSZ(s), REAL(cuStreamEndCapture_ptsz)(s, graph));
}

/* ---- syncs: the app waits for its queued work (a step loop's step ends here) ---- */

/* close: the wait covers a stream's or the context's work (an event sync waits for an
 * event of the app's, maybe far behind: nothing to date). */
#define SYNC(close, call)                                                      \
    do {                                                                       \
        vg_boot();                                                             \
        if (!atomic_load_explicit(&vg_active, memory_order_relaxed))           \
            return call;                                                       \
        struct vg_sync s_ = vg_sched_sync(1, close);                           \
        CUresult rc_ = call;                                                   \
        vg_sched_synced(s_, rc_ == CUDA_SUCCESS);                              \
        if (rc_ == CUDA_SUCCESS)                                               \
            vg_pools_reconcile(-1, 0); /* pools release at syncs */            \
        return rc_;                                                            \
    } while (0)

VG_EXPORT CUresult cuStreamSynchronize(CUstream s)
{
    SYNC(1, REAL(cuStreamSynchronize)(s));
}

VG_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s)
{
    SYNC(1, REAL(cuStreamSynchronize_ptsz)(s));
}

VG_EXPORT CUresult cuCtxSynchronize(void)
{
    SYNC(1, REAL(cuCtxSynchronize)());
}

VG_EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    SYNC(1, REAL(cuCtxSynchronize_v2)(ctx));
}

VG_EXPORT CUresult cuEventSynchronize(CUevent ev)
{
    SYNC(0, REAL(cuEventSynchronize)(ev));
}

/* A query that finds the work done ends a wait as a sync does (a loop polling for its step's
 * end); one that finds it running says the app waits for it (hold.h, "wait"). */
#define QUERY(close, call)                                                     \
    do {                                                                       \
        vg_boot();                                                             \
        if (!atomic_load_explicit(&vg_active, memory_order_relaxed))           \
            return call;                                                       \
        struct vg_sync s_ = vg_sched_sync(0, close);                           \
        CUresult rc_ = call;                                                   \
        vg_sched_synced(s_, rc_ == CUDA_SUCCESS);                              \
        if (rc_ == CUDA_ERROR_NOT_READY)                                       \
            vg_sched_polling(s_);                                              \
        return rc_;                                                            \
    } while (0)

VG_EXPORT CUresult cuStreamQuery(CUstream s)
{
    QUERY(1, REAL(cuStreamQuery)(s));
}

VG_EXPORT CUresult cuStreamQuery_ptsz(CUstream s)
{
    QUERY(1, REAL(cuStreamQuery_ptsz)(s));
}

VG_EXPORT CUresult cuEventQuery(CUevent ev)
{
    QUERY(0, REAL(cuEventQuery)(ev));
}
