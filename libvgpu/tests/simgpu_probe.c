/* SPDX-License-Identifier: Apache-2.0 */
/*
 * simgpu_probe - drives simgpu's hardware-like behaviour for the tests
 * (tests/libvgpu/test_simgpu_*.py). Each command prints one JSON object on stdout and
 * exits 0; an unexpected failure prints one line on stderr and exits 1. Times are
 * CLOCK_MONOTONIC ns (the clock of simgpu's timeline, build/tests/simgpu_timeline),
 * elapsed times cuEventElapsedTime's ms.
 *
 *   events US                  three kernels of US us on one stream, an event after each
 *                              and one recorded on the idle stream before them: the
 *                              events' elapsed times, when the first turned complete,
 *                              and the driver's answers for the cases that are errors
 *   wake SYNC N US             N times: a kernel of US us on an idle stream and a sync of
 *                              kind SYNC (stream, ctx, event-blocking, event-spin) for it;
 *                              when each sync returned
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "vgpu_cuda.h"

/* Not in vgpu_cuda.h (libvgpu needs none of them). */
CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags);

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "simgpu_probe: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static const char *rname(CUresult r)
{
    const char *s = NULL;
    if (cuGetErrorName(r, &s) != CUDA_SUCCESS || !s)
        return "?";
    return s;
}

#define CK(call)                                                                                   \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS)                                                                    \
            die("%s:%d: %s: %s", __FILE__, __LINE__, #call, rname(r_));                            \
    } while (0)

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static unsigned long parse_ul(const char *s, const char *what)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || end == s || *end)
        die("%s: \"%s\" is not a number", what, s);
    return v;
}

static CUmodule g_mod;

static void setup(void)
{
    CUdevice dev;
    CUcontext ctx;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoadData(&g_mod, "image"));
}

static CUfunction kernel(unsigned long us)
{
    char name[64];
    CUfunction f;
    snprintf(name, sizeof(name), "busy_%luus", us);
    CK(cuModuleGetFunction(&f, g_mod, name));
    return f;
}

static CUresult launch(CUfunction f, CUstream s)
{
    return cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL);
}

static float elapsed(CUevent a, CUevent b)
{
    float ms = -1;
    CK(cuEventElapsedTime(&ms, a, b));
    return ms;
}

/* ---- events ---- */
static int cmd_events(unsigned long us)
{
    setup();
    CUfunction f = kernel(us);
    CUstream s;
    CUevent idle, e[3], untimed, unrecorded;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CK(cuEventCreate(&idle, CU_EVENT_DEFAULT));
    for (int i = 0; i < 3; i++)
        CK(cuEventCreate(&e[i], CU_EVENT_DEFAULT));
    CK(cuEventCreate(&untimed, CU_EVENT_DISABLE_TIMING));
    CK(cuEventCreate(&unrecorded, CU_EVENT_DEFAULT));

    uint64_t rec0 = now_ns();
    CK(cuEventRecord(idle, s)); /* the stream is idle: complete at once, now */
    uint64_t rec1 = now_ns();
    for (int i = 0; i < 3; i++) {
        CK(launch(f, s));
        CK(i == 1 ? cuEventRecordWithFlags(e[i], s, 0) : cuEventRecord(e[i], s));
    }
    CK(cuEventRecord(untimed, s));
    float ms;
    CUresult pending = cuEventElapsedTime(&ms, idle, e[2]);
    CUresult untimed_rc = cuEventElapsedTime(&ms, idle, untimed);
    CUresult unrecorded_rc = cuEventElapsedTime(&ms, unrecorded, idle);
    CUresult query_pending = cuEventQuery(e[0]);

    /* When did the first event turn complete? Between the last NOT_READY and the first SUCCESS. */
    uint64_t last_not_ready = 0, first_ready = 0;
    for (;;) {
        uint64_t t = now_ns();
        CUresult r = cuEventQuery(e[0]);
        if (r == CUDA_SUCCESS) {
            first_ready = now_ns();
            break;
        }
        if (r != CUDA_ERROR_NOT_READY)
            die("cuEventQuery: %s", rname(r));
        last_not_ready = t;
    }
    CK(cuEventSynchronize(e[2]));
    CK(cuEventSynchronize(untimed));
    CUresult untimed_done = cuEventElapsedTime(&ms, idle, untimed);
    printf("{\"pid\": %d, \"record_idle\": [%" PRIu64 ", %" PRIu64 "], \"idle_to\": [%.6f, %.6f, %.6f], "
           "\"between\": [%.6f, %.6f], \"back\": %.6f, \"first_last_not_ready\": %" PRIu64
           ", \"first_ready\": %" PRIu64 ", \"pending\": \"%s\", \"untimed\": \"%s\", \"untimed_done\": \"%s\", "
           "\"unrecorded\": \"%s\", \"query_pending\": \"%s\"}\n",
           (int)getpid(), rec0, rec1, elapsed(idle, e[0]), elapsed(idle, e[1]), elapsed(idle, e[2]),
           elapsed(e[0], e[1]), elapsed(e[1], e[2]), elapsed(e[2], e[0]), last_not_ready, first_ready,
           rname(pending), rname(untimed_rc), rname(untimed_done), rname(unrecorded_rc), rname(query_pending));
    return 0;
}

/* ---- wake ---- */
/* N times: one kernel of US us on an idle stream, then the sync KIND waits for it;
 * the times the syncs returned (the test finds the kernels' ends on the timeline). */
static int cmd_wake(const char *kind, unsigned long n, unsigned long us)
{
    setup();
    CUfunction f = kernel(us);
    CUstream s;
    CUevent e;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    int blocking = !strcmp(kind, "event-blocking");
    if (!blocking && strcmp(kind, "event-spin") && strcmp(kind, "stream") && strcmp(kind, "ctx"))
        die("wake: unknown sync \"%s\"", kind);
    CK(cuEventCreate(&e, blocking ? CU_EVENT_BLOCKING_SYNC : CU_EVENT_DEFAULT));
    uint64_t *ret = calloc(n, sizeof(*ret));
    if (!ret)
        die("out of memory");
    for (unsigned long i = 0; i < n; i++) {
        CK(launch(f, s));
        if (!strncmp(kind, "event", 5)) {
            CK(cuEventRecord(e, s));
            CK(cuEventSynchronize(e));
        } else if (!strcmp(kind, "stream")) {
            CK(cuStreamSynchronize(s));
        } else {
            CK(cuCtxSynchronize());
        }
        ret[i] = now_ns();
    }
    printf("{\"pid\": %d, \"returned\": [", (int)getpid());
    for (unsigned long i = 0; i < n; i++)
        printf("%s%" PRIu64, i ? ", " : "", ret[i]);
    printf("]}\n");
    free(ret);
    return 0;
}

static void usage(void)
{
    fprintf(stderr, "usage: simgpu_probe events US | wake stream|ctx|event-blocking|event-spin N US\n");
    exit(2);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        usage();
    const char *cmd = argv[1];
    if (!strcmp(cmd, "events") && argc == 3)
        return cmd_events(parse_ul(argv[2], "US"));
    if (!strcmp(cmd, "wake") && argc == 5)
        return cmd_wake(argv[2], parse_ul(argv[3], "N"), parse_ul(argv[4], "US"));
    usage();
    return 2;
}
