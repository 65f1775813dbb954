# SPDX-License-Identifier: Apache-2.0
"""The durable slice store: SQLite under the state dir (state.db).

A slice and its grants are written in one transaction, so a crash or SIGKILL at any
instant leaves either the whole slice or none of it. WAL with synchronous=FULL makes
a commit durable when commit_allocation() returns (the WAL is fsynced at each commit).

The schema version is PRAGMA user_version; MIGRATIONS[v] takes a database from
version v to v + 1 inside the transaction that sets the new version, so a failed
migration leaves the file as it was. A database newer than this code is refused.

One connection, guarded by a lock, serves every thread; the daemon is the only
writer (other processes may read, e.g. tests and `sqlite3 state.db`).
"""
from __future__ import annotations

import functools
import json
import os
import queue
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from arbiter.errors import StateError
from arbiter.model import Grant, Policy, Priority, Slice, User
from arbiter.slices.pending import Pending

__all__ = ["DB_NAME", "MIGRATIONS", "SCHEMA_VERSION", "Migration", "Store"]

DB_NAME = "state.db"
_DB_SUFFIXES = (".db", ".sqlite", ".sqlite3")

_T = TypeVar("_T")

#: One step of the schema: takes a database at version i (its index) to i + 1.
Migration = Callable[[sqlite3.Connection], None]


def _v1_initial(db: sqlite3.Connection) -> None:
    db.execute("""
        CREATE TABLE slices (
            id         TEXT PRIMARY KEY,
            owner      TEXT NOT NULL UNIQUE,
            owner_kind TEXT NOT NULL,
            owner_pid  INTEGER NOT NULL DEFAULT 0,
            priority   INTEGER NOT NULL,
            policy     INTEGER NOT NULL,
            created_ms INTEGER NOT NULL,
            labels     TEXT NOT NULL DEFAULT '[]'   -- JSON list of [key, value] pairs
        )""")
    db.execute("""
        CREATE TABLE grants (
            slice_id  TEXT NOT NULL REFERENCES slices(id) ON DELETE CASCADE,
            ordinal   INTEGER NOT NULL,             -- vGPU number within the slice
            gpu_index INTEGER NOT NULL,
            gpu_uuid  TEXT NOT NULL,
            memory    INTEGER NOT NULL,             -- bytes
            compute   INTEGER NOT NULL,             -- percent
            PRIMARY KEY (slice_id, ordinal)
        )""")


def _v2_holder(db: sqlite3.Connection) -> None:
    # Who holds a slice, as the host saw it at prestart (arbiter.slices.identity).
    db.execute("ALTER TABLE slices ADD COLUMN owner_start INTEGER NOT NULL DEFAULT 0")
    db.execute("ALTER TABLE slices ADD COLUMN owner_cgroup TEXT NOT NULL DEFAULT ''")
    db.execute("ALTER TABLE slices ADD COLUMN owner_bundle TEXT NOT NULL DEFAULT ''")


def _v3_libvgpu(db: sqlite3.Connection) -> None:
    # The versioned install (arbiter.install.versions) whose libvgpu.so the container mapped;
    # '' for slices an older vgpud made (their init's mountinfo tells).
    db.execute("ALTER TABLE slices ADD COLUMN libvgpu_version TEXT NOT NULL DEFAULT ''")


def _v4_users(db: sqlite3.Connection) -> None:
    # The containers that use a claim's slice (arbiter.model.User), for attribution:
    # recorded by vgpud from /proc like a holder; gone with the slice.
    db.execute("""
        CREATE TABLE users (
            slice_id TEXT NOT NULL REFERENCES slices(id) ON DELETE CASCADE,
            pid      INTEGER NOT NULL,              -- the container's init, host pid
            start    INTEGER NOT NULL DEFAULT 0,    -- its /proc start time
            cgroup   TEXT NOT NULL DEFAULT '',      -- "<controllers>:<path>"
            bundle   TEXT NOT NULL DEFAULT '',
            PRIMARY KEY (slice_id, pid, start)
        )""")


