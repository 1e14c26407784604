"""A re-ranker that reads the recalled candidates before they are packed (pure, offline, no model weights).

Recall ranks stored units by fused lexical and dense scores without reading them against the question. This
module reads each candidate's text and multiplies its score by how well the text answers, from four readings:

* **relation** — the share of the question's weight (its terms weighted by their rarity among the candidates,
  :func:`soul_runtime.loop.excerpt.query_weights`) that one sentence of the candidate holds together: a text
  that names the question's entities in one sentence relates them; one that scatters them does not;
* **answer type** — what the question asks for, against what the text holds: figures for "how many / how much /
  what percentage", dates for "when / what date", names for "who / which", lists for "what are / list / steps /
  order / summarize";
* **position** — where the first question word sits in the text: early (what the message is about) or deep in a
  long message (said in passing);
* **breadth** — how many distinct content words the text holds per token it would cost (a line that names many
  things said answers a question that gathers them better than one that repeats a few);
* **asker** — for a question that gathers what was said over time (:data:`soul_runtime.memory.digest.SPANNING`),
  whether the asker said it (the episode's ``actor``): "how did my work on X evolve" is answered in the asker's own
  words, which name the topics session by session; the other side's long explanations name them less.

Each reading is in [0, 1]; the score becomes ``score * exp(sum(weight * (reading - mean of the candidates)))``,
scaled so that the best episode keeps recall's best episode score: a candidate is moved only relative to the
others recalled with it and the scores keep their scale (a stored fact at 0.9 still comes first). The weights (:class:`RerankWeights`) were set on BEAM's 1M development chats
(``soul_apps/bench/rerank_fit.py`` reproduces the grid and names the data); nothing was fitted to LoCoMo.

An optional model stage (:func:`model_order`; in a turn when ``TurnConfig.model_rerank`` is 1) hands the first
candidates to a configured model in one call of bounded tokens and moves the ones it names first; it is off by
default and never runs on the offline path.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from soul_runtime.loop.excerpt import FIGURE, query_weights, text_terms
from soul_runtime.memory.digest import SPANNING
from soul_runtime.models.base import LanguageModel, ReplyRequest
from soul_runtime.records import RecalledItem
from soul_runtime.text import segments


@dataclass(frozen=True)
class RerankWeights:
    """How much each reading moves a candidate (0 turns it off). The defaults come from the grid of
    ``soul_apps/bench/rerank_fit.py`` on BEAM's 1M development chats 3 and 4 (28 questions with key phrases):
    relation with a little breadth lifts key phrases (+0.008) and evidence (+0.012) together; more breadth, or
    position, lifts key phrases further (up to +0.016) but costs evidence on BEAM and answer and evidence recall
    on LoCoMo's conversations (checked against their floors, never fitted: e.g. breadth 1.2 took LoCoMo from
    0.827 / 0.858 to 0.814 / 0.826). Answer type lowered key phrases on every setting tried. Both are read and
    weigh 0 by default."""

    relation: float = 0.6
    answer_type: float = 0.0
    position: float = 0.0
    breadth: float = 0.3
    asker: float = 0.4
    """Set on BEAM's 1M development chats 3, 4 and 10, 31, 32 (``rerank_fit --asker``): key phrases 1.150x ->
    1.160x and 1.108x -> 1.121x chunked BM25's, event ordering 1.02x -> 1.16x and 1.22x -> 1.41x."""


DEFAULT = RerankWeights()
OFF = RerankWeights(0.0, 0.0, 0.0, 0.0, 0.0)

_MONTH = r"(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*"
_DATE = re.compile(rf"\b(?:{_MONTH}\s+\d{{1,2}}|\d{{1,2}}\s+{_MONTH}|\d{{4}}-\d{{2}}-\d{{2}}|\d{{1,2}}/\d{{1,2}}"
                   rf"|(?:19|20)\d\d|monday|tuesday|wednesday|thursday|friday|saturday|sunday|yesterday|tomorrow"
                   rf"|(?:last|next)\s+(?:week|month|year))\b", re.I)
