# SPDX-License-Identifier: Apache-2.0
"""The built-in values vgpu's Python shares with its compiled programs and the CLI.

Each is defined here once; oci_hook/native/vg_defaults.h holds the C twins and
tests/project/test_constants.py compares every one. Plain constants on purpose: importing this
costs nothing (the CLI needs the defaults before deciding whether to load a config).
"""
from __future__ import annotations

from pathlib import Path

__all__ = [
    "DEFAULT_CONFIG_PATH",
    "DEFAULT_LOWER_RUNTIME",
    "DEFAULT_RUN_DIR",
    "DEFAULT_SOCKET",
    "DEFAULT_WAIT_S",
    "ENV_CONFIG",
    "ENV_REGION_DIR",
    "ENV_SCHED_DIR",
    "ENV_SOCKET",
    "SOCKET_NAME",
]

#: Where vgpud, the programs and the CLI look when neither --config nor $VGPU_CONFIG says.
DEFAULT_CONFIG_PATH = Path("/etc/vgpu/config.yaml")
#: Runtime files (slices, scheduling regions) and the socket.
DEFAULT_RUN_DIR = Path("/run/vgpu")
#: vgpud's gRPC socket's name in the run dir (the lifecycle socket is `<it>.lifecycle`).
SOCKET_NAME = "vgpud.sock"
DEFAULT_SOCKET = DEFAULT_RUN_DIR / SOCKET_NAME
#: How long the compiled programs wait for vgpud (config hook.wait_s), seconds.
DEFAULT_WAIT_S = 10.0
#: The OCI runtime vgpu-runtime execs (config runtime.lower): `auto` is NVIDIA's
#: nvidia-container-runtime where it is on PATH (it adds the driver), else runc.
DEFAULT_LOWER_RUNTIME = "auto"
#: The environment variables that name the config file and vgpud's socket.
ENV_CONFIG = "VGPU_CONFIG"
ENV_SOCKET = "VGPU_SOCKET"
#: What libvgpu reads outside a container (`vgpu run` sets them): the slice's region
#: files and the GPUs' scheduling files.
ENV_REGION_DIR = "VGPU_REGION_DIR"
ENV_SCHED_DIR = "VGPU_SCHED_DIR"
