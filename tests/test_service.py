"""The HTTP service end to end: a real ``soul serve`` process (Ray Serve on the data dir's local runtime) on a free
127.0.0.1 port, reached with httpx and with the ``mcp`` SDK's own clients (streamable HTTP and stdio)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fakes import stop_serve, wait_healthy

pytestmark = pytest.mark.ray

SOUL = shutil.which("soul")
TENANTS = ("acme", "beta")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "SOUL_"))}
    env.update(extra)
    return env


def _soul(env: dict[str, str], *args: str, timeout: float = 180, check: bool = True) -> subprocess.CompletedProcess[str]:
    assert SOUL, "the `soul` console script is not installed: run `pip install -e .`"
    p = subprocess.run([SOUL, *args], env=env, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    if check and p.returncode != 0:
        raise AssertionError(f"soul {' '.join(args)} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running_service() -> Iterator[dict[str, Any]]:
    """A real ``soul serve`` (the default ingress) on a fresh data dir with tenants acme and beta; stopped by its pid
    (its runtime by ``soul down``) on exit."""
    base = Path(tempfile.mkdtemp(prefix="sv", dir="/tmp"))
    data = base / "data"
    env = _env(SOUL_DATA_DIR=str(data))
    keys = {t: json.loads(_soul(env, "tenants", "add", t, "--json").stdout)["key"] for t in TENANTS}
    port = _free_port()
    log = open(base / "serve.log", "w")  # noqa: SIM115 - closed at teardown
    proc = subprocess.Popen([SOUL, "serve", "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    wait_healthy(proc, url, base / "serve.log")
    srv = {"url": url, "keys": keys, "env": env, "data": data, "proc": proc, "base": base, "port": port, "log": log,
           "start_s": round(time.monotonic() - t0, 1)}
    try:
        yield srv
    finally:  # the service that runs now (a test may have restarted it)
        stop_serve(srv["proc"], srv["log"], lambda: _soul(env, "down", check=False))
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def server(shared_service: dict[str, Any]) -> dict[str, Any]:
    """:func:`running_service`, shared with tests/test_openapi.py's tests against a real service, which run after
    this module's tests but before its last one, which stops it (tests/conftest.py)."""
    return shared_service


