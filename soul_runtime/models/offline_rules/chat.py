"""Chit-chat, questions, hearsay, hypotheticals, instructions and text echoed back from memory."""

from __future__ import annotations

import re

from soul_runtime.models.base import memory_text
from soul_runtime.models.offline_rules.cleaning import content_words, split_sentences, strip_fillers
from soul_runtime.models.offline_rules.words import memo
from soul_runtime.text import fold as normalise
from soul_runtime.text import lacks_words

_CHIT = re.compile(
    r"^(?:(?:it's |it is |so )?(?:good|great|nice|lovely) (?:to )?(?:see|hear from|talk to|chat with|hear) you|"
    r"how (?:are|have|is) (?:you|it|things|life)|what's up|whats up|how's it going|how's everything|"
    r"(?:thanks?|thank you|thx|ty|cheers)\b|(?:bye|goodbye|see you|see ya|talk (?:to you )?soon|take care|"
    r"catch you later|have a (?:good|great|nice))|(?:lol|lmao|haha\w*|omg|wow|aw+|yay|same|me too|no worries|"
    r"you're welcome|np|sounds (?:good|great|fun|amazing|awesome|lovely)|good (?:morning|night|evening)|"
    r"that's (?:\w+ )?(?:great|cool|awesome|amazing|nice|wonderful|sweet|good|fantastic|lovely|true|fair|"
    r"funny|hilarious|sad|tough|rough|kind|sweet of you)|anything new|what now))")


def is_question(sentence: str) -> bool:
    return sentence.rstrip(" \"')").endswith("?")


_HEARSAY = re.compile(r"^(?:apparently|reportedly|supposedly|allegedly|rumou?r has it|word is|i(?:'ve)? heard|they say|"
                      r"people say)\b|^(?:my|our|his|her|their)\s+[\w-]+(?:\s+[\w-]+)?\s+(?:says?|said|thinks?|thought|claims?|"
                      r"claimed|reckons?|believes?|insists?|swears? by|recommends?)\b|^[A-Z][a-z]+\s+(?:says|said|thinks|claims|"
                      r"reckons|believes|insists|swears by|recommends)\b", re.I)


def is_hearsay(sentence: str) -> bool:
    """Someone else's claim or a rumour ("apparently …", "my cousin says …"): not the speaker's own fact."""
    return bool(_HEARSAY.match(sentence.strip()))


_HYPOTHETICAL = re.compile(r"\b(?:might|could|would) be\b|\b(?:we|i|they|you)(?:'re| are|'m| am)? (?:might|may|could|"
                           r"would|should|thinking (?:about|of)|considering|planning (?:to|on)|hoping to|want to|wants to)\b",
                           re.I)
_HYPOTHETICAL_WORDS = ("might", "could", "would", "may", "should", "thinking", "considering", "planning", "hoping", "want")
"""A literal of every branch of _HYPOTHETICAL: a text with none of these cannot match it."""


_IF_MAYBE = re.compile(r"^(?:if|maybe|perhaps|what if|suppose|imagine|hopefully|i wonder|i wish)\b", re.I)


def is_hypothetical(sentence: str) -> bool:
    return bool(_IF_MAYBE.match(sentence.strip())) or (not lacks_words(sentence, _HYPOTHETICAL_WORDS)
                                                      and bool(_HYPOTHETICAL.search(sentence)))


def is_chit_sentence(sentence: str) -> bool:
    """Greetings, thanks, small talk; a short sentence with no first person, name or number and ≤1 content word."""
    s = strip_fillers(sentence)
    cw = content_words(s)
    if not s or not cw or _CHIT.match(s.lower()):
        return len(cw) <= 2
    anchor = re.search(r"\b(?:I|I'm|I've|I'd|my|we|our|me)\b|\S\s+[A-Z][a-z]+|\d", s)
    return len(s.split()) <= 6 and len(cw) <= 1 and not anchor


def is_chit_chat(text: str) -> bool:
    """True when no sentence carries anything beyond greetings, thanks and small talk."""
    return all(is_chit_sentence(s) or (is_question(s) and len(content_words(strip_fillers(s))) <= 1)
               for s in split_sentences(text))


_INSTRUCTION = re.compile(
    r"\b(?:ignore|disregard|forget|override|bypass)\b[^.!?]{0,40}\b(?:instructions?|prompts?|rules|guidelines|"
    r"guardrails|directives?|training|previous|prior|above|earlier)\b|\bdisregard\b|\bsystem prompt\b|"
    r"\bfrom now on,?\s+(?:you\b|(?:\w+\s+)?(?:always|never|must|should|only|do not|don't|approve|reply|"
    r"respond|answer|ignore|treat|obey)\b)|\bhenceforth\b|\byou (?:must|should|will|shall) (?:always|never)\b|"
    r"(?:^|[.!?]\s+|\bnow\s+|\byou\s+(?:will\s+|should\s+|must\s+)?)act as\b|\bpretend (?:to be|you(?:'re| are))\b|"
    r"\b(?:your|the) new instructions?\b|\bnew instructions?:|\bremember that you (?:should|must|will|always|never)\b|"
    r"\byou are now (?:an? )?(?:assistant|ai|bot|model|dan|unrestricted|free|jailbroken)\b|"
    r"\bdeveloper mode\b|\bjailbreak\b|\bdo anything now\b", re.I | re.M)


# A literal of every branch of _INSTRUCTION: a text with none of these cannot match it.
_INSTRUCTION_WORDS = ("ignore", "disregard", "forget", "override", "bypass", "system prompt", "from now on", "henceforth",
                      "you", "act as", "pretend", "new instruction", "remember that you", "developer mode", "jailbreak",
                      "do anything now")


@memo
def is_instruction(text: str) -> bool:
    t = text.replace("\u2019", "'")
    return not lacks_words(t, _INSTRUCTION_WORDS) and bool(_INSTRUCTION.search(t))


def echoes(text: str, sources: tuple[str, ...] | list[str]) -> bool:
    """Does ``text`` repeat (contain, or is contained in) one of ``sources`` (persona / recalled memory lines)?"""
    n = normalise(memory_text(text))
    lines = [normalise(memory_text(line)) for src in sources for line in src.splitlines()]
    return len(n.split()) >= 3 and any(m and (n in m or (len(m.split()) >= 3 and m in n)) for m in lines)


def pastes(text: str, lines: tuple[str, ...] | list[str]) -> bool:
    """Does ``text`` contain a whole recalled memory line (≥ 3 words) — a memory pasted back, not a fact said again?"""
    n = normalise(text)
    bodies = [normalise(memory_text(line)) for src in lines for line in src.splitlines()]
    return any(len(b.split()) >= 3 and b in n for b in bodies)
