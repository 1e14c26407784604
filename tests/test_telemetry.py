"""OpenTelemetry traces (soul_runtime.telemetry): a turn's spans from the caller through its host to the store shards,
under one trace id.

In-process (no Ray): the client's handle, a real soul host and real store shards of this process, wired by the
direct transport, traced with the SDK's in-memory exporter. Across processes: a real ``soul serve`` (Ray Serve on
the data dir's local runtime) with the OTEL_* variables set, exporting to a small OTLP/HTTP collector of the test's
(stdlib http.server on 127.0.0.1, the protobuf requests decoded with opentelemetry-proto): an HTTP turn with a
``traceparent`` and a ``soul turn`` over Ray. Without the variables, or without the package, nothing of
opentelemetry is imported.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import types
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from actors import raycalls
from actors.layer_shard import LayerShard
from actors.placement import store_name
from actors.routing import Router
from actors.runtime import AsyncSoulHandle
from actors.shard_client import ShardCalls
from actors.soul_host import SoulHost
from actors.transport import DirectTransport
from soul_runtime import telemetry
from soul_runtime.config import MemoryConfig
from soul_runtime.models.offline import OfflineModel

REPO = Path(__file__).resolve().parents[1]
T0 = 1_780_000_000
TURNS = ("Maya ships the Orca release on Friday; her manager is Lee.", "When does Maya ship the Orca release?")


async def turns_in_process(data_dir: Path, texts: tuple[str, ...] = TURNS, wait_writes: bool = True) -> list[Any]:
    """``texts`` as turns of one soul through the client's async handle, a soul host and the three store shards,
    all plain objects of this process (the calls go through the direct transport instead of Ray)."""
    conf = {"data_dir": str(data_dir), "model": "offline", "embedder": "fast", "hosts": 1, "episodic_shards": 1,
            "semantic_shards": 1, "procedural_shards": 1, "host_capacity": 10, "idle_check_s": 0}
    shards = {store_name(layer, 0): LayerShard(layer, str(data_dir), asdict(MemoryConfig()), 8, "fast", 0, 1, 0.0)
              for layer in ("episodic", "semantic", "procedural")}
    host = SoulHost("soul-host-0", conf, model=OfflineModel())
    host.calls = ShardCalls(host.stores, transport=DirectTransport(shards))
    router = Router(["soul-host-0"], "souls", transport=DirectTransport({"soul-host-0": host}))
    handle = AsyncSoulHandle(types.SimpleNamespace(router=router, quotas=None), "maya")  # type: ignore[arg-type]
    out = [await handle.turn(t, at=T0 + 60 * i, wait_writes=wait_writes) for i, t in enumerate(texts)]
    await host.stop()
    for s in shards.values():
        s.stop()
    return out


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The SDK's in-memory exporter as this process's trace destination (put back afterwards)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    monkeypatch.setattr(raycalls, "get_actor", lambda name, namespace: name)  # a handle is its actor's name
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.use_provider(provider)
    try:
        yield exporter
    finally:
        telemetry.use_provider(None)


def by_id(finished: Any) -> dict[int, Any]:
    return {s.context.span_id: s for s in finished}


def children(finished: Any, parent: Any) -> list[Any]:
    return [s for s in finished if s.parent is not None and s.parent.span_id == parent.context.span_id]


def test_a_turn_is_a_span_with_its_stages_and_shard_calls_under_the_callers_trace(spans: Any, tmp_path: Path
                                                                                   ) -> None:
    from opentelemetry.trace import SpanKind

    tracer = telemetry.tracer()
    assert tracer is not None

    async def traced() -> list[Any]:
        with tracer.start_as_current_span("request"):
            return await turns_in_process(tmp_path)
    results = asyncio.run(traced())
    finished = spans.get_finished_spans()
    request = next(s for s in finished if s.name == "request")
    assert {s.context.trace_id for s in finished} == {request.context.trace_id}  # one trace, every process's part
    clients = children(finished, request)
    assert [s.name for s in clients] == ["soul turn", "soul turn"] and all(s.kind is SpanKind.CLIENT for s in clients)
    for client, result in zip(clients, results, strict=True):
        (turn,) = children(finished, client)
        assert turn.name == "soul.turn" and turn.kind is SpanKind.SERVER
        a = turn.attributes
        assert a["soul.id"] == "maya" and a["soul.turn_id"] == result.turn_id and a["soul.seq"] == result.seq
        assert a["soul.tenant"] == ""  # a soul of no tenant (the service's are "TENANT:id")
        assert a["soul.model"] == result.model and a["soul.tokens.total"] > 0 and a["soul.usage.calls"] >= 1
        assert a["gen_ai.request.model"] == OfflineModel.model_id
        stages = sorted(children(finished, turn), key=lambda s: s.start_time)
        names = [s.name for s in stages]
        assert names[:4] == ["buffer_read", "recall", "assemble", "inference"], names
        assert set(names[4:]) == {"decide", "write", "commit"} and names[-1] == "commit", names
        assert all(turn.start_time <= s.start_time <= s.end_time <= turn.end_time for s in stages)
        inference = stages[3]
        assert inference.attributes["gen_ai.request.model"] == OfflineModel.model_id
        assert inference.attributes["gen_ai.usage.output_tokens"] >= 0
        assert stages[0].end_time <= stages[1].start_time and stages[2].end_time <= stages[3].start_time
        write = next(s for s in stages if s.name == "write")
        wrote = children(finished, write)
        assert wrote and all(s.kind is SpanKind.CLIENT and s.name.startswith("write ") for s in wrote)
        for call in wrote:  # the shard's own span of the item, under the host's call
            (served,) = children(finished, call)
            assert served.kind is SpanKind.SERVER and served.name == f"store {call.name}"
            assert served.attributes["soul.shard"] == call.attributes["soul.shard"]
    # the first turn found no layer file to read; the second asked the layers the first one wrote
    recall_1, recall_2 = (next(s for s in children(finished, next(iter(children(finished, c)))) if s.name == "recall")
                          for c in clients)
    assert children(finished, recall_1) == []
    asked = children(finished, recall_2)
    assert {s.name for s in asked} >= {"recall episodic"}
    assert all(len(children(finished, s)) == 1 for s in asked)


def test_a_turn_answered_before_its_writes_has_its_memory_works_spans_under_it(spans: Any, tmp_path: Path) -> None:
    """``wait_writes=False``: the turn's span ends at the reply; its decision, writes and commit (while the next
    turn waits for them) are still its children, the trace's totals on its commit."""
    results = asyncio.run(turns_in_process(tmp_path, wait_writes=False))
    assert all(r.writes_pending for r in results)
    finished = spans.get_finished_spans()
    turns = sorted((s for s in finished if s.name == "soul.turn"), key=lambda s: s.start_time)
    assert [t.attributes["soul.turn_id"] for t in turns] == [r.turn_id for r in results]
    for turn in turns:
        assert turn.attributes["soul.writes_pending"] is True
        kids = {s.name: s for s in children(finished, turn)}
        assert {"buffer_read", "recall", "assemble", "inference", "decide", "write", "commit"} <= set(kids)
        assert kids["commit"].end_time >= turn.end_time >= kids["inference"].end_time
        assert kids["commit"].attributes["soul.turn_id"] == turn.attributes["soul.turn_id"]
        assert kids["commit"].attributes["soul.usage.calls"] == 2  # the reply and the memory decision


