# SPDX-License-Identifier: Apache-2.0
"""`vgpu upgrade`: switch a host to this package's version while containers run.

The steps (docs/upgrading.md), each undone in reverse order when a later one fails:

1. install this version's native files under `<lib dir>/<version>-<hash>/` (once;
   arbiter.install.versions), beside the one vgpud serves;
2. switch `<lib dir>/current` to it (atomic: engines exec through it);
3. re-register each engine that is registered and whose registration would change
   (`vgpu install`'s plan: an older registration that named other paths);
4. restart vgpud: `systemctl restart vgpud` when vgpud.service is active, else
   `--restart-command CMD` (run by the shell);
5. wait, at most `--timeout` seconds, for vgpud's Health to report this version serving
   this install;
6. print which containers still run which libvgpu install (`vgpu ls`, column LIBVGPU).

A failure after step 1 rolls back: `current` back, the engines' files back, and, when
vgpud was restarted, vgpud restarted again (`--rollback-command`, default the restart
command) with VGPU_UPGRADE_VERSION naming the version it ran before; then one line says
why. The install made in step 1 stays: vgpud removes it when nothing uses it.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arbiter.errors import VgpuError
from arbiter.install import versions
from arbiter.version import version
from vgpu_cli.client import connect, messages
from vgpu_cli.errors import CliError
from vgpu_cli.paths import resolve_socket

__all__ = ["UNIT", "add_arguments", "cmd_upgrade", "systemd_restart"]

Out = Callable[[str], None]
#: The systemd unit configs/systemd ships.
UNIT = "vgpud.service"
#: How long one restart command may run.
_COMMAND_TIMEOUT_S = 120.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `vgpu upgrade` arguments (--timeout, the common one, bounds the wait)."""
    from shim.install import DEFAULT_BIN_DIR, DEFAULT_FILES

    p.add_argument("--dry-run", action="store_true", help="print the steps, change nothing")
    p.add_argument("--restart-command", metavar="CMD",
                   help="how to restart vgpud (a shell command) when it does not run as "
                        f"systemd's {UNIT} (default there: systemctl restart vgpud)")
    p.add_argument("--rollback-command", metavar="CMD",
                   help="how to restart vgpud on the old version after a failure "
                        "(default: the restart command; $VGPU_UPGRADE_VERSION names the "
                        "version to start, $VGPU_UPGRADE_INSTALL its install)")
    p.add_argument("--lib-dir", metavar="DIR", type=Path,
                   help="where versioned installs live (default: the config's paths.lib_dir)")
    for target, path in DEFAULT_FILES.items():
        p.add_argument(f"--{target}-config", metavar="PATH", type=Path, default=path,
                       help=f"{target}'s registration to update when it has one "
                            f"(default {path})")
    p.add_argument("--bin-dir", metavar="DIR", type=Path, default=DEFAULT_BIN_DIR,
                   help=f"containerd's link directory (default {DEFAULT_BIN_DIR})")


def systemd_restart(run_dir: Path = Path("/run/systemd/system"),
                    systemctl: str | None = None) -> list[str] | None:
    """`systemctl restart vgpud` when systemd runs and vgpud.service is active, else None."""
    systemctl = systemctl or shutil.which("systemctl")
    if systemctl is None or not run_dir.is_dir():
        return None
    p = subprocess.run([systemctl, "is-active", "--quiet", UNIT], capture_output=True,
                       timeout=30, check=False)
    return [systemctl, "restart", UNIT] if p.returncode == 0 else None


@dataclass
class Served:
    """What vgpud's Health says it runs."""

    version: str
    libvgpu: str
    pid_start: float   # monotonic time it has been up since, as this process sees it

    @property
    def install(self) -> str:
        """The install its libvgpu.so lives in (empty: it names none)."""
        return Path(self.libvgpu).parent.name if self.libvgpu else ""


def _health(sock: str, timeout: float) -> Served:
    with connect(sock, timeout) as c:
        h = c.call("Health", messages().HealthRequest())
    return Served(h.version, dict(h.paths).get("libvgpu", ""),
                  time.monotonic() - h.uptime_seconds)