_NAME = re.compile(r"(?<![.!?]\s)(?<!^)\b[A-Z][a-z]+(?:\s+[A-Z][a-z]+)*")
_LIST = re.compile(r"(?m)^\s*(?:[-*\u2022]|\d+[.)])\s+|;|, (?:and |then )?")
_ASKS = (
    ("figure", re.compile(r"\b(?:how (?:many|much|long|often|far|big|fast|large|old)|what (?:percentage|number|"
                          r"amount|size|score|price|cost|rate|version)|how \w+ (?:was|is|were|did))\b", re.I)),
    ("date", re.compile(r"\b(?:when|what (?:date|day|time|month|year)|which (?:date|day|month|year)|how long ago|"
                        r"deadline|before|after|order|first|last)\b", re.I)),
    ("name", re.compile(r"\b(?:who|whom|whose|which (?:person|tool|library|framework|company|team)|what(?:'s| is) "
                        r"the name)\b", re.I)),
    ("list", SPANNING),
)


def asks(question: str) -> frozenset[str]:
    """What kinds of answer ``question`` asks for: ``figure``, ``date``, ``name``, ``list`` (none, any, several)."""
    return frozenset(kind for kind, pattern in _ASKS if pattern.search(question))


def _holds(text: str, kind: str) -> float:
    if kind == "figure":
        return min(1.0, len(FIGURE.findall(text)) / 2)
    if kind == "date":
        return min(1.0, len(_DATE.findall(text)) / 1)
    if kind == "name":
        return min(1.0, len(_NAME.findall(text)) / 2)
    return min(1.0, len(_LIST.findall(text)) / 4)


def answer_type(text: str, wanted: frozenset[str]) -> float:
    """The mean over the kinds of answer wanted of how much of that kind ``text`` holds (0 when none is asked)."""
    return sum(_holds(text, k) for k in wanted) / len(wanted) if wanted else 0.0


def relation(text: str, weights: dict[str, float], total: float) -> float:
    """The largest share of the question's weight that one sentence of ``text`` holds (0 to 1)."""
    if total <= 0:
        return 0.0
    best = 0.0
    for seg in segments(text):
        held = sum(weights.get(t, 0.0) for t in text_terms(seg))
        best = max(best, held)
    return min(1.0, best / total)


POSITION_CHARS = 1200
"""A first question word this many characters into a text or deeper reads as said in passing (position 0)."""


def position(text: str, weights: dict[str, float]) -> float:
    """1 when a question word is in the text's opening, falling to 0 at POSITION_CHARS in (0 when none is)."""
    low = text.lower()
    first = min((i for w in weights if (i := low.find(w[:5])) >= 0), default=-1)
    return 0.0 if first < 0 else max(0.0, 1.0 - first / POSITION_CHARS)


BREADTH_WORDS = 40
"""Distinct content words in a text's first 400 characters that read as full breadth (1)."""


def breadth(text: str) -> float:
    """Distinct content words in the text's first 400 characters (what a line shows), over BREADTH_WORDS."""
    return min(1.0, len(text_terms(text[:400])) / BREADTH_WORDS)


def readings(items: Sequence[RecalledItem], question: str) -> list[tuple[float, float, float, float]]:
    """Each candidate's (relation, answer type, position, breadth)."""
    weights = query_weights(question, [it.text for it in items])
    total = sum(weights.values())
    wanted = asks(question)
    return [(relation(it.text, weights, total), answer_type(it.text, wanted), position(it.text, weights),
             breadth(it.text)) for it in items]


