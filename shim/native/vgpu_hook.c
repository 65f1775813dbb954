/* SPDX-License-Identifier: Apache-2.0 */
/* vgpu-hook, compiled: the fast path of oci_hook/main.py.
 *
 *     vgpu-hook prestart|createRuntime|poststop   (the OCI state on stdin)
 *
 * vgpud's lifecycle socket decides (the request, the slice, the mount plan; poststop
 * releases); for prestart this program then enters the container's mount namespace
 * and applies the plan (vg_mount.c). A mount failure gives the slice back and prints
 * the one line the engine shows. When vgpud cannot be asked (no lifecycle socket, an
 * older vgpud) this execs `python -m oci_hook <phase>` with the same state, which
 * waits a bounded time for vgpud and is the complete implementation. */
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

#define USAGE "usage: vgpu-hook prestart|createRuntime|poststop  (the OCI state on stdin)"
#define STATE_MAX (1u << 20)
#define CALL_TIMEOUT_MS 10000       /* oci_hook.main's default wait, inside runc's timeout */
#define POSTSTOP_TIMEOUT_MS 5000
#define RELEASE_TIMEOUT_MS 2000

static char *state;
static size_t state_len;

static char *read_stdin(size_t *len)
{
    size_t cap = 4096;
    char *buf = malloc(cap);
    *len = 0;
    while (buf) {
        if (*len == cap) {
            if (cap >= STATE_MAX) {
                free(buf);
                return NULL;
            }
            char *more = realloc(buf, cap * 2);
            if (more == NULL) {
                free(buf);
                return NULL;
            }
            buf = more;
            cap *= 2;
        }
        ssize_t r = read(STDIN_FILENO, buf + *len, cap - *len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            free(buf);
            return NULL;
        }
        if (r == 0)
            return buf;
        *len += (size_t)r;
    }
    return NULL;
}

static void python(const char *phase)
{
    char *args[] = {(char *)phase};
    vg_exec_python("oci_hook", 1, args, state, state_len);
    exit(1);
}

static int base_request(struct vg_msg *m, const char *op)
{
    const char *sock = getenv("VGPU_SOCKET");
    return vg_msg_add(m, "v", VG_PROTOCOL_VERSION) || vg_msg_add(m, "op", op) ||
           vg_msg_add(m, "config", vg_config_path()) || vg_msg_add(m, "socket", sock ? sock : "");
}

/* After a failed mount: vgpud releases the container's slice. The OCI state goes along:
 * the container names itself (init pid, bundle), so a slice that another container
 * with the same id holds stays with it. */
static void release(const char *sock, const char *id)
{
    struct vg_msg req = {0}, reply = {0};
    char err[256];
    if (!base_request(&req, "release") && !vg_msg_add(&req, "id", id) &&
        !vg_msg_addn(&req, "state", state, state_len))
        vg_call(sock, &req, &reply, RELEASE_TIMEOUT_MS, err, sizeof(err));
    vg_msg_free(&req);
    vg_msg_free(&reply);
}

int main(int argc, char **argv)
{
    if (argc != 2 || (strcmp(argv[1], "prestart") != 0 && strcmp(argv[1], "createRuntime") != 0 &&
                      strcmp(argv[1], "poststop") != 0)) {
        fprintf(stderr, "%s\n", USAGE);
        return 2;
    }
    const char *phase = argv[1];
    int post = strcmp(phase, "poststop") == 0;
    state = read_stdin(&state_len);
    if (state == NULL) {
        fprintf(stderr, "vgpu: failed to read the OCI state on stdin: %s\n",
                errno ? strerror(errno) : "over 1 MiB");
        return 1;
    }
    char sock[VG_PATH_MAX], err[1024];
    if (memchr(state, '\0', state_len) != NULL || vg_lifecycle_path(sock, sizeof(sock)) != 0)
        python(phase);
    struct vg_msg req = {0}, reply = {0};
    if (base_request(&req, post ? "poststop" : "prestart") || vg_msg_add(&req, "phase", phase) ||
        vg_msg_addn(&req, "state", state, state_len))
        python(phase);
    int rc = vg_call(sock, &req, &reply, post ? POSTSTOP_TIMEOUT_MS : CALL_TIMEOUT_MS, err,
                     sizeof(err));
    vg_msg_free(&req);
    if (rc == VG_CALL_UNREACHABLE)
        python(phase);
    if (rc != 0) {
        if (post) {                 /* as the Python hook: vgpud down is not an error here */
            fprintf(stderr, "vgpu: failed to release the vGPU slice: %s; the reconciler will "
                    "release it\n", err);
            return 0;
        }
        fprintf(stderr, "vgpu: failed to allocate a vGPU: %s\n", err);
        return 1;
    }
    const char *v = vg_msg_get(&reply, "v"), *status = vg_msg_get(&reply, "status");
    if (v == NULL || strcmp(v, VG_PROTOCOL_VERSION) != 0 || status == NULL ||
        strcmp(status, "fallback") == 0)
        python(phase);
    if (strcmp(status, "ok") == 0)
        return 0;
    if (strcmp(status, "error") == 0) {
        const char *message = vg_msg_get(&reply, "message");
        fprintf(stderr, "%s\n", message ? message : "vgpu: vgpud refused the container");
        return 1;
    }
    const char *id = vg_msg_get(&reply, "id"), *pid = vg_msg_get(&reply, "pid");
    if (strcmp(status, "mount") != 0 || id == NULL || pid == NULL || atoi(pid) <= 0) {
        if (id != NULL)
            release(sock, id);
        python(phase);              /* an answer this program does not know */
    }
    struct vg_plan plan;
    /* Our own namespace, to go back to: the release must reach vgpud's socket. */
    int home = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
    int ok = vg_plan_parse(&reply, &plan, err, sizeof(err)) == 0 &&
             vg_enter_mount_ns(atoi(pid), err, sizeof(err)) == 0 &&
             vg_plan_apply(&plan, err, sizeof(err)) == 0;
    vg_plan_free(&plan);
    if (!ok) {
        if (home >= 0)
            setns(home, CLONE_NEWNS);
        release(sock, id);
        fprintf(stderr, "vgpu: failed to set up the vGPU mounts: %s\n", err);
        return 1;
    }
    return 0;
}