@dataclass
class Upgrade:
    """One upgrade's plan, what it did (for the rollback) and where it prints."""

    sock: str
    lib_dir: Path
    target: versions.Install
    files: Mapping[str, Path]
    restart: Sequence[str] | str
    rollback: Sequence[str] | str
    timeout: float
    out: Out
    engines: list[tuple[str, list[Any]]] = field(default_factory=list)
    undo: list[tuple[str, Callable[[], None]]] = field(default_factory=list)
    before: Served | None = None
    restarted: bool = False

    # ---- the steps ---------------------------------------------------------------------

    def install(self) -> None:
        """Step 1: the versioned install (made once)."""
        made = versions.install(self.lib_dir, self.target.version, self.files)
        if made.name != self.target.name:   # files changed under us: install what is there
            self.target = made

    def switch(self) -> None:
        """Step 2: current -> the new install; its undo switches back (or removes it)."""
        before = versions.switch_current(self.lib_dir, self.target)
        link = self.lib_dir / versions.CURRENT

        def back() -> None:
            if before is None:
                link.unlink(missing_ok=True)
                return
            old = next((i for i in versions.installed(self.lib_dir) if i.name == before), None)
            if old is None:
                raise CliError(f"cannot switch {link} back: {before} is gone")
            versions.switch_current(self.lib_dir, old)
        self.undo.append((f"switch {link} back to {before or '(none)'}", back))

    def register(self) -> None:
        """Step 3: each engine's changed registration; its undo writes the old back."""
        from shim.install import Change, Link, apply

        for target, steps in self.engines:
            for s in steps:
                if not s.changed:
                    continue
                if isinstance(s, Change):
                    undo_step: Any = Change(s.path, s.new, s.old) if s.old is not None else None
                else:
                    undo_step = Link(s.path, s.target, s.old) if s.old is not None else None

                def back(s: Any = s, u: Any = undo_step) -> None:
                    if u is None:
                        Path(s.path).unlink(missing_ok=True)
                    else:
                        apply([u], dry_run=False, out=lambda _t: None)
                self.undo.append((f"{target}: restore {s.path}", back))
                apply([s], dry_run=False, out=self.out)

    def restart_vgpud(self, command: Sequence[str] | str, served: versions.Install | None,
                      version_: str) -> None:
        """Step 4 (and the rollback's): run the restart command."""
        env = dict(os.environ, VGPU_UPGRADE_VERSION=version_,
                   VGPU_UPGRADE_INSTALL=str(served.path) if served else "")
        shell = isinstance(command, str)
        try:
            p = subprocess.run(command, shell=shell, env=env, timeout=_COMMAND_TIMEOUT_S,
                               check=False)
        except subprocess.TimeoutExpired as e:
            raise CliError(f"restart command {_show(command)} did not finish within "
                           f"{_COMMAND_TIMEOUT_S:g}s") from e
        except OSError as e:
            raise CliError(f"cannot run restart command {_show(command)}: "
                           f"{e.strerror or e}") from e
        if p.returncode != 0:
            raise CliError(f"restart command {_show(command)} exited {p.returncode}")

    def wait_serving(self, want_version: str, want_install: str | None, since: float
                     ) -> Served:
        """Step 5: Health from a vgpud started after `since` (monotonic) that reports
        `want_version` (and serves `want_install`), within the timeout."""
        deadline = time.monotonic() + self.timeout
        last = "no answer"
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CliError(f"vgpud at {self.sock} did not report version {want_version} "
                               f"within {self.timeout:g}s ({last})")
            try:
                h = _health(self.sock, min(left, 5.0))
            except CliError as e:
                last = str(e)
                time.sleep(0.1)
                continue
            last = f"it reports {h.version} serving {h.install or h.libvgpu or 'no install'}"
            if (h.pid_start >= since - 1.0 and h.version == want_version
                    and (want_install is None or h.install == want_install)):
                return h
            time.sleep(0.1)

    # ---- the whole -----------------------------------------------------------------------

    def run(self) -> None:
        """Every step; on a failure the rollback, then the failure re-raised."""
        self.install()
        try:
            self.switch()
            self.register()
            t0 = time.monotonic()
            self.restarted = True
            self.restart_vgpud(self.restart, self.target, self.target.version)
            self.wait_serving(self.target.version, self.target.name, t0)
        except (VgpuError, OSError) as e:
            why = str(e) if isinstance(e, VgpuError) else (
                f"{getattr(e, 'filename', '') or ''}: {e.strerror or e}".lstrip(": "))
            raise CliError(f"upgrade to {self.target.version} failed: {why}; "
                           f"{self.roll_back()}") from e

    def roll_back(self) -> str:
        """Undo what was done; the words that say where the host stands."""
        problems = []
        for what, undo in reversed(self.undo):
            try:
                undo()
            except (VgpuError, OSError) as e:
                problems.append(f"{what}: {e}")
        old = self.before
        served = "vgpud was not restarted"
        if self.restarted and old is not None:
            old_install = next((i for i in versions.installed(self.lib_dir)
                                if i.name == old.install), None)
            t0 = time.monotonic()
            try:
                self.restart_vgpud(self.rollback, old_install, old.version)
                h = self.wait_serving(old.version, None, t0)
                served = f"vgpud {h.version} serving"
            except VgpuError as e:
                problems.append(f"restart on {old.version}: {e}")
                served = "vgpud did not come back on the old version"
        current = versions.current(self.lib_dir)
        state = (f"rolled back: {self.lib_dir / versions.CURRENT} -> "
                 f"{current.name if current else '(none)'}, {served}")
        return state + ("; rollback problems: " + "; ".join(problems) if problems else "")


