"""``GET /v1/souls/{soul_id}/context``: the memory lines a turn with this query would be shown.

Read-only, behind the same tenant key as every ``/v1`` route (the answer is the tenant's own soul's recall): the
items :meth:`TenantSouls.recall` ranks, packed into a token budget by the rule a turn packs its context with
(:func:`soul_runtime.loop.context.pack_memory`), each with the line the model would read and what it costs.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

from fastapi import FastAPI, Query, Request
from pydantic import BaseModel, Field

from soul_runtime import limits
from soul_runtime.config import TurnConfig
from soul_runtime.loop.context import line_tokens, pack_memory
from soul_runtime.records import RecalledItem

from .contract import QueryText, QueryTime, seconds
from .http_api import ERRORS, Backend, SoulId, Stores, layers

ROUTE = "/v1/souls/{soul_id}/context"
DEFAULTS = TurnConfig()


class PackedItem(BaseModel):
    rank: int = Field(description="1 for the best-scored item recalled")
    store: str
    id: str
    text: str
    score: float
    sources: list[str]
    at: float
    shown: bool = Field(description="the item's line fits the budget: the model would read it")
    line: str | None = Field(description="the line the model would read (None when it is not shown); an episode's "
                                         "line starts with its day, or is indented under the line before it "
                                         "when that one is of the same day")
    position: int | None = Field(None, description="where the line stands in what the model reads, 1 first (facts "
                                                   "and procedures, then episodes by day); None when it is not shown")
    tokens: int | None = Field(description="what that line costs in the context (None when it is not shown)")


class ContextOut(BaseModel):
    query: str
    budget: int
    used_tokens: int
    items: list[PackedItem]


def packed(items: list[dict[str, Any]], budget: int, now: float, query: str) -> ContextOut:
    """The recalled items (the tenant's view, best first) with what the turn's packing rule makes of them."""
    recalled = [RecalledItem.from_dict(d) for d in items]
    lines = {(it.store, it.id): (pos, line)
             for pos, (it, line) in enumerate(pack_memory(recalled, budget, now, query), start=1)}
    out = []
    for rank, (d, it) in enumerate(zip(items, recalled, strict=True), start=1):
        pos, line = lines.get((it.store, it.id), (None, None))
        out.append(PackedItem(rank=rank, store=it.store, id=str(d["id"]), text=str(d["text"]), score=it.score,
                              sources=[str(s) for s in d["sources"]], at=it.at, shown=line is not None, line=line,
                              position=pos, tokens=None if line is None else line_tokens(line)))
    return ContextOut(query=query, budget=budget, used_tokens=sum(i.tokens or 0 for i in out), items=out)


def add_context_route(app: FastAPI, backend: Backend) -> None:
    @app.get(ROUTE, tags=["souls"], responses=ERRORS)
    async def context(soul_id: SoulId, request: Request, q: Annotated[QueryText, Query()],
                      budget: Annotated[int, Query(ge=1, le=100_000, description="tokens for memory lines")]
                      = DEFAULTS.memory_tokens,
                      k: Annotated[int, Query(ge=1, le=limits.K_MAX)] = DEFAULTS.recall_k,
                      store: Stores = None,
                      at: Annotated[QueryTime | None, Query(description="as of this time: epoch seconds or an RFC "
                                                                        "3339 date-time (default: now)")] = None
                      ) -> ContextOut:
        """The memory lines a turn asking ``q`` would be shown within ``budget`` tokens: the ``k`` items recall
        ranks (``store`` repeatable), each marked shown or not, with its line and its token cost."""
        s = await backend.souls(request)
        when = seconds(at)
        now = time.time() if when is None else when
        items = await s.recall(soul_id, q, k, when, layers(store))
        return await asyncio.to_thread(packed, items, budget, now, q)
