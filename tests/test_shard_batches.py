"""A store shard's batch of writes: each request is read from its plain form once, for the embedder's warm-up
and the write alike, and an item that cannot be read is refused alone (no Ray: the shard class in process)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from actors import layer_shard
from actors.layer_shard import LayerShard
from soul_runtime.config import MemoryConfig
from soul_runtime.errors import InvalidInput
from soul_runtime.records import Extraction, WriteRequest, to_plain


def _request(turn: str, episode: str) -> dict[str, Any]:
    return to_plain(WriteRequest(turn_key=turn, now=1_780_000_000.0, actor="maya", sources=(turn,),
                                 extraction=Extraction(episode=episode, event=True)))


def test_each_request_is_read_once_and_a_bad_item_is_refused_alone(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[str] = []
    real = layer_shard.request_from_plain

    def counted(d: dict[str, Any]) -> WriteRequest:
        read.append(str(d.get("turn_key")))
        return real(d)
    monkeypatch.setattr(layer_shard, "request_from_plain", counted)
    shard = LayerShard("episodic", str(tmp_path), asdict(MemoryConfig()), 8, "fast", 0, 1, 0.0)
    try:
        good = [_request("a/1", "Maya moved the standup to 9:30."), _request("a/2", "Maya booked the Lisbon flight.")]
        bad = [{"turn_key": "b/1"}]  # not a write request
        out = shard.apply_batch([("a", good, None), ("b", bad, None)])
        assert isinstance(out[1], (InvalidInput, KeyError, TypeError)) and not isinstance(out[0], Exception)
        assert [w.op.value for ws in out[0] for w in ws] == ["ADD", "ADD"]
        assert sorted(read) == ["a/1", "a/2", "b/1"]  # once each, though the embedder warmed the episodes first
    finally:
        shard.stop()
