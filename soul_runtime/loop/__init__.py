"""The turn loop: one soul's turn from its short-term buffer to its trace.

Lives here: ``Soul`` (buffer → recall → assemble → reply → tag → extract → guards → writes → trace), the
short-term buffer, context assembly under a token budget, the guards, turn traces, the soul's durable state
(buffer checkpoint, write intents, traces), the write-policy audit and message ingestion (JSONL / LoCoMo).

May import: ``memory``, ``models``, ``embedding`` and the foundation modules. Never ``cli``, ``bench``,
``actors`` or ``ray``.
"""

from soul_runtime.loop.soul import Soul

__all__ = ["Soul"]
