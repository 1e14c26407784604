"""Failover past a held lock: a soul's host is killed and Ray restarts it (a new owner) while another process holds
a write lock on the soul's database for longer than SQLite's busy timeout (30 s), as a paused or cut-off old owner
does, or a network file system that keeps a dead client's lock until its lease expires. The turn on the new owner
fails its first try with "database is locked" after the busy timeout; the router tries it again until the lock is
let go (``lease_wait_s``) and the caller gets its answer, no error. The retry policy itself is checked without Ray.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from actors import raycalls
from actors.retry import DEFAULT, LEASE_WAIT_S, RetryPolicy, lock_held
from actors.routing import Routed, Router
from soul_runtime.errors import StorageError
from soul_runtime.steps import Call, Pause

BUSY_TIMEOUT_S = 30.0  # SQLite's busy timeout of every database the runtime opens (memory.sqlite_db)
HOLD_S = BUSY_TIMEOUT_S + 10

HOLDER = r"""
import os, sqlite3, sys, time
path, marks, hold = sys.argv[1], sys.argv[2], float(sys.argv[3])
con = sqlite3.connect(path, isolation_level=None, timeout=60)
con.execute("BEGIN EXCLUSIVE")  # what an old owner holds mid-commit: no one else reads or writes the file
open(marks + "/locked", "w").write(repr(time.time()))
end = time.time() + hold
while time.time() < end and not (len(sys.argv) > 4 and os.path.exists(sys.argv[4])):  # held, or till told
    time.sleep(0.05)
open(marks + "/released", "w").write(repr(time.time()))  # before the lock goes: a turn done later saw it held
con.execute("ROLLBACK")
con.close()
"""


def test_the_policy_waits_for_a_held_lock_up_to_the_lease_wait() -> None:
    assert DEFAULT.lease_wait_s == LEASE_WAIT_S >= 90 + BUSY_TIMEOUT_S  # a 90 s NFS lease and one busy timeout
    p = RetryPolicy(lease_wait_s=10, lock_pause_s=1)
    assert p.lock_pause(100.0, 100.0) == 1 and p.lock_pause(100.0, 109.5) == 0.5
    assert p.lock_pause(100.0, 110.0) is None
    assert RetryPolicy(lease_wait_s=0).lock_pause(5.0, 5.0) is None
    assert lock_held(StorageError("souls/x/soul.sqlite: OperationalError (database is locked)"))
    assert not lock_held(StorageError("souls/x/soul.sqlite: disk full (database or disk is full)"))
    assert not lock_held(RuntimeError("database is locked"))


class _Handle:
    def __init__(self, name: str) -> None:
        self.name = name


LOCKED = StorageError("souls/s/soul.sqlite: OperationalError (database is locked)")


def _router(monkeypatch: pytest.MonkeyPatch, lease_wait_s: float) -> tuple[Router, list[float]]:
    monkeypatch.setattr(raycalls, "get_actor", lambda name, ns: _Handle(name))
    r = Router(["soul-host-0"], "ns", retry=RetryPolicy(lease_wait_s=lease_wait_s, lock_pause_s=1.0))
    now = [1000.0]
    r.clock = lambda: now[0]  # type: ignore[method-assign]
    return r, now


def test_the_router_tries_a_locked_turn_again_until_the_lease_wait(monkeypatch: pytest.MonkeyPatch,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """Each try is refused only after SQLite's busy timeout (30 s on the fake clock): three refusals, then the
    answer; with a shorter lease wait the third refusal is the caller's, naming the setting."""
    r, now = _router(monkeypatch, lease_wait_s=90)
    steps = r.steps(Routed("s", "run", ("turn",)))
    step, calls, pauses = next(steps), 0, []
    with caplog.at_level(logging.WARNING, logger="soul_runtime.routing"):
        while True:
            assert isinstance(step, Call)
            calls += 1
            now[0] += BUSY_TIMEOUT_S
            if calls <= 3:
                step = steps.throw(LOCKED)
                while isinstance(step, Pause):
                    pauses.append(step.seconds)
                    now[0] += step.seconds
                    step = steps.send(None)
                continue
            try:
                steps.send("answer")
            except StopIteration as done:
                assert done.value == "answer"
                break
    assert calls == 4 and pauses == [1.0, 1.0, 1.0]  # not counted as attempts, however many there are
    assert len([rec for rec in caplog.records if hasattr(rec, "lock_wait")]) == 1  # one warning per call

    r, now = _router(monkeypatch, lease_wait_s=45)
    steps = r.steps(Routed("s", "run", ("turn",)))
    step = next(steps)
    with pytest.raises(StorageError, match="lease_wait_s"):
        for _ in range(10):
            now[0] += BUSY_TIMEOUT_S
            step = steps.throw(LOCKED)
            while isinstance(step, Pause):
                now[0] += step.seconds
                step = steps.send(None)


def test_other_storage_errors_reach_the_caller_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    r, _ = _router(monkeypatch, lease_wait_s=90)
    steps = r.steps(Routed("s", "run", ("turn",)))
    next(steps)
    with pytest.raises(StorageError, match="disk full"):
        steps.throw(StorageError("souls/s/soul.sqlite: disk full (database or disk is full)"))


