# SPDX-License-Identifier: Apache-2.0
"""The layering you can read from the folders, pinned: which first-party package may
import which, and that none reaches into another's private names.

Every Python file of each shipped package is read with `ast` (nothing is imported or
run), so a lazy import inside a function counts as much as one at the top. The rules:

- arbiter (the domain, vgpud's gRPC API and daemon) knows nothing of containers or of
  the programs built on it: it imports no other first-party package;
- oci_hook (the hook's decisions) builds on arbiter; shim (the runtime's decisions,
  `vgpu install`) on arbiter and oci_hook;
- vgpud (the composition root) puts arbiter, shim and oci_hook together;
- vgpu_cli (the `vgpu` command) talks to vgpud through arbiter's API and uses shim
  for `vgpu install`;
- vgpu_k8s (the Kubernetes node agents) talks to vgpud through arbiter's API, and
  writes a claim's CDI spec with oci_hook.cdi (the container edits are the hook's);
- no package imports, or reads as an attribute, a `_name` of another package.

Inside arbiter, its packages are layered too (ARBITER_LAYERS): files/ (the files a slice
is made of) imports none of the others, install/ (versioned installs) only files/; slices/
(placement, the store, identity) builds on files/; compute/ (the broker's supervisor, the
guards) on slices/; daemon/ (vgpud: service, loops, metrics) puts them all together. The
modules directly in arbiter/ (errors, model, config, ...) are shared by every layer and
import only files/ and install/.

Standard library and third-party imports are free. A failure lists every violation
as `file:line: what`.
"""
from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.paths import ROOT

#: Package -> the first-party packages it may import (besides itself).
ALLOWED: Mapping[str, frozenset[str]] = {
    "arbiter": frozenset(),
    "oci_hook": frozenset({"arbiter"}),
    "shim": frozenset({"arbiter", "oci_hook"}),
    "vgpud": frozenset({"arbiter", "shim", "oci_hook"}),
    "vgpu_cli": frozenset({"arbiter", "shim"}),
    "vgpu_k8s": frozenset({"arbiter", "oci_hook"}),
}
#: Top-level first-party names no package may import at all (they do not ship).
NOT_SHIPPED = frozenset({"tests", "conftest", "bench", "scripts", "tools", "setup"})
FIRST_PARTY = frozenset(ALLOWED) | NOT_SHIPPED

#: arbiter's packages -> the ones each may import ("" is the modules directly in arbiter/,
#: proto/ and native/ among them, which every layer may import).
ARBITER_LAYERS: Mapping[str, frozenset[str]] = {
    "": frozenset({"files", "install"}),  # model's enums are region_file's; config's shipped
    "files": frozenset(),
    "install": frozenset({"files"}),  # atomic writes
    "slices": frozenset({"files", "install"}),
    "compute": frozenset({"slices", "files", "install"}),
    "daemon": frozenset({"slices", "files", "compute", "install"}),
}


def _private(name: str) -> bool:
    """`_x` is private; dunders (`__version__`, `__init__`) are not."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_of(path: Path, root: Path) -> str:
    """Dotted module name of a file under root (a package's __init__ is the package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@dataclass(frozen=True)
class Violation:
    """One forbidden import or private access, where it is."""

    file: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.what}"


class _Checker(ast.NodeVisitor):
    """Collects the violations of one file of `package`."""

    def __init__(self, package: str, module: str, is_package: bool, file: str) -> None:
        self.package = package
        self.module = module
        self.is_package = is_package
        self.file = file
        # Local name -> the dotted first-party name it is bound to, for every import in
        # the file (module level or inside a function: one namespace is enough here).
        self.bound: dict[str, str] = {}
        self.found: list[Violation] = []

    def _add(self, node: ast.AST, what: str) -> None:
        self.found.append(Violation(self.file, getattr(node, "lineno", 0), what))

    def _foreign(self, dotted: str) -> str | None:
        """The first-party package dotted belongs to when it is not ours, else None."""
        top = dotted.split(".")[0]
        return top if top in FIRST_PARTY and top != self.package else None

    def _check_module(self, node: ast.AST, dotted: str) -> None:
        other = self._foreign(dotted)
        if other is None:
            return
        if other not in ALLOWED.get(self.package, frozenset()):
            allowed = sorted(ALLOWED.get(self.package, ()))
            self._add(node, f"imports {dotted}: {self.package} may import "
                            f"{', '.join(allowed) if allowed else 'no first-party package'}")
        for part in dotted.split(".")[1:]:
            if _private(part):
                self._add(node, f"imports private module {dotted} of {other}")
                break

    def _absolute(self, node: ast.ImportFrom) -> str:
        """The module an ImportFrom names, relative imports resolved against this file."""
        if not node.level:
            return node.module or ""
        base = self.module.split(".")
        if not self.is_package:
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
        return ".".join([*base, *([node.module] if node.module else [])])

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._check_module(node, alias.name)
            if alias.asname:
                self.bound[alias.asname] = alias.name
            else:
                top = alias.name.split(".")[0]
                self.bound[top] = top
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = self._absolute(node)
        self._check_module(node, module)
        other = self._foreign(module)
        for alias in node.names:
            if other is not None and _private(alias.name):
                self._add(node, f"imports private name {module}.{alias.name} of {other}")
            if alias.name != "*":
                self.bound[alias.asname or alias.name] = f"{module}.{alias.name}"
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        # importlib.import_module("pkg.mod") / __import__("pkg.mod") are imports too.
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in ("import_module", "__import__") and node.args and \
                isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            self._check_module(node, node.args[0].value)
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if _private(node.attr):
            chain: list[str] = [node.attr]
            value = node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in self.bound:
                dotted = ".".join([self.bound[value.id], *reversed(chain)])
                other = self._foreign(dotted)
                if other is not None:
                    self._add(node, f"uses private name {dotted} of {other}")
        self.generic_visit(node)


