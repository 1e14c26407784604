"""What a soul host sends to the store shards for one soul (no Ray: the shard calls are recorded)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from actors.soul_host import RemoteMemory


def run(coro: Any) -> Any:
    return asyncio.run(coro)


class Recorded:
    """ShardCalls as the host uses it, recording which layers were asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def call(self, layer: str, soul_id: str, method: str, item: tuple[Any, ...]) -> Any:
        self.asked.append(layer)
        return []


def test_a_layer_with_no_file_is_not_asked_to_recall(tmp_path: Path) -> None:
    calls = Recorded()
    mem = RemoteMemory("s1", calls, tmp_path)  # type: ignore[arg-type]
    assert run(mem.recall("what is up", at=1.0)) == [] and calls.asked == []  # a fresh soul: no call at all
    (tmp_path / "episodic.sqlite").write_bytes(b"")
    run(mem.recall("what is up", at=1.0))
    assert calls.asked == ["episodic"]
    (tmp_path / "semantic.sqlite").write_bytes(b"")
    calls.asked.clear()
    run(mem.recall("what is up", at=1.0))
    assert sorted(calls.asked) == ["episodic", "semantic"]
    shared = Recorded()  # no directory (shared storage, files maybe on another node): every layer is asked
    run(RemoteMemory("s1", shared).recall("what is up", at=1.0))  # type: ignore[arg-type]
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


def test_an_activations_fence_travels_beside_the_first_recall_and_is_up_before_any_write(
        tmp_path: Path, monkeypatch: Any) -> None:
    """The fence calls go out at activation; the first recall is sent before the fence is waited for (no
    extra round trip), returns only once the fence is done, and a failed fence (a newer owner) is raised and
    sent again by the next call; a write (here a forget) never goes out before the fence is seen done."""
    import pytest

    from actors import raycalls
    from soul_runtime.errors import StaleOwner
    log: list[tuple[Any, ...]] = []
    fail = [True]

    class Stores:
        def handle(self, layer: str, soul_id: str) -> str:
            return layer

    class Calls(Recorded):
        stores = Stores()
        crowd = None

        async def call(self, layer: str, soul_id: str, method: str, item: tuple[Any, ...]) -> Any:
            log.append(("send", method, layer))
            await asyncio.sleep(0)  # the answer comes later: the fence is waited for meanwhile
            return await super().call(layer, soul_id, method, item)

    def call(handle: str, method: str, *args: Any) -> tuple[str, str]:
        log.append(("send", method, handle, *args[1:]))
        return (method, handle)

    def get(refs: list[tuple[str, str]]) -> list[Any]:
        log.append(("wait", *sorted(m for m, _ in refs)))
        if fail[0] and any(m == "fence" for m, _ in refs):
            raise StaleOwner("a newer owner fenced this layer")
        return [0 for _ in refs]
    async def get_async(refs: list[tuple[str, str]]) -> list[Any]:
        return get(refs)
    monkeypatch.setattr(raycalls, "call", call)
    monkeypatch.setattr(raycalls, "get", get)
    monkeypatch.setattr(raycalls, "get_async", get_async)
    for layer in ("episodic", "semantic"):
        (tmp_path / f"{layer}.sqlite").write_bytes(b"")
    mem = RemoteMemory("s1", Calls(), tmp_path)  # type: ignore[arg-type]
    mem.fence(7)
    assert log == [("send", "fence", "episodic", 7), ("send", "fence", "semantic", 7)]  # sent, not waited
    log.clear()
    with pytest.raises(StaleOwner):
        run(mem.recall("what is up", at=1.0))
    assert sorted(log[:2]) == [("send", "recall_batch", "episodic"), ("send", "recall_batch", "semantic")]
    assert log[2:] == [("wait", "fence", "fence")]  # the recall went out beside the fence
    log.clear()
    with pytest.raises(StaleOwner):  # still failing: sent again before the next write goes out
        mem.forget()
    assert log == [("send", "fence", "episodic", 7), ("send", "fence", "semantic", 7), ("wait", "fence", "fence")]
    log.clear()
    fail[0] = False
    assert mem.forget() == {"episodic": 0, "semantic": 0, "procedural": 0}
    assert log[:3] == [("send", "fence", "episodic", 7), ("send", "fence", "semantic", 7), ("wait", "fence", "fence")]
    assert [e[1] for e in log[3:] if e[0] == "send"] == ["forget"] * 3  # the writes only after the fence
    log.clear()
    run(mem.recall("what is up", at=1.0))  # fenced: no more fence calls
    assert all(e[1] != "fence" for e in log)
