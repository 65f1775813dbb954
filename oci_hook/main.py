# SPDX-License-Identifier: Apache-2.0
"""vgpu-hook: the OCI hook entry point; `vgpu-hook prestart|createRuntime|poststop`.

Phases (runtime-spec config.md#posix-platform-hooks; runc runs both in the runtime's
namespaces while the container's init waits, before pivot_root):

- ``prestart`` (Podman/CRI-O hooks.d) or its modern twin ``createRuntime``: get the
  container's slice from vgpud and mount it into the rootfs. Configure one of the two
  per container, not both (a second run finds its mounts made and changes nothing).
- ``poststop`` (or any phase whose state says "stopped": hooks.d runs the same
  command line for each of its stages): release the slice. vgpud down is not an
  error here: its reconciler frees slices of containers that are gone.

The OCI state comes on stdin. A container without request keys exits 0 without a word
and without importing gRPC. Any failure prints exactly one line on stderr (the engine
shows it to the user) and exits 1, after releasing what was allocated.
"""
from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from oci_hook.errors import HookError, StateError, VgpudError
from oci_hook.request import ENV_KEYS, ENV_REQUESTS_ANNOTATION, SLICE_ANNOTATION, find_request
from oci_hook.state import HookState, Spec, load_spec, parse_state

if TYPE_CHECKING:
    from arbiter.config import Config
    from arbiter.model import Request
    from oci_hook.client import SliceView, Vgpud
    from oci_hook.mounts import Plan

__all__ = ["PHASES", "Prestart", "main", "plan_for", "poststop", "prepare", "rollback", "run"]

#: The generated ld.so.preload in the bundle (oci_hook.mounts.PRELOAD_HOST_NAME; not
#: imported from there: poststop without a request must stay cheap).
PRELOAD_HOST_NAME = "vgpu-ld.so.preload"

PRESTART = "prestart"
CREATE_RUNTIME = "createRuntime"
POSTSTOP = "poststop"
PHASES = (PRESTART, CREATE_RUNTIME, POSTSTOP)
USAGE = "usage: vgpu-hook prestart|createRuntime|poststop  (the OCI state on stdin)"

_DEFAULT_WAIT_S = 10.0    # Config.hook_wait_s's default, used before the config is read
_POSTSTOP_WAIT_S = 5.0    # poststop delays the container's removal: wait less
_MOUNT_TIMEOUT_S = 10.0


class _Settings:
    """Socket and waits: $VGPU_SOCKET, else the config, read only when needed (it costs)."""

    def __init__(self, env: Mapping[str, str], timeouts: Sequence[int],
                 config: Config | None = None) -> None:
        self.env = env
        self._config: Config | None = config
        # Stay inside the runtime's hook timeout (runc kills the hook when it passes).
        self.cap = min(timeouts) * 0.75 if timeouts else float("inf")

    @property
    def config(self) -> Config:
        if self._config is None:
            from arbiter.config import config_path, load_config

            self._config = load_config(config_path(None, self.env))
        return self._config

    @property
    def socket_from_env(self) -> bool:
        return bool(self.env.get("VGPU_SOCKET"))

    @property
    def socket(self) -> str:
        return self.env.get("VGPU_SOCKET") or str(self.config.socket)

    def wait_s(self, most: float = float("inf")) -> float:
        return min(self.config.hook_wait_s, most, self.cap)


def _call(settings: _Settings, fn: Any, most: float = float("inf")) -> Any:
    """fn(timeout=, wait=) with the bounded wait for vgpud.

    With $VGPU_SOCKET a first try does not wait for vgpud: when it answers (the usual
    case) the config is never read. When it is not up, the wait the config allows.
    """
    if settings.socket_from_env:
        try:
            return fn(timeout=min(_DEFAULT_WAIT_S, most, settings.cap), wait=False)
        except VgpudError as e:
            if not e.unavailable:
                raise
    return fn(timeout=settings.wait_s(most), wait=True)


