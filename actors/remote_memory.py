"""A soul's memory as its host sees it: the three layers on the store shards, called in parallel and batched."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from soul_runtime.clock import to_timestamp
from soul_runtime.memory.erasure import Erased, ForgetQuery
from soul_runtime.memory.soul_memory import answer_without_store, cross_layer_marks, merge_recalls, parse_stores
from soul_runtime.records import LAYERS, MemoryWrite, RecalledItem, Store, WriteRequest, to_plain

from . import raycalls
from .shard_client import ShardCalls, results


def _first_error(answers: list[Any]) -> list[Any]:
    for a in answers:
        if isinstance(a, BaseException):
            raise a
    return answers


class RemoteMemory:
    """The loop's MemoryPort over store actors: the three layers in parallel, cross-layer marks on write,
    each call batched with other souls' calls to the same shard (:class:`ShardCalls`). ``recall`` and
    ``write_many`` (the turn path) are coroutines the host's loop awaits; the rest block (a host runs them on
    its threads).

    ``directory``: the soul's directory as this process sees it, given when the stores' files are on this
    machine (``storage="local"``): a layer with no file there has nothing to recall and is not called (a
    stat instead of a call; its writes go through this host, so the file appears before it is read)."""

    def __init__(self, soul_id: str, calls: ShardCalls, directory: Path | None = None) -> None:
        self.soul_id = soul_id
        self.calls = calls
        self.dir = directory
        self._fencing: tuple[int, list[Any] | None] | None = None  # the activation's fence, sent and not yet seen done

    def _stored(self, layer: Store) -> bool:
        return self.dir is None or (self.dir / f"{layer.value}.sqlite").exists()

    async def recall(self, query: str, k: int = 10, at: Any = None, stores: Any = None, *,
                     task_class: str | None = None) -> list[RecalledItem]:
        """The layers' recalls, in parallel; an activation's fence still in flight goes alongside (a read needs
        no fence), and is seen done before the recall returns (its error is the one reported)."""
        when = time.time() if at is None else to_timestamp(at)
        calls = [self.calls.call(s.value, self.soul_id, "recall_batch", (self.soul_id, query, k, when, task_class))
                 for s in parse_stores(stores) if self._stored(s)]
        *answers, fence = await asyncio.gather(*calls, self.fenced_async(), return_exceptions=True)
        return merge_recalls(_first_error([fence, *answers])[1:], k)

    def embed_ahead(self, reqs: list[WriteRequest]) -> None:
        """Nothing: a store actor embeds a soul's writes when it gets them, while this host reads on."""

    async def write_many(self, reqs: list[WriteRequest]) -> list[list[MemoryWrite]]:
        """The layers that have something to write get a call (semantic and procedural at once, then episodic
        with the semantic layer's marks); the others answer here without a call (``answer_without_store``)."""
        plain = [to_plain(r) for r in reqs]
        await self.fenced_async()

        async def write(layer: Store, marks: dict[str, list[str]] | None = None) -> list[list[MemoryWrite]]:
            answer = answer_without_store(layer, reqs, marks)
            if answer is not None:
                return answer
            got: list[list[MemoryWrite]] = await self.calls.call(layer.value, self.soul_id, "apply_batch",
                                                                 (self.soul_id, plain, marks))
            return got

        async def semantic_then_episodic() -> tuple[Any, Any]:
            sem = await write(Store.SEMANTIC)
            return sem, await write(Store.EPISODIC, cross_layer_marks(w for ws in sem for w in ws))

        both, proc = _first_error(list(await asyncio.gather(semantic_then_episodic(), write(Store.PROCEDURAL),
                                                            return_exceptions=True)))
        sem, epi = both
        return [e + s + p for e, s, p in zip(epi, sem, proc, strict=True)]


    def forget(self, stores: Any = None) -> dict[str, int]:
        self.fenced()
        layers = [s.value for s in parse_stores(stores)]
        refs = [raycalls.call(self.calls.stores.handle(layer, self.soul_id), "forget", self.soul_id) for layer in layers]
        return {layer: int(n) for layer, n in zip(layers, raycalls.get(refs), strict=True)}

    def fence(self, epoch: int) -> None:
        """Fence the soul's layers for a new activation; a layer with no file has nothing to fence (its shard
        would say so too; its first write carries the epoch), so a new soul costs no call here.

        The calls are sent now and seen done (:meth:`fenced`) before anything else of this memory returns or
        writes: the first recall travels beside them instead of after them (a round trip less per activation),
        and no write of this owner goes out before its fence is up."""
        refs = self._fence_calls(epoch)
        self._fencing = (epoch, refs) if refs else None

    def _fence_calls(self, epoch: int) -> list[Any]:
        return [raycalls.call(self.calls.stores.handle(s.value, self.soul_id), "fence", self.soul_id, epoch)
                for s in LAYERS if self._stored(s)]

    def fenced(self) -> None:
        """Wait for the activation's fence. A failure (a newer owner: StaleOwner; a shard lost) is raised, and
        the next call of this activation sends the fence again: nothing passes a layer not yet fenced."""
        if self._fencing is None:
            return
        epoch, refs = self._fencing
        self._fencing = (epoch, None)  # until seen done
        raycalls.get(refs if refs is not None else self._fence_calls(epoch))
        self._fencing = None

    async def fenced_async(self) -> None:
        """:meth:`fenced`, awaited."""
        if self._fencing is None:
            return
        epoch, refs = self._fencing
        self._fencing = (epoch, None)  # until seen done
        await raycalls.get_async(refs if refs is not None else self._fence_calls(epoch))
        self._fencing = None

    def forget_matching(self, query: ForgetQuery) -> dict[str, Erased]:
        self.fenced()
        refs = [raycalls.call(self.calls.stores.handle(s.value, self.soul_id), "forget_where", self.soul_id, query)
                for s in LAYERS]
        return {s.value: e for s, e in zip(LAYERS, raycalls.get(refs), strict=True)}

    def is_empty(self) -> bool:
        """No layer holds anything (the activation's fence is seen done first: an import writes next)."""
        self.fenced()
        return all(results([self.calls.send(s.value, self.soul_id, "read", self.soul_id, "is_empty")
                            for s in LAYERS]))

    def import_layers(self, data: dict[str, Any]) -> None:
        results([self.calls.send(s.value, self.soul_id, "import_", self.soul_id, data[s.value]) for s in LAYERS])