MIGRATIONS: tuple[Migration, ...] = (_v1_initial, _v2_holder, _v3_libvgpu, _v4_users)
SCHEMA_VERSION = len(MIGRATIONS)


class Store:
    """Slices and their grants in SQLite; every method is atomic and thread-safe.

    `path` is the state directory, in which ``state.db`` is used, or the database file
    itself (an existing file, or a name ending .db/.sqlite/.sqlite3); missing
    directories are made (0700).
    """

    def __init__(self, path: Path | str, *,
                 migrations: Sequence[Migration] = MIGRATIONS) -> None:
        path = Path(path)
        if not (path.is_file() or path.suffix in _DB_SUFFIXES):
            path = path / DB_NAME
        self.path = path
        self._lock = threading.Lock()
        self._closed = False
        # Group commit: writes queued for the writer thread, each with the Pending its
        # caller waits on (a write of None: flush's marker; the item None: close's).
        self._queue: queue.SimpleQueue[tuple[Callable[[sqlite3.Connection], Any] | None,
                                             Pending[Any]] | None] = queue.SimpleQueue()
        self._queue_lock = threading.Lock()
        self._writer: threading.Thread | None = None
        self._stopping = False
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fresh = not path.exists()
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None,
                                       timeout=10.0)
        except (OSError, sqlite3.Error) as e:
            raise StateError("open", f"slice state {path}", str(e), path=path) from e
        try:
            if fresh:
                os.chmod(path, 0o600)  # SQLite gives the -wal/-shm files the same mode
            mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StateError("open", f"slice state {path}",
                                 f"cannot use write-ahead logging (journal mode {mode})",
                                 path=path)
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._migrate(list(migrations))
            if self.schema_version >= SCHEMA_VERSION:  # the tables temp.new_slice writes
                _one_statement_insert(self._db)
        except BaseException as e:
            self._db.close()
            if isinstance(e, sqlite3.Error):
                raise StateError("open", f"slice state {path}", str(e), path=path) from e
            raise

    # --- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Finish queued writes, then close the database (idempotent); later calls raise."""
        with self._queue_lock:
            if not self._stopping:
                self._stopping = True
                self._queue.put(None)
            writer = self._writer
        if writer is not None and writer is not threading.current_thread():
            writer.join()
        with self._lock:
            if not self._closed:
                self._closed = True
                self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        """The database's PRAGMA user_version."""
        with self._tx("read", "schema version", write=False) as db:
            return int(db.execute("PRAGMA user_version").fetchone()[0])

    # --- reads -------------------------------------------------------------------------------

    def slices(self) -> list[Slice]:
        """Every slice, oldest first (created_ms, then id)."""
        with self._tx("read", "slices", write=False) as db:
            rows = db.execute(f"{_SELECT_SLICE} ORDER BY created_ms, id").fetchall()
            grants = _grants_by_slice(db.execute(_SELECT_GRANTS).fetchall())
        return [_slice(row, grants.get(row[0], ())) for row in rows]

    def get(self, id: str) -> Slice | None:
        """The slice with this id, or None."""
        return self._one("id", id)

    def by_owner(self, owner: str) -> Slice | None:
        """The slice this owner (container id, or process) holds, or None."""
        return self._one("owner", owner)

    # --- writes ------------------------------------------------------------------------------

    def commit_allocation(self, new: Slice, evicted: Sequence[str] = ()) -> None:
        """In one transaction delete the `evicted` slices and insert `new` with its grants.

        An evicted id that is already gone is fine (its room is free either way). Raises
        StateError (code CONFLICT) when the owner or the id already holds a slice; then
        nothing changed, evictions included.
        """
        with self._tx("store", f"slice {new.id}") as db:
            self._write_allocation(db, new, evicted)

    def delete(self, id: str) -> bool:
        """Delete a slice and its grants; False when there was none."""
        with self._tx("delete", f"slice {id}") as db:
            return self._write_delete(db, id)

    # --- group commit ----------------------------------------------------------------------
    # Many threads allocating and releasing at once share transactions: the writer
    # thread commits everything queued so far with one fsync, and each caller's Pending
    # is done only when its write is durable. A write that fails is rolled back to
    # its savepoint alone; a commit that fails fails every write in the batch. A batch of
    # one write that is one statement (_OneStatement) is that statement alone, in
    # SQLite's own transaction: no BEGIN and COMMIT, each a call that lets go of the GIL
    # and waits to get it back (most batches, as the writer keeps up).

    def commit_allocation_async(self, new: Slice, evicted: Sequence[str] = ()) -> Pending[None]:
        """commit_allocation, batched with other writers; its Pending is done once durable."""
        write = functools.partial(self._write_allocation, new=new, evicted=evicted)
        return self._submit(write if evicted else _OneStatement(write), f"slice {new.id}")

    def bind_async(self, id: str, pid: int, start: int, cgroup: str,
                   bundle: str) -> Pending[bool]:
        """Record the slice's holder (prestart); its Pending is done once durable, with
        False when there is no such slice."""
        return self._submit(_OneStatement(lambda db: db.execute(
            "UPDATE slices SET owner_pid = ?, owner_start = ?, owner_cgroup = ?,"
            " owner_bundle = ? WHERE id = ?", (pid, start, cgroup, bundle, id)).rowcount > 0),
            f"slice {id}")

    def set_libvgpu_async(self, id: str, libvgpu_version: str) -> Pending[bool]:
        """Record which installed libvgpu the slice's container mapped; False: no such slice."""
        return self._submit(_OneStatement(lambda db: db.execute(
            "UPDATE slices SET libvgpu_version = ? WHERE id = ?",
            (libvgpu_version, id)).rowcount > 0), f"slice {id}")

    def users(self) -> list[User]:
        """Every recorded user of a claim's slice (slice id, then pid)."""
        with self._tx("read", "slice users", write=False) as db:
            rows = db.execute("SELECT slice_id, pid, start, cgroup, bundle FROM users"
                              " ORDER BY slice_id, pid, start").fetchall()
        return [User(*row) for row in rows]

    def add_user_async(self, user: User) -> Pending[bool]:
        """Record a user of a slice; its Pending is done once durable, with False when there
        is no such slice."""
        def write(db: sqlite3.Connection) -> bool:
            if db.execute("SELECT 1 FROM slices WHERE id = ?",
                          (user.slice_id,)).fetchone() is None:
                return False
            db.execute("INSERT OR REPLACE INTO users (slice_id, pid, start, cgroup, bundle)"
                       " VALUES (?, ?, ?, ?, ?)",
                       (user.slice_id, user.pid, user.start, user.cgroup, user.bundle))
            return True
        return self._submit(write, f"slice {user.slice_id}")

    def delete_user_async(self, user: User) -> Pending[bool]:
        """Forget a user of a slice; its Pending is done once durable (False: none)."""
        return self._submit(_OneStatement(lambda db: db.execute(
            "DELETE FROM users WHERE slice_id = ? AND pid = ? AND start = ?",
            (user.slice_id, user.pid, user.start)).rowcount > 0), f"slice {user.slice_id}")

    def delete_async(self, id: str) -> Pending[bool]:
        """delete, batched with other writers; its Pending is done once durable."""
        return self._submit(_OneStatement(lambda db: self._write_delete(db, id)),
                            f"slice {id}")

    def flush(self) -> None:
        """Wait until every write submitted so far is committed (or has failed)."""
        try:
            marker: Pending[None] = self._submit(None, "flush")
        except StateError:  # closing: the writer ends once what was queued is done
            writer = self._writer
            if writer is not None and writer is not threading.current_thread():
                writer.join()
            return
        marker.result()

    def _submit(self, write: Callable[[sqlite3.Connection], _T] | None,
                what: str) -> Pending[_T]:
        done: Pending[_T] = Pending()
        with self._queue_lock:
            if self._closed or self._stopping:
                raise StateError("store", what, "the state database is closed", path=self.path)
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_loop, name="vgpud-store",
                                                daemon=True)
                self._writer.start()
            self._queue.put((write, done))
        return done

    def _write_loop(self) -> None:
        while True:
            # Everything queued by now is one batch (the first get waits, in C, GIL let go).
            items = [self._queue.get()]
            items.extend(self._queue.get() for _ in range(self._queue.qsize()))
            batch: list[tuple[Callable[[sqlite3.Connection], Any], Pending[Any]]] = []
            markers: list[Pending[Any]] = []
            for item in items:
                if item is not None:
                    write, done = item
                    if write is None:
                        markers.append(done)
                    else:
                        batch.append((write, done))
            if batch:
                try:
                    outcomes = self._write_batch(batch)
                except BaseException as e:
                    outcomes = [(done, None, e) for _, done in batch]
                for done, result, error in outcomes:
                    if error is None:
                        done.set_result(result)
                    else:
                        done.set_exception(error)
            for done in markers:  # flush's: everything queued before them is done now
                done.set_result(None)
            if None in items:  # close's, always the last
                return

    def _write_batch(self, batch: list[tuple[Callable[[sqlite3.Connection], Any], Pending[Any]]],
                     ) -> list[tuple[Pending[Any], Any, BaseException | None]]:
        """Commit a batch in one transaction; each write's (Pending, result, error).

        The writes go straight in first: every statement is a call that lets go of the GIL
        and waits to get it back, and a savepoint around each write would double them. Only
        when one fails is the batch rolled back and written again, each write within its
        own savepoint, so that the failing one fails alone."""
        what = f"{len(batch)} slice changes"
        first, first_done = batch[0]
        if len(batch) == 1 and isinstance(first, _OneStatement):
            return [self._write_alone(first, first_done)]
        try:
            with self._tx("store", what) as db:
                results = []
                for write, _ in batch:
                    try:
                        results.append(write(db))
                    except Exception as e:
                        raise _WriteFailedError from e
            return [(fut, r, None) for (_, fut), r in zip(batch, results, strict=True)]
        except _WriteFailedError:
            pass  # rolled back whole (_tx): once more, one savepoint per write
        outcomes: list[tuple[Pending[Any], Any, BaseException | None]] = []
        with self._tx("store", what) as db:
            for write, fut in batch:
                db.execute("SAVEPOINT w")
                try:
                    outcomes.append((fut, write(db), None))
                    db.execute("RELEASE w")
                except Exception as e:
                    db.execute("ROLLBACK TO w")
                    db.execute("RELEASE w")
                    outcomes.append((fut, None, self._write_error(e)))
        return outcomes

    def _write_alone(self, write: _OneStatement, fut: Pending[Any],
                     ) -> tuple[Pending[Any], Any, BaseException | None]:
        """One write of one statement, committed by SQLite as it ends (autocommit: the
        connection has no isolation level); its (Pending, result, error)."""
        with self._lock:
            if self._closed:
                return fut, None, StateError("store", "slice", "the state database is closed",
                                             path=self.path)
            try:
                return fut, write(self._db), None
            except Exception as e:
                return fut, None, self._write_error(e)

    def _write_error(self, e: Exception) -> Exception:
        """What a write's Pending fails with: SQLite's errors as StateError, others as raised."""
        if isinstance(e, sqlite3.Error):
            return StateError("store", "slice", str(e), path=self.path)
        return e

    def _write_allocation(self, db: sqlite3.Connection, new: Slice,
                          evicted: Sequence[str]) -> None:
        """The evicted slices' deletes, then one statement: the new slice and its grants."""
        try:
            grants = json.dumps([[g.gpu_index, g.gpu_uuid, g.memory, g.compute]
                                 for g in new.grants])
        except (TypeError, ValueError) as e:
            raise StateError("store", f"slice {new.id}", f"cannot store its grants: {e}",
                             path=self.path) from e
        if evicted:
            db.executemany("DELETE FROM slices WHERE id = ?", [(sid,) for sid in evicted])
        try:
            db.execute(
                "INSERT INTO temp.new_slice (id, owner, owner_kind, owner_pid, priority,"
                " policy, created_ms, labels, owner_start, owner_cgroup, owner_bundle,"
                " libvgpu_version, grants) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (new.id, new.owner, new.owner_kind, new.owner_pid, int(new.priority),
                 int(new.policy), new.created_ms,
                 json.dumps([list(kv) for kv in new.labels]), new.owner_start,
                 new.owner_cgroup, new.owner_bundle, new.libvgpu_version, grants))
        except sqlite3.IntegrityError as e:
            raise self._conflict(db, new) from e

    @staticmethod
    def _write_delete(db: sqlite3.Connection, id: str) -> bool:
        return db.execute("DELETE FROM slices WHERE id = ?", (id,)).rowcount > 0

    def update_grants(self, id: str, grants: Sequence[Grant]) -> None:
        """Replace a slice's grants (an in-place update); StateError NOT_FOUND if none."""
        with self._tx("update", f"slice {id}") as db:
            if db.execute("SELECT 1 FROM slices WHERE id = ?", (id,)).fetchone() is None:
                raise StateError("update", f"slice {id}", "no such slice",
                                 code=StateError.NOT_FOUND, path=self.path)
            db.execute("DELETE FROM grants WHERE slice_id = ?", (id,))
            _insert_grants(db, id, grants)

    # --- internals ---------------------------------------------------------------------------

    def _one(self, column: str, value: str) -> Slice | None:
        with self._tx("read", f"slice {column} {value}", write=False) as db:
            row = db.execute(f"{_SELECT_SLICE} WHERE {column} = ?", (value,)).fetchone()
            if row is None:
                return None
            grants = db.execute(f"{_SELECT_GRANTS} WHERE slice_id = ?", (row[0],)).fetchall()
        return _slice(row, _grants_by_slice(grants).get(row[0], ()))

    def _conflict(self, db: sqlite3.Connection, new: Slice) -> StateError:
        holder = db.execute("SELECT id FROM slices WHERE owner = ?", (new.owner,)).fetchone()
        if holder is not None:
            reason = f"owner {new.owner!r} already holds slice {holder[0]}"
        else:
            reason = "a slice with this id already exists"
        return StateError("store", f"slice {new.id}", reason, code=StateError.CONFLICT,
                          path=self.path)

    @contextmanager
    def _tx(self, verb: str, what: str, *, write: bool = True) -> Iterator[sqlite3.Connection]:
        """Hold the lock and run one transaction (IMMEDIATE for writes: no upgrade deadlock)."""
        with self._lock:
            if self._closed:
                raise StateError(verb, what, "the state database is closed", path=self.path)
            db = self._db
            try:
                db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            except sqlite3.Error as e:
                raise StateError(verb, what, str(e), path=self.path) from e
            try:
                yield db
            except BaseException as e:
                db.execute("ROLLBACK")
                if isinstance(e, sqlite3.Error):
                    raise StateError(verb, what, str(e), path=self.path) from e
                raise
            try:
                db.execute("COMMIT")
            except sqlite3.Error as e:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise StateError(verb, what, str(e), path=self.path) from e

    def _migrate(self, migrations: list[Migration]) -> None:
        db = self._db
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        if version > len(migrations):
            raise StateError("open", f"slice state {self.path}",
                             f"schema version {version} is newer than this vgpud knows "
                             f"({len(migrations)}); upgrade vgpu", code=StateError.SCHEMA,
                             path=self.path)
        while version < len(migrations):
            db.execute("BEGIN IMMEDIATE")
            try:
                # Re-read under the write lock: another opener may have migrated meanwhile.
                version = int(db.execute("PRAGMA user_version").fetchone()[0])
                if version < len(migrations):
                    migrations[version](db)
                    version += 1
                    db.execute(f"PRAGMA user_version = {version:d}")
                db.execute("COMMIT")
            except BaseException as e:
                db.execute("ROLLBACK")
                raise StateError("migrate", f"slice state {self.path}",
                                 f"step to version {version + 1} failed: {e}",
                                 code=StateError.SCHEMA, path=self.path) from e


