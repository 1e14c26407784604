"""The embedder layer: text -> unit-length float32 vectors.

Every embedder subclasses :class:`Embedder` and implements only
:meth:`Embedder._embed_batch` (one model call on a list of texts). Input
validation, batching (texts sorted by length so padding is small, then put back
in order), output checks and L2 normalisation live here, shared by all of them.

Vectors from different embedders cannot be compared: every index records the
``embedder_id`` and ``dim`` it was built with.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

import numpy as np

from soul_runtime.errors import EmbedderError, InvalidInput

__all__ = ["Embedder", "check_texts", "check_vectors", "normalize_rows"]


def normalize_rows(vectors: np.ndarray) -> np.ndarray:
    """``vectors`` (2-D) as float32 rows of unit L2 norm; all-zero rows stay zero.

    Norms are taken in float64 so very large float32 values do not overflow.
    """
    v64 = np.asarray(vectors, dtype=np.float64)
    norms = np.sqrt(np.einsum("ij,ij->i", v64, v64))
    safe = np.where(norms > 0.0, norms, 1.0)
    return (v64 / safe[:, None]).astype(np.float32)


def _check_text(text: object, index: int) -> str:
    if not isinstance(text, str):
        raise InvalidInput(f"text #{index} is a {type(text).__name__}, not a str")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidInput(
            f"text #{index} is not valid Unicode (lone surrogate {text[e.start]!r} at position {e.start})"
        ) from None
    return text


def check_texts(texts: Sequence[str], batch_size: int) -> list[str]:
    """The arguments of :meth:`Embedder.embed`, checked: the texts as a list, or :class:`InvalidInput`."""
    if isinstance(texts, (str, bytes)):
        raise InvalidInput("embed() takes a sequence of texts, not a single string: use embed_one()")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidInput(f"batch_size must be a positive int, got {batch_size!r}")
    try:
        return [_check_text(t, i) for i, t in enumerate(texts)]
    except TypeError:
        raise InvalidInput(f"embed() takes a sequence of texts, got {type(texts).__name__}") from None


class Embedder(abc.ABC):
    """Turns texts into L2-normalised float32 vectors of ``dim`` dimensions.

    Subclasses set ``embedder_id`` (stable name of model + weights + pooling:
    vectors with different ids are never compared) and ``dim``, and implement
    :meth:`_embed_batch`.
    """

    embedder_id: str
    dim: int

    @abc.abstractmethod
    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        """One model call: float32 array of shape ``(len(texts), dim)``, not necessarily normalised.

        ``texts`` are valid ``str`` (possibly empty) of similar length, at most
        ``batch_size`` of them.
        """

    def embed(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """Embed ``texts``: float32 array ``(len(texts), dim)``, rows of unit norm (or zero).

        Raises :class:`InvalidInput` for a non-``str`` item or text that is not
        valid Unicode, and :class:`EmbedderError` if the model returns vectors
        of the wrong shape or with NaN/inf.
        """
        items = check_texts(texts, batch_size)
        out = np.zeros((len(items), self.dim), dtype=np.float32)
        if not items:
            return out
        # Sort by length so each batch pads little; write results back in input order.
        order = sorted(range(len(items)), key=lambda i: len(items[i]))
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            out[idx] = self._checked_batch([items[i] for i in idx])
        return normalize_rows(out)

    def embed_one(self, text: str) -> np.ndarray:
        """Embed one text: float32 vector ``(dim,)`` of unit norm (or zero)."""
        if not isinstance(text, str):
            raise InvalidInput(f"text is a {type(text).__name__}, not a str")
        return self.embed([text])[0]

    def _checked_batch(self, texts: list[str]) -> np.ndarray:
        try:
            raw = self._embed_batch(texts)
        except (InvalidInput, EmbedderError):
            raise
        except Exception as e:  # a model failure, never the caller's fault
            raise EmbedderError(f"embedder {self.embedder_id} failed: {type(e).__name__}: {e}") from e
        try:
            vecs = np.asarray(raw, dtype=np.float32)
        except (TypeError, ValueError) as e:
            raise EmbedderError(f"embedder {self.embedder_id} returned a non-numeric result: {e}") from e
        if vecs.shape != (len(texts), self.dim):
            raise EmbedderError(
                f"embedder {self.embedder_id} returned shape {vecs.shape}, expected {(len(texts), self.dim)}"
            )
        if not np.isfinite(vecs).all():
            raise EmbedderError(f"embedder {self.embedder_id} returned NaN or infinite values")
        return vecs

    def __repr__(self) -> str:
        return f"{type(self).__name__}(embedder_id={self.embedder_id!r}, dim={self.dim})"


def check_vectors(vectors: Any, dim: int) -> np.ndarray:
    """Validate externally supplied vectors; return them as float32 unit rows (zero rows stay zero).

    ``vectors`` must be a 2-D array (or nested sequence) of real numbers with
    ``dim`` columns, all finite; otherwise :class:`InvalidInput` says why.
    """
    try:
        arr = np.asarray(vectors)
    except (TypeError, ValueError) as e:
        raise InvalidInput(f"vectors must be a 2-D numeric array: {e}") from None
    if arr.dtype.kind not in "fiu":
        raise InvalidInput(f"vectors must be real numbers, got dtype {arr.dtype}")
    if arr.ndim != 2:
        raise InvalidInput(f"vectors must be 2-D (n, {dim}), got {arr.ndim}-D shape {arr.shape}")
    if arr.shape[1] != dim:
        raise InvalidInput(f"vectors have dimension {arr.shape[1]}, expected {dim}")
    with np.errstate(over="ignore"):
        f32 = arr.astype(np.float32)
    if not np.isfinite(f32).all():
        bad = int(np.argwhere(~np.isfinite(f32))[0][0])
        raise InvalidInput(f"vectors contain NaN or infinite values (or values too large for float32), first in row {bad}")
    return normalize_rows(f32)
