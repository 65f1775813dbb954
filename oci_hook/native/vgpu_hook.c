/* SPDX-License-Identifier: Apache-2.0 */
/* vgpu-hook: the OCI hook of containers that ask for a vGPU.
 *
 *     vgpu-hook prestart|createRuntime|poststop   (the OCI state on stdin)
 *     vgpu-hook claim SLICE_ID                    (the same; a CDI spec's createRuntime hook)
 *     vgpu-hook createRuntime|poststop KEY=VALUE... (the device plugin's CDI devices)
 *
 * prestart / createRuntime: vgpud decides (the request, the slice, the mount plan);
 * this program enters the container's mount namespace and applies the plan
 * (vg_mount.c). A mount failure gives the slice back; the engine shows our one line.
 * poststop (or a state whose status is "stopped": hooks.d runs one command for every
 * stage): vgpud releases the slice; if vgpud is away, its reconciler will.
 * A container that asks for nothing (vg_spec.h: config.json and the state's
 * annotations) exits 0 at once, without vgpud.
 * claim: the engine applied a DRA claim's CDI spec (oci_hook/cdi.py: the slice's files);
 * vgpud checks the slice is a claim's, records the container as its user and answers
 * what the spec could not do (the ld.so.preload, which depends on the image); a failure
 * is one line, with nothing left mounted and nothing released (the claim holds the slice).
 * KEY=VALUE arguments: the request keys of a device plugin's CDI device (oci_hook/request.py
 * hook_keys: vgpud reads them from config.json's hooks, where only the engine writes). Such
 * a hook is the container's even when no annotation asks (containerd passes none through
 * without a runtime handler); the one that carries no vgpu.io/memory (the compute device's)
 * only carries its keys and exits 0, so the container is served once. */
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
#define USAGE "usage: vgpu-hook prestart|createRuntime|poststop [vgpu.io/KEY=VALUE...] | " \
              "claim SLICE_ID  (the OCI state on stdin)"
#define MEMORY_ARG "vgpu.io/memory="
#define STATE_MAX (1u << 20)
#define RELEASE_TIMEOUT_MS 2000   /* vgpud just answered; this only bounds a hang */

/* Could this container have a vGPU (ask for one, or hold one: vgpu.io/slice)? The
 * state's annotations, then the bundle's config.json; whatever cannot be read may. */
static int may_ask(const struct vg_spec *state)
{
    if (state->asks || state->malformed)
        return state->asks;
    struct vg_spec spec;
    return state->bundle[0] != '/' || vg_spec_scan_bundle(state->bundle, &spec) != 0 ||
           spec.asks;
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
             vg_plan_open_sources(&plan, err, errsz) == 0 &&
             vg_enter_mount_ns(pid, err, errsz) == 0 && vg_plan_apply(&plan, err, errsz) == 0;
    vg_plan_free(&plan);
    if (!ok && home >= 0)
        setns(home, CLONE_NEWNS);
    if (home >= 0)
        close(home);
    return ok ? 0 : -1;
}

/* vgpud answered prestart (or poststop: `post`); 0 when the container may go on. */
static int answered(const struct vg_msg *reply, const char *sock, int post, const char *state,
                    size_t state_len)
{
    char why[VG_WHY_MAX], line[VG_ERR_MAX];
    const char *status = vg_msg_get(reply, "status");
    const char *id = vg_msg_get(reply, "id"), *pid = vg_msg_get(reply, "pid");
    if (status && strcmp(status, "ok") == 0)
        return 0;
    if (!post && status && strcmp(status, "mount") == 0 && id && pid && atoi(pid) > 0) {
        if (mount_plan(reply, atoi(pid), why, sizeof(why)) == 0)
            return 0;
        release(sock, id, state, state_len);
        snprintf(line, sizeof(line), "failed to set up the vGPU mounts: %s", why);
        vg_say(line);
        return 1;
    }
    if (!post && id != NULL && !(status && strcmp(status, "error") == 0))
        release(sock, id, state, state_len);   /* an answer we do not know: undo it */
    vg_reply_line(reply, sock, post ? "poststop" : "prestart",
                  post ? "release the vGPU slice" : "allocate a vGPU", line, sizeof(line));
    vg_say(line);
    return 1;
}