def test_a_hosts_open_calls_are_forgotten_once_answered_and_committed_in_either_order(spans: Any) -> None:
    """The host's book of traced calls (actors.turn_spans.Calls): a call's commit finds its spans whether it comes
    before or after the answer, a request asked for again while in progress leaves the commit to the first call,
    and nothing stays once a call has answered and committed."""
    from actors.turn_spans import Calls
    from soul_runtime.loop.trace import TurnTrace
    calls, committed = Calls(), []
    hook = calls.hook(committed.append)

    def trace(rid: str, seq: int) -> TurnTrace:
        return TurnTrace(turn_id=f"maya/{seq}", seq=seq, soul_id="maya", kind="turn", at=T0, query="q",
                         request_id=rid, usage={"calls": 2, "by_model": {"m-1": {"calls": 2}}})

    def result(seq: int, pending: bool) -> Any:
        return types.SimpleNamespace(turn_id=f"maya/{seq}", seq=seq, model="m-1", writes_pending=pending)
    first = calls.begin("turn", "maya", "r1", None)
    again = calls.begin("turn", "maya", "r1", None)  # the same request asked for again (a batch's straggler)
    hook(trace("r1", 1))
    calls.end(again, result(1, True))
    assert calls.open == {("maya", "r1"): first}  # the first call's, answered and committed: not yet answered
    calls.end(first, result(1, True))
    assert calls.open == {}
    late = calls.begin("turn", "maya", "r2", None)  # answered before its writes, committed after
    calls.end(late, result(2, True))
    assert calls.open == {("maya", "r2"): late}
    hook(trace("r2", 2))
    assert calls.open == {} and [t.seq for t in committed] == [1, 2]
    commits = [s for s in spans.get_finished_spans() if s.name == "commit"]
    assert [s.attributes["soul.turn_id"] for s in commits] == ["maya/1", "maya/2"]
    assert all(s.attributes["gen_ai.request.model"] == "m-1" for s in commits)


