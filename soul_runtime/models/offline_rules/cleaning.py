"""Normalisation: values cleaned, keys made, sentences and clauses split, fillers dropped."""

from __future__ import annotations

import re

from soul_runtime.models.offline_rules.words import STOPWORDS, memo
from soul_runtime.text import collapse, singular
from soul_runtime.text import fold as normalise

_TRAILING_PUNCT = re.compile(r"[\s,;:.!?\u2014\u2013-]+$")
_TRAILING_NOW = re.compile(r"\s+(?:now|these days|nowadays|by the way|btw)$", re.I)


def clean_value(value: str) -> str:
    v = collapse(value.replace("\u2019", "'")).strip(" \"'`")
    v = _TRAILING_PUNCT.sub("", v)
    v = _TRAILING_NOW.sub("", v)
    return v.strip(" \"'`")


def entity_key(display: str) -> str:
    """"The Tendril" → "tendril": lower-case, spaces collapsed, no leading article."""
    return re.sub(r"^the\s+", "", collapse(display).lower())


def attribute_key(words: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", words.lower().replace("'s", "").replace("favorite", "favourite")).strip("_")


_STOP_NORM = frozenset(w.replace("'s", "").replace("'", "") for w in STOPWORDS)


@memo
def content_words(text: str) -> list[str]:
    return [singular(w) for w in normalise(text).split() if len(w) > 1 and w not in _STOP_NORM and not w.isdigit()]


@memo
def split_sentences(text: str) -> list[str]:
    parts = re.split(r"(?<!\b[DM]r\.)(?<!\bMrs\.)(?<!\bMs\.)(?<!\bSt\.)(?<!\bvs\.)(?<=[.!?])[\"')\]]*\s+(?=\S)|\n+",
                     text.replace("\u2019", "'").strip())
    return [p.strip() for p in parts if p.strip()]


@memo
def split_clauses(sentence: str) -> list[str]:
    parts = re.split(r"\s+[\u2014\u2013]\s+|\s+--?\s+|;\s+|,\s+(?=(?:and\s+|but\s+|so\s+)?(?:now\s+)?(?:I|I'm|my|My|we|We|we've|we're|(?:the|my|our) new)\b)"
                     r"|\s+(?:and|but)\s+(?=(?:I|I'm|my)\b)"
                     r"|,?\s+(?:and|but|while|whereas)\s+(?=(?:the|our|my|its|their)\s+[\w' -]{1,40}?\s(?:is|are)\s)", sentence)
    return [p.strip(" ,") for p in parts if p and p.strip(" ,")]


_FILLER = re.compile(
    r"^(?:(?i:hey there|hey|hi|hello|yo|wow|whoa|oh|ah|aw+|haha\w*|hehe\w*|lol|yeah|yep|yes|yup|sure|ok(?:ay)?|"
    r"well|so|um+|uh+|hmm+|omg|gosh|honestly|anyway|by the way|btw|fyi|also|and|but|just so you know|"
    r"totally agree|i agree|agreed|cool|great|awesome|nice|thanks|thank you|morning|good morning|noted|oh well)"
    r"(?=\W|$)(?:,?\s*[A-Z][a-z]+(?=\s*[,!.]))?\s*[,!.:;\u2014\u2013-]*\s*)+")


@memo
def strip_fillers(sentence: str) -> str:
    s = _FILLER.sub("", sentence.strip()).strip()
    return s[:1].upper() + s[1:] if s else s
