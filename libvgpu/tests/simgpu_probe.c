/* SPDX-License-Identifier: Apache-2.0 */
/*
 * simgpu_probe - drives simgpu's hardware-like behaviour for the tests
 * (tests/libvgpu/test_simgpu_*.py). Each command prints one JSON object on stdout and
 * exits 0; an unexpected failure prints one line on stderr and exits 1. Times are
 * CLOCK_MONOTONIC ns (the clock of simgpu's timeline, build/tests/simgpu_timeline),
 * elapsed times cuEventElapsedTime's ms.
 *
 *   events US                  three kernels of US us on one stream, an event after each
 *                              and one recorded on the idle stream before them: when each
 *                              was recorded, the events' elapsed times, when the first
 *                              turned complete, and the driver's answers for the cases
 *                              that are errors
 *   wake SYNC N US             N times: a kernel of US us on an idle stream and a sync of
 *                              kind SYNC (stream, ctx, event-blocking, event-spin) for it;
 *                              when each sync was called and returned
 *   sleep N US                 N times: a sleep to US us from now (clock_nanosleep to an
 *                              absolute time, no GPU): how late each woke up, this host's
 *                              own wake-up latency
 *   capture                    captures in each mode while this or another thread (in
 *                              each mode) syncs or queries: what each call, a launch into
 *                              the capture after it, cuStreamIsCapturing and
 *                              cuStreamEndCapture answered
 *   streams N US               N kernels of US us on each of two streams, launched in
 *                              turn, then a context sync: when it launched and synced
 *   stream-wait US1 US2 [nowait]  a kernel of US1 us on one stream and an event after
 *                              it; on another a wait for the event (not with nowait) and
 *                              a kernel of US2 us; when the second stream's sync returned
 *   hammer                     launch, record, query and sync on two streams until killed
 *   engine STATE DEV           what the timed engine of device DEV holds: entries free,
 *                              queued, done (kept for events), queues, repairs made
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "../simgpu/simgpu_state.h"
#include "vgpu_cuda.h"

/* Not in vgpu_cuda.h (libvgpu needs none of them). */
CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags);
CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode);

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

/* The module: simgpu loads any image and runs busy_<N>us; a real driver JIT-compiles this
 * PTX, whose `spin` kernel runs for the ns it is given, so the probe runs on a GPU too
 * (what it says there is how the driver behaves, a reference for simgpu's). */
static const char PTX[] = ".version 7.0\n.target sm_50\n.address_size 64\n"
                          ".visible .entry spin(.param .u64 spin_ns)\n{\n"
                          "  .reg .pred %p<2>;\n  .reg .b64 %rd<5>;\n"
                          "  ld.param.u64 %rd1, [spin_ns];\n  mov.u64 %rd2, %globaltimer;\n"
                          "$L_loop:\n  mov.u64 %rd3, %globaltimer;\n  sub.s64 %rd4, %rd3, %rd2;\n"
                          "  setp.lt.u64 %p1, %rd4, %rd1;\n  @%p1 bra $L_loop;\n  ret;\n}\n";

static void setup(void)
{
    CUdevice dev;
    CUcontext ctx;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoadData(&g_mod, PTX));
}

struct kern {
    CUfunction f;
    uint64_t ns; /* the spin kernel's parameter (simgpu's kernels ignore theirs) */
};

static struct kern kernel(unsigned long us)
{
    char name[64];
    struct kern k = {.ns = us * 1000ull};
    snprintf(name, sizeof(name), "busy_%luus", us);
    if (cuModuleGetFunction(&k.f, g_mod, name) != CUDA_SUCCESS)
        CK(cuModuleGetFunction(&k.f, g_mod, "spin"));
    return k;
}

