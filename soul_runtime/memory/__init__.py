"""Long-term memory: records on disk, the three layers and their pure policies.

Lives here: ``SoulMemory`` (one soul's three stores, export/import, forget), the episodic / semantic /
procedural stores, their write and recall policies (``policy_*``: frozen dataclasses in, decisions out,
explicit ``now``), the usearch vector index and the SQLite helpers.

May import: the foundation modules (``soul_runtime.errors/config/records/clock/text``) and
``soul_runtime.embedding``. Never ``loop``, ``models``, ``cli``, ``bench``, ``actors`` or ``ray``.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from soul_runtime.memory.soul_memory import SoulMemory


def __getattr__(attr: str) -> Any:  # lazy: importing a light submodule (say a record type) stays light
    if attr == "SoulMemory":
        from soul_runtime.memory.soul_memory import SoulMemory
        return SoulMemory
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


__all__ = ["SoulMemory"]
