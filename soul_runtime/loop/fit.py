"""Fitting a model's extraction to what the stores accept, before any store sees it.

Whatever a model extracts (the offline model, Claude or a user's own), the write it leads to must not
be refused: the caller's messages were valid, so the caller must not get an error for them. One rule,
applied to every write request of a turn or an observed batch, with each change written to the trace
(``TurnTrace.mended``):

* **control characters** (what :func:`soul_runtime.text.check_text` refuses) become spaces;
* **text longer than its limit** (:data:`soul_runtime.text.WRITE_LIMITS`) is **clipped** at the last
  white space before the limit and ends in "…" — an episode summary or detail, a fact value, a task
  step, the key context;
* **a key or id longer than its limit, or empty where one is needed**, is **dropped** with what it
  names: an entity, a context source id, a fact (entity or attribute), a task (class), an empty step —
  a clipped key would name something else;
* **a value of the wrong type** (a user's model may send any) is dropped the same way.

The caller's own parts of a write (turn key, time, speaker, session, message ids) are not mended: they
were checked when the call came in, and a write that still breaks them is refused with ``InvalidInput``.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from soul_runtime.records import Extraction, FactCandidate, TaskReport, WriteRequest
from soul_runtime.text import WRITE_LIMITS

_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters at the last white space before it, ending in "…"
    (at ``limit - 1`` characters when there is no white space in its second half)."""
    if len(text) <= limit:
        return text
    head = text[: limit - 1]
    cut = max(head.rfind(" "), head.rfind("\n"), head.rfind("\t"))
    if cut >= limit // 2:
        head = head[:cut]
    return head.rstrip() + "…"


class _Notes:
    def __init__(self, where: str) -> None:
        self.where = where
        self.lines: list[str] = []

    def add(self, what: str) -> None:
        self.lines.append(f"{self.where}: {what}")


def _text(value: Any, what: str, notes: _Notes, *, limit_key: str | None = None, required: bool = False
          ) -> str | None:
    """The mended text of one field; None when it must be dropped."""
    if not isinstance(value, str):
        notes.add(f"{what} dropped (a {type(value).__name__}, not text)")
        return None
    if _SURROGATE.search(value):
        value = _SURROGATE.sub("\ufffd", value)
        notes.add(f"{what}: lone surrogates replaced")
    if _CONTROL.search(value):
        value = _CONTROL.sub(" ", value)
        notes.add(f"{what}: control characters replaced by spaces")
    if required and not value.strip():
        notes.add(f"{what} dropped (empty)")
        return None
    key = limit_key or what
    limit = WRITE_LIMITS[key]
    if len(value) > limit:
        if key in ("entity", "source id", "fact entity", "fact attribute", "task class"):
            notes.add(f"{what} dropped ({len(value)} characters, limit {limit})")
            return None
        notes.add(f"{what} clipped from {len(value)} to {limit} characters (store limit)")
        value = clip(value, limit)
    return value


def _keys(values: Any, what: str, limit_key: str, notes: _Notes) -> tuple[str, ...]:
    if not isinstance(values, (tuple, list)):
        notes.add(f"{what}s dropped (not a list)")
        return ()
    out = [_text(v, f"{what} {i + 1}", notes, limit_key=limit_key, required=True) for i, v in enumerate(values)]
    return tuple(v for v in out if v is not None)


def _fact(f: Any, i: int, notes: _Notes) -> FactCandidate | None:
    if not isinstance(f, FactCandidate):
        notes.add(f"fact {i} dropped (not a fact)")
        return None
    name = f"fact {i}"
    entity = _text(f.entity, f"{name} entity", notes, limit_key="fact entity")
    attribute = _text(f.attribute, f"{name} attribute", notes, limit_key="fact attribute")
    value = _text(f.value, f"{name} value", notes, limit_key="fact value")
    if entity is None or attribute is None or value is None or not isinstance(f.kind, str):
        if entity is not None and attribute is not None and value is not None:
            notes.add(f"{name} dropped (its kind is not text)")
        else:
            notes.add(f"{name} dropped with it")
        return None
    display = [_text(d, f"{name} display name", notes, limit_key="fact entity") or ""
               for d in (f.display_entity, f.display_attribute)]
    sources = _keys(f.sources, f"{name} source id", "source id", notes)
    return replace(f, entity=entity, attribute=attribute, value=value, sources=sources, display_entity=display[0],
                   display_attribute=display[1])


def _task(t: Any, notes: _Notes) -> TaskReport | None:
    if t is None:
        return None
    if not isinstance(t, TaskReport):
        notes.add("task dropped (not a task report)")
        return None
    task_class = _text(t.task_class, "task class", notes)
    if task_class is None:
        notes.add("task dropped with it")
        return None
    if not isinstance(t.steps, (tuple, list)):
        notes.add("task steps dropped (not a list)")
        steps: tuple[str, ...] = ()
    else:
        kept = [_text(s, f"task step {i + 1}", notes, limit_key="task step", required=True)
                for i, s in enumerate(t.steps)]
        steps = tuple(s for s in kept if s is not None)
    outcome = t.outcome if isinstance(t.outcome, str) else ""
    if outcome != t.outcome:
        notes.add("task outcome dropped (not text)")
    save = t.save_requested if isinstance(t.save_requested, bool) else False
    return replace(t, task_class=task_class, steps=steps, outcome=outcome, save_requested=save)


def fit_extraction(ex: Extraction, where: str) -> tuple[Extraction, list[str]]:
    """``ex`` mended to the stores' limits (the module's rule) and what was changed, each line starting
    with ``where`` (the message or turn it came from)."""
    notes = _Notes(where)
    if not isinstance(ex, Extraction):
        notes.add("extraction dropped (not an extraction)")
        return Extraction(), notes.lines
    episode = _text(ex.episode, "episode summary", notes) or ""
    detail = _text(ex.detail, "episode detail", notes) or ""
    entities = _keys(ex.entities, "entity", "entity", notes)
    extra = _keys(ex.extra_sources, "context source id", "source id", notes)
    facts: tuple[FactCandidate, ...] = ()
    if isinstance(ex.facts, (tuple, list)):
        facts = tuple(f for f in (_fact(f, i + 1, notes) for i, f in enumerate(ex.facts)) if f is not None)
    else:
        notes.add("facts dropped (not a list)")
    task = _task(ex.task, notes)
    if not notes.lines:
        return ex, []
    return replace(ex, episode=episode, detail=detail, entities=entities, extra_sources=extra, facts=facts,
                   task=task, event=ex.event if isinstance(ex.event, bool) else False,
                   tool_call=ex.tool_call if isinstance(ex.tool_call, bool) else False), notes.lines


def fit_request(req: WriteRequest, where: str) -> tuple[WriteRequest, list[str]]:
    """A write request whose model-made parts (extraction, key context) the stores accept, and what was
    changed to get there."""
    ex, notes = fit_extraction(req.extraction, where)
    n = _Notes(where)
    key = _text(req.key_context, "key context", n) or ""
    notes += n.lines
    if not notes:
        return req, []
    return replace(req, extraction=ex, key_context=key), notes
