"""The offline built-in model: deterministic rules, no network, no API key.

Every reply starts with ``[offline model] ``; usage counts are estimates
(``len(text) // 4`` tokens, one call) so turn traces always carry numbers.
The text rules live in :mod:`soul_runtime.models.offline_rules`.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import threading
from dataclasses import dataclass, field

from soul_runtime.models import offline_episode as episode
from soul_runtime.models import offline_rules as rules
from soul_runtime.models.base import (
    ChatMessage,
    Exchange,
    LanguageModel,
    MemoryDecision,
    MemoryLine,
    ModelReply,
    ReplyRequest,
    TaskClassification,
    Usage,
    read_memory_lines,
)
from soul_runtime.records import Extraction, FactCandidate, TaskReport
from soul_runtime.text import prose
from soul_runtime.timeref import query_scope

PREFIX = "[offline model] "
_WINDOW = 8  # how many earlier messages a confirmation, correction or outcome may refer to
_VERB_ATTRS = ("likes", "dislikes", "prefers", "uses", "runs on")
_STORE_TAG = {"semantic": "fact", "episodic": "episode", "procedural": "procedure"}


def _has_content(text: str) -> bool:
    return bool(re.search(r"[A-Za-z0-9]", text or ""))  # the minimum-content filter


def _usage(inp: str, out: str) -> Usage:
    return Usage(max(1, len(inp) // 4), max(1, len(out) // 4), 1)


def _subject(speaker: str, text: str) -> str:
    """Who "I" is: the speaker, or for a generic speaker ("user") the name the text introduces."""
    return (rules.find_name(text) or speaker.strip()) if speaker.strip().lower() in rules.GENERIC_SPEAKERS else speaker.strip()


def _say(f: FactCandidate) -> str:
    e, a = f.display_entity or f.entity, (f.display_attribute or f.attribute).replace("_", " ")
    if a in _VERB_ATTRS or a == "lives in":
        return f"{e} {a} {f.value}"
    return f"{e} is {f.value}" if f.attribute == "description" else f"{e}'s {a} is {f.value}"


def _render(facts: list[FactCandidate]) -> str:
    named = [f for f in facts if not (f.attribute == "name" and f.entity == f.value.lower())]
    return "; ".join(_say(f) for f in (named or facts))


def _candidate(st: rules.Statement, kind: str, sources: tuple[str, ...]) -> FactCandidate:
    return FactCandidate(rules.entity_key(st.entity), st.attribute_key, st.value, kind, sources, st.entity, st.attribute)


def _prior(ex: Exchange) -> list[ChatMessage]:
    """The earlier messages (without the current one, should the caller have appended it)."""
    hist = list(ex.history)
    same = hist and hist[-1].role == "user" and rules.collapse(hist[-1].content) == rules.collapse(ex.user_text)
    return hist[:-1][-_WINDOW:] if same else hist[-_WINDOW:]


def _message_facts(msg: ChatMessage, speaker: str) -> list[FactCandidate]:
    """The facts a message states (an assistant's restatement: "Noted: Tendril's production database is …")."""
    return list(_parsed_facts(msg, msg.speaker or speaker))  # a message's own speaker: one reading whoever asks


@functools.lru_cache(maxsize=4096)
def _parsed_facts(msg: ChatMessage, speaker: str) -> tuple[FactCandidate, ...]:
    """:func:`_message_facts`, remembered: a turn's analysis reads the recent history several times, and the
    reply and the memory decision each analyse the turn (a pure function of its arguments)."""
    text = msg.content.removeprefix(PREFIX).strip()
    if rules.is_instruction(text):
        return ()
    text = prose(text).strip() or text  # as :func:`analyse` reads a message: its sentences, not its code or logs
    subject = "" if msg.role == "assistant" else _subject(speaker, text)
    out: list[FactCandidate] = []
    thing = person = ""
    for sentence in rules.split_sentences(rules.read_opening(text)[0] if msg.role == "user" else text):
        for clause in rules.split_clauses(rules.strip_fillers(sentence)):
            clause = re.sub(r"^(?i:noted|updated|confirmed|thanks|got it)\s*[:,\u2014-]\s*", "", clause)
            first = rules.as_first_person(clause) if person else ""
            clause, who = (first, person) if first else (
                rules.resolve_pronouns(clause, thing or (out[-1].display_entity if out else ""), person), subject)
            corr = rules.parse_correction(clause)
            clause = corr.statement if corr and corr.statement else clause
            out += [_candidate(st, "", ()) for st in rules.parse_statements(clause, who)]
        thing, person = rules.last_thing(sentence) or thing, rules.last_person(sentence) or person
    return tuple(out)


@dataclass
class _Analysis:
    instruction: bool = False
    chit: bool = False
    question: bool = False
    facts: list[FactCandidate] = field(default_factory=list)
    request: str = ""  # task class of a request in this message
    task: TaskReport | None = None
    task_body: str = ""
    explicit_steps: bool = False
    reported: bool = False  # the task was told with its steps, not asked for
    episode: str = ""
    event: bool = False
    entities: tuple[str, ...] = ()
    extra_sources: tuple[str, ...] = ()

    def of_kind(self, kind: str) -> list[FactCandidate]:
        return [f for f in self.facts if f.kind == kind]


def _resolve(corr: rules.Correction, cands: list[FactCandidate], sources: tuple[str, ...]) -> FactCandidate | None:
    """The recalled / recent fact a bare correction ("actually, it's Postgres 16") replaces."""
    new_words = set(rules.normalise(corr.value).split())
    hint = rules.normalise(corr.old_hint)

    def score(c: FactCandidate) -> int:  # the old value named, words shared, both numeric
        old = rules.normalise(c.value)
        return (10 if hint and re.search(rf"\b{re.escape(hint)}\b", old) else 0) + 2 * len(
            {w for w in new_words & set(old.split()) if not w.isdigit()}) + bool(re.search(r"\d", old) and re.search(r"\d", corr.value))

    best = max(cands, key=score, default=None)  # max keeps the first (most recent) of equal scores
    if best is None or score(best) == 0:
        return None
    value = corr.value
    if hint and corr.old_hint in best.value and len(new_words) == 1:
        value = best.value.replace(corr.old_hint, corr.value)
    elif re.fullmatch(r"\d+(?:\.\d+)*", corr.value):
        value = rules.replace_number(best.value, corr.value)
    if value == best.value:
        return None
    return dataclasses.replace(best, value=value, kind="corrected", sources=sources)


def _bind(words: set[str], old_hint: str, cands: list[FactCandidate]) -> FactCandidate | None:
    """The candidate fact a change refers to: most words shared with its entity and attribute, the old value named."""
    hint = set(rules.content_words(old_hint)) or set(rules.normalise(old_hint).split())
    stems = {rules.task_stem(w) for w in words}

    def score(c: FactCandidate) -> int:  # words of its entity and attribute, compared by stem ("skating" / "skate")
        about = {rules.task_stem(w) for w in rules.content_words(
            f"{c.display_entity or c.entity} {c.display_attribute or c.attribute}".replace("_", " "))}
        named = hint and (hint & set(rules.content_words(c.value)) or rules.normalise(old_hint) == rules.normalise(c.value))
        return 3 * len(stems & about) + 5 * bool(named)

    best = max(cands, key=score, default=None)  # max keeps the first (most recent) of equal scores
    return best if best is not None and score(best) > 0 else None


def _changed(chg: rules.Change, subject: str, cands: list[FactCandidate], recent: list[FactCandidate],
             sources: tuple[str, ...]) -> list[FactCandidate]:
    """Corrected facts for a change ("we moved X to Y", "actually, it's Y", "X is Y now"); [] if it binds to none."""
    if chg.value:
        words = set(rules.content_words(chg.context)) - set(rules.content_words(chg.value)) - rules.TIME_WORDS
        mine = [c for c in recent if subject and c.entity == rules.entity_key(subject)]
        best = _bind(words, chg.old_hint, cands) or (recent[0] if recent and (chg.marked or chg.verb) and not words else None) or (
            mine[0] if mine and chg.verb and re.match(r"^\s*(?i:i|i've|i'm)\b", chg.context) else None)
        if best is None:
            return []
        value = rules.replace_number(best.value, chg.value) if re.fullmatch(r"\d+(?:\.\d+)*", chg.value) else chg.value
        return [] if rules.normalise(value) == rules.normalise(best.value) else [
            dataclasses.replace(best, value=value, kind="corrected", sources=sources)]
    out = []
    for st in rules.parse_statements(chg.context, subject):
        f = _candidate(st, "corrected", sources)
        same = [c for c in cands if (c.entity, c.attribute) == (f.entity, f.attribute)]
        best = same[0] if same else _bind(set(rules.content_words(st.entity)), chg.old_hint, cands)
        if best is not None and rules.normalise(best.value) != rules.normalise(f.value):
            out.append(dataclasses.replace(best, value=f.value, kind="corrected", sources=sources))
        elif best is None and chg.marked:
            out.append(f)
    if not out and chg.context:  # "the wiki is on bookstack now": a known thing restated, its value in any case
        m = re.match(r"^(?:(?i:the|our|my)\s+)?(?P<np>[\w' -]+?)\s+(?:is|are)\s+(?:(?i:now)\s+)?(?:(?i:on|in|at|with|"
                     r"using)\s+)?(?P<val>[\w.+ -]+?)[.!]?$", rules.clean_value(chg.context))
        best = _bind(set(rules.content_words(m.group("np"))), chg.old_hint, cands) if m else None
        value = rules.trim_time(m.group("val")) if m else ""
        if best is not None and value and rules.normalise(value) != rules.normalise(best.value) and not set(
                rules.content_words(value)) <= set(rules.STOPWORDS):
            out.append(dataclasses.replace(best, value=value, kind="corrected", sources=sources))
    return out


def _retract(positive: str, clause: str, subject: str, cands: list[FactCandidate], previous: list[FactCandidate],
             sources: tuple[str, ...]) -> list[FactCandidate]:
    if positive == "":
        return [dataclasses.replace(f, kind="retracted", sources=sources) for f in previous]
    out = []
    for st in rules.parse_statements(positive, subject):
        f = _candidate(st, "retracted", sources)
        same = [c for c in cands if (c.entity == f.entity or set(rules.content_words(c.entity)) & set(rules.content_words(
            f.entity))) and (c.attribute == f.attribute or set(rules.content_words(c.value)) & set(rules.content_words(f.value)))]
        out.append(dataclasses.replace(same[0], kind="retracted", sources=sources) if same else f)
    words = set(rules.content_words(clause))
    if not out:  # "Tendril is no longer on Postgres": match a known fact by entity and value words
        out = [dataclasses.replace(c, kind="retracted", sources=sources) for c in cands
               if set(rules.content_words(c.display_entity or c.entity)) <= words and set(rules.content_words(c.value)) & words]
    if not out:  # "we don't use Asana anymore": the value named in full
        out = [dataclasses.replace(c, kind="retracted", sources=sources) for c in cands
               if set(rules.content_words(c.value)) and set(rules.content_words(c.value)) <= words]
    if not out and not rules.parse_statements(positive, subject):  # "forget about the boat": what the fact is about
        about = {rules.task_stem(w) for w in rules.content_words(positive)}
        out = [dataclasses.replace(c, kind="retracted", sources=sources) for c in cands if about & {
            rules.task_stem(w) for w in rules.content_words(f"{c.display_entity} {c.display_attribute} {c.value}")}]
    return out[:3]


def _names_attribute(words: set[str], c: FactCandidate) -> bool:
    """"The chess lessons ended": the clause names all of a fact's attribute (two words or more)."""
    att = set(rules.content_words((c.display_attribute or c.attribute).replace("_", " ")))
    return len(att) >= 2 and att <= words


def _successor(facts: list[FactCandidate], text: str, sources: tuple[str, ...]) -> list[FactCandidate]:
    """"Ms. Ode retired, my new tutor is Mr. Bain" / "the kettle broke, the new one is a Smeg": what was withdrawn
    is corrected to the value named next; a value both corrected and withdrawn in one message stays corrected."""
    corrected = {(f.entity, f.attribute) for f in facts if f.kind == "corrected"}
    facts = [f for f in facts if not (f.kind == "retracted" and (f.entity, f.attribute) in corrected)]
    gone = [f for f in facts if f.kind == "retracted"]
    m = re.search(r"\b(?:the|my|our) new (?:one|[\w-]+(?: [\w-]+)?) (?:is|are|will be)\s+(?P<val>[^,;!?]+)", text, re.I)
    if len({(f.entity, f.attribute) for f in gone}) != 1 or not m:
        return facts
    said = [f for f in facts if f.kind == "stated" and rules.normalise(f.value) in rules.normalise(m.group("val"))]
    value = said[0].value if said else rules.clean_value(re.sub(r"^(?i:an?|the)\s+", "", rules.trim_time(m.group("val"))))
    if not value or value.split()[0].lower() in rules.PRONOUNS:
        return facts
    new = dataclasses.replace(gone[0], value=value, kind="corrected", sources=sources)
    return [new if f is gone[0] else f for f in facts if f.kind not in ("stated", "retracted") or f is gone[0]
            or (f.kind == "stated" and rules.normalise(f.value) != rules.normalise(value))]


def _request(text: str) -> tuple[str, str] | None:
    """(task class, request body) of the first task request in ``text``."""
    found = ((rules.task_class(sn), req[1]) for sn in rules.split_sentences(text) if (req := rules.parse_request(sn)))
    return next(((cls, body) for cls, body in found if cls), None)


def _last_request(hist: list[ChatMessage], speaker: str) -> tuple[str, str, tuple[str, ...]] | None:
    """The task in progress: (class, body, steps) of the last request in history."""
    for i in range(len(hist) - 1, -1, -1):
        msg, after = hist[i], hist[i + 1].content.removeprefix(PREFIX) if i + 1 < len(hist) else ""
        req = _request(msg.content) if msg.role == "user" and not rules.is_instruction(msg.content) else None
        if req:
            subject = _subject(msg.speaker or speaker, msg.content)
            steps = rules.parse_steps(msg.content, subject) or rules.parse_steps(after) or rules.default_plan(req[0])
            return req[0], rules.to_third_person(req[1], subject), steps
    return None


def _procedure_steps(lines: tuple[str, ...], cls: str) -> tuple[str, tuple[str, ...]]:
    for m in read_memory_lines(lines):
        if m.store == "procedural" and rules.same_task(m.id.split("@")[0], cls):
            return m.id, tuple(s.strip(" .") for s in re.findall(r"\d+\.\s+(.+?)(?=;\s*\d+\.|$)", m.text))
    return "", ()


_TASK_NAMED = re.compile(r"\btask '([^']{1,80})'")


def _known_classes(ex: Exchange, hist: list[ChatMessage], subject: str) -> list[str]:
    """Task classes named before: procedures and task episodes recalled for this exchange, earlier messages."""
    out = list(ex.known_tasks)
    for m in read_memory_lines(ex.recalled):
        if m.store == "procedural":
            out.append(m.id.split("@")[0])
        out += _TASK_NAMED.findall(m.text)
    for msg in hist:
        out += _TASK_NAMED.findall(msg.content)
        if msg.role == "user":
            d = rules.parse_procedure(msg.content, subject)
            out += [rules.title_class(d[0])] if d and d[0] else []
    return [c for c in dict.fromkeys(out) if c]


def _class_for(title: str, known: list[str]) -> str:
    """The class of a titled task: a known class naming the same task, else one made from the title."""
    cls = rules.title_class(title)
    return next((k for k in known if rules.similar_task(k, cls)), cls) if cls else ""


def _described(text: str, hist: list[ChatMessage], ex: Exchange, subject: str) -> tuple[str, tuple[str, ...]] | None:
    """(task class, steps) of a task the user told with its steps, here or (for a save request or an outcome
    that only lists steps) in the conversation just before; None when there is none or a request came later."""
    known = _known_classes(ex, hist, subject)
    found = rules.parse_procedure(text, subject)
    users = [m for m in reversed(hist) if m.role == "user"]
    if found and not found[0]:  # steps without a title: the task was named in the message before
        named = next((m.content for m in users[:1] if not rules.is_question(m.content.strip())
                      and len(m.content.split()) <= 15 and not rules.parse_procedure(m.content, subject)), "")
        cls = _class_for(rules.strip_fillers(rules.split_sentences(named)[0]) if named else "", known)
        return (cls, found[1]) if cls else None
    if found:
        cls = _class_for(found[0], known)
        return (cls, found[1]) if cls else None
    if not rules.save_requested(text):
        return None
    for msg in users[:3]:  # a save request after the steps were told
        if _request(msg.content):
            return None
        d = rules.parse_procedure(msg.content, subject)
        if d and d[0]:
            cls = _class_for(d[0], known)
            return (cls, d[1]) if cls else None
    return None


@dataclass(frozen=True)
class _Reading:
    """What the stages read a message against: its text (prose only), the conversation before it, who speaks,
    and the facts said or known so far (candidates for a confirmation, correction, change or retraction)."""

    ex: Exchange
    text: str
    hist: list[ChatMessage]
    srcs: tuple[str, ...]
    subject: str
    name: str
    persona: tuple[str, ...]
    known: tuple[str, ...]
    prev_user: ChatMessage | None
    prev_reply: ChatMessage | None
    previous: list[FactCandidate]
    recent: list[FactCandidate]
    recent_said: list[FactCandidate]
    cands: list[FactCandidate]


def _opening(ex: Exchange) -> _Analysis | None:
    """Stage 1, the opening: a message with no content (chit-chat) or an instruction to the assistant is
    answered at once, with nothing read from it; None: read on."""
    text = ex.user_text.strip()
    chit, instruction = not _has_content(text), _has_content(text) and rules.is_instruction(text)
    return _Analysis(instruction=instruction, chit=chit) if chit or instruction else None


def _reading(ex: Exchange) -> _Reading:
    """What the later stages read the message against (statements are read from sentences, not from code,
    tables or logs)."""
    text = ex.user_text.strip()
    text = prose(text).strip() or text
    hist, srcs = _prior(ex), tuple(ex.message_ids)
    subject = _subject(ex.speaker, text)
    persona = (ex.persona,) if ex.persona else ()
    known = persona + tuple(x for x in ex.recalled if x.lstrip().startswith("[semantic")) + tuple(
        f"{e} {at.replace('_', ' ')}: {v}" for e, at, v in ex.known_facts)  # a known fact said again adds nothing
    prev_user = next((m for m in reversed(hist) if m.role == "user"), None)
    prev_reply = hist[-1] if hist and hist[-1].role == "assistant" else None
    previous = _message_facts(prev_user, ex.speaker) if prev_user else []
    said = [f for m in reversed(hist) if m.role == "user" for f in _message_facts(m, ex.speaker)]
    recent = [f for m in list(reversed(hist))[:4] if m.role == "user" for f in _message_facts(m, ex.speaker)]
    recent_said = next((fs for m in reversed(hist) if m.role == "user" and (fs := _message_facts(m, ex.speaker))), [])
    cands = said + [f for m in reversed(hist) if m.role != "user" for f in _message_facts(m, ex.speaker)]
    cands += [FactCandidate(e, at, v, "", (), e, at.replace("_", " ")) for e, at, v in ex.known_facts]
    return _Reading(ex, text, hist, srcs, subject, subject or "The user", persona, known, prev_user, prev_reply,
                    previous, recent, recent_said, cands)


def _clause_facts(r: _Reading, clause: str, who: str, marked: bool) -> list[FactCandidate]:
    """The facts of one clause, by what it does: confirms ("confirmed: ..."), withdraws ("X was
    decommissioned"), changes, retracts, corrects, or states."""
    srcs, cands = r.srcs, r.cands
    m = re.match(r"^(?i:confirmed|to confirm)\s*[:,]\s*(.+)$", clause)
    positive = rules.parse_retraction(clause)
    gone = rules.parse_dropped(clause) if positive is None and not m else ""
    if gone:  # the facts whose value or subject it is are withdrawn
        words = set(rules.content_words(gone))
        return [dataclasses.replace(c, kind="retracted", sources=srcs) for c in cands
                if words & set(rules.content_words(f"{c.value} {c.display_entity or c.entity}"))
                or _names_attribute(words, c)][:3]
    chg = rules.parse_change(clause, marked) if not m and positive is None else None
    changed = _changed(chg, who, cands, r.recent, srcs) if chg else []
    corr = rules.parse_correction(clause, marked) if not m and positive is None and not changed else None
    if changed:
        return changed
    if m:
        return [_candidate(st, "confirmed", srcs) for st in rules.parse_statements(m.group(1), who)]
    if positive is not None:
        return _retract(positive, clause, who, cands, r.previous or r.recent_said, srcs)
    if corr and corr.statement:
        return [_candidate(st, "corrected", srcs) for st in rules.parse_statements(corr.statement, who)]
    if corr:
        fixed = _resolve(corr, cands, srcs)
        return [fixed] if fixed else []
    return [_candidate(st, "stated", srcs) for st in rules.parse_statements(clause, who)]


def _clauses(r: _Reading, a: _Analysis) -> tuple[str, list[str]]:
    """Stage 2, the clauses: a confirmation of what was just said, then sentence by sentence (questions set
    aside, the opening markers read off the first ones) each clause's facts, pronouns resolved against the
    thing and the person just named. Adds to ``a.facts``; returns the text after a confirmation and what is left
    for the episode (the questions, and the clauses that stated no more than facts)."""
    ex, hist, subject = r.ex, r.hist, r.subject
    rest, leftover = r.text, []
    conf = rules.confirmation(r.text)
    if conf is not None:
        confirmed = r.previous or (_message_facts(r.prev_reply, ex.speaker) if r.prev_reply else [])
        a.facts += [dataclasses.replace(f, kind="confirmed", sources=r.srcs) for f in confirmed]
        rest = conf
    marked, opening = False, True  # the message's opening markers, read off its first sentences
    asked = r.prev_user is not None and rules.is_question((rules.split_sentences(r.prev_user.content) or [""])[-1])
    just_said = [] if asked else r.previous or (_message_facts(r.prev_reply, ex.speaker) if r.prev_reply else [])
    thing = r.recent_said[-1].display_entity if r.recent_said else r.cands[0].display_entity if r.cands else ""
    person = next((p for m in reversed(hist) if m.role == "user" and (p := rules.last_person(m.content))), "")
    for sentence in rules.split_sentences(rest):
        if rules.is_question(sentence):
            leftover.append(sentence)
            continue
        read = sentence
        if opening:  # a negation marks a correction only of what was just said: a fact stated the turn before
            read, mark = rules.read_opening(sentence)
            if mark == "no" and not just_said:
                read, mark = sentence, ""  # an answer, not a correction
            marked, opening = marked or bool(mark), not read
            if not read:  # only a marker: it bears on the sentences after it
                continue
        clauses, kept = rules.split_clauses(rules.strip_fillers(read)), []
        for spoken in clauses:
            n_facts = len(a.facts)
            first = rules.as_first_person(spoken) if person else ""  # of the person just named
            clause, who = (first, person) if first else (rules.resolve_pronouns(spoken, thing, person), subject)
            if rules.echoes(clause, r.persona) or rules.pastes(clause, ex.recalled):  # a user saying a fact again is fine
                continue
            a.facts += _clause_facts(r, clause, who, marked)
            if len(a.facts) == n_facts or all(f.kind == "stated" for f in a.facts[n_facts:]):
                kept.append(spoken)
        thing = rules.last_thing(sentence) or (a.facts[-1].display_entity if a.facts else "") or thing
        person = rules.last_person(sentence) or person
        leftover += [" \u2014 ".join(kept).rstrip(".!") + "."] if len(kept) < len(clauses) and kept else []
        leftover += [sentence] if len(kept) == len(clauses) else []
    return rest, leftover


def _fact_kinds(r: _Reading, facts: list[FactCandidate]) -> list[FactCandidate]:
    """Stage 3, the fact kinds: a successor named after a change, one fact per (entity, attribute, kind) (the
    first wins), no secret, and no stated fact the soul already knows."""
    facts = _successor(facts, r.text, r.srcs)
    unique = {(f.entity, f.attribute, f.kind): f for f in reversed(facts)}
    return [f for f in unique.values() if not rules.SECRET.search(f.attribute + " " + f.value) and not (
        f.kind == "stated" and rules.echoes(f"{f.display_entity} {f.display_attribute} {f.value}", r.known))][::-1]


def _tasks(r: _Reading, a: _Analysis, rest: str) -> tuple[str, bool]:
    """Stage 4, the tasks: a request here, a task told with its steps, or an outcome / "save this as a
    procedure" for the last request in history. Sets ``a.task`` and what goes with it; returns the outcome and
    whether saving was asked."""
    ex, text, hist, subject = r.ex, r.text, r.hist, r.subject
    req = _request(text)
    if req:
        cls, steps = next((k for k in ex.known_tasks if rules.same_task(k, req[0])), req[0]), rules.parse_steps(text, subject)
        a.request, a.task_body, a.explicit_steps = cls, rules.to_third_person(req[1], subject), bool(steps)
        steps = steps or _procedure_steps(tuple(ex.recalled), cls)[1] or rules.default_plan(cls)
        a.task = TaskReport(cls, steps, "", rules.save_requested(text))
    outcome, save = rules.detect_outcome(rest), rules.save_requested(text)
    told = rules.parse_procedure(text, subject) if not a.task else None
    outcome = rules.detect_outcome(rest, reported=True) if told else outcome
    described = _described(text, hist, ex, subject) if not a.task and (outcome or save) else None
    if described:  # a task told with its steps
        a.task, a.task_body, a.reported = TaskReport(described[0], described[1], outcome, save), f"'{described[0]}'", True
        a.facts = [f for f in a.facts if f.kind != "stated"]
    last = _last_request(hist, ex.speaker) if not a.task and (outcome or save) else None
    if last:
        cls = next((k for k in ex.known_tasks if rules.same_task(k, last[0])), last[0])
        a.task, a.task_body = TaskReport(cls, last[2], outcome, save), last[1]
    return outcome, save


ASKED_WORDS = 4
"""A question naming at least this many distinct content words ("how do I point the Alpaca sandbox's webhook
at my Docker container?") is kept as an event, in its own words: what it names (a tool, a service, an error, a
preference stated on the way) is what the speaker works on. Fewer ("how was your weekend?") is small talk."""


def _episode(r: _Reading, a: _Analysis, rest: str, leftover: list[str], outcome: str, save: bool) -> None:
    """Stage 5, the episode: the line kept of the message (what its facts and task leave out, the task's own
    lines, an elliptic answer with the question it answers), then the message's kind and entities."""
    ex, text, hist, name, subject = r.ex, r.text, r.hist, r.name, r.subject
    assistant, addressee = _voices(ex, hist)
    prev = hist[-1] if hist else None
    when = ex.at if ex.at > 0 else None
    general = "" if a.request else episode.episode_text(" ".join(leftover), name, at=when, addressee=addressee)
    if save and a.task and not outcome and rules.collapse(rules.strip_fillers(text)).count(" ") < 8:
        general = ""
    parts = [f"{name} {verb}: {_render(a.of_kind(kind))}." for kind, verb in
             (("confirmed", "confirmed"), ("corrected", "corrected"), ("retracted", "withdrew")) if a.of_kind(kind)]
    if a.request and a.task:
        parts += [f"{name} asked {assistant} to {a.task_body}."] + ["Steps: " + "; ".join(a.task.steps) + "."] * a.explicit_steps
    gist = rules.question_gist(prev.content.removeprefix(PREFIX), name) if prev and prev.speaker != ex.speaker else ""
    elliptic = bool(gist) and rules.is_elliptic(episode.split_photo(rest)[0])
    if not parts and elliptic:
        general = ""  # an answer that leans on the question: stored with it below
    task = a.task
    told_line = _told_line(task, name) if task and a.reported else ""
    if general and rules.content_words(general) and (not told_line or episode.adds_to(told_line, general)):
        parts.append(general)  # beside a told task's line for what that line leaves out (a date, a place, a photo)
    if task and told_line:  # later runs of the task are recognised by this line
        parts += [told_line] + [f"{name} asked to save '{task.task_class}' as a procedure."] * save
    elif a.task:
        parts += [f"The task to {a.task_body} {'succeeded' if a.task.outcome == 'success' else 'failed'}."] * bool(
            a.task.outcome) + [f"{name} asked to save '{a.task.task_class}' as a procedure."] * save
    if not parts and prev and elliptic:
        parts.append(episode.episode_text(rest, name, at=when, addressee=addressee, question=gist))
        a.extra_sources = (prev.id,) if getattr(prev, "id", "") else ()
    if not parts and (a.facts or a.task):
        parts.append(episode.episode_text(text, name, at=when, addressee=addressee) or f"{name}: {_render(a.facts)}.")
    a.episode = rules.cap(" ".join(p for p in parts if p), 2 * episode.LIMIT)
    _kind(a, text, name)
    a.entities = _entities(a, text, subject)


def _voices(ex: Exchange, hist: list[ChatMessage]) -> tuple[str, str]:
    """Who the assistant is (the name its persona gives it, else "the assistant") and whom the message
    addresses: the user who spoke before, else the named assistant, else no one ("")."""
    named = re.search(r"\b(?:[Yy]ou are|I am|I'm|name is)\s+([A-Z][a-z]+)\b", ex.persona)
    assistant = named.group(1) if named else "the assistant"
    prev = hist[-1] if hist else None
    addressee = (prev.speaker if prev and prev.role == "user" and prev.speaker and prev.speaker != ex.speaker
                 else assistant if named else "")
    return assistant, addressee


def _told_line(task: TaskReport, name: str) -> str:
    """The episode's line for a task the speaker says they did (later runs of the task are recognised by it)."""
    return (f"{name} {'did' if task.outcome != 'failure' else 'tried'} the task '{task.task_class}'"
            f"{' (' + task.outcome + ')' if task.outcome else ''}: " + "; ".join(task.steps) + ".")


def _kind(a: _Analysis, text: str, name: str) -> None:
    """The message's kind: an event (it holds a fact, a task or an episode), a question worth keeping (its
    episode is what was asked), or chit-chat."""
    a.event = bool(a.facts or a.task or a.episode)
    asked = any(rules.is_question(s) and len(rules.content_words(s)) >= 2 for s in rules.split_sentences(text))
    if asked and not a.event and len(set(rules.content_words(text))) >= ASKED_WORDS:
        a.episode = rules.cap(f"{name} asked: {rules.strip_fillers(rules.collapse(text))}", 2 * episode.LIMIT)
        a.event = True  # what was asked about is kept: the things a question names say what the speaker works on
        a.question = True
    else:
        a.question = asked and not a.event
    a.chit = not a.event and not a.question


def _entities(a: _Analysis, text: str, subject: str) -> tuple[str, ...]:
    """The things the message names, its facts' entities and its speaker, each once in its first spelling."""
    found = rules.entities(text) + [f.display_entity for f in a.facts] + [subject] * (subject.lower() not in rules.GENERIC_SPEAKERS)
    firsts = {e.lower(): e for e in reversed(found) if e}  # the first spelling of each, in order of appearance
    return tuple(firsts[k] for k in dict.fromkeys(e.lower() for e in found if e))


def analyse(ex: Exchange, *, for_reply: bool = False) -> _Analysis:
    """What a message says (facts, task, episode, kind), in five stages: the opening, the clauses, the fact
    kinds, the tasks and the episode. ``for_reply``: only what the reply needs; the episode is skipped when facts
    or a task already make the message an event (the reply never shows it)."""
    a = _opening(ex)
    if a is not None:
        return a
    a, r = _Analysis(), _reading(ex)
    rest, leftover = _clauses(r, a)
    a.facts = _fact_kinds(r, a.facts)
    outcome, save = _tasks(r, a, rest)
    if for_reply and (a.facts or a.task):
        a.event = True
        return a
    _episode(r, a, rest, leftover, outcome, save)
    return a


def _categories(a: _Analysis, text: str) -> tuple[str, ...]:
    """PERSIST_CATEGORIES that apply; () when the exchange carries nothing worth keeping."""
    found = {
        "preference": any(f.attribute.startswith(("prefers", "likes", "dislikes", "favourite")) for f in a.facts) or re.search(
            r"\b(?:i|we)\s+(?:really\s+|also\s+)?(?:prefer|like|love|enjoy|hate|dislike)\b|\bfavou?rite\b", text, re.I),
        "fact": a.facts, "decision": re.search(r"\b(?:decided|decide to|(?:we'll|let's|going) go with|chose|settled on|"
                                               r"agreed to)\b", text, re.I),
        "plan": re.search(r"\b(?:plan(?:ning)? to|going to|gonna|will|next (?:week|month|year)|tomorrow|intend|"
                          r"hoping to|thinking about|scheduled)\b", text, re.I),
        "task": a.task, "event": True}
    return tuple(k for k, v in found.items() if v) if a.event else ()


def extraction(a: _Analysis) -> Extraction:
    """What the analysis found, as the write path takes it (the episode: its factual unit)."""
    return Extraction(facts=tuple(a.facts), episode=a.episode, event=a.event, entities=a.entities, task=a.task,
                      extra_sources=a.extra_sources)


class OfflineModel(LanguageModel):
    """Rule-based stand-in for a real model: what runs without an API key."""

    model_id = "soul-offline-rules-v1"
    offline = True

    def __init__(self) -> None:
        self._last = threading.local()  # the tag and the extraction of one exchange share one analysis

    def _analyse(self, exchange: Exchange) -> _Analysis:
        last = getattr(self._last, "pair", None)
        if last is not None and (last[0] is exchange or last[0] == exchange):
            return last[1]
        a = analyse(exchange)
        self._last.pair = (exchange, a)
        return a

    def decide(self, exchange: Exchange) -> MemoryDecision:
        """The persistence tag and the extraction, from one analysis of the exchange."""
        a = self._analyse(exchange)
        inp = exchange.user_text + exchange.reply_text + "".join(m.content for m in exchange.history)
        if a.instruction:
            return MemoryDecision(False, (), "instruction", usage=_usage(inp, "instruction"))
        cats = _categories(a, exchange.user_text)
        if not cats:
            reason = "empty" if not _has_content(exchange.user_text) else "question" if a.question else "chit-chat"
            return MemoryDecision(False, (), reason, usage=_usage(inp, reason))
        ext = extraction(a)
        reason = "content: " + ", ".join(cats)
        return MemoryDecision(True, cats, reason, ext, _usage(inp, reason + a.episode + repr(ext.facts) + repr(ext.task)))

    def classify_task(self, text: str, known: tuple[str, ...]) -> TaskClassification:
        cls = rules.task_class(text)
        match = next((k for k in known if k == cls), None) or next((k for k in known if cls and rules.same_task(k, cls)), None)
        confidence = 0.0 if cls is None else 1.0 if match == cls else 0.8 if match else 0.6
        return TaskClassification(match or cls, confidence, _usage(text, match or cls or "none"))

    def reply(self, request: ReplyRequest) -> ModelReply:
        text, user = request.user_text, request.user if request.user.lower() not in rules.GENERIC_SPEAKERS else ""
        lines = [m for m in read_memory_lines(request.memory_lines) if m.id]
        known = tuple((m.id.split(":")[0], m.id.split(":", 1)[1], m.text.rsplit(": ", 1)[-1])
                      for m in lines if m.store == "semantic" and ":" in m.id)
        ex = Exchange(text, "", request.user, (), 0.0, recalled=tuple(request.memory_lines), history=request.history,
                      known_facts=known)
        a = analyse(ex, for_reply=True)
        parts = _acknowledged(a, request.memory_lines)
        relevant = _relevant(lines, text, a)
        if not a.instruction and (a.question or not parts) and not a.chit:
            for m in relevant:
                tag = _STORE_TAG.get(m.store, m.store)
                parts.append(f"From memory [{tag} {m.id}]: {m.text.rstrip('.')}.")
            if not relevant:
                parts.append("I don't have anything on that yet." if a.question else "Noted.")
        if not parts:
            talk = next((say for rx, say in _SMALL_TALK if re.search(rx, text.lower())), "Glad to hear it.")
            parts.append(talk.format(user=", " + user if user else ""))
        out = PREFIX + " ".join(parts)
        inp = request.system + "".join(request.memory_lines) + "".join(m.content for m in request.history) + text
        return ModelReply(out, _usage(inp, out))


def _acknowledged(a: _Analysis, memory_lines: tuple[str, ...]) -> list[str]:
    """What the reply says of the message itself: a refused instruction, the facts it confirmed, corrected,
    withdrew or stated, the plan for a task it asks for (a stored procedure's steps when there is one) or the
    outcome of one it reports, and a procedure it asks to save."""
    parts: list[str] = []
    if a.instruction:
        parts.append("That reads like an instruction to change how I work, so I won't follow it or store it.")
    for kind, say in (("confirmed", "Thanks, confirmed: {}."), ("corrected", "Updated: {}."),
                      ("retracted", "Understood, I'll treat this as no longer true: {}."),
                      ("stated", "Noted: {} \u2014 is that right?")):
        facts = a.of_kind(kind)
        if facts and not (kind == "stated" and all(f.attribute == "name" and f.entity == rules.entity_key(f.value)
                                                   for f in facts)):  # a self-introduction needs no check
            parts.append(say.format(_render(facts)))
    if a.request and a.task:
        pid, steps = _procedure_steps(memory_lines, a.request)
        plan = a.task.steps if a.explicit_steps or not steps else steps
        head = f"I'll follow procedure [procedure {pid}]" if steps and not a.explicit_steps else "Plan"
        parts.append(f"{head} for '{a.request}': " + "; ".join(f"{i + 1}. {s}" for i, s in enumerate(plan)) + ".")
    elif a.task and a.task.outcome:
        parts.append(f"{'Great' if a.task.outcome == 'success' else 'Sorry to hear that'}, recording a "
                     f"{a.task.outcome} for '{a.task.task_class}'.")
    if a.task and a.task.save_requested:
        parts.append(f"I'll save '{a.task.task_class}' as a procedure.")
    return parts


def _relevant(lines: list[MemoryLine], text: str, a: _Analysis) -> list[MemoryLine]:
    """Up to three memory lines the message's words point to, the best first (a procedure's lines not when the
    message asks for a task: its plan shows them); for a message about a time ("what happened three sessions
    ago") without such words, the dated lines, the best day first."""
    qwords = set(rules.content_words(text))
    scored = [(len(qwords & set(rules.content_words(m.text + " " + re.sub(r"[:_@]", " ", m.id)))), i, m)
              for i, m in enumerate(lines) if not (m.store == "procedural" and a.request)]
    top = max((s for s, _, _ in scored), default=0)
    relevant = sorted((x for x in scored if x[0] >= max(1, top // 2)), key=lambda x: (-x[0], x[1]))[:3]
    if not relevant and query_scope(text, 0.0) is not None:
        relevant = [x for x in scored if x[2].store == "episodic"][:3]
    return [m for _, _, m in relevant]


_SMALL_TALK = ((r"\b(?:bye|talk soon|see you (?:soon|later|tomorrow)|take care|later)\b", "Talk soon!"),
               (r"\b(?:thanks|thank you|thx|cheers)\b", "You're welcome!"),
               (r"\bhow (?:are|have) you\b|how's it going", "Doing well, thanks \u2014 ready when you are."),
               (r"\b(?:hi|hey|hello|morning|good to see you)\b", "Hello{user}! What are we working on today?"))