def test_an_http_request_is_a_span_under_its_traceparent_current_while_the_route_runs(spans: Any) -> None:
    """The service's own request spans (FastAPI versions without ``fastapi.telemetry``; the installed one's native
    spans are off here: no global tracer provider is set in this process)."""
    import secrets

    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from opentelemetry.trace import SpanKind, StatusCode

    from soul_apps.service.request_spans import RequestSpans
    app = FastAPI()
    seen: list[dict[str, str] | None] = []

    @app.get("/v1/souls/{soul_id}")
    async def read(soul_id: str) -> dict[str, str]:
        seen.append(telemetry.carrier())  # what a runtime call made here would carry to the host
        if soul_id == "broken":
            raise RuntimeError("boom")
        return {"soul": soul_id}
    app.add_middleware(RequestSpans)
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    with TestClient(app, raise_server_exceptions=False) as c:
        assert c.get("/v1/souls/maya", headers={"traceparent": f"00-{trace_id}-{parent}-01"}).status_code == 200
        assert c.get("/v1/souls/broken").status_code == 500
    ok, failed = spans.get_finished_spans()
    assert ok.name == "GET /v1/souls/{soul_id}" and ok.kind is SpanKind.SERVER
    assert f"{ok.context.trace_id:032x}" == trace_id and f"{ok.parent.span_id:016x}" == parent
    assert ok.attributes["http.route"] == "/v1/souls/{soul_id}" and ok.attributes["http.response.status_code"] == 200
    assert seen[0] is not None and seen[0]["traceparent"].split("-")[2] == f"{ok.context.span_id:016x}"
    assert failed.parent is None and f"{failed.context.trace_id:032x}" != trace_id  # no traceparent: a new trace
    assert failed.status.status_code is StatusCode.ERROR


def test_the_otel_variables_travel_to_the_actors_with_the_model_settings() -> None:
    from soul_runtime.plugins import settings_env
    env = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
           "OTEL_SERVICE_NAME": "souls", "HOME": "/h", "SOUL_MODEL": "offline"}
    assert settings_env(env) == {k: v for k, v in env.items() if k != "HOME"}