def _request(state: HookState, spec: Spec | None,
             settings: _Settings) -> tuple[dict[str, str] | None, dict[str, str]]:
    """(the raw request or None, the annotations)."""
    annotations = {**(spec.annotations if spec else {}), **state.annotations}
    env = spec.env if spec else ()
    raw = find_request(annotations, env, allow_env=False)
    if raw is None and any(item.partition("=")[0] in ENV_KEYS for item in env):
        # Env requests: allowed where vgpu-runtime said it checked the config, else by
        # the config itself (an image can carry env the scheduler never saw).
        allow = (annotations.get(ENV_REQUESTS_ANNOTATION) == "allowed"
                 or settings.config.allow_env_requests)
        raw = find_request(annotations, env, allow_env=allow)
    return raw, annotations


@dataclass(frozen=True)
class Prestart:
    """A prestart with a request: what the slice and the mounts are decided from."""

    state: HookState
    spec: Spec
    settings: _Settings
    raw: dict[str, str]
    annotations: Mapping[str, str]
    req: Request | None   # parsed up front unless the runtime's slice id is there


def prepare(state: HookState, phase: str, env: Mapping[str, str], *,
            config: Config | None = None) -> Prestart | None:
    """Read the spec and the request; None when the container asks for no vGPU."""
    spec = load_spec(state.bundle)
    settings = _Settings(env, spec.hook_timeouts.get(phase, ()), config)
    raw, annotations = _request(state, spec, settings)
    if raw is None:
        return None
    if state.pid <= 0:
        raise StateError("the OCI state on stdin",
                         f"no container pid (run vgpu-hook as a {PRESTART} or "
                         f"{CREATE_RUNTIME} hook)")
    # A bad request fails before anything starts; with the runtime's slice id it was
    # checked already (and most likely is not needed).
    req = None if annotations.get(SLICE_ANNOTATION) else _parse(raw, state)
    return Prestart(state, spec, settings, raw, annotations, req)


def plan_for(p: Prestart, client: Vgpud) -> Plan:
    """The container's slice (allocated, or the one it has) and the mounts that give it.

    On failure the caller releases (rollback): the Allocate may have succeeded.
    """
    from arbiter.native import libvgpu_path
    from oci_hook.mounts import plan_mounts

    s = _slice(client, p.settings, p.state, p.raw, p.annotations, p.req)
    return plan_mounts(s, rootfs=p.spec.rootfs, libvgpu=libvgpu_path(),
                       preload_host=p.state.bundle / PRELOAD_HOST_NAME)


def prestart(state: HookState, phase: str, env: Mapping[str, str]) -> int:
    """Give the container its slice: allocate (or find) it, then mount it."""
    p = prepare(state, phase, env)
    if p is None:
        return 0
    from oci_hook.mounts import MountHelper

    # Fork first, while this process has one thread (gRPC starts more).
    helper = MountHelper.start(state.pid)
    client: Vgpud | None = None
    try:
        from oci_hook.client import Vgpud

        client = Vgpud(p.settings.socket)
        plan = plan_for(p, client)
        helper.apply(plan, timeout=min(_MOUNT_TIMEOUT_S, p.settings.cap))
    except BaseException:
        helper.abort()
        if client is not None:
            rollback(client, p.settings, state)
        raise
    finally:
        if client is not None:
            client.close()
    return 0


def _parse(raw: dict[str, str], state: HookState) -> Request:
    import dataclasses

    from arbiter.model import Policy, Priority
    from oci_hook.request import parse_request

    # 0 / NORMAL / FIXED stand in for "not given": allocate() sends unspecified for
    # the keys the request lacks, so vgpud applies its own (live) config defaults.
    req = parse_request(raw, owner=state.id, owner_pid=state.pid,
                        defaults=(0, Priority.NORMAL, Policy.FIXED))
    return dataclasses.replace(req, bundle=str(state.bundle))


