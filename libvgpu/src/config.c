/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config.c - decide what this process enforces, from the slice files and env.
 *
 * Precedence (DESIGN.md, libvgpu standalone configuration):
 *   /dev/vgpu0 present -> the arbiter's slice; env vars are ignored, because
 *                         an image can carry env the scheduler never saw;
 *   VGPU_REGION_DIR    -> region files shared by the processes naming it;
 *   VGPU_MEMORY_LIMIT* -> limits accounted in this process alone;
 *   nothing            -> inert.
 * A malformed value fails closed: never silently unlimited.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/vg_quantity.h"
#include "../include/vgpu_sched.h"
#include "vgpu_internal.h"

extern char **environ;

static void set_error(struct vg_config *cfg, CUresult result, const char *fmt, ...)
{
    if (cfg->error[0])
        return; /* the first problem is the one to report */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cfg->error, sizeof(cfg->error), fmt, ap);
    va_end(ap);
    cfg->error_result = result;
}

static void parse_limit(struct vg_config *cfg, const char *key, const char *value, uint64_t *out)
{
    if (vg_parse_quantity(value, out) != 0)
        set_error(cfg, CUDA_ERROR_INVALID_VALUE, "%s=\"%s\": not a memory quantity: use %s", key, value,
                  VG_QUANTITY_FORMS);
}

/* Every variable <prefix> (dev -1: all devices) and <prefix>_<i> (device i) goes
 * to parse(cfg, key, value, dev); any other suffix is an error. Returns 1 when any
 * is set. */
static int load_per_device(struct vg_config *cfg, const char *prefix,
                           void (*parse)(struct vg_config *, const char *key, const char *value, int dev))
{
    size_t plen = strlen(prefix);
    int any = 0;
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, prefix, plen) != 0)
            continue;
        const char *eq = strchr(*e, '=');
        if (!eq)
            continue;
        char key[128];
        snprintf(key, sizeof(key), "%.*s", (int)(eq - *e), *e);
        const char *rest = key + plen;
        const char *value = eq + 1;
        any = 1;
        if (*rest == '\0') {
            parse(cfg, key, value, -1);
            continue;
        }
        char *end = NULL;
        long idx = *rest == '_' && rest[1] >= '0' && rest[1] <= '9' ? strtol(rest + 1, &end, 10) : -1;
        if (idx < 0 || (end && *end) || idx >= VG_MAX_DEVICES) {
            set_error(cfg, CUDA_ERROR_INVALID_VALUE, "%s=\"%s\": unknown variable: use %s or %s_<device 0..%d>", key,
                      value, prefix, prefix, VG_MAX_DEVICES - 1);
            continue;
        }
        parse(cfg, key, value, (int)idx);
    }
    return any;
}

static void parse_memory_limit(struct vg_config *cfg, const char *key, const char *value, int dev)
{
    parse_limit(cfg, key, value, dev < 0 ? &cfg->limit_all : &cfg->limit_dev[dev]);
}

/* An integer percent 2..100. */
static void parse_compute_limit(struct vg_config *cfg, const char *key, const char *value, int dev)
{
    char *end = NULL;
    long pct = strtol(value, &end, 10);
    if (!*value || *end || pct < 2 || pct > 100)
        set_error(cfg, CUDA_ERROR_INVALID_VALUE, "%s=\"%s\": not a compute share: use an integer percent 2..100",
                  key, value);
    else
        *(dev < 0 ? &cfg->compute_all : &cfg->compute_dev[dev]) = (uint32_t)pct;
}

/* VGPU_MEMORY_LIMIT and VGPU_MEMORY_LIMIT_<i>; returns 1 when any is set. */
static int load_limits(struct vg_config *cfg)
{
    return load_per_device(cfg, "VGPU_MEMORY_LIMIT", parse_memory_limit);
}

/* VGPU_COMPUTE_LIMIT and VGPU_COMPUTE_LIMIT_<i>; returns 1 when any is set. */
static int load_compute(struct vg_config *cfg)
{
    return load_per_device(cfg, "VGPU_COMPUTE_LIMIT", parse_compute_limit);
}

/* One of `names` (index = value), or -1 when unset; a wrong word fails closed. */
static int load_word(struct vg_config *cfg, const char *key, const char *const *names, int n, const char *forms)
{
    const char *v = getenv(key);
    if (!v)
        return -1;
    for (int i = 0; i < n; i++)
        if (strcmp(v, names[i]) == 0)
            return i;
    set_error(cfg, CUDA_ERROR_INVALID_VALUE, "%s=\"%s\": unknown value: use %s", key, v, forms);
    return -1;
}

static int load_sched(struct vg_config *cfg)
{
    static const char *const priorities[] = {"low", "normal", "high"}; /* enum vgpu_priority */
    static const char *const policies[] = {"fixed", "burst"};          /* enum vgpu_policy */
    cfg->priority = load_word(cfg, "VGPU_PRIORITY", priorities, 3, "high, normal or low");
    cfg->policy = load_word(cfg, "VGPU_POLICY", policies, 2, "fixed or burst");
    cfg->floor = -1;
    const char *v = getenv("VGPU_PRIORITY_FLOOR");
    if (v) {
        char *end = NULL;
        long pct = strtol(v, &end, 10);
        if (!*v || *end || pct < 0 || pct > 100)
            set_error(cfg, CUDA_ERROR_INVALID_VALUE,
                      "VGPU_PRIORITY_FLOOR=\"%s\": not a floor: use an integer percent 0..100", v);
        else
            cfg->floor = (int)pct;
    }
    const char *dir = getenv(VGPU_ENV_SCHED_DIR);
    if (dir && *dir) {
        if (strlen(dir) >= sizeof(cfg->sched_dir) - 110)
            set_error(cfg, CUDA_ERROR_INVALID_VALUE, VGPU_ENV_SCHED_DIR "=\"%s\": path too long", dir);
        else
            snprintf(cfg->sched_dir, sizeof(cfg->sched_dir), "%s", dir);
    }
    return load_compute(cfg) || cfg->priority >= 0 || cfg->policy >= 0 || cfg->floor >= 0;
}

