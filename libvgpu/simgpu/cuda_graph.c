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

/* ---- stream capture ---- */

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
    pthread_mutex_lock(&s->lock);
    if (s->capture)
        rc = CUDA_ERROR_ILLEGAL_STATE;
    else
        s->capture = g;
    pthread_mutex_unlock(&s->lock);
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
    pthread_mutex_lock(&s->lock);
    struct sg_graph *g = s->capture;
    s->capture = NULL;
    pthread_mutex_unlock(&s->lock);
    if (!g)
        return CUDA_ERROR_ILLEGAL_STATE;
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
    pthread_mutex_lock(&s->lock);
    *captureStatus = s->capture ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    pthread_mutex_unlock(&s->lock);
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    return cuStreamIsCapturing(hStream, captureStatus);
}
