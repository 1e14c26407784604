"""Turn traces' model usage: the reports a trace carries (:class:`~soul_runtime.records.TurnTrace`, re-exported
here, is the record of what was recalled — exactly as passed to the model —, decided, written, and how long it
took)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from soul_runtime.models.base import USAGE_KEYS, Usage, usage_count
from soul_runtime.records import TurnTrace as TurnTrace  # where the turn loop's callers found it


def _counts(u: Usage) -> list[Any]:
    """A usage's counts in the order of ``USAGE_KEYS``."""
    return [u.calls, u.input_tokens, u.output_tokens, u.cache_read_tokens, u.cache_write_tokens]


def _plain(counts: list[Any]) -> dict[str, int]:
    return dict(zip(USAGE_KEYS, map(int, counts), strict=True))


def usage_report(parts: Iterable[tuple[str, str, Usage]]) -> dict[str, Any]:
    """A trace's ``usage`` from ``(phase, model id, usage)`` of each model call (phase: reply | memory).

    The same as summing the :class:`Usage` of each group and taking ``to_dict()`` of the sums (a turn makes
    two of these reports, without the intermediate objects)."""
    total = [0] * 5
    phases: dict[str, list[Any]] = {"reply": [0] * 5, "memory": [0] * 5}
    models: dict[str, list[Any]] = {}
    for phase, model, u in parts:
        c = _counts(u)
        groups = (total, phases.setdefault(phase, [0] * 5)) + ((models.setdefault(model, [0] * 5),) if model else ())
        for g in groups:
            for i in range(5):
                g[i] = g[i] + c[i]
    return {**_plain(total), **{k: _plain(v) for k, v in phases.items()},
            "by_model": {k: _plain(v) for k, v in models.items()}}


_NONE: dict[str, Any] = {}


def _sum(a: Any, b: Any) -> dict[str, int]:
    """``(Usage.from_dict(a) + Usage.from_dict(b)).to_dict()``, a non-dict counting as no usage."""
    ga = (a if isinstance(a, dict) else _NONE).get
    gb = (b if isinstance(b, dict) else _NONE).get
    return {k: usage_count(ga(k, 0)) + usage_count(gb(k, 0)) for k in USAGE_KEYS}


def add_usage(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two usage reports summed (a soul's running total): totals, phases and models."""
    out: dict[str, Any] = _sum(a, b)
    for phase in ("reply", "memory"):
        out[phase] = _sum(a.get(phase), b.get(phase))
    ma, mb = a.get("by_model") or {}, b.get("by_model") or {}
    out["by_model"] = {m: _sum(ma.get(m), mb.get(m)) for m in sorted({*ma, *mb})}
    return out