@pytest.mark.ray
def test_a_turn_on_a_new_owner_waits_out_a_lock_held_past_the_busy_timeout(caplog: pytest.LogCaptureFixture) -> None:
    import soul_runtime
    base = Path(tempfile.mkdtemp(prefix="lease", dir="/tmp"))
    rt = soul_runtime.connect(data_dir=str(base / "data"), namespace="lease-wait", storage="shared",
                              embedder="fast", hosts=1, episodic_shards=1, semantic_shards=1, procedural_shards=1)
    holder = None
    try:
        soul = rt.soul("maya")
        assert soul.turn("The production database for Tendril is Postgres 15.", user="maya").seq == 1
        db = base / "data" / "souls" / "maya" / "soul.sqlite"
        assert db.is_file()
        # held till a try of the turn was refused for it (past the busy timeout), at most HOLD_S
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(db), str(base), str(HOLD_S),
                                   str(base / "release")])
        while not (base / "locked").exists():
            assert holder.poll() is None, "the lock holder died"
            time.sleep(0.05)
        host = raycalls.get_actor(rt.placement("maya")["host"], rt.cfg.namespace)
        os.kill(int(raycalls.get(raycalls.call(host, "pid"), timeout=60)), signal.SIGKILL)  # a new owner

        def release_once_refused() -> None:
            while holder.poll() is None:
                if any(getattr(r, "lock_wait", None) is not None for r in list(caplog.records)):
                    (base / "release").write_text("")
                    return
                time.sleep(0.1)
        releaser = threading.Thread(target=release_once_refused, daemon=True)
        with caplog.at_level(logging.WARNING, logger="soul_runtime.routing"):
            releaser.start()
            result = soul.turn("We moved the staging cluster to Frankfurt.", user="maya")
        done = time.time()
        releaser.join()
        assert result.seq == 2  # the caller got its answer: no error reached it
        released = float((base / "released").read_text())
        locked = float((base / "locked").read_text())
        assert locked <= released <= done  # it was answered only once the lock had gone ...
        assert holder.wait(60) == 0
        waits = [r for r in caplog.records if getattr(r, "lock_wait", None) is not None]
        assert waits, "no try was refused for the lock"  # ... after a try had failed past the busy timeout
        assert [t.seq for t in soul.traces(last=5)] == [1, 2]  # applied once
    finally:
        if holder is not None and holder.poll() is None:
            holder.kill()
        rt.shutdown_actors()
        rt.close()


def test_a_read_waits_for_a_held_lock_as_a_turn_does_and_other_errors_reach_the_caller_at_once(
        caplog: pytest.LogCaptureFixture) -> None:
    """A read (straight to the soul's store shard) refused for a lock another process holds is tried again, once a
    second, until ``lease_wait_s``; past it the StorageError names the setting; any other error is the caller's."""
    from actors.shard_reads import ShardRead, read_steps
    now = [1000.0]
    read = ShardRead("semantic", "s", "read", ("s", "facts", None))
    steps = read_steps(read, RetryPolicy(lease_wait_s=90, lock_pause_s=1.0), lambda: now[0])
    step, calls, pauses = next(steps), 0, []
    with caplog.at_level(logging.WARNING, logger="soul_runtime.routing"):
        while True:
            assert isinstance(step, Call) and step.target == read
            calls += 1
            now[0] += BUSY_TIMEOUT_S
            if calls <= 2:
                step = steps.throw(LOCKED)
                while isinstance(step, Pause):
                    pauses.append(step.seconds)
                    now[0] += step.seconds
                    step = steps.send(None)
                continue
            try:
                steps.send(["a fact"])
            except StopIteration as done:
                assert done.value == ["a fact"]
                break
    assert calls == 3 and pauses == [1.0, 1.0]
    assert [r.getMessage().split(":")[0] for r in caplog.records if hasattr(r, "lock_wait")] == ["read of s (semantic)"]

    steps = read_steps(read, RetryPolicy(lease_wait_s=45, lock_pause_s=1.0), lambda: now[0])
    next(steps)
    with pytest.raises(StorageError, match="lease_wait_s"):
        for _ in range(10):
            now[0] += BUSY_TIMEOUT_S
            step = steps.throw(LOCKED)
            while isinstance(step, Pause):
                now[0] += step.seconds
                step = steps.send(None)
    steps = read_steps(read, RetryPolicy(lease_wait_s=90), lambda: now[0])
    next(steps)
    with pytest.raises(StorageError, match="disk full"):
        steps.throw(StorageError("souls/s/semantic.sqlite: disk full (database or disk is full)"))