static CUresult launch(struct kern k, CUstream s)
{
    void *args[] = {&k.ns};
    return cuLaunchKernel(k.f, 1, 1, 1, 32, 1, 1, 0, s, args, NULL);
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
    struct kern f = kernel(us);
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
    uint64_t rec[3][2];
    for (int i = 0; i < 3; i++) {
        CK(launch(f, s));
        rec[i][0] = now_ns();
        CK(i == 1 ? cuEventRecordWithFlags(e[i], s, 0) : cuEventRecord(e[i], s));
        rec[i][1] = now_ns();
    }
    CK(cuEventRecord(untimed, s));
    float ms;
    CUresult pending = cuEventElapsedTime(&ms, idle, e[2]);
    CUresult untimed_rc = cuEventElapsedTime(&ms, idle, untimed);
    CUresult unrecorded_rc = cuEventElapsedTime(&ms, unrecorded, idle);
    CUresult query_pending = cuEventQuery(e[2]);
    uint64_t pending_asked = now_ns(); /* both asked before then: pending if e[2] ended later */

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
    printf("{\"pid\": %d, \"recorded\": [[%" PRIu64 ", %" PRIu64 "], [%" PRIu64 ", %" PRIu64 "], [%" PRIu64
           ", %" PRIu64 "]], ",
           (int)getpid(), rec[0][0], rec[0][1], rec[1][0], rec[1][1], rec[2][0], rec[2][1]);
    printf("\"record_idle\": [%" PRIu64 ", %" PRIu64 "], \"idle_to\": [%.6f, %.6f, %.6f], "
           "\"between\": [%.6f, %.6f], \"back\": %.6f, \"first_last_not_ready\": %" PRIu64
           ", \"first_ready\": %" PRIu64 ", \"pending\": \"%s\", \"untimed\": \"%s\", \"untimed_done\": \"%s\", "
           "\"unrecorded\": \"%s\", \"query_pending\": \"%s\", \"pending_asked\": %" PRIu64 "}\n",
           rec0, rec1, elapsed(idle, e[0]), elapsed(idle, e[1]), elapsed(idle, e[2]),
           elapsed(e[0], e[1]), elapsed(e[1], e[2]), elapsed(e[2], e[0]), last_not_ready, first_ready,
           rname(pending), rname(untimed_rc), rname(untimed_done), rname(unrecorded_rc), rname(query_pending),
           pending_asked);
    return 0;
}

/* ---- wake ---- */
/* N times: one kernel of US us on an idle stream, then the sync KIND waits for it;
 * the times the syncs returned (the test finds the kernels' ends on the timeline). */
static int cmd_wake(const char *kind, unsigned long n, unsigned long us)
{
    setup();
    struct kern f = kernel(us);
    CUstream s;
    CUevent e;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    int blocking = !strcmp(kind, "event-blocking");
    if (!blocking && strcmp(kind, "event-spin") && strcmp(kind, "stream") && strcmp(kind, "ctx"))
        die("wake: unknown sync \"%s\"", kind);
    CK(cuEventCreate(&e, blocking ? CU_EVENT_BLOCKING_SYNC : CU_EVENT_DEFAULT));
    uint64_t *ret = calloc(n, sizeof(*ret)), *called = calloc(n, sizeof(*called));
    if (!ret || !called)
        die("out of memory");
    for (unsigned long i = 0; i < n; i++) {
        CK(launch(f, s));
        if (!strncmp(kind, "event", 5))
            CK(cuEventRecord(e, s));
        called[i] = now_ns();
        if (!strncmp(kind, "event", 5)) {
            CK(cuEventSynchronize(e));
        } else if (!strcmp(kind, "stream")) {
            CK(cuStreamSynchronize(s));
        } else {
            CK(cuCtxSynchronize());
        }
        ret[i] = now_ns();
    }
    printf("{\"pid\": %d, \"called\": [", (int)getpid());
    for (unsigned long i = 0; i < n; i++)
        printf("%s%" PRIu64, i ? ", " : "", called[i]);
    printf("], \"returned\": [");
    for (unsigned long i = 0; i < n; i++)
        printf("%s%" PRIu64, i ? ", " : "", ret[i]);
    printf("]}\n");
    free(ret);
    free(called);
    return 0;
}

/* ---- sleep ---- */
/* The host's own lateness after a timed sleep: the baseline the wake tests hold a sync's
 * return to (a loaded or slow host wakes every sleeper late, simgpu or not). */
