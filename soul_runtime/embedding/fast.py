"""``FastEmbedder``: a deterministic, cheap embedder for benchmarks and tests.

Signed feature hashing of word unigrams and bigrams into 64 dimensions: texts that share words get a
positive cosine; no model, no randomness (crc32, not ``hash()``), ~20 µs a text. It measures the runtime,
not retrieval quality: use the default (MiniLM) embedder for memory that has to work.
"""

from __future__ import annotations

import re
import zlib

import numpy as np

from soul_runtime.embedding.base import Embedder

_WORD = re.compile(r"\w+")


class FastEmbedder(Embedder):
    """64-d signed feature hashing; a text without words embeds to the zero vector."""

    embedder_id = "fast-hash-64"
    dim = 64

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            words = _WORD.findall(text.lower())
            feats = words + [f"{a} {b}" for a, b in zip(words, words[1:], strict=False)]
            for f in feats:
                h = zlib.crc32(f.encode("utf-8"))
                out[row, h % self.dim] += 1.0 if (h >> 16) & 1 else -1.0
        return out
