# SPDX-License-Identifier: Apache-2.0
"""arbiter.slices.store: SQLite in tmp_path, real threads, and real processes killed with
SIGKILL."""
from __future__ import annotations

import os
import random
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from support.paths import ROOT
from support.process import read_line

from arbiter.errors import StateError
from arbiter.model import Grant, OwnerKind, Policy, Priority, Slice
from arbiter.slices.store import DB_NAME, MIGRATIONS, SCHEMA_VERSION, Store

GI = 1 << 30


def make(sid: str, owner: str | None = None, n: int = 1, **kw) -> Slice:
    grants = tuple(Grant(i, f"GPU-{i}", (i + 1) * GI, 10 + i) for i in range(n))
    return Slice(sid, owner or f"owner-{sid}", grants, **kw)


def raw(db_path: Path, sql: str, *args):
    with sqlite3.connect(db_path) as db:
        return db.execute(sql, args).fetchall()


@pytest.fixture
def store(tmp_path: Path):
    with Store(tmp_path / "state") as s:
        yield s


# --- round trip -----------------------------------------------------------------------------

ROUND_TRIP = [
    ("plain", make("a")),
    ("every-field", Slice(
        id="0123456789abcdef", owner="9f2c" * 16,
        grants=(Grant(3, "GPU-3fa1c2d4-aaaa-bbbb-cccc-0123456789ab", 1536 << 20, 2),
                Grant(0, "GPU-0", (1 << 62) + 1, 100),
                Grant(7, "", 1, 55)),
        priority=Priority.HIGH, policy=Policy.BURST, owner_kind=OwnerKind.PROCESS,
        owner_pid=4_194_304, created_ms=1_735_689_600_123,
        labels=(("io.kubernetes.pod.name", "trainer-0"), ("z", ""), ("a", "ünïcødé ✓"),
                ("z", "dup keys and order kept")))),
    ("low-fixed", make("b", priority=Priority.LOW, policy=Policy.FIXED, n=4)),
    ("no-grants", Slice("c", "oc", ())),
]


@pytest.mark.parametrize("s", [c[1] for c in ROUND_TRIP], ids=[c[0] for c in ROUND_TRIP])
def test_round_trip(tmp_path, s):
    with Store(tmp_path) as st:
        st.commit_allocation(s)
        assert st.get(s.id) == s
        assert st.by_owner(s.owner) == s
        assert st.slices() == [s]
        got = st.get(s.id)
        assert got is not None
        assert type(got.priority) is Priority and type(got.policy) is Policy
    with Store(tmp_path / DB_NAME) as st:  # reopened, by file name this time
        assert st.slices() == [s]


def test_missing(store):
    assert store.get("nope") is None
    assert store.by_owner("nope") is None
    assert store.slices() == []
    assert store.delete("nope") is False


def test_slices_oldest_first(store):
    for sid, ms in [("c", 5), ("a", 9), ("b", 5)]:
        store.commit_allocation(make(sid, created_ms=ms))
    assert [s.id for s in store.slices()] == ["b", "c", "a"]


# --- the file -------------------------------------------------------------------------------

def test_file_settings(tmp_path):
    with Store(tmp_path / "deep" / "state") as st:
        path = tmp_path / "deep" / "state" / DB_NAME
        assert st.path == path
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert st.schema_version == SCHEMA_VERSION == len(MIGRATIONS)
        assert st._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert st._db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert raw(path, "PRAGMA journal_mode") == [("wal",)]
        assert raw(path, "PRAGMA user_version") == [(SCHEMA_VERSION,)]


def test_explicit_file_name(tmp_path):
    with Store(tmp_path / "custom.sqlite") as st:
        st.commit_allocation(make("a"))
    assert (tmp_path / "custom.sqlite").is_file()
    with Store(tmp_path / "vgpu.d") as st:  # a state dir whose name has a dot
        assert st.path == tmp_path / "vgpu.d" / DB_NAME


