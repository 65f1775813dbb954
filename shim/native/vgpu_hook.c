/* SPDX-License-Identifier: Apache-2.0 */
/* vgpu-hook: the OCI hook of containers that ask for a vGPU.
 *
 *     vgpu-hook prestart|createRuntime|poststop   (the OCI state on stdin)
 *
 * prestart / createRuntime: vgpud decides (the request, the slice, the mount plan);
 * this program enters the container's mount namespace and applies the plan
 * (vg_mount.c). A mount failure gives the slice back; the engine shows our one line.
 * poststop (or a state whose status is "stopped": hooks.d runs one command for every
 * stage): vgpud releases the slice; if vgpud is away, its reconciler will.
 * A container that asks for nothing (vg_spec.h: config.json and the state's
 * annotations) exits 0 at once, without vgpud. */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vg_common.h"
#include "vg_mount.h"
#include "vg_msg.h"
#include "vg_spec.h"

#define CLIENT "vgpu-hook"
#define USAGE "usage: vgpu-hook prestart|createRuntime|poststop  (the OCI state on stdin)"
#define STATE_MAX (1u << 20)
#define SPEC_MAX (64u << 20)
#define RELEASE_TIMEOUT_MS 2000   /* vgpud just answered; this only bounds a hang */

/* The whole of stdin (up to STATE_MAX), or NULL. */
static char *read_stdin(size_t *len)
{
    size_t cap = 4096;
    char *buf = malloc(cap);
    *len = 0;
    while (buf) {
        if (*len == cap) {
            if (cap >= STATE_MAX) {
                errno = EFBIG;
                break;
            }
            char *more = realloc(buf, cap * 2);
            if (more == NULL)
                break;
            buf = more;
            cap *= 2;
        }
        ssize_t r = read(STDIN_FILENO, buf + *len, cap - *len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            break;
        if (r == 0)
            return buf;
        *len += (size_t)r;
    }
    free(buf);
    return NULL;
}

/* Could this container have a vGPU (ask for one, or hold one: vgpu.io/slice)? The
 * state's annotations, then the bundle's config.json; whatever cannot be read may. */
static int may_ask(const struct vg_spec *state)
{
    if (state->asks || state->malformed)
        return state->asks;
    if (state->bundle[0] != '/')
        return 1;
    char path[VG_PATH_MAX + 16];
    size_t len;
    snprintf(path, sizeof(path), "%s/config.json", state->bundle);
    char *spec = vg_read_file(path, SPEC_MAX, &len);
    if (spec == NULL)
        return 1;
    struct vg_spec facts;
    vg_spec_scan(spec, len, &facts);
    free(spec);
    return facts.asks;
}

/* One line on stderr (no newline inside). */
static void say(const char *line)
{
    char copy[VG_ERR_MAX];
    vg_strlcpy(copy, line, sizeof(copy));
    for (char *p = copy; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
    fprintf(stderr, "%s%s\n", strncmp(copy, "vgpu: ", 6) == 0 ? "" : "vgpu: ", copy);
}

/* After a failed mount: vgpud releases the container's slice. The OCI state goes along:
 * the container names itself (init pid, bundle), so a slice that another container
 * with the same id holds stays with it. */
static void release(const char *sock, const char *id, const char *state, size_t state_len)
{
    struct vg_msg req = {0}, reply = {0};
    char ignored[VG_WHY_MAX];
    if (!vg_msg_start(&req, "release") && !vg_msg_add(&req, "id", id) &&
        !vg_msg_addn(&req, "state", state, state_len))
        vg_call(sock, CLIENT, &req, &reply, RELEASE_TIMEOUT_MS, ignored, sizeof(ignored));
    vg_msg_free(&req);
    vg_msg_free(&reply);
}

/* Enter the container's mount namespace and apply vgpud's plan; 0 or -1 with err. */
static int mount_plan(const struct vg_msg *reply, int pid, char *err, size_t errsz)
{
    struct vg_plan plan;
    /* Our own namespace, to go back to: the release must reach vgpud's socket. */
    int home = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
    int ok = vg_plan_parse(reply, &plan, err, errsz) == 0 &&
             vg_enter_mount_ns(pid, err, errsz) == 0 && vg_plan_apply(&plan, err, errsz) == 0;
    vg_plan_free(&plan);
    if (!ok && home >= 0)
        setns(home, CLONE_NEWNS);
    if (home >= 0)
        close(home);
    return ok ? 0 : -1;
}

static int poststop(const char *sock, int wait_ms, const struct vg_spec *facts,
                    const char *state, size_t state_len)
{
    struct vg_msg req = {0}, reply = {0};
    char why[VG_WHY_MAX], line[VG_ERR_MAX];
    int rc = 1;
    if (vg_msg_start(&req, "poststop") || vg_msg_addn(&req, "state", state, state_len)) {
        say("failed to release the vGPU slice: out of memory");
        goto out;
    }
    int r = vg_call(sock, CLIENT, &req, &reply, wait_ms, why, sizeof(why));
    if (r == VG_CALL_VERSION) {
        say(why);
    } else if (r != 0) {
        /* Not an error for the container: vgpud's reconciler frees slices of dead ones. */
        snprintf(line, sizeof(line), "failed to release the vGPU slice of %s: %s; the "
                 "reconciler will release it", facts->id[0] ? facts->id : "the container", why);
        say(line);
        rc = 0;
    } else {
        const char *status = vg_msg_get(&reply, "status"), *message;
        if (status && strcmp(status, "ok") == 0) {
            rc = 0;
        } else if (status && strcmp(status, "error") == 0) {
            message = vg_msg_get(&reply, "message");
            say(message && *message ? message : "vgpud failed to release the vGPU slice");
        } else {
            snprintf(line, sizeof(line), "failed to release the vGPU slice: vgpud at %s "
                     "answered poststop with status '%.32s'", sock, status ? status : "");
            say(line);
        }
    }
out:
    vg_msg_free(&req);
    vg_msg_free(&reply);
    return rc;
}

static int prestart(const char *sock, int wait_ms, const char *phase, const char *state,
                    size_t state_len)
{
    struct vg_msg req = {0}, reply = {0};
    char why[VG_WHY_MAX], line[VG_ERR_MAX];
    int rc = 1;
    if (vg_msg_start(&req, "prestart") || vg_msg_add(&req, "phase", phase) ||
        vg_msg_addn(&req, "state", state, state_len)) {
        say("failed to allocate a vGPU: out of memory");
        goto out;
    }
    int r = vg_call(sock, CLIENT, &req, &reply, wait_ms, why, sizeof(why));
    if (r != 0) {
        snprintf(line, sizeof(line), "%s%s", r == VG_CALL_VERSION ? "" :
                 "failed to allocate a vGPU: ", why);
        say(line);
        goto out;
    }
    const char *status = vg_msg_get(&reply, "status");
    const char *id = vg_msg_get(&reply, "id"), *pid = vg_msg_get(&reply, "pid");
    if (status && strcmp(status, "ok") == 0) {
        rc = 0;
    } else if (status && strcmp(status, "error") == 0) {
        const char *message = vg_msg_get(&reply, "message");
        say(message && *message ? message : "vgpud refused the container");
    } else if (status && strcmp(status, "mount") == 0 && id && pid && atoi(pid) > 0) {
        if (mount_plan(&reply, atoi(pid), why, sizeof(why)) == 0) {
            rc = 0;
        } else {
            release(sock, id, state, state_len);
            snprintf(line, sizeof(line), "failed to set up the vGPU mounts: %s", why);
            say(line);
        }
    } else {
        if (id != NULL)
            release(sock, id, state, state_len);
        snprintf(line, sizeof(line), "failed to allocate a vGPU: vgpud at %s answered "
                 "prestart with status '%.32s'", sock, status ? status : "");
        say(line);
    }
out:
    vg_msg_free(&req);
    vg_msg_free(&reply);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc != 2 || (strcmp(argv[1], "prestart") != 0 && strcmp(argv[1], "createRuntime") != 0 &&
                      strcmp(argv[1], "poststop") != 0)) {
        fprintf(stderr, "%s\n", USAGE);
        return 2;
    }
    const char *phase = argv[1];
    size_t state_len;
    char *state = read_stdin(&state_len);
    if (state == NULL) {
        fprintf(stderr, "vgpu: failed to read the OCI state on stdin: %s\n",
                errno == EFBIG ? "over 1 MiB" : strerror(errno));
        return 1;
    }
    if (memchr(state, '\0', state_len) != NULL) {
        fprintf(stderr, "vgpu: failed to read the OCI state on stdin: it holds a NUL byte\n");
        return 1;
    }
    struct vg_spec facts;
    vg_spec_scan(state, state_len, &facts);
    if (!may_ask(&facts))
        return 0;
    struct vg_config cfg = {0};
    char sock[VG_PATH_MAX], err[VG_ERR_MAX];
    int wait_ms;
    if (vg_config_load(&cfg, err, sizeof(err)) != 0 ||
        vg_config_wait_ms(&cfg, &wait_ms, err, sizeof(err)) != 0 ||
        vg_lifecycle_path(&cfg, sock, sizeof(sock), err, sizeof(err)) != 0) {
        say(err);
        return 1;
    }
    vg_config_free(&cfg);
    if (strcmp(phase, "poststop") == 0 || strcmp(facts.status, "stopped") == 0)
        return poststop(sock, wait_ms, &facts, state, state_len);
    return prestart(sock, wait_ms, phase, state, state_len);
}