/* vgpud answered claim-prestart: mount the plan; 0 when the container may go on. */
static int claim_answered(const struct vg_msg *reply, const char *sock)
{
    char why[VG_WHY_MAX], line[VG_ERR_MAX];
    const char *status = vg_msg_get(reply, "status"), *pid = vg_msg_get(reply, "pid");
    if (status && strcmp(status, "mount") == 0 && pid && atoi(pid) > 0) {
        if (mount_plan(reply, atoi(pid), why, sizeof(why)) == 0)
            return 0;
        snprintf(line, sizeof(line), "failed to set up the vGPU mounts: %s", why);
        vg_say(line);
        return 1;
    }
    vg_reply_line(reply, sock, "claim-prestart", "use the claim's vGPU slice", line,
                  sizeof(line));
    vg_say(line);
    return 1;
}

static int usage(void)
{
    fprintf(stderr, "%s\n", USAGE);
    return 2;
}

/* Request keys as arguments (argv[2..], each vgpu.io/KEY=VALUE): -1 when one is not; else
 * whether one of them is the memory (the hook that serves the container). */
static int keys_serve(int argc, char **argv)
{
    int memory = 0;
    for (int i = 2; i < argc; i++) {
        if (strncmp(argv[i], "vgpu.io/", 8) != 0 || strchr(argv[i], '=') == NULL)
            return -1;
        memory |= strncmp(argv[i], MEMORY_ARG, strlen(MEMORY_ARG)) == 0;
    }
    return memory;
}

int main(int argc, char **argv)
{
    int claim = argc == 3 && strcmp(argv[1], "claim") == 0 && argv[2][0] != '\0';
    int keyed = !claim && argc > 2;
    int serve = keyed ? keys_serve(argc, argv) : 0;
    if (!claim && (argc < 2 || serve < 0 ||
                   (strcmp(argv[1], "prestart") != 0 && strcmp(argv[1], "createRuntime") != 0 &&
                    strcmp(argv[1], "poststop") != 0) ||
                   (keyed && strcmp(argv[1], "prestart") == 0)))
        return usage();
    if (keyed && !serve)
        return 0;   /* the compute device's keys: the memory device's hook reads them */
    const char *phase = argv[1];
    size_t state_len;
    char *state = vg_read_fd(STDIN_FILENO, STATE_MAX, &state_len);
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
    if (!claim && !keyed && !may_ask(&facts))
        return 0;
    struct vg_config cfg = {0};
    char sock[VG_PATH_MAX], err[VG_ERR_MAX];
    int wait_ms;
    if (vg_config_load(&cfg, err, sizeof(err)) != 0 ||
        vg_config_wait_ms(&cfg, &wait_ms, err, sizeof(err)) != 0 ||
        vg_lifecycle_path(&cfg, sock, sizeof(sock), err, sizeof(err)) != 0) {
        vg_say(err);
        return 1;
    }
    vg_config_free(&cfg);
    /* hooks.d runs one command line for every stage: a stopped container is poststop. */
    int post = !claim && (strcmp(phase, "poststop") == 0 || strcmp(facts.status, "stopped") == 0);
    struct vg_msg req = {0}, reply = {0};
    char why[VG_WHY_MAX], line[VG_ERR_MAX];
    int r = VG_CALL_FAILED, rc = 1;
    snprintf(why, sizeof(why), "out of memory");
    if (claim) {
        if (!vg_msg_start(&req, "claim-prestart") && !vg_msg_add(&req, "slice", argv[2]) &&
            !vg_msg_addn(&req, "state", state, state_len))
            r = vg_call(sock, CLIENT, &req, &reply, wait_ms, why, sizeof(why));
    } else if (!vg_msg_start(&req, post ? "poststop" : "prestart") &&
               (post || !vg_msg_add(&req, "phase", phase)) &&
               !vg_msg_addn(&req, "state", state, state_len)) {
        r = vg_call(sock, CLIENT, &req, &reply, wait_ms, why, sizeof(why));
    }
    if (r == 0) {
        rc = claim ? claim_answered(&reply, sock) : answered(&reply, sock, post, state, state_len);
    } else if (r == VG_CALL_VERSION) {
        vg_say(why);
    } else if (post) {
        /* Not an error for the container: vgpud's reconciler frees slices of dead ones. */
        snprintf(line, sizeof(line), "failed to release the vGPU slice of %s: %s; the "
                 "reconciler will release it", facts.id[0] ? facts.id : "the container", why);
        vg_say(line);
        rc = 0;
    } else {
        snprintf(line, sizeof(line), "failed to %s: %s",
                 claim ? "use the claim's vGPU slice" : "allocate a vGPU", why);
        vg_say(line);
    }
    vg_msg_free(&req);
    vg_msg_free(&reply);
    free(state);
    return rc;
}
