# SPDX-License-Identifier: Apache-2.0
"""`vgpu-device-plugin`: the entry point (flags, logging, signals)."""
from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from arbiter.config import DEFAULT_CDI_SPEC_DIRS
from arbiter.defaults import DEFAULT_SOCKET, ENV_SOCKET
from arbiter.errors import QuantityError
from arbiter.quantity import parse_memory
from arbiter.signals import stop_on_signals
from vgpu_k8s.deviceplugin.agent import Agent, Settings
from vgpu_k8s.deviceplugin.plugin import ENDPOINTS
from vgpu_k8s.errors import UsageError
from vgpu_k8s.unixserver import too_long

__all__ = ["DEFAULT_CDI_DIR", "DEFAULT_KUBELET_DIR", "DEFAULT_MEMORY_UNIT", "main", "parse_args"]

DEFAULT_KUBELET_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_MEMORY_UNIT = "256Mi"
#: Where --cdi writes its specs: the CDI directory for generated specs (CDI's own advice).
DEFAULT_CDI_DIR = DEFAULT_CDI_SPEC_DIRS[-1]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vgpu-device-plugin",
        description="Advertise vgpu.io/memory and vgpu.io/compute to the kubelet.")
    p.add_argument("--kubelet-dir", type=Path, default=DEFAULT_KUBELET_DIR,
                   help="the kubelet's device-plugins dir (kubelet.sock; our sockets go "
                        "there too) (default %(default)s)")
    p.add_argument("--memory-unit", default=DEFAULT_MEMORY_UNIT,
                   help="memory per vgpu.io/memory device (default %(default)s)")
    p.add_argument("--socket", default=None,
                   help=f"vgpud's socket (default ${ENV_SOCKET}, else {DEFAULT_SOCKET})")
    p.add_argument("--poll-interval", type=float, default=5.0, metavar="S",
                   help="seconds between two health checks through vgpud (default 5)")
    p.add_argument("--vgpud-grace", type=float, default=30.0, metavar="S",
                   help="seconds vgpud may be unreachable before every device turns "
                        "Unhealthy (default 30)")
    p.add_argument("--cdi", action="store_true",
                   help="answer Allocate with CDI devices (containerd >= 1.7 with CDI, "
                        "CRI-O): no runtime class; without it, annotations for the vgpu "
                        "runtime class (containerd 1.6)")
    p.add_argument("--cdi-dir", type=Path, default=DEFAULT_CDI_DIR,
                   help="with --cdi: where the specs are written, a directory the engine "
                        "reads (default %(default)s)")
    p.add_argument("--nvidia-cdi-dir", type=Path, action="append", default=None,
                   metavar="DIR",
                   help="with --cdi: where NVIDIA's CDI specs (nvidia.com/gpu) are looked "
                        "for, to add the GPU's beside vgpu's; repeatable (default: "
                        f"{', '.join(str(d) for d in DEFAULT_CDI_SPEC_DIRS)}; none: "
                        "--nvidia-cdi-dir '')")
    return p


def parse_args(argv: Sequence[str], env: dict[str, str]) -> Settings:
    """Settings from the command line; UsageError names a flag whose value is unusable."""
    args = _parser().parse_args(argv)
    try:
        unit = parse_memory(args.memory_unit)
    except QuantityError as e:
        raise UsageError("--memory-unit", args.memory_unit, str(e)) from e
    if unit < 1 << 20:
        raise UsageError("--memory-unit", args.memory_unit, "must be at least 1Mi")
    for flag, value in (("--poll-interval", args.poll_interval),
                        ("--vgpud-grace", args.vgpud_grace)):
        if not value > 0:
            raise UsageError(flag, str(value), "must be a positive number of seconds")
    nvidia_dirs = tuple(DEFAULT_CDI_SPEC_DIRS if args.nvidia_cdi_dir is None else
                        (d for d in args.nvidia_cdi_dir if str(d) not in ("", ".")))
    for flag, d in [("--cdi-dir", args.cdi_dir)] + [("--nvidia-cdi-dir", d)
                                                     for d in nvidia_dirs]:
        if not d.is_absolute():
            raise UsageError(flag, str(d), "must be an absolute directory")
    why = too_long(*(args.kubelet_dir / name for name in ENDPOINTS.values()))
    if why:
        raise UsageError("--kubelet-dir", str(args.kubelet_dir), why)
    return Settings(kubelet_dir=args.kubelet_dir, memory_unit=unit,
                    vgpud_socket=args.socket or env.get(ENV_SOCKET) or str(DEFAULT_SOCKET),
                    poll_s=args.poll_interval, grace_s=args.vgpud_grace,
                    cdi_dir=args.cdi_dir if args.cdi else None, nvidia_cdi_dirs=nvidia_dirs)


def main(argv: Sequence[str] | None = None) -> int:
    """Run until SIGTERM/SIGINT; 0 on a clean stop, 2 for bad flags."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="vgpu-device-plugin: %(message)s")
    try:
        settings = parse_args(sys.argv[1:] if argv is None else argv, dict(os.environ))
    except UsageError as e:
        print(f"vgpu-device-plugin: {e}", file=sys.stderr)
        return 2
    stop = stop_on_signals()  # SIGTERM, SIGINT
    Agent(settings).run(stop)
    logging.getLogger("vgpu-device-plugin").info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
