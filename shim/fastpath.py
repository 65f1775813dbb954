# SPDX-License-Identifier: Apache-2.0
"""The runtime's and the hook's work, done inside vgpud for the compiled programs.

vgpud serves these ops on its lifecycle socket (arbiter.lifecycle). Each one runs
the Python implementation's own functions (shim.runtime.give_vgpu,
oci_hook.main.prepare / plan_for / poststop) against vgpud's in-process stub
(arbiter.service.InProcessStub), with the config the client would have read: the
same decisions, the same one-line errors, without a Python process per container.

    runtime-create  bundle, id, path, self -> exec lower=..., or error
    prestart        phase, state           -> mount (the Plan), ok, or error
    poststop        state                  -> ok, or error
    release         id [state | bundle]    -> ok (a failed exec or mount gives it back;
                                              the container names itself, so another
                                              container's slice with the same id stays)

Every request also names `config` (the file the client would read) and `socket`
($VGPU_SOCKET, or empty for the config's): a client that is not talking about this
vgpud is told to fall back to Python, which reaches the right one.
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from arbiter.config import Config, config_path, load_config
from arbiter.errors import VgpuError
from arbiter.lifecycle import Fields, Op, Reply
from arbiter.service import ArbiterService, InProcessStub

__all__ = ["FastPath"]

log = logging.getLogger("vgpud")

_StatKey = tuple[int, int, int, int] | None


def _stat_key(path: Path) -> _StatKey:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


class FastPath:
    """The lifecycle ops of one vgpud."""

    def __init__(self, service: ArbiterService, own_socket: Path) -> None:
        from oci_hook.request import _validator

        self.stub = InProcessStub(service)
        self.own_socket = Path(own_socket)
        self._configs: dict[str, tuple[_StatKey, Config]] = {}
        self._lock = threading.Lock()
        _validator()  # compile the request schema now, not in the first container's start

    def ops(self) -> dict[str, Op]:
        """Op name -> handler, for arbiter.lifecycle.LifecycleServer."""
        return {"runtime-create": self._guarded(self.runtime_create),
                "prestart": self._guarded(self.prestart),
                "poststop": self._guarded(self.poststop),
                "release": self._guarded(self.release)}

    # -- shared ----------------------------------------------------------------

    @staticmethod
    def _env(req: Fields) -> dict[str, str]:
        """The client's environment as far as the Python path reads it."""
        env = {"VGPU_CONFIG": req.get("config")}
        for key, name in (("socket", "VGPU_SOCKET"), ("path", "PATH")):
            if req.get(key):
                env[name] = req.get(key)
        return {k: v for k, v in env.items() if v}

    def _config(self, env: dict[str, str]) -> Config:
        """The client's config file, loaded once per version of the file."""
        path = config_path(None, env)
        key = _stat_key(path)
        with self._lock:
            cached = self._configs.get(str(path))
        if cached is not None and cached[0] == key and key is not None:
            return cached[1]
        config = load_config(path)
        with self._lock:
            self._configs[str(path)] = (key, config)
        return config

    def _foreign(self, env: dict[str, str], config: Config) -> str | None:
        """Why the client's vgpud is not this one (None: it is)."""
        theirs = env.get("VGPU_SOCKET") or str(config.socket)
        try:
            if os.path.samefile(theirs, self.own_socket):
                return None
        except OSError:
            pass
        return f"the client's vgpud is at {theirs}, this one at {self.own_socket}"

    def _guarded(self, op: Callable[[Fields, dict[str, str], Config], Reply]) -> Op:
        """Load the client's config and check it names this vgpud; errors as one line."""
        def run(req: Fields) -> Reply:
            env = self._env(req)
            try:
                config = self._config(env)
            except VgpuError as e:
                # The Python path may not need the file at all (the hook with
                # $VGPU_SOCKET); where it does, it reports the same error.
                return Reply.fallback(str(e))
            foreign = self._foreign(env, config)
            if foreign:
                return Reply.fallback(foreign)
            try:
                return op(req, env, config)
            except VgpuError as e:
                return Reply.error(str(e))
        return run

    def _hook_client(self, socket: str) -> Any:
        from oci_hook.client import Vgpud

        return Vgpud(socket, stub=self.stub)

    def _release(self, owner: str, pid: int = 0, bundle: str = "") -> None:
        from arbiter.proto import vgpu_pb2

        self.stub.Release(vgpu_pb2.ReleaseRequest(owner=owner, owner_pid=pid, bundle=bundle))

    # -- ops -------------------------------------------------------------------

    def runtime_create(self, req: Fields, env: dict[str, str], config: Config) -> Reply:
        """vgpu-runtime create/run: what shim.runtime.main does on the vGPU path."""
        from shim.args import Invocation
        from shim.errors import SpecError
        from shim.lower import find_lower
        from shim.runtime import _Vgpud, give_vgpu, may_request
        from shim.spec import FileSpec

        bundle, cid = req.get("bundle"), req.get("id")
        if not bundle.startswith("/") or not cid:
            return Reply.fallback("runtime-create needs an absolute bundle and an id")
        self_paths = (Path(req.get("self")),) if req.get("self") else ()
        inv = Invocation(argv=(), command="create", bundle=Path(bundle), container_id=cid)
        store = FileSpec.of_bundle(Path(bundle))
        try:
            spec = store.load()
        except SpecError:
            spec = {}  # the lower runtime reports a broken bundle its own way
        if not may_request(spec):
            return Reply.of("exec", ("lower", find_lower(config.runtime_lower, env,
                                                          self_paths=self_paths)))

        def connect(socket: str, wait_s: float) -> _Vgpud:
            return _Vgpud(socket, wait_s, stub=self.stub)
        lower, undo = give_vgpu(inv, store, spec, env, config=config, connect=connect,
                                self_paths=self_paths)
        return Reply.of("exec", ("lower", lower), undo=undo)

    def prestart(self, req: Fields, env: dict[str, str], config: Config) -> Reply:
        """vgpu-hook prestart/createRuntime: the slice and the mount plan (vgpu-hook mounts)."""
        from oci_hook.main import plan_for, prepare, rollback
        from oci_hook.state import parse_state

        state = parse_state(req.get("state"))
        if state.status == "stopped":  # hooks.d runs one command line for every stage
            return self.poststop(req, env, config)
        p = prepare(state, req.get("phase") or "prestart", env, config=config)
        if p is None:
            return Reply.of("ok")
        client = self._hook_client(p.settings.socket)
        try:
            plan = plan_for(p, client)
        except BaseException:
            rollback(client, p.settings, state)
            raise
        return Reply.of("mount", ("id", state.id), ("pid", str(state.pid)), *plan.to_fields(),
                        undo=lambda: self._release(state.id, state.pid, str(state.bundle)))

    def poststop(self, req: Fields, env: dict[str, str], config: Config) -> Reply:
        """vgpu-hook poststop: release the container's slice."""
        from oci_hook.main import poststop
        from oci_hook.state import parse_state

        poststop(parse_state(req.get("state")), env, config=config, connect=self._hook_client)
        return Reply.of("ok")

    def release(self, req: Fields, env: dict[str, str], config: Config) -> Reply:
        """Give a container's slice back after its exec or mounts failed."""
        from oci_hook.state import parse_state

        cid, pid, bundle = req.get("id"), 0, req.get("bundle")
        if req.get("state"):  # vgpu-hook after a failed mount: the container's OCI state
            state = parse_state(req.get("state"))
            cid, pid, bundle = cid or state.id, state.pid, str(state.bundle)
        if not cid:
            return Reply.error("failed to release the vGPU slice: no container id")
        try:
            self._release(cid, pid, bundle)
        except Exception as e:  # the reconciler frees it; say so in vgpud's log only
            log.warning("lifecycle: failed to release the slice of %s: %s", cid, e)
        return Reply.of("ok")
