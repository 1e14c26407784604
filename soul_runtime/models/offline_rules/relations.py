"""Relations: copular and verb-frame statements about things."""

from __future__ import annotations

import re
from collections.abc import Callable

from soul_runtime.models.offline_rules.chat import is_hearsay, is_hypothetical, is_question
from soul_runtime.models.offline_rules.cleaning import clean_value
from soul_runtime.models.offline_rules.values import Statement, _bad_entity, _head, _named, _value
from soul_runtime.models.offline_rules.words import STOPWORDS

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
_PREP = r"out of|on|in|at|to|with|by|using|via|through|from|inside|onto|into|every|against"
_DAY = r"(?:mon|tues|wednes|thurs|fri|satur|sun)days?"
_MONTH = r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
_DATE = (rf"(?:{_MONTH}\s+\d{{1,2}}(?:st|nd|rd|th)?(?:,?\s+\d{{4}})?|\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTH}(?:\s+\d{{4}})?|"
         rf"{_MONTH}\s+\d{{4}}|\d{{4}}-\d\d-\d\d|week\s+\d{{1,2}}|(?:next|this)\s+{_DAY})")
_TIMEISH = re.compile(rf"^(?:at\s+|on\s+)?(?:\d{{1,2}}(?:[:.]\d\d)?\s*(?:am|pm|a\.m\.|p\.m\.)?|noon|midnight|{_DAY}|{_DATE}|"
                      rf"(?:every|each)\s+.+|(?:the\s+)?\d{{1,2}}(?:st|nd|rd|th)|(?:daily|weekly|monthly|nightly|hourly|"
                      r"fortnightly|biweekly|quarterly|yearly))$", re.I)
