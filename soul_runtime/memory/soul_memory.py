"""One soul's long-term memory in process: the three layers behind one API.

This is the engine the Ray layer wraps; store actors open the layers
individually (:func:`open_layer`), a laptop opens all three (:class:`SoulMemory`).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from soul_runtime.clock import to_timestamp
from soul_runtime.config import MemoryConfig
from soul_runtime.embedding.base import Embedder
from soul_runtime.embedding.choice import default_embedder
from soul_runtime.errors import InvalidInput
from soul_runtime.memory.digest import Digest
from soul_runtime.memory.episodic import EpisodicStore
from soul_runtime.memory.erasure import Erased, ForgetQuery
from soul_runtime.memory.export import import_export, pack_export
from soul_runtime.memory.procedural import ProceduralStore
from soul_runtime.memory.semantic import SemanticStore
from soul_runtime.records import (
    LAYERS,
    Episode,
    Fact,
    FactVersion,
    MemoryWrite,
    Procedure,
    RecalledItem,
    Store,
    WriteRequest,
)
from soul_runtime.text import check_write_request


def parse_stores(stores: Iterable[str] | None) -> tuple[Store, ...]:
    if stores is None:
        return LAYERS
    if isinstance(stores, str):
        stores = [stores]
    if not isinstance(stores, (list, tuple, set, frozenset)):
        raise InvalidInput(f"stores must be a list of layer names, got {stores!r}")
    out = []
    for s in stores:
        try:
            out.append(Store(s))
        except (ValueError, TypeError):
            raise InvalidInput(f"unknown store {s!r}; expected one of episodic, semantic, procedural") from None
    return tuple(dict.fromkeys(out))


def merge_recalls(lists: Sequence[Sequence[RecalledItem]], k: int) -> list[RecalledItem]:
    """Merge the layers' results by score (each layer scores on [0, 1]); ties by store then id."""
    order = {s.value: i for i, s in enumerate(LAYERS)}
    items = [it for lst in lists for it in lst]
    items.sort(key=lambda it: (-it.score, order.get(it.store, 9), it.id))
    return items[:k]


def answer_without_store(layer: Store, reqs: list[WriteRequest], marks: dict[str, list[str]] | None = None
                         ) -> list[list[MemoryWrite]] | None:
    """A layer's answer to ``apply_many(reqs)`` when it does not depend on what is stored because there is
    nothing for the layer to write (no fact, no task run, no episode and no cross-layer mark); None otherwise.
    The caller then skips the store: no call, no transaction, no fsync, no file for a soul that has none."""
    if layer is Store.EPISODIC and marks and any(marks.values()):
        return None
    if layer is Store.EPISODIC:
        return EpisodicStore.writes_without_store(reqs)
    if layer is Store.SEMANTIC:
        return SemanticStore.writes_without_store(reqs)
    return ProceduralStore.writes_without_store(reqs)


def cross_layer_marks(writes: Iterable[MemoryWrite]) -> dict[str, list[str]]:
    """What semantic writes ask of the episodic layer: episodes to promote (they fed a
    promoted fact), sources whose episodes a new value superseded, and the values it replaced."""
    promote: list[str] = []
    supersede: list[str] = []
    values: list[str] = []
    for w in writes:
        promote.extend(t for t in w.payload.get("promoted_turns", ()) if t not in promote)
        gone = [t for t in w.payload.get("superseded_sources", ()) if t not in supersede]
        supersede.extend(gone)
        prev = w.payload.get("previous")
        if gone and isinstance(prev, str) and prev.strip() and prev not in values:
            values.append(prev)
    return {"promote_turns": promote, "supersede_sources": supersede, "supersede_values": values}


