"""A usearch HNSW index beside the SQLite record, rebuilt from it when missing, stale or corrupt.

The index file is a cache of the record of truth. It is saved atomically (temp
file + rename) with a small JSON sidecar naming the embedder, the dimension and
the last change-log sequence number it holds; on open, changes after that
sequence are replayed from the record, and anything that does not fit is
rebuilt from scratch.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime  # noqa: F401  -- must be loaded before usearch: the reverse order segfaults (ort 1.31/1.32, usearch 2.26.6)
from usearch.index import Index

from soul_runtime.memory.sqlite_db import storage_error
from soul_runtime.owner_only import private_umask, restrict, write_file

EXACT_UP_TO = 8192
"""A soul with at most this many vectors is searched exhaustively: exact, and quicker than the graph at that size."""


@dataclass(frozen=True, kw_only=True)
class IndexParams:
    dtype: str = "f16"
    connectivity: int = 16
    expansion_add: int = 64
    expansion_search: int = 256


class VectorIndex:
    """One soul's episode vectors, keyed by the episode's integer row id."""

    def __init__(self, path: Path, *, dim: int, embedder_id: str, params: IndexParams | None = None) -> None:
        self.path = path
        self.meta_path = path.with_suffix(path.suffix + ".meta.json")
        self.dim = dim
        self.embedder_id = embedder_id
        self.params = params or IndexParams()
        self.applied_seq = 0
        self.rebuilt = False
        self.index = self._new()

    def _new(self) -> Index:
        p = self.params
        return Index(ndim=self.dim, metric="cos", dtype=p.dtype, connectivity=p.connectivity,
                     expansion_add=p.expansion_add, expansion_search=p.expansion_search)

    # ---- lifecycle -----------------------------------------------------------------
    def load(self) -> bool:
        """Load the saved index; False when it is missing or unusable (caller rebuilds)."""
        try:
            meta = json.loads(self.meta_path.read_text())
            if meta.get("embedder_id") != self.embedder_id or int(meta.get("dim", -1)) != self.dim:
                return False
            if meta.get("params") != self.params.__dict__:
                return False
            if not self.path.exists() or self.path.stat().st_size != int(meta["bytes"]):
                return False
            idx = self._new()
            idx.load(str(self.path))
            if len(idx) != int(meta["count"]):
                return False
            self.index = idx
            self.applied_seq = int(meta["applied_seq"])
            return True
        except Exception:  # a corrupt or foreign file is rebuilt, never trusted
            return False

    def rebuild(self, rows: Iterable[tuple[int, bytes]], applied_seq: int) -> None:
        self.index = self._new()
        keys: list[int] = []
        vecs: list[np.ndarray] = []
        for key, blob in rows:
            keys.append(key)
            vecs.append(np.frombuffer(blob, dtype=np.float32))
            if len(keys) >= 4096:
                self.index.add(np.asarray(keys, dtype=np.uint64), np.vstack(vecs))
                keys, vecs = [], []
        if keys:
            self.index.add(np.asarray(keys, dtype=np.uint64), np.vstack(vecs))
        self.applied_seq = applied_seq
        self.rebuilt = True

    def replay(self, changes: Iterable[tuple[int, str, int]], vector_of: Callable[[int], bytes | None]) -> None:
        """Apply logged changes (seq, op, key) newer than what the saved index holds."""
        for seq, op, key in changes:
            if key in self.index:
                self.index.remove(key)
            if op == "add":
                blob = vector_of(key)
                if blob is not None:
                    self.index.add(key, np.frombuffer(blob, dtype=np.float32))
            self.applied_seq = seq

    def save(self) -> None:
        # a name of its own: two processes opening one soul at once (a takeover) may both save
        tmp = self.path.with_suffix(f"{self.path.suffix}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            with private_umask():  # usearch creates the file with the process umask
                self.index.save(str(tmp))
            restrict(tmp)
            size = tmp.stat().st_size
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            meta = {"embedder_id": self.embedder_id, "dim": self.dim, "applied_seq": self.applied_seq,
                    "count": len(self.index), "bytes": size, "params": self.params.__dict__}
            write_file(self.meta_path, json.dumps(meta), durable=False)
        except (OSError, RuntimeError) as e:  # usearch reports a failed write as RuntimeError
            tmp.unlink(missing_ok=True)
            raise storage_error(e, self.path) from e

    # ---- data ----------------------------------------------------------------------
    def add(self, key: int, vector: np.ndarray, seq: int) -> None:
        if key in self.index:
            self.index.remove(key)
        self.index.add(key, vector)
        self.applied_seq = seq

    def remove(self, key: int, seq: int) -> None:
        if key in self.index:
            self.index.remove(key)
        self.applied_seq = seq

    def __len__(self) -> int:
        return len(self.index)

    def memory_bytes(self) -> int:
        """The index's memory: its vectors and graph, as serialized. (usearch's ``memory_usage`` counts the arena
        it reserves, 16 MiB even for one vector, most of which is never touched.)"""
        return int(self.index.serialized_length)

    def search(self, vector: np.ndarray, count: int) -> list[tuple[int, float]]:
        """(key, cosine similarity) pairs, best first."""
        n = len(self.index)
        if n == 0:
            return []
        res = self.index.search(vector, min(count, n), exact=n <= EXACT_UP_TO, threads=1)
        sims = 1.0 - np.asarray(res.distances, np.float64)  # the same doubles as 1.0 - float(d), one at a time
        return list(zip(np.asarray(res.keys).tolist(), sims.tolist(), strict=False))
