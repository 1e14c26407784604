"""The embedder layer: the real default embedder (offline), input validation, check_vectors."""

from __future__ import annotations

import numpy as np
import pytest

from soul_runtime.embedding.base import Embedder, check_vectors
from soul_runtime.embedding.choice import default_embedder
from soul_runtime.embedding.minilm import MiniLMEmbedder, length_groups
from soul_runtime.errors import EmbedderError, InvalidInput
from tests.fakes import HashEmbedder

TEXTS = [
    "The production database is Postgres 16",
    "",
    "which database version runs in prod?",
    "I love hiking on weekends",
    "Café naïve résumé — 日本語 😀",
    "a much longer text about the quarterly planning meeting and its many agenda items " * 12,
    "x" * 5000,  # far past 256 tokens: truncated
]


@pytest.fixture(scope="module")
def emb() -> Embedder:
    return default_embedder()


def test_default_is_cached_minilm(emb: Embedder) -> None:
    assert default_embedder() is emb
    assert isinstance(emb, MiniLMEmbedder)
    assert emb.embedder_id == "all-MiniLM-L6-v2-int8-onnx" and emb.dim == 384


def test_shape_dtype_and_unit_norm(emb: Embedder) -> None:
    v = emb.embed(TEXTS)
    assert v.shape == (len(TEXTS), 384) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert emb.embed([]).shape == (0, 384)
    one = emb.embed_one("hello")
    assert one.shape == (384,) and one.dtype == np.float32


def test_deterministic_and_batching_matches_one_by_one(emb: Embedder) -> None:
    batched = emb.embed(TEXTS, batch_size=3)
    again = emb.embed(TEXTS)
    single = np.stack([emb.embed_one(t) for t in TEXTS])
    assert np.abs(batched - again).max() < 1e-5
    assert np.abs(batched - single).max() < 1e-5


def test_a_batch_is_grouped_by_length_and_gives_the_same_vectors(emb: Embedder) -> None:
    """Short and long texts in one batch are encoded in groups of similar length (no short text padded to a
    long one's length); the vectors are the ones each text gets alone."""
    assert length_groups([18, 62, 20, 60, 19, 100]) == [[0, 4, 2], [3, 1], [5]]
    assert length_groups([]) == [] and length_groups([5]) == [[0]]
    groups = length_groups([3, 40, 7, 41, 200, 12])
    assert sorted(i for g in groups for i in g) == list(range(6))
    assert all(max([3, 40, 7, 41, 200, 12][i] for i in g) <= 1.25 * min([3, 40, 7, 41, 200, 12][i] for i in g) + 8
               for g in groups)
    texts = ["Deploy done.", "The staging cluster moved to the new vendor last week after the outage on the "
             "billing service, ticket 4411, and the data pipeline follows next month.", "Thanks!",
             "My sister's wedding is in June."]
    together = emb.embed(texts)
    assert np.allclose(together, np.stack([emb.embed([t])[0] for t in texts]), atol=1e-5)


def test_semantic_sanity(emb: Embedder) -> None:
    db, question, hiking = emb.embed(
        ["The production database is Postgres 16", "which database version runs in prod?", "I love hiking on weekends"]
    )
    assert float(db @ question) > float(db @ hiking) + 0.2


@pytest.mark.parametrize("bad", [[b"bytes"], [None], ["ok", 3], ["lone \ud800 surrogate"], "a plain str"])
def test_invalid_input(emb: Embedder, bad: object) -> None:
    with pytest.raises(InvalidInput):
        emb.embed(bad)  # type: ignore[arg-type]