def test_unopenable(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(StateError, match=r"^failed to open slice state .*file/state/state\.db: "):
        Store(tmp_path / "file" / "state")


def test_not_a_database(tmp_path):
    (tmp_path / DB_NAME).write_bytes(b"garbage" * 1000)
    with pytest.raises(StateError, match="failed to open slice state"):
        Store(tmp_path)


# --- writes ---------------------------------------------------------------------------------

def test_owner_is_unique(store):
    store.commit_allocation(make("a", owner="ctr"))
    with pytest.raises(StateError) as info:
        store.commit_allocation(make("b", owner="ctr"))
    e = info.value
    assert str(e) == "failed to store slice b: owner 'ctr' already holds slice a"
    assert e.code == StateError.CONFLICT and isinstance(e.__cause__, sqlite3.IntegrityError)
    assert [s.id for s in store.slices()] == ["a"]


def test_id_is_unique(store):
    store.commit_allocation(make("a", owner="one"))
    with pytest.raises(StateError, match="a slice with this id already exists") as info:
        store.commit_allocation(make("a", owner="two"))
    assert info.value.code == StateError.CONFLICT
    assert store.by_owner("two") is None


def test_evict_and_insert(store):
    for sid in "abc":
        store.commit_allocation(make(sid, n=2))
    store.commit_allocation(make("d"), ["a", "c", "already-gone"])
    assert [s.id for s in store.slices()] == ["b", "d"]
    # ON DELETE CASCADE: no grant rows of the evicted slices remain.
    assert raw(store.path, "SELECT DISTINCT slice_id FROM grants ORDER BY 1") == [("b",), ("d",)]


def snapshot(path: Path):
    return (raw(path, "SELECT * FROM slices ORDER BY id"),
            raw(path, "SELECT * FROM grants ORDER BY slice_id, ordinal"))


def test_commit_is_atomic_on_duplicate_owner(store):
    store.commit_allocation(make("a", n=2))
    store.commit_allocation(make("b", n=3))
    before = snapshot(store.path)
    with pytest.raises(StateError):
        # The eviction runs first; the insert then fails on b's owner: both roll back.
        store.commit_allocation(make("new", owner="owner-b"), ["a"])
    assert snapshot(store.path) == before
    assert store.get("a") == make("a", n=2)


def test_commit_is_atomic_on_a_failing_grant(store):
    store.commit_allocation(make("a", n=2))
    before = snapshot(store.path)
    bad = Slice("new", "o-new", (Grant(0, "GPU-0", GI, 10), Grant(1, "GPU-1", object(), 10)))
    # The evicted slice's delete is in; the second grant cannot be stored.
    with pytest.raises(StateError, match=r"^failed to store slice new: "):
        store.commit_allocation(bad, ["a"])
    assert snapshot(store.path) == before
    store.commit_allocation(make("next"))  # the connection is usable afterwards
    assert [s.id for s in store.slices()] == ["a", "next"]


def test_delete(store):
    store.commit_allocation(make("a", n=3))
    store.commit_allocation(make("b"))
    assert store.delete("a") is True
    assert store.delete("a") is False
    assert [s.id for s in store.slices()] == ["b"]
    assert raw(store.path, "SELECT count(*) FROM grants WHERE slice_id = 'a'") == [(0,)]


def test_update_grants(store):
    store.commit_allocation(make("a", n=2))
    new = (Grant(0, "GPU-0", 5 * GI, 40), Grant(1, "GPU-1", 5 * GI, 40))
    store.update_grants("a", new)
    got = store.get("a")
    assert got is not None and got.grants == new
    assert got == Slice("a", "owner-a", new)
    with pytest.raises(StateError) as info:
        store.update_grants("zz", new)
    assert info.value.code == StateError.NOT_FOUND
    assert str(info.value) == "failed to update slice zz: no such slice"


def test_closed(tmp_path):
    st = Store(tmp_path)
    st.commit_allocation(make("a"))
    st.close()
    st.close()  # idempotent
    with pytest.raises(StateError, match="the state database is closed"):
        st.slices()
    with pytest.raises(StateError, match="closed"):
        st.commit_allocation(make("b"))
    with Store(tmp_path) as again:
        assert [s.id for s in again.slices()] == ["a"]
        again.commit_allocation(make("b"))
    with Store(tmp_path) as third:
        assert [s.id for s in third.slices()] == ["a", "b"]


# --- migrations -----------------------------------------------------------------------------

def test_migrates_a_v0_database(tmp_path):
    # A version-0 file: made by an older tool, user_version never set, other tables kept.
    path = tmp_path / DB_NAME
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE notes (text TEXT)")
        db.execute("INSERT INTO notes VALUES ('kept')")
    assert raw(path, "PRAGMA user_version") == [(0,)]
    with Store(tmp_path) as st:
        assert st.schema_version == SCHEMA_VERSION
        st.commit_allocation(make("a"))
        assert st.get("a") == make("a")
    assert raw(path, "SELECT text FROM notes") == [("kept",)]


def _v2_add_grant_uuid_index(db: sqlite3.Connection) -> None:
    # A plausible next step: move labels into their own table, keeping the data.
    db.execute("CREATE TABLE labels (slice_id TEXT REFERENCES slices(id) ON DELETE CASCADE,"
               " key TEXT, value TEXT)")
    db.execute("INSERT INTO labels SELECT slices.id, j.value ->> 0, j.value ->> 1"
               " FROM slices, json_each(slices.labels) AS j")


def test_migrates_data_forward(tmp_path):
    s = make("a", labels=(("k", "v"),))
    with Store(tmp_path) as st:
        st.commit_allocation(s)
    with Store(tmp_path, migrations=(*MIGRATIONS, _v2_add_grant_uuid_index)) as st:
        assert st.schema_version == SCHEMA_VERSION + 1
        assert st.get("a") == s
    assert raw(tmp_path / DB_NAME, "SELECT * FROM labels") == [("a", "k", "v")]


def test_failed_migration_changes_nothing(tmp_path):
    with Store(tmp_path) as st:
        st.commit_allocation(make("a"))

    def broken(db: sqlite3.Connection) -> None:
        db.execute("CREATE TABLE half (x)")
        raise RuntimeError("disk on fire")

    with pytest.raises(StateError) as info:
        Store(tmp_path, migrations=(*MIGRATIONS, broken))
    assert info.value.code == StateError.SCHEMA
    assert f"step to version {SCHEMA_VERSION + 1} failed: disk on fire" in str(info.value)
    assert raw(tmp_path / DB_NAME, "PRAGMA user_version") == [(SCHEMA_VERSION,)]
    assert raw(tmp_path / DB_NAME, "SELECT name FROM sqlite_master WHERE name = 'half'") == []
    with Store(tmp_path) as st:
        assert [x.id for x in st.slices()] == ["a"]


def test_newer_database_is_refused(tmp_path):
    with sqlite3.connect(tmp_path / DB_NAME) as db:
        db.execute("PRAGMA user_version = 9")
    with pytest.raises(StateError) as info:
        Store(tmp_path)
    assert info.value.code == StateError.SCHEMA
    assert str(info.value).endswith(
        f"schema version 9 is newer than this vgpud knows ({SCHEMA_VERSION}); upgrade vgpu")


# --- threads --------------------------------------------------------------------------------

def test_threads(store):
    errors: list[BaseException] = []
    conflicts = []
    n_threads, per_thread = 8, 40

    def work(t: int) -> None:
        try:
            for i in range(per_thread):
                store.commit_allocation(make(f"t{t}-{i}", n=1 + i % 3))
                try:  # every thread also races for one shared owner
                    store.commit_allocation(make(f"shared-{t}-{i}", owner=f"shared-{i}"))
                except StateError as e:
                    assert e.code == StateError.CONFLICT
                    conflicts.append(e)
                if i % 2:
                    assert store.delete(f"t{t}-{i - 1}")
                assert store.get(f"t{t}-{i}") is not None
                assert all(len(s.grants) >= 1 for s in store.slices())
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    ids = {s.id for s in store.slices()}
    own = {f"t{t}-{i}" for t in range(n_threads) for i in range(1, per_thread, 2)}
    assert {i for i in ids if i.startswith("t")} == own
    shared = [s for s in store.slices() if s.owner.startswith("shared-")]
    assert sorted(s.owner for s in shared) == sorted(f"shared-{i}" for i in range(per_thread))
    assert len(conflicts) == (n_threads - 1) * per_thread


# --- durability: SIGKILL a writer at random moments -----------------------------------------

WRITER = textwrap.dedent("""
    import sys
    from arbiter.model import Grant, Priority, Slice
    from arbiter.slices.store import Store

    path, prefix = sys.argv[1], sys.argv[2]
    store = Store(path)
    i = 0
    while True:
        n = 1 + i % 4
        sid = f"{prefix}-{i}"
        evict = [f"{prefix}-{i - 3}"] if i % 3 == 0 and i >= 3 else []
        grants = tuple(Grant(g, f"GPU-{g}", (g + 1) << 20, 10) for g in range(n))
        store.commit_allocation(
            Slice(sid, "owner-" + sid, grants, priority=Priority(i % 3), created_ms=i,
                  labels=(("grants", str(n)),)), evict)
        print(sid, ",".join(evict), flush=True)   # acknowledged only after commit returns
        i += 1
""")


def evictions_of(prefix: str, i: int) -> set[str]:
    return {f"{prefix}-{i - 3}"} if i % 3 == 0 and i >= 3 else set()


def test_sigkill_never_loses_or_half_makes_a_slice(tmp_path):
    rng = random.Random(os.getpid())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    expected: set[str] = set()
    for round_ in range(6):
        prefix = f"r{round_}"
        child = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), prefix],
                                 cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        assert child.stdout is not None
        first = read_line(child)  # it is writing: kill it somewhere in the burst
        assert first, child.stderr.read() if child.stderr else ""
        time.sleep(rng.uniform(0.0, 0.4))
        child.send_signal(signal.SIGKILL)
        rest, _ = child.communicate()
        assert child.returncode == -signal.SIGKILL
        lines = (first + rest).split("\n")
        acked = [line for line in lines[:-1]]  # a torn last line was not acknowledged
        for n, line in enumerate(acked):
            sid, evicted = line.split(" ")
            assert sid == f"{prefix}-{n}"
            expected.add(sid)
            expected -= set(filter(None, evicted.split(",")))
        # The commit in flight when the kill came either happened entirely or not at all.
        nxt = len(acked)
        in_flight = (expected | {f"{prefix}-{nxt}"}) - evictions_of(prefix, nxt)

        with Store(tmp_path) as st:
            slices = st.slices()
            ids = {s.id for s in slices}
            assert ids in (expected, in_flight), (round_, len(acked))
            for s in slices:
                assert len(s.grants) == int(dict(s.labels)["grants"]), s.id
                assert [g.gpu_index for g in s.grants] == list(range(len(s.grants)))
            expected = ids
        assert raw(tmp_path / DB_NAME, "PRAGMA integrity_check") == [("ok",)]
        assert raw(tmp_path / DB_NAME,
                   "SELECT count(*) FROM grants WHERE slice_id NOT IN (SELECT id FROM slices)"
                   ) == [(0,)]
    assert len(expected) > 6


