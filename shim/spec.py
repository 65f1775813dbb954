# SPDX-License-Identifier: Apache-2.0
"""The OCI spec store: load a bundle's config.json, let modifiers change it, flush it back.

Load / modify / flush are kept apart (nvidia-container-toolkit's internal/oci):
`FileSpec` works on a bundle's config.json and writes it back atomically (a
temporary file in the same directory renamed over it, arbiter.files.atomic), so runc
never reads a half-written spec; `MemorySpec` holds a spec in memory for tests and
callers that build one. Unknown keys are kept as they are.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

from arbiter.files.atomic import write_whole
from shim.errors import SpecError

__all__ = ["FileSpec", "MemorySpec", "Spec", "SpecStore"]

#: An OCI runtime spec as JSON data.
Spec = dict[str, Any]


class SpecStore(Protocol):
    """Where a spec comes from and goes back to."""

    def load(self) -> Spec:
        """Read the spec."""
        ...

    def flush(self, spec: Spec) -> None:
        """Write the (modified) spec back."""
        ...


class MemorySpec:
    """A spec held in memory; flush keeps a copy of what was written."""

    def __init__(self, spec: Spec) -> None:
        self.spec = json.loads(json.dumps(spec))
        self.flushed: Spec | None = None

    def load(self) -> Spec:
        """A deep copy of the spec."""
        return json.loads(json.dumps(self.spec))  # type: ignore[no-any-return]

    def flush(self, spec: Spec) -> None:
        """Keep `spec` as the new spec."""
        self.flushed = json.loads(json.dumps(spec))
        self.spec = self.flushed


class FileSpec:
    """A bundle's config.json."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @classmethod
    def of_bundle(cls, bundle: Path) -> FileSpec:
        """The store of `<bundle>/config.json`."""
        return cls(Path(bundle) / "config.json")

    def load(self) -> Spec:
        """Parse config.json; SpecError when it is unreadable or not a JSON object."""
        try:
            data = self.path.read_bytes()
        except OSError as e:
            raise SpecError(self.path, "read", e.strerror or str(e)) from e
        try:
            spec = json.loads(data)
        except ValueError as e:
            raise SpecError(self.path, "parse", str(e)) from e
        if not isinstance(spec, dict):
            raise SpecError(self.path, "parse", "not a JSON object")
        return spec

    def flush(self, spec: Spec) -> None:
        """Replace config.json atomically, keeping its permission bits."""
        try:
            mode = self.path.stat().st_mode & 0o7777
        except OSError:
            mode = 0o644
        data = json.dumps(spec, separators=(",", ":")).encode()
        try:
            write_whole(self.path, data, mode)  # not durable: arbiter.files.atomic
        except OSError as e:
            raise SpecError(self.path, "write", e.strerror or str(e)) from e
