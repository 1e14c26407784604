"""Context assembly under the model's input budget (pure)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from soul_runtime.config import TurnConfig
from soul_runtime.loop.buffer import ShortTermBuffer
from soul_runtime.loop.excerpt import FIGURE, excerpt, query_weights, text_terms
from soul_runtime.loop.rerank import DEFAULT as RERANK
from soul_runtime.loop.rerank import RerankWeights, rerank_scores
from soul_runtime.memory.digest import SPANNING
from soul_runtime.memory.episodic_digests import DIGEST_ID
from soul_runtime.models.base import ReplyRequest
from soul_runtime.records import RecalledItem
from soul_runtime.text import estimate_tokens
from soul_runtime.timeref import ago, day_text

VALUE_POWER = 4.0
"""Value of a memory = its recall score ** VALUE_POWER: relevance has to outweigh shortness, or packing by
value per token would fill the budget with short, barely relevant lines."""


FULL_LINES = 6
"""The most relevant memories are shown in full, up to FULL_CHARS; the others, and a longer one, by the part
that answers the question (:mod:`soul_runtime.loop.excerpt`) within SHORT_CHARS, so more of them fit the budget:
a code block by its ``max_connections=209`` line, a table by its heading and the row asked about, a paragraph
by the sentence that holds the question's words. A memory that holds none of them is shown by its opening."""
FULL_CHARS = 400
SHORT_CHARS = 160
FULL_LINES_OVER_TIME = 9
"""For a question that gathers what was said over time (:data:`~soul_runtime.memory.digest.SPANNING`: a summary,
an order, a change) the most relevant FULL_LINES_OVER_TIME are shown in full. Its words name the subject, not
the answer: the answer is what was said about the subject session after session, and an excerpt around the
question's words leaves that out. Set on BEAM's 1M development chats (``python -m soul_apps.bench.rerank_fit
--full-lines``, 6 / 9 / 12 / 16 / 20 tried): 9 lifts key phrases on each of the three sets of chats (3, 4; 6 to 9;
10, 31, 32) and on the nine 1.109x -> 1.116x chunked BM25's, summaries 0.97x -> 1.01x, event orderings 1.03x ->
1.06x; evidence 1.500x -> 1.495x."""
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=\S)")


def short_text(text: str, limit: int | None = None) -> str:
    """The first sentence of ``text``, cut at a word boundary to ``limit`` characters."""
    limit = SHORT_CHARS if limit is None else limit
    first = _SENTENCE_END.split(text.strip(), maxsplit=1)[0]
    return first if len(first) <= limit else first[:limit].rsplit(" ", 1)[0].rstrip(" ,;:-") + "\u2026"


MIN_LINE_TOKENS = 40
"""A line is valued as if it cost at least this many tokens: a scrap of a few words ("4.", ``for item in
items:``) that matches a question word is not worth more than a passage of the same relevance."""

REPEAT = 0.8
"""An episode's line at least this share of whose content words one line already chosen holds says again what
the model is shown (the same advice given in two answers, a message and its own summary): it is left
out, and its room goes to something said once. Facts and procedures are always shown: they are current, and
the model names them by their ids to correct them."""


class _Said:
    """What the lines chosen so far say, as :data:`REPEAT` compares a new line with them: each line's content
    words and figures, and which lines hold each word."""

    def __init__(self) -> None:
        self.lines: list[tuple[frozenset[str], frozenset[str]]] = []
        self.holders: dict[str, list[int]] = {}

    def repeats(self, words: frozenset[str], figures: frozenset[str]) -> bool:
        """Whether one chosen line holds REPEAT of ``words`` and every one of ``figures`` ("the lead cost 45
        dollars" does not repeat "the lead cost 40 dollars"). A line that holds that many of the words holds one
        of any ``len - need + 1`` of them: only the holders of the rarest that many are compared."""
        if not words:
            return False
        need = math.ceil(REPEAT * len(words) - 1e-9)
        rare = sorted(words, key=lambda w: len(self.holders.get(w, ())))[:len(words) - need + 1]
        return any(figures <= self.lines[i][1] and len(words & self.lines[i][0]) >= need
                   for i in {i for w in rare for i in self.holders.get(w, ())})

    def add(self, words: frozenset[str], figures: frozenset[str]) -> None:
        for w in words:
            self.holders.setdefault(w, []).append(len(self.lines))
        self.lines.append((words, figures))


