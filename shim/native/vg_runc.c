/* SPDX-License-Identifier: Apache-2.0 */
#include "vg_runc.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int in_list(const char *name, const char *const *list)
{
    for (; *list; list++)
        if (strcmp(name, *list) == 0)
            return 1;
    return 0;
}

/* `--name=value` -> name, value; `-n` -> n, NULL; not a flag -> 0. */
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

void vg_runc_parse(int argc, char **argv, struct vg_runc_args *a)
{
    /* runc's flags that take a value as the next word (global, then create/run's). */
    static const char *const global_valued[] = {"root", "log", "log-format", "criu",
                                                "rootless", "bundle", "b", NULL};
    static const char *const create_valued[] = {"bundle", "b", "console-socket", "pid-file",
                                                "preserve-fds", NULL};
    memset(a, 0, sizeof(*a));
    char name[128];
    const char *value;
    int i = 1;
    while (i < argc) {
        const char *tok = argv[i];
        if (strcmp(tok, "--") == 0) {
            if (++i < argc)
                a->command = argv[i++];
            break;
        }
        if (!split_flag(tok, name, sizeof(name), &value)) {
            a->command = tok;
            i++;
            break;
        }
        if (value == NULL && in_list(name, global_valued) && i + 1 < argc)
            value = argv[++i];
        if (strcmp(name, "log") == 0)
            a->log = value;
        else if (strcmp(name, "log-format") == 0)
            a->log_format = value;
        else if (strcmp(name, "bundle") == 0 || strcmp(name, "b") == 0)
            a->bundle_flag = value;
        i++;
    }
    if (a->command == NULL || (strcmp(a->command, "create") != 0 && strcmp(a->command, "run") != 0))
        return;
    while (i < argc) {
        const char *tok = argv[i];
        if (strcmp(tok, "--") == 0) {
            a->id = i + 1 < argc ? argv[i + 1] : NULL;
            break;
        }
        if (!split_flag(tok, name, sizeof(name), &value)) {
            a->id = tok;
            break;
        }
        if (value == NULL && in_list(name, create_valued) && i + 1 < argc)
            value = argv[++i];
        if (strcmp(name, "bundle") == 0 || strcmp(name, "b") == 0)
            a->bundle_flag = value;
        i++;
    }
    char cwd[VG_PATH_MAX];
    if (getcwd(cwd, sizeof(cwd)) == NULL)
        vg_strlcpy(cwd, "/", sizeof(cwd));
    const char *b = a->bundle_flag;
    if (b == NULL || *b == '\0')
        vg_strlcpy(a->bundle, cwd, sizeof(a->bundle));
    else if (b[0] == '/')
        vg_strlcpy(a->bundle, b, sizeof(a->bundle));
    else if (snprintf(a->bundle, sizeof(a->bundle), "%s/%s", cwd, b) >= (int)sizeof(a->bundle))
        a->bundle[0] = '\0';   /* too long for a path: the lower runtime says so */
}

int vg_runc_creates(const struct vg_runc_args *a)
{
    return a->command && (strcmp(a->command, "create") == 0 || strcmp(a->command, "run") == 0) &&
           a->id && *a->id && a->bundle[0];
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

void vg_runc_report(const struct vg_runc_args *a, const char *message)
{
    char line[VG_ERR_MAX];
    vg_line(line, sizeof(line), message);
    fprintf(stderr, "%s\n", line);
    if (a->log == NULL || *a->log == '\0')
        return;
    FILE *f = fopen(a->log, "ae");
    if (f == NULL)
        return;
    char now[32];
    time_t t = time(NULL);
    struct tm tm;
    strftime(now, sizeof(now), "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tm));
    /* runc's own formats (logrus): what containerd's shim parses for the error. */
    if (a->log_format && strcmp(a->log_format, "json") == 0) {
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
