"""Junk and poisoning guards, applied to every model's extraction (pure).

Whatever the model says, these never become memories:

* text that tries to instruct the agent ("ignore previous instructions",
  "from now on always …", "you must obey me", jailbreaks, the same in German,
  Spanish, French, Italian and Portuguese) — no fact, no procedure, no task, no episode;
* text that impersonates the system, a tool call or a recalled memory line
  ("[SYSTEM] …", ``{"tool": …, "args": …}``, "[semantic maya:role] …"), and
  script / HTML injection — nothing at all;
* the soul's own system prompt, and memories recalled for this turn, repeated back;
* confirmations or saved procedures whose content came only from such an
  injected message earlier in the conversation;
* credentials (passwords, API keys, tokens) as facts, and procedure steps that
  switch off safety controls or destroy logs, backups or audit trails.
"""

from __future__ import annotations

import functools
import re
from dataclasses import replace

from soul_runtime.models.base import ChatMessage, Exchange
from soul_runtime.records import Extraction, FactCandidate, TaskReport
from soul_runtime.text import GatedPattern, normalise

# Each branch with words one of which every text it matches holds (in some letter case).
_INSTRUCTION = GatedPattern([
    (r"\b(ignore|disregard|forget|override)\b[^.]{0,40}\b(previous|prior|above|earlier|all|your)\b[^.]{0,30}"
     r"\b(instructions?|rules?|prompts?|guidelines|directives)\b", ("ignore", "disregard", "forget", "override")),
    (r"\bfrom now on,?\s+(you|always|never|please|do|don't|reply|respond|answer|call|treat|remember|ignore)\b",
     ("from now on",)),
    (r"\bgoing forward,? (you|always|never)\b", ("going forward",)),
    (r"\byou (must|should|will) (always|never)\b", ("always", "never")),
    (r"(^|[.!?;:]\s*|\byou\s+|\bplease\s+)(always|never) (approve|obey|follow|reveal|answer|say|reply|respond"
     r"|comply|execute|run|trust|ignore|skip|share|send|store|save|remember)\b", ("always", "never")),
    (r"\bsystem prompt\b|\bnew instructions\b|\byour instructions\b", ("system prompt", "instructions")),
    (r"(^|[.!?]\s*|\bplease\s+|\bnow\s+)act as\b|\bact (as|like) (an?|my) \w+ (ai|assistant|model|bot)\b",
     ("act as", "act like")),
    (r"\bpretend (to be|you are|you're)\b", ("pretend",)),
    (r"\bjailbreak\b|\b(dan|stan|dude|god|jailbreak|jailbroken) mode\b|\bdeveloper mode\b",
     ("jailbreak", " mode")),
    (r"\bremember that you (must|should|will)\b", ("remember that you",)),
    (r"\bdo anything now\b", ("do anything now",)),
    (r"\b(store|save|remember|record) (this|that|the following)?\s*(as )?(a )?(fact|memory|procedure)\b.{0,20}:",
     ("store", "save", "remember", "record")),
    (r"\byou are (now )?(no longer|an? unrestricted)\b", ("you are",)),
    # obedience, permissions and persona swaps
    (r"\byou (must|shall|will|have to|need to) (obey|comply|follow my|do (what|whatever|as) i)\b",
     ("obey", "comply", "follow my", "do what", "do as")),
    (r"\bobey me\b|\b(obey|follow) (only )?my (orders|instructions|commands)\b", ("obey me", "my orders",
                                                                                 "my instructions", "my commands")),
    (r"\byou(?: are|'re)? (now )?(allowed|permitted|authori[sz]ed|free) to\b",
     ("allowed to", "permitted to", "authorised to", "authorized to", "free to")),
    (r"\b(unfiltered|uncensored) (ai|assistant|model|mode|answers?)\b", ("unfiltered", "uncensored")),
    (r"\b(ai|assistant|model|bot|you)\b[^.]{0,30}\b(without|with no) (any )?(rules|restrictions|filters|limits"
     r"|guardrails)\b", ("without", "with no")),
    # German, Spanish, French, Italian, Portuguese
    (r"\b(ignoriere|ignorier|vergiss|missachte|übergehe)\b[^.!?]{0,50}\b(anweisungen|regeln|vorgaben|instruktionen"
     r"|befehle|richtlinien)\b", ("ignorier", "vergiss", "missachte", "übergehe")),
    (r"\bab (jetzt|sofort) (immer|nie|musst|sollst)\b|\bdu musst (immer|mir gehorchen)\b",
     ("ab jetzt", "ab sofort", "du musst")),
    (r"\b(ignora|olvida|omite|ignore|oublie|oubliez|ignorez|dimentica|esqueça|esqueca)\b[^.!?]{0,50}"
     r"\b(instrucciones|reglas|indicaciones|instructions|règles|consignes|istruzioni|regole|instruções|instrucoes"
     r"|regras)\b", ("ignor", "olvida", "omite", "oubli", "dimentica", "esqueça", "esqueca")),
    (r"\b(de ahora en adelante|a partir de ahora|à partir de maintenant|désormais|d'ora in poi|a partir de agora)\b"
     r"[^.!?]{0,20}\b(siempre|nunca|toujours|jamais|sempre|mai|debes|dois|devi)\b",
     ("de ahora en adelante", "a partir de ahora", "à partir de maintenant", "désormais", "d'ora in poi",
      "a partir de agora")),
])

