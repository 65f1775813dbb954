# SPDX-License-Identifier: Apache-2.0
"""The `vgpu` commands that ask vgpud and print: devices, ls, smi, release, update, info.

Each takes the parsed arguments, a connected Client (info connects itself: it reports
an unreachable vgpud instead of failing) and an output function; returns the exit status.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from arbiter.errors import VgpuError
from arbiter.version import version
from vgpu_cli.client import Client, connect, messages, rpc_error
from vgpu_cli.errors import CliError
from vgpu_cli.paths import DEFAULT_SOCKET, config_paths, resolve_config, resolve_socket
from vgpu_cli.render import (
    device_to_dict,
    dump_json,
    render_devices,
    render_slices,
    render_smi,
    slice_to_dict,
)

__all__ = ["HANDLERS", "cmd_devices", "cmd_info", "cmd_ls", "cmd_release", "cmd_smi",
           "cmd_update"]

Out = Callable[[str], None]
#: The compiled programs `vgpu info` reports, and what their absence means.
_PROGRAMS = (("vgpu-runtime", "not built (run make; no container gets a vGPU)"),
             ("vgpu-hook", "not built (run make; no container gets a vGPU)"),
             ("containerd-shim-vgpu-v2", "not built (run make)"),
             ("vgpu-broker", "not built (vgpud cannot start)"))


def cmd_devices(args: argparse.Namespace, c: Client, out: Out) -> int:
    """`vgpu devices`."""
    devices = c.call("Devices", messages().DevicesRequest()).devices
    out(dump_json([device_to_dict(d) for d in devices]) if args.json
        else render_devices(devices))
    return 0


def cmd_ls(args: argparse.Namespace, c: Client, out: Out) -> int:
    """`vgpu ls`."""
    slices = c.call("List", messages().ListRequest()).slices
    out(dump_json([slice_to_dict(s) for s in slices]) if args.json else render_slices(slices))
    return 0


def cmd_smi(args: argparse.Namespace, c: Client, out: Out) -> int:
    """`vgpu smi`."""
    pb = messages()
    devices = c.call("Devices", pb.DevicesRequest()).devices
    slices = c.call("List", pb.ListRequest()).slices
    if args.json:
        out(dump_json({"devices": [device_to_dict(d) for d in devices],
                       "slices": [slice_to_dict(s) for s in slices]}))
        return 0
    vgpud_version = c.call("Health", pb.HealthRequest()).version
    out(render_smi(devices, slices, vgpud_version))
    return 0


def cmd_release(args: argparse.Namespace, c: Client, out: Out) -> int:
    """`vgpu release ID|OWNER`: by id first, then by owner."""
    import grpc

    pb = messages()
    for field in ("id", "owner"):
        try:
            r = c.stub.Release(pb.ReleaseRequest(**{field: args.target}), timeout=c.timeout)
        except grpc.RpcError as e:
            # A daemon may answer NOT_FOUND / INVALID_ARGUMENT for "no such id": try the owner.
            if field == "id" and e.code() in (grpc.StatusCode.NOT_FOUND,
                                              grpc.StatusCode.INVALID_ARGUMENT):
                continue
            raise rpc_error(e, c.socket, c.timeout) from e
        if r.released:
            out(f"released slice {r.id or args.target}")
            return 0
    raise CliError(f"failed to release slice {args.target}: no slice has this id or owner")


def cmd_update(args: argparse.Namespace, c: Client, out: Out) -> int:
    """`vgpu update ID --memory Q --compute P`."""
    s = c.call("Update", messages().UpdateRequest(id=args.id, memory_bytes=args.memory or 0,
                                                  compute_percent=args.compute or 0))
    out(dump_json(slice_to_dict(s)) if args.json else render_slices([s]))
    return 0


#: The commands that need a connected vgpud, by name.
HANDLERS: dict[str, Callable[[argparse.Namespace, Client, Out], int]] = {
    "devices": cmd_devices, "ls": cmd_ls, "smi": cmd_smi,
    "release": cmd_release, "update": cmd_update,
}


def cmd_info(args: argparse.Namespace, env: Mapping[str, str], out: Out) -> int:
    """`vgpu info`: every path in use, local and (when reachable) as vgpud reports it."""
    from arbiter.native import libvgpu_path, program_path
    from shim.lifecycle import lifecycle_socket

    try:
        sock = resolve_socket(args, env)
    except CliError:  # a broken config file: reported below, from config_paths
        sock = DEFAULT_SOCKET
    config = resolve_config(args, env)
    info: dict[str, Any] = {"version": version(), "socket": sock, "config": config,
                            "config_exists": Path(config).is_file()}
    try:
        info["libvgpu"] = str(libvgpu_path())
    except VgpuError as e:
        info["libvgpu"] = None
        info["libvgpu_error"] = str(e)
    for name, _ in _PROGRAMS:
        found = program_path(name)
        info[name.replace("-", "_")] = str(found) if found else None
    info["lifecycle_socket"] = str(lifecycle_socket(sock))
    local = config_paths(config)
    info.update(local)
    info["vgpud"] = _daemon_info(args, sock)
    if args.json:
        out(dump_json(info))
        return 0
    out(_info_text(info, local))
    return 0


def _daemon_info(args: argparse.Namespace, sock: str) -> dict[str, Any]:
    """What vgpud says of itself, or why it cannot be asked."""
    try:
        with connect(sock, args.timeout) as c:
            h = c.call("Health", messages().HealthRequest())
            return {"reachable": True, "status": h.status, "version": h.version,
                    "devices": h.devices, "slices": h.slices,
                    "uptime_seconds": round(h.uptime_seconds, 1),
                    "paths": dict(h.paths)}
    except CliError as e:
        return {"reachable": False,
                "error": str(e).removeprefix(f"cannot reach vgpud at {sock}: ")}


def _info_text(info: Mapping[str, Any], local: Mapping[str, Any]) -> str:
    """`vgpu info` without --json: one aligned `name  value` line per path."""
    sock, daemon = info["socket"], info["vgpud"]
    rows = [("version", f"vgpu {info['version']}"),
            ("socket", sock),
            ("config", info["config"] + ("" if info["config_exists"] else " (absent: defaults)")),
            *([("config socket", str(local["config_socket"]))]
              if local.get("config_socket") not in (None, sock) else []),
            ("libvgpu.so", info["libvgpu"] or f"not found: {info['libvgpu_error']}"),
            *((name, info[name.replace("-", "_")] or absent) for name, absent in _PROGRAMS),
            ("lifecycle socket", info["lifecycle_socket"])]
    for key in ("state_dir", "run_dir", "event_log", "metrics_address", "config_error"):
        if key in local:
            rows.append((key.replace("_", " "), str(local[key]) or "(disabled)"))
    if daemon.get("reachable"):
        rows.append(("vgpud", f"{daemon['status']}, version {daemon['version']}, "
                              f"{daemon['devices']} GPUs, {daemon['slices']} slices, "
                              f"up {daemon['uptime_seconds']:g}s"))
        for key, value in sorted(daemon["paths"].items()):
            rows.append((f"vgpud {key.replace('_', ' ')}", value or "(none)"))
    else:
        rows.append(("vgpud", f"not reachable: {daemon['error']}"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)
