"""The Python API over HTTP against the same API over Ray: one scenario played on a tenant's soul of a real
``soul serve`` (its own data dir and Ray, shared with the inspector's and the TypeScript client's tests; the
tenant's key) through ``soul_runtime.connect``, and on the soul of
the same runtime id (``tenant:soul``) of the session's Ray runtime; every answer compared: the same record types,
the same values once the tenant's prefix is taken off the Ray side's ids as the service takes it off (so the model
read the same text on both sides, token counts included), the same errors. A turn whose answer is lost in transit
is sent again with its Idempotency-Key and applied once."""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import soul_runtime
from soul_apps.cli.scenario import SCENARIO, USER
from soul_apps.service.tenants import Scope
from soul_runtime.errors import AuthError, InvalidInput, NotFound
from soul_runtime.http_client import HttpRuntime
from soul_runtime.records import to_plain

pytestmark = pytest.mark.ray

TENANT = Scope("acme")
VOLATILE = ("timings_ms", "episodic_bytes", "semantic_bytes", "procedural_bytes")
"""Fields measured, not computed: a trace's milliseconds per stage, and the stats' sizes of a soul's database files
(they grow as SQLite checkpoints its log, at times of its own); they differ between any two runs, on one transport
or two."""


@pytest.fixture(scope="module")
def serve(served_pair: Any) -> dict[str, Any]:
    """A real ``soul serve`` on a free 127.0.0.1 port (Serve's Python proxy as the ingress), its tenant ``acme``: the
    one tests/test_inspector.py and tests/test_typescript_client.py use too (tests/conftest.py)."""
    return {"url": served_pair.url, "key": served_pair.keys[TENANT.tenant], "proc": served_pair.proc,
            "log": served_pair.base / "serve.log", "data": served_pair.data}


@pytest.fixture(scope="module")
def http(serve: dict[str, Any]) -> Iterator[HttpRuntime]:
    rt = soul_runtime.connect(serve["url"], api_key=serve["key"])
    assert isinstance(rt, HttpRuntime)
    yield rt
    rt.close()


def _plain(obj: Any) -> Any:
    """A record tree as plain data, without the fields that are measured, not computed."""
    def drop(o: Any) -> Any:
        if isinstance(o, dict):
            return {k: drop(v) for k, v in o.items() if k not in VOLATILE}
        if isinstance(o, list):
            return [drop(v) for v in o]
        return o
    return drop(to_plain(obj))


def _seen(obj: Any) -> Any:
    """An answer over Ray as the tenant sees it: plain, the tenant's prefix off its ids (an export's too)."""
    if isinstance(obj, bytes):
        from soul_apps.service.souls_api import TenantSouls
        return TenantSouls(None, TENANT.tenant, souls=list)._unscoped(obj)
    return TENANT.tree(_plain(obj))


def _both(ray: Any, web: Any, call: Any) -> Any:
    """``call`` on the handle over Ray and on the one over HTTP: the same answer (type and value, as the tenant
    sees it), or the same error class; returns the answer over HTTP."""
    def outcome(h: Any) -> tuple[str, Any]:
        try:
            got = call(h)
        except Exception as e:  # noqa: BLE001 - compared below
            return "error", type(e)
        return "ok", got
    a, b = outcome(ray), outcome(web)
    assert a[0] == b[0] and (a[1] is b[1] if a[0] == "error" else True), (a, b)
    if a[0] == "ok":
        assert type(a[1]) is type(b[1])
        if isinstance(a[1], list) and a[1]:
            assert {type(x) for x in a[1]} == {type(x) for x in b[1]}
        assert _seen(a[1]) == _plain(b[1]), _differences(_seen(a[1]), _plain(b[1]))
    return b[1]


