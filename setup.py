# SPDX-License-Identifier: Apache-2.0
"""Build hook: compile libvgpu.so and the compiled vgpu-runtime / vgpu-hook with make and
ship them inside the arbiter package (arbiter/native/, arbiter/native/bin/)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py
from setuptools.errors import ExecError

ROOT = Path(__file__).resolve().parent
LIBRARY = "build/libvgpu.so"  # the Makefile target, relative to ROOT
PACKAGED = ("arbiter", "native", "libvgpu.so")  # where arbiter.native.libvgpu_path looks
# The fast path (arbiter.native.program_path looks in arbiter/native/bin/).
PROGRAMS = ("build/bin/vgpu-runtime", "build/bin/vgpu-hook", "build/bin/vgpu-broker")
PROGRAM_DIR = ("arbiter", "native", "bin")
# configs/ files an installed vgpud reads (arbiter.config.schema_path looks in arbiter/configs/).
CONFIG_FILES = ("vgpud.schema.json", "vgpu.yaml", "request.schema.json")


def make_libvgpu() -> Path:
    """Run `make build/libvgpu.so` (and the programs) in the source tree; the library's path."""
    try:
        subprocess.run(["make", "-C", str(ROOT), LIBRARY, *PROGRAMS], check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise ExecError(f"failed to build libvgpu.so: {e} (needs gcc and make)") from e
    return ROOT / LIBRARY


class build_py_with_libvgpu(build_py):  # noqa: N801 - setuptools command naming
    """build_py that also builds libvgpu.so and copies it in as package data."""

    def run(self) -> None:
        """Build the Python files, then the library."""
        super().run()
        library = make_libvgpu()
        # Editable installs find the checkout's build/libvgpu.so instead.
        if not self.editable_mode:
            target = Path(self.build_lib, *PACKAGED)
            target.parent.mkdir(parents=True, exist_ok=True)
            self.copy_file(str(library), str(target))
            configs = Path(self.build_lib, "arbiter", "configs")
            configs.mkdir(parents=True, exist_ok=True)
            for name in CONFIG_FILES:
                self.copy_file(str(ROOT / "configs" / name), str(configs / name))
            bindir = Path(self.build_lib, *PROGRAM_DIR)
            bindir.mkdir(parents=True, exist_ok=True)
            for program in PROGRAMS:
                self.copy_file(str(ROOT / program), str(bindir / Path(program).name))
            # The programs' Python fallback runs the interpreter building this (pip
            # builds with the interpreter it installs into); $VGPU_PYTHON overrides it.
            (bindir / "vgpu-python").write_text(sys.executable + "\n", encoding="utf-8")

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        """Declare the copied library and config files among the outputs."""
        outputs = list(super().get_outputs(include_bytecode))
        if not self.editable_mode:
            outputs.append(str(Path(self.build_lib, *PACKAGED)))
            outputs += [str(Path(self.build_lib, "arbiter", "configs", n)) for n in CONFIG_FILES]
            outputs += [str(Path(self.build_lib, *PROGRAM_DIR, n)) for n in
                        (*(Path(p).name for p in PROGRAMS), "vgpu-python")]
        return outputs


class NativeDistribution(Distribution):
    """A distribution that ships a native library, so wheels are platform-specific."""

    def has_ext_modules(self) -> bool:
        """Yes: libvgpu.so (whole package goes to platlib, never split across lib dirs)."""
        return True


class platform_wheel(bdist_wheel):  # noqa: N801 - setuptools command naming
    """Tag the wheel for this platform (it holds a native library), any Python 3."""

    def get_tag(self) -> tuple[str, str, str]:
        """py3-none-<platform>: libvgpu.so does not link against Python."""
        _, _, platform = super().get_tag()
        return "py3", "none", platform


setup(
    distclass=NativeDistribution,
    cmdclass={"build_py": build_py_with_libvgpu, "bdist_wheel": platform_wheel},
)
