"""BEAM chats for `soul bench beam`: real long user/assistant conversations with probing questions.

BEAM (Tavakoli et al. 2025, "Beyond a Million Tokens") ships each chat as a directory holding ``chat.json``
(a list of batches: ``{"batch_number", "turns": [[{"role", "id", "content", "time_anchor"?}, ...], ...]}``) and
``probing_questions/probing_questions.json`` (question kind -> list of questions). The data is read from a path
given by the caller and never copied.

How a chat is read (the same for every system in the benchmark):

* every batch is one ``observe()`` session, timed at its first ``time_anchor`` (``"March-01-2024"``, UTC
  midnight; a batch without one follows the previous batch by a day), one minute per message;
* message ``id`` N becomes source ``mN``; the trailing ``->-> N,N`` plan marks are stripped from the text;
* questions of every kind but ``abstention`` (nothing to find); evidence = the question's ``source_chat_ids``
  (a list, a list of lists, or a dict of lists; for ``knowledge_update`` only ``updated_info``, the current value);
  a question without evidence ids is scored on key phrases only;
* key phrases = the content words (lower case ``[a-z0-9]+``, stop words out) of the rubric items, each with its
  leading "LLM response should state/mention/contain:" removed, on the kinds whose rubric states what was said
  (not ``instruction_following`` or ``preference_following``, whose rubric describes how to answer).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from soul_runtime.errors import InvalidInput

MINUTE = 60.0
DAY = 86_400.0
FACTUAL = ("contradiction_resolution", "event_ordering", "information_extraction", "knowledge_update",
           "multi_session_reasoning", "summarization", "temporal_reasoning")
"""Kinds whose rubric states what was said (scored on key phrases)."""
SKIPPED = ("abstention",)

_MARK = re.compile(r"\s*->->\s*[\d,\s]+$")
_RUBRIC_LEAD = re.compile(r"^\s*LLM response should (?:state|mention|contain|include)\s*:\s*", re.I)
_WORD = re.compile(r"[a-z0-9]+")
STOP = frozenset("""a an the and or of to in on at for with by from as is are was were be been being it its this that
these those i you your my me we our he she they them his her their what which who whom when where why how do does did
done not no yes can could should would will shall may might must have has had having than then so such into about
over under between through during before after above below up down out off again further once there here all any both
each few more most other some own same too very just also only llm response state mention contain""".split())


@dataclass(frozen=True)
class Question:
    question: str
    kind: str
    evidence: tuple[str, ...]
    key_words: tuple[str, ...]


@dataclass(frozen=True)
class Chat:
    chat_id: str
    sessions: tuple[tuple[str, tuple[dict[str, Any], ...]], ...]
    """(session name, messages ``{"id", "speaker", "text", "at"}``) in order."""
    questions: tuple[Question, ...]

    @property
    def messages(self) -> list[dict[str, Any]]:
        return [m for _, batch in self.sessions for m in batch]

    @property
    def chars(self) -> int:
        return sum(len(m["text"]) for m in self.messages)


def content_words(text: str) -> list[str]:
    """Lower-case ``[a-z0-9]+`` words of ``text`` that are not stop words, each once, in order."""
    return list(dict.fromkeys(w for w in _WORD.findall(text.lower()) if w not in STOP))


def _anchor(text: str) -> float:
    try:
        return datetime.strptime(text.strip(), "%B-%d-%Y").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        raise InvalidInput(f"not a BEAM time anchor: {text!r} (expected like 'March-01-2024')") from None


def _ids(value: Any) -> Iterable[int]:
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from _ids(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _ids(v)


def _question(kind: str, q: dict[str, Any]) -> Question:
    src = q.get("source_chat_ids")
    if kind == "knowledge_update" and isinstance(src, dict) and "updated_info" in src:
        src = src["updated_info"]
    evidence = tuple(dict.fromkeys(f"m{i}" for i in _ids(src)))
    words: list[str] = []
    if kind in FACTUAL:
        for item in q.get("rubric") or []:
            words += content_words(_RUBRIC_LEAD.sub("", str(item)))
    return Question(str(q["question"]), kind, evidence, tuple(dict.fromkeys(words)))


def load_chat(directory: str | Path) -> Chat:
    """One BEAM chat directory (``chat.json`` and ``probing_questions/probing_questions.json``)."""
    d = Path(directory)
    try:
        batches = json.loads((d / "chat.json").read_text(encoding="utf-8"))
        probes = json.loads((d / "probing_questions" / "probing_questions.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InvalidInput(f"{d}: not a BEAM chat directory: {e}") from None
    if not isinstance(batches, list) or not isinstance(probes, dict):
        raise InvalidInput(f"{d}: chat.json must hold a list of batches and probing_questions.json an object")
    sessions: list[tuple[str, tuple[dict[str, Any], ...]]] = []
    start = 0.0
    for bi, batch in enumerate(batches):
        msgs = [m for turn in batch.get("turns") or [] for m in (turn if isinstance(turn, list) else [turn])]
        anchor = next((m["time_anchor"] for m in msgs if m.get("time_anchor")), None)
        start = _anchor(anchor) if anchor else start + DAY
        out: list[dict[str, Any]] = []
        for j, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("content"), str) or "id" not in m:
                raise InvalidInput(f"{d}: batch {bi + 1} message {j + 1} needs an id and a string content")
            out.append({"id": f"m{m['id']}", "speaker": str(m.get("role") or "user"),
                        "text": _MARK.sub("", m["content"]), "at": start + j * MINUTE})
        if out:
            sessions.append((f"batch-{batch.get('batch_number', bi + 1)}", tuple(out)))
            start = out[-1]["at"]
    questions = tuple(_question(kind, q) for kind, qs in sorted(probes.items()) if kind not in SKIPPED
                      for q in (qs or []) if isinstance(q, dict) and q.get("question"))
    return Chat(d.name, tuple(sessions), questions)


def load(path: str | Path) -> list[Chat]:
    """The chats under ``path``: a chat directory, or a directory of them (``chats/1M``) in numeric order."""
    p = Path(path)
    if (p / "chat.json").is_file():
        return [load_chat(p)]
    dirs = [c for c in p.iterdir() if (c / "chat.json").is_file()] if p.is_dir() else []
    if not dirs:
        raise InvalidInput(f"{p}: no BEAM chat directories (each holds chat.json and probing_questions/)")
    return [load_chat(c) for c in sorted(dirs, key=lambda c: (not c.name.isdigit(), int(c.name) if c.name.isdigit()
                                                              else 0, c.name))]
