/* SPDX-License-Identifier: Apache-2.0 */
/* vgpu-runtime, compiled: the fast path of shim/runtime.py.
 *
 * - create/run of a bundle whose config.json could ask for a vGPU (the bytes hold
 *   "vgpu.io", "VGPU_" or a \u escape that could spell either): vgpud's lifecycle
 *   socket does what shim.runtime.give_vgpu does (validate, allocate, add hooks,
 *   nodes, env, flush config.json) and answers the lower runtime, which we exec
 *   with the original argv; its refusal is the one line we report.
 * - everything else passes through: runtime.lower of the config (read by a small
 *   scanner), found on PATH as shim/lower.py does, exec'd with argv untouched.
 * - whenever this cannot decide (no lifecycle socket, an older vgpud, a config form
 *   the scanner does not follow), exec `python -m shim`, the complete implementation. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "vg_common.h"
#include "vg_msg.h"

#define GUARD_ENV "VGPU_RUNTIME_EXEC_PID"
#define CALL_TIMEOUT_MS 10000       /* the config's default hook.wait_s */
#define RELEASE_TIMEOUT_MS 5000
#define SPEC_MAX (64u << 20)

struct inv {
    const char *command;
    const char *log;
    const char *log_format;
    const char *bundle_flag;
    const char *id;
    char bundle[VG_PATH_MAX];
};

static int in_list(const char *name, const char *const *list)
{
    for (; *list; list++)
        if (strcmp(name, *list) == 0)
            return 1;
    return 0;
}

/* `--name=value` -> name, value; `-n` -> n, NULL; not a flag -> 0 (shim/args.py). */
static int split_flag(const char *tok, char *name, size_t n, const char **value)
{
    *value = NULL;
    if (strlen(tok) < 2 || tok[0] != '-' || strcmp(tok, "--") == 0)
        return 0;
    const char *nm = tok[1] == '-' ? tok + 2 : tok + 1;
    if (*nm == '\0' || *nm == '-')
        return 0;
    const char *eq = strchr(nm, '=');
    size_t len = eq ? (size_t)(eq - nm) : strlen(nm);
    if (len >= n)
        len = n - 1;
    memcpy(name, nm, len);
    name[len] = '\0';
    if (eq)
        *value = eq + 1;
    return 1;
}

/* runc's command line, parsed as shim/args.py parse_argv does. */
static void parse_argv(int argc, char **argv, struct inv *inv)
{
    static const char *const global_valued[] = {"root", "log", "log-format", "criu",
                                                "rootless", "bundle", "b", NULL};
    static const char *const spec_valued[] = {"bundle", "b", "console-socket", "pid-file",
                                              "preserve-fds", NULL};
    memset(inv, 0, sizeof(*inv));
    char name[128];
    const char *value;
    int i = 1;
    while (i < argc) {
        const char *tok = argv[i];
        if (strcmp(tok, "--") == 0) {
            if (++i < argc)
                inv->command = argv[i++];
            break;
        }
        if (!split_flag(tok, name, sizeof(name), &value)) {
            inv->command = tok;
            i++;
            break;
        }
        if (value == NULL && in_list(name, global_valued) && i + 1 < argc)
            value = argv[++i];
        if (strcmp(name, "log") == 0)
            inv->log = value;
        else if (strcmp(name, "log-format") == 0)
            inv->log_format = value;
        else if (strcmp(name, "bundle") == 0 || strcmp(name, "b") == 0)
            inv->bundle_flag = value;
        i++;
    }
    if (inv->command == NULL ||
        (strcmp(inv->command, "create") != 0 && strcmp(inv->command, "run") != 0))
        return;
    while (i < argc) {
        const char *tok = argv[i];
        if (strcmp(tok, "--") == 0) {
            inv->id = i + 1 < argc ? argv[i + 1] : NULL;
            break;
        }
        if (!split_flag(tok, name, sizeof(name), &value)) {
            inv->id = tok;
            break;
        }
        if (value == NULL && in_list(name, spec_valued) && i + 1 < argc)
            value = argv[++i];
        if (strcmp(name, "bundle") == 0 || strcmp(name, "b") == 0)
            inv->bundle_flag = value;
        i++;
    }
    char cwd[VG_PATH_MAX];
    if (getcwd(cwd, sizeof(cwd)) == NULL)
        vg_strlcpy(cwd, "/", sizeof(cwd));
    const char *b = inv->bundle_flag;
    if (b == NULL || *b == '\0')
        vg_strlcpy(inv->bundle, cwd, sizeof(inv->bundle));
    else if (b[0] == '/')
        vg_strlcpy(inv->bundle, b, sizeof(inv->bundle));
    else if (snprintf(inv->bundle, sizeof(inv->bundle), "%s/%s", cwd, b) >=
             (int)sizeof(inv->bundle))
        inv->bundle[0] = '\0';   /* too long for a path: the lower runtime says so */
}