# --- group commit ----------------------------------------------------------------------------

def test_group_commit_many_writers_share_batches(tmp_path: Path):
    s = Store(tmp_path)
    n_threads, per_thread = 8, 40
    errors: list[BaseException] = []

    def writer(t: int) -> None:
        try:
            for i in range(per_thread):
                sid = f"s{t:02d}{i:03d}"
                s.commit_allocation_async(make(sid)).result(timeout=30)
                if i % 2:
                    assert s.delete_async(sid).result(timeout=30) is True
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    s.close()
    # Everything acknowledged is on disk, read back by a fresh connection.
    expected = {f"s{t:02d}{i:03d}" for t in range(n_threads) for i in range(0, per_thread, 2)}
    assert {row[0] for row in raw(tmp_path / DB_NAME, "SELECT id FROM slices")} == expected


def test_a_write_that_fails_in_a_batch_fails_alone_and_leaves_nothing(tmp_path: Path):
    """One batch holds writes before and after one that fails half-way: the others commit
    (written again one savepoint each), nothing of the failing one stays."""
    s = Store(tmp_path)
    s.commit_allocation(make("first", owner="dup"))
    sizes: list[int] = []
    write_batch = s._write_batch
    s._write_batch = lambda batch: (sizes.append(len(batch)), write_batch(batch))[1]

    def half(db: sqlite3.Connection) -> None:
        db.execute("DELETE FROM slices WHERE id = 'first'")
        raise RuntimeError("failed after its first statement")

    with s._lock:  # the writer waits on the connection with its first batch taken
        lead = s.delete_async("nothing")
        deadline = time.monotonic() + 10
        while not s._queue.empty() and time.monotonic() < deadline:
            time.sleep(0.001)
        ok = s.commit_allocation_async(make("a"))
        broken = s._submit(half, "a half write")
        clash = s.commit_allocation_async(make("b", owner="dup"))
        after = s.commit_allocation_async(make("c"))
    assert lead.result(timeout=10) is False
    ok.result(timeout=10)
    after.result(timeout=10)
    with pytest.raises(RuntimeError, match="first statement"):
        broken.result(timeout=10)
    with pytest.raises(StateError) as e:
        clash.result(timeout=10)
    assert e.value.code == StateError.CONFLICT
    assert sizes == [1, 4]
    s.close()
    assert sorted(r[0] for r in raw(tmp_path / DB_NAME, "SELECT id FROM slices")) == [
        "a", "c", "first"]
    assert raw(tmp_path / DB_NAME, "SELECT count(*) FROM grants") == [(3,)]