def test_invalid_input_needs_no_model() -> None:
    e = MiniLMEmbedder(model_path="/nonexistent/model.onnx")
    with pytest.raises(InvalidInput):
        e.embed_one(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        e.embed(["fine"], batch_size=0)


def test_missing_model_is_embedder_error() -> None:
    with pytest.raises(EmbedderError, match="pip install"):
        MiniLMEmbedder(model_path="/nonexistent/model.onnx").embed(["hello"])


class _Broken(Embedder):
    embedder_id = "broken"
    dim = 4

    def __init__(self, out: np.ndarray) -> None:
        self.out = out

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        return self.out


@pytest.mark.parametrize(
    "out", [np.full((1, 4), np.nan), np.array([[1.0, np.inf, 0, 0]]), np.ones((1, 3)), np.ones((2, 4))]
)
def test_bad_model_output_is_embedder_error(out: np.ndarray) -> None:
    with pytest.raises(EmbedderError):
        _Broken(out).embed(["a"])


def test_zero_rows_stay_zero() -> None:
    v = _Broken(np.zeros((1, 4))).embed(["a"])
    assert v.shape == (1, 4) and not v.any()


def test_check_vectors_normalises() -> None:
    v = check_vectors([[3.0, 4.0], [0.0, 0.0]], 2)
    assert v.dtype == np.float32
    assert np.allclose(v, [[0.6, 0.8], [0.0, 0.0]])
    assert check_vectors(np.ones((0, 2)), 2).shape == (0, 2)
    assert np.allclose(check_vectors(np.array([[1e30, 1e30]], dtype=np.float32), 2), [[0.70710677, 0.70710677]])


@pytest.mark.parametrize(
    "bad",
    [
        np.array([[np.nan, 1.0]]),
        np.array([[np.inf, 1.0]]),
        np.array([[1e300, 1.0]]),  # overflows float32
        np.ones((2, 3)),  # wrong dim
        np.ones(2),  # 1-D
        np.ones((1, 1, 2)),  # 3-D
        np.array([["a", "b"]]),
        [[1.0, 2.0], [3.0]],  # ragged
    ],
)
def test_check_vectors_rejects(bad: object) -> None:
    with pytest.raises(InvalidInput):
        check_vectors(bad, 2)


def test_hash_embedder() -> None:
    e = HashEmbedder()
    v = e.embed(["red apple pie", "red apple", "blue whale", ""])
    assert v.shape == (4, 64) and e.embedder_id == "test-hash-64"
    assert float(v[0] @ v[1]) > float(v[0] @ v[2])
    assert np.array_equal(v, e.embed(["red apple pie", "red apple", "blue whale", ""]))


class _ThreadNoting(HashEmbedder):
    """Notes which thread embedded which texts; ``fail`` texts make the model call fail."""

    def __init__(self, fail: frozenset[str] = frozenset()) -> None:
        self.calls: list[tuple[str, list[str]]] = []
        self.fail = fail

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        import threading
        self.calls.append((threading.current_thread().name, list(texts)))
        if self.fail & set(texts):
            raise RuntimeError("model down")
        return super()._embed_batch(texts)


def test_texts_sent_ahead_are_embedded_beside_the_caller_with_the_same_vectors() -> None:
    from soul_runtime.embedding.ahead import EmbeddingAhead
    emb = _ThreadNoting()
    ahead = EmbeddingAhead(emb, limit=3)
    ahead.submit(["alpha beta", "gamma delta", "alpha beta"])
    got = ahead.embed(["gamma delta", "new words here", "alpha beta"])
    assert np.array_equal(got, HashEmbedder().embed(["gamma delta", "new words here", "alpha beta"]))
    assert [(name.startswith("embed-ahead"), texts) for name, texts in emb.calls] == [
        (True, ["alpha beta", "gamma delta"]), (False, ["new words here"])]
    assert ahead.held == 0  # taken once: asked again, a text is embedded again
    ahead.submit(["a1", "a2", "a3", "a4"])
    assert ahead.held == 3  # the oldest beyond the limit is dropped


def test_a_failed_embedding_ahead_is_done_again_by_the_caller_whose_error_it_then_is() -> None:
    from soul_runtime.embedding.ahead import EmbeddingAhead
    emb = _ThreadNoting(fail=frozenset({"broken text"}))
    ahead = EmbeddingAhead(emb)
    ahead.submit(["broken text", "fine text"])
    with pytest.raises(EmbedderError, match="model down"):
        ahead.embed(["fine text", "broken text"])
    emb.fail = frozenset()
    ahead.submit(["broken text"])
    assert np.array_equal(ahead.embed(["broken text"]), HashEmbedder().embed(["broken text"]))


def test_observing_embeds_each_windows_episodes_while_the_next_window_is_read(tmp_path: object) -> None:
    from pathlib import Path

    from soul_runtime.config import SoulConfig, TurnConfig
    from soul_runtime.loop.soul import Soul
    from soul_runtime.memory.soul_memory import SoulMemory
    from soul_runtime.models.offline import OfflineModel
    emb = _ThreadNoting()
    d = Path(str(tmp_path))
    mem = SoulMemory(d / "m", embedder=emb)
    soul = Soul("obs", d / "m", memory=mem, model=OfflineModel(),
                config=SoulConfig(turn=TurnConfig(observe_window=2)))
    said = [("maya", "We moved the billing service to Postgres 16 on 4 March, ticket BILL-{}."),
            ("leo", "The p95 latency of the uploader is {}0 ms since the pool fix went out."),
            ("maya", "Sprint {} ends on Friday; the release train leaves on Monday after it.")]
    soul.observe([{"speaker": s, "text": t.format(i), "id": f"m{i}"} for i, (s, t) in enumerate(said * 2)])
    ahead = [texts for name, texts in emb.calls if name.startswith("embed-ahead")]
    assert len(ahead) == 3 and all(len(t) == 2 for t in ahead)  # three windows of two messages
    assert mem.stats()["episodes"] == 6 and mem.episodic.ahead.held == 0
    stored = mem.recall("p95 latency of the uploader", k=3, stores=["episodic"])
    assert stored and "uploader" in stored[0].text
    soul.close()
