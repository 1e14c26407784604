"""Long messages become several units: one episode per informative piece, each indexed under its own words.

A message longer than ``UNIT_AT`` characters, or one with code, a table or a log in it (what the model does
not read, :func:`soul_runtime.text.prose`), holds more than one episode summary can show. Besides the model's
episode of the message, the write path stores each informative unit of it as an episode of its own — dated like the message, sourced to it, its text shown as it was said —
so that an identifier, a library version, a figure or a date in the middle of a long message is found by
its own words and shown, not clipped away.

Units: the message is cut at blank lines (a fenced code block stays one block), a block longer than
``UNIT_CHARS`` is cut at line ends, then sentence ends, then white space, and consecutive pieces are packed
while they fit ``UNIT_CHARS`` (at most what an episode summary shows, ``max_episode_chars``); a block that ends
in a colon introduces what follows it ("Measured p95 latency of ledger this week:" and its table), so it starts
a unit. A
unit is informative when it holds a figure or a date (a digit), an identifier (``snake_case``, ``a.b``,
``key=value``, a path, backticks) or a decision ("propose", "agreed", "decided", "let us go with"). At most
``MAX_UNITS`` units of a message are kept, the first ones.

The units of a message share its vector (one embedding per message): the dense side finds the message, the
lexical side the unit. That vector is computed from the opening of what the message is indexed under (its
summary first, ``HEAD_CHARS`` characters, about 100 tokens of technical text, within the 128 MiniLM was
tuned at), not from as much of it as the embedder takes: the rest of the message is found through its units,
and the encoder's cost grows with every token it reads.
"""

from __future__ import annotations

import re
from dataclasses import replace

from soul_runtime.loop.fit import clip
from soul_runtime.memory.episodic import index_key_text
from soul_runtime.memory.episodic_writes import UNIT_KEY
from soul_runtime.memory.policy_episodic import decide_episode
from soul_runtime.records import Extraction, WriteRequest
from soul_runtime.text import prose

UNIT_AT = 800
UNIT_CHARS = 400
MAX_UNITS = 48
HEAD_CHARS = 320

_FENCE = re.compile(r"^\s*```")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")
_INFORMATIVE = re.compile(r"\d|\w[_=./]\w|`|\b(?:propos|agree|decid|chose|let us go with|let's go with|we will use|"
                          r"switch(?:ed)? to|migrat|deprecat)", re.I)


def _blocks(text: str) -> list[str]:
    """Blank-line separated blocks; a fenced code block is one block whatever its blank lines."""
    out: list[str] = []
    cur: list[str] = []
    fenced = False
    for line in text.split("\n"):
        if _FENCE.match(line):
            fenced = not fenced
        if not line.strip() and not fenced:
            if cur:
                out.append("\n".join(cur))
                cur = []
            continue
        cur.append(line)
    if cur:
        out.append("\n".join(cur))
    return out


def _cut(block: str, size: int) -> list[str]:
    """A block in pieces of at most ``size`` characters: at line ends, then sentence ends, then white space."""
    if len(block) <= size:
        return [block]
    out: list[str] = []
    for part in block.split("\n") if "\n" in block else _SENTENCE_END.split(block):
        if "\n" in block and len(part) > size:
            out += _cut(part, size)
            continue
        while len(part) > size:
            cut = part.rfind(" ", 0, size)
            cut = cut if cut > size // 2 else size
            out.append(part[:cut])
            part = part[cut:].lstrip()
        if part.strip():
            out.append(part)
    return out


def split_units(text: str, size: int = UNIT_CHARS) -> list[str]:
    """The units of ``text`` (see the module doc), informative or not."""
    pieces: list[tuple[str, str]] = []  # (text, joiner to the previous piece)
    for block in _blocks(text):
        for i, piece in enumerate(_cut(block, size)):
            pieces.append((piece, "\n" if i else "\n\n"))
    out: list[str] = []
    for piece, joiner in pieces:
        lead_in = joiner == "\n\n" and piece.rstrip().endswith(":")  # "Measured p95 of ledger this week:"
        if out and not lead_in and len(out[-1]) + len(joiner) + len(piece) <= size:
            out[-1] += joiner + piece
        else:
            out.append(piece)
    return [u.strip() for u in out if u.strip()]


def informative(unit: str) -> bool:
    return bool(_INFORMATIVE.search(unit))


def message_requests(req: WriteRequest, text: str) -> list[WriteRequest]:
    """The writes of a message: ``req`` (its model-made write) and, for a long or structured message whose own
    episode is kept (what a guard or the episode policy refused for the message is not stored by its units), the
    episodes of its informative units, each written under its own turn key with the message's sources, date,
    speaker and session, indexed under its own words. Such a message and its units share one vector, computed
    from the opening of the message's key text (``HEAD_CHARS``)."""
    if len(text) <= UNIT_AT and prose(text) == text or not decide_episode(req.extraction).write:
        return [req]  # a short message of prose; or one whose own episode is not kept (a guard, chit-chat)
    units = [u for u in split_units(text) if informative(u)][:MAX_UNITS]
    head = replace(req, vector_text=clip(req.vector_text or index_key_text(req), HEAD_CHARS))
    return [head] + [replace(head, turn_key=f"{req.turn_key}{UNIT_KEY}{i + 1}",
                             extraction=Extraction(episode=u, event=True, extra_sources=req.extraction.extra_sources),
                             key_context="")
                     for i, u in enumerate(units)]
