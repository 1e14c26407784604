"""Store actors: one layer's stores for the souls of one shard (plain class; made remote in runtime.py; its
callers' side is :mod:`actors.shard_client`).

Each shard keeps an LRU of open per-soul stores; a soul's files live in
``DATA_DIR/souls/SOUL_ID/``. Calls are idempotent (writes are keyed by turn), so
Ray may retry them after a restart.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from soul_runtime import telemetry
from soul_runtime.config import MemoryConfig
from soul_runtime.embedding.batching import BatchingEmbedder
from soul_runtime.embedding.choice import make_embedder
from soul_runtime.errors import SoulError, StaleOwner
from soul_runtime.memory.episodic import EpisodicStore
from soul_runtime.memory.episodic_writes import vector_text
from soul_runtime.memory.erasure import Erased, ForgetQuery
from soul_runtime.memory.policy_episodic import decide_episode
from soul_runtime.memory.procedural import ProceduralStore
from soul_runtime.memory.semantic import SemanticStore
from soul_runtime.memory.soul_memory import answer_without_store
from soul_runtime.memory.soul_records import soul_dir, soul_ids, stored
from soul_runtime.memory.sqlite_db import storage_error, use_storage
from soul_runtime.records import Store, WriteRequest, request_from_plain
from soul_runtime.text import check_write_request

from . import raycalls
from .fair_pool import FairPool, tenant_of
from .introspection import ActorBase
from .keyed_locks import Entry, KeyedLocks
from .metrics import Metrics
from .placement import store_name, store_of
from .schedule import Closer, SizeTable, Ticker, over_capacity, sweep_due
from .settings import process_capacity
from .shard_client import SHARD_CHANNEL_METHODS
from .soul_presence import require_known
from .tenant_weights import TenantWeights

LayerStore = EpisodicStore | SemanticStore | ProceduralStore
log = logging.getLogger(__name__)


def embed_threads(cpus: int, episodic_shards: int) -> int:
    """An episodic shard's embedder threads: its share of the cluster's CPUs, at least 1 and at most 2."""
    return max(1, min(2, int(cpus) // max(1, int(episodic_shards))))


def call_tenant(method: str, args: tuple[Any, ...]) -> str:
    """The tenant of a batch call (``recall_batch`` / ``apply_batch``): its first item's soul's (a host sends each
    tenant's items in calls of their own)."""
    items = args[0] if args else None
    return tenant_of(items[0][0]) if items and isinstance(items[0], tuple | list) and items[0] and \
        isinstance(items[0][0], str) else ""


class LayerShard(ActorBase):
    """The stores of one layer for the souls hashed to this shard.

    A threaded actor: calls for different souls run concurrently, calls for one soul one at a time (a lock
    per soul, taken by :meth:`_soul`); the episodic shard's embedder batches concurrent callers' texts.
    """

    def __init__(self, layer: str, data_dir: str, memory_config: dict[str, Any], capacity: int = 0,
                 embedder: str = "default", index: int = 0, shards: int = 1, retention_every_s: float = 0.0,
                 storage: str = "local", capacity_bytes: int = 0, channel: int = 0,
                 embedder_args: dict[str, str] | None = None) -> None:
        use_storage(storage)
        self.layer = Store(layer)
        self.data_dir = data_dir
        self.cfg = MemoryConfig(**memory_config)
        self.capacity = process_capacity(capacity)  # open stores (0: as the open-file limit allows)
        self.capacity_bytes = capacity_bytes
        self.open: OrderedDict[str, LayerStore] = OrderedDict()
        self.sizes = SizeTable()  # memory of each open store, as of its last use
        self.guard = threading.Lock()  # the LRU and the lock table
        self.locks: KeyedLocks[threading.Lock] = KeyedLocks(threading.Lock, guard=self.guard,
                                                             keep=lambda sid: sid in self.open)
        self._closer = Closer(f"{layer}-close")  # evicted stores (see _evict)
        # the episodic shards share the cores: each embeds with its share of them (at least one thread)
        self.embedder = BatchingEmbedder(make_embedder(embedder, threads=embed_threads(raycalls.cluster_cpus(), shards),
                                                       args=embedder_args)) if self.layer is Store.EPISODIC else None
        # the semantic shards reconcile facts by meaning (fact_match): one thread, the model loaded on the first
        # candidate that needs a comparison of meaning (most are settled by their exact or normalised key)
        self.fact_embedder = BatchingEmbedder(make_embedder(embedder, threads=1, args=embedder_args)) if (
            self.layer is Store.SEMANTIC and self.cfg.fact_match_similarity < 1.0) else None
        self.metrics = Metrics.create()
        self.name = store_name(self.layer.value, index)
        self.shards = shards
        self.retention_every_s = retention_every_s if self._has_retention() else 0.0
        self.swept: dict[str, float] = {}
        self._sweeping = threading.Lock()
        self.ticker: Ticker | None = None
        # for the hosts on this machine, ``channel`` calls at once (the shard's threads; 0: no channel), handed
        # out in weighted fair order per tenant (a host sends each tenant's items in calls of their own)
        self.start(SHARD_CHANNEL_METHODS, channel, pool=FairPool(channel, TenantWeights(data_dir, storage),
                                                                   thread_name_prefix="channel-call") if channel else None,
                   tenant=call_tenant)

    def on_start(self) -> None:
        """The retention ticker, when running as an actor with a retention to sweep."""
        me = raycalls.current_actor() if self.retention_every_s > 0 else None
        if me is not None:  # in an actor: the sweep runs in the actor's own queue
            self.ticker = Ticker(min(60.0, self.retention_every_s), lambda: raycalls.call(me, "sweep_due"),
                                 name=f"{self.name}-retention")

    def _has_retention(self) -> bool:
        if self.layer is Store.EPISODIC:
            return self.cfg.episodic_ttl_days > 0
        return self.layer is Store.SEMANTIC and self.cfg.archived_fact_ttl_days > 0

    def my_souls(self) -> list[str]:
        """The souls with records that hash to this shard."""
        return [sid for sid in soul_ids(self.data_dir) if store_of(sid, self.layer.value, self.shards) == self.name]

    def sweep_due(self, now: float | None = None) -> dict[str, int]:
        """Retention on schedule: sweep each of this shard's souls not swept for ``retention_every_s``
        (the shard's timer calls this with the wall clock; tests pass ``now``)."""
        t = time.time() if now is None else float(now)
        total: Counter[str] = Counter()
        if not self._sweeping.acquire(blocking=False):  # the previous sweep is still running
            return {}
        try:
            self._sweep_souls(t, total)
        finally:
            self._sweeping.release()
        return dict(total)

    def _sweep_souls(self, t: float, total: Counter[str]) -> None:
        for sid in self.my_souls():
            if sweep_due(self.swept.get(sid), t, self.retention_every_s):
                got = self.sweep(sid, t)
                self.metrics.sweep(self.layer.value, got)
                total.update(got)
                total["souls_swept"] += 1
                self.swept[sid] = t

    @contextmanager
    def _claimed(self, soul_id: str) -> Iterator[None]:
        """Hold the soul's lock; the lock-table entry lives while anyone holds or waits for it."""
        with self.locks.held(soul_id):
            yield

    @contextmanager
    def _soul(self, soul_id: str) -> Iterator[Any]:
        """The soul's store, opened if need be, used by this thread alone until the block ends. Its memory is
        measured when the block completes; after a failure the size of its last use stands: measuring reads the
        database, and a call refused for a lock another process holds would wait out SQLite's busy timeout a
        second time before its caller's retry policy heard of the lock."""
        with self._claimed(soul_id):
            with self.guard:
                st = self.open.get(soul_id)
                if st is not None:
                    self.open.move_to_end(soul_id)
            if st is None:
                st = self._open_store(soul_id)
                with self.guard:
                    self.open[soul_id] = st
            yield st
            if self.capacity_bytes > 0 and soul_id in self.open:
                size = st.memory_bytes()
                with self.guard:
                    self.sizes[soul_id] = size
        self._evict()

    def _open_store(self, soul_id: str) -> Any:
        d = soul_dir(self.data_dir, soul_id)
        if self.layer is Store.EPISODIC:
            assert self.embedder is not None
            return EpisodicStore(d, self.embedder, self.cfg)
        if self.layer is Store.SEMANTIC:
            return SemanticStore(d, self.cfg, self.fact_embedder)
        return ProceduralStore(d, self.cfg)

    def _absent(self, soul_id: str) -> bool:
        """The soul has no store of this layer: none open here and no file on disk."""
        with self.guard:
            if soul_id in self.open:
                return False
        return not stored(soul_dir(self.data_dir, soul_id) / f"{self.layer.value}.sqlite")

    def _evict(self) -> None:
        """Close the least recently used stores beyond capacity (a count and, if set, bytes of memory), skipping
        any a thread holds or waits for.

        A victim leaves the LRU at once, with its soul's lock taken; it is closed on the shard's closing thread,
        off the path of the call that made room (closing a store that was written saves its small vector index
        and checkpoints its WAL: fsyncs), and its lock is released when the close is done, so a call for that
        soul waits for the close and then opens it afresh. Beyond ``schedule.MAX_CLOSING`` stores waiting to close, the
        caller closes the victim itself (open files stay bounded)."""
        while True:
            with self.guard:
                if not over_capacity(self.open, self.sizes, self.capacity, self.capacity_bytes):
                    return
                victim = next((sid for sid in self.open if self.locks.users(sid) == 0), None)
                if victim is None:
                    return
                entry = self.locks.take(victim)  # nobody holds or waits for it
                st = self.open.pop(victim)
                self.sizes.pop(victim, None)
            self._closer.run(self._close_taken, victim, entry, st)

    def _close_taken(self, soul_id: str, entry: Entry[threading.Lock], st: LayerStore) -> None:
        """Close an evicted store whose soul lock the evictor took; then release that lock."""
        try:
            st.close()
        except Exception as e:  # noqa: BLE001 — its data is on disk (the index is rebuilt from it if need be)
            log.warning("closing %s's %s store failed: %r", soul_id, self.layer.value, e)
        finally:
            entry.lock.release()
            self.locks.release(soul_id, entry)

    def wait_closed(self) -> int:
        """Wait until every evicted store is closed; returns how many stores are open."""
        self._closer.wait_closed()
        with self.guard:
            return len(self.open)

    def _close(self, soul_id: str) -> None:
        with self._claimed(soul_id):
            with self.guard:
                st = self.open.pop(soul_id, None)
                self.sizes.pop(soul_id, None)
            if st is not None:
                st.close()

    def ping(self) -> str:
        return self.layer.value


    def metrics_snapshot(self) -> dict[str, int]:
        """What this shard counted, and for the episodic layer its embedder's model calls with the texts they
        carried and the texts it found in its cache."""
        out = {**self.metrics.local, **self.channel_counts()}
        if self.embedder is not None:
            out.update(embed_calls=self.embedder.model_calls, embed_texts=self.embedder.model_texts,
                       embed_cache_hits=self.embedder.cache_hits)
        return out


    def recall(self, soul_id: str, query: str, k: int, now: float, task_class: str | None = None) -> list[Any]:
        t0 = time.perf_counter()
        if self._absent(soul_id):  # nothing stored in this layer yet: do not create a store to read it
            self.metrics.recall(self.layer.value, time.perf_counter() - t0)
            return []
        with self._reading(soul_id), self._soul(soul_id) as st:
            if self.layer is Store.EPISODIC:
                out = st.recall(query, k, now)
            elif self.layer is Store.SEMANTIC:
                out = st.recall(query, k)
            else:
                out = st.recall(query, k, task_class)
        self.metrics.recall(self.layer.value, time.perf_counter() - t0)
        return list(out)

    def read_recall(self, soul_id: str, query: str, k: int, now: float) -> list[Any]:
        """:meth:`recall` for a reader of the soul (the public API), not for its own turn: a soul nobody wrote is
        NotFound, and nothing is created. (A turn's recall of a new soul, before its first write, is empty.)"""
        if self._absent(soul_id):
            require_known(self.data_dir, soul_id)
        return self.recall(soul_id, query, k, now)

    def apply(self, soul_id: str, reqs: list[dict[str, Any]] | list[WriteRequest],
              marks: dict[str, list[str]] | None = None) -> list[list[Any]]:
        """The soul's write requests applied to this layer (as plain dicts, or already read by ``apply_batch``)."""
        requests = [r if isinstance(r, WriteRequest) else request_from_plain(r) for r in reqs]
        for req in requests:
            check_write_request(req)
        answer = answer_without_store(self.layer, requests, marks)
        if answer is not None:  # nothing to write: no store opened (or created), no transaction
            return answer
        try:
            with self._soul(soul_id) as st:
                if self.layer is Store.EPISODIC:
                    out = st.apply_many(requests, **(marks or {}))
                else:
                    out = st.apply_many(requests)
        except StaleOwner:  # another owner wrote the soul: this cache is behind; the next call opens it anew
            self._close(soul_id)
            raise
        for ws in out:
            for w in ws:
                self.metrics.write(w.store.value, w.op.value)
        return out

    # ---- batches: the recalls / writes of several souls in one call (from a host's ShardCalls) --------
    def recall_batch(self, items: list[tuple[Any, ...]]) -> list[Any]:
        """``recall`` for each item ``(soul_id, query, k, now, task_class[, carrier])``; one result (or the exception
        it raised) per item, in order."""
        if self.embedder is not None:
            self._warm([item[1] for item in items])
        out: list[Any] = []
        for soul_id, query, k, now, task_class, *carried in items:
            with self._served("recall", soul_id, carried, len(items)):
                try:
                    out.append(self.recall(soul_id, query, k, now, task_class))
                except Exception as e:  # goes back to its own caller only
                    out.append(e)
        return out

    def apply_batch(self, items: list[tuple[Any, ...]]) -> list[Any]:
        """``apply`` for each item ``(soul_id, requests, marks[, carrier])``; one result (or the exception it raised)
        per item, in order."""
        read: list[Any] = []  # each item's requests read once (or the error reading them raised, for apply)
        for _, reqs, *_ in items:
            try:
                read.append([request_from_plain(r) for r in reqs])
            except Exception as e:  # noqa: BLE001 — refused by apply, for its own caller
                read.append(e)
        if self.embedder is not None:
            self._warm([vector_text(req) for rs in read if isinstance(rs, list) for req in rs
                        if decide_episode(req.extraction).write])
        out: list[Any] = []
        for (soul_id, _, marks, *carried), requests in zip(items, read, strict=True):
            with self._served("write", soul_id, carried, len(items)):
                try:
                    if isinstance(requests, Exception):
                        raise requests
                    out.append(self.apply(soul_id, requests, marks))
                except Exception as e:  # goes back to its own caller only
                    out.append(e)
        return out

    def _served(self, what: str, soul_id: str, carried: list[Any], batch: int) -> Any:
        """The span of one item of a batch, a child of the caller's context when the item carried one (its
        trailing element, :class:`~actors.shard_client.ShardCalls` adds it when traces are on); else nothing."""
        if not carried or not carried[0]:
            return nullcontext()
        return telemetry.span(f"store {what} {self.layer.value}", parent=telemetry.context_of(carried[0]),
                              kind="server", attributes={"soul.id": soul_id, "soul.layer": self.layer.value,
                                                         "soul.shard": self.name, "soul.batch_items": batch})

    def _warm(self, texts: list[str]) -> None:
        """Embed the texts of a batch in one model call; the stores then find them in the embedder's cache."""
        assert self.embedder is not None
        try:
            self.embedder.embed(list(dict.fromkeys(t for t in texts if isinstance(t, str))))
        except SoulError:  # a bad text fails its own item below, not the batch
            pass

    def read(self, soul_id: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """Read-only calls: facts, history, procedures, episodes, stats, task_classes."""
        if method not in {"facts", "history", "procedures", "episodes", "stats", "task_classes", "export",
                          "is_empty", "current_digests"}:
            raise AttributeError(method)
        if method not in ("is_empty", "task_classes") and self._absent(soul_id):
            require_known(self.data_dir, soul_id)  # a reader's read of a soul nobody wrote creates nothing
        with self._reading(soul_id), self._soul(soul_id) as st:
            return getattr(st, method)(*args, **kwargs)

    @contextmanager
    def _reading(self, soul_id: str) -> Iterator[None]:
        """A read's failure of the storage as the :class:`StorageError` a write's is (naming the file and its cause):
        "database is locked" when another process holds the file past SQLite's busy timeout, which the caller's
        retry policy waits out (actors/retry.py), as it does for a turn."""
        try:
            yield
        except (sqlite3.ProgrammingError, sqlite3.InterfaceError, sqlite3.IntegrityError):
            raise
        except sqlite3.DatabaseError as e:
            raise storage_error(e, soul_dir(self.data_dir, soul_id) / f"{self.layer.value}.sqlite") from e

    def forget(self, soul_id: str) -> int:
        """Erase this layer of a soul: its files are unlinked and recreated empty."""
        if self._absent(soul_id):
            return 0
        with self._soul(soul_id) as st:
            return int(st.erase())

    def fence(self, soul_id: str, epoch: int) -> None:
        """A new activation of the soul took over with ``epoch``: refuse older writers from now on. A layer
        with no store yet is left absent: its first write carries the epoch (and an old owner's writes to it
        could only be the completed intent's own, which are idempotent)."""
        if self._absent(soul_id):
            return
        with self._soul(soul_id) as st:
            st.fence(int(epoch))

    def forget_where(self, soul_id: str, query: ForgetQuery) -> Erased:
        if self._absent(soul_id):
            return Erased()
        with self._soul(soul_id) as st:
            return st.forget_where(query)

    def import_(self, soul_id: str, data: dict[str, Any]) -> None:
        with self._soul(soul_id) as st:
            st.import_(data)

    def sweep(self, soul_id: str, now: float) -> dict[str, int]:
        with self._soul(soul_id) as st:
            return dict(st.sweep(now)) if hasattr(st, "sweep") else {}

    def flush(self) -> int:
        n = 0
        with self.guard:
            souls = list(self.open)
        for soul_id in souls:
            with self._soul(soul_id) as st:
                if isinstance(st, EpisodicStore):
                    st.flush()
                    n += 1
        return n

    def close_soul(self, soul_id: str) -> None:
        self._close(soul_id)

    def on_stop(self) -> int:
        """Stop (see :mod:`actors.introspection`; the channel is closed first): the retention ticker, then every
        open store is closed (vector indices saved), the closing thread ends and the spans not yet exported go.
        Returns how many stores were closed."""
        if self.ticker is not None:
            self.ticker.stop()
            self.ticker = None
        self.flush()  # vector indices saved whole: the next start reads them instead of replaying changes
        with self.guard:
            souls = list(self.open)
        for soul_id in souls:
            self._close(soul_id)
        self._closer.stop()
        telemetry.flush()  # the spans not yet exported go before the actor is killed
        return len(souls)
