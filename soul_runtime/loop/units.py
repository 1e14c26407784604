"""Long messages become several units: every part of a message findable, by its own words and by meaning.

A message longer than ``UNIT_AT`` characters, or one with code, a table or a log in it (what the model does
not read, :func:`soul_runtime.text.prose`), holds more than one episode summary can show. Besides the model's
episode of the message, the write path stores each unit of it as an episode of its own — dated like the
message, sourced to it, its text shown as it was said — so that an identifier, a figure, a date or a sentence
of prose in the middle of a long message is found and shown, not clipped away.

Units: the message is cut at blank lines (a fenced code block stays one block), a block longer than
``UNIT_CHARS`` is cut at line ends, then sentence ends, then white space, and consecutive pieces are packed
while they fit ``UNIT_CHARS``; a block that ends in a colon introduces what follows it ("Measured p95 latency of
ledger this week:" and its table), so it starts a unit. A scrap of under ``SCRAP_CHARS`` left alone ("4.", a
lone heading or line of code) joins a neighbour, up to ``UNIT_MAX`` (what an episode shows, ``max_episode_chars``):
a unit that short holds too few words to be found for what it is about, and lexical scoring, which favours short
texts, would rank it above the passages it belongs to. Every unit of a message is kept, up to ``MAX_UNITS`` (a message of ``max_text_chars`` fits).

Vectors: a message of up to ``OWN_VECTORS_UPTO`` characters gives each unit a vector of its own text, so the
dense side finds the very part that answers. A longer message (a pasted document, a log, a long answer) is
represented on the dense side by its opening (``HEAD_CHARS``, its summary first), which its units share; the
rest of it is found through its units' words. This bounds the encoder's work per message, which grows with
every token it reads, and keeps one long document from filling the dense candidates with its parts.
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
UNIT_CHARS = 360
UNIT_MAX = 400
SCRAP_CHARS = 40
MAX_UNITS = 5_000
HEAD_CHARS = 320
OWN_VECTORS_UPTO = 2_400

_FENCE = re.compile(r"^\s*```")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")
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
    """The units of ``text`` (see the module doc)."""
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
    units = [u.strip() for u in out if u.strip()]
    i = 0
    while i < len(units):  # a scrap ("4.", a lone heading or code line) joins a neighbour it fits beside
        u = units[i]
        if len(units) > 1 and len(u) < SCRAP_CHARS:
            nxt = i + 1 if i + 1 < len(units) and len(u) + 1 + len(units[i + 1]) <= UNIT_MAX else None
            if nxt is not None:
                units[i:i + 2] = [u + "\n" + units[i + 1]]
                continue
            if i and len(units[i - 1]) + 1 + len(u) <= UNIT_MAX:
                units[i - 1:i + 1] = [units[i - 1] + "\n" + u]
                continue
        i += 1
    return units


def message_requests(req: WriteRequest, text: str) -> list[WriteRequest]:
    """The writes of a message: ``req`` (its model-made write) and, for a long or structured message whose own
    episode is kept (what a guard or the episode policy refused for the message is not stored by its units), the
    episodes of its units, each written under its own turn key with the message's sources, date, speaker and
    session, shown as said. Their vectors: see the module doc (``OWN_VECTORS_UPTO``)."""
    if len(text) <= UNIT_AT and prose(text) == text or not decide_episode(req.extraction).write:
        return [req]  # a short message of prose; or one whose own episode is not kept (a guard, chit-chat)
    units = split_units(text)[:MAX_UNITS]
    own = len(text) <= OWN_VECTORS_UPTO
    head = req if own else replace(req, vector_text=clip(req.vector_text or index_key_text(req), HEAD_CHARS))
    return [head] + [replace(head, turn_key=f"{req.turn_key}{UNIT_KEY}{i + 1}",
                             extraction=Extraction(episode=u, event=True, extra_sources=req.extraction.extra_sources),
                             key_context="", vector_text=u if own else head.vector_text)
                     for i, u in enumerate(units)]
