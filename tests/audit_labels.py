"""Hand-labelled expectations for the write-policy audit of ``fixtures/audit_transcript.jsonl``.

Each exchange was labelled by reading the message against the rules of :mod:`soul_runtime.loop.audit` (a
person's call, written here, not produced by the classifier): where it should be written and why. The
assistant's message ``a2r`` is context, not an exchange.
"""

from __future__ import annotations

from typing import Any

# id: (primary bucket, every label, why)
LABELLED: dict[str, tuple[str, tuple[str, ...], str]] = {
    "a1": ("nothing", (), "a greeting: chit-chat"),
    "a2": ("episodic", ("episodic", "observation"), "a role stated once: an observation, not yet a fact"),
    "a3": ("semantic", ("episodic", "semantic"), "confirms the role the assistant read back"),
    "a4": ("episodic", ("episodic", "observation"), "a fact stated once, not yet confirmed"),
    "a5": ("semantic", ("episodic", "semantic"), "confirms the database fact"),
    "a6": ("episodic", ("episodic",), "a task with steps but no outcome yet: no procedure"),
    "a7": ("procedural", ("episodic", "procedural"), "the task shipped: an outcome makes it a procedure"),
    "a8": ("nothing", (), "chit-chat"),
    "a9": ("semantic", ("episodic", "semantic"), "corrects a known fact (Postgres 15 -> 16)"),
    "a10": ("episodic", ("episodic", "observation"), "a preference stated once"),
    "a11": ("episodic", ("episodic",), "an event: what happened this morning"),
    "a12": ("episodic", ("episodic",), "a question naming what it asks about (Tendril's production Postgres "
            "version): an event in its own words, no fact"),
    "a13": ("nothing", (), "an injected instruction: never stored"),
    "a14": ("nothing", (), "an instruction to change behaviour: never stored"),
    "a15": ("episodic", ("episodic",), "a second task with steps, no outcome yet"),
    "a16": ("procedural", ("episodic", "procedural"), "the second task shipped"),
    "a17": ("procedural", ("episodic", "procedural"), "asks to save the task as a procedure"),
    "a18": ("semantic", ("episodic", "semantic"), "retracts the database fact"),
    "a19": ("nothing", (), "a goodbye: chit-chat"),
}
CONTEXT = {"a2r"}


def labelled_fixture(transcript: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The transcript as a replayable fixture carrying the hand labels (the assistant's messages as context)."""
    out = []
    for m in transcript:
        entry = {k: m[k] for k in ("id", "speaker", "text", "at") if k in m}
        if m["id"] in CONTEXT:
            entry["expected"] = "context"
        else:
            primary, labels, _ = LABELLED[m["id"]]
            entry.update(expected=primary, labels=list(labels))
        out.append(entry)
    return out