def test_a_shard_hands_a_read_refused_for_a_lock_on_without_touching_the_database_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read the soul's database refuses for a lock another connection holds reaches the caller (whose retry policy
    waits the lock out) as the StorageError "database is locked" once; the shard sends no other statement to the
    locked file, each of which would wait out SQLite's busy timeout again. A read that succeeds has the store's
    memory measured for the shard's capacity in bytes, and the failed one leaves that figure as it was."""
    import sqlite3
    from dataclasses import asdict

    from actors.layer_shard import LayerShard
    from soul_runtime.config import MemoryConfig
    from soul_runtime.memory import sqlite_db
    monkeypatch.setattr(sqlite_db, "_storage", ["local"])  # the shard's storage setting stays this test's
    # shared storage (a rollback journal), where a lock another process holds refuses readers too
    shard = LayerShard("semantic", str(tmp_path), asdict(MemoryConfig()), 8, "fast", 0, 1, 0.0, storage="shared",
                       capacity_bytes=1 << 30)
    try:
        (tmp_path / "souls" / "maya").mkdir(parents=True)  # a soul that exists (reads of unknown souls create none)
        shard.read("maya", "stats")  # creates and opens the soul's semantic database
        measured = shard.sizes["maya"]
        assert measured > 0
        db = shard.open["maya"].db
        db.execute("PRAGMA busy_timeout=50")  # this test's own wait for the lock (the runtime's is 30 s)
        sent: list[str] = []
        db.set_trace_callback(sent.append)
        holder = sqlite3.connect(tmp_path / "souls" / "maya" / "semantic.sqlite", isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            with pytest.raises(StorageError) as refused:
                shard.read("maya", "facts")
            assert lock_held(refused.value), refused.value
            assert len(sent) == 1, sent  # the refused statement alone
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert shard.sizes["maya"] == measured
        sent.clear()
        assert shard.read("maya", "facts") == []
        assert any("page_count" in q for q in sent), sent  # measured after a read that succeeded
        db.set_trace_callback(None)
    finally:
        shard.stop()


@pytest.mark.ray
def test_reads_wait_out_a_lock_held_on_a_layers_database_past_the_busy_timeout(
        caplog: pytest.LogCaptureFixture) -> None:
    """Another process holds the soul's semantic and episodic databases locked (past SQLite's busy timeout, till a
    read of each layer has been refused for the lock): a blocking facts(), and recall() and episodes() from a
    coroutine, sent while the locks are held, get their answers once the locks are gone, no error."""
    import asyncio
    import threading

    import soul_runtime
    base = Path(tempfile.mkdtemp(prefix="leaseread", dir="/tmp"))
    rt = soul_runtime.connect(data_dir=str(base / "data"), namespace="lease-read", storage="shared",
                              embedder="fast", hosts=1, episodic_shards=1, semantic_shards=1, procedural_shards=1)
    holders: list[subprocess.Popen[bytes]] = []
    try:
        soul = rt.soul("maya")
        soul.turn("The production database for Tendril is Postgres 15.", user="maya")
        facts, episodes = soul.facts(), soul.episodes()  # (a fact needs confirming: none yet)
        assert len(episodes) == 1
        for layer in ("semantic", "episodic"):
            marks = base / layer
            marks.mkdir()
            db = base / "data" / "souls" / "maya" / f"{layer}.sqlite"
            assert db.is_file()
            holders.append(subprocess.Popen([sys.executable, "-c", HOLDER, str(db), str(marks), "600",
                                             str(base / "release")]))
            while not (marks / "locked").exists():
                assert holders[-1].poll() is None, "the lock holder died"
                time.sleep(0.05)
        got: dict[str, object] = {}

        async def from_a_coroutine() -> None:
            a = rt.async_soul("maya")
            got["recall"], got["episodes"] = await asyncio.gather(a.recall("Tendril database", stores=["episodic"]),
                                                                  a.episodes())

        def waits() -> set[str]:
            return {r.getMessage().split(":")[0] for r in list(caplog.records)
                    if getattr(r, "lock_wait", None) is not None}

        def refused_both() -> bool:
            w = waits()
            return "read of maya (semantic)" in w and bool(w & {"recall of maya (episodic)", "read of maya (episodic)"})

        with caplog.at_level(logging.WARNING, logger="soul_runtime.routing"):
            t = threading.Thread(target=lambda: asyncio.run(from_a_coroutine()))
            f = threading.Thread(target=lambda: got.__setitem__("facts", soul.facts()))
            t.start()
            f.start()
            give_up = time.monotonic() + 300  # the locks are held till each layer's read has met one (an event)
            while not refused_both() and time.monotonic() < give_up and t.is_alive():
                time.sleep(0.1)
            (base / "release").write_text("")
            f.join()
            t.join()
        done = time.time()
        released = max(float((base / layer / "released").read_text()) for layer in ("semantic", "episodic"))
        assert released <= done  # answered only once the locks had gone ...
        assert all(h.wait(60) == 0 for h in holders)
        assert got["facts"] == facts and got["episodes"] == episodes, got
        assert [i.id for i in got["recall"]] == [e.id for e in episodes], got  # type: ignore[attr-defined]
        # the first of recall() and episodes() the episodic shard takes meets the lock; the other waits in the shard
        # behind it (one call of a soul at a time there) and finds it gone
        assert refused_both(), waits()
    finally:
        for h in holders:
            if h.poll() is None:
                h.kill()
        rt.shutdown_actors()
        rt.close()
        shutil.rmtree(base, ignore_errors=True)