def _show(command: Sequence[str] | str) -> str:
    return repr(command if isinstance(command, str) else " ".join(command))


def _engines(args: argparse.Namespace, lib_dir: Path) -> list[tuple[str, list[Any]]]:
    """The registered engines and the steps that point them at the stable paths."""
    from shim.install import TARGETS, plan, registered

    found = []
    for target in TARGETS:
        config_file = Path(getattr(args, f"{target}_config"))
        if registered(target, config_file):
            found.append((target, plan(target, config_file, lib_dir=lib_dir, switch=False,
                                       bin_dir=args.bin_dir, out=lambda _t: None)))
    return found


def _by_install(slices: Sequence[Any]) -> list[str]:
    """`vgpu ls`'s LIBVGPU column, grouped: one line per install and its containers."""
    groups: dict[str, list[str]] = {}
    for s in slices:
        groups.setdefault(s.libvgpu_version or "(not recorded: an older vgpud's)",
                          []).append(s.owner or s.id)
    if not groups:
        return ["vgpu: no container holds a slice"]
    width = max(len(k) for k in groups)
    return ["vgpu: containers by libvgpu install:"] + [
        f"  {k.ljust(width)}  {len(v)}  {', '.join(sorted(v))}"
        for k, v in sorted(groups.items())]


def cmd_upgrade(args: argparse.Namespace, env: Mapping[str, str], out: Out) -> int:
    """`vgpu upgrade`."""
    from arbiter.native import own_files
    from shim.install import config_lib_dir

    sock = resolve_socket(args, env)
    lib_dir = config_lib_dir(args)
    files = own_files()
    new_version = version()
    name = f"{new_version}-{versions.content_hash(files)}"
    target = versions.Install(lib_dir / name, new_version, name.rsplit("-", 1)[1])
    before = _health(sock, args.timeout)
    restart: Sequence[str] | str | None = args.restart_command or systemd_restart()
    if restart is None:
        raise CliError(f"vgpud does not run as systemd's {UNIT} here: pass "
                       "--restart-command CMD (how to restart it)")
    rollback = args.rollback_command or restart
    current = versions.current(lib_dir)
    engines = _engines(args, lib_dir)
    changed = [(t, [s for s in steps if s.changed]) for t, steps in engines]
    if (before.version == new_version and before.install == name
            and current is not None and current.name == name
            and not any(steps for _, steps in changed)):
        out(f"vgpu: already at {new_version}: vgpud serves {name} and engines run it")
        return 0
    steps = [
        f"install {target.path}" + (" (there already)" if (target.path / versions.MANIFEST)
                                    .is_file() else ""),
        f"switch {lib_dir / versions.CURRENT}: "
        f"{current.name if current else '(none)'} -> {name}",
        *(f"re-register {t}: {s.path}" for t, steps_ in changed for s in steps_),
        f"restart vgpud ({before.version}, serving {before.install or before.libvgpu}): "
        f"{_show(restart)}",
        f"wait up to {args.timeout:g}s for vgpud {new_version} serving {name}",
        "print which containers run which libvgpu install",
    ]
    if args.dry_run:
        for i, step in enumerate(steps, 1):
            out(f"{i}. {step}")
        out("vgpu: dry run: nothing was changed")
        return 0
    up = Upgrade(sock, lib_dir, target, files, restart, rollback, args.timeout, out,
                 engines=engines, before=before)
    up.run()
    out(f"vgpu: upgraded {before.version} -> {new_version}: vgpud serves {up.target.name}, "
        f"engines run {lib_dir / versions.CURRENT} -> {up.target.name}")
    if changed and any(s for _, s in changed):
        from shim.install import RESTART
        for t, s in changed:
            if s:
                out(f"vgpu: {RESTART[t]}")
    with connect(sock, args.timeout) as c:
        slices = c.call("List", messages().ListRequest()).slices
    for line in _by_install(slices):
        out(line)
    return 0