def _client(srv: dict[str, Any], tenant: str | None = None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {srv['keys'][tenant]}"} if tenant else {}
    return httpx.Client(base_url=srv["url"], headers=headers, timeout=120)


def _haproxy_serving(port: int) -> bool:
    """A haproxy process whose configuration binds ``port``."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() != "haproxy":
                continue
            args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            conf = Path(args[args.index("-f") + 1])
            if re.search(rf"^\s*bind\s+\S*:{port}\b", conf.read_text(), re.M):
                return True
        except (OSError, ValueError, IndexError):
            pass
    return False


def test_health_openapi_and_keys(server: dict[str, Any]) -> None:
    anon = _client(server)
    assert anon.get("/healthz").json() == {"status": "ok"}
    if sys.platform.startswith("linux"):  # ray[serve] brings haproxy there: the default ingress is HAProxy
        log = server["base"] / "serve.log"
        deadline = time.monotonic() + 30  # `soul serve` says so once it has seen /healthz answer too
        while "serving http" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        port = int(server["url"].rsplit(":", 1)[1])
        assert "haproxy ingress" in log.read_text() and _haproxy_serving(port), log.read_text()
    spec = anon.get("/openapi.json").json()
    paths = set(spec["paths"])
    assert {"/v1/souls", "/v1/souls/{soul_id}/turns", "/v1/souls/{soul_id}/observe", "/v1/souls/{soul_id}/recall",
            "/v1/souls/{soul_id}/facts", "/v1/souls/{soul_id}/facts/{entity}/{attribute}/history",
            "/v1/souls/{soul_id}/episodes", "/v1/souls/{soul_id}/procedures", "/v1/souls/{soul_id}/traces",
            "/v1/souls/{soul_id}/traces/{seq}", "/v1/souls/{soul_id}/stats", "/v1/souls/{soul_id}/export",
            "/v1/souls/{soul_id}/import", "/v1/souls/{soul_id}", "/v1/souls/{soul_id}/forget"} <= paths
    assert "TurnIn" in spec["components"]["schemas"]
    for headers in ({}, {"Authorization": "Bearer soul_wrong"}, {"Authorization": server["keys"]["acme"]},
                    {"Authorization": f"Basic {server['keys']['acme']}"}):
        for method, path in (("GET", "/v1/souls"), ("POST", "/v1/souls/maya/turns"), ("GET", "/v1/souls/maya/facts"),
                             ("DELETE", "/v1/souls/maya"), ("POST", "/mcp/")):
            r = anon.request(method, path, headers=headers, json={"text": "hi"})
            assert r.status_code == 401, (method, path, r.text)
            assert r.json()["error"]["type"] == "Unauthorized" and r.headers["www-authenticate"] == "Bearer"
    assert not (server["data"] / "souls").exists() or not any((server["data"] / "souls").iterdir())


def _answers_as_documented(spec: dict[str, Any], path: str, body: dict[str, Any]) -> None:
    """A turn, observe or forget answer has exactly the fields, and their JSON types, of its route's 200 schema
    in /openapi.json (fields of plain types, arrays of them; any other schema form fails here by name)."""
    route = "/v1/souls/{soul_id}/" + path.rsplit("/", 1)[1]
    ref = spec["paths"][route]["post"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    schema = spec["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert set(body) == set(schema["properties"]) == set(schema["required"]), (route, body)
    kinds = {"string": str, "integer": int, "boolean": bool, "array": list, "object": dict}

    def fits(x: Any, prop: dict[str, Any], where: str) -> bool:
        assert prop.get("type") in kinds, f"{route} {where}: schema {prop} is not checked here"
        return isinstance(x, kinds[prop["type"]]) and (prop["type"] == "boolean" or not isinstance(x, bool))
    for name, prop in schema["properties"].items():
        assert fits(body[name], prop, name), (route, name, body[name])
        if prop["type"] == "array":
            assert all(fits(x, prop["items"], name) for x in body[name]), (route, name)


def test_every_route(server: dict[str, Any]) -> None:
    c = _client(server, "acme")
    sid = f"maya-{uuid.uuid4().hex[:6]}"
    v = f"/v1/souls/{sid}"
    t1 = c.post(v + "/turns", json={"text": "The production database for Tendril is Postgres 15.", "user": "Maya",
                                    "at": "2026-03-02T09:00:00Z"})
    assert t1.status_code == 200, t1.text
    body = t1.json()
    assert body["turn_id"] == f"{sid}/1" and body["seq"] == 1 and body["writes"] and not body["writes_pending"]
    assert "acme" not in t1.text
    spec = c.get("/openapi.json").json()
    _answers_as_documented(spec, v + "/turns", body)
    obs = c.post(v + "/observe", json={"messages": [
        {"speaker": "Maya", "text": "Correct, Tendril runs Postgres 15 in production.", "id": "c2"},
        {"speaker": "Maya", "text": "We rolled back the cache deploy after the latency spike.", "id": "c3"}],
        "at": "2026-03-02T09:05:00Z"})
    assert obs.status_code == 200 and obs.json()["seq"] == 2, obs.text
    _answers_as_documented(spec, v + "/observe", obs.json())
    items = c.get(v + "/recall", params={"q": "Tendril production database", "k": 5}).json()["items"]
    assert items and any("Postgres 15" in i["text"] for i in items)
    sem = c.get(v + "/recall", params=[("q", "Tendril database"), ("store", "semantic")]).json()["items"]
    assert {i["store"] for i in sem} <= {"semantic"}
    facts = c.get(v + "/facts").json()["facts"]
    fact = next(f for f in facts if f["value"] == "Postgres 15")
    hist = c.get(f"{v}/facts/{fact['entity']}/{fact['attribute']}/history").json()["versions"]
    assert [h["value"] for h in hist] == ["Postgres 15"]
    assert c.get(v + "/facts", params={"entity": fact["entity"]}).json()["facts"]
    assert c.get(v + "/episodes").json()["episodes"]
    assert c.get(v + "/procedures").json() == {"procedures": []}
    traces = c.get(v + "/traces", params={"last": 5}).json()["traces"]
    assert [t["turn_id"] for t in traces] == [f"{sid}/1", f"{sid}/2"] and traces[0]["soul_id"] == sid
    one = c.get(v + "/traces/2").json()
    assert one["kind"] == "observe" and one["turn_id"] == f"{sid}/2"
    assert c.get(v + "/stats").json()["facts"] >= 1
    assert sid in c.get("/v1/souls").json()["souls"]

    # Idempotency-Key: answered once; another body with the same key is refused and changes nothing
    k = {"Idempotency-Key": "order-42"}
    a = c.post(v + "/turns", json={"text": "Ship the release on Friday."}, headers=k).json()
    b = c.post(v + "/turns", json={"text": "Ship the release on Friday."}, headers=k).json()
    assert a["turn_id"] == b["turn_id"] == f"{sid}/3" and a["reply"] == b["reply"]
    r = c.post(v + "/turns", json={"text": "Ship it on Monday."}, headers=k)
    assert r.status_code == 422 and r.json()["error"]["type"] == "IdempotencyConflict"
    assert c.post(v + "/turns", json={"text": "x"}, headers={"Idempotency-Key": "k" * 201}).status_code == 400
    assert len(c.get(v + "/traces", params={"last": 50}).json()["traces"]) == 3

    # export -> import into a new soul; the ids in the export carry no tenant prefix
    blob = c.get(v + "/export")
    assert blob.status_code == 200 and blob.headers["content-type"] == "application/octet-stream"
    assert b"acme" not in blob.content and sid.encode() in blob.content
    copy = f"{sid}-copy"
    r = c.post(f"/v1/souls/{copy}/import", content=blob.content, headers={"content-type": "application/octet-stream"})
    assert r.status_code == 201, r.text
    assert [f["value"] for f in c.get(f"/v1/souls/{copy}/facts").json()["facts"]] == [f["value"] for f in facts]
    again = c.post(f"/v1/souls/{copy}/import", content=blob.content, headers={"content-type": "application/octet-stream"})
    assert again.status_code == 400 and again.json()["error"]["type"] == "InvalidInput"
    assert c.post(f"/v1/souls/{sid}-x/import", content=b"not an export",
                  headers={"content-type": "application/octet-stream"}).status_code == 400
    assert c.post(f"/v1/souls/{sid}-x/import", json={"a": 1}).status_code == 400

    # forget single memories, then the whole soul
    ep = c.get(v + "/episodes").json()["episodes"][0]
    gone = c.post(v + "/forget", json={"query": "latency spike"})
    assert gone.status_code == 200 and gone.json()["deleted"], gone.text
    _answers_as_documented(spec, v + "/forget", gone.json())
    assert all("latency spike" not in e["summary"] for e in c.get(v + "/episodes").json()["episodes"])
    assert ep
    erased = c.delete(f"/v1/souls/{copy}").json()["erased"]
    assert erased["semantic"] >= 1
    assert c.get(f"/v1/souls/{copy}/facts").json() == {"facts": []}
    assert c.get(f"/v1/souls/{copy}/traces").json() == {"traces": []}
    # after the erase the same key may be used again on the erased soul
    assert c.post(f"/v1/souls/{copy}/turns", json={"text": "Ship it on Monday."}, headers=k).status_code == 200


READ_ROUTES = ("/recall?q=project", "/context?q=project", "/facts", "/facts?entity=user", "/facts/user/name/history",
               "/episodes", "/episodes?sessions_ago=0", "/procedures", "/procedures?task=deploy", "/traces",
               "/traces?last=5", "/traces/1", "/stats", "/export", "/digests")
"""Every GET route under ``/v1/souls/{soul_id}``, some with their parameters."""


def test_reads_of_unknown_souls_create_nothing(server: dict[str, Any]) -> None:
    """Every read route of a soul nobody wrote, or only the other tenant did, answers 404 NotFound (JSON of the error
    tree) for both tenants, and leaves no directory and no entry in the tenant's list of souls."""
    spec = _client(server).get("/openapi.json").json()
    gets = {p.removeprefix("/v1/souls/{soul_id}") for p, ops in spec["paths"].items()
            if p.startswith("/v1/souls/{soul_id}") and "get" in ops}
    covered = {re.sub(r"\?.*", "", r).replace("/1", "/{seq}").replace("/user/name/", "/{entity}/{attribute}/")
               for r in READ_ROUTES}
    assert gets == covered, gets ^ covered  # a new read route is tested here too
    run = uuid.uuid4().hex[:6]
    clients = {t: _client(server, t) for t in TENANTS}
    theirs = {t: f"theirs-{t}-{run}" for t in TENANTS}  # each tenant writes one soul the other then reads
    for t, c in clients.items():
        assert c.post(f"/v1/souls/{theirs[t]}/turns", json={"text": "Our codename is Tern."}).status_code == 200
    souls = Path(server["data"]) / "souls"
    before = sorted(p.name for p in souls.iterdir())
    for t, c in clients.items():
        other = next(o for o in TENANTS if o != t)
        for sid in (f"ghost-{run}", theirs[other]):
            for route in READ_ROUTES:
                r = c.get(f"/v1/souls/{sid}{route}")
                assert r.status_code == 404, (t, sid, route, r.status_code, r.text[:200])
                assert r.headers["content-type"] == "application/json", (route, r.headers)
                err = r.json()["error"]
                assert err["type"] == "NotFound" and sid in err["message"] and f"{t}:" not in err["message"], err
        listed = c.get("/v1/souls").json()["souls"]
        assert theirs[t] in listed and f"ghost-{run}" not in listed and theirs[other] not in listed
    assert sorted(p.name for p in souls.iterdir()) == before  # no directory made by a read
    assert not [p for p in before if run in p and not p.endswith(tuple(theirs.values()))]
    # the tenant's own soul reads as before (200), its unknown trace is still a NotFound of its own
    c = clients["acme"]
    assert c.get(f"/v1/souls/{theirs['acme']}/traces").json()["traces"][0]["turn_id"] == f"{theirs['acme']}/1"
    assert c.get(f"/v1/souls/{theirs['acme']}/traces/9").status_code == 404


def _state(c: httpx.Client, sid: str) -> tuple[Any, ...]:
    v = f"/v1/souls/{sid}"
    return (c.get(v + "/export").content, c.get(v + "/traces", params={"last": 100}).json(),
            c.get(v + "/facts").json(), sorted(c.get("/v1/souls").json()["souls"]))


def test_bad_input_is_refused_and_changes_nothing(server: dict[str, Any]) -> None:
    c = _client(server, "acme")
    sid = f"bad-{uuid.uuid4().hex[:6]}"
    v = f"/v1/souls/{sid}"
    assert c.post(v + "/turns", json={"text": "Our staging cluster is in Frankfurt."}).status_code == 200
    before = _state(c, sid)
    j = {"content-type": "application/json"}
    cases: list[tuple[str, str, dict[str, Any], int]] = [
        ("POST", v + "/turns", {"content": b"{not json", "headers": j}, 400),
        ("POST", v + "/turns", {"content": b"", "headers": j}, 422),
        ("POST", v + "/turns", {"json": {"text": 5}}, 422),
        ("POST", v + "/turns", {"json": {"text": "hi", "wait_writes": "yes"}}, 422),
        ("POST", v + "/turns", {"json": {"text": "hi", "extra": 1}}, 422),
        ("POST", v + "/turns", {"json": ["text"]}, 422),
        ("POST", v + "/turns", {"json": {"text": "   "}}, 400),
        ("POST", v + "/turns", {"json": {"text": "bad\x00char"}}, 400),
        ("POST", v + "/turns", {"json": {"text": "hi", "at": "not a time"}}, 400),
        ("POST", v + "/turns", {"json": {"text": "hi", "at": True}}, 422),
        ("POST", v + "/observe", {"json": {"messages": []}}, 400),
        ("POST", v + "/observe", {"json": {"messages": [{"speaker": "a", "text": "b"}]}}, 422),
        ("POST", v + "/observe", {"json": {"messages": [{"speaker": "a", "text": "b", "id": "x y"}]}}, 400),
        ("POST", v + "/observe", {"json": {"messages": [{"speaker": "a", "text": "b", "id": "m", "at": 1e30}]}}, 400),
        ("POST", v + "/forget", {"json": {}}, 400),
        ("POST", v + "/forget", {"json": {"ids": "ep-1"}}, 422),
        ("GET", v + "/recall", {"params": {"q": "x", "k": 0}}, 400),
        ("GET", v + "/recall", {"params": {"q": "x", "k": "many"}}, 422),
        ("GET", v + "/recall", {"params": {"q": "x", "store": "nowhere"}}, 400),
        ("GET", v + "/traces/0", {}, 400),
        ("GET", v + "/traces/abc", {}, 422),
        ("GET", v + "/traces/99", {}, 404),
        ("GET", v + "/facts/none/none/history", {}, 404),
        ("GET", "/v1/souls/" + "x" * 96 + "/facts", {}, 400),
        ("GET", "/v1/souls/-bad/facts", {}, 400),
        ("POST", "/v1/souls/a%20b/turns", {"json": {"text": "hi"}}, 400),
        ("GET", v + "/nothing-here", {}, 404),
    ]
    for method, path, kw, code in cases:
        r = c.request(method, path, **kw)
        assert r.status_code == code, (method, path, kw, r.status_code, r.text)
        err = r.json()["error"]
        assert set(err) == {"type", "message"} and err["message"] and "acme" not in r.text, r.text
        assert str(server["data"]) not in r.text
    assert _state(c, sid) == before


ROUTES = ("turn", "observe", "recall", "facts", "traces", "trace1", "episodes", "stats", "history", "export", "list")


def _read(c: httpx.Client, sid: str, op: str) -> httpx.Response:
    v = f"/v1/souls/{sid}"
    return {"recall": lambda: c.get(v + "/recall", params={"q": "project codename"}),
            "facts": lambda: c.get(v + "/facts"), "traces": lambda: c.get(v + "/traces", params={"last": 50}),
            "trace1": lambda: c.get(v + "/traces/1"), "episodes": lambda: c.get(v + "/episodes"),
            "stats": lambda: c.get(v + "/stats"), "history": lambda: c.get(v + "/facts/user/codename/history"),
            "export": lambda: c.get(v + "/export")}[op]()


def _norm(r: httpx.Response, sid: str) -> tuple[int, Any]:
    """A read's status and answer with the soul id replaced, and sizes on disk left out."""
    if r.headers.get("content-type") == "application/octet-stream":
        return r.status_code, r.content.replace(sid.encode(), b"SOUL")
    data = json.loads(r.text.replace(sid, "SOUL"))
    if isinstance(data, dict):
        data = {k: v for k, v in data.items() if not k.endswith("_bytes")}
    return r.status_code, data


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(TENANTS), st.sampled_from(("maya", "zed", "a.b@c")),
                          st.sampled_from(ROUTES)), min_size=2, max_size=9))
