"""The actors' stop step: what runs beside their calls ends, and every open soul or store is closed."""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from pathlib import Path

import pytest

from actors.layer_shard import LayerShard
from soul_runtime.config import MemoryConfig

from .test_schedule import Clock, host


def test_a_host_stops_its_ticker_and_passivates_every_soul(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        h = host(tmp_path, Clock(), monkeypatch, host_capacity=8, idle_check_s=30.0)
        ticker = h._ticker
        assert ticker is not None and not ticker.done()
        for sid in ("a", "b", "c"):
            await h.last_seq(sid)
        assert await h.stop() == 3
        await asyncio.sleep(0)
        assert h.active_souls() == [] and h._ticker is None and ticker.cancelled()
        assert h.metrics.local["passivations:asked"] == 3
        with pytest.raises(RuntimeError):  # the closing thread has ended
            h._closing_pool.submit(lambda: None)
    asyncio.run(main())


def _open_files_under(root: Path) -> list[str]:
    fds = Path("/proc/self/fd")
    out = []
    for fd in fds.iterdir():
        try:
            target = str(fd.resolve())
        except OSError:
            continue
        if target.startswith(str(root)):
            out.append(target)
    return out


def test_a_shard_stops_closing_every_open_store(tmp_path: Path) -> None:
    shard = LayerShard("semantic", str(tmp_path), asdict(MemoryConfig()), 8, "default", 0, 1, 0.0)
    for sid in ("a", "b"):  # souls that exist (a read of an unknown soul creates nothing)
        (tmp_path / "souls" / sid).mkdir(parents=True)
    before = {sid: shard.read(sid, "stats") for sid in ("a", "b")}
    assert _open_files_under(tmp_path)  # the two stores' databases are open
    assert shard.stop() == 2 and len(shard.open) == 0 and len(shard.locks) == 0
    assert _open_files_under(tmp_path) == []
    again = LayerShard("semantic", str(tmp_path), asdict(MemoryConfig()), 8, "default", 0, 1, 0.0)
    assert {sid: again.read(sid, "stats") for sid in ("a", "b")} == before
    again.stop()


def test_the_actor_base_runs_the_lifecycle_hooks_in_order() -> None:
    """start: the channel is served, then on_start; stop: the channel is closed, then on_stop, whose answer
    stop returns (an async actor's on_stop is awaited by its own async stop)."""
    from typing import Any

    from actors.introspection import ActorBase

    events: list[Any] = []

    class Channel:
        def close(self) -> None:
            events.append("channel closed")

    class Probe(ActorBase):
        def serve_channel(self, methods: tuple[str, ...], concurrency: int) -> None:
            events.append(("channel", methods, concurrency))
            self.channel = Channel()  # type: ignore[assignment]

        def on_start(self) -> None:
            events.append("on_start")

        def on_stop(self) -> int:
            events.append("on_stop")
            return 3

    a = Probe()
    a.start(("run",), 2)
    assert events == [("channel", ("run",), 2), "on_start"]
    assert a.stop() == 3 and a.channel is None
    assert events[2:] == ["channel closed", "on_stop"]
    assert ActorBase().stop() == 0  # nothing to stop
