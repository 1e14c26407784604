"""The public API: what ``soul_runtime`` exports, and one set of signatures in process and through the runtime."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

import soul_runtime
from actors.runtime import AsyncSoulHandle, SoulHandle
from soul_runtime.embedding.fast import FastEmbedder
from soul_runtime.memory.erasure import ForgetQuery
from soul_runtime.memory.soul_memory import SoulMemory

SHARED = ("recall", "facts", "fact_history", "procedures", "episodes", "forget", "forget_where", "stats", "export",
          "import_")


def test_every_exported_name_resolves_and_the_core_stays_light() -> None:
    for name in soul_runtime.__all__:
        assert getattr(soul_runtime, name) is not None, name
    for name in ("StaleOwner", "RuntimeConfig", "TurnResult", "TurnTrace", "RecalledItem", "MemoryWrite", "Fact"):
        assert name in soul_runtime.__all__
    assert issubclass(soul_runtime.StaleOwner, soul_runtime.SoulError)
    with pytest.raises(AttributeError):
        soul_runtime.NoSuchThing  # noqa: B018


def _params(fn: Any) -> list[tuple[str, Any]]:
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()
            if p.name != "self" and p.kind is not inspect.Parameter.KEYWORD_ONLY]


@pytest.mark.parametrize("method", SHARED)
def test_the_in_process_memory_and_the_handles_take_the_same_arguments(method: str) -> None:
    """Positional parameters, names and defaults alike (each side may add keyword-only extras)."""
    assert _params(getattr(SoulMemory, method)) == _params(getattr(SoulHandle, method))
    assert hasattr(AsyncSoulHandle, method)


def test_recall_and_forget_where_take_only_the_handles_arguments(tmp_path: Path) -> None:
    """The in-process memory takes the time of a recall as ``at`` and a targeted forget as ``ids``/``query``,
    as the handles do; the older ``now=`` and ``forget_where(ForgetQuery)`` forms are gone."""
    m = SoulMemory(tmp_path / "s", embedder=FastEmbedder())
    assert "now" not in inspect.signature(SoulMemory.recall).parameters
    with pytest.raises(TypeError):
        m.recall("anything", 3, now=1_700_000_000.0)  # type: ignore[call-arg]
    assert m.recall("anything", 3, at=1_700_000_000.0) == []
    got = m.forget_where(["ep-1"])
    assert set(got) == {"episodic", "semantic", "procedural"}
    assert m.forget_where(ids=["ep-1"]) == got
    assert m.forget_matching(ForgetQuery.make(["ep-1"], None)) == got
    m.close()


@pytest.mark.ray
def test_a_handle_reads_one_trace_by_id_and_the_last_ones(runtime: Any, soul_id: str) -> None:
    import asyncio
    s = runtime.soul(soul_id)
    ids = [s.turn(f"Note {i}: the build runs on runner {i}.", user="maya", at=1_700_000_000 + i).turn_id
           for i in range(3)]
    assert s.trace(ids[1]).turn_id == ids[1]
    assert [t.turn_id for t in s.traces(last=2)] == ids[1:]
    assert [t.turn_id for t in s.traces(last=3)] == ids
    a = runtime.async_soul(soul_id)
    assert [t.turn_id for t in asyncio.run(a.traces(last=1))] == ids[2:]


@pytest.mark.ray
def test_reads_of_an_unknown_soul_raise_not_found_and_create_nothing(runtime: Any, soul_id: str) -> None:
    """Through the Python API over Ray, blocking and async: every read of a soul nobody wrote is NotFound, and the
    soul is in no list and has no directory afterwards."""
    import asyncio

    from soul_runtime.errors import NotFound
    reads = {"recall": ("q",), "facts": (), "fact_history": ("user", "name"), "procedures": (), "episodes": (),
             "traces": (), "trace": (f"{soul_id}/1",), "stats": (), "export": ()}
    h, ah = runtime.soul(soul_id), runtime.async_soul(soul_id)
    for name, args in reads.items():
        with pytest.raises(NotFound, match=soul_id):
            getattr(h, name)(*args)
        with pytest.raises(NotFound, match=soul_id):
            asyncio.run(getattr(ah, name)(*args))
    assert soul_id not in runtime.souls()
    assert not (Path(runtime.cfg.data_dir) / "souls" / soul_id).exists()
    h.turn("My name is Ann.")
    assert soul_id in runtime.souls() and [t.seq for t in h.traces()] == [1] and h.procedures() == []