def rerank_scores(items: Sequence[RecalledItem], question: str, weights: RerankWeights = DEFAULT, asker: str = ""
                  ) -> list[float] | None:
    """Each of ``items``'s score after reading it against ``question`` asked by ``asker`` (see the module doc);
    None when reading changes nothing (no question, fewer than two episodes, every weight 0). Facts and procedures
    keep their scores: they are current and shown first whatever the episodes say."""
    said = weights.asker if asker and SPANNING.search(question) else 0.0
    w = (weights.relation, weights.answer_type, weights.position, weights.breadth, said)
    idx = [i for i, it in enumerate(items) if it.store == "episodic"]
    if not question or len(idx) < 2 or not any(w):
        return None
    r = [(*x, float(items[i].actor == asker)) for i, x in
         zip(idx, readings([items[i] for i in idx], question), strict=True)]
    means = [sum(x[j] for x in r) / len(r) for j in range(5)]
    lifted = [items[i].score * math.exp(sum(wj * (xj - mj) for wj, xj, mj in zip(w, x, means, strict=True)))
              for i, x in zip(idx, r, strict=True)]
    scale = max(items[i].score for i in idx) / max(max(lifted), 1e-12)  # the best episode keeps recall's top score
    out = [it.score for it in items]
    for i, s in zip(idx, lifted, strict=True):
        out[i] = round(s * scale, 6)
    return out


def rerank(items: Sequence[RecalledItem], question: str, weights: RerankWeights = DEFAULT, asker: str = ""
           ) -> list[RecalledItem]:
    """``items`` re-scored by :func:`rerank_scores`, best first (as they were when reading changes nothing)."""
    scores = rerank_scores(items, question, weights, asker)
    if scores is None:
        return list(items)
    return [replace(it, score=s) for s, _, it in sorted(zip(scores, range(len(items)), items, strict=True),
                                                          key=lambda x: (-x[0], x[1]))]


MODEL_CANDIDATES = 20
"""The model stage reads at most this many candidates..."""
MODEL_CHARS = 300
"""...each cut to this many characters: one call of bounded tokens (about 20 * 300 / 4 = 1,500 tokens in)."""


def model_prompt(items: Sequence[RecalledItem], question: str) -> str:
    """The one prompt the model stage sends: the question and the numbered candidates, asking for the numbers of
    those that answer it, best first."""
    lines = [f"[{i}] {it.text[:MODEL_CHARS]}" for i, it in enumerate(items[:MODEL_CANDIDATES])]
    return ("Question: " + question.strip() + "\n\nPassages:\n" + "\n".join(lines)
            + "\n\nReply with the numbers of the passages that help answer the question, best first, "
              "comma-separated, nothing else.")


def model_order(items: Sequence[RecalledItem], question: str, ask: Callable[[str], str]) -> list[RecalledItem]:
    """``items`` with the ones a model names (``ask(prompt) -> reply``, one call) moved first in its order, each
    given the score of the place it takes; the others keep their order. A reply naming nothing valid changes
    nothing."""
    return model_reordered(items, ask(model_prompt(items, question)))


def model_reordered(items: Sequence[RecalledItem], reply: str) -> list[RecalledItem]:
    """``items`` reordered by a model's ``reply`` to :func:`model_prompt` (see :func:`model_order`)."""
    head = list(items[:MODEL_CANDIDATES])
    named = list(dict.fromkeys(int(n) for n in re.findall(r"\d+", reply) if int(n) < len(head)))
    if not named:
        return list(items)
    scores = sorted((it.score for it in head), reverse=True)
    order = [head[i] for i in named] + [it for i, it in enumerate(head) if i not in set(named)]
    return [replace(it, score=s) for it, s in zip(order, scores, strict=True)] + list(items[MODEL_CANDIDATES:])


MODEL_REPLY_TOKENS = 60
"""The model stage's reply: a list of numbers."""


def _asked(prompt: str) -> ReplyRequest:
    return ReplyRequest(system="You rank passages for a question. Reply only with passage numbers.",
                        memory_lines=(), history=(), user_text=prompt, user="rerank", max_tokens=MODEL_REPLY_TOKENS)


def model_request(items: Sequence[RecalledItem], question: str) -> ReplyRequest:
    """The model stage's one call as a request of a configured model's ``reply`` (no memory lines, no history,
    MODEL_REPLY_TOKENS out): what a turn sends when ``TurnConfig.model_rerank`` is on."""
    return _asked(model_prompt(items, question))


def ask_with(model: LanguageModel) -> Callable[[str], str]:
    """The model stage's one call through a configured model's ``reply``. The offline model answers nothing
    useful: the stage is for a real model only."""
    def ask(prompt: str) -> str:
        return model.reply(_asked(prompt)).text
    return ask
