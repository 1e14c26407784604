"""Storage limits say so: a full disk, read-only storage or a file size limit reaches the caller as StorageError
naming the cause; nothing acknowledged is lost, and the soul serves again once the storage is back."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from soul_runtime.errors import StorageError
from soul_runtime.loop.soul import Soul
from soul_runtime.memory.soul_memory import SoulMemory
from soul_runtime.memory.sqlite_db import storage_cause, transaction
from soul_runtime.models.offline import OfflineModel
from tests.fakes import HashEmbedder

T0 = 1_780_000_000.0
ROOT = Path(__file__).resolve().parents[1]


def _text(i: int) -> str:
    return (f"Turn {i}: the gateway p95 latency for service{i} is {i} ms, sprint {i} ends on Friday and we pin "
            f"fastapi 0.{i}.2 with marker zq{i}x.")


def _open(d: Path) -> tuple[Soul, SoulMemory]:
    mem = SoulMemory(d, embedder=HashEmbedder())
    return Soul("dev", d, memory=mem, model=OfflineModel()), mem


def _fill(soul: Soul, start: int, limit: int = 3000) -> tuple[list[int], StorageError]:
    """Turns until the storage refuses one: (the acknowledged turns, the error)."""
    acked = []
    for i in range(start, start + limit):
        try:
            soul.turn(_text(i), user="dev", at=T0 + 60 * i)
        except StorageError as e:
            return acked, e
        acked.append(i)
    raise AssertionError(f"{limit} turns fitted: the storage never filled up")


def _all_there(d: Path, acked: list[int]) -> None:
    """Every acknowledged turn is in the record, read by a fresh opening of the soul."""
    soul, mem = _open(d)
    try:
        assert soul.state.last_seq >= len(acked)
        traces = soul.traces(len(acked) + 10)
        said = {t.query for t in traces}
        assert {_text(i) for i in acked} <= said
        for i in acked[:: max(1, len(acked) // 8)]:
            assert any(f"zq{i}x" in ep.summary or f"service{i}" in ep.summary for ep in mem.episodes()), i
        for name in ("soul.sqlite", "episodic.sqlite", "semantic.sqlite", "procedural.sqlite"):
            con = sqlite3.connect(d / name)
            assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            con.close()
    finally:
        soul.close()
        mem.close()


def _serves_again(soul: Soul, mem: SoulMemory) -> None:
    r = soul.turn("After the storage came back: the cache hit rate is 97% with marker back1.", user="dev",
                  at=T0 + 10**6)
    assert r.seq == soul.state.last_seq
    assert any("back1" in it.text for it in mem.recall("cache hit rate marker back1", 5, at=T0 + 10**6 + 1))


def test_a_failed_transaction_raises_the_cause_not_the_rollback() -> None:
    con = sqlite3.connect(":memory:", isolation_level=None)
    con.execute("CREATE TABLE t (x BLOB)")
    page = int(con.execute("PRAGMA page_size").fetchone()[0])
    con.execute(f"PRAGMA max_page_count={int(con.execute('PRAGMA page_count').fetchone()[0]) + 2}")
    with pytest.raises(StorageError, match="disk full"):
        with transaction(con):
            con.execute("INSERT INTO t VALUES (?)", (b"x" * page * 8,))
    assert not con.in_transaction
    with transaction(con):  # the connection serves again
        con.execute("INSERT INTO t VALUES (x'00')")
    assert con.execute("SELECT COUNT(*) FROM t").fetchone()[0] == 1


def test_causes_are_named() -> None:
    assert storage_cause(OSError(28, "No space left on device")) == "disk full"
    assert storage_cause(OSError(30, "Read-only file system")) == "read-only storage"
    assert storage_cause(OSError(5, "Input/output error")) == "I/O error"
    assert storage_cause(OSError(27, "File too large")) == "file size limit"
    assert storage_cause(sqlite3.OperationalError("attempt to write a readonly database")) == "read-only storage"


@pytest.fixture
def tmpfs() -> Iterator[Path]:
    """A 3 MB tmpfs (needs the right to mount: root, or skipped — the file size limit test runs everywhere)."""
    mnt = Path(tempfile.mkdtemp(prefix="soul-tmpfs-"))
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m,mode=0700", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        mnt.rmdir()
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
        mnt.rmdir()


def test_full_disk_then_space_back(tmpfs: Path) -> None:
    ballast = tmpfs / "ballast"
    ballast.write_bytes(b"x" * 700_000)
    d = tmpfs / "soul"
    soul, mem = _open(d)
    acked, err = _fill(soul, 0)
    assert "disk full" in str(err) and str(d) in str(err), err
    assert len(acked) > 20
    with pytest.raises(StorageError, match="disk full"):  # still full: still said so
        soul.turn("One more while the disk is full: marker full2.", user="dev", at=T0 + 5 * 10**5)
    ballast.unlink()
    _serves_again(soul, mem)
    soul.close()
    mem.close()
    _all_there(d, acked)


def test_read_only_storage_then_writable_again(tmpfs: Path) -> None:
    d = tmpfs / "soul"
    soul, mem = _open(d)
    for i in range(5):
        soul.turn(_text(i), user="dev", at=T0 + 60 * i)
    soul.close()
    mem.close()
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    try:
        with pytest.raises(StorageError, match="read-only|cannot open"):
            soul, mem = _open(d)
            soul.turn("Written while the storage is read-only: marker ro1.", user="dev", at=T0 + 10**5)
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(tmpfs)], check=True)
    soul, mem = _open(d)
    _serves_again(soul, mem)
    soul.close()
    mem.close()
    _all_there(d, list(range(5)))


_FSIZE_CHILD = """
import resource, signal, sys
from pathlib import Path
sys.path.insert(0, {root!r})
from tests.test_storage_limits import _fill, _open, _serves_again
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing us
d = Path({dir!r})
soul, mem = _open(d)
soul.turn("Warm up: the first turn creates every file.", user="dev", at=1.0)
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (max(p.stat().st_size for p in d.iterdir()) + 150_000, hard))
acked, err = _fill(soul, 0)
print("ERR", err)
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
_serves_again(soul, mem)
soul.close(); mem.close()
print("ACKED", ",".join(map(str, acked)))
"""


def test_file_size_limit_then_lifted(tmp_path: Path) -> None:
    """The same with a per-process file size limit (RLIMIT_FSIZE, in a child process): runs without root."""
    d = tmp_path / "soul"
    out = subprocess.run([sys.executable, "-c", _FSIZE_CHILD.format(root=str(ROOT), dir=str(d))],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    err = next(line for line in out.stdout.splitlines() if line.startswith("ERR "))
    assert "file size limit" in err or "disk full" in err, err
    acked = [int(x) for x in next(line for line in out.stdout.splitlines() if line.startswith("ACKED "))[6:].split(",")]
    assert len(acked) > 5
    _all_there(d, acked)

