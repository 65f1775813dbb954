#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Install what building and testing vgpu needs; safe to run again (installs only what is missing).
#   Debian packages: gcc, make, libc6-dev (apt-get, only when one is missing);
#                    for the end-to-end tests runc, crun, containerd, docker.io, podman and
#                    busybox-static (an engine counts as present when its command
#                    is on PATH, however it was installed: docker-ce's dockerd will do);
#                    prometheus for tests/e2e/test_prometheus.py (a real server scraping vgpud),
#                    debootstrap for the node image's test base (tests/e2e/test_node_image.py),
#                    systemd for systemd-socket-activate (tests/arbiter/daemon/test_restart.py: vgpud
#                    under systemd's own socket activation; every Debian host but a minimal
#                    image has it)
#   When it installs crun: a containers.conf drop-in that keeps Podman on runc (below)
#   Python packages: the project's runtime dependencies and its `test` extra, read from
#                    pyproject.toml (the tests import the packages from the checkout)
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
DEB_PACKAGES=(gcc make libc6-dev)
# Debian's own python3 is "externally managed" (PEP 668): pip refuses to
# install into it, so the packages go into .venv, which scripts/py prefers.
externally_managed() {
    "$PYTHON" -c 'import os, sys, sysconfig; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else 1)'
}
USE_VENV=0
if [[ -x .venv/bin/python ]] || externally_managed; then
    USE_VENV=1
    DEB_PACKAGES+=(python3-venv)
fi

# command -> Debian package, for the container engines the end-to-end tests drive
# (and the Prometheus server that scrapes vgpud in one of them, and debootstrap, which
# makes the Debian 12 base of the node image in tests/e2e/test_node_image.py; and strace,
# which shows tests/arbiter/files/test_atomic.py the fsyncs a durable write makes).
ENGINE_PACKAGES=(runc:runc crun:crun containerd:containerd ctr:containerd
                 containerd-shim-runc-v2:containerd dockerd:docker.io docker:docker.io
                 podman:podman prometheus:prometheus systemd-socket-activate:systemd
                 debootstrap:debootstrap strace:strace)

deb_installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}
missing=()
for pkg in "${DEB_PACKAGES[@]}"; do
    deb_installed "$pkg" || missing+=("$pkg")
done
for entry in "${ENGINE_PACKAGES[@]}"; do
    cmd=${entry%%:*} pkg=${entry#*:}
    if ! command -v "$cmd" >/dev/null && [[ " ${missing[*]} " != *" $pkg "* ]]; then
        missing+=("$pkg")
    fi
done
# The test images need a static busybox (it is copied into a rootfs without libraries).
if ! deb_installed busybox-static && ! { [[ -x /bin/busybox ]] && file -L /bin/busybox 2>/dev/null | grep -q "statically linked"; }; then
    missing+=(busybox-static)
fi
# Podman (and Buildah) run containers with crun rather than runc once crun is installed,
# unless a containers.conf names the runtime; and Debian 12's crun refuses hosts with hybrid
# cgroups. crun is here for tests/arbiter/slices/test_liveness.py only (the tests that run podman
# name runc), so installing it must not change what a plain `podman run` uses: the runtime
# Podman had before, runc, is pinned in a drop-in (later drop-ins and ~/.config ones still
# override it; /etc/containers/containers.conf does not). Written only when this script
# installs crun and no containers.conf names a runtime.
PODMAN_PIN=/etc/containers/containers.conf.d/10-vgpu-keep-runc.conf
keep_podman_on_runc() {
    local f
    for f in /usr/share/containers/containers.conf /etc/containers/containers.conf \
             /etc/containers/containers.conf.d/*.conf; do
        if [[ -f $f ]] && grep -Eq '^[[:space:]]*runtime[[:space:]]*=' "$f"; then
            echo "install-deps: $f names Podman's runtime: left as it is"
            return 0
        fi
    done
    echo "install-deps: $PODMAN_PIN keeps Podman's default runtime runc (crun is for the tests)"
    "${SUDO[@]}" mkdir -p "$(dirname "$PODMAN_PIN")"
    printf '%s\n' "# Written by vgpu's scripts/install-deps.sh when it installed crun for its tests:" \
        "# Podman would otherwise switch from runc to crun. Delete it to let Podman choose" \
        "# (or before naming a runtime in /etc/containers/containers.conf: this overrides it)." \
        "[engine]" 'runtime = "runc"' | "${SUDO[@]}" tee "$PODMAN_PIN" >/dev/null
}

if ((${#missing[@]})); then
    echo "install-deps: apt-get install ${missing[*]}"
    SUDO=()
    if [[ $(id -u) -ne 0 ]]; then
        command -v sudo >/dev/null || { echo "install-deps: need root or sudo for apt-get" >&2; exit 1; }
        SUDO=(sudo)
    fi
    "${SUDO[@]}" apt-get update -q
    DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
    if [[ " ${missing[*]} " == *" crun "* ]]; then
        keep_podman_on_runc
    fi
else
    echo "install-deps: Debian packages present (${DEB_PACKAGES[*]} runc crun containerd docker.io podman prometheus systemd debootstrap strace busybox-static)"
fi

if ((USE_VENV)); then
    [[ -x .venv/bin/python ]] || { echo "install-deps: python3 -m venv .venv"; "$PYTHON" -m venv .venv; }
    PYTHON=.venv/bin/python
    "$PYTHON" -m pip --version >/dev/null
fi

# One list of Python requirements: pyproject.toml's dependencies + the test extra.
mapfile -t requirements < <("$PYTHON" - <<'PY'
import tomllib
with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
for req in project.get("dependencies", []) + project["optional-dependencies"]["test"]:
    print(req)
PY
)
# Only ask the index when something is missing, so a ready machine works offline.
if "$PYTHON" - "${requirements[@]}" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version
try:
    from packaging.requirements import Requirement
except ImportError:
    sys.exit(1)
for text in sys.argv[1:]:
    req = Requirement(text)
    try:
        if not req.specifier.contains(version(req.name), prereleases=True):
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
PY
then
    echo "install-deps: Python packages present (${requirements[*]})"
else
    echo "install-deps: pip install ${requirements[*]}"
    "$PYTHON" -m pip install -q "${requirements[@]}"
fi