def test_a_lone_write_is_one_statement_in_sqlites_own_transaction(tmp_path: Path):
    """A batch of one allocation or delete runs one statement and no BEGIN or COMMIT (each
    a call that waits for the GIL again); it is durable all the same, slice and grants."""
    s = Store(tmp_path)
    statements: list[str] = []
    s._db.set_trace_callback(statements.append)
    s.commit_allocation_async(make("a", n=3)).result(timeout=10)
    inserted = list(statements)
    statements.clear()
    assert s.delete_async("a").result(timeout=10) is True
    deleted = list(statements)
    statements.clear()
    s.commit_allocation_async(make("b", n=2)).result(timeout=10)
    s._db.set_trace_callback(None)
    # (The trace repeats a statement once per trigger program it runs.)
    assert len(set(inserted)) == 1, inserted
    assert inserted[0].startswith("INSERT INTO temp.new_slice"), inserted
    assert set(deleted) == {"DELETE FROM slices WHERE id = 'a'"}, deleted
    # Read by another connection, as after a crash: the whole slice, nothing of "a".
    assert raw(tmp_path / DB_NAME, "SELECT id FROM slices") == [("b",)]
    assert raw(tmp_path / DB_NAME, "SELECT slice_id, ordinal, gpu_index, gpu_uuid, memory,"
               " compute FROM grants ORDER BY ordinal") == [
        ("b", 0, 0, "GPU-0", GI, 10), ("b", 1, 1, "GPU-1", 2 * GI, 11)]
    s.close()


