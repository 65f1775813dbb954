/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cuda_graph.c - CUDA graphs: stream capture, kernel nodes, instantiate, launch.
 *
 * The engine runs one kernel at a time anyway, so a graph is kept as the list
 * of its kernel durations in the order they were added (a valid topological
 * order, since a node's dependencies must exist before it). Launching an
 * executable graph submits those kernels in order on the stream.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

struct sg_gnode {
    uint32_t magic;
    uint64_t dur_ns;
};

struct sg_graph {
    uint32_t magic;
    pthread_mutex_t lock; /* guards nodes/n/cap */
    struct sg_gnode **nodes;
    size_t n, cap;
};

struct sg_gexec {
    uint32_t magic;
    size_t n;
    uint64_t dur_ns[];
};

struct sg_graph *sg_graph_new(void)
{
    struct sg_graph *g = calloc(1, sizeof(*g));
    if (!g)
        return NULL;
    g->magic = SG_MAGIC_GRAPH;
    pthread_mutex_init(&g->lock, NULL);
    if (sg_handle_add(g) != 0) {
        free(g);
        return NULL;
    }
    return g;
}

CUresult sg_graph_append(struct sg_graph *g, uint64_t dur_ns, CUgraphNode *node_out)
{
    struct sg_gnode *nd = calloc(1, sizeof(*nd));
    if (!nd)
        return CUDA_ERROR_OUT_OF_MEMORY;
    nd->magic = SG_MAGIC_GNODE;
    nd->dur_ns = dur_ns;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&g->lock);
    if (g->n == g->cap) {
        size_t ncap = g->cap ? g->cap * 2 : 16;
        struct sg_gnode **nn = realloc(g->nodes, ncap * sizeof(*nn));
        if (!nn) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
            goto out;
        }
        g->nodes = nn;
        g->cap = ncap;
    }
    if (sg_handle_add(nd) != 0) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    g->nodes[g->n++] = nd;
    if (node_out)
        *node_out = (CUgraphNode)nd;
out:
    pthread_mutex_unlock(&g->lock);
    if (rc != CUDA_SUCCESS)
        free(nd);
    return rc;
}

static void graph_free(struct sg_graph *g)
{
    for (size_t i = 0; i < g->n; i++) {
        sg_handle_del(g->nodes[i]);
        free(g->nodes[i]);
    }
    free(g->nodes);
    g->magic = SG_MAGIC_DEAD;
    pthread_mutex_destroy(&g->lock);
    free(g);
}

SIMGPU_API CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!phGraph || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct sg_graph *g = sg_graph_new();
    if (!g)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *phGraph = (CUgraph)g;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuGraphDestroy(CUgraph hGraph)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sg_graph *g = (struct sg_graph *)hGraph;
    if (!g || !sg_handle_take(g, SG_MAGIC_GRAPH))
        return CUDA_ERROR_INVALID_VALUE;
    graph_free(g);
    return CUDA_SUCCESS;
}

/* v1 and v2 parameter structs share the prefix that simgpu reads (func). */
static CUresult add_kernel_node(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                size_t numDependencies, const CUDA_KERNEL_NODE_PARAMS_v2 *p)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sg_graph *g = (struct sg_graph *)hGraph;
    if (!phGraphNode || !p || (numDependencies && !dependencies) || !g || !sg_handle_ok(g, SG_MAGIC_GRAPH))
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < numDependencies; i++)
        if (!sg_handle_ok(dependencies[i], SG_MAGIC_GNODE))
            return CUDA_ERROR_INVALID_VALUE;
    struct sg_func *f = (struct sg_func *)p->func;
    if (!f || !sg_handle_ok(f, SG_MAGIC_FUNC))
        return CUDA_ERROR_INVALID_VALUE;
    if (!p->gridDimX || !p->gridDimY || !p->gridDimZ || !p->blockDimX || !p->blockDimY || !p->blockDimZ)
        return CUDA_ERROR_INVALID_VALUE;
    return sg_graph_append(g, f->dur_ns, phGraphNode);
}

SIMGPU_API CUresult cuGraphAddKernelNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                         size_t numDependencies, const CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams)
{
    /* v1 is v2 without the trailing kern/ctx fields, which are never read when func is set. */
    if (!nodeParams)
        return CUDA_ERROR_INVALID_VALUE;
    CUDA_KERNEL_NODE_PARAMS_v2 p = {.func = nodeParams->func};
    return add_kernel_node(phGraphNode, hGraph, dependencies, numDependencies, &p);
}