static int cmd_sleep(unsigned long n, unsigned long us)
{
    printf("{\"late\": [");
    for (unsigned long i = 0; i < n; i++) {
        uint64_t t = now_ns() + (uint64_t)us * 1000u;
        struct timespec ts = {.tv_sec = (time_t)(t / 1000000000u), .tv_nsec = (long)(t % 1000000000u)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
            ;
        printf("%s%" PRIu64, i ? ", " : "", now_ns() - t);
    }
    printf("]}\n");
    return 0;
}

/* ---- capture ---- */
/* Another thread: sets its capture mode, makes one call, answers what it returned. */
enum call { Q_EVENT, SYNC_EVENT, Q_STREAM, SYNC_STREAM, SYNC_CTX, END_CAPTURE };
static const char *const CALLS[] = {"cuEventQuery", "cuEventSynchronize", "cuStreamQuery",
                                    "cuStreamSynchronize", "cuCtxSynchronize", "cuStreamEndCapture"};
struct other {
    CUcontext ctx;
    int mode;
    enum call call;
    CUevent e;
    CUstream s;
    CUresult rc;
};

static void *other_thread(void *arg)
{
    struct other *o = arg;
    CK(cuCtxSetCurrent(o->ctx));
    CUstreamCaptureMode m = o->mode;
    CK(cuThreadExchangeStreamCaptureMode(&m));
    CUgraph g;
    switch (o->call) {
    case Q_EVENT: o->rc = cuEventQuery(o->e); break;
    case SYNC_EVENT: o->rc = cuEventSynchronize(o->e); break;
    case Q_STREAM: o->rc = cuStreamQuery(o->s); break;
    case SYNC_STREAM: o->rc = cuStreamSynchronize(o->s); break;
    case SYNC_CTX: o->rc = cuCtxSynchronize(); break;
    case END_CAPTURE: o->rc = cuStreamEndCapture(o->s, &g); break;
    }
    return NULL;
}

static CUresult in_other_thread(int mode, enum call call, CUevent e, CUstream s)
{
    struct other o = {.mode = mode, .call = call, .e = e, .s = s};
    CK(cuCtxGetCurrent(&o.ctx));
    pthread_t th;
    if (pthread_create(&th, NULL, other_thread, &o) != 0)
        die("pthread_create");
    pthread_join(th, NULL);
    return o.rc;
}

static const char *const MODES[] = {"global", "thread_local", "relaxed"};
static struct kern g_k;
static CUstream g_cs, g_other_s;
static CUevent g_other_e;
static int g_nout;

/* One capture on g_cs in cap_mode (this thread, in its own mode self_mode); during it,
 * another thread in mode other_mode makes call on its own stream and event (or on the
 * capturing stream / an event recorded into the capture, with on_capture), or this thread
 * does (by_self). Prints what the call, a launch into the capture after it,
 * cuStreamIsCapturing and cuStreamEndCapture answered. */
static void scenario(const char *name, int cap_mode, int self_mode, int other_mode, enum call call,
                     int on_capture, int by_self)
{
    CUstreamCaptureMode m = self_mode;
    CK(cuThreadExchangeStreamCaptureMode(&m));
    CUevent captured;
    CK(cuEventCreate(&captured, CU_EVENT_DEFAULT));
    CK(cuStreamBeginCapture_v2(g_cs, cap_mode));
    CK(launch(g_k, g_cs));
    CK(cuEventRecord(captured, g_cs));
    CUevent e = on_capture ? captured : g_other_e;
    CUstream s = on_capture ? g_cs : g_other_s;
    CUresult rc;
    if (by_self) {
        switch (call) {
        case Q_EVENT: rc = cuEventQuery(e); break;
        case SYNC_EVENT: rc = cuEventSynchronize(e); break;
        case Q_STREAM: rc = cuStreamQuery(s); break;
        case SYNC_STREAM: rc = cuStreamSynchronize(s); break;
        case SYNC_CTX: rc = cuCtxSynchronize(); break;
        default: rc = CUDA_ERROR_UNKNOWN;
        }
    } else {
        rc = in_other_thread(other_mode, call, e, s);
    }
    CUresult after = launch(g_k, g_cs);
    CUstreamCaptureStatus st;
    CK(cuStreamIsCapturing(g_cs, &st));
    CUgraph g = (CUgraph)&g;
    CUresult end = cuStreamEndCapture(g_cs, &g);
    if (end == CUDA_SUCCESS)
        CK(cuGraphDestroy(g));
    CK(cuEventDestroy_v2(captured));
    m = CU_STREAM_CAPTURE_MODE_GLOBAL;
    CK(cuThreadExchangeStreamCaptureMode(&m));
    printf("%s\"%s\": {\"capture\": \"%s\", \"self\": \"%s\", \"other\": \"%s\", \"call\": \"%s\", "
           "\"rc\": \"%s\", \"launch_after\": \"%s\", \"status\": %d, \"end\": \"%s\", \"graph\": %s}",
           g_nout++ ? ", " : "", name, MODES[cap_mode], MODES[self_mode], by_self ? "-" : MODES[other_mode],
           CALLS[call], rname(rc), rname(after), (int)st, rname(end),
           end == CUDA_SUCCESS ? "true" : g ? "\"set\"" : "false");
    fflush(stdout);
}

static int cmd_capture(void)
{
    setup();
    g_k = kernel(100);
    CK(cuStreamCreate(&g_cs, CU_STREAM_NON_BLOCKING));
    CK(cuStreamCreate(&g_other_s, CU_STREAM_NON_BLOCKING));
    CK(cuEventCreate(&g_other_e, CU_EVENT_DEFAULT));
    CK(launch(g_k, g_other_s));
    CK(cuEventRecord(g_other_e, g_other_s));
    const int G = CU_STREAM_CAPTURE_MODE_GLOBAL, T = CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
              R = CU_STREAM_CAPTURE_MODE_RELAXED;
    printf("{");
    /* another thread's unsafe calls during a global capture */
    scenario("global/query_event", G, G, G, Q_EVENT, 0, 0);
    scenario("global/sync_event", G, G, G, SYNC_EVENT, 0, 0);
    scenario("global/query_stream", G, G, G, Q_STREAM, 0, 0);
    scenario("global/sync_stream", G, G, G, SYNC_STREAM, 0, 0);
    scenario("global/sync_ctx", G, G, G, SYNC_CTX, 0, 0);
    /* ... by a thread that is not in global mode */
    scenario("global/thread_local_query", G, G, T, Q_EVENT, 0, 0);
    scenario("global/relaxed_query", G, G, R, Q_EVENT, 0, 0);
    scenario("global/relaxed_sync_stream", G, G, R, SYNC_STREAM, 0, 0);
    /* captures that are not global leave other threads alone */
    scenario("thread_local/query_event", T, G, G, Q_EVENT, 0, 0);
    scenario("relaxed/query_event", R, G, G, Q_EVENT, 0, 0);
    /* the capturing thread's own calls */
    scenario("self/global", G, G, 0, Q_EVENT, 0, 1);
    scenario("self/thread_local", T, G, 0, Q_EVENT, 0, 1);
    scenario("self/relaxed_capture", R, G, 0, Q_EVENT, 0, 1);
    scenario("self/relaxed_thread", G, R, 0, Q_EVENT, 0, 1);
    /* calls that conflict whatever the modes */
    scenario("conflict/query_capturing_stream", R, G, R, Q_STREAM, 1, 0);
    scenario("conflict/query_captured_event", R, G, R, Q_EVENT, 1, 0);
    scenario("conflict/sync_ctx", R, G, R, SYNC_CTX, 0, 0);
    scenario("conflict/sync_capturing_stream", G, G, 0, SYNC_STREAM, 1, 1);
    /* a global capture ends only on its own thread */
    scenario("end/other_thread", G, G, G, END_CAPTURE, 1, 0);
    scenario("end/other_thread_relaxed", R, G, G, END_CAPTURE, 1, 0);

    CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    CUresult x1 = cuThreadExchangeStreamCaptureMode(&m);
    int prev1 = m;
    m = CU_STREAM_CAPTURE_MODE_GLOBAL;
    CUresult x2 = cuThreadExchangeStreamCaptureMode(&m);
    int prev2 = m;
    /* simgpu refuses these; a real driver is not asked (NULL crashed an H200's). */
    CUfunction probe_f;
    int sim = cuModuleGetFunction(&probe_f, g_mod, "busy_1us") == CUDA_SUCCESS;
    m = 7;
    CUresult bad = sim ? cuThreadExchangeStreamCaptureMode(&m) : CUDA_ERROR_NOT_SUPPORTED;
    CUresult null = sim ? cuThreadExchangeStreamCaptureMode(NULL) : CUDA_ERROR_NOT_SUPPORTED;
    printf(", \"exchange\": [\"%s\", %d, \"%s\", %d], \"exchange_bad\": \"%s\", \"exchange_null\": \"%s\"}\n",
           rname(x1), prev1, rname(x2), prev2, rname(bad), rname(null));
    return 0;
}

/* ---- streams ---- */
/* N kernels of US us on each of two streams, launched in turn, then a context sync. */
static int cmd_streams(unsigned long n, unsigned long us)
{
    setup();
    struct kern f = kernel(us);
    CUstream s[2];
    for (int i = 0; i < 2; i++)
        CK(cuStreamCreate(&s[i], CU_STREAM_NON_BLOCKING));
    uint64_t t0 = now_ns();
    for (unsigned long i = 0; i < 2 * n; i++)
        CK(launch(f, s[i % 2]));
    CK(cuCtxSynchronize());
    uint64_t t1 = now_ns();
    printf("{\"pid\": %d, \"launched\": %" PRIu64 ", \"synced\": %" PRIu64 "}\n", (int)getpid(), t0, t1);
    return 0;
}

/* A kernel of US1 us on one stream, an event after it; on another stream a wait for
 * that event (unless "nowait") and a kernel of US2 us. */
static int cmd_stream_wait(unsigned long us1, unsigned long us2, int wait)
{
    setup();
    CUstream s1, s2;
    CUevent e;
    CK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    CK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    CK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    CK(launch(kernel(us1), s1));
    CK(cuEventRecord(e, s1));
    if (wait)
        CK(cuStreamWaitEvent(s2, e, 0));
    CK(launch(kernel(us2), s2));
    CK(cuStreamSynchronize(s2));
    uint64_t t = now_ns();
    CK(cuStreamSynchronize(s1));
    printf("{\"pid\": %d, \"s2_synced\": %" PRIu64 "}\n", (int)getpid(), t);
    return 0;
}

/* ---- hammer, engine ---- */
/* Launches, records, queries and syncs on two streams until killed. */
static int cmd_hammer(void)
{
    setup();
    struct kern f = kernel(5);
    CUstream s[2];
    CUevent e[4];
    for (int i = 0; i < 2; i++)
        CK(cuStreamCreate(&s[i], CU_STREAM_NON_BLOCKING));
    for (int i = 0; i < 4; i++)
        CK(cuEventCreate(&e[i], CU_EVENT_DEFAULT));
    printf("{\"pid\": %d}\n", (int)getpid());
    fflush(stdout);
    for (unsigned long i = 0;; i++) {
        CK(launch(f, s[i % 2]));
        CK(cuEventRecord(e[i % 4], s[i % 2]));
        CUresult r = cuEventQuery(e[(i + 1) % 4]);
        if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_READY)
            die("cuEventQuery: %s", rname(r));
        r = cuStreamQuery(s[0]);
        if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_READY)
            die("cuStreamQuery: %s", rname(r));
        if (i % 64 == 63)
            CK(cuCtxSynchronize());
    }
    return 0;
}