def test_a_lone_write_that_conflicts_fails_alone_and_leaves_nothing(tmp_path: Path):
    s = Store(tmp_path)
    s.commit_allocation(make("first", owner="dup"))
    with pytest.raises(StateError) as e:
        s.commit_allocation_async(make("second", owner="dup", n=2)).result(timeout=10)
    assert e.value.code == StateError.CONFLICT
    assert "owner 'dup' already holds slice first" in str(e.value)
    s.close()
    assert raw(tmp_path / DB_NAME, "SELECT id FROM slices") == [("first",)]
    assert raw(tmp_path / DB_NAME, "SELECT slice_id FROM grants") == [("first",)]


def test_the_one_statement_insert_leaves_the_files_schema_as_it_was(tmp_path: Path):
    """temp.new_slice is the connection's own: the file keeps the schema an older vgpud
    (or sqlite3 state.db) knows, at the same version."""
    Store(tmp_path).close()
    before = raw(tmp_path / DB_NAME, "SELECT type, name, sql FROM sqlite_master ORDER BY name")
    with Store(tmp_path) as s:
        s.commit_allocation_async(make("a")).result(timeout=10)
        assert raw(tmp_path / DB_NAME, "SELECT type, name, sql FROM sqlite_master"
                   " ORDER BY name") == before
    assert raw(tmp_path / DB_NAME, "PRAGMA user_version") == [(SCHEMA_VERSION,)]
    assert not [row for row in before if "new_slice" in (row[1] or "")]


def test_flush_waits_for_the_writes_queued_before_it(tmp_path: Path):
    """flush() returns once every write queued before it is durable, and not before."""
    s = Store(tmp_path)
    with s._lock:  # the writer waits on the connection with the first write taken
        first = s.commit_allocation_async(make("a"))
        second = s.delete_async("nothing")
        flushed = threading.Event()
        t = threading.Thread(target=lambda: (s.flush(), flushed.set()))
        t.start()
        assert not flushed.wait(0.2)
        assert not first.done() and not second.done()
    t.join(10)
    assert flushed.is_set() and first.done() and second.done()
    assert [x.id for x in s.slices()] == ["a"]
    s.close()
    s.flush()  # closed: nothing queued, returns at once


def test_close_commits_what_was_queued_before_it(tmp_path: Path):
    s = Store(tmp_path)
    with s._lock:
        queued = [s.commit_allocation_async(make(f"q{i}")) for i in range(5)]
        closer = threading.Thread(target=s.close)
        closer.start()
        time.sleep(0.05)
        with pytest.raises(StateError, match="closed"):
            s.commit_allocation_async(make("late"))
    closer.join(10)
    for p in queued:
        p.result(timeout=10)
    assert sorted(r[0] for r in raw(tmp_path / DB_NAME, "SELECT id FROM slices")) == [
        f"q{i}" for i in range(5)]


def test_group_commit_failure_is_confined_to_its_write(tmp_path: Path):
    s = Store(tmp_path)
    s.commit_allocation(make("first", owner="dup"))
    ok = s.commit_allocation_async(make("a"))
    clash = s.commit_allocation_async(make("b", owner="dup"))  # the owner holds a slice
    gone = s.delete_async("first")
    ok.result(timeout=10)
    with pytest.raises(StateError) as e:
        clash.result(timeout=10)
    assert e.value.code == StateError.CONFLICT
    assert gone.result(timeout=10) is True
    s.flush()
    assert sorted(x.id for x in s.slices()) == ["a"]
    s.close()
    with pytest.raises(StateError):
        s.commit_allocation_async(make("late"))
