"""Embedders: the ``Embedder`` protocol (batched in shared code), MiniLM on onnxruntime (the default), a
numpy fp32 BERT reference, and ``FastEmbedder`` (deterministic, cheap; for benchmarks and tests).

May import: the foundation modules only. Never ``memory``, ``loop``, ``cli``, ``bench``, ``actors`` or ``ray``.
"""
