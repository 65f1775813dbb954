# SPDX-License-Identifier: Apache-2.0
"""The `vgpu` CLI without vgpud: argument parsing, rendering, JSON shapes, error lines.

Calls go to a small in-test Arbiter servicer on a real unix socket, so the client
side (deadlines, status mapping, release by id then owner) runs for real.
"""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from concurrent import futures

import grpc
import pytest
from support.paths import ROOT
from support.process import clean_env

from arbiter.proto import vgpu_pb2 as pb
from arbiter.proto import vgpu_pb2_grpc
from vgpu_cli import args as cli_args
from vgpu_cli import paths, render, run, supervisor
from vgpu_cli.main import main

Gi, Mi = 1 << 30, 1 << 20
CID = "4f1c9e2a7b3d5e6f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7"


def make_slice(sid="s1", owner=CID, gpus=((0, 2 * Gi, 30, 16 * Mi),), prio=pb.NORMAL,
               policy=pb.FIXED) -> pb.Slice:
    return pb.Slice(
        id=sid, owner=owner, owner_kind="container", owner_pid=42, priority=prio,
        policy=policy, region_dir=f"/run/vgpu/slices/{sid}", created_unix_ms=1700000000000,
        labels={"b": "2", "a": "1"},
        vgpus=[pb.VGpu(index=i, gpu_index=g, gpu_uuid=f"GPU-{g}", memory_bytes=m,
                       compute_percent=c, memory_used_bytes=u,
                       region_path=f"/run/vgpu/slices/{sid}/vgpu{i}")
               for i, (g, m, c, u) in enumerate(gpus)])


DEVICES = [
    pb.Device(index=0, uuid="GPU-0", name="simgpu", memory_total_bytes=16 * Gi,
              memory_allocated_bytes=4 * Gi, memory_used_bytes=12345678,
              compute_allocated_percent=60, slices=2, utilization_percent=7, minor=0,
              driver_version="580.95.05", cuda_version="13.0"),
    pb.Device(index=1, uuid="GPU-1", name="simgpu", memory_total_bytes=16 * Gi),
]


# ---- pure parts ----------------------------------------------------------------

@pytest.mark.parametrize("nbytes,text", [
    (0, "0"), (16 * Gi, "16Gi"), (1536 * Mi, "1536Mi"), (16777216, "16Mi"),
    (12345678, "11.8Mi"), (10**9, "1G"), (5, "5B"), (1000, "1K"), (2 * Gi + 1, "2.0Gi"),
], ids=str)
def test_format_bytes(nbytes, text):
    assert render.format_bytes(nbytes) == text


@pytest.mark.parametrize("owner,short", [
    (CID, CID[:12]), ("sha256:" + CID, CID[:12]), ("abc", "abc"),
    ("run-host-12-ab", "run-host-12-ab"), ("pid:12", "pid:12"),
    ("ABCDEF0123456789", "ABCDEF0123456789"),
], ids=["container", "sha256", "short", "vgpu-run", "pid", "not-lower-hex"])
def test_short_owner(owner, short):
    assert render.short_owner(owner) == short


@pytest.mark.parametrize("argv,checks", [
    (["ls"], {"command": "ls", "json": False, "socket": None, "timeout": 10.0}),
    (["--socket", "/s", "ls", "--json"], {"socket": "/s", "json": True}),
    (["ls", "--socket", "/t"], {"socket": "/t"}),
    (["--socket", "/s", "--timeout", "2.5", "devices"], {"socket": "/s", "timeout": 2.5}),
    (["update", "x", "--memory", "1Gi"], {"id": "x", "memory": Gi, "compute": None}),
    (["update", "x", "--compute", "30"], {"memory": None, "compute": 30}),
    (["release", "abc"], {"target": "abc"}),
    (["run", "--memory", "512", "--", "echo", "--memory", "x"],
     {"memory": 512 * Mi, "cmd": ["echo", "--memory", "x"], "compute": 0, "count": 1,
      "priority": 0, "policy": 0, "devices": []}),
    (["run", "--memory", "1Gi", "--compute", "20", "--count", "2", "--priority", "HIGH",
      "--policy", "burst", "--devices", "0, GPU-1", "-v", "--", "true"],
     {"compute": 20, "count": 2, "priority": pb.HIGH, "policy": pb.BURST,
      "devices": ["0", "GPU-1"], "verbose": True, "cmd": ["true"]}),
    (["run", "--memory", "1", "sleep", "1"], {"cmd": ["sleep", "1"]}),
    (["run", "--priority", "low", "--memory", "1", "--", "x"], {"priority": pb.LOW}),
], ids=["ls", "global-socket", "sub-socket", "timeout", "update-mem", "update-compute",
        "release", "run-dashdash", "run-all", "run-no-dashdash", "run-low"])
