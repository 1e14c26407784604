"""Tasks: requests, task classes, default plans, steps given by the user, outcomes and save requests."""

from __future__ import annotations

import re

from soul_runtime.models.offline_rules.chat import is_question
from soul_runtime.models.offline_rules.cleaning import clean_value, split_sentences, strip_fillers
from soul_runtime.models.offline_rules.words import memo
from soul_runtime.text import singular

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
        s = re.sub(r"\bme\b", lambda _: speaker, re.sub(r"\bmy\b", lambda _: speaker + "'s", s))
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
