/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gpu_load.c - a greedy GPU workload for the compute tests and benchmark.
 *
 *   gpu_load [--kernel busy_2000us] [--device N[,N...]] [--path kernel|ex|coop|graph]
 *            [--graph-kernels N] [--threads N] [--queue N]
 *            [--start-at NS] [--until NS | --seconds S] [--trace FILE]
 *
 * Launches KERNEL (simgpu: busy_<N>us occupies the engine N us) as fast as the
 * GPU takes it, keeping at most --queue launches in flight per thread (like a
 * training loop that syncs now and then), from --threads threads each with its
 * own stream; with several devices, thread i works on the i-th (mod count).
 * --start-at / --until are CLOCK_MONOTONIC times, so processes started one
 * after another measure the same window. --trace writes one (launch time ns,
 * GPU ns of that launch, device) triple of little-endian uint64 per launch;
 * the summary line on stdout is JSON.
 */
#include "vgpu_cuda.h"
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_DEVS 8

struct opts {
    const char *kernel, *path, *trace;
    int devices[MAX_DEVS], ndev, threads, queue, graph_kernels;
    uint64_t start_at, until, kernel_ns;
};

struct rec {
    uint64_t t, gpu_ns, dev;
};

struct worker {
    pthread_t th;
    const struct opts *o;
    int dev;
    CUcontext ctx;
    CUfunction f;
    struct rec *recs;
    size_t n, cap;
    CUresult err;
    const char *what;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t t)
{
    struct timespec ts = {(time_t)(t / 1000000000ull), (long)(t % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0)
        ;
}

static void die(const char *what, CUresult r)
{
    fprintf(stderr, "gpu_load: %s failed: %d\n", what, (int)r);
    exit(1);
}

static int note(struct worker *w, uint64_t gpu_ns)
{
    if (w->n == w->cap) {
        w->cap = w->cap ? w->cap * 2 : 4096;
        w->recs = realloc(w->recs, w->cap * sizeof(*w->recs));
        if (!w->recs)
            return -1;
    }
    w->recs[w->n].t = now_ns();
    w->recs[w->n].gpu_ns = gpu_ns;
    w->recs[w->n].dev = (uint64_t)w->dev;
    w->n++;
    return 0;
}

#define CHECK(label, call)                                                                                   \
    do {                                                                                                    \
        CUresult r_ = (call);                                                                               \
        if (r_ != CUDA_SUCCESS) {                                                                           \
            w->err = r_;                                                                                    \
            w->what = label;                                                                                \
            return NULL;                                                                                    \
        }                                                                                                   \
    } while (0)

static void *work(void *arg)
{
    struct worker *w = arg;
    const struct opts *o = w->o;
    CHECK("cuCtxSetCurrent", cuCtxSetCurrent(w->ctx));
    CUstream s;
    CHECK("cuStreamCreate", cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUgraphExec exec = NULL;
    uint64_t per_launch = o->kernel_ns;
    if (strcmp(o->path, "graph") == 0) {
        CUgraph g;
        CHECK("cuStreamBeginCapture", cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
        for (int i = 0; i < o->graph_kernels; i++)
            CHECK("captured launch", cuLaunchKernel(w->f, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
        CHECK("cuStreamEndCapture", cuStreamEndCapture(s, &g));
        CHECK("cuGraphInstantiate", cuGraphInstantiateWithFlags(&exec, g, 0));
        per_launch = o->kernel_ns * (uint64_t)o->graph_kernels;
    }
    CUevent *ring = calloc((size_t)o->queue, sizeof(*ring));
    for (int i = 0; i < o->queue; i++)
        CHECK("cuEventCreate", cuEventCreate(&ring[i], CU_EVENT_DISABLE_TIMING));
    sleep_until(o->start_at);
    for (uint64_t k = 0; now_ns() < o->until; k++) {
        CUevent ev = ring[k % (uint64_t)o->queue];
        if (k >= (uint64_t)o->queue)
            CHECK("cuEventSynchronize", cuEventSynchronize(ev)); /* at most --queue in flight */
        if (exec) {
            CHECK("cuGraphLaunch", cuGraphLaunch(exec, s));
        } else if (strcmp(o->path, "ex") == 0) {
            CUlaunchConfig cfg = {0};
            cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
            cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1;
            cfg.hStream = s;
            CHECK("cuLaunchKernelEx", cuLaunchKernelEx(&cfg, w->f, NULL, NULL));
        } else if (strcmp(o->path, "coop") == 0) {
            CHECK("cuLaunchCooperativeKernel", cuLaunchCooperativeKernel(w->f, 1, 1, 1, 1, 1, 1, 0, s, NULL));
        } else {
            CHECK("cuLaunchKernel", cuLaunchKernel(w->f, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
        }
        if (note(w, per_launch) != 0)
            CHECK("out of host memory", CUDA_ERROR_OUT_OF_MEMORY);
        CHECK("cuEventRecord", cuEventRecord(ev, s));
    }
    CHECK("cuStreamSynchronize", cuStreamSynchronize(s));
    return NULL;
}

int main(int argc, char **argv)
{
    struct opts o = {"busy_1000us", "kernel", NULL, {0}, 1, 1, 4, 4, 0, 0, 0};
    double seconds = 2.0;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--kernel"))
            o.kernel = v;
        else if (!strcmp(k, "--path"))
            o.path = v;
        else if (!strcmp(k, "--trace"))
            o.trace = v;
        else if (!strcmp(k, "--device")) {
            o.ndev = 0;
            for (const char *p = v; *p && o.ndev < MAX_DEVS; p = strchr(p, ',') ? strchr(p, ',') + 1 : "")
                o.devices[o.ndev++] = atoi(p);
        }
        else if (!strcmp(k, "--threads"))
            o.threads = atoi(v);
        else if (!strcmp(k, "--queue"))
            o.queue = atoi(v);
        else if (!strcmp(k, "--graph-kernels"))
            o.graph_kernels = atoi(v);
        else if (!strcmp(k, "--start-at"))
            o.start_at = strtoull(v, NULL, 10);
        else if (!strcmp(k, "--until"))
            o.until = strtoull(v, NULL, 10);
        else if (!strcmp(k, "--seconds"))
            seconds = atof(v);
        else {
            fprintf(stderr, "gpu_load: unknown option %s\n", k);
            return 2;
        }
    }
    unsigned us = 0;
    if (sscanf(o.kernel, "busy_%uus", &us) != 1 || o.threads < 1 || o.queue < 1 || o.graph_kernels < 1) {
        fprintf(stderr, "gpu_load: --kernel busy_<N>us, --threads, --queue and --graph-kernels >= 1\n");
        return 2;
    }
    o.kernel_ns = (uint64_t)us * 1000;
    if (!o.start_at)
        o.start_at = now_ns();
    if (!o.until)
        o.until = o.start_at + (uint64_t)(seconds * 1e9);
    CUresult r;
    CUcontext ctx[MAX_DEVS];
    CUfunction f[MAX_DEVS];
    static const char image[] = "simgpu";
    if ((r = cuInit(0)))
        die("cuInit", r);
    for (int i = 0; i < o.ndev; i++) {
        CUdevice dev;
        CUmodule mod;
        if ((r = cuDeviceGet(&dev, o.devices[i])) || (r = cuDevicePrimaryCtxRetain(&ctx[i], dev)) ||
            (r = cuCtxSetCurrent(ctx[i])) || (r = cuModuleLoadData(&mod, image)) ||
            (r = cuModuleGetFunction(&f[i], mod, o.kernel)))
            die("setup", r);
    }
    struct worker *ws = calloc((size_t)o.threads, sizeof(*ws));
    for (int i = 0; i < o.threads; i++) {
        ws[i].o = &o;
        ws[i].dev = o.devices[i % o.ndev];
        ws[i].ctx = ctx[i % o.ndev];
        ws[i].f = f[i % o.ndev];
        pthread_create(&ws[i].th, NULL, work, &ws[i]);
    }
    uint64_t launches = 0, gpu_ns = 0;
    FILE *trace = o.trace ? fopen(o.trace, "wb") : NULL;
    for (int i = 0; i < o.threads; i++) {
        pthread_join(ws[i].th, NULL);
        if (ws[i].err)
            die(ws[i].what, ws[i].err);
        for (size_t j = 0; j < ws[i].n; j++)
            gpu_ns += ws[i].recs[j].gpu_ns;
        launches += ws[i].n;
        if (trace)
            fwrite(ws[i].recs, sizeof(struct rec), ws[i].n, trace);
    }
    if (trace)
        fclose(trace);
    printf("{\"launches\":%llu,\"gpu_ns\":%llu,\"start\":%llu,\"until\":%llu,\"end\":%llu}\n",
           (unsigned long long)launches, (unsigned long long)gpu_ns, (unsigned long long)o.start_at,
           (unsigned long long)o.until, (unsigned long long)now_ns());
    return 0;
}