SIMGPU_API CUresult cuGraphAddKernelNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph,
                                            const CUgraphNode *dependencies, size_t numDependencies,
                                            const CUDA_KERNEL_NODE_PARAMS_v2 *nodeParams)
{
    return add_kernel_node(phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
}

SIMGPU_API CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags)
{
    (void)flags; /* auto-free-on-launch, upload, device launch: no effect here */
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sg_graph *g = (struct sg_graph *)hGraph;
    if (!phGraphExec || !g || !sg_handle_ok(g, SG_MAGIC_GRAPH))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g->lock);
    struct sg_gexec *x = calloc(1, sizeof(*x) + g->n * sizeof(x->dur_ns[0]));
    if (x) {
        x->magic = SG_MAGIC_GEXEC;
        x->n = g->n;
        for (size_t i = 0; i < g->n; i++)
            x->dur_ns[i] = g->nodes[i]->dur_ns;
    }
    pthread_mutex_unlock(&g->lock);
    if (!x || sg_handle_add(x) != 0) {
        free(x);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *phGraphExec = (CUgraphExec)x;
    return CUDA_SUCCESS;
}

/* The pre-12.0 ABI, with an error node and a log buffer. */
SIMGPU_API CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                                       char *logBuffer, size_t bufferSize)
{
    if (phErrorNode)
        *phErrorNode = NULL;
    if (logBuffer && bufferSize)
        logBuffer[0] = '\0';
    return cuGraphInstantiateWithFlags(phGraphExec, hGraph, 0);
}

SIMGPU_API CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                                          char *logBuffer, size_t bufferSize)
{
    return cuGraphInstantiate(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
}

SIMGPU_API CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sg_gexec *x = (struct sg_gexec *)hGraphExec;
    if (!x || !sg_handle_ok(x, SG_MAGIC_GEXEC))
        return CUDA_ERROR_INVALID_HANDLE;
    struct sg_stream *s;
    if ((rc = sg_stream_resolve(hStream, &s)) != CUDA_SUCCESS)
        return rc;
    for (size_t i = 0; i < x->n && rc == CUDA_SUCCESS; i++)
        rc = sg_stream_submit(s, x->dur_ns[i]);
    return rc;
}

SIMGPU_API CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    return cuGraphLaunch(hGraphExec, hStream);
}

SIMGPU_API CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sg_gexec *x = (struct sg_gexec *)hGraphExec;
    if (!x || !sg_handle_take(x, SG_MAGIC_GEXEC))
        return CUDA_ERROR_INVALID_VALUE;
    x->magic = SG_MAGIC_DEAD;
    free(x);
    return CUDA_SUCCESS;
}

/* ---- stream capture ----
 *
 * The driver's rules (cuStreamBeginCapture_v2, cuThreadExchangeStreamCaptureMode): each
 * thread has an interaction mode, GLOBAL by default. A thread that is not RELAXED may not
 * make a potentially unsafe call (simgpu checks the syncs and queries: cuStreamSynchronize,
 * cuStreamQuery, cuEventSynchronize, cuEventQuery, cuCtxSynchronize) while it has a capture
 * of its own that is not RELAXED, nor, in GLOBAL mode, while another thread has a GLOBAL
 * one. Whatever the mode, syncing or querying a capturing stream, a context with one, or an
 * event recorded into one conflicts necessarily. Such a call fails with
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (CUDA_ERROR_CAPTURED_EVENT for the event) and
 * invalidates the captures it conflicts with: their streams stay in capture until
 * cuStreamEndCapture, which then fails with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED and no
 * graph. A capture that is not relaxed, ended on another thread, ends with
 * CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD and no graph. Captures are per process. (Checked
 * against an H200's driver with build/tests/simgpu_probe capture.)
 */

static pthread_mutex_t g_cap_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sg_stream *g_capturing; /* under g_cap_lock */
static _Atomic int g_captures;        /* its length: no capture, no lock taken */
static uint64_t g_cap_ids;            /* under g_cap_lock */
static __thread int tl_mode;          /* CU_STREAM_CAPTURE_MODE_GLOBAL (0) by default */
static __thread char tl_token;        /* its address names the thread */

int sg_capture_add(struct sg_stream *s, uint64_t dur_ns, CUresult *rc)
{
    if (!atomic_load(&g_captures))
        return 0;
    pthread_mutex_lock(&g_cap_lock);
    int capturing = s->capture != NULL;
    if (capturing)
        *rc = s->cap_invalid ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : sg_graph_append(s->capture, dur_ns, NULL);
    pthread_mutex_unlock(&g_cap_lock);
    return capturing;
}

uint64_t sg_capture_id(struct sg_stream *s, int *invalid)
{
    if (invalid)
        *invalid = 0;
    if (!atomic_load(&g_captures))
        return 0;
    pthread_mutex_lock(&g_cap_lock);
    uint64_t id = s->capture ? s->cap_id : 0;
    if (id && invalid)
        *invalid = s->cap_invalid;
    pthread_mutex_unlock(&g_cap_lock);
    return id;
}

