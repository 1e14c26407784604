"""Isolation between souls: nothing written to soul B is ever visible through soul A.

In process (property-based): two souls in separate directories sharing one embedder
and one process. On Ray: two souls placed on the same host actor and the same store
shards, before and after both are passivated and reactivated.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soul_runtime.loop.soul import Soul
from soul_runtime.memory.soul_memory import SoulMemory
from soul_runtime.models.offline import OfflineModel
from tests.fakes import HashEmbedder

T0 = 1_780_000_000.0
EMBEDDER = HashEmbedder()
_n = iter(range(10**9))

word = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=3, max_size=8)
marker = st.builds(lambda w, i: f"{w.capitalize()}{i}", word, st.integers(100, 999))


def _statements(m: str) -> list[str]:
    """Turns that put marker ``m`` into every layer: a fact (stated + confirmed), episodes, a procedure."""
    return [f"The production database for {m} is Postgres {m}.", "Correct.",
            f"I'm {m}, a senior SRE on the {m.lower()} team.", "Yes, that's right.",
            f"Can you draft the postmortem for incident-{m.lower()}? Steps: 1. pull the {m.lower()} timeline "
            f"2. summarise {m.lower()} impact", "It shipped, save this as a procedure."]


def everything(mem: SoulMemory, soul: Soul | None, queries: list[str], now: float) -> str:
    """All that soul's memory shows: recall for every query, facts, histories, procedures, episodes, traces, export."""
    parts: list[str] = []
    for q in queries:
        parts += [f"{it.id} {it.text} {' '.join(it.sources)}" for it in mem.recall(q, 50, at=now)]
    for f in mem.facts():
        parts.append(f"{f.key} {f.value} {f.display_entity} {' '.join(f.sources)}")
        parts += [f"{h.value} {' '.join(h.sources)}" for h in mem.fact_history(f.entity, f.attribute)]
    parts += [f"{p.task_class} {' '.join(p.steps)} {' '.join(p.sources)}" for p in mem.procedures()]
    parts += [f"{e.summary} {' '.join(e.sources)} {' '.join(e.entities)} {e.session}" for e in mem.episodes()]
    if soul is not None:
        parts += [str(t.to_dict()) for t in soul.traces(1000)]
    parts.append(str(msgpack.unpackb(mem.export(), raw=False, strict_map_key=False)))
    return "\n".join(parts)


@pytest.fixture
def two_souls() -> Iterator[Any]:
    opened: list[Any] = []

    def make(name: str) -> tuple[SoulMemory, Soul]:
        d = Path(tempfile.mkdtemp(prefix=f"iso-{name}-"))
        mem = SoulMemory(d, embedder=EMBEDDER)
        soul = Soul(name, d, memory=mem, model=OfflineModel())
        opened.append((mem, soul))
        return mem, soul
    yield make
    for mem, soul in opened:
        soul.close()
        mem.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(a=marker, b=marker, free_a=st.lists(st.text(min_size=1, max_size=80).filter(str.strip), max_size=3),
       free_b=st.lists(st.text(min_size=1, max_size=80).filter(str.strip), max_size=3), interleave=st.booleans())
def test_souls_in_one_process_never_see_each_other(two_souls: Any, a: str, b: str, free_a: list[str],
                                                   free_b: list[str], interleave: bool) -> None:
    if a.lower()[:-3] == b.lower()[:-3] or a[-3:] == b[-3:]:
        return
    ida, idb = f"souls-a{next(_n)}", f"souls-b{next(_n)}"
    mem_a, soul_a = two_souls(ida)
    mem_b, soul_b = two_souls(idb)
    free_a = [t for t in free_a if t.isprintable()]
    free_b = [t for t in free_b if t.isprintable() and not any(w in t.lower() for w in (a.lower(), a[-3:]))]
    turns_a, turns_b = _statements(a) + free_a, _statements(b) + free_b
    order = ([(soul_a, t) for t in turns_a] + [(soul_b, t) for t in turns_b]) if not interleave else [
        x for pair in zip([(soul_a, t) for t in turns_a], [(soul_b, t) for t in turns_b], strict=False) for x in pair] + [
        (soul_b, t) for t in turns_b[len(turns_a):]] + [(soul_a, t) for t in turns_a[len(turns_b):]]
    for i, (soul, text) in enumerate(order):
        soul.turn(text, user="Maya", at=T0 + 60 * i)
    soul_b.observe([{"speaker": "Ben", "text": f"{b} runs on the {b.lower()} cluster.", "id": f"{b.lower()}-obs"}],
                   at=T0 + 10_000)
    queries = [a, b, f"Which Postgres does {b} run?", f"postmortem {b.lower()}", "postmortem", "team"]
    seen_a = everything(mem_a, soul_a, queries, T0 + 20_000)
    seen_b = everything(mem_b, soul_b, queries, T0 + 20_000)
    assert b in seen_b and b.lower() in seen_b  # B's memory really holds B's marker …
    assert a in seen_a
    for token in (b, b.lower(), idb, f"{b.lower()}-obs"):
        assert token not in seen_a, (token, "of soul B visible through soul A")
    for token in (a, a.lower(), ida):
        assert token not in seen_b, (token, "of soul A visible through soul B")
    assert mem_a.procedures() and mem_b.procedures()
    assert {p.task_class for p in mem_a.procedures()} == {p.task_class for p in mem_b.procedures()}
    assert not set(s for p in mem_b.procedures() for s in p.sources) & set(s for p in mem_a.procedures() for s in p.sources)