/* Where an arbiter-made slice finds its GPUs' scheduling regions: the hook
 * mounts them at /run/vgpu/sched in containers; on the host (vgpu run) the
 * slice dir is <run_dir>/slices/<id> and the regions are in <run_dir>/sched. */
static void arbiter_sched_dir(struct vg_config *cfg, const char *dev_dir)
{
    cfg->sched_from_arbiter = 1;
    if (strcmp(dev_dir, "/dev") == 0) {
        snprintf(cfg->sched_dir, sizeof(cfg->sched_dir), "%s", VGPU_SCHED_CONTAINER_DIR);
        return;
    }
    const char *dir = getenv(VGPU_ENV_SCHED_DIR);
    if (dir && *dir && strlen(dir) < sizeof(cfg->sched_dir) - 110)
        snprintf(cfg->sched_dir, sizeof(cfg->sched_dir), "%s", dir);
    else
        snprintf(cfg->sched_dir, sizeof(cfg->sched_dir), "%.140s/../../sched", dev_dir);
}

static void load_context_reserve(struct vg_config *cfg)
{
    const char *v = getenv("VGPU_CONTEXT_RESERVE");
    if (!v || strcmp(v, "0") == 0)
        return;
    parse_limit(cfg, "VGPU_CONTEXT_RESERVE", v, &cfg->context_reserve);
}

/* 1 when dir/vgpu0 is a region the arbiter made (flag in its header). */
static int arbiter_made(const char *dir)
{
    char path[300];
    struct {
        uint32_t magic, version, size, flags;
    } head;
    snprintf(path, sizeof(path), "%s/" VGPU_REGION_FILE_PREFIX "0", dir);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, &head, sizeof(head));
    close(fd);
    return n == (ssize_t)sizeof(head) && head.magic == VGPU_REGION_MAGIC && (head.flags & VGPU_REGION_FLAG_ARBITER);
}

static unsigned count_slice_files(const char *dir)
{
    unsigned n = 0;
    char path[300];
    for (; n < VG_MAX_DEVICES; n++) {
        snprintf(path, sizeof(path), "%s/" VGPU_REGION_FILE_PREFIX "%u", dir, n);
        if (access(path, F_OK) != 0)
            break;
    }
    return n;
}

void vg_config_load(struct vg_config *cfg, const char *dev_dir)
{
    memset(cfg, 0, sizeof(*cfg));
    unsigned slice = count_slice_files(dev_dir);
    if (slice > 0) {
        cfg->mode = VG_MODE_SLICE;
        cfg->slice_devices = slice;
        snprintf(cfg->region_dir, sizeof(cfg->region_dir), "%s", dev_dir);
        cfg->priority = cfg->policy = cfg->floor = -1;
        arbiter_sched_dir(cfg, dev_dir);
        return;
    }
    int limits = load_limits(cfg);
    load_context_reserve(cfg);
    int sched = load_sched(cfg);
    const char *dir = getenv(VGPU_ENV_REGION_DIR);
    if (dir && *dir) {
        struct stat sb;
        cfg->mode = VG_MODE_SHARED;
        if (strlen(dir) >= sizeof(cfg->region_dir) - 16)
            set_error(cfg, CUDA_ERROR_INVALID_VALUE, VGPU_ENV_REGION_DIR "=\"%s\": path too long", dir);
        /* Racing first processes may both mkdir: EEXIST is success. */
        else if (stat(dir, &sb) != 0 &&
                 (errno != ENOENT || (mkdir(dir, 0755) != 0 && errno != EEXIST) || stat(dir, &sb) != 0))
            set_error(cfg, CUDA_ERROR_OPERATING_SYSTEM, VGPU_ENV_REGION_DIR "=\"%s\": %s", dir, strerror(errno));
        else if (!S_ISDIR(sb.st_mode))
            set_error(cfg, CUDA_ERROR_OPERATING_SYSTEM, VGPU_ENV_REGION_DIR "=\"%s\": not a directory", dir);
        snprintf(cfg->region_dir, sizeof(cfg->region_dir), "%s", dir);
        /* A slice the arbiter made (vgpu run) is a slice: its files, nothing more. */
        if (!cfg->error[0] && arbiter_made(dir)) {
            cfg->mode = VG_MODE_SLICE;
            cfg->slice_devices = count_slice_files(dir);
            arbiter_sched_dir(cfg, cfg->region_dir);
        } else if (!cfg->sched_dir[0]) {
            /* The processes of one shared slice coordinate at least among themselves. */
            snprintf(cfg->sched_dir, sizeof(cfg->sched_dir), "%s", cfg->region_dir);
        }
    } else if (limits || sched || cfg->context_reserve || cfg->error[0]) {
        cfg->mode = VG_MODE_PRIVATE;
    }
}
