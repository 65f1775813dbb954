/* SPDX-License-Identifier: Apache-2.0 */
/* "Could this container ask for a vGPU?", decided without vgpud: a bounded walk of an
 * OCI spec (config.json) or OCI state that finds the keys of the top-level
 * `annotations` object and the strings of `process.env`, with escapes decoded (a key
 * spelt with \u escapes is still recognised). A superset of vgpud's exact test
 * (oci_hook.request.find_request): false means certainly no request, so the container
 * passes through without vgpud; true means vgpud decides.
 * A pod's sandbox (VG_CRI_TYPE_KEY or VG_CRIO_TYPE_KEY = VG_SANDBOX_TYPE) asks for
 * nothing, whatever else it carries; like Python's json, the last top-level `annotations`
 * object and the last of a repeated key decide. The hook judges its OCI state and the
 * bundle's config.json each on its own: the state carries the spec's annotations
 * (runtime-spec state.md), so this agrees with vgpud, which lays one over the other. */
#ifndef VG_SPEC_H
#define VG_SPEC_H

#include <stddef.h>

#include "vg_common.h"

struct vg_spec {
    int asks;                    /* a vgpu.io/ or cdi.k8s.io/ annotation key or a VGPU_
                                    env entry, in a document that is not a pod's sandbox */
    int malformed;               /* not one JSON value; `asks` then says whether the raw
                                    bytes could spell a request at all */
    char bundle[VG_PATH_MAX];    /* the top-level "bundle" string (an OCI state), or "" */
    char status[32];             /* the top-level "status" string (an OCI state), or "" */
    char id[256];                /* the top-level "id" string (an OCI state), or "" */
};

/* Walk `len` bytes of JSON at `text` into `out`; never fails (see `malformed`). */
void vg_spec_scan(const char *text, size_t len, struct vg_spec *out);

/* The same for `<bundle>/config.json`; -1 if it cannot be read. */
int vg_spec_scan_bundle(const char *bundle, struct vg_spec *out);

#endif
