"""Confirmation: an opening made only of affirmative words ("yes", "spot on", "you got it")."""

from __future__ import annotations

import re

from soul_runtime.models.offline_rules.cleaning import split_sentences
from soul_runtime.models.offline_rules.words import memo

_AFFIRM = frozenset("yes yep yeah yup yea ya aye right correct true indeed exactly precisely absolutely definitely "
                    "certainly affirmative accurate confirmed confirm bingo sure yess yesss mhm mm-hm mmhm uh-huh "
                    "spot-on 100% yesss".split())
_AFFIRM_FILL = frozenset("that that's thats it it's its is was you you're youre are got have does do did totally quite "
                         "100% the one spot on all of course so very well said what i how works good memory "
                         "this sir ma'am as far know afaik believe think for sure".split())


def _affirm_words(clause: str) -> list[str]:
    t = clause.lower().replace("\u2019", "'").replace("spot on", "spot-on")
    return [w for w in re.split(r"[\s,!.;:\u2014\u2013]+|\s-\s", t) if w]


@memo
def confirmation(text: str) -> str | None:
    """The text after an explicit confirmation, or None when ``text`` does not start with one.

    A confirmation is a first clause made only of affirmative words ("yes", "correct", "spot on") and
    empty fillers ("that's", "you got it"), with at least one affirmative and no negation; further
    clauses of the first sentence that are equally empty ("that's what I said") are part of it.
    """
    sentences = split_sentences(text.strip())
    if not sentences:
        return None
    clauses = [c for c in re.split(r"(?<=[,!.;])\s+|\s+[\u2014\u2013-]\s+", sentences[0]) if c.strip()]
    used = 0
    for clause in clauses:
        words = _affirm_words(clause)
        if not words or any(w not in _AFFIRM and w not in _AFFIRM_FILL for w in words):
            break
        if used == 0 and not any(w in _AFFIRM or w == "got" for w in words):
            return None
        used += 1
    if used == 0:
        return None
    rest = " ".join(clauses[used:] + sentences[1:])
    return rest.strip()
