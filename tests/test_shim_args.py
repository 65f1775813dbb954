# SPDX-License-Identifier: Apache-2.0
"""shim.args: runtime command lines in every shape engines use, good and odd."""
from __future__ import annotations

from pathlib import Path

import pytest

from shim.args import parse_argv

CWD = Path("/work/cwd")


@pytest.mark.parametrize(("argv", "command", "bundle", "cid"), [
    pytest.param(["create", "--bundle", "/b", "c1"], "create", "/b", "c1", id="create-bundle-id"),
    pytest.param(["create", "--bundle=/b", "c1"], "create", "/b", "c1", id="create-bundle-eq"),
    pytest.param(["create", "-b", "/b", "c1"], "create", "/b", "c1", id="create-b"),
    pytest.param(["create", "-b=/b", "c1"], "create", "/b", "c1", id="create-b-eq"),
    pytest.param(["create", "-bundle", "/b", "c1"], "create", "/b", "c1", id="go-single-dash"),
    pytest.param(["run", "-b", "/b", "c1"], "run", "/b", "c1", id="run-b"),
    pytest.param(["run", "--detach", "--bundle", "/b", "c1"], "run", "/b", "c1", id="run-detach"),
    pytest.param(["--bundle", "/b", "create", "c1"], "create", "/b", "c1",
                 id="bundle-before-create"),
    pytest.param(["--root", "R", "--log", "L", "create", "--bundle", "/b", "c1"], "create",
                 "/b", "c1", id="root-log-create"),
    pytest.param(["--root=R", "--log-format", "json", "--systemd-cgroup", "create",
                  "--bundle", "/b", "--pid-file", "/p", "--console-socket", "/s", "c1"],
                 "create", "/b", "c1", id="containerd-shape"),
    pytest.param(["--root", "/run/docker/runtime-runc/moby", "--log", "/x/log.json",
                  "--log-format", "json", "create", "--bundle", "/b", "--pid-file", "/p",
                  "c1"], "create", "/b", "c1", id="docker-shape"),
    pytest.param(["--debug", "--criu", "/usr/sbin/criu", "create", "--no-pivot",
                  "--preserve-fds", "2", "-b", "/b", "c1"], "create", "/b", "c1",
                 id="debug-criu-preserve-fds"),
    pytest.param(["create", "c1"], "create", str(CWD), "c1", id="default-bundle-cwd"),
    pytest.param(["create", "--bundle", "rel", "c1"], "create", str(CWD / "rel"), "c1",
                 id="relative-bundle"),
    pytest.param(["create", "--bundle", "", "c1"], "create", str(CWD), "c1",
                 id="empty-bundle-is-cwd"),
    pytest.param(["create", "--pid-file", "/p", "--", "c1"], "create", str(CWD), "c1",
                 id="double-dash-id"),
    pytest.param(["create", "c1", "--bundle", "/late"], "create", str(CWD), "c1",
                 id="flags-after-id-ignored-like-runc"),
])
def test_create_shapes(argv, command, bundle, cid):
    inv = parse_argv(["vgpu-runtime", *argv], cwd=CWD)
    assert (inv.command, str(inv.bundle), inv.container_id) == (command, bundle, cid)
    assert inv.creates
    assert inv.argv == ("vgpu-runtime", *argv)


@pytest.mark.parametrize(("argv", "command"), [
    pytest.param(["start", "c1"], "start", id="start"),
    pytest.param(["--root", "R", "kill", "c1", "9"], "kill", id="kill"),
    pytest.param(["delete", "--force", "c1"], "delete", id="delete"),
    pytest.param(["--root", "create", "state", "c1"], "state", id="root-value-named-create"),
    pytest.param(["--log", "run", "state", "c1"], "state", id="log-value-named-run"),
    pytest.param(["--version"], None, id="version"),
    pytest.param([], None, id="nothing"),
    pytest.param(["features"], "features", id="features"),
    pytest.param(["exec", "--process", "/p.json", "c1"], "exec", id="exec"),
])
def test_other_commands_do_not_create(argv, command):
    inv = parse_argv(["vgpu-runtime", *argv], cwd=CWD)
    assert inv.command == command
    assert not inv.creates
    assert inv.bundle is None


def test_create_without_id_does_not_create():
    assert not parse_argv(["r", "create", "--bundle", "/b"], cwd=CWD).creates


def test_global_flags_kept_in_order():
    inv = parse_argv(["r", "--root", "R", "--log=L", "--log-format", "json", "--systemd-cgroup",
                      "create", "c1"], cwd=CWD)
    assert inv.global_flags == (("root", "R"), ("log", "L"), ("log-format", "json"),
                                ("systemd-cgroup", None))
    assert inv.global_flag("log") == "L"
    assert inv.global_flag("criu") is None