def check_source(package: str, module: str, source: str, file: str = "<source>",
                 is_package: bool = False) -> list[Violation]:
    """The violations in one file's source, for a file of `package` named `module`."""
    checker = _Checker(package, module, is_package, file)
    checker.visit(ast.parse(source, filename=file))
    return checker.found


def package_files(package: str, root: Path = ROOT) -> Iterator[Path]:
    """Every Python file of a package, generated stubs included (they import too)."""
    yield from sorted((root / package).rglob("*.py"))


def check_package(package: str, root: Path = ROOT) -> list[Violation]:
    """Every violation in a package's files."""
    found: list[Violation] = []
    for path in package_files(package, root):
        found += check_source(package, _module_of(path, root), path.read_text(),
                              str(path.relative_to(root)), path.name == "__init__.py")
    return found


def shipped_packages(root: Path = ROOT) -> set[str]:
    """The top-level packages pyproject.toml ships (packages.find include patterns)."""
    config = tomllib.loads((root / "pyproject.toml").read_text())
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    return {pattern.removesuffix("*") for pattern in include}


# ---- the tree --------------------------------------------------------------------

def test_every_shipped_package_has_a_rule():
    shipped = shipped_packages()
    assert shipped == set(ALLOWED), (
        f"pyproject ships {sorted(shipped)}, the rules name {sorted(ALLOWED)}: "
        "give every shipped package its allowed imports here")
    missing = [p for p in ALLOWED if not (ROOT / p / "__init__.py").is_file()]
    assert not missing, f"packages without an __init__.py: {missing}"


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_follow_the_layering(package: str):
    found = check_package(package)
    assert not found, (f"{len(found)} layering violation(s) in {package}/:\n"
                       + "\n".join(map(str, found)))


