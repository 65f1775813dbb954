# SPDX-License-Identifier: Apache-2.0
"""Where the files vgpu ships are: configs/ as the installed package holds it
(arbiter/configs/, copied there by setup.py) or as a source checkout has it.

Every file the code reads at run time (schemas, the default config, the engine
snippets `vgpu install` writes) is found here; no module keeps a text copy.
"""
from __future__ import annotations

from pathlib import Path

from arbiter.errors import ShippedFileNotFoundError

__all__ = ["CONFIGS", "shipped_file"]

#: The files under configs/ that the code reads at run time; setup.py ships each of
#: them (tests/project/test_wheel.py checks the wheel has every one).
CONFIGS = (
    "vgpu.yaml",
    "vgpud.schema.json",
    "request.schema.json",
    "oci-hooks.d/vgpu.json",
    "containerd/vgpu.toml",
    "docker/daemon.json",
    "systemd/vgpud.socket",
    "systemd/vgpud.service",
)

# arbiter/install/shipped.py -> arbiter/, where setup.py puts configs/ in a wheel.
_PACKAGE_DIR = Path(__file__).resolve().parent.parent
# arbiter/ -> the repository root (only meaningful in a checkout).
_CHECKOUT_ROOT = _PACKAGE_DIR.parent


def shipped_file(name: str, package_dir: Path = _PACKAGE_DIR,
                 checkout_root: Path = _CHECKOUT_ROOT) -> Path:
    """configs/`name` from the installed package, else from the source checkout."""
    candidates = [package_dir / "configs" / name, checkout_root / "configs" / name]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise ShippedFileNotFoundError(name, candidates)
