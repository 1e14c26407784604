"""The turn loop: one soul's turn from its short-term buffer to its trace.

Lives here: ``Soul``, the turn orchestrator of one soul, which enforces a turn's read-then-write order
(buffer → recall → assemble → reply, then one memory decision → guards → writes → trace), the
short-term buffer, context assembly under a token budget, the guards, turn traces, the soul's durable state
(buffer checkpoint, write intents, traces), the write-policy audit and message ingestion (JSONL / LoCoMo).

May import: ``memory``, ``models``, ``embedding`` and the foundation modules. Never ``cli``, ``bench``,
``actors`` or ``ray``.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from soul_runtime.loop.soul import Soul


def __getattr__(attr: str) -> Any:  # lazy: importing a light submodule (say a record type) stays light
    if attr == "Soul":
        from soul_runtime.loop.soul import Soul
        return Soul
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


__all__ = ["Soul"]
