"""A user's own model and embedder, as the runtime finds them by import path (``tests.user_models:EchoModel``).

Importable in every Ray worker of the test session (the repository root is on their ``sys.path``)."""

from __future__ import annotations

import asyncio
import os
import zlib

import numpy as np

from soul_runtime.embedding.base import Embedder
from soul_runtime.models.base import (
    AsyncLanguageModel,
    Exchange,
    LanguageModel,
    MemoryDecision,
    ModelReply,
    ReplyRequest,
    TaskClassification,
    Usage,
)
from soul_runtime.records import Extraction


def _keep(exchange: Exchange, model: str) -> MemoryDecision:
    """Every exchange is kept, its user text as the episode."""
    return MemoryDecision(True, ("event",), "kept by the user's model", Extraction(episode=exchange.user_text, event=True),
                          Usage(calls=1), model)


class EchoModel(LanguageModel):
    """Replies with what it was told and how many memories it was shown; keeps every exchange as an episode.
    ``prefix`` (a ``model_args`` entry) starts every reply; ``SOUL_MODEL_ECHO_SUFFIX`` (a forwarded setting)
    ends it."""

    model_id = "user-echo-1"

    def __init__(self, prefix: str = "echo") -> None:
        self.prefix = prefix

    def reply(self, request: ReplyRequest) -> ModelReply:
        suffix = os.environ.get("SOUL_MODEL_ECHO_SUFFIX", "")
        return ModelReply(f"{self.prefix}: {request.user_text} ({len(request.memory_lines)} memories, pid "
                          f"{os.getpid()}){suffix}", Usage(calls=1, input_tokens=3, output_tokens=2), self.model_id)

    def decide(self, exchange: Exchange) -> MemoryDecision:
        return _keep(exchange, self.model_id)

    def classify_task(self, text: str, known: tuple[str, ...]) -> TaskClassification:
        return TaskClassification(None)


class AsyncEchoModel(AsyncLanguageModel):
    """The same as :class:`EchoModel` with coroutine methods; records the thread each ran on."""

    model_id = "user-async-echo-1"

    def __init__(self) -> None:
        self.threads: list[str] = []

    async def reply(self, request: ReplyRequest) -> ModelReply:
        import threading
        await asyncio.sleep(0.01)
        self.threads.append(threading.current_thread().name)
        return ModelReply(f"async echo: {request.user_text}", Usage(calls=1), self.model_id)

    async def decide(self, exchange: Exchange) -> MemoryDecision:
        await asyncio.sleep(0)
        return _keep(exchange, self.model_id)

    async def classify_task(self, text: str, known: tuple[str, ...]) -> TaskClassification:
        return TaskClassification(None)


class WaitingModel(AsyncLanguageModel):
    """A remote model's latency without the remote: every call awaits ``delay_s`` (a ``model_args`` entry), then
    answers as :class:`AsyncEchoModel` does. Counts the calls waiting at once in this process (class-wide: the
    runtime makes the instance)."""

    model_id = "user-waiting-1"
    waiting = 0
    peak = 0

    def __init__(self, delay_s: str = "0") -> None:
        self.delay_s = float(delay_s)

    @classmethod
    async def _wait(cls, delay_s: float) -> None:
        cls.waiting += 1
        cls.peak = max(cls.peak, cls.waiting)
        try:
            await asyncio.sleep(delay_s)
        finally:
            cls.waiting -= 1

    async def reply(self, request: ReplyRequest) -> ModelReply:
        await self._wait(self.delay_s)
        return ModelReply(f"waited: {request.user_text}", Usage(calls=1), self.model_id)

    async def decide(self, exchange: Exchange) -> MemoryDecision:
        await self._wait(self.delay_s)
        return _keep(exchange, self.model_id)

    async def classify_task(self, text: str, known: tuple[str, ...]) -> TaskClassification:
        return TaskClassification(None)


def echo_model() -> EchoModel:
    """A zero-argument factory."""
    return EchoModel(prefix="factory")


class TrigramEmbedder(Embedder):
    """Character-trigram hashing into 32 dimensions: not the project's embedders (other id, other dim)."""

    embedder_id = "user-trigram-32"
    dim = 32

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            t = f"  {text.lower()} "
            for i in range(len(t) - 2):
                out[row, zlib.crc32(t[i:i + 3].encode()) % self.dim] += 1.0
        return out


def trigram_embedder(dim: str = "32") -> TrigramEmbedder:
    """A factory taking ``embedder_args`` (str values)."""
    emb = TrigramEmbedder()
    emb.dim = int(dim)
    emb.embedder_id = f"user-trigram-{emb.dim}"
    return emb


class WrongDimEmbedder(TrigramEmbedder):
    """Declares 48 dimensions and returns 32."""

    embedder_id = "user-wrong-dim"
    dim = 48

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        return np.ones((len(texts), 32), dtype=np.float32)


class NoDimEmbedder(Embedder):
    embedder_id = "user-no-dim"

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        return np.ones((len(texts), 4), dtype=np.float32)


class NotAModel:
    model_id = "nothing"


def not_a_model() -> NotAModel:
    return NotAModel()