def test_tenants_are_apart(server: dict[str, Any], steps: list[tuple[str, str, str]]) -> None:
    """Random sequences of routes, tenants and souls: a tenant never sees another's souls, words, ids or name, and
    a soul only another tenant has written reads exactly like one nobody has written."""
    run = uuid.uuid4().hex[:6]
    clients = {t: _client(server, t) for t in TENANTS}
    wrote: dict[tuple[str, str], int] = {}
    touched: dict[str, set[str]] = {t: set() for t in TENANTS}
    words = {t: f"zq{t}{run}" for t in TENANTS}  # every text a tenant writes holds its own word
    for tenant, name, op in steps:
        c, sid = clients[tenant], f"{name}-{run}"
        others = [o for o in TENANTS if o != tenant]
        touched[tenant].add(sid)
        n = wrote.get((tenant, sid), 0)
        if op == "turn":
            r = c.post(f"/v1/souls/{sid}/turns", json={"text": f"Our project codename is {words[tenant]}."})
        elif op == "observe":
            r = c.post(f"/v1/souls/{sid}/observe", json={"messages": [
                {"speaker": "user", "text": f"The project codename is {words[tenant]}.", "id": f"m{n}"}]})
        elif op == "list":
            r = c.get("/v1/souls")
            mine = set(r.json()["souls"])
            assert {s for (t, s) in wrote if t == tenant} <= mine
            assert all(s.endswith(run) is False or s in touched[tenant] for s in mine), (mine, touched)
        else:
            r = _read(c, sid, op)
            if n == 0:  # the tenant never wrote this soul (perhaps the other one did): it reads as a new soul
                fresh = f"new{uuid.uuid4().hex[:6]}"
                assert _norm(r, sid) == _norm(_read(c, fresh, op), fresh), (op, r.text)
        if op in ("turn", "observe"):
            assert r.status_code == 200, r.text
            wrote[(tenant, sid)] = n + 1
            assert r.json()["turn_id"] == f"{sid}/{n + 1}"
        text = r.text if r.headers.get("content-type") != "application/octet-stream" else r.content.decode("latin-1")
        for o in others:
            assert words[o] not in text and f"{o}:" not in text, (tenant, op, text[:300])
        assert f"{tenant}:" not in text
        if op == "traces":
            assert r.status_code == 404 if n == 0 else len(r.json()["traces"]) == n, r.text[:200]