_SLICE_COLUMNS = ("id, owner, owner_kind, owner_pid, priority, policy, created_ms, labels,"
                  " owner_start, owner_cgroup, owner_bundle, libvgpu_version")
_SELECT_SLICE = f"SELECT {_SLICE_COLUMNS} FROM slices"
_SELECT_GRANTS = "SELECT slice_id, ordinal, gpu_index, gpu_uuid, memory, compute FROM grants"

_SliceRow = tuple[str, str, str, int, int, int, int, str, int, str, str, str]


class _OneStatement:
    """A write that is one SQL statement (all of it or nothing, even in autocommit)."""

    def __init__(self, write: Callable[[sqlite3.Connection], Any]) -> None:
        self.write = write

    def __call__(self, db: sqlite3.Connection) -> Any:
        return self.write(db)


def _one_statement_insert(db: sqlite3.Connection) -> None:
    """temp.new_slice: a slice and its grants (JSON [[gpu_index, gpu_uuid, memory,
    compute], ...]) inserted by one statement, so that the writer makes them in one call.

    TEMP: this connection's alone, nothing in the file changes (an older vgpud opens it as
    it was, the schema version stays)."""
    db.execute(f"""
        CREATE TEMP VIEW IF NOT EXISTS new_slice AS
        SELECT {_SLICE_COLUMNS}, '[]' AS grants FROM main.slices""")
    db.execute(f"""
        CREATE TEMP TRIGGER IF NOT EXISTS new_slice_insert INSTEAD OF INSERT ON new_slice
        BEGIN
            INSERT INTO slices ({_SLICE_COLUMNS}) VALUES (
                NEW.id, NEW.owner, NEW.owner_kind, NEW.owner_pid, NEW.priority, NEW.policy,
                NEW.created_ms, NEW.labels, NEW.owner_start, NEW.owner_cgroup,
                NEW.owner_bundle, NEW.libvgpu_version);
            INSERT INTO grants (slice_id, ordinal, gpu_index, gpu_uuid, memory, compute)
            SELECT NEW.id, key, json_extract(value, '$[0]'), json_extract(value, '$[1]'),
                   json_extract(value, '$[2]'), json_extract(value, '$[3]')
            FROM json_each(NEW.grants);
        END""")