def arbiter_layer(module: str) -> str:
    """The arbiter layer a dotted arbiter module belongs to ("" for arbiter's own modules)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ARBITER_LAYERS else ""


def arbiter_layer_violations(module: str, source: str, file: str = "<source>",
                             is_package: bool = False) -> list[Violation]:
    """The imports in one arbiter file that reach a layer its own may not import."""
    checker = _Checker("arbiter", module, is_package, file)
    layer = arbiter_layer(module)
    found = []
    for node in ast.walk(ast.parse(source, filename=file)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = checker._absolute(node)
            names = [f"{base}.{a.name}" for a in node.names] if base == "arbiter" else [base]
        else:
            continue
        for name in names:
            if not name.startswith("arbiter."):
                continue
            other = arbiter_layer(name)
            if other and other != layer and other not in ARBITER_LAYERS[layer]:
                allowed = ", ".join(sorted(ARBITER_LAYERS[layer])) or "no other layer"
                found.append(Violation(file, node.lineno,
                                       f"imports {name}: arbiter/{layer or '*.py'} may import "
                                       f"{allowed}"))
    return found


def test_arbiter_layers_cover_its_packages():
    packages = {p.name for p in (ROOT / "arbiter").iterdir() if (p / "__init__.py").is_file()}
    assert packages - {"proto", "native"} == set(ARBITER_LAYERS) - {""}, (
        f"arbiter's packages {sorted(packages)}: give each a layer in ARBITER_LAYERS")


def test_arbiter_packages_follow_their_layers():
    found: list[Violation] = []
    for path in package_files("arbiter"):
        found += arbiter_layer_violations(_module_of(path, ROOT), path.read_text(),
                                          str(path.relative_to(ROOT)),
                                          path.name == "__init__.py")
    assert not found, (f"{len(found)} layer violation(s) in arbiter/:\n"
                       + "\n".join(map(str, found)))


@pytest.mark.parametrize(("module", "source", "expected"), [
    ("arbiter.files.slicefs", "from arbiter.slices.store import Store\n",
     ["imports arbiter.slices.store: arbiter/files may import no other layer"]),
    ("arbiter.slices.placement", "from arbiter import compute\n",
     ["imports arbiter.compute: arbiter/slices may import files, install"]),
    ("arbiter.model", "import arbiter.daemon.server\n",
     ["imports arbiter.daemon.server: arbiter/*.py may import files, install"]),
    ("arbiter.daemon.server", "from arbiter.compute.guardian import Guardian\n"
                              "from arbiter.errors import VgpuError\n", []),
    ("arbiter.compute.guardian", "from ..slices.arbiter import Arbiter\n"
                                 "from .freezer import Freezer\n", []),
])
def test_the_layer_checker(module: str, source: str, expected: list[str]):
    assert [v.what for v in arbiter_layer_violations(module, source)] == expected


# ---- the checker itself, on synthetic sources ------------------------------------

@pytest.mark.parametrize(("package", "module", "source", "expected"), [
    ("arbiter", "arbiter.daemon.server", "import shim.runtime\n",
     ["1: imports shim.runtime: arbiter may import no first-party package"]),
    ("arbiter", "arbiter.daemon.server", "from shim.fastpath import Service\n",
     ["1: imports shim.fastpath: arbiter may import no first-party package"]),
    ("arbiter", "arbiter.daemon.server",
     "import os\n\ndef f():\n    from vgpud import main\n    return main\n",
     ["4: imports vgpud: arbiter may import no first-party package"]),
    ("arbiter", "arbiter.daemon.server",
     "import importlib\nm = importlib.import_module('oci_hook.request')\n",
     ["2: imports oci_hook.request: arbiter may import no first-party package"]),
    ("oci_hook", "oci_hook.phases", "from tests.support import x\n",
     ["1: imports tests.support: oci_hook may import arbiter"]),
    ("vgpu_cli", "vgpu_cli.main", "from oci_hook import request\n",
     ["1: imports oci_hook: vgpu_cli may import arbiter, shim"]),
    ("shim", "shim.service", "from oci_hook.request import _validator\n",
     ["1: imports private name oci_hook.request._validator of oci_hook"]),
    ("vgpud", "vgpud.main", "import shim.runtime as rt\nrt._Vgpud()\n",
     ["2: uses private name shim.runtime._Vgpud of shim"]),
    ("vgpud", "vgpud.main", "def f():\n    import shim.runtime\n    shim.runtime._Vgpud\n",
     ["3: uses private name shim.runtime._Vgpud of shim"]),
    ("vgpud", "vgpud.main", "from shim import runtime\nx = runtime._find_lower\n",
     ["2: uses private name shim.runtime._find_lower of shim"]),
    ("vgpud", "vgpud.main", "from shim.runtime import Service\nService._cache\n",
     ["2: uses private name shim.runtime.Service._cache of shim"]),
    ("vgpud", "vgpud.main", "import shim._impl\n",
     ["1: imports private module shim._impl of shim"]),
], ids=["import", "from-import", "lazy-import-in-function", "import_module", "not-shipped",
        "cli-to-hook", "private-from-import", "private-attr-of-alias",
        "private-attr-lazy", "private-attr-of-module", "private-attr-of-class",
        "private-module"])
def test_checker_catches(package: str, module: str, source: str, expected: list[str]):
    found = check_source(package, module, source, file="f.py")
    assert [str(v).removeprefix("f.py:") for v in found] == expected


@pytest.mark.parametrize(("package", "module", "source"), [
    ("arbiter", "arbiter.slices.arbiter", "import os, sys\nos._exit\nsys._getframe()\n"),
    ("arbiter", "arbiter.slices.arbiter",
     "from arbiter.files.region_file import _field\nimport arbiter.x\n"
     "arbiter.x._private\n"),
    ("arbiter", "arbiter.proto.vgpu_pb2_grpc", "from . import vgpu_pb2\nfrom .. import core\n"),
    ("shim", "shim.service", "from oci_hook.request import find_request\n"
                             "from arbiter import __version__\n"),
    ("vgpud", "vgpud.main", "import shim.lifecycle\nshim.lifecycle.serve()\n"),
    ("vgpu_cli", "vgpu_cli.main", "import grpc\nfrom shim import install\n"
                                  "def f(x):\n    return x._private\n"),
], ids=["stdlib-private", "own-private", "relative-inside", "allowed-public",
        "allowed-attr", "unbound-private"])
def test_checker_allows(package: str, module: str, source: str):
    assert check_source(package, module, source) == []


def test_checker_resolves_relative_imports_to_their_package():
    # `from ..shim import x` inside a package file would leave arbiter: caught as shim.
    found = check_source("arbiter", "arbiter.proto.vgpu_pb2", "from ...shim import x\n",
                         file="f.py")
    assert [str(v) for v in found] == [
        "f.py:1: imports shim: arbiter may import no first-party package"]


def test_failure_message_lists_every_violation(tmp_path: Path):
    pkg = tmp_path / "arbiter"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("import shim\nfrom oci_hook.request import _v\n")
    (pkg / "b.py").write_text("def f():\n    import vgpu_cli.main\n")
    found = [str(v) for v in check_package("arbiter", tmp_path)]
    assert found == [
        "arbiter/a.py:1: imports shim: arbiter may import no first-party package",
        "arbiter/a.py:2: imports oci_hook.request: arbiter may import no first-party package",
        "arbiter/a.py:2: imports private name oci_hook.request._v of oci_hook",
        "arbiter/b.py:2: imports vgpu_cli.main: arbiter may import no first-party package",
    ]
