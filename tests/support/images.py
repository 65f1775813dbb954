# SPDX-License-Identifier: Apache-2.0
"""Test images built locally (no registry is reachable): a minimal glibc rootfs.

The rootfs holds busybox-static as /bin/sh (and its applets), the glibc libraries
that vgpu_probe, libvgpu.so and simgpu need (found with ldd), build/tests/vgpu_probe
and gpu_load in /usr/bin, and simgpu's libcuda.so.1 / libnvidia-ml.so.1 in
/usr/lib/x86_64-linux-gnu (in production the driver's libraries come from
nvidia-container-runtime or CDI, not from vgpu). Three forms, each built once per
test session (per process) and then copied to `dest`:

- build_rootfs(dest)           -> dest, a directory (a runc bundle's rootfs)
- build_tarball(dest)          -> dest, a plain tar of the rootfs (`docker import`)
- build_oci_archive(dest, ref) -> dest, an OCI image layout tar (`ctr images import`)

build_pause_archive(dest, ref) writes the CRI sandbox image the same way: one file,
/pause (tests/support/pause.c, built static), the image's entrypoint.
make_bundle(...) makes a runc bundle around a rootfs.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from support.paths import BUILD, SIMGPU_DIR, TEST_BIN

__all__ = ["BUSYBOX", "PATH_ENV", "build_oci_archive", "build_pause_archive", "build_rootfs",
           "build_tarball", "make_bundle"]

BUSYBOX = Path("/bin/busybox")
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_LIBDIR = "usr/lib/x86_64-linux-gnu"

_lock = threading.RLock()
_cache: dict[str, Path] = {}


def _cache_dir() -> Path:
    if "dir" not in _cache:
        path = Path(tempfile.mkdtemp(prefix="vgpu-images-"))
        atexit.register(shutil.rmtree, path, ignore_errors=True)
        _cache["dir"] = path
    return _cache["dir"]


def _ldd(paths: list[Path]) -> set[str]:
    """Host paths of the shared libraries `paths` need (simgpu's come from build/)."""
    env = dict(os.environ, LD_LIBRARY_PATH=str(SIMGPU_DIR))
    out = subprocess.run(["ldd", *map(str, paths)], env=env, capture_output=True,
                         text=True, check=True).stdout
    libs = set()
    for line in out.splitlines():
        m = re.search(r"(?:=>\s*)?(/\S+)\s+\(0x", line)
        if m and not m.group(1).startswith(str(BUILD)):
            libs.add(m.group(1))
    return libs


def _in_rootfs(host_path: str) -> str:
    """Where a host library goes in the merged-/usr rootfs (lib -> usr/lib, lib64 -> usr/lib64)."""
    rel = host_path.lstrip("/")
    return "usr/" + rel if rel.startswith(("lib/", "lib64/")) else rel


def _make_rootfs(root: Path) -> None:
    if not BUSYBOX.is_file():
        raise FileNotFoundError(f"{BUSYBOX} is missing: apt-get install busybox-static")
    probe, load = TEST_BIN / "vgpu_probe", TEST_BIN / "gpu_load"
    cuda, nvml = SIMGPU_DIR / "libcuda.so.1", SIMGPU_DIR / "libnvidia-ml.so.1"
    for d in ("usr/bin", "usr/sbin", "usr/lib64", _LIBDIR, "etc", "dev", "proc", "sys",
              "tmp", "root", "run", "var/tmp"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for name in ("bin", "sbin", "lib", "lib64"):
        (root / name).symlink_to(f"usr/{name}")
    shutil.copy2(BUSYBOX, root / "usr/bin/busybox")
    applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True,
                             check=True).stdout.split()
    for applet in applets:
        link = root / "usr/bin" / applet
        if applet != "busybox" and not link.exists():
            link.symlink_to("busybox")
    for lib in _ldd([probe, load, BUILD / "libvgpu.so", cuda, nvml]):
        target = root / _in_rootfs(lib)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(lib), target)
    shutil.copy2(probe, root / "usr/bin/vgpu_probe")
    shutil.copy2(load, root / "usr/bin/gpu_load")
    for lib in (cuda, nvml):
        shutil.copy2(lib, root / _LIBDIR / lib.name)
        (root / _LIBDIR / lib.name.removesuffix(".1")).symlink_to(lib.name)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc/group").write_text("root:x:0:\n")
    (root / "etc/ld.so.conf").write_text(f"/{_LIBDIR}\n/usr/lib\n")
    subprocess.run(["ldconfig", "-r", str(root)], check=True)
    (root / "tmp").chmod(0o1777)


def _tar(src: Path, dest: Path) -> None:
    subprocess.run(["tar", "--sort=name", "--numeric-owner", "--owner=0", "--group=0",
                    "--mtime=@0", "-C", str(src), "-cf", str(dest), "."], check=True)


def _cached(kind: str, make: object) -> Path:
    with _lock:
        if kind not in _cache:
            path = _cache_dir() / kind
            make(path)  # type: ignore[operator]
            _cache[kind] = path
        return _cache[kind]


def _rootfs() -> Path:
    def make(path: Path) -> None:
        path.mkdir()
        _make_rootfs(path)
    return _cached("rootfs", make)


