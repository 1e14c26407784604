"""Junk and poisoning guards, applied to every model's extraction (pure).

Whatever the model says, these never become memories:

* text that tries to instruct the agent ("ignore previous instructions",
  "from now on always …") — no fact, no procedure, no task;
* the soul's own system prompt, and memories recalled for this turn, repeated back.
"""

from __future__ import annotations

import re
from dataclasses import replace

from .llm import Exchange
from .records import Extraction, FactCandidate
from .text import normalise

_INSTRUCTION = re.compile(
    r"\b(ignore|disregard|forget|override)\b[^.]{0,40}\b(previous|prior|above|earlier|all|your)\b[^.]{0,30}"
    r"\b(instructions?|rules?|prompts?|guidelines|directives)\b"
    r"|\bfrom now on,?\s+(you|always|never|please|do|don't|reply|respond|answer|call|treat|remember|ignore)\b|\bgoing forward,? (you|always|never)\b|\byou (must|should|will) (always|never)\b"
    r"|(^|[.!?;:]\s*|\byou\s+|\bplease\s+)(always|never) (approve|obey|follow|reveal|answer|say|reply|respond"
    r"|comply|execute|run|trust|ignore|skip|share|send|store|save|remember)\b"
    r"|\bsystem prompt\b|\bnew instructions\b|\byour instructions\b|(^|[.!?]\s*|\bplease\s+|\bnow\s+)act as\b"
    r"|\bpretend (to be|you are)\b"
    r"|\bjailbreak\b|\bdeveloper mode\b|\bremember that you (must|should|will)\b|\bdo anything now\b"
    r"|\b(store|save|remember|record) (this|that|the following)?\s*(as )?(a )?(fact|memory|procedure)\b.{0,20}:"
    r"|\byou are (now )?(no longer|an? unrestricted)\b",
    re.IGNORECASE,
)


def is_instruction(text: str) -> bool:
    """Does the text try to instruct the agent (rather than tell it something)?"""
    return bool(_INSTRUCTION.search(text))


def _echoes(value: str, known: list[str]) -> bool:
    v = normalise(value)
    return len(v) >= 12 and any(v in k for k in known)


def _fact_text(f: FactCandidate) -> str:
    return normalise(f"{f.display_entity or f.entity} {f.display_attribute or f.attribute} {f.value}")


def sanitize(ex: Extraction, exchange: Exchange) -> tuple[Extraction, list[str]]:
    """Drop what must never be stored; return the cleaned extraction and why things were dropped."""
    dropped: list[str] = []
    if is_instruction(exchange.user_text):
        if ex.facts or ex.task is not None:
            dropped.append("instruction to the agent: no fact, task or procedure kept")
        return replace(ex, facts=(), task=None, event=False, episode=""), dropped
    known = [normalise(exchange.persona)] + [normalise(r) for r in exchange.recalled]
    user = normalise(exchange.user_text)
    echo_turn = len(user) >= 12 and any(user in k for k in known if k)
    facts = []
    for f in ex.facts:
        if is_instruction(f.value) or is_instruction(f.attribute):
            dropped.append(f"fact {f.entity}:{f.attribute}: value is an instruction")
        elif f.kind == "stated" and (echo_turn or _echoes(_fact_text(f), known) or _echoes(f.value, known[:1])):
            dropped.append(f"fact {f.entity}:{f.attribute}: repeats the system prompt or a recalled memory")
        else:
            facts.append(f)
    task = ex.task
    if task is not None and any(is_instruction(s) for s in task.steps):
        dropped.append(f"task {task.task_class}: steps instruct the agent")
        task = None
    episode = ex.episode
    if echo_turn and not any(f.kind != "stated" for f in facts) and task is None:
        dropped.append("episode: the turn repeats the system prompt or a recalled memory")
        episode = ""
    return replace(ex, facts=tuple(facts), task=task, episode=episode), dropped
