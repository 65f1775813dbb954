/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gpu_load.c - a GPU workload for the compute tests and benchmark.
 *
 *   gpu_load [--kernel busy_2000us | --kernels busy_50us,busy_500us,...]
 *            [--device N[,N...]] [--path kernel|ex|coop|graph|graph-procaddr] [--graph-kernels N]
 *            [--threads N] [--queue N] [--sync-every N] [--cpu-gap-us U]
 *            [--gap spin|sleep] [--wait sync|poll] [--start-at NS] [--until NS | --seconds S]
 *            [--trace FILE] [--capture-every-us U]
 *
 * Launches KERNEL (simgpu: busy_<N>us occupies the engine N us) as fast as the
 * GPU takes it, keeping at most --queue launches in flight per thread (like a
 * training loop that syncs now and then), from --threads threads each with its
 * own stream; with several devices, thread i works on the i-th (mod count).
 * --kernels cycles through a list of kernels, one per launch (a mix of lengths).
 * --sync-every N makes a step loop, as inference serving and data-bound training
 * are: after every N launches the thread synchronizes its stream, then does
 * --cpu-gap-us of CPU work (busy spinning, as a step preparing its next input
 * does; --gap sleep sleeps instead) before the next step. The queue then
 * defaults to N, so a whole step is in flight. --wait poll polls cuStreamQuery until
 * the step is done instead of syncing (as loops that overlap host work do).
 * --start-at / --until are CLOCK_MONOTONIC times, so processes started one
 * after another measure the same window. --trace writes one (launch time ns,
 * GPU ns of that launch, device) triple of little-endian uint64 per launch;
 * the summary line on stdout is JSON. --capture-every-us U adds a thread that
 * captures a graph in CU_STREAM_CAPTURE_MODE_GLOBAL every U us (--graph-kernels
 * launches into its own stream, held open about U/2 us), as PyTorch captures CUDA
 * graphs, while the other threads launch (in relaxed mode, so only someone else's
 * calls can break a capture); the summary counts the captures and those that failed.
 */
#include "vgpu_cuda.h"
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_DEVS 8
#define MAX_KERNELS 16

struct opts {
    const char *path, *trace;
    const char *kernels[MAX_KERNELS];
    int nkernels, devices[MAX_DEVS], ndev, threads, queue, graph_kernels, sync_every, gap_sleep, poll;
    uint64_t start_at, until, kernel_ns[MAX_KERNELS], cpu_gap_ns, capture_every_ns;
};

struct rec {
    uint64_t t, gpu_ns, dev;
};

