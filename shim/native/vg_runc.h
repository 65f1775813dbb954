/* SPDX-License-Identifier: Apache-2.0 */
/* runc's command line as vgpu-runtime needs it: which command, which bundle and
 * container id on create/run, and where runc's --log goes (the one error line is
 * also written there: containerd's runc shim, and so Docker, shows it from there). */
#ifndef VG_RUNC_H
#define VG_RUNC_H

#include "vg_common.h"

struct vg_runc_args {
    const char *command;     /* create, run, start, state, ... or NULL */
    const char *log;         /* --log FILE */
    const char *log_format;  /* --log-format text|json */
    const char *bundle_flag; /* --bundle / -b as given */
    const char *id;          /* create/run: the container id */
    char bundle[VG_PATH_MAX];/* create/run: the bundle, absolute ("" if too long) */
};

void vg_runc_parse(int argc, char **argv, struct vg_runc_args *a);

/* create or run of a container id with a bundle: the commands that may get a vGPU. */
int vg_runc_creates(const struct vg_runc_args *a);

/* One line on stderr, and in --log in its --log-format ("vgpu: " prefixed if missing). */
void vg_runc_report(const struct vg_runc_args *a, const char *message);

#endif