SAME_DAY = "  "
"""An episode of the same day as the line before it starts with this indent instead of repeating the date."""


def when(it: RecalledItem, now: float | None = None) -> str:
    """``3 March 2024 (2 days ago)``: an episode's day and, while that is recent, how long before ``now``."""
    rel = ago(it.at, now) if now is not None else ""
    return f"{day_text(it.at)}{f' ({rel})' if rel else ''}"


def is_digest(it: RecalledItem) -> bool:
    """A consolidated memory (:mod:`soul_runtime.memory.episodic_digests`): shown whole, and never standing in
    for the lines of the messages it quotes."""
    return it.id.startswith(DIGEST_ID)


def full_lines(query: str, over_time: int = FULL_LINES_OVER_TIME) -> int:
    """How many of the best memories are shown in full for ``query``: ``over_time`` for a question that gathers
    what was said over time, FULL_LINES for any other."""
    return over_time if SPANNING.search(query) else FULL_LINES


def _shown(it: RecalledItem, short: bool, weights: dict[str, float] | None) -> str:
    text = it.text
    room = len(text) if is_digest(it) else SHORT_CHARS if short else FULL_CHARS
    if len(text) > room:
        found = excerpt(text, weights, room) if weights else None
        text = found if found is not None else short_text(text, room)
    return text


def _dated(it: RecalledItem) -> bool:
    return it.store == "episodic" and bool(it.at)


def _body(it: RecalledItem, text: str) -> str:
    """An episode's text as it is; a fact's or a procedure's after its id, by which the model can name it."""
    return text if _dated(it) else f"[{it.store} {it.id}] {text}"


def _line(day: str, body: str, same_day: bool = False) -> str:
    """``body`` under ``day`` (indented instead when the line before is of the same day); undated as it is."""
    return body if not day else SAME_DAY + body if same_day else f"{day}: {body}"


def memory_line(it: RecalledItem, now: float | None = None, *, short: bool = False,
                weights: dict[str, float] | None = None) -> str:
    """``3 March 2024 (2 days ago): …``: an episode says when it happened (and, while that is recent, how long
    before ``now``); a fact or a procedure is current and carries its id instead (``[semantic ana:dog] …``), by
    which the model can name it. A text longer than its room (FULL_CHARS, or SHORT_CHARS when ``short``) that
    holds the question's terms (``weights``, from :func:`query_weights`) is shown by its excerpt; else by its
    opening."""
    return _line(when(it, now) if _dated(it) else "", _body(it, _shown(it, short, weights)))


def line_tokens(line: str) -> int:
    """Tokens a memory line costs in the context (its newline included)."""
    return estimate_tokens(line) + 1


def _render(chosen: list[tuple[int, RecalledItem, str, str]]) -> list[tuple[RecalledItem, str]]:
    """Facts and procedures in recall order, then the episodes by day, each day's date written once: the day of
    the best recalled episode first, and within a day in recall order."""
    first: dict[str, int] = {}
    for i, _, day, _ in sorted(chosen, key=lambda x: x[0]):
        first.setdefault(day, i)
    ordered = sorted(chosen, key=lambda x: (bool(x[2]), first[x[2]] if x[2] else 0, x[0]))
    out, last_day = [], ""
    for _, it, day, body in ordered:
        out.append((it, _line(day, body, day == last_day)))
        last_day = day
    return out


