/* SPDX-License-Identifier: Apache-2.0 */
/* vgpu-runtime: an OCI runtime in front of the lower one (runc by default).
 *
 * 1. Find the lower runtime (config runtime.lower, else runc on PATH, never this
 *    program nor containerd-shim-vgpu-v2's private bin dir).
 * 2. On create/run of a bundle whose config.json may ask for a vGPU (vg_spec.h),
 *    ask vgpud (op=runtime-create): it validates, allocates and edits config.json,
 *    or refuses with the one line we report. A spec that asks for nothing, and every
 *    other command, never waits for vgpud.
 * 3. Exec the lower runtime with argv untouched; if that fails, give the slice back.
 * Errors: one line on stderr and in runc's --log. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vg_common.h"
#include "vg_exec.h"
#include "vg_msg.h"
#include "vg_runc.h"
#include "vg_spec.h"

#define CLIENT "vgpu-runtime"
#define RELEASE_TIMEOUT_MS 5000   /* vgpud just answered; this only bounds a hang */

/* runtime.lower `auto`: NVIDIA's runtime where the toolkit is installed (it adds the
 * driver's libraries and the GPUs' nodes, which runc alone does not), else runc. */
#define LOWER_AUTO "auto"
static const char *const auto_lowers[] = {"nvidia-container-runtime", "runc", NULL};

/* containerd-shim-vgpu-v2's private dirs, which hold this program as `runc`: as it says
 * ($VGPU_SHIM_BIN), and where it is beside this program (build/bin/shim,
 * arbiter/native/bin/shim); resolved, "" where there is none. */
static void shim_dirs(char given[VG_PATH_MAX], char beside[VG_PATH_MAX])
{
    char dir[VG_PATH_MAX];
    const char *env = getenv("VGPU_SHIM_BIN");
    given[0] = beside[0] = '\0';
    if (env && *env && realpath(env, given) == NULL)
        given[0] = '\0';
    if (vg_self_dir(dir, sizeof(dir)) == 0) {
        char guess[VG_PATH_MAX + 16];
        snprintf(guess, sizeof(guess), "%s/%s", dir, VG_SHIM_BIN_DIR);
        if (realpath(guess, beside) == NULL)
            beside[0] = '\0';
    }
}

/* PATH without the shim's private dirs, for the lower runtime: a lower runtime that finds
 * runc on PATH itself (nvidia-container-runtime does) must find the real one, not this
 * program again. A failure leaves PATH as it was (the loop guard then says so). */
static void drop_shim_dirs(void)
{
    char given[VG_PATH_MAX], beside[VG_PATH_MAX];
    shim_dirs(given, beside);
    const char *old = getenv("PATH");
    if (old == NULL || (!given[0] && !beside[0]))
        return;
    char *copy = strdup(old), *out = malloc(strlen(old) + 1);
    if (copy == NULL || out == NULL) {
        free(copy);
        free(out);
        return;
    }
    out[0] = '\0';
    int first = 1;
    for (char *entry = copy, *next; entry; entry = next) {
        next = strchr(entry, ':');
        if (next)
            *next++ = '\0';
        char real[PATH_MAX];
        if (realpath(*entry ? entry : ".", real) != NULL &&
            ((given[0] && strcmp(real, given) == 0) || (beside[0] && strcmp(real, beside) == 0)))
            continue;
        if (!first)
            strcat(out, ":");
        strcat(out, entry);   /* as it was: an empty entry stays the cwd */
        first = 0;
    }
    setenv("PATH", out, 1);
    free(copy);
    free(out);
}

/* The lower runtime's absolute path; -1 with `err` set. */
static int find_lower(const struct vg_config *cfg, char *out, size_t n, char *err, size_t errsz)
{
    char name[VG_PATH_MAX] = VG_DEFAULT_LOWER;
    if (vg_config_get(cfg, "runtime", "lower", name, sizeof(name), err, errsz) < 0)
        return -1;
    int is_auto = strcmp(name, LOWER_AUTO) == 0;
    const char *why = NULL;
    if (strchr(name, '/')) {
        if (name[0] != '/')
            why = "a path must be absolute";
        else if (vg_is_self(name))
            why = "it is vgpu-runtime itself";
        else if (!vg_is_executable(name))
            why = "no such executable file";
        else
            vg_strlcpy(out, name, n);
    } else {
        char given[VG_PATH_MAX], beside[VG_PATH_MAX];
        shim_dirs(given, beside);
        const char *skip[] = {given, beside, NULL};
        if (!is_auto && vg_path_search(name, skip, out, n) != 0)
            why = "not found on PATH (set runtime.lower in the vgpu config to its absolute path)";
        for (int i = 0; is_auto && auto_lowers[i]; i++) {
            if (vg_path_search(auto_lowers[i], skip, out, n) == 0)
                break;
            if (auto_lowers[i + 1] == NULL)
                why = "neither nvidia-container-runtime nor runc is on PATH (set "
                      "runtime.lower in the vgpu config to an absolute path)";
        }
    }
    if (why == NULL)
        return 0;
    snprintf(err, errsz, "vgpu: failed to find the lower runtime '%s': %s", name, why);
    return -1;
}