# Markup that impersonates the system, a tool call or the soul's own memory lines; script injection.
_FORGED = re.compile(
    r"^\W{0,4}(system|developer|admin|instructions?|assistant)\W{0,4}\s*[:\]>]"
    r"|\[(system|inst|/inst|admin|developer)\]|<\|?(im_start|im_end|system|endoftext)\|?>|<<sys>>"
    r"|<!--|</?\s*(script|iframe|object|embed|tool_call|function_call|tool_use|system)\b|\bjavascript:|\bon(error|load)\s*="
    r"|!\[[^\]]*\]\(\s*https?:"
    r"|[\"'](tool|function|tool_name|name|action)[\"']\s*:\s*[\"'][^\"']*[\"']\s*,\s*[\"'](args|arguments|parameters"
    r"|input|action_input)[\"']\s*:"
    r"|^\s*\[(semantic|episodic|procedural)\s+[^\]]+\]|\bfrom memory \[(fact|episode|procedure)\b",
    re.IGNORECASE | re.MULTILINE,
)

_SECRET = re.compile(r"\b(passwords?(?! manager)|passwd|passphrase|passcode|pin code|api[ _-]?keys?|secret[ _-]?keys?"
                     r"|(access|auth|bearer|session) ?tokens?|private[ _-]?keys?|credentials?|ssn"
                     r"|social security number)\b", re.IGNORECASE)

_STEP_LIST = re.compile(r"\bsteps?\s*:|\bprocedure\b|\brunbook\b|(^|\s)1[.)]\s+\S.*\s2[.)]\s+\S|\bfirst\b.{1,80}\bthen\b",
                        re.IGNORECASE | re.DOTALL)
_DANGEROUS_STEP = re.compile(
    r"\b(disable|turn off|switch off|mute|silence|pause|bypass|skip|remove)\b[^.;]{0,25}\b(alerts?|alerting|monitoring"
    r"|logging|audit\w*|reviews?|approvals?|tests?|backups?|firewall|2fa|mfa|authentication|security|safeguards?)\b"
    r"|\b(delete|wipe|erase|purge|destroy|shred|truncate|clear|rm -rf)\b[^.;]{0,25}\b(logs?|audit\w*|backups?"
    r"|history|evidence|trail)\b|\bforce[- ]push\b|\bchmod 777\b|\bcurl\b[^|]*\|\s*(ba)?sh\b",
    re.IGNORECASE,
)


_RECITED = re.compile(r"from memory \[", re.IGNORECASE)


_FORGED_MARKS = (":", "[", "]", "<", ">", "=")
"""Every branch of _FORGED needs one of these characters (none of them has another case)."""


def is_instruction(text: str) -> bool:
    """Does the text try to instruct the agent (rather than tell it something)?"""
    return _INSTRUCTION.search(text.replace("\u2019", "'"))


def is_forged(text: str) -> bool:
    """Does the text impersonate the system, a tool call or a memory line, or inject script?"""
    return any(c in text for c in _FORGED_MARKS) and bool(_FORGED.search(text))


@functools.lru_cache(maxsize=8192)  # pure; a soul's recent history is checked again each turn
def is_injection(text: str) -> bool:
    """An instruction, forged markup, or a list of steps that switches off safety controls / destroys records."""
    return is_instruction(text) or is_forged(text) or bool(_STEP_LIST.search(text) and is_dangerous_step(text))


def is_dangerous_step(step: str) -> bool:
    """A procedure step that switches off a safety control or destroys logs, backups or audit trails."""
    return bool(_DANGEROUS_STEP.search(step))


def _echoes(value: str, known: list[str]) -> bool:
    v = normalise(value)
    return len(v) >= 12 and any(v in k for k in known)


