"""Retractions ("X is no longer Y", "forget that") and things said to be gone ("Tomcat was retired")."""

from __future__ import annotations

import re

from soul_runtime.models.offline_rules.changes import _SWAP
from soul_runtime.models.offline_rules.chat import is_hypothetical, is_question
from soul_runtime.models.offline_rules.cleaning import clean_value
from soul_runtime.models.offline_rules.episodes import _third
from soul_runtime.models.offline_rules.relations import trim_time
from soul_runtime.models.offline_rules.words import PRONOUNS, memo
from soul_runtime.text import collapse

_RETRACT = (
    (re.compile(r"^(?P<a>.+?)\s+(?P<v>is|are|am)\s+no longer\s+(?P<b>.+)$", re.I), "{a} {v} {b}"),
    (re.compile(r"^(?P<a>.+?)\s+no longer\s+(?P<v>\w+)\s+(?P<b>.+)$", re.I), "{a} {v} {b}"),
    (re.compile(r"^(?P<a>.+?)\s+(?P<n>doesn't|does not|don't|do not)\s+(?P<v>\w+)\s+(?P<b>.+?)\s+any\s?more$",
                re.I), "{a} {v3} {b}"),
    (re.compile(r"^(?:please\s+)?forget\s+(?:that|about)\s+(?P<a>.+)$", re.I), "{a}"),
)


_I_AM = re.compile(r"\bI'm\b")
_NO_LONGER = re.compile(r"'s no longer\b")
_NOT_ANYMORE = re.compile(r"^(?P<a>.+?)\s+(?P<v>is|are)(?:n't| not)\s+(?P<b>.+?)\s+any ?more$", re.I)
_OOPS = re.compile(r"^(?i:sorry|oops|oh|ah|wait)[,!.\s]+")
_FORGET_THAT = re.compile(r"^(?i:please\s+)?(?i:forget|ignore|scrap|strike|disregard) (?:that|this|what i (?:just )?said)(?:$|[,.;!])")
_NO_LONGER_TRUE = re.compile(r"^(?i:that's|that is|it's|it is) no longer (?:true|the case|right|correct)")


@memo
def parse_retraction(clause: str) -> str | None:
    """The positive statement being withdrawn ("Tendril uses Redis"), '' for "forget that", None if no retraction."""
    s = _NO_LONGER.sub(" is no longer", _I_AM.sub("I am", clean_value(clause.replace("\u2019", "'"))))
    s = _NOT_ANYMORE.sub(r"\g<a> \g<v> no longer \g<b>", s)
    s = _OOPS.sub("", s)
    if _FORGET_THAT.match(s) or _NO_LONGER_TRUE.match(s):
        return ""
    for m, fmt in ((rx.match(s), fmt) for rx, fmt in _RETRACT):
        if m:
            a, v, b = m.group("a"), m.groupdict().get("v") or "", m.groupdict().get("b") or ""
            return collapse(fmt.format(a=a, v=v, b=b, v3=v if re.match(r"^(?i:i|we|you|they)$", a) else _third(v)))
    return None


_GONE = (r"decommissioned|retired|died|stolen|lost|sold|written off|closed|removed|shut down|turned off|switched off|deprecated|sunset|sunsetted|deleted|"
         r"dropped|cancell?ed|discontinued|uninstalled|killed|scrapped|abandoned")
_DROPPED = (re.compile(rf"^(?P<obj>.+?)\s+(?:was|were|has been|have been|got|is being|is now|are now)\s+(?:\w+\s+)?"
                       rf"(?:{_GONE})\b", re.I),
            re.compile(rf"^(?:we|i)\s+(?:\w+\s+)?(?:{_GONE}|got rid of|ditched|stopped using|quit|moved off|"
                       rf"moved away from)\s+(?P<obj>.+)$", re.I),
            re.compile(r"^(?P<obj>.+?)\s+(?:is|are)\s+(?:now\s+)?(?:gone|dead|history|no more)$", re.I),
            re.compile(r"^(?:we|i)\s+stopped\s+\w+ing\s+(?:with|at|in|on|for|to)\s+(?P<obj>.+)$", re.I),
            re.compile(r"^(?P<obj>(?:[A-Z][\w.]*\s*)+|(?i:the|that|this|our|my)\s+[\w -]+?)\s+(?:just\s+)?(?:retired|died|"
                       r"closed|shut down|broke down|went bust|folded|stopped|ended|came to an end|left|quit|resigned|"
                       r"passed away|moved away)$"))


@memo
def parse_dropped(clause: str) -> str:
    """What a clause says is gone ("Tomcat was decommissioned", "we got rid of Jenkins"), else ''."""
    s = re.sub(r"'s (?=gone|dead|history)", " is ", clean_value(clause.replace("\u2019", "'")))
    if _SWAP.match(s):  # "sold the Polo and bought a Yaris": a replacement, not a loss
        return ""
    s = trim_time(s)
    for rx in _DROPPED:
        m = rx.match(s)
        if m and not is_question(clause) and not is_hypothetical(s):
            obj = clean_value(trim_time(re.sub(r"^(?i:the|our|my|that|this)\s+", "", m.group("obj"))))
            return obj if obj and obj.split()[0].lower() not in PRONOUNS else ""
    return ""
