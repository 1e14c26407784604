"""Dialogue acts of the phrasing corpus: the offline rules against a classifier over the shipped embedder.

Should a classifier over the embedder (MiniLM int8 ONNX) decide the dialogue act of a user message
(statement / confirmation / correction / retraction / save request / other) instead of the rules? This
module measures it: each corpus turn whose act is plain from the case's kind gets a gold
act; the rules' act is read from :mod:`soul_runtime.models.offline_rules` (what the offline model acts
on); the classifiers (nearest centroid, and a small numpy logistic regression) are trained on
``TRAIN`` — generic examples written for this purpose, not taken from the corpus — and judged on the
same turns. ``run`` returns accuracy per act and the extra start-up cost (model load + training).
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import numpy as np

from soul_runtime.embedding.base import Embedder

ACTS = ("statement", "confirmation", "correction", "retraction", "save", "other")

TRAIN: dict[str, tuple[str, ...]] = {
    "statement": (
        "The invoicing job runs every night at midnight.", "My brother works as a nurse in Glasgow.",
        "Our main office is in Rotterdam.", "I use Obsidian for my notes.", "The test servers run Debian.",
        "We keep the customer data in a Postgres cluster.", "My cat is called Miso.", "The API is written in Java.",
        "Our Friday demo starts at 4pm.", "I've been vegetarian for ten years.", "The reports are generated with dbt.",
        "Kappa uses Cassandra for storage.", "I'm a data engineer at a bank.", "The team calendar lives in Outlook."),
    "confirmation": (
        "Aye.", "Yeah, that's right.", "Yes, that is so.", "Exactly so.", "Yep, that's the one I meant.", "That's true.",
        "Righto.", "Absolutely.", "Yes, you've got it.", "It sure is.", "Mm-hm.", "Indeed.", "Yup, that's the case.",
        "Accurate, yes."),
    "correction": (
        "Actually, it's Python 3.12, not 3.11.", "No, we moved the meeting to Thursday.", "Sorry, I meant Berlin.",
        "Correction: the API is on version 4 now.", "We switched from Jenkins to GitLab CI last month.",
        "It changed, the office is in Utrecht now.", "Wait, the deadline is the 14th, not the 12th.",
        "They replaced the old router with a Netgear.", "Not Tuesday, Wednesday.", "I got it wrong, it's Azure.",
        "These days the job runs at 3am instead.", "We upgraded the cluster to Kubernetes 1.30."),
    "retraction": (
        "We don't use Jira anymore.", "Forget what I said about the gym.", "That's no longer true.",
        "The old API was shut down.", "I no longer have a car.", "We stopped using Mailchimp.",
        "Please ignore that, it was wrong.", "The Tuesday meeting was cancelled for good.",
        "I left the book club.", "Scratch that, it isn't true.", "We got rid of the staging server.",
        "The project was abandoned."),
    "save": (
        "Save this as a procedure.", "Please remember these steps for next time.", "Keep that as a runbook.",
        "Store this workflow so we can reuse it.", "Make that our standard checklist.",
        "Could you note those steps down as the way to do it?", "Add this to your procedures.",
        "Remember how I did that.", "Record these steps as a playbook.", "That's the process, save it."),
    "other": (
        "How are you today?", "Thanks, that's great!", "What time is it in Tokyo?", "Should we use Redis?",
        "If we had more money we'd hire a designer.", "My colleague thinks Go is better.", "lol",
        "Maybe we should try Notion.", "Is the build green?", "See you tomorrow!", "Not sure, I'll check.",
        "No, that's wrong.", "I wonder whether the API is slow.", "Good night!"),
}


def gold_acts(cases: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(case id, turn text, act) for the turns whose act is plain from the case's kind and expectation."""
    out = []
    for c in cases:
        kind, turns = c["kind"], c["turns"]
        for i, t in enumerate(turns):
            act = ""
            if kind in ("confirm", "statement", "correct", "retract") and c["expect"] is not None:
                last = i == len(turns) - 1 and len(turns) >= 3 and i % 2 == 0
                act = ({"correct": "correction", "retract": "retraction"}[kind] if last and kind in ("correct", "retract")
                       else "confirmation" if i % 2 else "statement")
            elif kind == "repeat" and c["expect"]:
                act = "statement"
            elif kind == "none" and i == 0 and len(turns) == 2 and (t.rstrip().endswith("?") or not c["expect"]):
                act = "other" if not _plain_statement(c) else ""
            elif kind == "save" and c.get("expect_procedures") and i == len(turns) - 1 and len(turns) > 1:
                act = "save"
            if act:
                out.append((c["id"], t, act))
    return out