def _differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two plain trees differ (for the failure message)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str) for d in _differences(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def test_the_same_scenario_gives_the_same_answers_over_ray_and_over_http(http: HttpRuntime, runtime: Any) -> None:
    sid = f"xt-{uuid.uuid4().hex[:8]}"
    ray, web = runtime.soul(TENANT.soul(sid)), http.soul(sid)
    turns = []
    for d, day in enumerate(SCENARIO):
        for i, text in enumerate(day.turns):
            at = day.date.timestamp() + 60 * i
            turns.append(_both(ray, web, lambda h, t=text, at=at, rid=f"day{d}-{i}": h.turn(
                t, user=USER, at=at, request_id=rid)))
    assert turns[-1].seq == len(turns) and turns[-1].turn_id == f"{sid}/{len(turns)}"
    observed = _both(ray, web, lambda h: h.observe(
        [{"speaker": "maya", "text": "The staging cluster for Tendril runs in eu-west-1.", "id": "m1"},
         {"speaker": "lee", "text": "Got it, eu-west-1 for staging.", "id": "m2"}],
        at=SCENARIO[-1].date.timestamp() + 3600, session="standup", request_id="obs-1"))
    assert observed.writes

    facts = _both(ray, web, lambda h: h.facts())
    assert {(f.entity, f.attribute): f.value for f in facts}[("tendril", "production_database")] == "Postgres 16"
    _both(ray, web, lambda h: h.facts("maya"))
    history = _both(ray, web, lambda h: h.fact_history("tendril", "production_database"))
    assert [v.value for v in history][:1] == ["Postgres 15"]
    assert _both(ray, web, lambda h: h.procedures())
    _both(ray, web, lambda h: h.procedures("draft postmortem"))
    episodes = _both(ray, web, lambda h: h.episodes())
    assert episodes
    day2 = SCENARIO[1].date.timestamp()
    _both(ray, web, lambda h: h.episodes(since=day2, until=day2 + 86400))
    _both(ray, web, lambda h: h.episodes(session="standup"))
    _both(ray, web, lambda h: h.episodes(sessions_ago=1))
    digests = _both(ray, web, lambda h: h.digests())  # brought up to date, with their provenance
    [standup] = [d for d in digests if d.kind == "session" and d.sessions == ("standup",)]
    assert "eu-west-1" in standup.text and set(standup.episodes) <= {e.id for e in episodes} and standup.sources
    later = SCENARIO[-1].date.timestamp() + 7200
    assert _both(ray, web, lambda h: h.recall("Which Postgres does Tendril run?", k=5, at=later))
    _both(ray, web, lambda h: h.recall("postmortem steps", 3, later, ["procedural", "semantic"]))
    traces = _both(ray, web, lambda h: h.traces(last=4))
    assert [t.turn_id for t in traces][-1] == observed.turn_id
    _both(ray, web, lambda h: h.trace(f"{h.id}/4"))
    assert _both(ray, web, lambda h: h.stats())["model_usage"]

    # refused alike, before or after sending
    for bad in (lambda h: h.recall("q", k=0), lambda h: h.recall("", k=3), lambda h: h.episodes(sessions_ago=-1),
                lambda h: h.recall("q", stores=["nowhere"]), lambda h: h.forget_where(),
                lambda h: h.observe("not a list"), lambda h: h.turn("hi", wait_writes="yes"),
                lambda h: h.trace(f"{h.id}/9999"), lambda h: h.traces(last=0), lambda h: h.import_("text")):
        _both(ray, web, bad)
    with pytest.raises(InvalidInput):
        web.episodes(sessions_ago=2**63)
    with pytest.raises(NotFound):
        web.trace(f"{sid}/9999")

    blob = _both(ray, web, lambda h: h.export())
    copy = f"{sid}-copy"
    ray_copy, web_copy = runtime.soul(TENANT.soul(copy)), http.soul(copy)
    assert _both(ray_copy, web_copy, lambda h: h.import_(ray.export() if h is ray_copy else blob)) is None
    assert _both(ray_copy, web_copy, lambda h: h.facts()) == facts
    forgotten = _both(ray, web, lambda h: h.forget_where(ids=[episodes[0].id], request_id="fw-1"))
    assert [w.key for w in forgotten.writes] == [episodes[0].id]
    _both(ray, web, lambda h: h.forget(["procedural"]))
    assert _both(ray, web, lambda h: h.procedures()) == []
    _both(ray, web, lambda h: h.forget())
    assert _both(ray, web, lambda h: h.facts()) == []


def test_the_async_handles_answer_as_the_blocking_ones(http: HttpRuntime, runtime: Any) -> None:
    sid = f"xa-{uuid.uuid4().hex[:8]}"
    day = SCENARIO[0]

    async def play(rt: Any, soul_id: str) -> list[Any]:
        s = rt.async_soul(soul_id)
        out: list[Any] = [await s.turn(t, user=USER, at=day.date.timestamp() + 60 * i, request_id=f"a{i}")
                          for i, t in enumerate(day.turns[:5])]
        out += [await s.facts(), await s.episodes(), await s.traces(last=2), await s.stats(),
                await s.recall("Tendril database", k=3, at=day.date.timestamp() + 600)]
        with pytest.raises(InvalidInput):
            await s.recall("q", k=0)
        return out
    over_ray = asyncio.run(play(runtime, TENANT.soul(sid)))
    over_http = asyncio.run(play(http, sid))
    assert [type(x) for x in over_ray] == [type(x) for x in over_http]
    assert _seen(over_ray) == _plain(over_http)
    assert _plain(http.soul(sid).facts()) == _plain(over_http[5])


class _DropFirstAnswer(httpx.HTTPTransport):
    """Sends every request; the first turn's answer is read and then lost (the connection fails after the server
    has applied the turn)."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, str | None]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        self.sent.append((request.url.path, request.headers.get("Idempotency-Key")))
        if request.url.path.endswith("/turns") and len(self.sent) == 1:
            response.read()
            response.close()
            raise httpx.ReadError("the connection dropped before the answer arrived", request=request)
        return response


class _AsyncDropFirstAnswer(httpx.AsyncHTTPTransport):
    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, str | None]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        self.sent.append((request.url.path, request.headers.get("Idempotency-Key")))
        if request.url.path.endswith("/turns") and len(self.sent) == 1:
            await response.aread()
            await response.aclose()
            raise httpx.ReadError("the connection dropped before the answer arrived", request=request)
        return response


def test_a_turn_whose_answer_was_lost_is_sent_again_and_applied_once(serve: dict[str, Any]) -> None:
    sid = f"xr-{uuid.uuid4().hex[:8]}"
    transport = _DropFirstAnswer()
    with soul_runtime.connect(serve["url"], api_key=serve["key"], transport=transport) as rt:
        s = rt.soul(sid)
        first = s.turn("The production database for Tendril is Postgres 15.", user=USER, at=1_700_000_000)
        assert len(transport.sent) == 2 and transport.sent[0] == transport.sent[1]  # sent twice, one key
        assert transport.sent[0][1]
        assert first.seq == 1
        assert [t.seq for t in s.traces(last=10)] == [1]  # applied once
        assert s.turn("Thanks!", user=USER, at=1_700_000_060).seq == 2

    async def run() -> None:
        t = _AsyncDropFirstAnswer()
        async with HttpRuntime(serve["url"], serve["key"], async_transport=t) as rt:
            a = rt.async_soul(sid + "-a")
            got = await a.turn("Maya is a senior SRE.", user=USER, at=1_700_000_000, request_id="mine")
            assert [k for _, k in t.sent[:2]] == ["mine", "mine"]
            assert got.seq == 1 and [x.seq for x in await a.traces(last=10)] == [1]
    asyncio.run(run())


def test_a_wrong_key_is_an_auth_error_and_connect_needs_one(serve: dict[str, Any],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    with soul_runtime.connect(serve["url"], api_key="not-a-key") as rt, pytest.raises(AuthError):
        rt.soul("anyone").facts()
    monkeypatch.delenv("SOUL_API_KEY", raising=False)
    with pytest.raises(soul_runtime.ConfigError, match="SOUL_API_KEY"):
        soul_runtime.connect(serve["url"])
    monkeypatch.setenv("SOUL_API_KEY", serve["key"])
    with soul_runtime.connect(serve["url"]) as rt:
        assert isinstance(rt.souls(), list)


@pytest.mark.stops_shared_service
def test_a_sigterm_stops_the_service_and_leaves_its_runtime_without_serve(serve: dict[str, Any]) -> None:
    """Runs last of the tests that share the service: SIGTERM stops ``soul serve`` (Serve's Python proxy ingress, whose replicas Serve's throughput mode
    gives a direct ingress too): it exits 0 once stopped, its port refuses connections, and on the runtime, which
    stays up, no process of Serve is left (its controller, proxy and replica); the runtime's own actors are."""
    from soul_apps.cluster.local_cluster import _scan
    proc = serve["proc"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 0, serve["log"].read_text()[-4000:]
    assert "stopped (SIGTERM)" in serve["log"].read_text()
    with pytest.raises(httpx.ConnectError):
        httpx.get(serve["url"] + "/healthz", timeout=10)
    head = json.loads((serve["data"] / "cluster" / "head.json").read_text())
    titles = [c.split()[0] for c in _scan(head["session_id"], head["temp_dir"]).values() if c.startswith("ray::")]
    assert "ray::RuntimeController" in titles, titles
    assert not [t for t in titles if t.startswith(("ray::Serve", "ray::ProxyActor"))], titles