/* What the timed engine of device DEV holds (read-only, from the state file). */
static int cmd_engine(const char *path, unsigned long dev)
{
    int fd = open(path, O_RDONLY);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0 || (size_t)sb.st_size < sizeof(struct simgpu_state))
        die("%s: not a simgpu state file", path);
    const struct simgpu_state *st = mmap(NULL, sizeof(*st), PROT_READ, MAP_SHARED, fd, 0);
    if (st == MAP_FAILED || st->magic != SIMGPU_MAGIC || dev >= st->ndev)
        die("%s: not a simgpu state file with device %lu", path, dev);
    const struct simgpu_engine *E = &st->eng[dev];
    const struct simgpu_cursor *c = &E->c[atomic_load(&E->cur) & 1];
    unsigned n[3] = {0}, queues = 0, waiting = 0;
    for (unsigned i = 0; i < SIMGPU_ENTRIES; i++)
        n[atomic_load(&E->e[i].state) % 3]++;
    for (unsigned k = 0; k < c->nq && k < SIMGPU_QUEUES; k++) {
        queues += c->q[k].used != 0;
        waiting += c->q[k].used != 0 && c->q[k].head != SIMGPU_NIL;
    }
    printf("{\"timed\": %u, \"repairs\": %u, \"free\": %u, \"queued\": %u, \"done\": %u, \"queues\": %u, "
           "\"queues_with_work\": %u}\n",
           st->cfg.timed, atomic_load(&E->repairs), n[0], n[1], n[2], queues, waiting);
    return 0;
}