CUresult sg_capture_guard(const struct sg_stream *s, const struct sg_ctx *ctx, uint64_t cap_id)
{
    if (!atomic_load(&g_captures))
        return CUDA_SUCCESS;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&g_cap_lock);
    for (struct sg_stream *c = g_capturing; c; c = c->cap_next) {
        int mine = c->cap_thread == &tl_token;
        int conflict = c == s || (ctx && c->ctx == ctx);
        if (tl_mode != CU_STREAM_CAPTURE_MODE_RELAXED) {
            conflict |= mine && c->cap_mode != CU_STREAM_CAPTURE_MODE_RELAXED;
            conflict |= !mine && tl_mode == CU_STREAM_CAPTURE_MODE_GLOBAL && c->cap_mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
        }
        if (cap_id && c->cap_id == cap_id) {
            c->cap_invalid = 1;
            rc = SG_ERROR_CAPTURED_EVENT; /* the driver's answer for an event of a capture */
        } else if (conflict) {
            c->cap_invalid = 1;
            if (rc == CUDA_SUCCESS)
                rc = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
    }
    pthread_mutex_unlock(&g_cap_lock);
    return rc;
}

/* Take s out of capture (under g_cap_lock); returns its graph. */
static struct sg_graph *capture_end(struct sg_stream *s)
{
    struct sg_graph *g = s->capture;
    for (struct sg_stream **p = &g_capturing; *p; p = &(*p)->cap_next) {
        if (*p == s) {
            *p = s->cap_next;
            atomic_fetch_sub(&g_captures, 1);
            break;
        }
    }
    s->capture = NULL;
    s->cap_next = NULL;
    return g;
}

void sg_capture_drop(struct sg_stream *s)
{
    if (!atomic_load(&g_captures))
        return;
    pthread_mutex_lock(&g_cap_lock);
    struct sg_graph *g = s->capture ? capture_end(s) : NULL;
    pthread_mutex_unlock(&g_cap_lock);
    if (g && sg_handle_take(g, SG_MAGIC_GRAPH))
        graph_free(g);
}

static CUresult begin_capture(CUstream hStream, CUstreamCaptureMode mode)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (mode < CU_STREAM_CAPTURE_MODE_GLOBAL || mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    /* The legacy default stream cannot be captured. */
    if (!hStream || hStream == CU_STREAM_LEGACY)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    struct sg_stream *s;
    if ((rc = sg_stream_resolve(hStream, &s)) != CUDA_SUCCESS)
        return rc;
    struct sg_graph *g = sg_graph_new();
    if (!g)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_cap_lock);
    if (s->capture) {
        rc = CUDA_ERROR_ILLEGAL_STATE;
    } else {
        s->capture = g;
        s->cap_id = ++g_cap_ids;
        s->cap_mode = mode;
        s->cap_invalid = 0;
        s->cap_thread = &tl_token;
        s->cap_next = g_capturing;
        g_capturing = s;
        atomic_fetch_add(&g_captures, 1);
    }
    pthread_mutex_unlock(&g_cap_lock);
    if (rc != CUDA_SUCCESS && sg_handle_take(g, SG_MAGIC_GRAPH))
        graph_free(g);
    return rc;
}

SIMGPU_API CUresult cuStreamBeginCapture(CUstream hStream)
{
    return begin_capture(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL);
}

SIMGPU_API CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
    return begin_capture(hStream, mode);
}

SIMGPU_API CUresult cuStreamBeginCapture_ptsz(CUstream hStream)
{
    return begin_capture(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL);
}

SIMGPU_API CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode)
{
    return begin_capture(hStream, mode);
}

SIMGPU_API CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!phGraph)
        return CUDA_ERROR_INVALID_VALUE;
    struct sg_stream *s;
    if ((rc = sg_stream_resolve(hStream, &s)) != CUDA_SUCCESS)
        return rc;
    struct sg_graph *g = NULL;
    pthread_mutex_lock(&g_cap_lock);
    if (!s->capture) {
        rc = CUDA_ERROR_ILLEGAL_STATE;
    } else {
        /* Ended from another thread, a capture that is not relaxed is over all the same,
         * with no graph (so the driver does). */
        if (s->cap_mode != CU_STREAM_CAPTURE_MODE_RELAXED && s->cap_thread != &tl_token)
            rc = CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
        else if (s->cap_invalid)
            rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        g = capture_end(s);
    }
    pthread_mutex_unlock(&g_cap_lock);
    *phGraph = NULL;
    if (rc != CUDA_SUCCESS) {
        if (g && sg_handle_take(g, SG_MAGIC_GRAPH))
            graph_free(g);
        return rc;
    }
    *phGraph = (CUgraph)g;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
    return cuStreamEndCapture(hStream, phGraph);
}

SIMGPU_API CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    struct sg_stream *s;
    CUresult rc = sg_stream_resolve(hStream, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!captureStatus)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_cap_lock);
    *captureStatus = !s->capture     ? CU_STREAM_CAPTURE_STATUS_NONE
                     : s->cap_invalid ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                      : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    pthread_mutex_unlock(&g_cap_lock);
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    return cuStreamIsCapturing(hStream, captureStatus);
}

SIMGPU_API CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!mode || *mode < CU_STREAM_CAPTURE_MODE_GLOBAL || *mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    int old = tl_mode;
    tl_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}
