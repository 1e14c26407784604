"""Pure text rules of the offline model: no I/O, no clocks, no randomness.

Normalisation, chit-chat and instruction detection, fact-statement patterns,
confirmation / correction / retraction parsing, task / steps / outcome detection
and the first→third person rewriting used for episode summaries. Everything here
is a plain function of its arguments so the offline model is fully deterministic.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from soul_runtime import text
from soul_runtime.text import collapse, lacks_words, singular
from soul_runtime.text import fold as normalise

GENERIC_SPEAKERS = frozenset({"", "user", "human", "you", "me", "speaker", "unknown"})
# chatter on top of the retrieval stop words: words that carry no fact in conversation
STOPWORDS = text.STOPWORDS | frozenset("""
agree always amazing anything awesome bad bit bye can't care cool day even ever everything feel fine get glad go going
gonna good got great guess haha happy hear hello i'll im isn't kind know later let's like lol look looks lot love many
mean more most much myself never new nice now one please pretty right see something soon sound sounds still stuff super
sure talk thank thanks thing things think time today totally wanna way welcome well won't yep yet you'd you've yours
""".split())
OPINION = frozenset("so really very pretty super too great awesome amazing cool nice good bad fine fun special "
                    "important tough hard easy lovely wonderful fantastic beautiful terrible awful true crazy".split())
PRONOUNS = frozenset("it that this them him her you me us those these they he she there something".split())
SECRET = re.compile(r"(?<![a-z0-9])(?:passwords?(?![ _]manager)|passwd|passphrase|secret|api[ _-]?key|token|credential|private key|ssn)", re.I)

F = TypeVar("F", bound=Callable[..., Any])


def memo(fn: F) -> F:
    """``fn`` (a pure function of hashable arguments) with its recent results remembered: a turn's reply and its
    memory decision parse the same message, and the recent history again each turn. A list result is kept as a
    tuple and handed out as a fresh list, so no caller can change what another one gets."""
    @functools.lru_cache(maxsize=8192)
    def cached(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        return (tuple(out), True) if isinstance(out, list) else (out, False)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        out, was_list = cached(*args, **kwargs)
        return list(out) if was_list else out
    return wrapper  # type: ignore[return-value]


# ---- normalisation -------------------------------------------------------------


def clean_value(value: str) -> str:
    v = collapse(value.replace("\u2019", "'")).strip(" \"'`")
    v = re.sub(r"[\s,;:.!?\u2014\u2013-]+$", "", v)
    v = re.sub(r"\s+(?:now|these days|nowadays|by the way|btw)$", "", v, flags=re.I)
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
                     r"|\s+(?:and|but)\s+(?=(?:I|I'm|my)\b)", sentence)
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


# ---- chit-chat, questions, instructions -----------------------------------------
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


def is_hypothetical(sentence: str) -> bool:
    return bool(re.match(r"^(?:if|maybe|perhaps|what if|suppose|imagine|hopefully|i wonder|i wish)\b",
                         sentence.strip(), re.I)) or (not lacks_words(sentence, _HYPOTHETICAL_WORDS)
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
    """Does ``text`` repeat (contain, or is contained in) one of ``sources`` (persona / recalled "[store id] …" lines)?"""
    n = normalise(re.sub(r"^\s*\[[^\]]*\]", "", text))
    lines = [normalise(re.sub(r"^\s*\[[^\]]*\]", "", line)) for src in sources for line in src.splitlines()]
    return len(n.split()) >= 3 and any(m and (n in m or (len(m.split()) >= 3 and m in n)) for m in lines)


def pastes(text: str, lines: tuple[str, ...] | list[str]) -> bool:
    """Does ``text`` contain a whole recalled memory line (≥ 3 words) — a memory pasted back, not a fact said again?"""
    n = normalise(text)
    bodies = [normalise(re.sub(r"^\s*\[[^\]]*\]", "", line)) for src in lines for line in src.splitlines()]
    return any(len(b.split()) >= 3 and b in n for b in bodies)


# ---- fact statements ------------------------------------------------------------
@dataclass(frozen=True)
class Statement:
    entity: str  # display form ("Tendril", "Maya")
    attribute: str  # display words ("production database", "likes")
    value: str
    key: str = ""  # attribute key when it is not just the snake_case of ``attribute``

    @property
    def attribute_key(self) -> str:
        return self.key or attribute_key(self.attribute)


_ENT = r"(?P<ent>[A-Z][\w.+-]*(?:\s+[A-Z][\w.+-]*){0,3}|[a-z]+-\d+)"
_IS = r"\s+(?:is|are)\s+(?:now\s+)?(?P<val>.+)$"
_NAME = re.compile(r"^(?i:my name is|i'm|i am|call me|this is)\s+(?P<name>[A-Z][a-z]+(?:\s+[A-Z][a-z]+)?)\b(?P<rest>.*)$")
_NOT_NAMES = frozenset("not so just really here back off also sorry glad happy good fine ok okay thinking "
                       "going doing feeling still".split())
_ROLE = re.compile(r"^(?i:i'm|i am|i work as|i'm working as)\s+(?:an?)\s+(?P<role>.+?)"
                   r"(?:\s+(?P<prep>on|in|at|with|for|of)\s+(?:the\s+)?(?P<rest>.+))?$")
_ROLE_BAD = frozenset("bit little lot big huge great good real total bad mess wreck part fan kind sort "
                      "couple few while".split())
_TEAM = re.compile(r"^(?i:i'm|i am|i work|i'm working)\s+(?i:on|in|with|for)\s+(?:the\s+)?(?P<team>.+?\bteam)$")
_WORK_AT = re.compile(r"^(?i:i work|i'm working|i am working)\s+(?i:at|for)\s+(?P<org>[A-Z].*)$")
_FROM = re.compile(r"^(?i:i'm|i am|i come)\s+(?i:originally\s+)?from\s+(?P<val>[A-Z].*)$")
_LIVE = re.compile(r"^(?i:i live|i'm living|i am living|i moved|i've moved|i just moved|i'm based|i am based|i'm located|"
                   r"i am located)\s+(?i:in|to)\s+(?P<val>[A-Z].*)$")
_PREF1 = re.compile(r"^(?i:i)\s+(?:(?i:really|also|just|totally|absolutely|still|much|do)\s+)?"
                    r"(?P<verb>(?i:prefer|like|love|enjoy|hate|dislike|use))\s+(?P<val>.+)$")
_PREF3 = re.compile(r"^" + _ENT + r"\s+(?P<verb>prefers|likes|loves|enjoys|hates|dislikes|uses|runs on)\s+(?P<val>.+)$")
_MY = re.compile(r"^(?i:my)\s+(?P<att>[a-z][a-z' -]{0,40}?)" + _IS)
_POSS = re.compile(r"^(?:[Tt]he\s+)?" + _ENT + r"'s\s+(?P<att>[a-z][a-z' ]{0,40}?)" + _IS)
_OF = re.compile(r"^(?:[Tt]he\s+)?(?P<att>[a-z][a-z ]{0,40}?)\s+(?:of|for)\s+(?:the\s+)?" + _ENT + _IS)
_CAP_ATTR = re.compile(r"^(?:[Tt]he\s+)?" + _ENT + r"\s+(?P<att>[a-z][a-z ]{0,40}?)" + _IS)
_X_IS = re.compile(r"^" + _ENT + _IS)
_I_ADJ = re.compile(r"^(?i:i'm|i am)\s+(?:(?i:very|quite|really|severely|mildly|also|still|now)\s+)?"
                    r"(?P<adj>[a-z]+(?:ic|ed|ent|ant|ive))\s+(?P<prep>to|of|with|from|in|on)\s+(?P<val>.+)$")
_I_AT = re.compile(r"^(?i:i've been|i have been|i'm|i am|i've worked|i have worked)\s+(?P<prep>at|with)\s+(?P<val>[A-Z].*)$")
_I_VERB = re.compile(r"^(?:(?i:i)|(?i:we)(?=\s+[a-z]+\s+(?:to|with|at|for|on|in|by)\s))\s+(?:(?i:also|still|now|currently|mostly|usually|always|normally)\s+)?(?P<verb>[a-z]{2,})\s+"
                     r"(?:(?P<prep>to|with|at|for|on|in|by)\s+)?(?:(?i:a|an|the)\s+)?(?P<val>(?:Dr\.\s+)?[A-Z0-9][\w.+-]*"
                     r"(?:\s+[\w.+-]+){0,4})$")
_MY_AFTER = re.compile(r"^(?:(?P<val>[A-Z0-9][\w.+' -]{0,40}?),\s+(?i:that's|that is|it's|it is)\s+my\s+(?P<att>[a-z][\w' -]{0,30})"
                       r"|(?i:still\s+|always\s+)?(?i:my)\s+(?P<att2>[a-z][\w' -]{0,30}):\s*(?P<val2>.+))$")
_NOT_HABIT = frozenset("am was were had did said told think thought know knew met saw visited went got made took gave "
                       "found heard read ran wrote bought sold left came mean meant guess hope wish wonder want need "
                       "asked called emailed texted pinged love like prefer enjoy hate dislike use".split())
_PREF_BASE = {"prefer": "prefers", "like": "likes", "love": "likes", "enjoy": "likes", "hate": "dislikes",
              "dislike": "dislikes", "use": "uses", "runs on": "runs on"}
_CUT = re.compile(r",\s+(?:which|who|but|and|so|because|since|though|as|when|while)\b|\s+(?:because|since|which|"
                  r"although|though|but)\b|\s+[\u2014\u2013]\s+|\s+--?\s+")


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


def find_name(text: str) -> str:
    """A self-introduced name ("I'm Maya", "my name is Maya"), else ''."""
    clauses = [c for sentence in split_sentences(text) for c in split_clauses(strip_fillers(sentence))]
    names = [m.group("name") for m in map(_NAME.match, clauses) if m]
    return next((n for n in names if n.split()[0].lower() not in _NOT_NAMES), "")


@memo
def parse_statements(clause: str, subject: str) -> list[Statement]:
    """Facts stated in one clause; first person maps to ``subject`` (skipped when '')."""
    out = _statements(clause, subject)
    if subject:
        out = [Statement(st.entity, st.attribute, re.sub(r"\b[Mm]y\b", subject + "'s", st.value), st.key) for st in out]
    return out


def _statements(clause: str, subject: str) -> list[Statement]:
    s = clean_value(re.sub(r"^(?i:i think|i believe|i guess|remember|note|just so you know)(?:\s+that)?[,\s]+", "",
                           clause.replace("\u2019", "'")))
    if not s or is_question(clause) or is_hypothetical(s) or is_hearsay(s):
        return []
    s = _plain_form(s)
    out: list[Statement] = []
    if subject:
        m = _NAME.match(s)
        if m and m.group("name").split()[0].lower() not in _NOT_NAMES:
            out.append(Statement(subject, "name", m.group("name")))
            rest = m.group("rest").strip(" ,")
            if re.match(r"^(?i:and\s+)?(?i:an?)\s", rest):
                out += _statements("I am " + re.sub(r"^(?i:and\s+)", "", rest), subject)
            return out
        m = _ROLE.match(s)  # "I'm a senior SRE on the platform team", "I'm a big fan of jazz"
        if m:
            role, rest, prep = clean_value(m.group("role")), clean_value(m.group("rest") or ""), m.group("prep")
            if re.match(r"^(?:big |huge )?fan$", role, re.I) and rest and prep == "of":
                return [Statement(subject, "likes", rest, "likes_" + _head(rest))]
            if prep == "of" and rest and role.split()[-1].lower() in ("member", "part", "fan", "founder", "head", "chair",
                                                                     "captain", "leader", "president", "owner"):
                role, rest = f"{role} of {rest}", ""
            ok_role = role.split()[0].lower() not in _ROLE_BAD and len(role.split()) <= 7 and _value(role)
            out += [Statement(subject, "role", role)] if ok_role else []
            out += [Statement(subject, "team", rest)] if rest.lower().endswith("team") else [Statement(
                subject, "employer", _value(rest))] if rest[:1].isupper() and prep in ("at", "for") and _value(rest) else []
            return out
        for rx, att in ((_TEAM, "team"), (_WORK_AT, "employer"), (_FROM, "origin"), (_LIVE, "lives in")):
            m = rx.match(s)
            if m and _value(m.group(1)):
                return [Statement(subject, att, _value(m.group(1)))]
        m = _I_ADJ.match(s)  # "I'm intolerant of lactose", "I'm engaged to Remi"
        if m and _value(m.group("val")):
            return [Statement(subject, f"{m.group('adj').lower()} {m.group('prep').lower()}", _value(trim_time(m.group("val"))))]
        m = _I_AT.match(s)  # "I've been at Initech since 2019"
        if m and _value(trim_time(m.group("val"))):
            return [Statement(subject, m.group("prep").lower(), _value(trim_time(m.group("val"))))]
        m = _PREF1.match(s)
        if m:
            v = _value(re.sub(r"^(?i:to)\s+", "", m.group("val")))
            base = _PREF_BASE[m.group("verb").lower()]
            return [Statement(subject, base, v, attribute_key(base) + "_" + _head(v))] if v and _head(v) else []
        m = _MY.match(s)  # "my favourite editor is Helix", "my dog's name is Max"
        if m and _value(m.group("val")):
            val = re.sub(r"^(?:on|at|in)\s+(?=[A-Z0-9]|(?:mon|tues|wednes|thurs|fri|satur|sun)day)", "", m.group("val"))
            return [Statement(subject, m.group("att").replace("'s", "").strip(), _value(trim_time(_named(val))))]
        m = _MY_AFTER.match(s)  # "Site manager, that's my role", "still my favourite book: Dune"
        if m and _value(m.group("val") or m.group("val2")):
            return [Statement(subject, (m.group("att") or m.group("att2")).strip(),
                              _value(trim_time(m.group("val") or m.group("val2"))))]
        m = _I_VERB.match(s)  # "I ride a Cube", "I follow Celtic", "I shop at Aldi": a verb and a named object
        if m and m.group("verb").lower() not in _NOT_HABIT and not m.group("verb").lower().endswith("ed") and _value(
                trim_time(m.group("val"))) and not (s[:2].lower() == "we" and is_timeish(trim_time(m.group("val")))):
            att = f"{m.group('verb').lower()} {(m.group('prep') or '').lower()}".strip()
            return [Statement(subject, att, _value(trim_time(m.group("val"))))]
    rel = parse_relation(s, subject)
    if rel:
        return rel
    if re.match(r"^(?i:i|i'm|i've|my|me|we|our|he|she|they|it|this|that|there|his|her|their|its)\b", s):
        return []
    m = _PREF3.match(s)
    if m and not _bad_entity(m.group("ent"), True):
        verb = m.group("verb")
        v, base = _value(m.group("val")), _PREF_BASE.get(verb[:-1]) or _PREF_BASE.get(verb, verb)
        return [Statement(m.group("ent"), base, v, attribute_key(base) + "_" + _head(v))] if v and _head(v) else []
    for rx in (_POSS, _OF, _CAP_ATTR):
        m = rx.match(s)
        if m and _value(m.group("val")) and not _bad_entity(m.group("ent"), m.start("ent") == 0):
            att = m.group("att").replace("'s", "").strip()
            if att.split()[-1] in ("and", "or", "with", "to", "has", "was", "who") or len(att.split()) > 4:
                continue
            return [Statement(m.group("ent"), att, _value(m.group("val")))]
    m = _X_IS.match(s)
    v = _value(m.group("val"), generic=True) if m and not _bad_entity(m.group("ent"), True) else ""
    return [Statement(m.group("ent"), "description", v)] if m and v else []


# ---- confirmation, correction, retraction --------------------------------------
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


_CORR_MARK = re.compile(r"^(?i:actually|correction|sorry|wait|oops|no|nope|not quite|i meant|my mistake|wrong|incorrect|"
                        r"scratch that)\b[\s,:;!.\u2014-]*(?P<rest>.*)$")
_BARE = re.compile(r"^(?i:it's|it is|it was|that's|that is|it should be|should be|make that|make it|i meant|"
                   r"it's actually|it is actually)\s+(?P<val>.+)$")
_NOT_BUT = re.compile(r"^(?i:(?:no,?\s*)?(?:it's\s+|it is\s+)?not)\s+(?P<old>.+?)(?:,\s*(?i:but\s+)?|\s+(?i:but)\s+)"
                     r"(?P<new>.+)$")
_BUT_NOT = re.compile(r"^(?i:it's|it is)\s+(?P<new>.+?),\s*(?i:not)\s+(?P<old>.+)$")


@dataclass(frozen=True)
class Correction:
    statement: str = ""  # a full statement to parse ("the Tendril production database is Postgres 16")
    value: str = ""  # a bare new value ("Postgres 16", "16")
    old_hint: str = ""  # the old value when named ("not 15, 16")


@memo
def parse_correction(clause: str) -> Correction | None:
    s = clause.strip().replace("\u2019", "'")
    s = re.sub(r"^(?i:it|that)\s+(?:isn't|is not|'s not)\s+(?P<old>.+?)\s+(?:any ?more|now)(?=,)", r"it is not \g<old>", s)
    s = re.sub(r"^(?i:it|that)\s+isn't\b", "it is not", s)
    for rx in (_BUT_NOT, _NOT_BUT):
        m = rx.match(re.sub(r"^(?i:no|nope|actually),?\s+(?=(?i:it|not))", "", s))
        if m and len(m.group("new").split()) <= 6 and clean_value(m.group("new")):
            return Correction(value=clean_value(re.sub(r"^(?i:it's|it is)\s+", "", m.group("new"))),
                              old_hint=clean_value(m.group("old")))
    if re.search(r"\s(?i:is|are) actually\s", s):
        return Correction(statement=re.sub(r"\s+actually\b", "", s, count=1, flags=re.I))
    m = _CORR_MARK.match(s)
    if not m or not m.group("rest"):
        return None
    rest = clean_value(m.group("rest"))
    b = _BARE.match(rest)
    if b or re.search(r"\s(?:is|are)\s", rest):
        return Correction(value=clean_value(b.group("val"))) if b else Correction(statement=rest)
    bare = len(rest.split()) <= 4 and not re.match(r"^(?i:i|we|thanks|thank|worries|problem|way|idea)\b", rest)
    return Correction(value=rest) if bare else None


def replace_number(old: str, new_number: str) -> str:
    """The last number of ``old`` replaced ("Postgres 15", "16" → "Postgres 16")."""
    nums = list(re.finditer(r"\d+(?:\.\d+)*", old))
    return old[:nums[-1].start()] + new_number + old[nums[-1].end():] if nums else new_number


_RETRACT = (
    (re.compile(r"^(?P<a>.+?)\s+(?P<v>is|are|am)\s+no longer\s+(?P<b>.+)$", re.I), "{a} {v} {b}"),
    (re.compile(r"^(?P<a>.+?)\s+no longer\s+(?P<v>\w+)\s+(?P<b>.+)$", re.I), "{a} {v} {b}"),
    (re.compile(r"^(?P<a>.+?)\s+(?P<n>doesn't|does not|don't|do not)\s+(?P<v>\w+)\s+(?P<b>.+?)\s+any\s?more$",
                re.I), "{a} {v3} {b}"),
    (re.compile(r"^(?:please\s+)?forget\s+(?:that|about)\s+(?P<a>.+)$", re.I), "{a}"),
)


@memo
def parse_retraction(clause: str) -> str | None:
    """The positive statement being withdrawn ("Tendril uses Redis"), '' for "forget that", None if no retraction."""
    s = re.sub(r"'s no longer\b", " is no longer", re.sub(r"\bI'm\b", "I am", clean_value(clause.replace("\u2019", "'"))))
    s = re.sub(r"^(?P<a>.+?)\s+(?P<v>is|are)(?:n't| not)\s+(?P<b>.+?)\s+any ?more$", r"\g<a> \g<v> no longer \g<b>", s, flags=re.I)
    s = re.sub(r"^(?i:sorry|oops|oh|ah|wait)[,!.\s]+", "", s)
    if re.match(r"^(?i:please\s+)?(?i:forget|ignore|scrap|strike|disregard) (?:that|this|what i (?:just )?said)(?:$|[,.;!])", s) or re.match(
            r"^(?i:that's|that is|it's|it is) no longer (?:true|the case|right|correct)", s):
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


# ---- tasks ------------------------------------------------------------------------
TASK_VERBS = frozenset("draft write prepare compose review summarise summarize create update fix deploy investigate "
                       "plan schedule send book set migrate analyse analyze document compile triage debug build "
                       "rotate run organise organize publish test refactor upgrade outline".split())
_VERB_ALIAS = {"summarize": "summarise", "analyze": "analyse", "organize": "organise"}
_VERB_GROUP = {"write": "draft", "prepare": "draft", "compose": "draft", "draft": "draft"}
_REQ = re.compile(r"^(?:(?i:hey|ok|okay|so|and|also|now|next|then|alright)\W+)?(?P<lead>(?i:can|could|would|will)\s+"
                  r"you\s+(?:please\s+)?|(?i:please)\s+|(?i:i\s+need|i'd\s+like|i\s+want|i\s+would\s+like)\s+you\s+to\s+"
                  r"|(?i:help\s+me)\s+)?(?P<verb>[A-Za-z]+)\b(?:\s+(?P<part>up|out|together))?\s+(?P<rest>.+)$")
_NP_END = re.compile(r"\s+(?:for|of|on|about|to|with|from|in|into|by|before|after|so|and|that|which|using|this|"
                     r"when|please|again|too|as|like|based)\b|[,.:;?!\u2014\u2013(]")
_IMPERATIVE_OBJ = r"(?i:the|a|an|another|my|our|this|that|some|me|us)\s"
_DETS = frozenset("the a an another my our your this that these those new some its their his her quick short brief "
                  "full first next same one more".split())

_PLANS = {k: tuple(v.split(", ")) for k, v in (
    ("draft", "gather inputs, outline, write draft, review"), ("review", "read it through, note issues, summarise feedback"),
    ("summarise", "collect the material, pick the key points, write the summary"),
    ("fix", "reproduce the problem, find the cause, apply the fix, verify"),
    ("deploy", "check prerequisites, apply the change, verify, announce"), ("plan", "collect constraints, propose options, confirm"))}
_PLAN_OF = {"investigate": "fix", "debug": "fix", "triage": "fix", "migrate": "deploy", "upgrade": "deploy",
            "rotate": "deploy", "publish": "deploy", "schedule": "plan", "book": "plan", "organise": "plan",
            "analyse": "summarise", "compile": "summarise", "outline": "draft", "document": "draft"}


def parse_request(sentence: str) -> tuple[str, str] | None:
    """(verb, request body) of a task request ("Can you draft the postmortem for incident-204?")."""
    s = strip_fillers(sentence.replace("\u2019", "'")).rstrip("?!. ")
    m = _REQ.match(s)
    verb = _VERB_ALIAS.get(m.group("verb").lower(), m.group("verb").lower()) if m else ""
    if not m or verb not in TASK_VERBS or (verb == "set" and m.group("part") != "up") or (not m.group("lead") and not
                                                                                        re.match(_IMPERATIVE_OBJ, m.group("rest"))):
        return None
    body = s[m.start("verb"):]
    return verb + (" up" if verb == "set" else ""), body[:1].lower() + body[1:]


def task_class(text: str) -> str | None:
    """"draft postmortem": verb + head noun of the object, ids and specifics dropped."""
    for verb, body in filter(None, map(parse_request, split_sentences(text))):
        rest = re.sub(r"^[A-Za-z]+(?:\s+(?:up|out|together))?\s+", "", body)
        np = _NP_END.split(rest + " ", maxsplit=1)[0]
        words = [w for w in np.split() if w.lower() not in _DETS and not re.search(r"\d", w) and not w[:1].isupper()
                 and w.isascii() and re.match(r"^[a-z-]+$", w)]
        if words:
            return f"{verb} {singular(words[-1])}"
    return None


def same_task(a: str, b: str) -> bool:
    """Same head noun and the same verb (or a synonym: draft / write / prepare / compose)."""
    (va, _, na), (vb, _, nb) = a.rpartition(" "), b.rpartition(" ")
    return na == nb and _VERB_GROUP.get(va, va) == _VERB_GROUP.get(vb, vb)


def default_plan(task: str) -> tuple[str, ...]:
    v = task.split()[0]
    return _PLANS.get(_PLAN_OF.get(v, _VERB_GROUP.get(v, v)), ("understand the request", "do the work", "review"))


def _clean_step(step: str, speaker: str) -> str:
    s = clean_value(re.sub(r"^(?i:and|then|first(?:ly)?|next|finally|lastly|after that|\d{1,2}[.)])[,\s]+", "",
                           step.strip()))
    if speaker:
        s = re.sub(r"\bme\b", speaker, re.sub(r"\bmy\b", speaker + "'s", s))
    return s[:1].lower() + s[1:] if len(s) > 1 and not s[1:2].isupper() else s


def parse_steps(text: str, speaker: str = "") -> tuple[str, ...]:
    """Steps given by the user: a numbered list, "first …, then …, finally …", or a list after a colon."""
    t = text.replace("\u2019", "'")
    items = re.findall(r"(?:^|\s|:)(\d{1,2})[.)]\s+(.+?)(?=\s+\d{1,2}[.)]\s+|\s*$)", t, re.S)
    if len(items) >= 2 and [int(n) for n, _ in items] == list(range(1, len(items) + 1)):
        return tuple(s for s in (_clean_step(x, speaker) for _, x in items) if s)
    candidates = []
    m = re.search(r"\bfirst(?:ly)?\b,?\s+(.+)$", t, re.I | re.S)
    if m and re.search(r"\b(?:then|finally|next|lastly)\b", m.group(1), re.I):
        candidates.append(re.split(r",?\s*(?:and\s+)?\b(?:then|next|after that|finally|lastly)\b,?\s*", m.group(1),
                                   flags=re.I))
    for m in re.finditer(r"(?:\bsteps?\b[^:]{0,20}|\w):\s*(.+)$", t, re.I | re.S):
        body = re.split(r"(?<=[.!?])\s+(?=[A-Z])", m.group(1).strip())[0]
        candidates.append(body.split(";") if ";" in body else body.split(","))
    for parts in candidates:
        steps = tuple(s for s in (_clean_step(p, speaker) for p in parts) if s)
        if len(steps) >= 2:
            return steps
    return ()


_FAIL = re.compile(r"\b(?:that|it|this) (?:failed|broke)|\bfail(?:ed|ing|s)\b|\bdidn't work\b|\bdid not work\b|"
                   r"\bbroke\b|\brolled (?:it )?back\b|\brollback\b|\breverted\b|\bwas rejected\b|\bgot rejected\b|"
                   r"\bno luck\b|\bwent wrong\b|\bgave up\b", re.I)
_SUCCESS = re.compile(r"\bshipped\b|\b(?:that|it|this|everything|all) (?:worked|passed)\b|\bworked (?:fine|well|great|"
                      r"perfectly|out|like a charm)\b|\bdone,? thanks\b|"
                      r"\blooks good\b|\blooks great\b|\bpublished\b|\bmerged\b|\bwent out\b|\bis live\b|"
                      r"\bsucceeded\b|\bwas a success\b|\bsuccess(?:ful(?:ly)?)?\b|\bnailed it\b|\ball (?:done|good|fine)\b|"
                      r"\bwent (?:\w+ )?(?:fine|well|smoothly|great|ok(?:ay)?|through)\b|\bturned out (?:\w+ )?"
                      r"(?:great|fine|well|perfect|nice|good)\b|\bno (?:issues|problems|errors|hiccups)\b|"
                      r"\bwithout (?:any )?(?:issues|problems|errors|a hitch)\b|\bsmooth(?:ly)?\b", re.I)
# a report's closing word ("… pumped the tyres. Fine." / "Done! …"): an outcome only after steps were told
_SUCCESS_SHORT = re.compile(r"(?:^|[.!;]\s+)(?:done|finished|completed|worked|perfect|excellent|fine|good|great|sorted)\b",
                            re.I)


@memo
def detect_outcome(text: str, reported: bool = False) -> str:
    """"success" ("it shipped", "that worked", "went fine"), "failure" ("that failed", "rolled back") or ''.
    ``reported``: the text tells a task with its steps, so a closing "Done." or "Fine." is an outcome too."""
    t = text.replace("\u2019", "'")
    negated = re.search(r"(?:\bnot|n't|\bnever|\byet to)\s+(?:\w+\s+)?(?:shipped|worked|published|merged|been|done|"
                        r"finished|successful|smooth(?:ly)?)\b|\bnot yet\b|\bif it\b", t, re.I)
    ok = _SUCCESS.search(t) or (reported and _SUCCESS_SHORT.search(t))
    return "failure" if _FAIL.search(t) else "success" if ok and not negated else ""


_SAVE_VERB = r"(?:save|store|keep|remember|record|memori[sz]e|note|write|jot|add|make|file|log)"
_SAVE_WHAT = (r"(?:procedure|workflow|playbook|runbook|process|template|checklist|routine|recipe|sop|steps|"
              r"how (?:to|i|we) (?:do|did|handle|handled) (?:it|this|that)|the way (?:to do it|i do it|we do it)|"
              r"for (?:next time|the future|later|future reference))")


@memo
def save_requested(text: str) -> bool:
    """Does the user ask to keep what they just described as a procedure ("store it as a playbook", "remember
    the steps for later", "hold on to that as a runbook, could you?")? Not when negated or asked about."""
    for sentence in split_sentences(text.replace("\u2019", "'")):
        s = strip_fillers(sentence)
        m = re.search(rf"\b{_SAVE_VERB}\b(?:\s+(?:down|up|away))?\b(?P<rest>.*)$", s, re.I)
        if not m:
            continue
        head, rest = s[: m.start()], m.group("rest")
        if re.search(r"\b(?:don't|do not|no need to|never|not|won't|shouldn't|can't)\s+(?:\w+\s+)?$", head, re.I):
            continue
        asked = is_question(sentence) and not re.match(r"^(?i:could|can|would|will)\s+you\b", s) and not re.search(
            r",\s*(?:would|will|could|can) you\??$|\bplease\b", s, re.I)
        if asked or re.match(r"^(?i:should|shall|do|does|is|are|must|would|will)\s+(?:i|we|it|you think)\b", s):
            continue
        verb = m.group(0).split()[0].lower()
        if verb in ("add", "file", "log") and not re.search(r"\bto (?:your|the|our|my) (?:procedures|runbooks?|playbooks?|"
                                                             r"checklists?|routines?|workflows?)\b", rest, re.I):
            continue
        if verb in ("make", "write", "jot", "note") and not re.search(_SAVE_WHAT, rest, re.I) and not (
                verb == "note" and re.search(r"\bdown\b", m.group(0), re.I)):
            continue
        if re.search(_SAVE_WHAT, rest, re.I) or re.match(r"^\s*(?:it|this|that|these|those|them)\s*(?:,?\s*please)?\W*$",
                                                         rest, re.I) and verb in ("save", "store", "keep", "record"):
            return True
        if re.match(r"^\s*(?:(?:all\s+)?(?:this|that|these|those|it)\s+)?(?:down\s+)?(?:as|for|to)\b", rest, re.I) and \
                re.search(_SAVE_WHAT, rest, re.I):
            return True
    return False


# ---- procedures described in ordinary words ------------------------------------------
# "To reset the router I unplug it, wait a minute and plug it back in." / "Tuned the bike today:
# oiled the chain, trued the wheel, pumped the tyres. Worked fine." A description is a title (what the task
# is) and two or more steps; its class is the title's content words, stemmed and in a fixed order, so the
# same task named in other words ("tuned the bike" / "the bike tune") gets the same class.
_LIGHT = frozenset("do did does done doing make made makes making finish finished complete completed get got have had "
                   "another again once more one two three four five third second first last next same whole today "
                   "tonight yesterday morning afternoon evening week month year weekly daily monthly nightly time "
                   "round bit usual quick here how process routine procedure steps step way drill like goes go "
                   "went this that these those there out".split())
_COMPOUND = {"backup": "back", "setup": "set", "cleanup": "clean", "rollout": "roll", "signup": "sign", "login": "log",
             "checkup": "check", "shutdown": "shut", "startup": "start", "teardown": "tear", "walkthrough": "walk"}
_STEP_LEAD = re.compile(r"^(?:(?:and|then|first(?:ly)?|next|finally|lastly|after that|afterwards|once that's done|"
                        r"\d{1,2}[.)])[,\s]+|(?:i|we)\s+(?=[a-z]))+", re.I)
_NOT_VERB = frozenset("the a an my our your their his her its this that these those it i we you he she they there "
                      "some any all every each no not one two three".split())


def task_stem(word: str) -> str:
    """A crude stem shared by a verb and its nouns: approved / approval → approv; migration / migrate → migrat."""
    w = word.lower().strip("'-")
    w = _COMPOUND.get(w, w)
    for suf, rep in (("ations", "at"), ("ation", "at"), ("ments", ""), ("ment", ""), ("als", ""), ("al", ""),
                     ("ies", "y"), ("ing", ""), ("ed", ""), ("es", ""), ("s", ""), ("e", "")):
        if w.endswith(suf) and len(w) - len(suf) >= 3:
            w = w[: -len(suf)] + rep
            break
    return w[:-1] if len(w) > 3 and w[-1] == w[-2] and w[-1] not in "ls" else w


_LIGHT_STEMS = frozenset(task_stem(w) for w in _LIGHT)
_COMPOUND_OF = {(stem, part): word for word, stem in _COMPOUND.items()
                for part in ("up", "out", "down", "in", "through") if word == stem + part}


def title_class(title: str) -> str:
    """The task class a title names: its content words in order, without light verbs, times and fillers."""
    words = normalise(title).split()
    words = [_COMPOUND_OF.get((task_stem(w), nxt), w) for w, nxt in zip(words, [*words[1:], ""][:len(words)],
                                                                             strict=True)]
    words = [w for w in words if w.isalpha() and len(w) > 1 and w not in _LIGHT
             and w not in _STOP_NORM and w not in PRONOUNS and task_stem(w) not in _LIGHT_STEMS]
    return " ".join(list(dict.fromkeys(words))[:5])


def similar_task(a: str, b: str) -> bool:
    """Two titled classes name the same task: one's stems contain the other's, or they share most of them."""
    x, y = {task_stem(w) for w in a.split()}, {task_stem(w) for w in b.split()}
    if not x or not y:
        return False
    common = len(x & y)
    return (common >= 1 and (x <= y or y <= x)) or common / len(x | y) >= 0.5


def _split_items(body: str) -> list[str]:
    parts = re.split(r",\s*(?:and\s+|then\s+|and then\s+)?|;\s*|\s+(?:and then|then)\s+", body)
    out: list[str] = []
    for p in parts:  # "printed the form and signed it": two steps when both halves start like a verb phrase
        halves = re.split(r"\s+and\s+(?=[a-z][a-z-]*\s+\S)", p)
        if len(halves) > 1 and all(_verbish(h) for h in halves):
            out += halves
        else:
            out.append(p)
    return out


def _verbish(item: str) -> bool:
    first = _STEP_LEAD.sub("", item.strip()).split()
    return bool(first) and bool(re.fullmatch(r"[a-z][a-z-]*", first[0])) and first[0] not in _NOT_VERB and len(first) >= 2


def _list_steps(body: str, speaker: str) -> tuple[str, ...]:
    """Steps of a run-on list ("unplug it, wait a minute and plug it back in"); () unless ≥ 2 look
    like verb phrases and none is a bare noun."""
    body = split_sentences(body)[0] if split_sentences(body) else body
    items = [i for i in (x.strip(" .") for x in _split_items(body.rstrip(". "))) if i]
    if len(items) < 2 or not all(_verbish(i) or _verbish(i[:1].lower() + i[1:]) for i in items):
        return ()
    steps = tuple(s for s in (_clean_step(_STEP_LEAD.sub("", i), speaker) for i in items) if s)
    return steps if len(steps) >= 2 else ()


_TITLE_SEP = re.compile(r"\s*(?::|\s[\u2014\u2013-]\s)\s*")
_TITLE_LEAD = re.compile(r"^(?:(?:here's|here is|this is|that's) how (?:i|we)\s+|(?:i|we)\s*(?:need|have|want|am going|'m going|"
                         r"'re going|are going|plan|planned|got|'ve got|must|'ll|will|should)\s+(?:to\s+)?|time to\s+|gotta\s+|"
                         r"let's\s+|(?:my|our) (?:process|routine|procedure|"
                         r"way|checklist|steps?) (?:for|to|when)\s+|steps? (?:to|for)\s+|how (?:i|we|to)\s+)", re.I)
_TITLE_TAIL = re.compile(r"\s+(?:goes like this|works like this|is done like this|is like this|looks like this|"
                         r"process|routine|procedure|checklist|steps)$", re.I)


def _title(raw: str) -> str:
    t = clean_value(re.sub(r"^(?:ok(?:ay)?|so|well|alright)[,\s]+", "", raw.strip(), flags=re.I))
    t = _TITLE_TAIL.sub("", _TITLE_LEAD.sub("", t))
    return t


@memo
def parse_procedure(text: str, speaker: str = "") -> tuple[str, tuple[str, ...]] | None:
    """(title, steps) of a task described or reported with its steps; title '' when it only lists steps."""
    t = text.replace("\u2019", "'").strip()
    sentences = split_sentences(t)
    if not sentences or is_hypothetical(sentences[0]) or re.match(r"^(?i:hypothetically|in theory|i guess|"
                                                                  r"i suppose)\b", sentences[0]):
        return None
    first = strip_fillers(sentences[0])
    # "To X, I a, b and c." / "When X, we a, b, c." / "For X I a, b, c." / "I X by a-ing, b-ing and c-ing."
    m = re.match(r"^(?P<lead>to|when|whenever|for|before|after)\s+(?P<title>.+?),?\s+(?:i|we)\s+(?P<body>(?!\w+\s+(?:it|"
                 r"that|this)\s*$).+)$", first, re.I)
    if m and not re.match(r"^(?:a|an)\s+\w+$", m.group("title")):
        steps = _list_steps(m.group("body"), speaker)
        if steps:
            return _title(m.group("title")), steps
    m = re.match(r"^(?:i|we)\s+(?P<title>.+?)\s+by\s+(?P<body>\w+ing\b.+)$", first, re.I)
    if m:
        steps = _list_steps(m.group("body"), speaker)
        if steps:
            return _title(m.group("title")), steps
    # "TITLE: a, b, c" / "TITLE - a, b, c" / numbered / first … then …
    m = _TITLE_SEP.search(t)
    if m and len(t[: m.start()].split()) <= 12 and "\n" not in t[: m.start()]:
        head, body = t[: m.start()], t[m.end():]
        head = strip_fillers(split_sentences(head)[-1]) if split_sentences(head) else head
        steps = parse_steps(body, speaker) or _list_steps(re.sub(r"^(?:i|we)\s+", "", body, flags=re.I), speaker)
        if steps and not is_question(head):
            steps = tuple(_cut(_STEP_LEAD.sub("", s)) for s in steps)
            return _title(re.sub(r"^(?i:done|finished|all done)\W*$", "", head)), steps
    # "TITLE. (First) I a, (then) b, (and) c."
    for i, sentence in enumerate(sentences[1:3], start=1):
        body = strip_fillers(sentence)
        steps = parse_steps(body, speaker) or _list_steps(re.sub(r"^(?:i|we)\s+", "", body, flags=re.I), speaker)
        if steps:
            head = strip_fillers(sentences[i - 1])
            return ("" if re.fullmatch(r"(?i:done|finished|all done|completed|ok|okay)?\W*", head) or is_question(head)
                    else _title(head)), tuple(_cut(_STEP_LEAD.sub("", s)) for s in steps)
    # a list with no title at all: "Done! I printed the form, signed it and posted it."
    body = re.sub(r"^(?i:done|finished|all done|completed)\W+(?:(?:i|we)\s+)?", "", first)
    if body != first:
        steps = _list_steps(body, speaker)
        if steps:
            return "", steps
    return None


def _cut(step: str) -> str:
    """A step without a following sentence ("posted it. Everything went through" → the first part)."""
    return clean_value(re.split(r"(?<=[a-z0-9])\.\s+(?=[A-Z])", step)[0])


# ---- episodes -------------------------------------------------------------------
_PRESENT = frozenset("love like want need think feel hope know prefer enjoy work live plan try miss wish believe "
                     "hate run use paint play read write take make get keep find see mean own teach study volunteer look "
                     "guess agree remember lead manage say go do have don't haven't am".split())
_ADV = r"(?:really|also|just|still|totally|always|never|usually|often|actually|sometimes|definitely|even|only)"


def _third(verb: str) -> str:
    irregular = {"have": "has", "do": "does", "don't": "doesn't", "haven't": "hasn't", "am": "is", "go": "goes"}
    if verb in irregular or (verb.endswith("y") and verb[-2:-1] not in "aeiou"):
        return irregular.get(verb) or verb[:-1] + "ies"
    return verb + ("es" if verb.endswith(("s", "sh", "ch", "x")) else "s")


def to_third_person(text: str, name: str) -> str:
    """Rewrite first person as ``name``: I→Maya, I'm→Maya is, my→Maya's, me→Maya."""
    contractions = {"m": " is", "ve": " has", "d": " would", "ll": " will"}
    intro = r"\b(?:[Ii]'m|I am|[Mm]y name is|[Tt]his is)\s+" + re.escape(name) + r"\b"
    t = re.sub(intro + r",?\s+(?:and\s+)?(?:I'm\s+|I am\s+)?(?=an?\s)", name + " is ", text.replace("\u2019", "'"))
    t = re.sub(intro, name + " introduced themself", t)

    def subj(m: re.Match[str]) -> str:
        verb = (m.group("verb") or "").strip()
        verb = " " + _third(verb.lower()) if verb.lower() in _PRESENT else m.group("verb") or ""
        return name + (m.group("adv") or "") + verb

    t = re.sub(r"\b[Ii]'(?P<c>m|ve|d|ll)\b", lambda m: name + contractions[m.group("c").lower()], t)
    t = re.sub(r"\b[Ii]\b(?!')(?P<adv>(?:\s+" + _ADV + r")*)(?P<verb>\s+[a-z']+)?", subj, t)
    t = re.sub(r"\b[Mm]yself\b", "themself", t)
    t = re.sub(r"\b[Mm](?:y|ine)\b", name + "'s", t)
    return re.sub(r"\bme\b(?!-)", name, t)


def cap(summary: str, limit: int = 300) -> str:
    return summary if len(summary) <= limit else summary[:limit].rsplit(" ", 1)[0].rstrip(",;:") + "…"


@memo
def is_elliptic(text: str) -> bool:
    """A reply that leans on the question before it: "A sunrise, last year." / "Researching adoption agencies"."""
    s = strip_fillers((split_sentences(text) or [""])[0])
    if not s or not content_words(s):
        return False
    if len(strip_fillers(text).split()) <= 10 and not re.search(r"\b(?:I|I'm|I've|I'd|we|we're|it's|he|she|they|you)\b",
                                                                 s, re.I):
        return True
    return bool(re.match(r"^(?i:gonna|going to|planning|thinking about|hoping to|probably|definitely)\b|^[A-Z][a-z]+ing\b",
                         s)) and not re.search(r"^\S+(?:\s+\S+){0,4}\s+(?:is|are|was|were|has|sounds|looks)\b", s)


def question_gist(text: str, answerer: str) -> str:
    """The last question of a message, with "you" read as the one who answers it."""
    qs = [q for q in (strip_fillers(s) for s in split_sentences(text) if is_question(s)) if content_words(q)]
    return re.sub(r"\b[Yy]ou\b", answerer, re.sub(r"\b[Yy]our\b", answerer + "'s", qs[-1])) if qs else ""


@memo
def entities(text: str) -> list[str]:
    """Capitalised names and ids like incident-204; a sentence's first word only when it looks like a name."""
    found: list[str] = []
    sentences = [strip_fillers(x) for x in split_sentences(text)]
    rx = re.compile(r"(?<![\w'-])(?:[A-Z][\w+.-]*[\w+](?:\s+[A-Z][\w+-]*)*|[a-z]+-\d+)")
    mid = {m.group(0).split()[0] for s in sentences for m in rx.finditer(s) if m.start() > 0}
    for s in sentences:
        for m in rx.finditer(s):
            word = re.sub(r"^The\s+", "", m.group(0))
            common = m.start() == 0 and " " not in word and word not in mid and not s[m.end():].startswith("'s") \
                and not re.search(r"[A-Z0-9]", word[1:])  # a sentence's first word, probably not a name
            if not common and word.split()[0].lower() not in STOPWORDS and word.lower() not in map(str.lower, found):
                found.append(word)
    return found


# ---- relations: copular and verb-frame statements about things --------------------
# A clause "NP VERB [PREP] VALUE" becomes (entity, relation, value): the noun phrase gives the
# entity (and an attribute when it is possessive: "E's A", "the A of E", "my A"), the verb and
# preposition give the relation class, the value's shape (a time, a day) can override it.
_RELATION_VERBS = {
    "runs on": "run host deploy serve back keep store live sit hold power",
    "built with": "write build make implement code develop orchestrate manage",
    "location": "base locate situate",
    "schedule": "happen schedule occur start leave meet",
}
_REL_OF = {lemma: rel for rel, words in _RELATION_VERBS.items() for lemma in words.split()}
_IRREGULAR = {"written": "write", "wrote": "write", "built": "build", "made": "make", "kept": "keep", "ran": "run",
              "held": "hold", "sat": "sit", "left": "leave", "met": "meet", "went": "go", "got": "get"}
_PREP = r"out of|on|in|at|to|with|by|using|via|through|from|inside|onto|into|every"
_DAY = r"(?:mon|tues|wednes|thurs|fri|satur|sun)days?"
_TIMEISH = re.compile(rf"^(?:at\s+|on\s+)?(?:\d{{1,2}}(?:[:.]\d\d)?\s*(?:am|pm|a\.m\.|p\.m\.)?|noon|midnight|{_DAY}|"
                      rf"(?:every|each)\s+.+|(?:the\s+)?\d{{1,2}}(?:st|nd|rd|th)|(?:daily|weekly|monthly|nightly|hourly|"
                      r"fortnightly|biweekly|quarterly|yearly))$", re.I)
_TRAILING_TIME = re.compile(
    r"(?:,?\s+(?:now|nowadays|these days|currently|anymore|any more|from now on|for now|recently|lately|"
    r"a while (?:ago|back)|\w+ (?:days?|weeks?|months?|years?) ago|last \w+|this \w+|next \w+|starting .+|since .+|"
    r"as of .+|effective .+|in (?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)\w*(?:\s+\d{4})?|in \d{4}|"
    r"for (?!now\b)[a-z].*|instead|as well|yesterday|today|tonight|earlier|this (?:morning|afternoon|evening)|"
    r"the other day|this time|(?:in|over) the (?:spring|summer|autumn|fall|winter)|always has been|has always been|as always|"
    r"as usual))+$", re.I)
_KIN = frozenset("mum mom mam mother dad father mother-in-law father-in-law sister brother wife husband partner son "
                 "daughter grandma grandmother grandpa grandfather nan aunt uncle cousin niece nephew boss".split())
_NP_OK = re.compile(r"^[\w.+-]+(?:\s+[\w.+-]+){0,4}$")
_NOT_NP = frozenset("it this that there he she they we i you who what which something everything nothing anything "
                    "someone everyone life work weather today tomorrow here one".split())


def lemma(word: str) -> str:
    """A verb's base form ("hosted" → host, "runs" → run, "written" → write); a rough rule, no dictionary."""
    w = word.lower()
    if w in _IRREGULAR:
        return _IRREGULAR[w]
    for suf, rep in (("ies", "y"), ("ied", "y"), ("ing", ""), ("ed", ""), ("es", ""), ("s", "")):
        if w.endswith(suf) and len(w) - len(suf) >= 3:
            base = w[: -len(suf)] + rep
            if suf in ("ing", "ed") and len(base) > 3 and base[-1] == base[-2] and base[-1] not in "ls":
                base = base[:-1]  # running → run, shipped → ship
            if base + "e" in _REL_OF or (suf in ("ed", "ing", "es") and base.endswith(("at", "iz", "ov", "ag", "rv",
                                                                                       "erg", "uc", "id"))):
                base += "e"  # hosted→host, but serve, locate, manage, orchestrate
            return base
    return w


def trim_time(value: str) -> str:
    """A value without trailing time adverbials ("Render in March" → Render, "10:00 starting this week" → 10:00)."""
    v = _TRAILING_TIME.sub("", clean_value(value)).strip(" ,")
    return clean_value(v) if v else clean_value(value)


def is_timeish(value: str) -> bool:
    return bool(_TIMEISH.match(clean_value(value)))


def _noun_phrase(np: str, subject: str) -> tuple[str, str, bool] | None:
    """(entity, attribute, owned) named by a subject noun phrase; attribute '' when the phrase is the thing
    itself; owned when a possessive ("our", "my", "E's") makes it somebody's attribute."""
    s = clean_value(re.sub(r"\s+(?:that|which)?\s*(?:i|we|you|they)\s+[a-z]+$", "", np.strip(), flags=re.I))
    owned = bool(re.match(r"^(?i:our|your|their)\s", s)) or s != clean_value(np)
    s = re.sub(r"^(?i:the|our|your|their|this|that)\s+", "", s)
    m = re.match(r"^(?i:my)\s+(?P<att>.+)$", s)
    if m:
        return (subject, m.group("att"), True) if subject else None
    m = re.match(r"^(?P<ent>.+?)(?:'s|(?<=s)')\s+(?P<att>.+)$", s)
    if m:
        ent = re.sub(r"^(?i:the|our)\s+", "", m.group("ent"))
        return (ent, m.group("att"), True) if _NP_OK.match(ent) and _NP_OK.match(m.group("att")) else None
    m = re.match(r"^(?P<att>[a-z][\w -]*?)\s+(?:of|for|behind|in|at)\s+(?:the\s+)?(?P<ent>[A-Z][\w.+-]*(?:\s+[A-Z][\w.+-]*)*)$", s)
    if m:
        return m.group("ent"), m.group("att"), True
    m = re.match(r"^(?P<ent>[A-Z][\w.+-]*(?:\s+[A-Z][\w.+-]*)*)\s+(?P<att>[a-z][a-z -]*)$", s)
    if m and m.start() == 0 and not _bad_entity(m.group("ent"), True):
        return m.group("ent"), m.group("att"), True
    if not _NP_OK.match(s) or s.split()[0].lower() in _NOT_NP or s.split()[0].lower() in STOPWORDS:
        return None
    if subject and s.lower() in _KIN:
        return subject, s.lower(), True
    return s, "", owned


def _relation(verb: str, prep: str, value: str) -> str:
    rel = _REL_OF.get(lemma(verb), "") if verb else ""
    if is_timeish(trim_time(value)) or (prep == "every"):
        return "schedule"
    if rel:
        return rel
    if verb:
        return f"{verb.lower()} {prep}".strip()
    return {"in": "location", "at": "location", "on": "runs on", "with": "built with", "by": "runs on"}.get(prep, "")


def _fact(ent: str, att: str, rel: str, value: str, owned: bool = False) -> Statement | None:
    """One statement, or None when the value is junk or a common noun about a bare topic ("the kids are happy")."""
    v = _value(trim_time(_named(value)))
    if not v or not ent or ent.split()[0].lower() in _NOT_NP:
        return None
    named = bool(re.search(r"[A-Z0-9]", v)) or is_timeish(v)
    if not named and not att and not owned:
        return None
    return Statement(ent, att or rel or "description", v)


_SPLIT = re.compile(rf"\s(?:(?P<be>is|are|was|were)\s+(?:(?:now|currently|still|actually|also)\s+)?"
                    rf"(?:(?!(?:{_PREP})\b)(?P<part>[a-z]{{2,}}(?:ed|en|t|n)|held|paid|made|laid|led|hid|kept|sold|done)\s+)?|"
                    rf"(?:(?:now|currently|still|also|actually)\s+)?"
                    rf"(?P<v>[a-z]+)\s+(?:(?:out|up|off|over|down|back)\s+(?=(?:{_PREP})\s))?)(?:(?P<prep>{_PREP})\s+)?"
                    rf"(?P<val>\S.*)$")


class _Split:
    """One reading of a clause as NP + (copula [participle] | verb) + [preposition] + value."""

    def __init__(self, s: str, m: re.Match[str]) -> None:
        self._g = {"np": s[: m.start()], "be": m.group("be") or "", "verb": m.group("part") or m.group("v") or "",
                   "prep": m.group("prep") or "", "val": m.group("val")}

    def group(self, name: str) -> str:
        return self._g[name]


def _splits(s: str) -> list[_Split]:
    """Readings left to right; a verb reading needs a known relation verb, "uses", or a verb with a preposition."""
    out = []
    for start in [i for i, ch in enumerate(s) if ch == " "]:
        m = _SPLIT.match(s, start)
        if not m or start == 0:
            continue
        be, part, v, prep = m.group("be"), m.group("part"), m.group("v"), m.group("prep")
        if be:
            if (part and not prep) or (be in ("was", "were") and not part):
                continue  # "is deployed" without where; a past state is an event, not a current fact
        elif not v or (v in STOPWORDS and not (prep and m.group("val")[:1].isupper())) or not (
                lemma(v) in _REL_OF or lemma(v) == "use" or prep):
            continue
        elif re.match(r"^(?:is|are|was|were|has|have|will|would)\b", m.group("val")) or (
                re.match(r"^[a-z]+s\b", m.group("val")) and lemma(m.group("val").split()[0]) in _REL_OF):
            continue
        out.append(_Split(s, m))
    return out


_INVERTED = re.compile(r"^(?P<val>[A-Z][\w.+-]*(?:\s+[\w.+-]+){0,3}|\d[\w:.]*)\s+(?:is|are)\s+(?P<det>our|my|the)\s+"
                       r"(?P<np>\w[\w' -]{0,40}?)(?P<rc>\s+(?:we|i)\s+(?:use|have|run|picked|chose))?$")
_ACTIVE = re.compile(r"^(?P<val>[A-Z][\w.+-]*(?:\s+[A-Z0-9][\w.+-]*){0,2})\s+(?P<verb>hosts|runs|powers|serves|backs|"
                     r"stores|holds)\s+(?P<det>our|my|the)\s+(?P<np>[a-z][\w -]{0,40})$")
_WE_VERB = re.compile(rf"^(?:we|i)\s+(?:(?i:now|still|currently|also|just)\s+)?(?P<verb>[a-z]+)\s+(?:(?:our|the|my)\s+)?"
                      rf"(?P<np>[a-z][\w -]{{0,40}}?)\s+(?P<prep>{_PREP})\s+(?P<val>.+)$", re.I)
_AGENT = re.compile(r"^(?P<val>[A-Z][\w&.+-]*(?:\s+(?:&\s+)?[A-Z][\w&.+-]*){0,3})\s+(?:is|are)\s+(?:now\s+)?(?:doing|handling|"
                    r"running|managing|building|fixing|maintaining|cleaning|catering|organi[sz]ing)\s+(?:the|our|my)\s+"
                    r"(?P<np>[a-z][\w -]{0,40}?)(?:\s+(?:now|these days|from now on))?$")
_HAVE_BRAND = re.compile(r"^(?i:we|i)\s+(?i:have|own|got|use)\s+(?i:a|an)\s+(?P<val>[A-Z][\w.+-]*(?:\s+[A-Z0-9][\w.+-]*)?)\s+"
                         r"(?P<np>[a-z][a-z-]*(?:\s+[a-z][a-z-]*){0,3})$")
_WE_WHEN = re.compile(r"^(?:we|i)\s+(?P<verb>[a-z]+)\s+(?P<prep>on|at|every)\s+(?P<val>.+)$", re.I)
_WE_USE_FOR = re.compile(r"^(?:we|i)(?:\s+(?:now|still|currently|also|mostly))?(?:\s+use|\s+are using|'re using|'re on|"
                         r"\s+are on|'m on|\s+am on|\s+run|'re running|\s+are running)\s+"
                         r"(?P<val>[A-Z][\w.+-]*(?:\s+[A-Z0-9][\w.+-]*){0,2})\s+(?:for|as)\s+(?:our\s+|the\s+|my\s+)?"
                         r"(?P<np>[a-z][\w -]{0,40})$", re.I)


_WHAT = re.compile(r"^(?P<val>[A-Z][\w.+-]*(?:\s+[A-Z0-9][\w.+-]*){0,2})\s+(?:is|are)\s+(?:what|where|who)\s+(?P<np>.+?)\s+"
                   r"(?P<verb>[a-z]+)\s*(?P<prep>on|in|with|at|for|through)?$")


def _plain_form(s: str) -> str:
    """Aspect and idiom out of the way: "we've been hosting X on Y" → "we host X on Y", "X's on Y" → "X is on Y",
    "X is called Y" → "X is Y"."""
    s = re.sub(r"^(?P<w>we|i)(?:'ve| have|'re| are|'m| am)(?: been)?\s+(?P<v>[a-z]+ing)\b",
               lambda m: f"{m.group('w')} {lemma(m.group('v'))}", s, flags=re.I)
    s = re.sub(r"^(?P<w>we|i)(?:'ve| have) (?:had|got)\b", lambda m: f"{m.group('w')} have", s, flags=re.I)
    s = re.sub(r"^(?P<w>we|i) do (?:my|our|the) (?P<v>[a-z]+ing)\b", lambda m: f"{m.group('w')} {lemma(m.group('v'))}", s,
               flags=re.I)
    s = re.sub(r"^(?P<e>[A-Z][\w.+-]*(?:\s+[A-Z][\w.+-]*)*)'s\s+(?=(?:on|in|at|with|hosted|running|written|built)\b)",
               lambda m: f"{m.group('e')} is ", s)
    s = re.sub(r"\s(?P<be>is|are)\s+being\s+(?=[a-z]+(?:ed|en|ne|t)\s+by\b)", lambda m: f" {m.group('be')} ", s)
    return re.sub(r"\s(?P<be>is|are)\s+(?:called|named)\s+", lambda m: f" {m.group('be')} ", s)


def parse_relation(clause: str, subject: str) -> list[Statement]:
    """Statements about things: "the billing service is written in Go", "X runs on Y", "Y hosts our X"."""
    s = re.sub(r"^(?i:i'd say|i would say|i think|i believe|fwiw|for the record|to be clear|i'd say that)[,\s]+", "",
               clause)
    s = re.sub(r",?\s+(?:always has been|has always been|as always|as usual)$", "", _plain_form(clean_value(s)))
    if not s or is_question(clause) or is_hypothetical(s) or is_hearsay(s):
        return []
    m = _WHAT.match(s)  # "Nomad is what Kite runs on", "Aldi is where I shop"
    if m and m.group("np").lower() in ("i", "we") and subject and m.group("np").lower() == "i":
        st = _fact(subject, f"{m.group('verb')} {m.group('prep') or 'at'}", "", m.group("val"), True)
        return [st] if st else []
    if m and lemma(m.group("verb")) in _REL_OF:
        np = _noun_phrase(m.group("np"), subject)
        st = _fact(np[0], np[1], _relation(m.group("verb"), m.group("prep") or "", m.group("val")), m.group("val"),
                   np[2]) if np else None
        return [st] if st else []
    m = _INVERTED.match(s)
    if m and m.group("val").split()[0].lower() not in STOPWORDS and (m.group("det") != "the" or m.group("rc") or (
            len(m.group("np").split()) <= 2 and m.group("val")[:1].isupper())):
        owner = m.group("det").lower() == "my"
        if owner and not subject:
            return []
        st = _fact(subject, m.group("np"), "", m.group("val")) if owner else _fact(m.group("np"), "", "description",
                                                                                    m.group("val"))
        return [st] if st else []
    for rx in (_ACTIVE, _WE_VERB, _WE_USE_FOR):
        m = rx.match(s)
        if m:
            verb = m.groupdict().get("verb") or "use"
            prep = m.groupdict().get("prep") or ""
            rel = "uses" if verb.lower() == "use" else _relation(verb, prep, m.group("val"))
            if rel and (rx is not _WE_VERB or lemma(verb) in _REL_OF or re.match(r"^[A-Z0-9]", m.group("val"))):
                st = _fact(m.group("np"), "", rel, m.group("val"))
                return [st] if st else []
    m = _AGENT.match(s)  # "Apex Roofing is fixing the roof now": who does a thing
    if m:
        st = _fact(m.group("np"), "", "done by", m.group("val"))
        return [st] if st else []
    m = _HAVE_BRAND.match(s)
    if m:
        st = _fact(m.group("np"), "", "description", m.group("val"))
        return [st] if st else []
    m = _WE_WHEN.match(s)
    when = ("every " if m and m.group("prep").lower() == "every" else "") + (m.group("val") if m else "")
    if m and is_timeish(trim_time(when)) and m.group("verb").lower() not in STOPWORDS:
        st = _fact(lemma(m.group("verb")), "", "schedule", when)
        return [st] if st else []
    for sp in _splits(s):
        verb, prep = sp.group("verb") or "", (sp.group("prep") or "").lower()
        np = _noun_phrase(sp.group("np"), subject)
        if not np:
            continue
        plain = bool(sp.group("be")) and not verb and not prep
        uses = lemma(verb) == "use" and not prep
        rel = "" if plain else "uses" if uses else _relation(verb, prep, sp.group("val"))
        st = _fact(np[0], np[1], rel, ("every " if prep == "every" else "") + sp.group("val"), np[2])
        if st and uses and not np[1]:  # the existing convention: one "uses_<tool>" fact per tool
            st = Statement(st.entity, "uses", st.value, "uses_" + _head(st.value))
        if st:
            return [st]
    return []


# ---- changes: "we moved X to Y", "X was swapped for Y", "replaced X with Y" ------------------
_CHANGE_MARK = re.compile(
    r"^(?i:actually|correction|update|small fix|quick fix|fix|heads up|fyi|sorry|wait|hold on|oops|no|nope|"
    r"not quite|not anymore|not any more|scratch that|my mistake|my bad|i was wrong|i meant|i misspoke|"
    r"i got (?:that|it) wrong|i was mistaken|that's wrong|that was wrong|that's not right|wrong|incorrect|"
    r"to correct myself|change of plan|news)\b[\s,:;!.\u2014\u2013-]*")
TIME_WORDS = frozenset("since recently lately nowadays currently anymore starting week month year sprint ago weve theyve "
                       "while".split())
_CHANGE_ADVERB = re.compile(r"\b(?i:now|from now on|these days|nowadays|anymore|any more|since|starting|as of|"
                            r"no longer|recently|lately)\b")
_CHANGE_VERBS = (r"moved|migrated|switched|changed|relocated|upgraded|downgraded|shifted|swapped|transitioned|"
                 r"converted|ported|rewrote|rewritten|rebuilt|replaced|rescheduled|pushed|bumped|updated|traded|"
                 r"exchanged|repointed|cut over|flipped")
_CHANGE = re.compile(rf"^(?P<ctx>.*?)\b(?P<verb>{_CHANGE_VERBS})\b(?P<obj>.*?)\s+(?:over\s+|back\s+)?"
                     rf"(?P<prep>to|for|with|in|into|onto|from \S+ to)\s+(?P<new>.+)$", re.I)
_SWAP = re.compile(r"^(?P<ctx>.*?)\b(?:sold|dropped|ditched|gave up|left|quit|retired|cancelled|canceled)\s+"
                   r"(?P<old>.+?)\s+and\s+(?:\w+\s+)?(?:bought|got|picked up|adopted|joined|went with|switched to|"
                   r"moved to|started using|signed up (?:for|with))\s+(?P<new>.+)$", re.I)
_ITS_NOW = re.compile(r"^(?P<ctx>.*?)(?:,|;|\s[\u2014\u2013-])\s*(?:and\s+)?(?:it's|it is|now it's|it's now|"
                      r"they're|they are)\s+(?:now\s+)?(?P<new>.+)$", re.I)
_NOT_OLD = re.compile(r",?\s+(?:and\s+)?not\s+(?P<old>[^,]+)$", re.I)


@dataclass(frozen=True)
class Change:
    context: str  # the words that name what changed ("checkout", "the design review")
    value: str  # the new value
    old_hint: str = ""  # the old value when named
    marked: bool = False  # an explicit marker ("actually", "correction", "not X")
    verb: bool = False  # said with a verb of change ("moved", "switched", "replaced")


def strip_change_marker(clause: str) -> tuple[str, bool]:
    s, marked = clause.strip().replace("\u2019", "'"), False
    while True:
        m = _CHANGE_MARK.match(s)
        if not m or m.end() == 0:
            return s, marked
        s, marked = s[m.end():].strip(), True


@memo
def parse_change(clause: str) -> Change | None:
    """A change of an earlier fact stated with a verb of change or a replacement, marked or not."""
    s, marked = strip_change_marker(re.sub(r"^(?i:so|and|but)\s+(?=(?i:now|these days|nowadays|i|we)\b)", "", clause.strip()))
    if not s or is_question(s) or is_hypothetical(s):
        return None
    old = ""
    m = _NOT_OLD.search(s)
    if m and len(m.group("old").split()) <= 4:
        old, s = clean_value(m.group("old")), s[: m.start()]
    m = _SWAP.match(s)
    if m:
        return Change(m.group("ctx"), trim_time(m.group("new")), clean_value(m.group("old")), marked, True)
    m = re.match(r"^(?P<ctx>(?i:i|we))(?:'ve| have)?\s+(?:just\s+)?(?i:started|joined|begun|began)\s+(?:(?i:at|with|in)\s+)?"
                 r"(?P<new>[A-Z].*)$", s)
    if m:  # "I've started at Northside this term": a new place of work or study
        return Change(m.group("ctx"), trim_time(m.group("new")), old, marked, True)
    m = _CHANGE.match(s)
    if m and not re.search(r"\b(?:to|in)\b\s*$", m.group("obj")):
        verb, obj, new = m.group("verb").lower(), m.group("obj").strip(), trim_time(m.group("new"))
        prep = m.group("prep").lower()
        later = re.match(r"^(?P<p>for|with|to)\s+(?P<n>.+)$", new, re.I)
        if prep in ("in", "into") and later:  # "traded the Skoda in for a Corolla": "in" was a particle
            obj, new, prep = f"{obj} {prep}", trim_time(later.group("n")), later.group("p").lower()
        if verb in ("replaced", "swapped", "traded", "exchanged") and obj and prep in ("with", "for"):
            return Change(m.group("ctx"), new, clean_value(obj) or old, marked, True)
        return Change(f"{m.group('ctx')} {obj}", new, old, marked, True)
    m = _ITS_NOW.match(s)
    if m and (marked or re.search(rf"\b(?:{_CHANGE_VERBS})\b", m.group("ctx"), re.I)):
        return Change(m.group("ctx"), trim_time(m.group("new")), old, marked, True)
    b = _BARE.match(s)
    if b and (marked or _CHANGE_ADVERB.search(s)) and not re.match(r"^(?i:it's|it is|that's|that is)\s+(?:a|an|the|my|our|"
                                                                    r"not|no|so|very|too|really)\b", s):
        return Change("", re.sub(r"^(?:at|on|in)\s+(?=[A-Z0-9])", "", trim_time(b.group("val"))), old, True)
    if marked or old or _CHANGE_ADVERB.search(s):  # a restatement: parse it, then bind it
        return Change(re.sub(r"^(?i:these days|nowadays|now|lately|recently|from now on|as of \w+|since \w+)[,\s]+", "",
                             s), "", old, marked or bool(old))
    return None