def test_mcp_over_streamable_http(server: dict[str, Any]) -> None:
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client
    sid = f"mcp-{uuid.uuid4().hex[:6]}"

    async def session(tenant: str, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {server['keys'][tenant]}"})
        out = []
        async with Client(streamable_http_client(server["url"] + "/mcp/", http_client=http)) as c:
            out.append(await c.list_tools())
            for name, args in calls:
                out.append(await c.call_tool(name, args))
        return out

    got = anyio.run(session, "acme", [("remember", {"soul_id": sid, "text": "My dog is called Biscuit."}),
                                      ("recall", {"soul_id": sid, "query": "what is my dog called", "k": 3}),
                                      ("facts", {"soul_id": sid}),
                                      ("recall", {"soul_id": "no such id!", "query": "x"})])
    tools = {t.name: t for t in got[0].tools}
    assert set(tools) >= {"remember", "recall", "facts", "forget"}
    assert "before answering" in tools["recall"].description and "forget" in tools["forget"].description
    assert not got[1].is_error and got[1].structured_content["turn_id"] == f"{sid}/1"
    items = got[2].structured_content["items"]
    assert any("Biscuit" in i["text"] for i in items)
    assert got[4].is_error and "InvalidInput" in got[4].content[0].text
    # the HTTP API sees the same soul; the other tenant does not
    assert any("Biscuit" in i["text"] for i in _client(server, "acme").get(
        f"/v1/souls/{sid}/recall", params={"q": "dog"}).json()["items"])
    other = anyio.run(session, "beta", [("recall", {"soul_id": sid, "query": "what is my dog called"})])
    assert other[1].is_error and "NotFound" in other[1].content[0].text  # beta has no soul of that name
    gone = anyio.run(session, "acme", [("forget", {"soul_id": sid, "query": "Biscuit"}),
                                       ("recall", {"soul_id": sid, "query": "dog"})])
    assert gone[1].structured_content["deleted"]
    assert all("Biscuit" not in i["text"] for i in gone[2].structured_content["items"])


def test_mcp_over_stdio(server: dict[str, Any]) -> None:
    from mcp import Client, StdioServerParameters
    sid = f"desk-{uuid.uuid4().hex[:6]}"
    c = _client(server, "beta")
    assert c.post(f"/v1/souls/{sid}/turns", json={"text": "I prefer tea over coffee."}).status_code == 200
    assert SOUL

    async def session() -> list[Any]:
        params = StdioServerParameters(command=SOUL, args=["mcp", "--soul", sid, "--tenant", "beta"],
                                       env=server["env"])
        async with Client(params) as cl:
            return [await cl.call_tool("recall", {"query": "tea or coffee"}),
                    await cl.call_tool("remember", {"text": "My sister lives in Lisbon."}),
                    await cl.call_tool("recall", {"query": "x", "soul_id": "someone-else"})]

    got = anyio.run(session)
    assert any("tea" in i["text"] for i in got[0].structured_content["items"])
    assert not got[1].is_error and got[1].structured_content["turn_id"] == f"{sid}/2"
    assert got[2].is_error
    assert any("Lisbon" in i["text"] for i in c.get(f"/v1/souls/{sid}/recall", params={"q": "sister"}).json()["items"])


def test_tenant_removed_with_its_souls(server: dict[str, Any]) -> None:
    env, data = server["env"], server["data"]
    key = json.loads(_soul(env, "tenants", "add", "gamma", "--json").stdout)["key"]
    c = httpx.Client(base_url=server["url"], headers={"Authorization": f"Bearer {key}"}, timeout=120)
    for sid in ("one", "two"):
        assert c.post(f"/v1/souls/{sid}/turns", json={"text": f"The {sid} service runs on port 8080."},
                      headers={"Idempotency-Key": "k"}).status_code == 200
    assert (data / "souls" / "gamma:one").is_dir()
    assert _soul(env, "tenants", "remove", "gamma", check=False).returncode == 2  # has souls: needs --forget
    out = json.loads(_soul(env, "tenants", "remove", "gamma", "--forget", "--json").stdout)
    assert sorted(out["souls_deleted"]) == ["one", "two"]
    assert not [p for p in (data / "souls").iterdir() if p.name.startswith("gamma:")]
    assert c.get("/v1/souls").status_code == 401
    key2 = json.loads(_soul(env, "tenants", "add", "gamma", "--json").stdout)["key"]
    c2 = httpx.Client(base_url=server["url"], headers={"Authorization": f"Bearer {key2}"}, timeout=120)
    for route in ("traces", "facts"):  # nothing of the old souls is served: the new tenant has no soul 'one'
        r = c2.get(f"/v1/souls/one/{route}")
        assert r.status_code == 404 and r.json()["error"]["type"] == "NotFound", r.text
    r = c2.post("/v1/souls/one/turns", json={"text": "Something else."}, headers={"Idempotency-Key": "k"})
    assert r.status_code == 200 and r.json()["turn_id"] == "one/1"


def test_a_turn_over_a_tenants_limit_is_refused_before_it_begins(server: dict[str, Any]) -> None:
    """``soul tenants set`` on a running service: a turn over turns/s or over the souls limit is a 429
    QuotaExceeded with Retry-After and the JSON error body, and leaves nothing (no trace, no soul, no directory);
    ``GET /v1/usage`` shows the tenant's souls, counts and limits."""
    env, data = server["env"], server["data"]
    key = json.loads(_soul(env, "tenants", "add", "quota", "--json").stdout)["key"]
    _soul(env, "tenants", "set", "quota", "--turns-per-s", "0.2", "--souls", "1")
    c = httpx.Client(base_url=server["url"], headers={"Authorization": f"Bearer {key}"}, timeout=120)
    ok = c.post("/v1/souls/one/turns", json={"text": "The billing job runs at 6 am."}, headers={"Idempotency-Key": "a"})
    assert ok.status_code == 200, ok.text
    r = c.post("/v1/souls/one/turns", json={"text": "It moved to 7 am."}, headers={"Idempotency-Key": "b"})
    assert r.status_code == 429 and r.headers["content-type"] == "application/json", r.text
    assert r.json()["error"]["type"] == "QuotaExceeded" and "turns per second" in r.json()["error"]["message"]
    assert 1 <= int(r.headers["retry-after"]) <= 5
    traces = c.get("/v1/souls/one/traces").json()["traces"]
    assert [t["query"] for t in traces] == ["The billing job runs at 6 am."]  # nothing of the refused turn
    _soul(env, "tenants", "set", "quota", "--turns-per-s", "0")  # no rate limit now; still one soul at most
    r = c.post("/v1/souls/two/turns", json={"text": "A second soul."})
    assert r.status_code == 429 and r.json()["error"]["type"] == "QuotaExceeded", r.text
    assert "souls" in r.json()["error"]["message"] and int(r.headers["retry-after"]) >= 1
    assert not (data / "souls" / "quota:two").exists() and c.get("/v1/souls").json() == {"souls": ["one"]}
    assert c.post("/v1/souls/one/turns", json={"text": "It moved to 7 am."}).status_code == 200
    deadline = time.monotonic() + 30
    while True:  # the hosts and the replica write their counts every second or so
        u = c.get("/v1/usage").json()
        if (u["turns"] >= 2 and u["throttled"] >= 1) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert u["souls"] == 1 and u["stored_bytes"] > 0 and u["turns"] == 2 and u["throttled"] >= 1, u
    assert u["limits"] == {"souls": 1}
    rows = json.loads(_soul(env, "tenants", "usage", "quota", "--json").stdout)
    assert rows[0]["tenant"] == "quota" and rows[0]["souls"] == 1 and rows[0]["turns"] == 2


@pytest.mark.parametrize("kind", ["httpx", "aiohttp"])
def test_the_serve_benchmarks_callers_send_turns_and_fail_on_an_error(server: dict[str, Any], kind: str) -> None:
    from contextlib import AsyncExitStack

    from soul_apps.bench.serve import _caller, _levels

    async def go() -> dict[str, Any]:
        async with AsyncExitStack() as stack:
            good = [await _caller(stack, kind, server["url"], server["keys"]["acme"]) for _ in range(2)]
            bad = await _caller(stack, kind, server["url"], "not-a-key")
            with pytest.raises(RuntimeError, match="HTTP 401"):
                await bad("POST", f"/v1/souls/bench-{kind}/turns", {"text": "hello"})

            async def turn(i: int, k: int) -> None:
                await good[i]("POST", f"/v1/souls/bench-{kind}-{i}/turns", {"text": f"Note {k}: the build is green."})
            return (await _levels(2, 2, {"http": turn}))["http"]

    res = asyncio.run(go())
    assert res["turns"] == 4 and res["turns_per_s"] > 0
    with _client(server, "acme") as c:
        for i in range(2):  # a warm-up turn and two counted ones each
            assert [t["seq"] for t in c.get(f"/v1/souls/bench-{kind}-{i}/traces").json()["traces"]] == [1, 2, 3]


def test_one_service_per_runtime(server: dict[str, Any]) -> None:
    busy = _soul(server["env"], "serve", "--port", server["url"].rsplit(":", 1)[1], check=False)
    assert busy.returncode == 2 and "in use" in busy.stderr
    again = _soul(server["env"], "serve", "--port", str(_free_port()), check=False)
    assert again.returncode == 2 and "serves the HTTP API already" in again.stderr, again.stderr
    assert _client(server).get("/healthz").status_code == 200  # the running service is untouched


def _restart(srv: dict[str, Any]) -> float:
    """Stop the running ``soul serve`` (SIGTERM, as an operator does) and start it again on the same port and data
    dir; returns the seconds until the new one answered /healthz 200."""
    t0 = time.monotonic()
    srv["proc"].send_signal(signal.SIGTERM)
    assert srv["proc"].wait(120) == 0
    srv["log"].close()
    srv["log"] = open(srv["base"] / "serve.log", "a")  # noqa: SIM115 - closed by the next restart or the teardown
    srv["proc"] = subprocess.Popen([SOUL, "serve", "--port", str(srv["port"])], env=srv["env"], stdout=srv["log"],
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    wait_healthy(srv["proc"], srv["url"], srv["base"] / "serve.log")
    return time.monotonic() - t0


def _replica_pids(data: Path) -> list[int]:
    """The pids of this service's Serve replicas: Ray workers named for the deployment whose environment names this
    data dir (other services on the machine have their own)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"ServeReplica:soul-runtime" not in cmd:
                continue
            if f"SOUL_DATA_DIR={data}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found.append(int(pid))
        except OSError:
            pass
    return found


@pytest.mark.slow
def test_restarts_and_killed_replicas_fail_no_turn(server: dict[str, Any]) -> None:
    """12 clients of two tenants (the Python client over HTTP, one soul each) send turns with their own idempotency
    keys while ``soul serve`` is restarted three times and a Serve replica is SIGKILLed three times: no turn fails
    after the client's retries, and each acknowledged turn is in its soul's traces and episodes exactly once."""
    import threading

    import soul_runtime
    run = uuid.uuid4().hex[:6]
    stop = threading.Event()
    acked: dict[str, list[tuple[str, int, str]]] = {}
    failures: list[str] = []

    def client(n: int) -> None:
        tenant = TENANTS[n % 2]
        sid = f"soak-{run}-{n}"
        rt = soul_runtime.connect(server["url"], api_key=server["keys"][tenant], retry_for_s=240)
        mine = acked.setdefault(f"{tenant}/{sid}", [])
        i = 0
        try:
            while not stop.is_set() or i < 2:
                key = f"{sid}-k{i}"
                try:
                    res = rt.soul(sid).turn(f"Note {i}: build zq{run}x{n}x{i} passed.", request_id=key)
                    mine.append((key, res.seq, res.reply))
                except Exception as e:  # noqa: BLE001 - counted: the floor is none
                    failures.append(f"{sid} turn {i}: {type(e).__name__}: {e}")
                i += 1
        finally:
            rt.close()

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(12)]
    for t in threads:
        t.start()

    def progressed(by: int) -> None:
        goal = sum(len(v) for v in acked.values()) + by
        t0 = time.monotonic()
        while sum(len(v) for v in acked.values()) < goal:
            assert time.monotonic() - t0 < 300 and not failures, failures[:3]
            time.sleep(0.2)

    seen: dict[str, int] = {}  # what a plain HTTP client gets from /healthz and a turn route meanwhile

    def probe() -> None:
        with httpx.Client(base_url=server["url"], timeout=10) as h:
            while not stop.is_set():
                for path in ("/healthz", f"/v1/souls/probe-{run}/traces"):
                    try:
                        r = h.get(path, headers={"Authorization": f"Bearer {server['keys']['acme']}"})
                        ctype = r.headers.get("content-type", "").split(";")[0]
                        kind = f"{r.status_code} {'json' if ctype == 'application/json' else ctype or 'no body'}"
                        if r.status_code == 503:
                            kind += " Retry-After" if r.headers.get("Retry-After") else " no Retry-After"
                    except httpx.TransportError as e:
                        kind = type(e).__name__
                    seen[kind] = seen.get(kind, 0) + 1
                time.sleep(0.1)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    restarts, kills = [], 0
    for _ in range(3):
        progressed(12)
        pids = _replica_pids(server["data"])
        assert pids, "no replica of this service found"
        os.kill(pids[0], signal.SIGKILL)
        kills += 1
        progressed(12)
        restarts.append(round(_restart(server), 1))
    stop.set()
    for t in threads:
        t.join(300)
    prober.join(30)
    assert not failures, failures[:5]
    assert kills == 3 and len(restarts) == 3
    print(f"a plain client's answers during the soak: {dict(sorted(seen.items()))}")
    assert all(k.split()[0] in ("200", "404", "500", "503") for k in seen if k[0].isdigit()), seen
    c = {t: _client(server, t) for t in TENANTS}
    in_episodes = 0
    for name, got in acked.items():
        tenant, sid = name.split("/")
        traces = c[tenant].get(f"/v1/souls/{sid}/traces", params={"last": 500}).json()["traces"]
        keys = [t["request_id"] for t in traces]
        assert sorted(keys) == sorted(k for k, _, _ in got), (sid, len(keys), len(got))  # none lost, none doubled
        by_key = {t["request_id"]: t for t in traces}
        assert all(by_key[k]["seq"] == seq and by_key[k]["reply"] == reply for k, seq, reply in got)
        episodes = c[tenant].get(f"/v1/souls/{sid}/episodes").json()["episodes"]
        n = sid.rsplit("-", 1)[1]
        for i in range(len(got)):  # the episode a turn wrote holds its text as what the user said (a later one
            said = f"Note {i}: build zq{run}x{n}x{i} passed."  # may quote it in the model's question)
            own = [e for e in episodes if e["summary"].startswith(said) or f"user said: {said}" in e["summary"]]
            assert len(own) <= 1, (sid, i, own)
            in_episodes += len(own)
    print(f"restart soak: {sum(len(v) for v in acked.values())} turns acknowledged, 0 failed, each once in traces, "
          f"{in_episodes} with an episode of their own (none twice); restarts took {restarts} s to a healthy "
          f"service; {kills} replicas SIGKILLed (2 cores shared with other work)")


@pytest.mark.stops_shared_service
def test_stopped_mid_request_loses_no_acknowledged_turn(server: dict[str, Any]) -> None:
    """Runs last of the tests that share the service: SIGTERM while turns are in flight; every turn answered 200 is in the soul's record."""
    key = server["keys"]["acme"]
    run = uuid.uuid4().hex[:6]
    souls = [f"stop-{run}-{i}" for i in range(6)]
    acked: list[dict[str, Any]] = []
    failed: list[str] = []

    async def client(sid: str, n: int) -> None:
        async with httpx.AsyncClient(base_url=server["url"], headers={"Authorization": f"Bearer {key}"},
                                     timeout=120) as c:
            for i in range(n):
                try:
                    r = await c.post(f"/v1/souls/{sid}/turns", json={"text": f"Note {i}: the build {run}-{i} passed."})
                except httpx.HTTPError as e:
                    failed.append(type(e).__name__)
                    return
                if r.status_code == 200:
                    acked.append({"soul": sid, **r.json()})
                else:
                    failed.append(str(r.status_code))

    async def main() -> None:
        tasks = [asyncio.create_task(client(s, 40)) for s in souls]
        while len(acked) < 12:
            await asyncio.sleep(0.02)
        server["proc"].send_signal(signal.SIGTERM)
        await asyncio.gather(*tasks)

    asyncio.run(main())
    assert server["proc"].wait(120) == 0
    assert len(acked) >= 12 and failed, (len(acked), failed)  # stopped with turns still to send
    # a normal start and stop print nothing that reads as a problem
    # the starts of the shared service (the restart soak starts it again, and kills replicas while it runs), then
    # this stop: from the line that says it drains
    log = (Path(server["base"]) / "serve.log").read_text()
    started = log.rpartition("Ctrl-C stops")[0]
    stopped = log[log.rindex("Draining requests in flight"):]
    assert "Connecting to existing Serve app" not in started, started
    assert "stopped (SIGTERM)" in stopped and not re.search(r"failed|died|[Ee]rror", stopped), stopped
    for sid in souls:
        p = _soul(server["env"], "trace", f"acme:{sid}", "--last", "500", "--json", check=False)
        stored = {t["turn_id"]: t for t in json.loads(p.stdout)} if p.returncode == 0 else {}
        for a in (a for a in acked if a["soul"] == sid):
            t = stored.get(f"acme:{a['turn_id']}")
            assert t is not None and t["reply"] == a["reply"], (a, sorted(stored))
