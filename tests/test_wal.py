"""Torn SQLite WAL tails: a writer SIGKILLed leaves its WAL; the tail is truncated or garbled; on reopen
every acknowledged write is there, the index agrees, and the store keeps working."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from soul_runtime.memory.soul_memory import SoulMemory
from soul_runtime.records import Extraction, WriteRequest
from tests.fakes import HashEmbedder
from tests.test_crash import write_then_kill


@pytest.mark.parametrize("damage", ["append-garbage", "truncate-partial-frame", "delete-index"])
def test_torn_wal_tail_loses_nothing_acknowledged(tmp_path: Path, damage: str) -> None:
    acked = write_then_kill(tmp_path, 40)
    wal = tmp_path / "episodic.sqlite-wal"
    assert wal.exists() and wal.stat().st_size > 0, "the killed writer should leave its WAL behind"
    size = wal.stat().st_size
    if damage == "append-garbage":  # a torn write after the last commit frame
        with open(wal, "ab") as f:
            f.write(os.urandom(3000))
    elif damage == "truncate-partial-frame":  # a frame cut short: only an unfinished transaction's bytes go
        page = struct.unpack(">I", wal.read_bytes()[8:12])[0]  # the WAL header names the page size
        frame = 24 + page
        whole = 32 + ((size - 32) // frame) * frame
        with open(wal, "ab") as f:
            f.write(os.urandom(frame // 2))
        os.truncate(wal, whole + frame // 3)
    else:
        (tmp_path / "episodic.usearch").unlink(missing_ok=True)
    m = SoulMemory(tmp_path, embedder=HashEmbedder())
    sources = {s for e in m.episodes() for s in e.sources}
    assert set(acked) <= sources
    assert m.stats()["indexed"] == m.stats()["episodes"]
    m.write(WriteRequest(turn_key="after", now=1.7e9 + 10_000, actor="maya", sources=("after",),
                         extraction=Extraction(episode="The store keeps working after the repair.", event=True)))
    assert any("after" in it.sources for it in m.recall("store keeps working", 3, at=1.7e9 + 10_001))
    m.close()