def pack_memory(recalled: Sequence[RecalledItem], budget: int, now: float | None = None, query: str = "",
                rerank_weights: RerankWeights = RERANK, asker: str = "", full_over_time: int = FULL_LINES_OVER_TIME
                ) -> list[tuple[RecalledItem, str]]:
    """The recalled items whose lines fit ``budget`` tokens, chosen greedily by value per token
    (``score ** VALUE_POWER`` / tokens of the line, at least MIN_LINE_TOKENS), returned with their lines: facts
    and procedures first in recall order, then episodes by day (the day of the best first), a day's date written
    once and its other episodes indented under it (:data:`SAME_DAY`), so the budget goes to what was said rather than to repeated
    dates. The first FULL_LINES items (``full_over_time`` for a question over time, :func:`full_lines`) are
    rendered in full, the others short: by the part that answers ``query``. An episode whose sources are all shown by an episode already chosen is left out: one line per
    message said, so the budget reaches more of what was said (the parts of a long message recalled together
    are shown by the one that answers best); so is an episode's line that repeats one already chosen
    (:data:`REPEAT`). The candidates are first re-ranked by reading them against ``query``
    (:mod:`soul_runtime.loop.rerank`; ``asker``: who asks ``query``; ``rerank_weights``
    :data:`~soul_runtime.loop.rerank.OFF` keeps recall's order)."""
    read = rerank_scores(recalled, query, rerank_weights, asker)
    scores = [it.score for it in recalled] if read is None else read
    if read is not None:  # read against the question: the candidates in their new order, with their new scores
        order = sorted(range(len(recalled)), key=lambda i: (-read[i], i))
        recalled, scores = [recalled[i] for i in order], [read[i] for i in order]
    weights = query_weights(query, [it.text for it in recalled]) if query else {}
    full = full_lines(query, full_over_time)
    rows = [(i, it, when(it, now) if _dated(it) else "", _body(it, _shown(it, i >= full, weights)))
            for i, it in enumerate(recalled)]
    by_value = sorted(rows, key=lambda r: (-(max(scores[r[0]], 1e-9) ** VALUE_POWER)
                                           / max(MIN_LINE_TOKENS, line_tokens(_line(r[2], r[3]))), r[0]))
    used, chosen = 0, []
    shown: set[str] = set()
    days: set[str] = set()
    said = _Said()
    for row in by_value:
        _, it, day, body = row
        t = line_tokens(_line(day, body, day in days))
        episode = it.store == "episodic" and not is_digest(it)
        if used + t > budget or (episode and it.sources and shown.issuperset(it.sources)):
            continue
        words, figures = text_terms(body), frozenset(FIGURE.findall(body))
        if episode and said.repeats(words, figures):
            continue
        said.add(words, figures)
        chosen.append(row)
        shown.update(it.sources if episode else ())
        days.add(day)
        used += t
    packed = _render(chosen)
    while chosen and sum(line_tokens(line) for _, line in packed) > budget:  # a date moved to a longer line
        chosen.pop()
        packed = _render(chosen)
    return packed


@dataclass(frozen=True)
class Assembled:
    request: ReplyRequest
    used: tuple[RecalledItem, ...]  # the recalled items actually passed to the model, in order
    tokens: dict[str, int]


def assemble(*, persona: str, recalled: list[RecalledItem], buffer: ShortTermBuffer, user_text: str, user: str,
             cfg: TurnConfig, now: float | None = None) -> Assembled:
    """System prompt + memory lines + the newest buffer turns + the user text, within
    ``context_tokens`` with ``reply_tokens`` left for the answer."""
    system_t = estimate_tokens(persona)
    user_t = estimate_tokens(user_text) + 4
    room = cfg.context_tokens - cfg.reply_tokens - system_t - user_t
    mem_budget = max(0, min(cfg.memory_tokens, room))
    packed = pack_memory(recalled, mem_budget, now, user_text, asker=user)
    used = [it for it, _ in packed]
    mem_t = sum(line_tokens(line) for _, line in packed)
    window = buffer.window(max(0, room - mem_t))
    buf_t = sum(t.tokens for t in window)
    req = ReplyRequest(system=persona, memory_lines=tuple(line for _, line in packed),
                       history=buffer.chat(window), user_text=user_text, user=user, max_tokens=cfg.reply_tokens)
    tokens = {"system": system_t, "memory": mem_t, "buffer": buf_t, "user": user_t, "reply_budget": cfg.reply_tokens,
              "total": system_t + mem_t + buf_t + user_t + cfg.reply_tokens, "budget": cfg.context_tokens}
    return Assembled(req, tuple(used), tokens)
