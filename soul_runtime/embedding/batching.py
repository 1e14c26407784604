"""``BatchingEmbedder``: concurrent ``embed`` calls on a node share one model call.

It wraps an :class:`Embedder` for a threaded actor: the texts of concurrent callers go to the model together
through a :class:`~soul_runtime.batching.MicroBatcher` (at most ``max_batch`` texts, waiting at most
``max_wait_s`` for company, one model call at a time: what arrives while the model runs goes in its next call). A small LRU of recent texts means a text embedded a moment ago (a turn's query,
then the same words in the episode's index key, or a batch warmed ahead of the writes) is not embedded
again. The vectors are exactly the wrapped embedder's.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from soul_runtime.batching import MicroBatcher
from soul_runtime.embedding.base import Embedder, check_texts, normalize_rows


class BatchingEmbedder(Embedder):
    """Same ``embedder_id`` and vectors as ``inner``; thread-safe; batches concurrent callers."""

    def __init__(self, inner: Embedder, *, max_batch: int = 32, max_wait_s: float = 0.002, cache_size: int = 4096
                 ) -> None:
        self.inner = inner
        self.embedder_id = inner.embedder_id
        self.dim = inner.dim
        self.cache_size = cache_size
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._batcher: MicroBatcher[str, np.ndarray] = MicroBatcher(self._model_call, max_batch=max_batch,
                                                                     max_wait_s=max_wait_s, serial=True)
        self.cache_hits = 0

    @property
    def model_calls(self) -> int:
        return self._batcher.calls

    @property
    def model_texts(self) -> int:
        """Texts sent to the model, over all its calls."""
        return self._batcher.items

    def _model_call(self, texts: list[str]) -> list[np.ndarray]:
        return list(self.inner._checked_batch(texts))

    def embed(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """As :meth:`Embedder.embed` (same checks, same vectors); texts in the cache cost a lookup, the others
        go to the model together with what concurrent callers ask for."""
        items = check_texts(texts, batch_size)
        out = np.empty((len(items), self.dim), dtype=np.float32)
        missing: list[int] = []
        with self._lock:
            for i, t in enumerate(items):
                hit = self._cache.get(t)
                if hit is None:
                    missing.append(i)
                else:
                    self._cache.move_to_end(t)
                    out[i] = hit
                    self.cache_hits += 1
        if missing:
            want = list(dict.fromkeys(items[i] for i in missing))
            vecs = normalize_rows(np.stack(self._batcher.submit(want)))  # unit rows, as the base class makes them
            rows = dict(zip(want, vecs, strict=True))
            for i in missing:
                out[i] = rows[items[i]]
            with self._lock:
                self._cache.update(rows)
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        return out

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        return self.embed(texts)