def _plain_statement(c: dict[str, Any]) -> bool:
    """A none-case that opens with a plain statement and fails because of its reply ("No, that's not right.")."""
    second = c["turns"][1].lower() if len(c["turns"]) > 1 else ""
    return second.startswith(("no", "hmm")) or len(c["turns"]) == 1


def rules_act(text: str, user: str) -> str:
    """The act the offline rules read in a message on its own (no conversation)."""
    from soul_runtime.models import offline_rules as rules
    if rules.is_instruction(text):
        return "other"
    if rules.confirmation(text) is not None:
        return "confirmation"
    if rules.save_requested(text):
        return "save"
    for sentence in rules.split_sentences(text):
        if rules.is_question(sentence):
            continue
        for clause in rules.split_clauses(rules.strip_fillers(sentence)):
            if rules.parse_retraction(clause) is not None or rules.parse_dropped(clause):
                return "retraction"
            if rules.parse_change(clause) or rules.parse_correction(clause):
                return "correction"
            if rules.parse_statements(clause, user):
                return "statement"
    return "other"


def _logreg(x: np.ndarray, y: np.ndarray, k: int, steps: int = 300, lr: float = 0.5, l2: float = 1e-3) -> np.ndarray:
    w = np.zeros((x.shape[1] + 1, k))
    xb = np.hstack([x, np.ones((len(x), 1))])
    onehot = np.eye(k)[y]
    for _ in range(steps):
        z = xb @ w
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        w -= lr * (xb.T @ (p - onehot) / len(x) + l2 * w)
    return w


def run(cases: list[dict[str, Any]], embedder: Embedder) -> dict[str, Any]:
    gold = gold_acts(cases)
    users = {c["id"]: c["user"] for c in cases}
    t0 = time.perf_counter()
    embedder.embed(["warm up"])
    t_load = time.perf_counter() - t0
    texts = [t for a in ACTS for t in TRAIN[a]]
    labels = np.array([ACTS.index(a) for a in ACTS for _ in TRAIN[a]])
    t0 = time.perf_counter()
    xtr = embedder.embed(texts)
    cent = np.stack([xtr[labels == i].mean(0) for i in range(len(ACTS))])
    cent /= np.linalg.norm(cent, axis=1, keepdims=True)
    w = _logreg(xtr, labels, len(ACTS))
    t_train = time.perf_counter() - t0
    t0 = time.perf_counter()
    xte = embedder.embed([t for _, t, _ in gold])
    t_embed = (time.perf_counter() - t0) / max(1, len(gold))
    pred = {"nearest centroid": [ACTS[i] for i in (xte @ cent.T).argmax(1)],
            "logistic regression": [ACTS[i] for i in (np.hstack([xte, np.ones((len(xte), 1))]) @ w).argmax(1)]}
    t0 = time.perf_counter()
    pred["rules"] = [rules_act(t, users[cid]) for cid, t, _ in gold]
    t_rules = (time.perf_counter() - t0) / max(1, len(gold))
    out: dict[str, Any] = {"turns": len(gold), "by_method": {}, "cost": {
        "embedder_load_s": round(t_load, 3), "train_s": round(t_train, 3), "embed_per_turn_ms": round(1000 * t_embed, 2),
        "rules_per_turn_ms": round(1000 * t_rules, 2)}}
    for name, p in pred.items():
        per: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for (_, _, act), guess in zip(gold, p, strict=True):
            per[act][0] += act == guess
            per[act][1] += 1
        ok = sum(a for a, _ in per.values())
        out["by_method"][name] = {"accuracy": round(ok / max(1, len(gold)), 3),
                                  "by_act": {a: f"{per[a][0]}/{per[a][1]}" for a in ACTS if per[a][1]}}
    return out
