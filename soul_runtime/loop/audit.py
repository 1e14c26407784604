"""The write-policy audit (pure, no Ray): where would each exchange of a transcript be written?

Every exchange goes through the same steps a soul's turn loop runs
(:func:`soul_runtime.loop.decide.decide_exchange`): the minimum-length filter, the model's
memory decision (persist + extraction in one), the guards (:func:`soul_runtime.loop.guards.sanitize`),
and then the layer rules:

* ``episodic``   — :func:`soul_runtime.memory.policy_episodic.decide_episode` says write;
* ``semantic``   — a fact candidate is confirmed, corrected or retracted;
* ``observation`` — only *stated* facts: the semantic layer counts an observation
  but writes no fact yet (reported apart, never a primary bucket);
* ``procedural`` — a task with an outcome, or "save this as a procedure".

The primary bucket is the most specific label: procedural > semantic > episodic
> nothing. The policy is flagged UNBALANCED when one *store* bucket
(episodic / semantic / procedural) holds more than ``threshold`` of **all**
exchanges; "nothing" never triggers the flag (a chatty transcript is not a
policy problem), and the share among stored exchanges is reported beside it.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from soul_runtime.clock import to_timestamp
from soul_runtime.config import SoulConfig
from soul_runtime.errors import InvalidInput
from soul_runtime.loop.decide import decide_exchange
from soul_runtime.memory.policy_episodic import decide_episode
from soul_runtime.models.base import ChatMessage, Exchange, LanguageModel
from soul_runtime.owner_only import write_file
from soul_runtime.steps import drive

BUCKETS = ("procedural", "semantic", "episodic", "nothing")
STORES = ("episodic", "semantic", "procedural")
DEFAULT_THRESHOLD = 0.6
ASSISTANT_NAMES = ("atlas", "assistant", "soul")


@dataclass(frozen=True)
class AuditRow:
    id: str
    speaker: str
    text: str
    primary: str
    labels: tuple[str, ...]
    reason: str
    writes: tuple[str, ...] = ()


@dataclass(frozen=True)
class AuditReport:
    rows: tuple[AuditRow, ...]
    threshold: float
    tally: dict[str, int] = field(default_factory=dict)
    labels: dict[str, int] = field(default_factory=dict)
    share: dict[str, float] = field(default_factory=dict)
    stored_share: dict[str, float] = field(default_factory=dict)
    unbalanced: bool = False
    dominant: str = ""

    @property
    def nothing(self) -> list[AuditRow]:
        return [r for r in self.rows if r.primary == "nothing"]

    def to_dict(self) -> dict[str, Any]:
        return {"threshold": self.threshold, "total": len(self.rows), "tally": self.tally, "labels": self.labels,
                "share": self.share, "stored_share": self.stored_share, "unbalanced": self.unbalanced,
                "dominant": self.dominant, "rows": [dict(asdict(r), labels=list(r.labels), writes=list(r.writes))
                                                    for r in self.rows],
                "nothing": [{"id": r.id, "text": r.text, "reason": r.reason} for r in self.nothing]}


def load_transcript(path: str | Path) -> list[dict[str, Any]]:
    """A JSONL file of ``{speaker, text, id, at?}`` lines, or a JSON list of such dicts."""
    p = Path(path)
    try:
        raw = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(f"{p}: not a UTF-8 text file") from None
    stripped = raw.lstrip()
    if stripped.startswith("["):
        try:
            items = json.loads(raw)
        except ValueError as e:
            raise InvalidInput(f"{p}: not valid JSON: {e}") from None
    else:
        items = []
        for n, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                items.append(json.loads(line))
            except ValueError as e:
                raise InvalidInput(f"{p}:{n}: not a JSON line: {e}") from None
    return check_transcript(items, str(p))


def check_transcript(items: Iterable[Any], where: str = "transcript") -> list[dict[str, Any]]:
    out = []
    for i, m in enumerate(items):
        if not isinstance(m, Mapping) or not isinstance(m.get("text"), str) or not isinstance(m.get("speaker"), str):
            raise InvalidInput(f"{where}: item {i + 1} must be an object with string 'speaker' and 'text'")
        out.append({**m, "id": str(m.get("id") or f"m{i + 1}")})
    if not out:
        raise InvalidInput(f"{where}: no messages")
    return out


def _labels(ex: Exchange, model: LanguageModel, cfg: SoulConfig, known: dict[tuple[str, str], str]
            ) -> tuple[tuple[str, ...], str, tuple[str, ...]]:
    """(labels, reason, write descriptions) of one exchange — the soul's memory decision plus the layer rules.

    ``known`` stands in for the semantic layer (what recall would hand the extractor as known facts);
    it is updated with the facts this exchange would write."""
    d = drive(decide_exchange(model, ex, cfg.turn, {}), {"model": model})
    if not d.persisted:
        return (), d.reason, ()
    clean = d.extraction
    for f in clean.facts:
        if f.kind in ("confirmed", "corrected"):
            known[(f.entity, f.attribute)] = f.value
        elif f.kind == "retracted":
            known.pop((f.entity, f.attribute), None)
    labels: list[str] = []
    writes: list[str] = []
    ep = decide_episode(clean)
    if ep.write:
        labels.append("episodic")
        writes.append(f"episode ({ep.reason})")
    strong = [f for f in clean.facts if f.kind in ("confirmed", "corrected", "retracted")]
    if strong:
        labels.append("semantic")
    writes += [f"fact {f.entity}:{f.attribute} = {f.value!r} ({f.kind})" for f in clean.facts]
    if any(f.kind == "stated" for f in clean.facts) and not strong:
        labels.append("observation")
    task = clean.task
    if task is not None and (task.outcome or task.save_requested):
        labels.append("procedural")
        writes.append(f"task '{task.task_class}' {task.outcome or 'save requested'}")
    reason = d.reason
    if not labels:
        reason += f"; no layer write ({ep.reason})"
    return tuple(labels), reason, tuple(writes)


def primary_bucket(labels: Iterable[str]) -> str:
    found = set(labels)
    return next((b for b in BUCKETS[:3] if b in found), "nothing")


def _is_reply(m: Mapping[str, Any], assistant: str) -> bool:
    return m.get("role") == "assistant" or str(m["speaker"]).strip().lower() in {assistant.lower(), *ASSISTANT_NAMES}


def classify(transcript: Sequence[Mapping[str, Any]], *, model: LanguageModel | None = None,
             config: SoulConfig | None = None, assistant: str = "Atlas") -> list[AuditRow]:
    """One row per exchange (messages from the assistant are context, not exchanges)."""
    if model is None:
        from soul_runtime.models.offline import OfflineModel
        model = OfflineModel()
    cfg = config or SoulConfig()
    items = check_transcript(transcript)
    history: list[ChatMessage] = []
    rows: list[AuditRow] = []
    known: dict[tuple[str, str], str] = {}
    last_at: float | None = None
    for m in items:
        at = to_timestamp(m["at"]) if m.get("at") is not None else None
        if at is not None and last_at is not None and at - last_at > cfg.turn.session_gap_minutes * 60:
            history.clear()  # a new session: the soul's buffer starts empty
        last_at = at if at is not None else last_at
        if _is_reply(m, assistant):
            history.append(ChatMessage("assistant", m["text"], m["id"], m["speaker"]))
            continue
        window = tuple(history[-cfg.turn.history_for_extraction:])
        ex = Exchange(user_text=m["text"], reply_text=str(m.get("reply", "")), speaker=m["speaker"],
                      message_ids=(m["id"],), at=at or 0.0, persona=cfg.persona, history=window,
                      known_facts=tuple((e, a, v) for (e, a), v in known.items()))
        labels, reason, writes = _labels(ex, model, cfg, known)
        rows.append(AuditRow(m["id"], m["speaker"], m["text"], primary_bucket(labels), labels, reason, writes))
        history.append(ChatMessage("user", m["text"], m["id"], m["speaker"]))
        if m.get("reply"):
            history.append(ChatMessage("assistant", str(m["reply"]), m["id"] + "/reply", assistant))
    return rows


def tally(rows: Sequence[AuditRow], threshold: float = DEFAULT_THRESHOLD) -> AuditReport:
    """Counts per primary bucket and per label, shares, and the imbalance verdict."""
    if not 0.0 < threshold <= 1.0:
        raise InvalidInput(f"threshold must be in (0, 1], got {threshold!r}")
    counts = Counter(r.primary for r in rows)
    per_bucket = {b: counts.get(b, 0) for b in BUCKETS}
    label_counts = Counter(lbl for r in rows for lbl in r.labels)
    labels = {b: label_counts.get(b, 0) for b in (*STORES, "observation")}
    total = len(rows)
    stored = total - per_bucket["nothing"]
    share = {b: round(n / total, 4) if total else 0.0 for b, n in per_bucket.items()}
    stored_share = {b: round(per_bucket[b] / stored, 4) if stored else 0.0 for b in STORES}
    dominant = max(STORES, key=lambda b: per_bucket[b]) if stored else ""
    unbalanced = bool(dominant) and share[dominant] > threshold
    return AuditReport(tuple(rows), threshold, per_bucket, labels, share, stored_share, unbalanced, dominant)


def audit(transcript: Sequence[Mapping[str, Any]], threshold: float = DEFAULT_THRESHOLD, *,
          model: LanguageModel | None = None, config: SoulConfig | None = None) -> AuditReport:
    return tally(classify(transcript, model=model, config=config), threshold)


def fixture_entries(rows: Sequence[AuditRow], transcript: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """The classification as fixture entries; assistant messages of the transcript are kept as context."""
    by_id = {r.id: r for r in rows}
    out: list[dict[str, Any]] = []
    source = transcript or [{"id": r.id, "speaker": r.speaker, "text": r.text} for r in rows]
    for m in source:
        r = by_id.get(str(m.get("id")))
        entry: dict[str, Any] = {"id": str(m.get("id")), "speaker": m["speaker"], "text": m["text"]}
        if m.get("at") is not None:
            entry["at"] = m["at"]
        if r is not None:
            entry["expected"] = r.primary
            entry["labels"] = list(r.labels)
        else:
            entry["expected"] = "context"  # an assistant message: not an exchange of its own
        out.append(entry)
    return out


def save_fixture(path: str | Path, rows: Sequence[AuditRow], transcript: Sequence[Mapping[str, Any]] = ()) -> Path:
    """Write the (reviewed) classification: a JSON list of ``{id, speaker, text, expected, labels}``."""
    return write_file(path, json.dumps(fixture_entries(rows, transcript), indent=2, ensure_ascii=False) + "\n")


def replay_fixture(path: str | Path, *, model: LanguageModel | None = None,
                   config: SoulConfig | None = None) -> list[dict[str, Any]]:
    """Run a saved fixture through the policy again; one dict per exchange whose classification differs."""
    try:
        entries = json.loads(Path(path).read_text(encoding="utf-8"))
    except ValueError as err:
        raise InvalidInput(f"{path}: not a JSON fixture: {err}") from None
    if not isinstance(entries, list) or any(not isinstance(e, dict) or "expected" not in e for e in entries):
        raise InvalidInput(f"{path}: a fixture is a JSON list of {{id, speaker, text, expected}}")
    rows = {r.id: r for r in classify(entries, model=model, config=config)}
    mismatches = []
    for e in entries:
        r = rows.get(str(e["id"]))
        if r is None:
            if e["expected"] != "context":
                mismatches.append({"id": e["id"], "text": e["text"], "expected": e["expected"], "got": "context"})
            continue
        labels_differ = "labels" in e and sorted(e["labels"]) != sorted(r.labels)
        if r.primary != e["expected"] or labels_differ:
            mismatches.append({"id": e["id"], "text": e["text"], "expected": e["expected"], "got": r.primary,
                               "expected_labels": e.get("labels"), "got_labels": list(r.labels),
                               "reason": r.reason})
    return mismatches
