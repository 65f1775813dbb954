# SPDX-License-Identifier: Apache-2.0
"""Build hook: compile libvgpu.so and the programs with make and ship them, with the
configs/ files the code reads at run time, inside the arbiter package:
arbiter/native/libvgpu.so, arbiter/native/bin/<program>, arbiter/configs/<file>."""
from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py
from setuptools.errors import ExecError

ROOT = Path(__file__).resolve().parent
#: Each library's Makefile target (relative to ROOT) and where arbiter.native looks for
#: it in the package: libvgpu.so (containers) and libvgpu-fileops.so (vgpud's own).
LIBRARIES = (("build/libvgpu.so", ("arbiter", "native", "libvgpu.so")),
             ("build/libvgpu-fileops.so", ("arbiter", "native", "libvgpu-fileops.so")))
PROGRAM_DIR = ("arbiter", "native", "bin")      # where arbiter.native.program_path looks
CONFIG_DIR = ("arbiter", "configs")             # where arbiter.install.shipped.shipped_file looks


def _tuple(module: str, name: str) -> tuple[str, ...]:
    """The string tuple `name` of a package module, read without importing the package
    (it is being built): the one list of what to ship stays in the code that finds it."""
    tree = ast.parse((ROOT / module).read_text(encoding="utf-8"))
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            value = ast.literal_eval(node.value)
            return tuple(str(v) for v in value)
    raise ExecError(f"failed to read {name} from {module}")


PROGRAMS = _tuple("arbiter/native/__init__.py", "PROGRAMS")  # e.g. vgpu-hook, shim/runc
CONFIGS = _tuple("arbiter/install/shipped.py", "CONFIGS")            # e.g. oci-hooks.d/vgpu.json


def make() -> None:
    """Run make for the library and every program in the source tree."""
    targets = [lib for lib, _ in LIBRARIES] + [f"build/bin/{p}" for p in PROGRAMS]
    try:
        subprocess.run(["make", "-C", str(ROOT), *targets], check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise ExecError(f"failed to build the libraries and the programs: {e} "
                        "(needs gcc and make)") from e


def _shipped() -> list[tuple[Path, tuple[str, ...]]]:
    """(source, destination parts under build_lib) of every file the build adds."""
    files = [(ROOT / lib, parts) for lib, parts in LIBRARIES]
    files += [(ROOT / "build" / "bin" / p, (*PROGRAM_DIR, *p.split("/"))) for p in PROGRAMS]
    files += [(ROOT / "configs" / c, (*CONFIG_DIR, *c.split("/"))) for c in CONFIGS]
    return files


class build_py_with_native(build_py):  # noqa: N801 - setuptools command naming
    """build_py that also builds the native parts and copies them and configs/ in."""

    def run(self) -> None:
        """Build the Python files, then the native parts."""
        if not self.editable_mode:
            # setuptools reuses build/lib.*: a module deleted since the last build (or a
            # program no longer shipped) would still go into the wheel.
            shutil.rmtree(self.build_lib, ignore_errors=True)
        super().run()
        make()
        # Editable installs find the checkout's build/ and configs/ instead.
        if self.editable_mode:
            return
        for source, parts in _shipped():
            target = Path(self.build_lib, *parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            # preserve_mode: the programs stay executable in the wheel; a symlink in
            # build/bin (shim/runc) is copied as the file it names.
            self.copy_file(str(source), str(target), preserve_mode=True)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        """Declare the copied files among the outputs."""
        outputs = list(super().get_outputs(include_bytecode))
        if not self.editable_mode:
            outputs += [str(Path(self.build_lib, *parts)) for _, parts in _shipped()]
        return outputs


class NativeDistribution(Distribution):
    """A distribution that ships a native library, so wheels are platform-specific."""

    def has_ext_modules(self) -> bool:
        """Yes: libvgpu.so (whole package goes to platlib, never split across lib dirs)."""
        return True


class platform_wheel(bdist_wheel):  # noqa: N801 - setuptools command naming
    """Tag the wheel for this platform (it holds native code), any Python 3."""

    def get_tag(self) -> tuple[str, str, str]:
        """py3-none-<platform>: the libraries and the programs do not link against Python."""
        _, _, platform = super().get_tag()
        return "py3", "none", platform


setup(
    distclass=NativeDistribution,
    cmdclass={"build_py": build_py_with_native, "bdist_wheel": platform_wheel},
)