struct worker {
    pthread_t th;
    const struct opts *o;
    int dev;
    CUcontext ctx;
    CUfunction f[MAX_KERNELS];
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

/* CPU work between steps: spinning keeps the core busy, as preparing a batch does. */
static void cpu_gap(const struct opts *o)
{
    if (!o->cpu_gap_ns)
        return;
    uint64_t until = now_ns() + o->cpu_gap_ns;
    if (o->gap_sleep)
        sleep_until(until);
    else
        while (now_ns() < until)
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

struct capturer {
    pthread_t th;
    const struct opts *o;
    CUcontext ctx;
    CUfunction f;
    uint64_t captures, failed;
    CUresult err;
    const char *what;
};

/* Capture a graph in global mode every capture_every_ns until the end. */
static void *capture(void *arg)
{
    struct capturer *w = arg;
    const struct opts *o = w->o;
    CHECK("cuCtxSetCurrent", cuCtxSetCurrent(w->ctx));
    CUstream s;
    CHECK("cuStreamCreate", cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    sleep_until(o->start_at);
    for (uint64_t next = now_ns(); next < o->until; next += o->capture_every_ns) {
        sleep_until(next);
        CHECK("cuStreamBeginCapture", cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
        CUresult rc = CUDA_SUCCESS;
        for (int i = 0; i < o->graph_kernels && rc == CUDA_SUCCESS; i++)
            rc = cuLaunchKernel(w->f, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL);
        sleep_until(now_ns() + o->capture_every_ns / 2); /* others work while it is open */
        CUgraph g = NULL;
        CUresult end = cuStreamEndCapture(s, &g);
        w->captures++;
        if (rc != CUDA_SUCCESS || end != CUDA_SUCCESS)
            w->failed++;
        if (g)
            cuGraphDestroy(g);
    }
    return NULL;
}

static void *work(void *arg)
{
    struct worker *w = arg;
    const struct opts *o = w->o;
    CHECK("cuCtxSetCurrent", cuCtxSetCurrent(w->ctx));
    if (o->capture_every_ns) {
        CUstreamCaptureMode relaxed = CU_STREAM_CAPTURE_MODE_RELAXED;
        CHECK("cuThreadExchangeStreamCaptureMode", cuThreadExchangeStreamCaptureMode(&relaxed));
    }
    CUstream s;
    CHECK("cuStreamCreate", cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUgraphExec exec = NULL;
    uint64_t graph_ns = 0;
    if (strcmp(o->path, "graph") == 0 || strcmp(o->path, "graph-procaddr") == 0) {
        CUgraph g;
        /* graph-procaddr: capture through the pointers cuGetProcAddress hands out, as the
         * CUDA runtime does (libvgpu must see the capture either way) */
        CUresult (*begin)(CUstream, CUstreamCaptureMode) = cuStreamBeginCapture_v2;
        CUresult (*end)(CUstream, CUgraph *) = cuStreamEndCapture;
        if (strcmp(o->path, "graph-procaddr") == 0) {
            CUdriverProcAddressQueryResult st;
            CHECK("cuGetProcAddress", cuGetProcAddress_v2("cuStreamBeginCapture", (void **)&begin, 12000, 0, &st));
            CHECK("cuGetProcAddress", cuGetProcAddress_v2("cuStreamEndCapture", (void **)&end, 12000, 0, &st));
        }
        CHECK("cuStreamBeginCapture", begin(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
        for (int i = 0; i < o->graph_kernels; i++) {
            int j = i % o->nkernels;
            CHECK("captured launch", cuLaunchKernel(w->f[j], 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
            graph_ns += o->kernel_ns[j];
        }
        CHECK("cuStreamEndCapture", end(s, &g));
        CHECK("cuGraphInstantiate", cuGraphInstantiateWithFlags(&exec, g, 0));
    }
    CUevent *ring = calloc((size_t)o->queue, sizeof(*ring));
    for (int i = 0; i < o->queue; i++)
        /* blocking: a load that spun while it waits would take the CPU the others need */
        CHECK("cuEventCreate", cuEventCreate(&ring[i], CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC));
    sleep_until(o->start_at);
    /* k counts launches since the last sync: no event waits on what a sync drained. */
    uint64_t n = 0;
    for (uint64_t k = 0; now_ns() < o->until; k++, n++) {
        if (o->sync_every && n > 0 && n % (uint64_t)o->sync_every == 0) {
            if (o->poll) {
                CUresult q;
                while ((q = cuStreamQuery(s)) == CUDA_ERROR_NOT_READY)
                    ;
                CHECK("cuStreamQuery", q);
            } else {
                CHECK("cuStreamSynchronize", cuStreamSynchronize(s));
            }
            cpu_gap(o);
            k = 0;
            if (now_ns() >= o->until)
                break;
        }
        CUevent ev = ring[k % (uint64_t)o->queue];
        if (k >= (uint64_t)o->queue)
            CHECK("cuEventSynchronize", cuEventSynchronize(ev)); /* at most --queue in flight */
        int j = (int)(n % (uint64_t)o->nkernels);
        CUfunction f = w->f[j];
        uint64_t gpu_ns = exec ? graph_ns : o->kernel_ns[j];
        if (exec) {
            CHECK("cuGraphLaunch", cuGraphLaunch(exec, s));
        } else if (strcmp(o->path, "ex") == 0) {
            CUlaunchConfig cfg = {0};
            cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
            cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1;
            cfg.hStream = s;
            CHECK("cuLaunchKernelEx", cuLaunchKernelEx(&cfg, f, NULL, NULL));
        } else if (strcmp(o->path, "coop") == 0) {
            CHECK("cuLaunchCooperativeKernel", cuLaunchCooperativeKernel(f, 1, 1, 1, 1, 1, 1, 0, s, NULL));
        } else {
            CHECK("cuLaunchKernel", cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
        }
        if (note(w, gpu_ns) != 0)
            CHECK("out of host memory", CUDA_ERROR_OUT_OF_MEMORY);
        CHECK("cuEventRecord", cuEventRecord(ev, s));
    }
    CHECK("cuStreamSynchronize", cuStreamSynchronize(s));
    return NULL;
}

/* "busy_50us,busy_500us" -> o->kernels / o->kernel_ns; 0 when every name is busy_<N>us. */
static int parse_kernels(struct opts *o, char *list)
{
    o->nkernels = 0;
    char *save = NULL;
    for (char *k = strtok_r(list, ",", &save); k; k = strtok_r(NULL, ",", &save)) {
        unsigned us = 0;
        if (o->nkernels == MAX_KERNELS || sscanf(k, "busy_%uus", &us) != 1)
            return -1;
        o->kernels[o->nkernels] = k;
        o->kernel_ns[o->nkernels++] = (uint64_t)us * 1000;
    }
    return o->nkernels ? 0 : -1;
}

int main(int argc, char **argv)
{
    struct opts o = {.path = "kernel", .ndev = 1, .threads = 1, .graph_kernels = 4};
    char kernels[512] = "busy_1000us";
    double seconds = 2.0;
    int queue = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--kernel") || !strcmp(k, "--kernels"))
            snprintf(kernels, sizeof(kernels), "%s", v);
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
            queue = atoi(v);
        else if (!strcmp(k, "--graph-kernels"))
            o.graph_kernels = atoi(v);
        else if (!strcmp(k, "--sync-every"))
            o.sync_every = atoi(v);
        else if (!strcmp(k, "--cpu-gap-us"))
            o.cpu_gap_ns = strtoull(v, NULL, 10) * 1000;
        else if (!strcmp(k, "--gap") && (!strcmp(v, "spin") || !strcmp(v, "sleep")))
            o.gap_sleep = !strcmp(v, "sleep");
        else if (!strcmp(k, "--wait") && (!strcmp(v, "sync") || !strcmp(v, "poll")))
            o.poll = !strcmp(v, "poll");
        else if (!strcmp(k, "--start-at"))
            o.start_at = strtoull(v, NULL, 10);
        else if (!strcmp(k, "--until"))
            o.until = strtoull(v, NULL, 10);
        else if (!strcmp(k, "--seconds"))
            seconds = atof(v);
        else if (!strcmp(k, "--capture-every-us"))
            o.capture_every_ns = strtoull(v, NULL, 10) * 1000;
        else {
            fprintf(stderr, "gpu_load: unknown option %s %s\n", k, v);
            return 2;
        }
    }
    o.queue = queue ? queue : o.sync_every ? o.sync_every : 4;
    if (parse_kernels(&o, kernels) != 0 || o.threads < 1 || o.queue < 1 || o.graph_kernels < 1 ||
        o.sync_every < 0) {
        fprintf(stderr, "gpu_load: --kernel busy_<N>us[,busy_<N>us...] (at most %d), --threads, --queue and "
                        "--graph-kernels >= 1, --sync-every >= 0\n", MAX_KERNELS);
        return 2;
    }
    if (!o.start_at)
        o.start_at = now_ns();
    if (!o.until)
        o.until = o.start_at + (uint64_t)(seconds * 1e9);
    CUresult r;
    CUcontext ctx[MAX_DEVS];
    CUfunction f[MAX_DEVS][MAX_KERNELS];
    static const char image[] = "simgpu";
    if ((r = cuInit(0)))
        die("cuInit", r);
    for (int i = 0; i < o.ndev; i++) {
        CUdevice dev;
        CUmodule mod;
        if ((r = cuDeviceGet(&dev, o.devices[i])) || (r = cuDevicePrimaryCtxRetain(&ctx[i], dev)) ||
            (r = cuCtxSetCurrent(ctx[i])) || (r = cuModuleLoadData(&mod, image)))
            die("setup", r);
        for (int j = 0; j < o.nkernels; j++)
            if ((r = cuModuleGetFunction(&f[i][j], mod, o.kernels[j])))
                die("cuModuleGetFunction", r);
    }
    struct worker *ws = calloc((size_t)o.threads, sizeof(*ws));
    for (int i = 0; i < o.threads; i++) {
        ws[i].o = &o;
        ws[i].dev = o.devices[i % o.ndev];
        ws[i].ctx = ctx[i % o.ndev];
        memcpy(ws[i].f, f[i % o.ndev], sizeof(ws[i].f));
        pthread_create(&ws[i].th, NULL, work, &ws[i]);
    }
    struct capturer cap = {.o = &o, .ctx = ctx[0], .f = f[0][0]};
    if (o.capture_every_ns)
        pthread_create(&cap.th, NULL, capture, &cap);
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
    if (o.capture_every_ns) {
        pthread_join(cap.th, NULL);
        if (cap.err)
            die(cap.what, cap.err);
    }
    printf("{\"launches\":%llu,\"gpu_ns\":%llu,\"start\":%llu,\"until\":%llu,\"end\":%llu,\"pid\":%d,\"captures\":%llu,\"captures_failed\":%llu}\n",
           (unsigned long long)launches, (unsigned long long)gpu_ns, (unsigned long long)o.start_at,
           (unsigned long long)o.until, (unsigned long long)now_ns(), (int)getpid(),
           (unsigned long long)cap.captures, (unsigned long long)cap.failed);
    return 0;
}
