# SPDX-License-Identifier: Apache-2.0
"""vgpu-runtime: a transparent OCI runtime that gives vGPUs to the containers that ask.

For `create` / `run` of a bundle whose spec requests a vGPU (vgpu.io/* annotations,
or VGPU_* env where the config allows), it validates the request, asks vgpud for
the slice (idempotent by container id; the hook's own Allocate later returns the
same slice), adds the vgpu hooks, the slice's device nodes and cgroup rules, the
CUDA/NVIDIA visible-devices env and the slice annotation to config.json, and then
execs the lower runtime (config runtime.lower, runc by default) with the original
arguments. Every other call, and every container that asks for nothing, goes to
the lower runtime untouched, without loading the config or gRPC: that path reads
config.json once and execs.

A bad or refused request fails the call with one line on stderr (and in runc's
--log file, where containerd and Docker read the runtime's error from), and leaves
no slice behind.

The compiled vgpu-runtime (shim/native/) is what engines run: vgpud runs give_vgpu
for it in-process (shim/fastpath.py), and it execs this module whenever it cannot.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from shim.args import Invocation, parse_argv
from shim.errors import AllocateError, SpecError
from shim.lower import exec_lower, find_lower
from shim.spec import FileSpec, Spec

__all__ = ["configured_lower", "main", "may_request"]

_DEFAULT_CONFIG = "/etc/vgpu/config.yaml"
_DEFAULT_LOWER = "runc"
#: Seconds for a Release after a failure (vgpud answered the Allocate moments ago).
_RELEASE_TIMEOUT_S = 5.0
#: Added to hook.wait_s for the hooks' OCI timeout: the mounts after the Allocate.
_HOOK_MARGIN_S = 20


def may_request(spec: Spec) -> bool:
    """Cheap test: could this spec ask for a vGPU (any vgpu.io/* annotation or VGPU_* env)?

    False means certainly not, and the call passes through without loading anything
    else; True leads to the exact test (oci_hook.request.find_request with the config).
    """
    annotations = spec.get("annotations")
    if isinstance(annotations, dict) and any(
            isinstance(k, str) and k.startswith("vgpu.io/") for k in annotations):
        return True
    process = spec.get("process")
    env = process.get("env") if isinstance(process, dict) else None
    return isinstance(env, list) and any(
        isinstance(e, str) and e.startswith("VGPU_") for e in env)


def _config_file(environ: Mapping[str, str]) -> str:
    return environ.get("VGPU_CONFIG") or _DEFAULT_CONFIG


def configured_lower(config_file: str | Path) -> str:
    """runtime.lower of the config file, read without the YAML library where possible.

    The pass-through path must stay fast, and importing yaml alone costs about 10 ms,
    so the common block form is read by a small scanner:

        runtime:
          lower: runc        # a comment

    Anything else that mentions a top-level `runtime` key (flow style, anchors,
    quoting the scanner does not follow) is read with yaml.safe_load. A missing or
    unreadable file gives the default (runc); the vGPU path validates the file fully.
    """
    try:
        text = Path(config_file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return _DEFAULT_LOWER
    lines = text.splitlines()
    start = None
    for i, line in enumerate(lines):
        if line.startswith("runtime") and line[len("runtime"):].lstrip().startswith(":"):
            rest = line.split(":", 1)[1].split("#", 1)[0].strip()
            if rest:
                return _lower_from_yaml(text)
            start = i + 1
            break
    if start is None:
        return _DEFAULT_LOWER
    for line in lines[start:]:
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not line[0].isspace():
            break                       # the next top-level key: no `lower`
        if stripped.startswith("lower:"):
            value = stripped[len("lower:"):].split(" #", 1)[0].strip()
            if not value or value[0] in "'\"&*!|>{[":
                return _lower_from_yaml(text)
            return value
    return _DEFAULT_LOWER


def _lower_from_yaml(text: str) -> str:
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        return _DEFAULT_LOWER
    runtime = doc.get("runtime") if isinstance(doc, dict) else None
    lower = runtime.get("lower") if isinstance(runtime, dict) else None
    return lower if isinstance(lower, str) and lower else _DEFAULT_LOWER


def report(inv: Invocation, message: str) -> None:
    """Tell the user: one line on stderr, and in runc's --log file in its --log-format.

    containerd's runc shim (and so Docker) takes the runtime's error from the last
    error entry of that log, not from stderr.
    """
    line = message if message.startswith("vgpu: ") else f"vgpu: {message}"
    line = " ".join(line.split())
    print(line, file=sys.stderr, flush=True)
    log = inv.global_flag("log")
    if not log:
        return
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if inv.global_flag("log-format") == "json":
        entry = json.dumps({"level": "error", "msg": line, "time": now})
    else:
        entry = f'time="{now}" level=error msg={json.dumps(line)}'
    try:
        with open(log, "a", encoding="utf-8") as f:
            f.write(entry + "\n")
    except OSError:
        pass


def _hook_settings(config_file: str, environ: Mapping[str, str], wait_s: float) -> Any:
    """How config.json runs vgpu-hook, with env for it.

    The compiled vgpu-hook (arbiter.native.program_path) where it is built or shipped:
    it asks vgpud's lifecycle socket, and runs this interpreter with `-m oci_hook`
    ($VGPU_PYTHON) whenever it cannot. Without it, this interpreter directly.
    """
    import oci_hook
    from arbiter.native import program_path
    from shim.modifiers import HookSettings

    env: dict[str, str] = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                           "VGPU_CONFIG": config_file}
    if environ.get("VGPU_SOCKET"):
        env["VGPU_SOCKET"] = environ["VGPU_SOCKET"]
    # A checkout (tests, `make demo`) is not on the interpreter's path by itself.
    package_root = str(Path(oci_hook.__file__).resolve().parent.parent)
    if not any(part in package_root for part in ("site-packages", "dist-packages")):
        env["PYTHONPATH"] = package_root
    timeout = math.ceil(wait_s) + _HOOK_MARGIN_S
    native = program_path("vgpu-hook")
    if native is not None:
        env["VGPU_PYTHON"] = sys.executable
        return HookSettings(path=str(native), args=(str(native),), env=env, timeout=timeout)
    return HookSettings(path=sys.executable, args=(sys.executable, "-m", "oci_hook"),
                        env=env, timeout=timeout)


def _rpc_reason(e: Any, socket: str, wait_s: float) -> str:
    import grpc

    code = e.code() if hasattr(e, "code") else None
    details = " ".join(str((e.details() if hasattr(e, "details") else "") or code).split())
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return (f"failed to allocate a vGPU: vgpud at {socket} did not answer within "
                f"{wait_s:g}s (is vgpud running?)")
    return details


class _Vgpud:
    """The two calls vgpu-runtime makes to vgpud, with bounded waits."""

    def __init__(self, socket: str, wait_s: float, stub: Any = None) -> None:
        from oci_hook.client import import_grpc

        grpc = import_grpc()  # before the stubs, which import grpc themselves
        from arbiter.proto import vgpu_pb2_grpc

        self.socket = socket
        self.wait_s = wait_s
        # vgpud's lifecycle socket passes its in-process stub: no channel then.
        self.channel = None if stub is not None else grpc.insecure_channel(f"unix:{socket}")
        self.stub = stub if stub is not None else vgpu_pb2_grpc.ArbiterStub(self.channel)

    def allocate(self, request: Any) -> Any:
        """The slice for `request` (a model Request); AllocateError with vgpud's reason."""
        import grpc

        from arbiter.convert import request_to_proto

        try:
            return self.stub.Allocate(request_to_proto(request), timeout=self.wait_s,
                                      wait_for_ready=True).slice
        except grpc.RpcError as e:
            raise AllocateError(request.owner, _rpc_reason(e, self.socket, self.wait_s)) from e

    def release(self, owner: str, bundle: str = "") -> None:
        """Release owner's slice (allocated for `bundle`); failures are left to vgpud's
        reconciler."""
        import grpc

        from arbiter.proto import vgpu_pb2

        try:
            self.stub.Release(vgpu_pb2.ReleaseRequest(owner=owner, bundle=bundle),
                              timeout=_RELEASE_TIMEOUT_S, wait_for_ready=True)
        except grpc.RpcError as e:
            print(f"vgpu: failed to release the slice of {owner}: "
                  f"{_rpc_reason(e, self.socket, _RELEASE_TIMEOUT_S)} "
                  "(vgpud's reconciler frees it)", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()


def give_vgpu(inv: Invocation, store: FileSpec, spec: Spec, environ: Mapping[str, str], *,
              config: Any = None, connect: Callable[[str, float], _Vgpud] = _Vgpud,
              self_paths: Sequence[Path] = ()) -> tuple[str, Callable[[], None] | None]:
    """The vGPU path: validate, allocate, modify and flush the spec.

    Returns the lower runtime's path and a function that releases the slice again
    (for a failed exec); (path, None) with the spec untouched when the exact request
    test finds no request. On any failure after the Allocate, releases the slice.
    vgpud's lifecycle socket runs this too: with the config it has loaded, `connect`
    giving its in-process client, and the compiled runtime's path as `self_paths`.
    """
    from arbiter.config import config_path, load_config
    from arbiter.convert import policy_from_name, priority_from_name
    from oci_hook.request import (
        ANNOTATION_PREFIX,
        INTERNAL_ANNOTATIONS,
        find_request,
        parse_request,
    )
    from shim.modifiers import SliceInfo, for_slice

    config_file = str(config_path(None, environ))
    if config is None:
        config = load_config(Path(config_file))
    lower = find_lower(config.runtime_lower, environ, self_paths=self_paths)
    annotations = spec.get("annotations") or {}
    process = spec.get("process") or {}
    raw = find_request(annotations, process.get("env") or [],
                       allow_env=config.allow_env_requests)
    if raw is None:
        return lower, None
    from_env = not any(k.startswith(ANNOTATION_PREFIX) and k not in INTERNAL_ANNOTATIONS
                       for k in annotations)
    assert inv.container_id is not None
    request = parse_request(raw, owner=inv.container_id, defaults=(
        config.default_compute, priority_from_name(config.default_priority),
        policy_from_name(config.default_policy)))
    # Who asks: the bundle tells this container from another with the same id until its
    # prestart records its init (vgpud refuses an id that another live container holds).
    bundle = str(inv.bundle) if inv.bundle is not None else ""
    request = dataclasses.replace(request, bundle=bundle)
    socket = environ.get("VGPU_SOCKET") or str(config.socket)
    vgpud = connect(socket, config.hook_wait_s)
    try:
        granted = vgpud.allocate(request)
        try:
            vgpus = sorted(granted.vgpus, key=lambda v: v.index)
            info = SliceInfo(id=granted.id, gpu_uuids=tuple(v.gpu_uuid for v in vgpus),
                             device_nodes=tuple(n for v in vgpus for n in v.device_nodes))
            hook = _hook_settings(config_file, environ, config.hook_wait_s)
            for_slice(info, hook, env_request=from_env).modify(spec)
            store.flush(spec)
        except BaseException:
            vgpud.release(inv.container_id, bundle)
            raise
    finally:
        vgpud.close()

    def undo() -> None:
        again = connect(socket, _RELEASE_TIMEOUT_S)
        try:
            again.release(request.owner, bundle)
        finally:
            again.close()
    return lower, undo


def main(argv: Sequence[str] | None = None) -> int:
    """Run vgpu-runtime; returns only on failure (success execs the lower runtime)."""
    from arbiter.errors import VgpuError

    argv = list(sys.argv if argv is None else argv)
    environ = os.environ
    inv = parse_argv(argv)
    try:
        if inv.creates and inv.bundle is not None:
            store = FileSpec.of_bundle(inv.bundle)
            try:
                spec = store.load()
            except SpecError:
                spec = {}   # the lower runtime reports a broken bundle its own way
            if may_request(spec):
                lower, undo = give_vgpu(inv, store, spec, environ)
                try:
                    exec_lower(lower, argv)
                except BaseException:
                    if undo is not None:
                        undo()
                    raise
        exec_lower(find_lower(configured_lower(_config_file(environ)), environ), argv)
    except VgpuError as e:
        report(inv, str(e))
        return 1
    except KeyboardInterrupt:
        return 130