class SoulMemory:
    """Episodic, semantic and procedural stores of one soul, in one directory."""

    def __init__(self, directory: str | Path, *, embedder: Embedder | None = None,
                 config: MemoryConfig | None = None) -> None:
        self.dir = Path(directory)
        self.cfg = config or MemoryConfig()
        self.embedder = embedder or default_embedder()
        self.episodic = EpisodicStore(self.dir, self.embedder, self.cfg)
        self.semantic = SemanticStore(self.dir, self.cfg, self.embedder)
        self.procedural = ProceduralStore(self.dir, self.cfg)

    def close(self) -> None:
        self.episodic.close()
        self.semantic.close()
        self.procedural.close()

    def __enter__(self) -> SoulMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- writes ----------------------------------------------------------------------
    def write(self, req: WriteRequest) -> list[MemoryWrite]:
        """All layer writes of one exchange. Idempotent per ``req.turn_key``."""
        return self.write_many([req])[0]

    def embed_ahead(self, reqs: list[WriteRequest]) -> None:
        """A hint that ``reqs`` are about to be written (:meth:`write_many`): their episodes' vectors are
        computed now on a thread beside the caller, so that its next work and the encoder overlap."""
        self.episodic.embed_ahead(reqs)

    def write_many(self, reqs: list[WriteRequest]) -> list[list[MemoryWrite]]:
        for r in reqs:
            check_write_request(r)
        sem = answer_without_store(Store.SEMANTIC, reqs) or self.semantic.apply_many(reqs)
        marks = cross_layer_marks(w for ws in sem for w in ws)
        epi = answer_without_store(Store.EPISODIC, reqs, marks) or self.episodic.apply_many(reqs, **marks)
        proc = answer_without_store(Store.PROCEDURAL, reqs) or self.procedural.apply_many(reqs)
        return [e + s + p for e, s, p in zip(epi, sem, proc, strict=True)]

    # ---- reads -----------------------------------------------------------------------
    def recall(self, query: str, k: int = 10, at: Any = None, stores: Iterable[str] | None = None, *,
               task_class: str | None = None, timings: dict[str, float] | None = None) -> list[RecalledItem]:
        """The three layers' best ``k`` for ``query``, as of ``at`` (None: now). ``timings``: if given,
        milliseconds per stage are added to it (the episodic layer's embed, dense, lexical and score; semantic;
        procedural; merge)."""
        if not isinstance(k, int) or isinstance(k, bool) or k < 1 or k > 1000:
            raise InvalidInput(f"k must be an int in 1..1000, got {k!r}")
        t = time.time() if at is None else to_timestamp(at)
        lists = []
        clock = time.perf_counter
        for s in parse_stores(stores):
            t0 = clock()
            if s is Store.EPISODIC:
                lists.append(self.episodic.recall(query, k, t, timings=timings))
                continue
            if s is Store.SEMANTIC:
                lists.append(self.semantic.recall(query, k))
            else:
                lists.append(self.procedural.recall(query, k, task_class))
            if timings is not None:
                timings[s.value] = timings.get(s.value, 0.0) + (clock() - t0) * 1000
        t0 = clock()
        out = merge_recalls(lists, k)
        if timings is not None:
            timings["merge"] = timings.get("merge", 0.0) + (clock() - t0) * 1000
        return out

    def facts(self, entity: str | None = None) -> list[Fact]:
        return self.semantic.facts(_opt_text(entity, "entity"))

    def fact_history(self, entity: str, attribute: str) -> list[FactVersion]:
        return self.semantic.history(_text(entity, "entity"), _text(attribute, "attribute"))

    def procedures(self, task_class: str | None = None) -> list[Procedure]:
        return self.procedural.procedures(_opt_text(task_class, "task class"))

    def episodes(self, since: Any = None, until: Any = None, session: str | None = None,
                 sessions_ago: int | None = None) -> list[Episode]:
        if sessions_ago is not None and (not isinstance(sessions_ago, int) or isinstance(sessions_ago, bool)
                                         or not 0 <= sessions_ago <= 1_000_000):
            raise InvalidInput(f"sessions_ago must be an int in 0..1000000, got {sessions_ago!r}")
        return self.episodic.episodes(since=None if since is None else to_timestamp(since),
                                      until=None if until is None else to_timestamp(until),
                                      session=_opt_text(session, "session"), sessions_ago=sessions_ago)

    def sweep(self, now: Any) -> dict[str, int]:
        t = to_timestamp(now)
        return {**self.episodic.sweep(t), **self.semantic.sweep(t)}

    def consolidate(self, now: Any = None) -> dict[str, int]:
        """Work after the turn: bring the consolidated memory (digests of sessions and spans of sessions, each
        naming the episodes it was written from) up to date with the episodes. Also run by :meth:`sweep`."""
        return self.episodic.consolidate(None if now is None else to_timestamp(now))

    def digests(self) -> list[Digest]:
        """The consolidated memory held, with provenance (the episodes and sources of each digest)."""
        return self.episodic.digests()

    def forget(self, stores: Iterable[str] | None = None) -> dict[str, int]:
        """Erase these layers (all by default) for good: their files are unlinked and recreated empty, so no
        row, history, idempotency record, FTS segment, index entry, WAL frame or free page is left."""
        return {s.value: self._layer(s).erase() for s in parse_stores(stores)}

    def forget_where(self, ids: Iterable[str] | None = None, query: str | None = None) -> dict[str, Erased]:
        """Delete single memories in every layer: these ids (``ep-3``, ``tendril:database``, ``deploy@v2``) and
        every memory whose text contains the phrase ``query``. What each layer erased, by layer."""
        return self.forget_matching(ForgetQuery.make(ids, query))

    def forget_matching(self, q: ForgetQuery) -> dict[str, Erased]:
        """:meth:`forget_where` for a query already made (the loop's erasure step)."""
        return {s.value: self._layer(s).forget_where(q) for s in LAYERS}

    def fence(self, epoch: int) -> None:
        """Take the soul over with this fencing epoch: from now on every layer refuses older writers."""
        for layer in (self.episodic, self.semantic, self.procedural):
            layer.fence(epoch)

    def _layer(self, s: Store) -> EpisodicStore | SemanticStore | ProceduralStore:
        return self.episodic if s is Store.EPISODIC else self.semantic if s is Store.SEMANTIC else self.procedural

    def is_empty(self) -> bool:
        return all(layer.is_empty() for layer in (self.episodic, self.semantic, self.procedural))

    def stats(self) -> dict[str, int]:
        return {**self.episodic.stats(), **self.semantic.stats(), **self.procedural.stats()}

    # ---- export / import -------------------------------------------------------------
    def export(self) -> bytes:
        return pack_export({s: getattr(self, s.value).export() for s in LAYERS})

    def import_(self, blob: bytes) -> None:
        """Load an export into this (empty) soul; a bad export changes nothing."""
        import_export(self, blob, self.episodic.dir.name)

    def import_layers(self, data: dict[str, Any]) -> None:
        for s in LAYERS:
            getattr(self, s.value).import_(data[s.value])


def _text(v: object, what: str) -> str:
    if not isinstance(v, str) or not v or len(v) > 500:
        raise InvalidInput(f"{what} must be a non-empty string, got {v!r}")
    return v


def _opt_text(v: object, what: str) -> str | None:
    return None if v is None else _text(v, what)


def wipe(directory: str | Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
