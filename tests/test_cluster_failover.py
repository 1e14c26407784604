"""Failover past a held lock: a soul's host is killed and Ray restarts it (a new owner) while another process holds
a write lock on the soul's database for longer than SQLite's busy timeout (30 s), as a paused or cut-off old owner
does, or a network file system that keeps a dead client's lock until its lease expires. The turn on the new owner
fails its first try with "database is locked" after the busy timeout; the router tries it again until the lock is
let go (``lease_wait_s``) and the caller gets its answer, no error. The retry policy itself is checked without Ray.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
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
import sqlite3, sys, time
path, marks, hold = sys.argv[1], sys.argv[2], float(sys.argv[3])
con = sqlite3.connect(path, isolation_level=None, timeout=60)
con.execute("BEGIN EXCLUSIVE")  # what an old owner holds mid-commit: no one else reads or writes the file
open(marks + "/locked", "w").write(repr(time.time()))
time.sleep(hold)
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
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(db), str(base), str(HOLD_S)])
        while not (base / "locked").exists():
            assert holder.poll() is None, "the lock holder died"
            time.sleep(0.05)
        host = raycalls.get_actor(rt.placement("maya")["host"], rt.cfg.namespace)
        os.kill(int(raycalls.get(raycalls.call(host, "pid"), timeout=60)), signal.SIGKILL)  # a new owner
        with caplog.at_level(logging.WARNING, logger="soul_runtime.routing"):
            result = soul.turn("We moved the staging cluster to Frankfurt.", user="maya")
        done = time.time()
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
