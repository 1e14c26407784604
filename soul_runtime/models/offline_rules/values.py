"""A stated fact (``Statement``) and the cleaning of the values and entities it is made of."""

from __future__ import annotations

import re
from dataclasses import dataclass

from soul_runtime.models.offline_rules.cleaning import attribute_key, clean_value
from soul_runtime.models.offline_rules.words import OPINION, PRONOUNS, STOPWORDS
from soul_runtime.text import singular


@dataclass(frozen=True)
class Statement:
    entity: str  # display form ("Tendril", "Maya")
    attribute: str  # display words ("production database", "likes")
    value: str
    key: str = ""  # attribute key when it is not just the snake_case of ``attribute``

    @property
    def attribute_key(self) -> str:
        return self.key or attribute_key(self.attribute)



_NOT_NAMES = frozenset("not so just really here back off also sorry glad happy good fine ok okay thinking "
                       "going doing feeling still".split())
_CUT = re.compile(r",\s+(?:which|who|but|and|so|because|since|though|as|when|while)\b|\s+(?:because|since|which|"
                  r"although|though|but|more than|better than|over any)\b|\s+[\u2014\u2013]\s+|\s+--?\s+")


def _named(raw: str) -> str:
    """"a woman called Ruth Obi" → "Ruth Obi"; anything else as it is."""
    m = re.match(r"^(?:an?|the|some)\s+(?:[a-z]+\s+){1,2}(?:named|called)\s+(?P<n>[A-Z].*)$", raw.strip())
    return m.group("n") if m else raw


def _value(raw: str, generic: bool = False) -> str:
    """A clean value, or '' for junk: too long, a pronoun, negated, an opinion ("so cool"), a question."""
    v = clean_value(_CUT.split(raw, maxsplit=1)[0])
    v = re.sub(r"^(?:an?\s+)(?=[A-Z0-9])", "", v)
    v = re.sub(r"^(?:based|located|situated|hosted|kept|stored)\s+(?:in|on|at)\s+(?=[A-Z0-9])", "", v)
    words = v.lower().split()
    first = words[1] if len(words) > 1 and words[0] in ("a", "an", "the") else (words or [""])[0]
    bad = not words or len(words) > 8 or words[0] in PRONOUNS or words[0] in ("not", "no", "never") or "?" in v
    return "" if bad or first in OPINION or (generic and not re.match(r"^(?:an?\s|the\s|[A-Z0-9])", v)) else v


def _head(value: str) -> str:
    skip = ("the", "a", "an", "my", "to", "some", "all", "every", "any")
    words = [w for w in re.findall(r"[a-z0-9][\w-]*", value.lower()) if w not in skip]
    return singular(words[0]) if words else ""


def _bad_entity(ent: str, initial: bool) -> bool:
    first = ent.split()[0].lower()
    return first in STOPWORDS or first in _NOT_NAMES or (initial and " " not in ent and first.endswith(("ing", "ly")))
