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


async def turns_in_process(data_dir: Path, texts: tuple[str, ...] = TURNS) -> list[Any]:
    """``texts`` as turns of one soul through the client's async handle, a soul host and the three store shards,
    all plain objects of this process (the calls go through the direct transport instead of Ray)."""
    conf = {"data_dir": str(data_dir), "model": "offline", "embedder": "fast", "hosts": 1, "episodic_shards": 1,
            "semantic_shards": 1, "procedural_shards": 1, "host_capacity": 10, "idle_check_s": 0}
    shards = {store_name(layer, 0): LayerShard(layer, str(data_dir), asdict(MemoryConfig()), 8, "fast", 0, 1, 0.0)
              for layer in ("episodic", "semantic", "procedural")}
    host = SoulHost("soul-host-0", conf, model=OfflineModel())
    host.calls = ShardCalls(host.stores, transport=DirectTransport(shards))
    router = Router(["soul-host-0"], "souls", transport=DirectTransport({"soul-host-0": host}))
    handle = AsyncSoulHandle(types.SimpleNamespace(router=router), "maya")  # type: ignore[arg-type]
    out = [await handle.turn(t, at=T0 + 60 * i) for i, t in enumerate(texts)]
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
