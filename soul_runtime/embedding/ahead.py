"""Embedding ahead: the vectors of texts about to be written, computed on a worker thread beside the caller.

Observing a conversation reads its messages window by window, then writes them all. The episodes' vectors of
a window are known once it is read, so they are embedded while the next window is read (the encoder releases
the interpreter lock: on two cores the model's reading and the encoder run side by side), and the write takes
them from here. A text asked for that was not sent ahead, or whose embedding failed, is embedded by the
caller as usual (its error is raised then); the vectors are the embedder's own either way.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from soul_runtime.embedding.base import Embedder

LIMIT = 512
"""Texts held ahead per store; older ones are dropped (a hint that is never followed costs nothing more)."""

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _worker() -> ThreadPoolExecutor:
    """One thread per process: embedding ahead overlaps the caller's reading with the encoder, it does not add
    encoders (the encoder already uses the cores it is given)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed-ahead")
        return _pool


class EmbeddingAhead:
    """Texts sent ahead to ``embedder`` and their vectors (or their pending embedding)."""

    def __init__(self, embedder: Embedder, *, limit: int = LIMIT) -> None:
        self.embedder = embedder
        self.limit = limit
        self._lock = threading.Lock()
        self._pending: OrderedDict[str, tuple[Future[np.ndarray], int]] = OrderedDict()

    def submit(self, texts: Sequence[str]) -> None:
        """Start embedding those of ``texts`` not already sent ahead."""
        with self._lock:
            new = [t for t in dict.fromkeys(texts) if isinstance(t, str) and t not in self._pending]
            if not new:
                return
            fut = _worker().submit(self.embedder.embed, new)
            for i, t in enumerate(new):
                self._pending[t] = (fut, i)
            while len(self._pending) > self.limit:
                self._pending.popitem(last=False)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """As ``embedder.embed(texts)``: rows sent ahead are taken (waiting for them if need be), the others
        embedded now."""
        with self._lock:
            got = [self._pending.pop(t, None) if isinstance(t, str) else None for t in texts]
        if not any(got):
            return self.embedder.embed(texts)
        out = np.zeros((len(texts), self.embedder.dim), dtype=np.float32)
        missing: list[int] = []
        for i, g in enumerate(got):
            if g is None or g[0].exception() is not None:  # not sent ahead, or failed: embedded below, where its
                missing.append(i)                           # error reaches the caller
            else:
                out[i] = g[0].result()[g[1]]
        if missing:
            out[missing] = self.embedder.embed([texts[i] for i in missing])
        return out

    @property
    def held(self) -> int:
        """Texts sent ahead and not yet taken."""
        return len(self._pending)