def test_the_variables_decide_whether_traces_are_wanted() -> None:
    assert not telemetry.wanted({}) and not telemetry.wanted({"OTEL_TRACES_EXPORTER": "none"})
    assert telemetry.wanted({"OTEL_TRACES_EXPORTER": "otlp"}) and telemetry.wanted({"OTEL_TRACES_EXPORTER": "none,console"})
    assert telemetry._exporter_names({"OTEL_TRACES_EXPORTER": "otlp,console"}) == ["otlp_proto_http", "console"]
    assert telemetry._exporter_names({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) == \
        ["otlp_proto_grpc"]


NO_OTEL = textwrap.dedent("""
    import asyncio, sys, tempfile
    from pathlib import Path
    if sys.argv[1] == "blocked":  # the package is not installed, as far as this process can tell
        class Blocker:
            def find_spec(self, name, path=None, target=None):
                if name == "opentelemetry" or name.startswith("opentelemetry."):
                    raise ImportError(f"{name} is not installed")
                return None
        sys.meta_path.insert(0, Blocker())
    from actors import raycalls
    raycalls.get_actor = lambda name, namespace: name
    from tests.test_telemetry import turns_in_process
    out = asyncio.run(turns_in_process(Path(tempfile.mkdtemp())))
    assert [r.seq for r in out] == [1, 2], out
    assert out[0].writes, out[0]
    loaded = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
    print("loaded:", loaded)
    assert not loaded, loaded
""")


@pytest.mark.parametrize("case", ["unset", "blocked"])
def test_without_the_variables_or_the_package_nothing_of_opentelemetry_is_imported(case: str) -> None:
    """Turns through the client's handle, a host and the shards: with OTEL_TRACES_EXPORTER unset (the package is
    installed here), or set with the package made unimportable, they run as ever and opentelemetry is never
    imported."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    if case == "blocked":
        env.update(OTEL_TRACES_EXPORTER="otlp", OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9")
    p = subprocess.run([sys.executable, "-c", NO_OTEL, case], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "loaded: []" in p.stdout
    if case == "blocked":
        assert "OpenTelemetry SDK is not installed" in p.stderr


# ---- across processes: a real `soul serve` exporting to a collector of the test's ------------------------------

class Collector:
    """An OTLP/HTTP trace receiver on 127.0.0.1 (what a platform's collector is to the runtime): every span of every
    export request, decoded from its protobuf, with its resource's ``service.name`` and ``process.pid``."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )
        self.spans: list[tuple[str, int, Any]] = []
        self.paths: set[str] = set()
        lock = threading.Lock()
        me = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 — http.server's name
                import gzip
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                req = ExportTraceServiceRequest()
                req.ParseFromString(body)
                got = []
                for rs in req.resource_spans:
                    res = {a.key: a.value for a in rs.resource.attributes}
                    service = res["service.name"].string_value if "service.name" in res else ""
                    pid = res["process.pid"].int_value if "process.pid" in res else 0
                    got += [(service, pid, s) for ss in rs.scope_spans for s in ss.spans]
                with lock:
                    me.spans += got
                    me.paths.add(self.path)
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, name="otlp-collector", daemon=True).start()

    def trace(self, trace_id: bytes) -> list[tuple[str, int, Any]]:
        return [x for x in list(self.spans) if x[2].trace_id == trace_id]

    def wait(self, ready: Any, what: str, limit_s: float = 120) -> None:
        """Until ``ready()`` holds (the processes export every 0.2 s: OTEL_BSP_SCHEDULE_DELAY), at most
        ``limit_s``: a liveness bound, not a measure."""
        import time
        t0 = time.monotonic()
        while not ready():
            assert time.monotonic() - t0 < limit_s, (what, sorted({s.name for _, _, s in self.spans}))
            time.sleep(0.2)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def traced_server() -> Any:
    """A `soul serve` (and its local runtime) started with the OTEL_* variables pointing at a :class:`Collector`."""
    import json
    import shutil
    import tempfile

    from tests.fakes import stop_serve, wait_healthy
    from tests.test_service import _env, _free_port, _soul

    collector = Collector()
    base = Path(tempfile.mkdtemp(prefix="ot", dir="/tmp"))
    env = _env(SOUL_DATA_DIR=str(base / "data"), OTEL_TRACES_EXPORTER="otlp", OTEL_SERVICE_NAME="soul-test",
               OTEL_EXPORTER_OTLP_ENDPOINT=collector.url, OTEL_BSP_SCHEDULE_DELAY="200")
    env = {k: v for k, v in env.items() if not k.startswith("OTEL_") or k in (
        "OTEL_TRACES_EXPORTER", "OTEL_SERVICE_NAME", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_BSP_SCHEDULE_DELAY")}
    key = json.loads(_soul(env, "tenants", "add", "acme", "--json").stdout)["key"]
    port = _free_port()
    log = open(base / "serve.log", "w")  # noqa: SIM115 - closed at teardown
    soul = shutil.which("soul")
    assert soul
    proc = subprocess.Popen([soul, "serve", "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, base / "serve.log")
        yield {"url": url, "key": key, "env": env, "collector": collector}
    finally:
        stop_serve(proc, log, lambda: _soul(env, "down", check=False))
        collector.close()
        shutil.rmtree(base, ignore_errors=True)


SERVER, CLIENT = 2, 3  # the protobuf's SpanKind values


def attrs(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in span.attributes:
        v = a.value
        out[a.key] = getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None
    return out


def tree(spans: list[tuple[str, int, Any]]) -> tuple[dict[bytes, Any], dict[bytes, list[Any]]]:
    """Spans by id, and the children of each span id."""
    by: dict[bytes, Any] = {s.span_id: s for _, _, s in spans}
    kids: dict[bytes, list[Any]] = {}
    for _, _, s in spans:
        kids.setdefault(s.parent_span_id, []).append(s)
    return by, kids


def check_turn(spans: list[tuple[str, int, Any]], client: Any) -> set[int]:
    """Under ``client`` (the caller's ``soul turn`` span): the host's turn span with its stages, the shard calls
    under recall and write, and each shard's own span under its call. Returns the pids the spans came from."""
    by, kids = tree(spans)
    pid = {s.span_id: p for _, p, s in spans}
    (turn,) = kids[client.span_id]
    assert turn.name == "soul.turn" and turn.kind == SERVER
    a = attrs(turn)
    assert a["soul.turn_id"].endswith("/2") and a["soul.tokens.total"] > 0 and a["gen_ai.request.model"]
    stages = {s.name: s for s in kids[turn.span_id]}
    assert set(stages) == {"buffer_read", "recall", "assemble", "inference", "decide", "write", "commit"}, stages
    shard_calls = kids.get(stages["recall"].span_id, []) + kids.get(stages["write"].span_id, [])
    assert {s.name.split()[0] for s in shard_calls} == {"recall", "write"}, [s.name for s in shard_calls]
    for call in shard_calls:
        assert call.kind == CLIENT
        (served,) = kids[call.span_id]
        assert served.kind == SERVER and served.name == f"store {call.name}"
        assert pid[served.span_id] != pid[turn.span_id]  # a store shard's process
    return {pid[client.span_id], pid[turn.span_id]} | {pid[s.span_id] for c in shard_calls for s in kids[c.span_id]}


@pytest.mark.ray
def test_an_http_turn_with_a_traceparent_is_one_trace_from_the_request_to_the_store_shards(
        traced_server: dict[str, Any]) -> None:
    import secrets

    import httpx
    col: Collector = traced_server["collector"]
    headers = {"Authorization": f"Bearer {traced_server['key']}"}
    with httpx.Client(base_url=traced_server["url"], headers=headers, timeout=120) as c:
        r = c.post("/v1/souls/maya/turns", json={"text": TURNS[0], "at": T0})  # no traceparent: a trace of its own
        assert r.status_code == 200, r.text
        trace_id, parent = secrets.token_bytes(16), secrets.token_bytes(8)
        r = c.post("/v1/souls/maya/turns", json={"text": TURNS[1], "at": T0 + 60},
                   headers={"traceparent": f"00-{trace_id.hex()}-{parent.hex()}-01"})
        assert r.status_code == 200, r.text

    def complete() -> bool:
        names = {s.name for _, _, s in col.trace(trace_id)}
        return {"POST /v1/souls/{soul_id}/turns", "soul turn", "soul.turn", "commit",
                "store recall episodic", "store write episodic"} <= names
    col.wait(complete, "the traced turn's spans")
    spans = col.trace(trace_id)
    assert col.paths == {"/v1/traces"} and {svc for svc, _, _ in spans} == {"soul-test"}
    by, kids = tree(spans)
    (request,) = kids[parent]  # the HTTP request's span is the traceparent's child
    assert request.name == "POST /v1/souls/{soul_id}/turns" and request.kind == SERVER
    a = attrs(request)
    assert a["http.response.status_code"] == 200 and a["http.route"] == "/v1/souls/{soul_id}/turns"
    (client,) = [s for _, _, s in spans if s.name == "soul turn"]
    assert client.kind == CLIENT
    up = client  # the runtime call is made within the request (under FastAPI's spans of the route's operations)
    while up.parent_span_id != parent:
        up = by[up.parent_span_id]
    assert up is request
    pids = check_turn(spans, client)
    assert len(pids) >= 3  # the service's replica, the soul's host and the store shards: one trace
    assert attrs(kids[client.span_id][0])["soul.turn_id"].endswith(r.json()["turn_id"])  # the tenant's soul
    assert attrs(kids[client.span_id][0])["soul.tenant"] == "acme"


@pytest.mark.ray
def test_a_turn_over_ray_from_a_client_process_is_one_trace_to_the_store_shards(traced_server: dict[str, Any]
                                                                                ) -> None:
    """`soul turn` (a driver on the local runtime, the variables set): its own ``soul turn`` span roots the trace
    of the host's turn and the shard calls."""
    from tests.test_service import _soul
    col: Collector = traced_server["collector"]
    env = traced_server["env"]
    for i, text in enumerate(TURNS):
        _soul(env, "turn", "lee", text, "--at", str(T0 + 60 * i))

    def roots() -> list[Any]:
        return [s for _, _, s in list(col.spans) if s.name == "soul turn" and not s.parent_span_id
                and attrs(s).get("soul.id") == "lee"]

    def complete() -> bool:
        found = roots()
        if len(found) < 2:
            return False
        names = {s.name for _, _, s in col.trace(found[-1].trace_id)}
        return {"soul.turn", "commit", "store recall episodic", "store write episodic"} <= names
    col.wait(complete, "the CLI turns' spans")
    second = max(roots(), key=lambda s: s.start_time_unix_nano)
    pids = check_turn(col.trace(second.trace_id), second)
    assert len(pids) >= 3  # the CLI, the soul's host and the store shards


def test_the_variables_alone_set_up_the_process_and_name_its_exporters() -> None:
    """``OTEL_TRACES_EXPORTER=console`` (an exporter found by its entry point), nothing else done by the program:
    the turns' spans come out of this process with its service name, exported at exit."""
    import json
    script = textwrap.dedent("""
        import asyncio, tempfile
        from pathlib import Path
        from actors import raycalls
        raycalls.get_actor = lambda name, namespace: name
        from tests.test_telemetry import turns_in_process
        asyncio.run(turns_in_process(Path(tempfile.mkdtemp())))
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="souls-here")
    p = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    decoder, out, at = json.JSONDecoder(), [], p.stdout.find("{")
    while at >= 0:  # the console exporter prints one JSON object per span
        span, end = decoder.raw_decode(p.stdout, at)
        out.append(span)
        at = p.stdout.find("{", end)
    names = [x["name"] for x in out]
    assert names.count("soul.turn") == 2 and names.count("soul turn") == 2 and "store write episodic" in names
    assert {x["resource"]["attributes"]["service.name"] for x in out} == {"souls-here"}
    assert len({x["context"]["trace_id"] for x in out}) == 2  # each turn its own trace (no caller's span)