class _WriteFailedError(Exception):
    """A write of a batch raised (its cause): the batch is written again, write by write."""


def _insert_grants(db: sqlite3.Connection, slice_id: str, grants: Sequence[Grant]) -> None:
    db.executemany(
        "INSERT INTO grants (slice_id, ordinal, gpu_index, gpu_uuid, memory, compute)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        [(slice_id, n, g.gpu_index, g.gpu_uuid, g.memory, g.compute)
         for n, g in enumerate(grants)])


def _grants_by_slice(rows: list[tuple[str, int, int, str, int, int]],
                     ) -> dict[str, tuple[Grant, ...]]:
    out: dict[str, list[tuple[int, Grant]]] = {}
    for slice_id, ordinal, index, uuid, memory, compute in rows:
        out.setdefault(slice_id, []).append((ordinal, Grant(index, uuid, memory, compute)))
    return {k: tuple(g for _, g in sorted(v, key=lambda p: p[0])) for k, v in out.items()}


def _slice(row: _SliceRow, grants: tuple[Grant, ...]) -> Slice:
    (sid, owner, owner_kind, owner_pid, priority, policy, created_ms, labels, owner_start,
     owner_cgroup, owner_bundle, libvgpu_version) = row
    return Slice(
        id=sid, owner=owner, grants=grants, priority=Priority(priority), policy=Policy(policy),
        owner_kind=owner_kind, owner_pid=owner_pid, created_ms=created_ms,
        labels=tuple((str(k), str(v)) for k, v in json.loads(labels)),
        owner_start=owner_start, owner_cgroup=owner_cgroup, owner_bundle=owner_bundle,
        libvgpu_version=libvgpu_version,
    )
