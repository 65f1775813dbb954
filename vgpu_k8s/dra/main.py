# SPDX-License-Identifier: Apache-2.0
"""`vgpu-dra-plugin`: the entry point (flags, logging, signals)."""
from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from arbiter.config import DEFAULT_CDI_SPEC_DIRS
from arbiter.defaults import DEFAULT_SOCKET, ENV_SOCKET
from arbiter.signals import stop_on_signals
from vgpu_k8s.dra.agent import Agent, Settings
from vgpu_k8s.dra.apiserver import Cluster, api_client
from vgpu_k8s.dra.errors import ApiError
from vgpu_k8s.dra.registration import registration_socket
from vgpu_k8s.dra.resourceslice import DRIVER
from vgpu_k8s.errors import UsageError
from vgpu_k8s.unixserver import too_long

__all__ = ["DEFAULT_CDI_DIR", "DEFAULT_KUBELET_DIR", "ENV_NODE_NAME", "main", "parse_args"]

DEFAULT_KUBELET_DIR = Path("/var/lib/kubelet")
DEFAULT_CDI_DIR = Path("/var/run/cdi")
ENV_NODE_NAME = "NODE_NAME"
# A node name is a DNS subdomain (RFC 1123).
_NODE_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vgpu-dra-plugin",
        description="The kubelet's DRA plugin for driver vgpu.io: GPU memory and compute "
                    "as consumable capacity, delivered through CDI.")
    p.add_argument("--node-name", default=None,
                   help=f"this node's name (default ${ENV_NODE_NAME})")
    p.add_argument("--kubelet-dir", type=Path, default=DEFAULT_KUBELET_DIR,
                   help="the kubelet's root dir: registration in plugins_registry/, the DRA "
                        "socket and checkpoint in plugins/vgpu.io/ (default %(default)s)")
    p.add_argument("--cdi-dir", type=Path, default=DEFAULT_CDI_DIR,
                   help="where the claims' CDI specs are written (default %(default)s)")
    p.add_argument("--nvidia-cdi-dir", type=Path, action="append", default=None,
                   metavar="DIR",
                   help="where NVIDIA's CDI specs (nvidia.com/gpu) are looked for, to answer "
                        "a claim's GPUs' devices beside vgpu's; repeatable (default: "
                        f"{', '.join(str(d) for d in DEFAULT_CDI_SPEC_DIRS)}; none: "
                        "--nvidia-cdi-dir '')")
    p.add_argument("--socket", default=None,
                   help=f"vgpud's socket (default ${ENV_SOCKET}, else {DEFAULT_SOCKET})")
    p.add_argument("--kubeconfig", default=None,
                   help="a kubeconfig file for the API server (default: the in-cluster "
                        "config of the pod's service account)")
    p.add_argument("--poll-interval", type=float, default=5.0, metavar="S",
                   help="seconds between two looks at vgpud's GPUs and their health "
                        "(default 5)")
    p.add_argument("--resync-interval", type=float, default=60.0, metavar="S",
                   help="seconds between two looks at the published ResourceSlice in the "
                        "API server, which is published again when it is gone or changed "
                        "(default 60; also right after each registration with the kubelet)")
    return p


def parse_args(argv: Sequence[str], env: dict[str, str]) -> Settings:
    """Settings from the command line; UsageError names a flag whose value is unusable."""
    args = _parser().parse_args(argv)
    node = args.node_name if args.node_name is not None else env.get(ENV_NODE_NAME, "")
    if not node:
        raise UsageError("--node-name", "", f"is required (or ${ENV_NODE_NAME}): the node "
                         "whose GPUs are published")
    if len(node) > 253 or not _NODE_RE.fullmatch(node):
        raise UsageError("--node-name", node, "is not a Kubernetes node name (lowercase "
                         "letters, digits, '-' and '.', at most 253)")
    for flag, value in (("--poll-interval", args.poll_interval),
                        ("--resync-interval", args.resync_interval)):
        if not value > 0:
            raise UsageError(flag, str(value), "must be a positive number of seconds")
    if args.kubeconfig is not None and not Path(args.kubeconfig).is_file():
        raise UsageError("--kubeconfig", args.kubeconfig, "no such file")
    nvidia_dirs = tuple(DEFAULT_CDI_SPEC_DIRS if args.nvidia_cdi_dir is None else
                        (d for d in args.nvidia_cdi_dir if str(d) not in ("", ".")))
    for d in nvidia_dirs:
        if not d.is_absolute():
            raise UsageError("--nvidia-cdi-dir", str(d), "must be an absolute directory")
    settings = Settings(node=node, kubelet_dir=args.kubelet_dir, cdi_dir=args.cdi_dir,
                        vgpud_socket=args.socket or env.get(ENV_SOCKET) or str(DEFAULT_SOCKET),
                        kubeconfig=args.kubeconfig, poll_s=args.poll_interval,
                        resync_s=args.resync_interval, nvidia_cdi_dirs=nvidia_dirs)
    why = too_long(settings.dra_socket, registration_socket(settings.registry_dir, DRIVER))
    if why:
        raise UsageError("--kubelet-dir", str(args.kubelet_dir), why)
    return settings


def main(argv: Sequence[str] | None = None) -> int:
    """Run until SIGTERM/SIGINT; 0 on a clean stop, 2 for bad flags, 1 when it cannot start."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="vgpu-dra-plugin: %(message)s")
    try:
        settings = parse_args(sys.argv[1:] if argv is None else argv, dict(os.environ))
    except UsageError as e:
        print(f"vgpu-dra-plugin: {e}", file=sys.stderr)
        return 2
    stop = stop_on_signals()  # SIGTERM, SIGINT
    try:
        agent = Agent(settings, Cluster(api_client(settings.kubeconfig)))
    except (ApiError, ValueError) as e:
        print(f"vgpu-dra-plugin: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    agent.run(stop)
    logging.getLogger("vgpu-dra-plugin").info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