static void usage(void)
{
    fprintf(stderr, "usage: simgpu_probe events US | wake stream|ctx|event-blocking|event-spin N US | sleep N US |\n"
                    "       capture |\n"
                    "       streams N US | stream-wait US1 US2 [nowait] | hammer | engine STATE DEV\n");
    exit(2);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        usage();
    const char *cmd = argv[1];
    if (!strcmp(cmd, "events") && argc == 3)
        return cmd_events(parse_ul(argv[2], "US"));
    if (!strcmp(cmd, "streams") && argc == 4)
        return cmd_streams(parse_ul(argv[2], "N"), parse_ul(argv[3], "US"));
    if (!strcmp(cmd, "stream-wait") && (argc == 4 || (argc == 5 && !strcmp(argv[4], "nowait"))))
        return cmd_stream_wait(parse_ul(argv[2], "US1"), parse_ul(argv[3], "US2"), argc == 4);
    if (!strcmp(cmd, "hammer") && argc == 2)
        return cmd_hammer();
    if (!strcmp(cmd, "engine") && argc == 4)
        return cmd_engine(argv[2], parse_ul(argv[3], "DEV"));
    if (!strcmp(cmd, "capture") && argc == 2)
        return cmd_capture();
    if (!strcmp(cmd, "sleep") && argc == 4)
        return cmd_sleep(parse_ul(argv[2], "N"), parse_ul(argv[3], "US"));
    if (!strcmp(cmd, "wake") && argc == 5)
        return cmd_wake(argv[2], parse_ul(argv[3], "N"), parse_ul(argv[4], "US"));
    usage();
    return 2;
}
