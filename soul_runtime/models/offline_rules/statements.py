"""Fact statements: a clause read as (entity, attribute, value), first person mapped to the speaker."""

from __future__ import annotations

import re

from soul_runtime.models.offline_rules.chat import is_hearsay, is_hypothetical, is_question
from soul_runtime.models.offline_rules.cleaning import (
    attribute_key,
    clean_value,
    split_clauses,
    split_sentences,
    strip_fillers,
)
from soul_runtime.models.offline_rules.reading import parse_predicate
from soul_runtime.models.offline_rules.relations import _plain_form, is_timeish, parse_relation, trim_time
from soul_runtime.models.offline_rules.values import _NOT_NAMES, Statement, _bad_entity, _head, _named, _value
from soul_runtime.models.offline_rules.words import memo

_ENT = r"(?P<ent>[A-Z][\w.+-]*(?:\s+[A-Z][\w.+-]*){0,3}|[a-z]+-\d+)"
_IS = r"\s+(?:is|are)\s+(?:now\s+)?(?P<val>.+)$"
_NAME = re.compile(r"^(?i:my name is|i'm|i am|call me|this is)\s+(?P<name>[A-Z][a-z]+(?:\s+[A-Z][a-z]+)?)\b(?P<rest>.*)$")
_ROLE = re.compile(r"^(?i:i'm|i am|i work as|i'm working as)\s+(?:an?)\s+(?P<role>.+?)"
                   r"(?:\s+(?P<prep>on|in|at|with|for|of)\s+(?:the\s+)?(?P<rest>.+))?$")
_ROLE_BAD = frozenset("bit little lot big huge great good real total bad mess wreck part fan kind sort "
                      "couple few while".split())
_TEAM = re.compile(r"^(?i:i'm|i am|i work|i'm working)\s+(?i:on|in|with|for)\s+(?:the\s+)?(?P<team>.+?\bteam)$")
_WORK_AT = re.compile(r"^(?i:i work|i'm working|i am working)\s+(?i:at|for)\s+(?P<org>[A-Z].*)$")
_FROM = re.compile(r"^(?i:i'm|i am|i come)\s+(?i:originally\s+)?from\s+(?P<val>[A-Z].*)$")
_LIVE = re.compile(r"^(?i:i live|i'm living|i am living|i moved|i've moved|i just moved|i'm based|i am based|i'm located|"
                   r"i am located|i work|i'm working|i am working)\s+(?i:in|to|from)\s+(?P<val>[A-Z].*)$")
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


def find_name(text: str) -> str:
    """A self-introduced name ("I'm Maya", "my name is Maya"), else ''."""
    clauses = [c for sentence in split_sentences(text) for c in split_clauses(strip_fillers(sentence))]
    names = [m.group("name") for m in map(_NAME.match, clauses) if m]
    return next((n for n in names if n.split()[0].lower() not in _NOT_NAMES), "")


_LEAD_IN = re.compile(r"^[A-Za-z][\w'-]*(?:\s+[\w'-]+){0,7}?,\s+(?:so\s+|and\s+|but\s+)?(?=(?:the|our|my|their)\b|[A-Z])")


@memo
def parse_statements(clause: str, subject: str) -> list[Statement]:
    """Facts stated in one clause; first person maps to ``subject`` (skipped when '')."""
    out = _statements(clause, subject)
    lead = _LEAD_IN.match(clause.strip())
    if not out and lead:  # "<lead-in>, the <thing> is …": a lead-in before the statement
        out = _statements(clause.strip()[lead.end():], subject)
    if subject:
        out = [Statement(st.entity, st.attribute, re.sub(r"\b[Mm]y\b", lambda _: subject + "'s", st.value), st.key) for st in out]
    return out


def _statements(clause: str, subject: str) -> list[Statement]:
    s = clean_value(re.sub(r"^(?i:i think|i believe|i guess|remember|note|just so you know)(?:\s+that)?[,\s]+", "",
                           clause.replace("\u2019", "'")))
    if not s or is_question(clause) or is_hypothetical(s) or is_hearsay(s):
        return []
    s = _plain_form(s)
    if subject:
        mine = _about_me(s, subject)
        if mine is not None:
            return mine
    return _about_others(s, subject)


def _about_me(s: str, subject: str) -> list[Statement] | None:
    """What a first-person clause says of ``subject`` (its name, role, employer, likes, ...); None when it is
    none of those forms (the clause is then read as about someone or something else)."""
    out: list[Statement] = []
    m = _NAME.match(s)
    if m and m.group("name").split()[0].lower() not in _NOT_NAMES:
        out.append(Statement(subject, "name", m.group("name")))
        rest = m.group("rest").strip(" ,")
        if re.match(r"^(?i:and\s+)?(?i:an?)\s", rest):
            out += _statements("I am " + re.sub(r"^(?i:and\s+)", "", rest), subject)
        return out
    m = _ROLE.match(s)  # "I'm a senior SRE on the platform team", "I'm a big fan of jazz"
    if m:
        return _role(m, subject)
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
    m = _MY.match(s)  # "my favourite font is Inter", "my dog's name is <name>"
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
    return None


def _role(m: re.Match[str], subject: str) -> list[Statement]:
    """The role a first-person clause names ("I'm a senior SRE on the platform team", "I'm a big fan of jazz"),
    with the team or employer it names beside it."""
    out: list[Statement] = []
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


def _about_others(s: str, subject: str) -> list[Statement]:
    """What a clause says of someone or something: a predicate, a relation, a preference, an attribute."""
    pred = parse_predicate(s, subject)
    if pred:
        return pred
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
