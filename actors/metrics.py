"""Metrics through ``ray.util.metrics`` (exported by Ray's metrics agent / Prometheus).

Outside a Ray process the same calls are counted in memory only, so the logic
stays testable without Ray.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from soul_runtime.records import TurnTrace

from . import raycalls

LATENCY_S = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]


class Metrics:
    def __init__(self, ray_metrics: dict[str, Any] | None) -> None:
        self._m = ray_metrics
        self.local: Counter[str] = Counter()

    @classmethod
    def create(cls) -> Metrics:
        if not raycalls.metrics_available():
            return cls(None)
        try:
            return cls({
                "turns": raycalls.counter("soul_turns_total", "Turns and observes applied", ("kind",)),
                "turn_latency": raycalls.histogram("soul_turn_latency_seconds", "Turn latency", LATENCY_S, ("kind",)),
                "recall_latency": raycalls.histogram("soul_recall_latency_seconds", "Recall latency per layer",
                                                     LATENCY_S, ("layer",)),
                "writes": raycalls.counter("soul_memory_writes_total", "Memory writes by layer and op",
                                           ("layer", "op")),
                "activations": raycalls.counter("soul_activations_total", "Soul activations"),
                "passivations": raycalls.counter("soul_passivations_total", "Soul passivations by reason",
                                                 ("reason",)),
                "sweeps": raycalls.counter("soul_retention_sweeps_total", "Retention sweeps of a soul's layer",
                                           ("layer",)),
                "swept": raycalls.counter("soul_retention_deleted_total", "Memories deleted by retention",
                                          ("layer", "kind")),
                "model_calls": raycalls.counter("soul_model_calls_total", "Model calls by model id", ("model",)),
                "model_tokens": raycalls.counter("soul_model_tokens_total", "Model tokens by model id and kind "
                                                 "(input = uncached, cache_read, cache_write, output)",
                                                 ("model", "kind")),
                "tenant_turns": raycalls.counter("soul_tenant_turns_total", "Turns, observes and forgets applied, "
                                                 "by tenant", ("tenant",)),
                "tenant_tokens": raycalls.counter("soul_tenant_tokens_total", "Model tokens by tenant", ("tenant",)),
                "tenant_queued": raycalls.counter("soul_tenant_queued_seconds_total", "Seconds a tenant's work "
                                                  "waited for a host's threads or the model's slots", ("tenant",)),
                "tenant_throttled": raycalls.counter("soul_tenant_throttled_total", "Turns refused over a tenant's "
                                                     "limit (429)", ("tenant", "limit")),
            })
        except Exception:  # metrics must never break serving
            return cls(None)

    def _inc(self, name: str, tags: dict[str, str] | None = None) -> None:
        self.local[name + (":" + ",".join(tags.values()) if tags else "")] += 1
        if self._m is not None:
            self._m[name].inc(1.0, tags=tags)

    def turn(self, kind: str, seconds: float) -> None:
        self._inc("turns", {"kind": kind})
        if self._m is not None:
            self._m["turn_latency"].observe(seconds, tags={"kind": kind})

    def recall(self, layer: str, seconds: float) -> None:
        self.local[f"recalls:{layer}"] += 1
        if self._m is not None:
            self._m["recall_latency"].observe(seconds, tags={"layer": layer})

    def write(self, layer: str, op: str) -> None:
        self._inc("writes", {"layer": layer, "op": op})

    def model_usage(self, trace: TurnTrace) -> int:
        """Count a committed trace's model calls and tokens per model (a metric per model); returns its tokens."""
        by_model = (trace.usage or {}).get("by_model") or {}
        total = 0
        for model, u in by_model.items():
            if not isinstance(u, dict):
                continue
            calls = int(u.get("calls", 0))
            self.local[f"model_calls:{model}"] += calls
            for kind, key in (("input", "input_tokens"), ("output", "output_tokens"),
                              ("cache_read", "cache_read_tokens"), ("cache_write", "cache_write_tokens")):
                n = int(u.get(key, 0))
                total += n
                self.local[f"model_tokens:{model},{kind}"] += n
                if self._m is not None and n:
                    self._m["model_tokens"].inc(float(n), tags={"model": model, "kind": kind})
            if self._m is not None and calls:
                self._m["model_calls"].inc(float(calls), tags={"model": model})
        return total

    def tenant_turn(self, tenant: str, tokens: int) -> None:
        """A committed turn of ``tenant`` ("" for souls of no tenant) and its model tokens."""
        self._inc("tenant_turns", {"tenant": tenant})
        self.local[f"tenant_tokens:{tenant}"] += tokens
        if self._m is not None and tokens:
            self._m["tenant_tokens"].inc(float(tokens), tags={"tenant": tenant})

    def tenant_queued(self, tenant: str, seconds: float) -> None:
        self.local[f"tenant_queued_ms:{tenant}"] += int(seconds * 1000)
        if self._m is not None and seconds > 0:
            self._m["tenant_queued"].inc(float(seconds), tags={"tenant": tenant})

    def tenant_throttled(self, tenant: str, limit: str) -> None:
        self._inc("tenant_throttled", {"tenant": tenant, "limit": limit})

    def activation(self) -> None:
        self._inc("activations")

    def passivation(self, reason: str) -> None:
        """``reason``: idle (the timer), capacity (LRU over ``host_capacity``) or asked (a call)."""
        self.local["passivations"] += 1  # the total, beside the count per reason
        self._inc("passivations", {"reason": reason})

    def sweep(self, layer: str, deleted: Mapping[str, int]) -> None:
        self._inc("sweeps", {"layer": layer})
        for kind, n in deleted.items():
            if n and kind.endswith(("_deleted", "_purged")):
                self.local[f"swept:{layer},{kind}"] += n
                if self._m is not None:
                    self._m["swept"].inc(float(n), tags={"layer": layer, "kind": kind})
