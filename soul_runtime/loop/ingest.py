"""Loaders for conversations to observe (pure, no Ray).

* JSONL: one ``{"speaker", "text", "id", "at"?, "session"?}`` object per line.
  Consecutive messages become one ``observe()`` batch; a batch ends when the
  ``session`` field changes, when the time gap exceeds ``gap_minutes``, or at
  ``batch_size`` messages.
* LoCoMo JSON: a conversation dict with ``session_N`` (lists of
  ``{speaker, dia_id, text}``) and ``session_N_date_time`` ("1:56 pm on 8 May, 2023"),
  either bare or as a sample ``{"sample_id", "conversation": {...}, "qa": [...]}``;
  a file may hold one such dict or a list of them. One batch per session, with
  ``at`` = the session's date and ``session`` = ``"session_N"``; message ids are the
  ``dia_id``\\ s (prefixed with the sample id when a file holds several conversations,
  so ids stay unique within one soul).

Every problem is an :class:`~soul_runtime.errors.InvalidInput` naming the file and place.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from soul_runtime.clock import to_timestamp
from soul_runtime.errors import InvalidInput

FORMATS = ("auto", "jsonl", "locomo")
_MONTHS = {m: i + 1 for i, m in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct",
                                           "nov", "dec"))}
_LOCOMO_DATE = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*([ap])\.?\s*m\.?\s+on\s+(\d{1,2})\s+([A-Za-z]+)\.?,?\s+(\d{4})\s*$",
                          re.IGNORECASE)
_SESSION_KEY = re.compile(r"^session_(\d+)$")


@dataclass(frozen=True)
class Batch:
    """The arguments of one ``SoulHandle.observe`` call."""

    messages: list[dict[str, Any]]
    at: float | None = None
    session: str | None = None
    label: str = ""


@dataclass(frozen=True)
class Conversation:
    sample_id: str
    batches: list[Batch]
    qa: list[dict[str, Any]] = field(default_factory=list)
    speakers: tuple[str, ...] = ()

    @property
    def messages(self) -> int:
        return sum(len(b.messages) for b in self.batches)


def parse_locomo_date(text: str) -> float:
    """``"1:56 pm on 8 May, 2023"`` → UTC epoch seconds."""
    m = _LOCOMO_DATE.match(text or "")
    month = _MONTHS.get(m.group(5)[:3].lower()) if m else None
    if not m or month is None:
        raise InvalidInput(f"not a LoCoMo session date: {text!r} (expected like '1:56 pm on 8 May, 2023')")
    hour = int(m.group(1)) % 12 + (12 if m.group(3).lower() == "p" else 0)
    try:
        return datetime(int(m.group(6)), month, int(m.group(4)), hour, int(m.group(2)), tzinfo=timezone.utc).timestamp()
    except ValueError as e:
        raise InvalidInput(f"not a LoCoMo session date: {text!r} ({e})") from None


def _read(path: str | Path) -> str:
    p = Path(path)
    if not p.is_file():
        raise InvalidInput(f"{p}: no such file")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(f"{p}: not a UTF-8 text file") from None


def detect_format(path: str | Path, text: str | None = None) -> str:
    text = _read(path) if text is None else text
    head = text.lstrip()[:1]
    if head == "[":
        return "locomo"
    if head == "{":
        first = text.lstrip().split("\n", 1)[0]
        try:
            obj = json.loads(first)
        except ValueError:
            return "locomo"  # a multi-line JSON document
        return "jsonl" if isinstance(obj, dict) and "text" in obj and "speaker" in obj else "locomo"
    raise InvalidInput(f"{path}: neither JSONL messages nor a LoCoMo JSON file")


def load_jsonl(path: str | Path, *, batch_size: int = 50, gap_minutes: float = 240.0) -> Conversation:
    batches: list[Batch] = []
    current: list[dict[str, Any]] = []
    session: str | None = None
    last_at: float | None = None
    seen: set[str] = set()

    def flush() -> None:
        if current:
            batches.append(Batch(list(current), current[0].get("at"), session,
                                 f"{session or 'batch'} ({len(current)} messages)"))
            current.clear()

    for n, line in enumerate(_read(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            m = json.loads(line)
        except ValueError as e:
            raise InvalidInput(f"{path}:{n}: not a JSON line: {e}") from None
        if not isinstance(m, dict) or not isinstance(m.get("text"), str) or not isinstance(m.get("speaker"), str):
            raise InvalidInput(f"{path}:{n}: expected an object with string 'speaker' and 'text'")
        mid = str(m.get("id") or f"m{n}")
        if mid in seen:
            raise InvalidInput(f"{path}:{n}: message id {mid!r} appears twice")
        seen.add(mid)
        at = to_timestamp(m["at"]) if m.get("at") is not None else None
        sess = str(m["session"]) if m.get("session") is not None else None
        if current and (sess != session or len(current) >= batch_size or (
                at is not None and last_at is not None and at - last_at > gap_minutes * 60)):
            flush()
        session, last_at = sess, at if at is not None else last_at
        msg: dict[str, Any] = {"speaker": m["speaker"], "text": m["text"], "id": mid}
        if at is not None:
            msg["at"] = at
        current.append(msg)
    flush()
    if not batches:
        raise InvalidInput(f"{path}: no messages")
    return Conversation(Path(path).stem, batches, [], tuple(dict.fromkeys(m["speaker"] for b in batches
                                                                          for m in b.messages)))


def _qa(items: Any, where: str) -> list[dict[str, Any]]:
    if items is None:
        return []
    if not isinstance(items, list):
        raise InvalidInput(f"{where}: 'qa' must be a list")
    out = []
    for q in items:
        if not isinstance(q, dict) or "question" not in q:
            raise InvalidInput(f"{where}: every qa item needs a 'question'")
        answer = q.get("answer", q.get("adversarial_answer", ""))
        out.append({"question": str(q["question"]), "answer": "" if answer is None else str(answer),
                    "evidence": [str(e) for e in q.get("evidence") or []], "category": q.get("category")})
    return out


def _conversation(sample: dict[str, Any], index: int, prefix: bool, where: str, captions: bool = True
                  ) -> Conversation:
    conv = sample.get("conversation", sample)
    if not isinstance(conv, dict):
        raise InvalidInput(f"{where}: 'conversation' must be an object")
    sample_id = str(sample.get("sample_id") or f"conv-{index + 1}")
    numbers = sorted(int(m.group(1)) for k in conv if (m := _SESSION_KEY.match(k)))
    if not numbers:
        raise InvalidInput(f"{where}: conversation {sample_id!r} has no session_N keys (not a LoCoMo file?)")
    batches = []
    for n in numbers:
        turns = conv[f"session_{n}"]
        date = conv.get(f"session_{n}_date_time")
        if not isinstance(turns, list):
            raise InvalidInput(f"{where}: {sample_id} session_{n} must be a list of messages")
        if not turns:
            continue
        if not isinstance(date, str):
            raise InvalidInput(f"{where}: {sample_id} lacks session_{n}_date_time")
        at = parse_locomo_date(date)
        msgs = []
        for i, t in enumerate(turns):
            if not isinstance(t, dict) or not all(isinstance(t.get(k), str) for k in ("speaker", "dia_id", "text")):
                raise InvalidInput(f"{where}: {sample_id} session_{n} message {i + 1} needs speaker, dia_id and text")
            text = t["text"]
            if captions and t.get("blip_caption"):
                text += f" [shares a photo: {t['blip_caption']}]"
            msgs.append({"speaker": t["speaker"], "text": text,
                         "id": f"{sample_id}:{t['dia_id']}" if prefix else t["dia_id"], "at": at})
        session = f"{sample_id}:session_{n}" if prefix else f"session_{n}"
        batches.append(Batch(msgs, at, session, f"{session} ({date}, {len(msgs)} messages)"))
    speakers = tuple(str(conv[k]) for k in ("speaker_a", "speaker_b") if conv.get(k))
    return Conversation(sample_id, batches, _qa(sample.get("qa"), where), speakers)


def load_locomo(path: str | Path, *, captions: bool = True) -> list[Conversation]:
    """``captions``: append shared photos' captions to their message text."""
    try:
        data = json.loads(_read(path))
    except ValueError as e:
        raise InvalidInput(f"{path}: not valid JSON: {e}") from None
    samples = data if isinstance(data, list) else [data]
    if not samples or not all(isinstance(s, dict) for s in samples):
        raise InvalidInput(f"{path}: a LoCoMo file holds a conversation object or a list of them")
    return [_conversation(s, i, len(samples) > 1, str(path), captions) for i, s in enumerate(samples)]


def load(path: str | Path, fmt: str = "auto") -> list[Conversation]:
    """The conversations in ``path`` (JSONL: exactly one), ready for ``observe`` batch by batch."""
    if fmt not in FORMATS:
        raise InvalidInput(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if fmt == "auto":
        fmt = detect_format(path)
    return [load_jsonl(path)] if fmt == "jsonl" else load_locomo(path)