def _fact_text(f: FactCandidate) -> str:
    return normalise(f"{f.display_entity or f.entity} {f.display_attribute or f.attribute} {f.value}")


def _quotes(text: str, source: str, n: int = 6) -> bool:
    """Does ``text`` contain ``n`` consecutive words of ``source`` (a system prompt quoted inside a sentence)?"""
    words = source.split()
    return len(words) >= n and any(" ".join(words[i:i + n]) in text for i in range(len(words) - n + 1))


def _unfounded(value: str, user: str, history: tuple[ChatMessage, ...]) -> bool:
    """Does ``value`` (not said in this turn) come only from injected messages earlier in the conversation, or
    from the soul reciting its own memories ("From memory [fact …]") — i.e. nothing real to confirm?"""
    v = normalise(value)
    if not v or v in user:
        return False

    def baseless(i: int) -> bool:  # an injection, or the soul's answer to one, or the soul reciting memories
        m = history[i]
        if m.role == "user":
            return is_injection(m.content)
        after_injection = i > 0 and history[i - 1].role == "user" and is_injection(history[i - 1].content)
        return after_injection or v not in normalise(_RECITED.split(m.content, maxsplit=1)[0])

    said = [i for i, m in enumerate(history) if v in normalise(m.content)]
    return bool(said) and all(baseless(i) for i in said)


def sanitize(ex: Extraction, exchange: Exchange) -> tuple[Extraction, list[str]]:
    """Drop what must never be stored; return the cleaned extraction and why things were dropped."""
    dropped: list[str] = []
    if is_injection(exchange.user_text):
        if ex.facts or ex.task is not None or ex.episode:
            what = "instruction to the agent" if is_instruction(exchange.user_text) else "forged system/tool/memory text"
            dropped.append(f"{what}: no fact, task, procedure or episode kept")
        return replace(ex, facts=(), task=None, event=False, episode="", detail="", entities=()), dropped
    persona = normalise(exchange.persona)
    known = [persona] + [normalise(r) for r in exchange.recalled]
    user = normalise(exchange.user_text)
    echo_turn = (len(user) >= 12 and any(user in k for k in known if k)) or (bool(persona) and _quotes(user, persona))
    facts = []
    for f in ex.facts:
        why = _fact_refused(f, exchange, known, user, echo_turn)
        if why:
            dropped.append(f"fact {f.entity}:{f.attribute}: {why}")
        else:
            facts.append(f)
    task = ex.task
    bad_task = _task_refused(task, user, exchange) if task is not None else ""
    if task is not None and bad_task:  # a procedure injection: nothing of the turn is kept
        dropped.append(f"task {task.task_class}: {bad_task}; nothing of the turn kept")
        return replace(ex, facts=(), task=None, event=False, episode="", detail="", entities=()), dropped
    episode = ex.episode
    if echo_turn and not any(f.kind != "stated" for f in facts) and task is None:
        dropped.append("episode: the turn repeats the system prompt or a recalled memory")
        episode = ""
    elif episode and len(facts) < len(ex.facts) and not facts and task is None:
        episode = ""  # the episode would only retell what was just refused
    return replace(ex, facts=tuple(facts), task=task, episode=episode), dropped


def _fact_refused(f: FactCandidate, exchange: Exchange, known: list[str], user: str, echo_turn: bool) -> str:
    """Why a fact must not be stored ("" when it may): an instruction, a credential, a repeat of the system
    prompt or of a recalled memory, or a value only an injection or a recited memory said."""
    if is_injection(f.value) or is_injection(f.attribute):
        return "value is an instruction"
    if _SECRET.search(f"{f.attribute.replace('_', ' ')} {f.value}"):
        return "a credential is never stored"
    if f.kind == "stated" and (echo_turn or _echoes(_fact_text(f), known[:1]) or _echoes(f.value, known[:1])):
        return "repeats the system prompt or a recalled memory"
    if f.kind != "retracted" and _unfounded(f.value, user, exchange.history):
        return f"{f.kind}, but only an injection or a recited memory said it"
    return ""


def _task_refused(task: TaskReport, user: str, exchange: Exchange) -> str:
    """Why a task's steps must not become a procedure ("" when they may)."""
    if any(is_injection(s) for s in task.steps):
        return "steps instruct the agent"
    if any(is_dangerous_step(s) for s in task.steps):
        return "steps switch off safety controls or destroy records"
    if task.steps and all(_unfounded(s, user, exchange.history) for s in task.steps):
        return "steps come from an injected message"
    return ""
