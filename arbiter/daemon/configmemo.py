# SPDX-License-Identifier: Apache-2.0
"""Config documents the schema accepted, remembered in vgpud's run dir across restarts.

Checking the config against configs/vgpud.schema.json needs jsonschema, whose import is
~90 ms of a vgpud start (most of it referencing and attrs, not the format checkers). A
restart with the same config file compares a digest instead: arbiter.config's
`document_digest` covers the schema file and the whole document, so a change to either
is checked again in full, and a document that failed is never recorded. The checks
arbiter.config makes beyond the schema (duplicate keys, quantities, paths) run every time.

The record is trusted only when it belongs to vgpud's uid and nobody else can write it
(the run dir is vgpud's, 0711; the file is made 0600); anything else is ignored.
"""
from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from arbiter.files.atomic import write_whole

__all__ = ["NAME", "AcceptedConfigs"]

log = logging.getLogger("vgpud")

#: The record's file name in the run dir.
NAME = "config-accepted"
#: Digests kept: the last few configs (a reload back and forth stays checked).
_KEEP = 8


class AcceptedConfigs:
    """The digests of accepted documents recorded in `run_dir` (arbiter.config.Accepted)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / NAME
        self._known = self._read()
        self._added: list[str] = []

    def _read(self) -> list[str]:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return []
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid()
                    or st.st_mode & 0o022):
                log.debug("%s: not vgpud's own file, ignored", self.path)
                return []
            text = f.read(4096).decode("ascii", errors="replace")
        return [line for line in text.split() if len(line) == 64]

    def __contains__(self, digest: object) -> bool:
        return digest in self._known

    def add(self, digest: str) -> None:
        """Record a digest whose document the schema accepted (written by save())."""
        if digest not in self._known and digest not in self._added:
            self._added.append(digest)

    def save(self) -> None:
        """Write what add() recorded (atomically, 0600); a failure only costs a full check
        at the next start."""
        if not self._added:
            return
        keep = [*[d for d in self._known if d not in self._added], *self._added][-_KEEP:]
        try:  # the run dir: no fsync (arbiter.files.atomic)
            write_whole(self.path, "".join(f"{d}\n" for d in keep).encode(), 0o600)
        except OSError as e:
            log.debug("cannot record the accepted config in %s: %s", self.path, e)
            return
        self._known, self._added = keep, []