def test_parse_ok(argv, checks):
    args = cli_args.parse_args(argv)
    for key, value in checks.items():
        assert getattr(args, key) == value, key


@pytest.mark.parametrize("argv,message", [
    ([], "required"),
    (["frob"], "invalid choice"),
    (["run", "--", "true"], "--memory"),
    (["run", "--memory", "1x", "--", "true"], "invalid memory quantity '1x'"),
    (["run", "--memory", "0", "--", "true"], "invalid memory quantity '0'"),
    (["run", "--memory", "1"], "a command to run is required"),
    (["run", "--memory", "1", "--"], "a command to run is required"),
    (["run", "--memory", "1", "--compute", "1", "--", "x"], "invalid compute quantity '1'"),
    (["run", "--memory", "1", "--compute", "101", "--", "x"], "invalid compute quantity"),
    (["run", "--memory", "1", "--count", "0", "--", "x"], "invalid count '0'"),
    (["run", "--memory", "1", "--priority", "urgent", "--", "x"],
     "invalid priority 'urgent': expected one of low, normal, high"),
    (["run", "--memory", "1", "--policy", "soft", "--", "x"], "invalid policy 'soft'"),
    (["run", "--memory", "1", "--devices", "0,,1", "--", "x"], "invalid devices"),
    (["update", "x"], "nothing to change"),
    (["release"], "required"),
    (["ls", "--timeout", "0"], "invalid timeout '0'"),
    (["ls", "--timeout", "soon"], "invalid timeout"),
], ids=["no-command", "unknown-command", "run-no-memory", "bad-memory", "zero-memory",
        "run-no-cmd", "run-empty-cmd", "compute-low", "compute-high", "count-zero",
        "bad-priority", "bad-policy", "bad-devices", "update-nothing", "release-no-id",
        "timeout-zero", "timeout-word"])
