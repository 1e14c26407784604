"""What a soul host sends to the store shards for one soul (no Ray: the shard calls are recorded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from actors.soul_host import RemoteMemory


class Recorded:
    """ShardCalls as the host uses it, recording which layers were asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def start(self, layer: str, soul_id: str, method: str, item: tuple[Any, ...]) -> Any:
        self.asked.append(layer)

        class Done:
            def result(self) -> list[list[Any]]:
                return [[]]
        return Done()


def test_a_layer_with_no_file_is_not_asked_to_recall(tmp_path: Path) -> None:
    calls = Recorded()
    mem = RemoteMemory("s1", calls, tmp_path)  # type: ignore[arg-type]
    assert mem.recall("what is up", now=1.0) == [] and calls.asked == []  # a fresh soul: no call at all
    (tmp_path / "episodic.sqlite").write_bytes(b"")
    mem.recall("what is up", now=1.0)
    assert calls.asked == ["episodic"]
    (tmp_path / "semantic.sqlite").write_bytes(b"")
    calls.asked.clear()
    mem.recall("what is up", now=1.0)
    assert sorted(calls.asked) == ["episodic", "semantic"]
    shared = Recorded()  # no directory (shared storage, files maybe on another node): every layer is asked
    RemoteMemory("s1", shared).recall("what is up", now=1.0)  # type: ignore[arg-type]
    assert sorted(shared.asked) == ["episodic", "procedural", "semantic"]


def test_a_new_activation_fences_only_the_layers_with_a_file(tmp_path: Path, monkeypatch: Any) -> None:
    from actors import raycalls
    fenced: list[tuple[str, str, int]] = []

    class Stores:
        def handle(self, layer: str, soul_id: str) -> str:
            return layer

    class Calls:
        stores = Stores()
        crowd = None
    monkeypatch.setattr(raycalls, "call", lambda h, method, soul, epoch: fenced.append((h, soul, epoch)) or h)
    monkeypatch.setattr(raycalls, "get", lambda refs: refs)
    mem = RemoteMemory("s1", Calls(), tmp_path)  # type: ignore[arg-type]
    mem.fence(3)
    assert fenced == []  # a new soul: nothing to fence, no call
    (tmp_path / "episodic.sqlite").write_bytes(b"")
    mem.fence(4)
    assert fenced == [("episodic", "s1", 4)]
    fenced.clear()
    RemoteMemory("s1", Calls()).fence(5)  # type: ignore[arg-type]  # shared storage: every layer
    assert sorted(h for h, _, _ in fenced) == ["episodic", "procedural", "semantic"]