# ---- on Ray: same host, same shards, before and after passivation -----------------------------------------------
def _colocated_pair(cfg: Any, prefix: str) -> tuple[str, str]:
    from actors.controller import host_name
    from actors.placement import rendezvous, shard_index

    hosts = [host_name(i) for i in range(cfg.hosts)]

    def where(sid: str) -> tuple[Any, ...]:
        return (rendezvous(sid, hosts),) + tuple(shard_index(sid, cfg.shards(layer), layer)
                                                 for layer in ("episodic", "semantic", "procedural"))
    first = f"{prefix}-a0"
    for i in range(1, 10_000):
        other = f"{prefix}-b{i}"
        if where(other) == where(first):
            return first, other
    raise AssertionError("no colocated pair found")


def _ray_everything(s: Any, queries: list[str]) -> str:
    parts: list[str] = []
    for q in queries:
        parts += [f"{it.id} {it.text} {' '.join(it.sources)}" for it in s.recall(q, 50, at=T0 + 20_000)]
    for f in s.facts():
        parts.append(f"{f.key} {f.value} {' '.join(f.sources)}")
        parts += [f"{h.value} {' '.join(h.sources)}" for h in s.fact_history(f.entity, f.attribute)]
    parts += [f"{p.task_class} {' '.join(p.steps)} {' '.join(p.sources)}" for p in s.procedures()]
    parts += [f"{e.summary} {' '.join(e.sources)} {' '.join(e.entities)}" for e in s.episodes()]
    parts += [str(t.to_dict()) for t in s.traces(last=1000)]
    parts.append(str(msgpack.unpackb(s.export(), raw=False, strict_map_key=False)))
    return "\n".join(parts)


@pytest.mark.ray
def test_colocated_souls_on_ray_are_isolated_across_passivation(runtime: Any, soul_id: str) -> None:
    from actors import raycalls
    from actors.controller import host_name
    from actors.placement import rendezvous

    cfg = runtime.cfg
    ida, idb = _colocated_pair(cfg, soul_id)
    host = rendezvous(ida, [host_name(i) for i in range(cfg.hosts)])
    assert runtime.placement(ida)["host"] == runtime.placement(idb)["host"] == host
    for layer in ("episodic", "semantic", "procedural"):
        assert runtime.store(layer, ida) == runtime.store(layer, idb)  # the very same shard actor
    sa, sb = runtime.soul(ida), runtime.soul(idb)
    ma, mb = "Quokka417", "Wombat829"
    for i, (ta, tb) in enumerate(zip(_statements(ma), _statements(mb), strict=True)):
        sa.turn(ta, user="Maya", at=T0 + 60 * i)
        sb.turn(tb, user="Maya", at=T0 + 60 * i)
    sb.observe([{"speaker": "Ben", "text": f"{mb} runs on the {mb.lower()} cluster.", "id": "wombat-obs"}],
               at=T0 + 1000)
    sa.observe([{"speaker": "Ann", "text": f"{ma} runs on the {ma.lower()} cluster.", "id": "quokka-obs"}],
               at=T0 + 1000)
    queries = [ma, mb, f"Which Postgres does {mb} run?", "postmortem", "cluster", "team"]

    def check() -> None:
        seen_a, seen_b = _ray_everything(sa, queries), _ray_everything(sb, queries)
        assert mb in seen_b and ma in seen_a
        for token in ("wombat", idb.lower()):
            assert token not in seen_a.lower(), token
        for token in ("quokka", ida.lower()):
            assert token not in seen_b.lower(), token
        assert sa.procedures() and sb.procedures()

    check()
    h = raycalls.get_actor(host, cfg.namespace)
    assert h is not None
    assert set(raycalls.get(raycalls.call(h, "active_souls"))) >= {ida, idb}
    assert raycalls.get([raycalls.call(h, "passivate", ida), raycalls.call(h, "passivate", idb)]) == [True, True]
    assert not {ida, idb} & set(raycalls.get(raycalls.call(h, "active_souls")))
    check()  # reads reactivate the souls (traces go through the host)
    r = sb.turn(f"My favourite editor is {mb}Edit.", user="Maya", at=T0 + 2000)
    assert r.seq == len(_statements(mb)) + 2  # the sequence survived passivation
    check()