def test_parse_errors_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        cli_args.parse_args(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "usage: vgpu" in err
    assert message in err


def test_render_table_aligns_and_right_justifies():
    text = render.render_table(["A", "NUM"], [["xyz", "1"], ["q", "100"]], right=(1,))
    assert text.splitlines() == ["A     NUM", "xyz     1", "q     100"]


def test_render_devices():
    lines = render.render_devices(DEVICES).splitlines()
    assert lines[0].split() == ["GPU", "UUID", "NAME", "MEMORY", "ALLOCATED", "USED",
                                "COMPUTE", "SLICES", "DRIVER"]
    assert lines[1].split() == ["0", "GPU-0", "simgpu", "16Gi", "4Gi", "11.8Mi", "60%", "2",
                                "580.95.05"]
    assert lines[2].split() == ["1", "GPU-1", "simgpu", "16Gi", "0", "0", "0%", "0", "-"]


def test_render_slices_one_row_per_vgpu():
    s = make_slice(gpus=((0, 2 * Gi, 30, 16 * Mi), (1, 2 * Gi, 30, 0)), prio=pb.HIGH,
                   policy=pb.BURST)
    lines = render.render_slices([s]).splitlines()
    assert lines[0].split() == ["SLICE", "OWNER", "PRIORITY", "POLICY", "VGPU", "GPU",
                                "MEMORY", "COMPUTE", "LIBVGPU"]
    assert lines[1].split() == ["s1", CID[:12], "high", "burst", "0", "0", "16Mi", "/",
                                "2Gi", "30%", "-"]   # made by an older vgpud: unknown
    assert lines[2].split() == ["1", "1", "0", "/", "2Gi", "30%"]
    assert CID not in "\n".join(lines)


def test_render_slices_shows_the_libvgpu_version_each_container_maps():
    s = make_slice(gpus=((0, 2 * Gi, 30, 0),))
    s.libvgpu_version = "0.2.0-35c4b6990777"
    lines = render.render_slices([s]).splitlines()
    assert lines[1].split()[-1] == "0.2.0"
    assert render.slice_to_dict(s)["libvgpu_version"] == "0.2.0-35c4b6990777"


def test_render_slices_names_a_claims_kind_and_owner():
    s = make_slice(owner="0b7e3c52-9f1a-4d1e-8a3b-2c4d5e6f7a8b",
                   gpus=((1, 4 * Gi, 20, 0), (0, Gi, 10, 0)))
    s.owner_kind = "claim"
    lines = render.render_slices([s]).splitlines()
    assert lines[1].split() == ["s1", "claim:0b7e3c52-9f1a-4d1e-8a3b-2c4d5e6f7a8b", "normal",
                                "fixed", "0", "1", "0", "/", "4Gi", "20%", "-"]
    assert lines[2].split() == ["1", "0", "0", "/", "1Gi", "10%"]


def test_render_smi_fits_100_columns():
    slices = [make_slice("a" * 32, gpus=((0, 2 * Gi, 30, Gi),)),
              make_slice("b", owner="run-a-very-long-hostname-123456-deadbeef",
                         gpus=((0, 2 * Gi, 30, 0), (1, 1536 * Mi, 100, 1536 * Mi)))]
    text = render.render_smi(DEVICES, slices, "0.1.0")
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert "vgpud 0.1.0" in text and "2 GPUs   2 slices" in text
    assert "GPU 0  simgpu" in text and "GPU 1  simgpu" in text
    assert "11.8Mi used / 4Gi allocated / 16Gi" in text
    assert "7% used / 60% allocated" in text
    assert "    1Gi / 2Gi     [#####.....]" in text
    assert " 1536Mi / 1536Mi  [##########]" in text
    # Slice b appears under both of its GPUs; the box's right edge is aligned.
    assert text.count("run-a-very-lo~") == 2
    boxed = [line for line in lines if line.startswith("|")]
    assert {len(line) for line in boxed} == {96}


def test_render_smi_empty():
    text = render.render_smi([], [])
    assert "no GPUs" in text and "0 GPUs   0 slices" in text


def test_slice_and_device_json_shapes():
    d = render.slice_to_dict(make_slice())
    assert d["owner"] == CID and d["priority"] == "normal" and d["policy"] == "fixed"
    assert d["vgpus"][0]["memory_bytes"] == 2 * Gi  # an int, not protobuf's string
    assert list(d["labels"]) == ["a", "b"]
    assert json.loads(render.dump_json(d)) == d
    dd = render.device_to_dict(DEVICES[0])
    assert dd["memory_used_bytes"] == 12345678 and dd["utilization_percent"] == 7


def test_child_env_prepends_preload_and_sets_region_dir():
    env = supervisor.child_env({"LD_PRELOAD": "/x.so", "A": "b"}, "/lib/libvgpu.so", "/r/s1")
    assert env == {"LD_PRELOAD": "/lib/libvgpu.so:/x.so", "A": "b", "VGPU_REGION_DIR": "/r/s1"}
    env = supervisor.child_env({"CUDA_VISIBLE_DEVICES": "3"}, "/l.so", "/r", ["GPU-b", "GPU-a"])
    assert env["LD_PRELOAD"] == "/l.so" and env["CUDA_VISIBLE_DEVICES"] == "GPU-b,GPU-a"
    assert "VGPU_SCHED_DIR" not in env  # an older vgpud names none: the user's value stays
    mine = {"VGPU_SCHED_DIR": "/mine"}
    env = supervisor.child_env(mine, "/l.so", "/r", sched_dir="/run/vgpu/sched")
    assert env["VGPU_SCHED_DIR"] == "/run/vgpu/sched"
    assert supervisor.child_env(mine, "/l.so", "/r")["VGPU_SCHED_DIR"] == "/mine"


def test_run_owner_is_unique_and_names_host_and_pid():
    a, b = run.run_owner(pid=7, host="h"), run.run_owner(pid=7, host="h")
    assert a.startswith("run-h-7-") and a != b


@pytest.mark.parametrize("status,code", [(0, 0), (3 << 8, 3), (signal.SIGKILL, 137),
                                         (signal.SIGTERM, 143)], ids=str)
def test_exit_status(status, code):
    assert supervisor.exit_status(status) == code


def test_resolve_socket_order(tmp_path):
    args = cli_args.parse_args(["ls"])
    none = str(tmp_path / "absent.yaml")
    assert paths.resolve_socket(args, {"VGPU_CONFIG": none}) == paths.DEFAULT_SOCKET
    assert paths.resolve_socket(args, {"VGPU_SOCKET": "/e", "VGPU_CONFIG": none}) == "/e"
    args = cli_args.parse_args(["ls", "--socket", "/f"])
    assert paths.resolve_socket(args, {"VGPU_SOCKET": "/e"}) == "/f"


# ---- against an in-test servicer on a real unix socket --------------------------

class FakeArbiter(vgpu_pb2_grpc.ArbiterServicer):
    def __init__(self) -> None:
        self.slices: dict[str, pb.Slice] = {"s1": make_slice()}
        self.requests: list[object] = []
        self.delay = 0.0

    def Devices(self, request, context):  # noqa: N802 - gRPC names
        time.sleep(self.delay)
        return pb.DevicesResponse(devices=DEVICES)

    def List(self, request, context):  # noqa: N802 - gRPC names
        return pb.ListResponse(slices=list(self.slices.values()))

    def Health(self, request, context):  # noqa: N802 - gRPC names
        return pb.HealthResponse(status="ok", version="9.9", devices=2,
                                 slices=len(self.slices), uptime_seconds=3.25,
                                 paths={"run_dir": "/run/vgpu", "state_dir": "/var/lib/vgpu"})

    def Release(self, request, context):  # noqa: N802 - gRPC names
        self.requests.append(request)
        for sid, s in list(self.slices.items()):
            if request.id == sid or (request.owner and request.owner == s.owner):
                del self.slices[sid]
                return pb.ReleaseResponse(released=True, id=sid)
        return pb.ReleaseResponse(released=False)

    def Update(self, request, context):  # noqa: N802 - gRPC names
        self.requests.append(request)
        s = self.slices.get(request.id)
        if s is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no slice {request.id}")
        if request.memory_bytes > 16 * Gi:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          "failed to update slice s1: GPU 0 has\nonly 12Gi free")
        for v in s.vgpus:
            v.memory_bytes = request.memory_bytes or v.memory_bytes
            v.compute_percent = request.compute_percent or v.compute_percent
        return s


