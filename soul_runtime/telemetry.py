"""OpenTelemetry traces, when asked for: the standard variables (``OTEL_TRACES_EXPORTER``, ``OTEL_SERVICE_NAME``,
``OTEL_EXPORTER_OTLP_ENDPOINT`` …) and the SDK installed (``pip install 'soul-runtime[otel]'``).

With ``OTEL_TRACES_EXPORTER`` unset or ``none`` every function here is a no-op and nothing of ``opentelemetry`` is
imported; with it set and the SDK missing, one warning is logged and the same holds. Otherwise the process gets a
tracer: the application's own when it has set a global tracer provider, else a provider made here from the
variables (its resource from ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``, its sampler from
``OTEL_TRACES_SAMPLER``, one batching processor per exporter named in ``OTEL_TRACES_EXPORTER``: ``otlp`` is OTLP
over HTTP/protobuf, or gRPC when ``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL=grpc``; any other name is an exporter
registered in the entry-point group ``opentelemetry_traces_exporter``, such as ``console``).

A call's context travels between processes as a W3C carrier dict (``traceparent``, ``tracestate``): :func:`carrier`
writes the current one, :func:`context_of` reads one back. See docs/telemetry.md for the spans the runtime makes.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

EXPORTER_ENV = "OTEL_TRACES_EXPORTER"
CARRIER_KEY = "trace_context"
"""The key of a soul call's payload under which the caller's context (a W3C carrier) travels to the soul's host."""
SCOPE = "soul_runtime"
"""The instrumentation scope of every span the runtime makes."""
log = logging.getLogger("soul_runtime.telemetry")

_lock = threading.Lock()
_tracer: Any = None
_provider: Any = None
_decided = False


def wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Do the variables ask for traces (``OTEL_TRACES_EXPORTER`` names an exporter other than ``none``)?"""
    env = os.environ if environ is None else environ
    names = [n.strip().lower() for n in env.get(EXPORTER_ENV, "").split(",") if n.strip()]
    return any(n != "none" for n in names)


def tracer() -> Any | None:
    """This process's tracer, set up on first use; None when traces are off."""
    global _tracer, _decided
    if not _decided:
        with _lock:
            if not _decided:
                _tracer = _setup()
                _decided = True
    return _tracer


def use_provider(provider: Any | None) -> None:
    """Trace with ``provider`` (a ``TracerProvider``) in this process from now on, whatever the variables say (an
    application that keeps its provider apart from the global one; tests). None: decide again from the variables
    on next use."""
    global _tracer, _provider, _decided
    with _lock:
        _tracer = None if provider is None else provider.get_tracer(SCOPE)
        _provider = provider
        _decided = provider is not None


def _exporter_names(environ: Mapping[str, str]) -> list[str]:
    protocol = (environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf").strip().lower()
    otlp = "otlp_proto_grpc" if protocol == "grpc" else "otlp_proto_http"
    names = [n.strip().lower() for n in environ.get(EXPORTER_ENV, "").split(",") if n.strip()]
    return list(dict.fromkeys(otlp if n == "otlp" else n for n in names if n != "none"))


def _setup() -> Any | None:
    global _provider
    if not wanted():
        return None
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("%s is set but the OpenTelemetry SDK is not installed (pip install 'soul-runtime[otel]'): "
                    "no traces", EXPORTER_ENV)
        return None
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):  # the application has set none: ours
        from importlib.metadata import entry_points
        provider = TracerProvider(resource=Resource.create({"process.pid": os.getpid()}))  # + the variables'
        for name in _exporter_names(os.environ):
            found = list(entry_points(group="opentelemetry_traces_exporter", name=name))
            try:
                if not found:
                    raise LookupError("no package registers it (for otlp: pip install 'soul-runtime[otel]')")
                provider.add_span_processor(BatchSpanProcessor(found[0].load()()))
            except Exception as e:  # noqa: BLE001 — traces are an aid: the runtime runs without them
                log.warning("trace exporter %r could not be made: %s: %s", name, type(e).__name__, e)
        trace.set_tracer_provider(provider)
    _provider = trace.get_tracer_provider()
    return trace.get_tracer(SCOPE)


def flush(timeout_ms: int = 10_000) -> bool:
    """Export the spans this process still holds (a process about to stop, when it skips the exit handlers). True
    when there was nothing to do or all went."""
    if not _decided or _tracer is None:
        return True
    force = getattr(_provider, "force_flush", None)
    return bool(force(timeout_ms)) if force is not None else True


def carrier(ctx: Any = None) -> dict[str, str] | None:
    """A context (default: the current one) as a W3C carrier (``traceparent`` …), None when traces are off or it
    holds no span."""
    if tracer() is None:
        return None
    from opentelemetry import propagate
    out: dict[str, str] = {}
    propagate.inject(out, context=ctx)
    return out or None


def context_of(carried: Mapping[str, str] | None) -> Any | None:
    """The context a carrier holds (None: none, or traces off)."""
    if not carried or tracer() is None:
        return None
    from opentelemetry import propagate
    return propagate.extract(dict(carried))


def current() -> Any | None:
    """The current context (to parent spans made on another thread), None when traces are off."""
    if tracer() is None:
        return None
    from opentelemetry import context
    return context.get_current()


@contextmanager
def span(name: str, *, parent: Any = None, kind: str = "internal", attributes: Mapping[str, Any] | None = None,
         start_ns: int | None = None) -> Iterator[Any | None]:
    """A span made current for the block (``parent``: a context from :func:`context_of` / :func:`current`, else the
    current one), ended with it; an error escaping the block is recorded on it. Yields the span, or None when
    traces are off."""
    t = tracer()
    if t is None:
        yield None
        return
    with t.start_as_current_span(name, context=parent, kind=_kind(kind), attributes=dict(attributes or {}),
                                 start_time=start_ns) as s:
        yield s


def start(name: str, *, parent: Any = None, kind: str = "internal", attributes: Mapping[str, Any] | None = None,
          start_ns: int | None = None) -> Any | None:
    """A span started and not made current (end it with :func:`end`); None when traces are off."""
    t = tracer()
    if t is None:
        return None
    return t.start_span(name, context=parent, kind=_kind(kind), attributes=dict(attributes or {}),
                        start_time=start_ns)


def end(s: Any | None, *, error: BaseException | None = None, end_ns: int | None = None) -> None:
    """End a span of :func:`start` (None: nothing), recording ``error`` on it."""
    if s is None:
        return
    if error is not None:
        failed(s, error)
    s.end(end_time=end_ns)


def failed(s: Any | None, error: BaseException) -> None:
    """Record ``error`` on the span and mark it failed."""
    if s is None:
        return
    from opentelemetry.trace import Status, StatusCode
    s.record_exception(error)
    s.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"[:500]))


def context_with(s: Any) -> Any:
    """A context whose current span is ``s`` (to parent spans made later or elsewhere)."""
    from opentelemetry import trace
    return trace.set_span_in_context(s)


def _kind(kind: str) -> Any:
    from opentelemetry.trace import SpanKind
    return {"internal": SpanKind.INTERNAL, "server": SpanKind.SERVER, "client": SpanKind.CLIENT}[kind]
