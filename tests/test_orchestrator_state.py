"""The orchestrator's per-soul state stays bounded by the souls in flight (no Ray needed: plain class)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from actors.orchestrator import BoundedLRU, TurnOrchestrator
from actors.settings import RuntimeConfig


def test_soul_locks_are_fifo_and_dropped_when_unused(tmp_path: Path) -> None:
    orch = TurnOrchestrator(RuntimeConfig(data_dir=str(tmp_path)).to_dict())
    order: list[int] = []

    async def turn(i: int) -> None:
        async with orch._lock("soul-a"):
            order.append(i)
            await asyncio.sleep(0.001)

    async def main() -> None:
        await asyncio.gather(*(turn(i) for i in range(20)), *(_other(orch, j) for j in range(500)))

    asyncio.run(main())
    assert order == list(range(20))
    assert orch.locks == {}


async def _other(orch: TurnOrchestrator, j: int) -> None:
    async with orch._lock(f"soul-{j}"):
        await asyncio.sleep(0)


def test_bounded_lru_forgets_the_oldest() -> None:
    d: BoundedLRU[str, int] = BoundedLRU(3)
    for i in range(10):
        d[f"s{i}"] = i
    d["s7"] = 70  # rewritten: most recent again
    d["s10"] = 10
    assert list(d) == ["s9", "s7", "s10"] and d["s7"] == 70
