/* SPDX-License-Identifier: Apache-2.0 */
/* The values the compiled programs share with vgpud's Python, in one place. A test
 * compares every one with its Python twin (named above it), so keep the form
 * `#define NAME "text"` or `#define NAME number`, one per line. */
#ifndef VG_DEFAULTS_H
#define VG_DEFAULTS_H

/* arbiter.defaults.DEFAULT_CONFIG_PATH */
#define VG_DEFAULT_CONFIG "/etc/vgpu/config.yaml"
/* arbiter.defaults.DEFAULT_RUN_DIR */
#define VG_DEFAULT_RUN_DIR "/run/vgpu"
/* arbiter.defaults.SOCKET_NAME: vgpud's socket in the run dir */
#define VG_SOCKET_NAME "vgpud.sock"
/* the lifecycle socket is vgpud's socket path + this (shim.lifecycle.lifecycle_socket) */
#define VG_LIFECYCLE_SUFFIX ".lifecycle"
/* arbiter.defaults.DEFAULT_WAIT_S: how long a program waits for vgpud (hook.wait_s), s */
#define VG_DEFAULT_WAIT_S 10
/* shim.lifecycle.VERSION: the lifecycle protocol's version */
#define VG_PROTOCOL_VERSION "2"
/* arbiter.defaults.DEFAULT_LOWER_RUNTIME (runtime.lower) */
#define VG_DEFAULT_LOWER "auto"
/* oci_hook.request.ANNOTATION_PREFIX: annotations that may ask for a vGPU */
#define VG_ANNOTATION_PREFIX "vgpu.io/"
/* oci_hook.cdi.ANNOTATION_PREFIX: CDI device requests, which may name a claim's vGPU
 * (containerd 1.6 has no CDI: vgpud applies a vgpu.io/claim device's spec) */
#define VG_CDI_ANNOTATION_PREFIX "cdi.k8s.io/"
/* oci_hook.request.CONTAINER_TYPE_KEYS: what containerd's CRI plugin, then CRI-O, write on
 * every spec of a pod; a value of VG_SANDBOX_TYPE (oci_hook.request.SANDBOX) is the pod's
 * sandbox (pause) container, which asks for nothing whatever else it carries */
#define VG_CRI_TYPE_KEY "io.kubernetes.cri.container-type"
#define VG_CRIO_TYPE_KEY "io.kubernetes.cri-o.ContainerType"
#define VG_SANDBOX_TYPE "sandbox"
/* process.env entries that may ask for a vGPU (VGPU_MEMORY, ...) */
#define VG_ENV_PREFIX "VGPU_"
/* containerd-shim-vgpu-v2's private bin dir, beside the programs: its runc is vgpu-runtime */
#define VG_SHIM_BIN_DIR "shim"
/* containerd's runc shim, which containerd-shim-vgpu-v2 runs */
#define VG_RUNC_SHIM "containerd-shim-runc-v2"

#endif