_TRAILING_TIME = re.compile(
    r"(?:,?\s+(?:now|nowadays|these days|currently|anymore|any more|from now on|for now|recently|lately|"
    r"a while (?:ago|back)|\w+ (?:days?|weeks?|months?|years?) ago|last \w+|this \w+|next \w+|starting .+|since .+|"
    r"as of .+|effective .+|in (?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)\w*(?:\s+\d{4})?|in \d{4}|"
    r"for (?!now\b)[a-z].*|instead|as well|yesterday|today|tonight|earlier|this (?:morning|afternoon|evening)|"
    r"the other day|this time|(?:in|over) (?:the )?(?:spring|summer|autumn|fall|winter)|from (?:the )?next \w+|from today|from tomorrow|going forward|always has been|has always been|as always|"
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
    named = bool(re.search(r"[A-Z0-9]", v)) or is_timeish(v) or bool(re.search(r"\w[-_./@]\w|^#\w", v))
    if not named and not att and not owned:
        return None
    return Statement(ent, att or rel or "description", v)


_SPLIT = re.compile(rf"\s(?:(?P<be>is|are|was|were)\s+(?:(?:now|currently|still|actually|also)\s+)?"
                    rf"(?:(?!(?:{_PREP}|next|last|first|most|best|just|not|about|almost|often)\b)(?P<part>[a-z]{{2,}}(?:ed|en|t|n)|held|paid|made|laid|led|hid|kept|sold|done)\s+)?|"
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
                     r"stores|holds|orchestrates|builds)\s+(?P<det>our|my|the)\s+(?P<np>[a-z][\w -]{0,40})$")
_WE_VERB = re.compile(rf"^(?:we|i)\s+(?:(?i:now|still|currently|also|just)\s+)?(?P<verb>[a-z]+)\s+(?:(?:our|the|my)\s+)?"
                      rf"(?P<np>[a-z][\w -]{{0,40}}?)\s+(?P<prep>{_PREP})\s+(?P<val>.+)$", re.I)
_AGENT = re.compile(r"^(?P<val>[A-Z][\w&.+-]*(?:\s+(?:&\s+)?[A-Z][\w&.+-]*){0,3})\s+(?:is|are)\s+(?:now\s+)?(?:doing|handling|"
                    r"running|managing|building|fixing|maintaining|cleaning|catering|organi[sz]ing)\s+(?:the|our|my)\s+"
                    r"(?P<np>[a-z][\w -]{0,40}?)(?:\s+(?:now|these days|from now on))?$")
_HAVE_BRAND = re.compile(r"^(?i:we|i)\s+(?i:have|own|got|use)\s+(?i:a|an)\s+(?P<val>[A-Z][\w.+-]*(?:\s+[A-Z0-9][\w.+-]*)?)\s+"
                         r"(?P<np>[a-z][a-z-]*(?:\s+[a-z][a-z-]*){0,3})$")
_WE_WHEN = re.compile(r"^(?:we|i)\s+(?P<verb>[a-z]+)\s+(?P<prep>on|at|every)\s+(?P<val>.+)$", re.I)
_WE_USE_FOR = re.compile(r"^(?:we|i)(?:\s+(?:now|still|currently|also|mostly))?(?:\s+use|\s+are using|'re using|'re on|"
                         r"\s+are on|'m on|\s+am on|\s+run|'re running|\s+are running)\s+(?:an?\s+)?"
                         r"(?P<val>[A-Z][\w.+-]*(?:\s+[A-Z0-9][\w.+-]*){0,2})\s+(?:for|as)\s+(?:our\s+|the\s+|my\s+)?"
                         r"(?P<np>[a-z][\w -]{0,40})$", re.I)


_WHAT = re.compile(r"^(?P<val>[A-Z][\w.+-]*(?:\s+[A-Z0-9][\w.+-]*){0,2})\s+(?:is|are)\s+(?:what|where|who)\s+(?P<np>.+?)\s+"
                   r"(?P<verb>[a-z]+)\s*(?P<prep>on|in|with|at|for|through)?$")


_PLAIN_FORMS: tuple[tuple[re.Pattern[str], Callable[[re.Match[str]], str]], ...] = (
    (re.compile(r"^(?P<w>we|i)(?:'ve| have|'re| are|'m| am)(?: been)?\s+(?P<v>[a-z]+ing)\b", re.I),
     lambda m: f"{m.group('w')} {lemma(m.group('v'))}"),
    (re.compile(r"^(?P<w>we|i)(?:'ve| have) (?:had|got)\b", re.I), lambda m: f"{m.group('w')} have"),
    (re.compile(r"^(?P<w>we|i) do (?:my|our|the) (?P<v>[a-z]+ing)\b", re.I),
     lambda m: f"{m.group('w')} {lemma(m.group('v'))}"),
    (re.compile(r"^(?P<e>[A-Z][\w.+-]*(?:\s+[A-Z][\w.+-]*)*)'s\s+(?=(?:on|in|at|with|hosted|running|written|built)\b)"),
     lambda m: f"{m.group('e')} is "),
    (re.compile(r"\s(?P<be>is|are)\s+being\s+(?=[a-z]+(?:ed|en|ne|t)\s+by\b)"), lambda m: f" {m.group('be')} "),
    (re.compile(r"\s(?P<be>is|are)\s+scheduled\s+(?:for|at)\s+"), lambda m: f" {m.group('be')} at "),
    (re.compile(r"\s(?P<be>is|are)\s+(?:called|named)\s+"), lambda m: f" {m.group('be')} "),
)


def _plain_form(s: str) -> str:
    """Aspect and idiom out of the way: "we've been hosting X on Y" → "we host X on Y", "X's on Y" → "X is on Y",
    "X is called Y" → "X is Y"."""
    for rx, plain in _PLAIN_FORMS:
        s = rx.sub(plain, s)
    return s


def parse_relation(clause: str, subject: str) -> list[Statement]:
    """Statements about things: "the billing service is written in Go", "X runs on Y", "Y hosts our X"."""
    s = re.sub(r"^(?i:i'd say|i would say|i think|i believe|fwiw|for the record|to be clear|i'd say that)[,\s]+", "",
               clause)
    s = re.sub(r",?\s+(?:always has been|has always been|as always|as usual)$", "", _plain_form(clean_value(s)))
    if not s or is_question(clause) or is_hypothetical(s) or is_hearsay(s):
        return []
    for reader in (_framed, _by_verb):
        got = reader(s, subject)
        if got is not None:
            return got
    return _by_split(s, subject)


def _framed(s: str, subject: str) -> list[Statement] | None:
    """A clause framed around its value: "Nomad is what Kite runs on", "Opsgenie is the pager we use"; None
    when it is not one."""
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
    return None


def _by_verb(s: str, subject: str) -> list[Statement] | None:
    """A clause whose verb names the relation: "X runs on Y", "we use Y for X", "Apex Roofing is fixing the
    roof", "we deploy every Friday"; None when it is not one."""
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
    return None


def _by_split(s: str, subject: str) -> list[Statement]:
    """A clause split at its verb (or "is") into a noun phrase and a value, read as the first split that makes
    a fact."""
    for sp in _splits(s):
        verb, prep = sp.group("verb") or "", (sp.group("prep") or "").lower()
        np = _noun_phrase(sp.group("np"), subject)
        if not np:
            continue
        plain = bool(sp.group("be")) and not verb and not prep
        uses = lemma(verb) == "use" and not prep
        rel = ("schedule" if is_timeish(trim_time(sp.group("val"))) else "") if plain else "uses" if uses else _relation(
            verb, prep, sp.group("val"))
        st = _fact(np[0], np[1], rel, ("every " if prep == "every" else "") + sp.group("val"), np[2])
        if st and uses and not np[1]:  # the existing convention: one "uses_<tool>" fact per tool
            st = Statement(st.entity, "uses", st.value, "uses_" + _head(st.value))
        if st:
            return [st]
    return []