@pytest.fixture
def fake(tmp_path):
    path = tmp_path / "vgpud.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    servicer = FakeArbiter()
    vgpu_pb2_grpc.add_ArbiterServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix:{path}")
    server.start()
    servicer.socket = str(path)
    yield servicer
    server.stop(0)


def vgpu(fake_or_socket, *argv, capsys):
    sock = fake_or_socket if isinstance(fake_or_socket, str) else fake_or_socket.socket
    code = main(["--socket", sock, *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_devices_table_and_json(fake, capsys):
    code, out, _ = vgpu(fake, "devices", capsys=capsys)
    assert code == 0 and out.splitlines()[1].split()[:2] == ["0", "GPU-0"]
    code, out, _ = vgpu(fake, "devices", "--json", capsys=capsys)
    assert code == 0 and [d["index"] for d in json.loads(out)] == [0, 1]


def test_ls_json_has_full_owner(fake, capsys):
    code, out, _ = vgpu(fake, "ls", "--json", capsys=capsys)
    assert code == 0 and json.loads(out)[0]["owner"] == CID
    code, out, _ = vgpu(fake, "ls", capsys=capsys)
    assert CID[:12] in out and CID not in out


def test_smi(fake, capsys):
    code, out, _ = vgpu(fake, "smi", capsys=capsys)
    assert code == 0 and "vgpud 9.9" in out and "s1" in out
    code, out, _ = vgpu(fake, "smi", "--json", capsys=capsys)
    assert set(json.loads(out)) == {"devices", "slices"}


def test_release_by_id_then_by_owner(fake, capsys):
    code, out, _ = vgpu(fake, "release", CID, capsys=capsys)
    assert code == 0 and out.strip() == "released slice s1"
    assert [(r.id, r.owner) for r in fake.requests] == [(CID, ""), ("", CID)]
    code, _, err = vgpu(fake, "release", "s1", capsys=capsys)
    assert code == 1
    assert err == "vgpu: failed to release slice s1: no slice has this id or owner\n"


def test_update_sends_only_what_changes(fake, capsys):
    code, out, _ = vgpu(fake, "update", "s1", "--compute", "50", "--json", capsys=capsys)
    assert code == 0 and json.loads(out)["vgpus"][0]["compute_percent"] == 50
    assert (fake.requests[-1].memory_bytes, fake.requests[-1].compute_percent) == (0, 50)


def test_server_error_is_one_line(fake, capsys):
    code, _, err = vgpu(fake, "update", "s1", "--memory", "20Gi", capsys=capsys)
    assert code == 1
    assert err == "vgpu: failed to update slice s1: GPU 0 has only 12Gi free\n"
    code, _, err = vgpu(fake, "update", "nope", "--memory", "1Gi", capsys=capsys)
    assert (code, err) == (1, "vgpu: no slice nope\n")


def test_deadline(fake, capsys):
    fake.delay = 2
    code, _, err = vgpu(fake, "--timeout", "0.2", "devices", capsys=capsys)
    assert code == 1 and err.startswith("vgpu: vgpud at ") and "within 0.2s" in err


def test_info_reports_daemon(fake, capsys):
    code, out, _ = vgpu(fake, "info", "--json", capsys=capsys)
    info = json.loads(out)
    assert code == 0 and info["socket"] == fake.socket
    assert info["vgpud"]["reachable"] and info["vgpud"]["version"] == "9.9"
    assert info["vgpud"]["paths"] == {"run_dir": "/run/vgpu", "state_dir": "/var/lib/vgpu"}
    assert info["libvgpu"] == str(ROOT / "build" / "libvgpu.so")
    assert info["vgpu_runtime"] == str(ROOT / "build" / "bin" / "vgpu-runtime")
    assert info["vgpu_hook"] == str(ROOT / "build" / "bin" / "vgpu-hook")
    assert info["containerd_shim_vgpu_v2"] == str(ROOT / "build" / "bin" /
                                                  "containerd-shim-vgpu-v2")
    assert info["lifecycle_socket"] == f"{fake.socket}.lifecycle"


# ---- no daemon -----------------------------------------------------------------

def test_no_socket(tmp_path, capsys):
    sock = str(tmp_path / "none.sock")
    code, out, err = vgpu(sock, "ls", capsys=capsys)
    assert (code, out) == (1, "")
    assert err == (f"vgpu: cannot reach vgpud at {sock}: no such socket (is vgpud running? "
                   "start it with 'vgpud' or pass --socket)\n")


def test_not_a_socket(tmp_path, capsys):
    path = tmp_path / "file"
    path.write_text("")
    code, _, err = vgpu(str(path), "devices", capsys=capsys)
    assert code == 1 and ": not a socket (is vgpud running?" in err


def test_socket_nobody_listens(tmp_path, capsys):
    path = str(tmp_path / "dead.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.close()  # the file stays, nothing listens: a crashed vgpud
    code, _, err = vgpu(path, "ls", capsys=capsys)
    assert code == 1 and err.startswith(f"vgpu: cannot reach vgpud at {path}: ")
    assert err.count("\n") == 1


def test_run_without_daemon_runs_nothing(tmp_path, capsys):
    marker = tmp_path / "ran"
    code, _, err = vgpu(str(tmp_path / "none.sock"), "run", "--memory", "1", "--",
                        "touch", str(marker), capsys=capsys)
    assert code == 1 and "no such socket" in err and not marker.exists()


def test_info_without_daemon(tmp_path, capsys):
    code, out, _ = vgpu(str(tmp_path / "none.sock"), "info", capsys=capsys)
    assert code == 0
    assert "libvgpu.so" in out and "not reachable: no such socket" in out


def test_module_entry_point_and_usage_exit_code(tmp_path):
    env = clean_env()
    p = subprocess.run([sys.executable, "-m", "vgpu_cli", "--socket",
                        str(tmp_path / "x"), "ls"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 1 and p.stderr.startswith("vgpu: cannot reach vgpud") and not p.stdout
    p = subprocess.run([sys.executable, "-m", "vgpu_cli", "bogus"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "usage: vgpu" in p.stderr


def test_closed_stdout_pipe_is_quiet(fake):
    # `vgpu devices | head -0`: no traceback.
    env = clean_env()
    p = subprocess.run(f"{sys.executable} -m vgpu_cli --socket {fake.socket} devices "
                       "| head -c0", shell=True, cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=30)
    assert "Traceback" not in p.stderr