/* Could the bundle's spec ask for a vGPU? An unreadable spec passes through: the
 * lower runtime reports it its own way. */
static int may_ask(const struct vg_runc_args *inv)
{
    struct vg_spec facts;
    return vg_spec_scan_bundle(inv->bundle, &facts) == 0 && facts.asks;
}

static int call(const char *sock, struct vg_msg *req, struct vg_msg *reply, int timeout_ms,
                char *err, size_t errsz)
{
    char why[VG_WHY_MAX];
    int rc = vg_call(sock, CLIENT, req, reply, timeout_ms, why, sizeof(why));
    if (rc == VG_CALL_VERSION)
        snprintf(err, errsz, "vgpu: %s", why);
    else if (rc != 0)
        snprintf(err, errsz, "vgpu: failed to allocate a vGPU: %s", why);
    return rc;
}

/* After a failed exec (or an answer we do not know): vgpud gives the slice back. The
 * bundle goes along, so a slice another bundle holds under the same id stays. */
static void release(const char *sock, const struct vg_runc_args *inv)
{
    struct vg_msg req = {0}, reply = {0};
    char ignored[VG_WHY_MAX];
    if (vg_msg_start(&req, "release") == 0 && vg_msg_add(&req, "id", inv->id) == 0 &&
        vg_msg_add(&req, "bundle", inv->bundle) == 0)
        vg_call(sock, CLIENT, &req, &reply, RELEASE_TIMEOUT_MS, ignored, sizeof(ignored));
    vg_msg_free(&req);
    vg_msg_free(&reply);
}

/* op=runtime-create; 0 when the container may start (with or without a vGPU). */
static int ask_vgpud(const struct vg_config *cfg, const struct vg_runc_args *inv, char *sock,
                     size_t socksz, char *err, size_t errsz)
{
    int wait_ms;
    if (vg_config_wait_ms(cfg, &wait_ms, err, errsz) != 0 ||
        vg_lifecycle_path(cfg, sock, socksz, err, errsz) != 0)
        return -1;
    struct vg_msg req = {0}, reply = {0};
    int rc = -1;
    if (vg_msg_start(&req, "runtime-create") || vg_msg_add(&req, "bundle", inv->bundle) ||
        vg_msg_add(&req, "id", inv->id)) {
        snprintf(err, errsz, "vgpu: failed to allocate a vGPU: out of memory");
        goto out;
    }
    if (call(sock, &req, &reply, wait_ms, err, errsz) != 0)
        goto out;
    const char *status = vg_msg_get(&reply, "status");
    if (status && strcmp(status, "ok") == 0) {
        rc = 0;
    } else {
        if (!(status && strcmp(status, "error") == 0))
            release(sock, inv);   /* an answer we do not know: undo it */
        vg_reply_line(&reply, sock, "runtime-create", "allocate a vGPU", err, errsz);
    }
out:
    vg_msg_free(&req);
    vg_msg_free(&reply);
    return rc;
}

int main(int argc, char **argv)
{
    struct vg_runc_args inv;
    struct vg_config cfg = {0};
    char err[VG_ERR_MAX], lower[VG_PATH_MAX], sock[VG_PATH_MAX] = "";
    vg_runc_parse(argc, argv, &inv);
    if (vg_config_load(&cfg, err, sizeof(err)) != 0 ||
        find_lower(&cfg, lower, sizeof(lower), err, sizeof(err)) != 0) {
        vg_runc_report(&inv, err);
        return 1;
    }
    int asked = vg_runc_creates(&inv) && may_ask(&inv);
    if (asked && ask_vgpud(&cfg, &inv, sock, sizeof(sock), err, sizeof(err)) != 0) {
        vg_runc_report(&inv, err);
        return 1;
    }
    vg_config_free(&cfg);
    char why[VG_WHY_MAX];
    drop_shim_dirs();
    vg_exec_guarded(lower, argv, why, sizeof(why));
    if (asked)
        release(sock, &inv);
    snprintf(err, sizeof(err), "vgpu: failed to run the lower runtime: %s", why);
    vg_runc_report(&inv, err);
    return 1;
}
