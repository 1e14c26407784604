"""The soul's recall parts taken apart in one benchmark run (``--ablation``), on the same stores.

Recall is asked every question once before the store is consolidated (no digests yet) and once after; each
answer is packed with and without the re-ranker (:mod:`soul_runtime.loop.rerank`). ``soul`` is both parts, as a
turn runs them; ``soul_recall_order`` is the code before either part (recall's order, no digests).
"""

from __future__ import annotations

from collections.abc import Sequence

from soul_runtime.loop.context import pack_memory
from soul_runtime.loop.rerank import DEFAULT, OFF
from soul_runtime.records import RecalledItem

ABLATIONS = {"soul_recall_order": (False, False), "soul_rerank_only": (False, True),
             "soul_digests_only": (True, False)}
"""Name -> (digests recalled, re-ranked)."""
LABELS = {"soul_recall_order": "soul: recall's order, no digests", "soul_rerank_only": "soul: re-ranker, no digests",
          "soul_digests_only": "soul: digests, recall's order"}


def packed(items: Sequence[RecalledItem], budget: int, now: float, question: str, rerank: bool = True,
           asker: str = "") -> list[tuple[str, tuple[str, ...]]]:
    """What a turn would show of ``items`` at ``budget`` tokens when ``asker`` asks ``question``, as (line,
    sources); ``rerank`` False: packed in recall's order."""
    return [(line, it.sources) for it, line in pack_memory(items, budget, now, question, DEFAULT if rerank else OFF,
                                                           asker)]


def variants(after: Sequence[RecalledItem], before: Sequence[RecalledItem] | None
             ) -> dict[str, tuple[Sequence[RecalledItem], bool]]:
    """The systems to score for one question: ``soul`` (after consolidation, re-ranked) and, given the recall
    from ``before`` consolidation, the :data:`ABLATIONS`."""
    out: dict[str, tuple[Sequence[RecalledItem], bool]] = {"soul": (after, True)}
    if before is not None:
        out.update({name: (after if digests else before, rr) for name, (digests, rr) in ABLATIONS.items()})
    return out