def _slice(client: Vgpud, settings: _Settings, state: HookState, raw: dict[str, str],
           annotations: Mapping[str, str], req: Request | None) -> SliceView:
    """The slice vgpu-runtime allocated (vgpu.io/slice, checked to be ours), else Allocate.

    Either way vgpud records this container's init with the slice (its liveness), and
    refuses when another live container holds the id's slice."""
    slice_id = annotations.get(SLICE_ANNOTATION)
    if slice_id:
        try:
            s: SliceView = _call(settings, lambda **kw: client.attach(
                slice_id, state.id, state.pid, str(state.bundle), **kw))
            if s.owner == state.id:
                return s
        except VgpudError as e:
            if not e.not_found:
                raise
    if req is None:
        req = _parse(raw, state)
    given = frozenset(raw)
    allocated: SliceView = _call(settings, lambda **kw: client.allocate(req, given, **kw))
    return allocated


def rollback(client: Vgpud, settings: _Settings, state: HookState) -> None:
    """Release the container's slice after a failed prestart; best effort, bounded.

    The container names itself: another live container's slice (the same id, refused
    at Allocate) stays with it."""
    # On failure the reconciler frees it once the container is gone.
    with contextlib.suppress(VgpudError):
        client.release(state.id, timeout=min(2.0, settings.cap), wait=False, pid=state.pid,
                       bundle=str(state.bundle))


def poststop(state: HookState, env: Mapping[str, str], *, config: Config | None = None,
             connect: Callable[[str], Vgpud] | None = None) -> int:
    """Release the container's slice; vgpud down: say so and succeed.

    vgpud's lifecycle socket runs this too, with its config and in-process client.
    """
    try:
        spec: Spec | None = load_spec(state.bundle)
    except StateError:
        spec = None  # the bundle may be gone: the state's annotations still tell
    settings = _Settings(env, spec.hook_timeouts.get(POSTSTOP, ()) if spec else (), config)
    raw, annotations = _request(state, spec, settings)
    if raw is None and SLICE_ANNOTATION not in annotations:
        return 0
    with contextlib.suppress(OSError):
        (state.bundle / PRELOAD_HOST_NAME).unlink(missing_ok=True)
    if connect is None:
        from oci_hook.client import Vgpud

        connect = Vgpud
    client = connect(settings.socket)
    try:
        # The container names itself (its bundle; runc's stopped state has no pid): a
        # slice that another container with the same id holds is not released.
        _call(settings, lambda **kw: client.release(state.id, pid=state.pid,
                                                    bundle=str(state.bundle), **kw),
              most=_POSTSTOP_WAIT_S)
    except VgpudError as e:
        if not e.unavailable:
            raise
        print(f"vgpu: {e}; the reconciler will release the slice of {state.id}",
              file=sys.stderr)
    finally:
        client.close()
    return 0


def run(phase: str, stdin: bytes, env: Mapping[str, str]) -> int:
    """Run one phase; HookError propagates to main."""
    state = parse_state(stdin)
    # hooks.d (Podman, CRI-O) runs one command line for every stage it lists: the
    # state's status tells poststop ("stopped") from prestart ("created").
    if phase == POSTSTOP or state.status == "stopped":
        return poststop(state, env)
    return prestart(state, phase, env)


def main(argv: Sequence[str] | None = None, *, fast_exit: bool = True) -> int:
    """Entry point of `vgpu-hook`: one phase argument, the OCI state on stdin.

    With `fast_exit`, a run that used gRPC ends with os._exit: tearing down gRPC and
    the interpreter costs ~15 ms, and the hook's time counts in every container start.
    """
    code = _main(sys.argv[1:] if argv is None else list(argv))
    if fast_exit and "grpc" in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _main(args: list[str]) -> int:
    if len(args) != 1 or args[0] not in PHASES:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        return run(args[0], sys.stdin.buffer.read(), os.environ)
    except HookError as e:
        print(f"vgpu: {e}", file=sys.stderr)
    except Exception as e:  # the engine shows one line, never a traceback
        from arbiter.errors import VgpuError

        kind = "" if isinstance(e, VgpuError) else f"internal error: {type(e).__name__}: "
        print(" ".join(f"vgpu: {kind}{e}".split()), file=sys.stderr)
    return 1