def _tarball() -> Path:
    return _cached("rootfs.tar", lambda path: _tar(_rootfs(), path))


def build_rootfs(dest: Path) -> Path:
    """Make `dest` (must not exist) a fresh copy of the test rootfs; returns `dest`."""
    subprocess.run(["cp", "-a", "--reflink=auto", str(_rootfs()), str(dest)], check=True)
    return dest


def build_tarball(dest: Path) -> Path:
    """Write the rootfs as a plain tar at `dest` (for `docker import`); returns `dest`."""
    shutil.copyfile(_tarball(), dest)
    return dest


def _blob(blobs: Path, data: bytes) -> tuple[str, int]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    (blobs / digest.removeprefix("sha256:")).write_bytes(data)
    return digest, len(data)


def _oci_archive(dest: Path, ref: str, layer: bytes, image_config: dict[str, object]) -> Path:
    """Write an OCI image layout tar at `dest`: one uncompressed layer, the given image
    config (Env, Cmd, Entrypoint), named `ref` for `ctr images import`."""
    with tempfile.TemporaryDirectory(prefix="vgpu-oci-") as tmp:
        layout = Path(tmp)
        blobs = layout / "blobs" / "sha256"
        blobs.mkdir(parents=True)
        layer_digest, layer_size = _blob(blobs, layer)
        config = {
            "architecture": "amd64",
            "os": "linux",
            "config": image_config,
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
            "history": [{"created_by": "tests/support/images.py"}],
        }
        config_digest, config_size = _blob(blobs, json.dumps(config).encode())
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": config_digest, "size": config_size},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                        "digest": layer_digest, "size": layer_size}],
        }
        manifest_digest, manifest_size = _blob(blobs, json.dumps(manifest).encode())
        tag = ref.rsplit(":", 1)[1] if ":" in ref.rsplit("/", 1)[-1] else "latest"
        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest, "size": manifest_size,
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {"io.containerd.image.name": ref,
                                "org.opencontainers.image.ref.name": tag},
            }],
        }
        (layout / "index.json").write_text(json.dumps(index))
        (layout / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
        _tar(layout, dest)
    return dest


def build_oci_archive(dest: Path, ref: str) -> Path:
    """Write an OCI image layout tar at `dest` naming the image `ref`; returns `dest`.

    One uncompressed layer (the rootfs), a config with Env PATH and Cmd ["/bin/sh"].
    `ctr images import dest` names it `ref` (annotation io.containerd.image.name); use a
    full reference such as ``docker.io/library/vgpu-test:latest``.
    """
    return _oci_archive(dest, ref, _tarball().read_bytes(),
                        {"Env": [PATH_ENV], "Cmd": ["/bin/sh"]})


def _pause_tar() -> Path:
    def make(path: Path) -> None:
        root = path.with_suffix(".d")
        root.mkdir()
        subprocess.run(["gcc", "-static", "-Os", "-s", "-o", str(root / "pause"),
                        str(Path(__file__).with_name("pause.c"))], check=True)
        _tar(root, path)
    return _cached("pause.tar", make)


def build_pause_archive(dest: Path, ref: str) -> Path:
    """Write the CRI sandbox image (a static /pause, its entrypoint) as an OCI image
    layout tar at `dest` naming it `ref` (the CRI plugin's `sandbox_image`); returns dest."""
    return _oci_archive(dest, ref, _pause_tar().read_bytes(), {"Entrypoint": ["/pause"]})


def make_bundle(bundle: Path, *, args: list[str], env: list[str] | None = None,
                annotations: dict[str, str] | None = None,
                hooks: dict[str, list[dict[str, object]]] | None = None,
                mounts: list[dict[str, object]] | None = None,
                rootfs: Path | None = None, cgroupns: bool = False) -> Path:
    """Make a runc bundle at `bundle` (rootfs: a fresh build_rootfs copy unless given).

    The spec is `runc spec`'s default (no terminal, not read-only) with the given process
    args, env (added after PATH), annotations, hooks and extra mounts; with cgroupns, a
    cgroup namespace of its own, as Docker, containerd's CRI and Podman give a container on
    cgroup v2 (its /sys/fs/cgroup is then its own cgroup). Returns `bundle`.
    """
    bundle.mkdir(parents=True, exist_ok=True)
    if rootfs is None:
        rootfs = build_rootfs(bundle / "rootfs")
    subprocess.run(["runc", "spec", "--bundle", str(bundle)], check=True)
    spec = json.loads((bundle / "config.json").read_text())
    spec["root"] = {"path": os.path.relpath(rootfs, bundle), "readonly": False}
    spec["process"]["terminal"] = False
    spec["process"]["args"] = args
    spec["process"]["env"] = [PATH_ENV, *(env or [])]
    if annotations:
        spec["annotations"] = annotations
    if hooks:
        spec["hooks"] = hooks
    spec["mounts"] += mounts or []
    if cgroupns:
        spec["linux"]["namespaces"].append({"type": "cgroup"})
    (bundle / "config.json").write_text(json.dumps(spec, indent=1))
    return bundle