/* JSON string body of `s` (quotes, backslashes and control characters escaped). */
static void json_escape(FILE *f, const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
}

/* One line on stderr, and in runc's --log file in its --log-format: containerd's runc
 * shim (and so Docker) takes the runtime's error from there (shim/runtime.py report). */
static void report(const struct inv *inv, const char *message)
{
    char line[8192];
    const char *prefix = strncmp(message, "vgpu: ", 6) == 0 ? "" : "vgpu: ";
    snprintf(line, sizeof(line), "%s%s", prefix, message);
    for (char *p = line; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
    fprintf(stderr, "%s\n", line);
    if (inv->log == NULL || *inv->log == '\0')
        return;
    FILE *f = fopen(inv->log, "ae");
    if (f == NULL)
        return;
    char now[32];
    time_t t = time(NULL);
    struct tm tm;
    strftime(now, sizeof(now), "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tm));
    if (inv->log_format && strcmp(inv->log_format, "json") == 0) {
        fputs("{\"level\": \"error\", \"msg\": \"", f);
        json_escape(f, line);
        fprintf(f, "\", \"time\": \"%s\"}\n", now);
    } else {
        fprintf(f, "time=\"%s\" level=error msg=\"", now);
        json_escape(f, line);
        fputs("\"\n", f);
    }
    fclose(f);
}

static int same_file(const char *a, const struct stat *self)
{
    struct stat st;
    return stat(a, &st) == 0 && st.st_dev == self->st_dev && st.st_ino == self->st_ino;
}

static int is_exec_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* containerd-shim-vgpu-v2's private bin dir (its `runc` is vgpu-runtime): $VGPU_SHIM_BIN,
 * and shim/bin of this program's own installation (checkout: build/bin/../../shim/bin;
 * package: arbiter/native/bin/../../../shim/bin). Real paths, "" where absent. */
#define N_SKIP 3
static void shim_bin_dirs(char skip[N_SKIP][PATH_MAX])
{
    char exe[PATH_MAX], guess[PATH_MAX + 32];
    const char *env = getenv("VGPU_SHIM_BIN");
    for (int i = 0; i < N_SKIP; i++)
        skip[i][0] = '\0';
    if (env && *env && realpath(env, skip[0]) == NULL)
        skip[0][0] = '\0';
    if (realpath("/proc/self/exe", exe) == NULL)
        return;
    char *slash = strrchr(exe, '/');
    if (slash == NULL)
        return;
    *slash = '\0';
    snprintf(guess, sizeof(guess), "%s/../../shim/bin", exe);
    if (realpath(guess, skip[1]) == NULL)
        skip[1][0] = '\0';
    snprintf(guess, sizeof(guess), "%s/../../../shim/bin", exe);
    if (realpath(guess, skip[2]) == NULL)
        skip[2][0] = '\0';
}

/* The lower runtime's absolute path (shim/lower.py find_lower): a bare name is looked up
 * on PATH skipping containerd-shim-vgpu-v2's bin dir and this program. */
static int find_lower(const char *name, char *out, size_t n, char *err, size_t errsz)
{
    struct stat self;
    int have_self = stat("/proc/self/exe", &self) == 0;
    if (strchr(name, '/')) {
        const char *reason = NULL;
        if (name[0] != '/')
            reason = "a path must be absolute";
        else if (have_self && same_file(name, &self))
            reason = "it is vgpu-runtime itself";
        else if (!is_exec_file(name))
            reason = "no such executable file";
        if (reason) {
            snprintf(err, errsz, "failed to find the lower runtime '%s': %s", name, reason);
            return -1;
        }
        vg_strlcpy(out, name, n);
        return 0;
    }
    char skip[N_SKIP][PATH_MAX];
    shim_bin_dirs(skip);
    const char *path = getenv("PATH");
    char *copy = strdup(path ? path : "/bin:/usr/bin");
    if (copy == NULL) {
        snprintf(err, errsz, "failed to find the lower runtime '%s': out of memory", name);
        return -1;
    }
    char cwd[VG_PATH_MAX] = "";
    int found = 0;
    for (char *entry = copy, *next; entry; entry = next) {
        next = strchr(entry, ':');
        if (next)
            *next++ = '\0';
        const char *dir = *entry ? entry : ".";
        char real[PATH_MAX];
        int skipped = 0;
        if (realpath(dir, real) != NULL)
            for (int i = 0; i < N_SKIP; i++)
                skipped |= skip[i][0] && strcmp(real, skip[i]) == 0;
        if (skipped)
            continue;
        char candidate[VG_PATH_MAX];
        if (dir[0] == '/') {
            snprintf(candidate, sizeof(candidate), "%s/%s", dir, name);
        } else {
            if (!cwd[0] && getcwd(cwd, sizeof(cwd)) == NULL)
                continue;
            snprintf(candidate, sizeof(candidate), "%s/%s/%s", cwd, dir, name);
        }
        if (!is_exec_file(candidate) || (have_self && same_file(candidate, &self)))
            continue;
        vg_strlcpy(out, candidate, n);
        found = 1;
        break;
    }
    free(copy);
    if (!found) {
        snprintf(err, errsz, "failed to find the lower runtime '%s': not found on PATH (set "
                 "runtime.lower in the vgpu config to its absolute path)", name);
        return -1;
    }
    return 0;
}

/* Replace this process with the lower runtime, argv[1:] untouched (shim/lower.py). */
static void exec_lower(const char *path, int argc, char **argv, char *err, size_t errsz)
{
    char mark[32];
    snprintf(mark, sizeof(mark), "%d", (int)getpid());
    const char *seen = getenv(GUARD_ENV);
    if (seen && strcmp(seen, mark) == 0) {
        snprintf(err, errsz, "failed to find the lower runtime '%s': it execs vgpu-runtime "
                 "again (a loop)", path);
        return;
    }
    setenv(GUARD_ENV, mark, 1);
    argv[0] = (char *)path;
    (void)argc;
    execv(path, argv);
    snprintf(err, errsz, "failed to find the lower runtime '%s': cannot exec it: %s", path,
             strerror(errno));
}

/* Could this spec ask for a vGPU? A superset of shim.runtime.may_request on the raw
 * bytes: any spelling of a vgpu.io/ key or VGPU_ variable contains one of these. */
static int may_request(const char *spec)
{
    return strstr(spec, "vgpu.io") || strstr(spec, "VGPU_") || strstr(spec, "\\u");
}

static void python(int argc, char **argv)
{
    vg_exec_python("shim", argc - 1, argv + 1, NULL, 0);
    exit(1);
}

/* Ask vgpud (create/run with a possible request); returns only to pass through. */
static void vgpu_path(const struct inv *inv, int argc, char **argv)
{
    char sock[VG_PATH_MAX], self[VG_PATH_MAX], err[1024];
    if (vg_lifecycle_path(sock, sizeof(sock)) != 0)
        python(argc, argv);
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    self[n > 0 ? n : 0] = '\0';
    const char *env_sock = getenv("VGPU_SOCKET");
    struct vg_msg req = {0}, reply = {0};
    if (vg_msg_add(&req, "v", VG_PROTOCOL_VERSION) || vg_msg_add(&req, "op", "runtime-create") ||
        vg_msg_add(&req, "config", vg_config_path()) ||
        vg_msg_add(&req, "socket", env_sock ? env_sock : "") ||
        vg_msg_add(&req, "bundle", inv->bundle) || vg_msg_add(&req, "id", inv->id) ||
        vg_msg_add(&req, "path", getenv("PATH") ? getenv("PATH") : "") ||
        vg_msg_add(&req, "self", self))
        python(argc, argv);       /* a field we cannot frame (never in practice) */
    int rc = vg_call(sock, &req, &reply, CALL_TIMEOUT_MS, err, sizeof(err));
    vg_msg_free(&req);
    if (rc == VG_CALL_UNREACHABLE)
        python(argc, argv);
    if (rc != 0) {
        char line[1200];
        snprintf(line, sizeof(line), "failed to allocate a vGPU: %s", err);
        report(inv, line);
        exit(1);
    }
    const char *v = vg_msg_get(&reply, "v"), *status = vg_msg_get(&reply, "status");
    if (v == NULL || strcmp(v, VG_PROTOCOL_VERSION) != 0 || status == NULL ||
        strcmp(status, "fallback") == 0)
        python(argc, argv);
    if (strcmp(status, "error") == 0) {
        const char *message = vg_msg_get(&reply, "message");
        report(inv, message ? message : "vgpu: vgpud refused the container");
        exit(1);
    }
    const char *lower = vg_msg_get(&reply, "lower");
    if (strcmp(status, "exec") != 0 || lower == NULL || lower[0] != '/')
        python(argc, argv);
    exec_lower(lower, argc, argv, err, sizeof(err));
    /* The exec failed: give the slice back (vgpud's reconciler would, later). */
    struct vg_msg rel = {0}, ack = {0};
    char ignored[256];
    if (!vg_msg_add(&rel, "v", VG_PROTOCOL_VERSION) && !vg_msg_add(&rel, "op", "release") &&
        !vg_msg_add(&rel, "config", vg_config_path()) &&
        !vg_msg_add(&rel, "socket", env_sock ? env_sock : "") && !vg_msg_add(&rel, "id", inv->id) &&
        !vg_msg_add(&rel, "bundle", inv->bundle))  /* who asks: another bundle's slice stays */
        vg_call(sock, &rel, &ack, RELEASE_TIMEOUT_MS, ignored, sizeof(ignored));
    report(inv, err);
    exit(1);
}

int main(int argc, char **argv)
{
    struct inv inv;
    char err[1024];
    parse_argv(argc, argv, &inv);
    int creates = inv.command && inv.id && *inv.id &&
                  (strcmp(inv.command, "create") == 0 || strcmp(inv.command, "run") == 0);
    if (creates) {
        char spec_path[VG_PATH_MAX + 16];
        char *spec = NULL;
        if (snprintf(spec_path, sizeof(spec_path), "%s/config.json", inv.bundle) <
            (int)sizeof(spec_path))
            spec = vg_read_file(spec_path, SPEC_MAX, NULL);
        /* An unreadable spec passes through: the lower runtime reports it its own way. */
        if (spec != NULL && may_request(spec)) {
            free(spec);
            vgpu_path(&inv, argc, argv);
        }
        free(spec);
    }
    char lower_name[VG_PATH_MAX] = "runc", lower[VG_PATH_MAX];
    char *text = vg_read_file(vg_config_path(), 1 << 20, NULL);
    if (text != NULL) {
        int r = vg_cfg_get(text, "runtime", "lower", lower_name, sizeof(lower_name));
        free(text);
        if (r < 0)
            python(argc, argv);   /* a YAML form the scanner does not follow */
        if (r == 0)
            vg_strlcpy(lower_name, "runc", sizeof(lower_name));
    }
    if (find_lower(lower_name, lower, sizeof(lower), err, sizeof(err)) == 0)
        exec_lower(lower, argc, argv, err, sizeof(err));
    report(&inv, err);
    return 1;
}
