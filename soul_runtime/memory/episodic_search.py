"""The episodic store's search: scoring candidates, the lexical (FTS5) side, time scopes and the time axis."""

from __future__ import annotations

from typing import Any

import numpy as np

from soul_runtime.errors import InvalidInput
from soul_runtime.memory.episodic_table import EpisodeTable
from soul_runtime.memory.episodic_tokens import fts_tokens, query_words
from soul_runtime.memory.layer_db import unpack
from soul_runtime.memory.policy_episodic import (
    fused_score,
    in_recall,
    later_figures_first,
    lexical_clauses,
    recency_weight,
)
from soul_runtime.records import Episode, RecalledItem
from soul_runtime.timeref import TimeScope, query_scope

_Hit = tuple[int, float, float, int, int, bytes, int]
"""A recall candidate read with its row: (row key, lexical score, at, promoted, superseded, vector, unit)."""


class EpisodeSearch(EpisodeTable):
    def _score(self, query: str, k: int, now: float, query_vector: np.ndarray, dense: dict[int, float],
               lexical: list[_Hit]) -> list[RecalledItem]:
        """Score the candidates on their date, flags and similarities alone; only the ``k`` kept are read
        whole. Lexical and time-scoped hits come with their date, flags and vector (read by their own query);
        the other dense hits' dates and flags come from the covering index, in one query; a hit without a dense
        similarity gets its true one from its stored vector (one matrix product for all of them)."""
        scope = self._in_scope(query_scope(query, now))
        scoped: set[int] = set()
        hits = lexical
        if scope:
            scoped = {h[0] for h in scope}
            have = {h[0] for h in lexical}
            hits = lexical + [h for h in scope if h[0] not in have]
        held = {h[0] for h in hits}
        rest = [key for key in dense if key not in held]
        rows = self.db.execute(
            "SELECT rowid, at, promoted, superseded, unit FROM episodes INDEXED BY episodes_recall "
            f"WHERE rowid IN ({','.join('?' * len(rest))})", rest).fetchall() if rest else []
        if not hits and not rows:
            return []
        ids = [h[0] for h in hits] + [r[0] for r in rows]
        sims: list[float | None] = [dense.get(h[0]) for h in hits]
        need = [i for i, d in enumerate(sims) if d is None]
        if need:  # hits without a dense similarity: their true one, from the stored vectors
            got = np.frombuffer(b"".join([hits[i][5] for i in need]), np.float32).reshape(len(need), -1) @ query_vector
            for i, sim in zip(need, got.tolist(), strict=True):
                sims[i] = sim
        ats, promoted_, superseded_, unit = np.array([(*h[2:5], h[6]) for h in hits] + [r[1:] for r in rows],
                                                     np.float64).reshape(len(ids), 4).T
        lex = np.array([h[1] for h in hits] + [0.0] * len(rows))  # lexical hits score > 0, the others 0
        scores = fused_score(np.array(sims + [dense[r[0]] for r in rows]), lex, self.cfg, unit != 0)
        scores = scores * recency_weight(ats, now, self.cfg)
        if scoped:  # the question names a time ("three sessions ago"): what happened then comes first
            scores = np.where([key in scoped for key in ids], 0.5 + 0.5 * scores, 0.5 * scores)
        live = np.logical_and(superseded_ == 0, in_recall(ats, promoted_ != 0, now, self.cfg))
        top = top_rounded(np.where(live & (scores >= self.cfg.min_score), scores, -np.inf), k)
        kept = sorted((-round(float(scores[i]), 6), f"ep-{ids[i]}", i) for i in top)[:k]
        if not kept:
            return []
        shown = {r[0]: r for r in self.db.execute(
            f"SELECT rowid, summary, sources, actor FROM episodes WHERE rowid IN ({','.join('?' * len(kept))})",
            [ids[i] for *_, i in kept])}
        texts = [shown[ids[i]][1] for *_, i in kept]
        final = later_figures_first(query, texts, [float(ats[i]) for *_, i in kept], [-neg for neg, *_ in kept])
        items = [RecalledItem("episodic", eid, text, round(score, 6), tuple(unpack(shown[ids[i]][2])), float(ats[i]),
                              str(shown[ids[i]][3]))
                 for (_, eid, i), text, score in zip(kept, texts, final, strict=True)]
        return sorted(items, key=lambda it: (-it.score, it.id))

    def _in_scope(self, scope: TimeScope | None, limit: int = 200) -> list[_Hit]:
        """The episodes a time-scoped question points at (at most ``limit``, the latest), as hits with no
        lexical score."""
        if scope is None:
            return []
        found = self._where(since=scope.since, until=scope.until, sessions_ago=scope.sessions_ago)
        if found is None:
            return []
        where, params = found
        return [(r[0], 0.0, r[1], r[2], r[3], r[4], r[5]) for r in self.db.execute(
            f"SELECT rowid, at, promoted, superseded, vector, unit FROM episodes WHERE {where} "
            "ORDER BY at DESC, rowid DESC LIMIT ?", (*params, limit))]

    def _size(self) -> int:
        """The store's size as lexical pruning and the parallel search read it: its highest episode key (kept
        from the last read and committed inserts; read again after any delete)."""
        if self._max_key is None:
            self._max_key = int(self.db.execute("SELECT COALESCE(MAX(rowid), 0) FROM episodes").fetchone()[0])
        return self._max_key

    def _match(self, query: str) -> str:
        """The FTS5 MATCH expression of ``query``'s words (:func:`query_words`, see :func:`lexical_clauses`);
        empty when nothing to match."""
        qt = query_words(query)
        if not qt:
            return ""
        size = self._size()
        docs: dict[str, int] = {}
        if size >= self.lexical.prune_at:  # a large store: a query that matches few episodes (LexicalLimits)
            docs = self._term_docs(fts_tokens(qt), size)
        quoted = [['"' + t.replace('"', "") + '"' for t in c] for c in lexical_clauses(qt, docs, size, self.lexical)]
        return " OR ".join(q[0] if len(q) == 1 else "(" + " AND ".join(q) + ")" for q in quoted)

    def _lexical_rows(self, query: str, limit: int) -> list[_Hit]:
        """The best ``limit`` BM25 matches (score > 0) with their date, flags and vector, in one query.

        The BM25 score is ordered on as a plain column (``bm25(...) AS s ... ORDER BY s``): FTS5's ``ORDER BY
        rank`` ranks the same but costs about a third more at 100,000 episodes. Ties go by row id. The rows are
        read after the LIMIT (a subquery), so only the kept matches are looked up in ``episodes``."""
        match = self._match(query)
        if not match:
            return []
        rows: list[_Hit] = self.db.execute(
            "SELECT l.rowid, -l.s, e.at, e.promoted, e.superseded, e.vector, e.unit FROM (SELECT rowid, "
            "bm25(episodes_fts) AS s FROM episodes_fts WHERE episodes_fts MATCH ? ORDER BY s, rowid LIMIT ?) AS l "
            "JOIN episodes AS e ON e.rowid = l.rowid ORDER BY l.s, l.rowid", (match, limit)).fetchall()
        return [r for r in rows if r[1] > 0]

    def _lexical(self, query: str, limit: int) -> dict[int, float]:
        """Row key -> BM25 score (higher is better) of the best ``limit`` lexical matches."""
        return {h[0]: h[1] for h in self._lexical_rows(query, limit)}

    def _term_docs(self, tokens: dict[str, tuple[str, ...]], size: int) -> dict[str, int]:
        """How many episodes hold each query term, by its FTS5 tokens (``tokens``: term -> tokens): FTS5's own
        count of its rarest token, remembered until the store grows by a quarter (the tokens not remembered are
        read in one query); 0 for a term without tokens."""
        stale = sorted({tok for toks in tokens.values() for tok in toks
                        if (hit := self._doc_freq.get(tok)) is None or size > hit[1] * 1.25})
        if stale:
            got = dict(self.db.execute("SELECT term, doc FROM episodes_vocab WHERE term IN "
                                       f"({','.join('?' * len(stale))})", stale).fetchall())
            if len(self._doc_freq) + len(stale) > 4096:
                self._doc_freq.clear()
            for tok in stale:
                self._doc_freq[tok] = (int(got.get(tok, 0)), size)
        return {t: min([size] + [self._doc_freq[tok][0] for tok in toks]) if toks else 0
                for t, toks in tokens.items()}

    def episodes(self, *, since: float | None = None, until: float | None = None, session: str | None = None,
                 sessions_ago: int | None = None) -> list[Episode]:
        """The time axis: episodes in a time range, of a session, or of the session N before the latest."""
        found = self._where(since=since, until=until, session=session, sessions_ago=sessions_ago)
        return [] if found is None else self._rows(*found)

    def _where(self, *, since: float | None = None, until: float | None = None, session: str | None = None,
               sessions_ago: int | None = None) -> tuple[str, tuple[Any, ...]] | None:
        """The WHERE clause (and its parameters) of :meth:`episodes`; None when no episode can match."""
        where: list[str] = ["1"]
        params: list[Any] = []
        if since is not None:
            where.append("at >= ?")
            params.append(since)
        if until is not None:
            where.append("at < ?")
            params.append(until)
        if session is not None:
            where.append("session = ?")
            params.append(session)
        if sessions_ago is not None:
            if sessions_ago < 0:
                raise InvalidInput("sessions_ago must be >= 0")
            r = self.db.execute("SELECT idx FROM sessions ORDER BY idx DESC LIMIT 1 OFFSET ?",
                                (sessions_ago,)).fetchone()
            if r is None:
                return None
            where.append("session_index = ?")
            params.append(r[0])
        return " AND ".join(where), tuple(params)


def top_rounded(scores: np.ndarray, k: int, digits: int = 6) -> list[int]:
    """Indices of the finite ``scores`` that can be among the best ``k`` once rounded to ``digits`` decimals
    (ties then go by id): those within one rounding step of the k-th best. Sorting these few gives the same
    top ``k`` as sorting them all."""
    idx = np.flatnonzero(np.isfinite(scores))
    if len(idx) > k:
        kth = float(np.partition(scores[idx], len(idx) - k)[len(idx) - k])
        idx = idx[scores[idx] >= kth - 2 * 10.0 ** -digits]
    return [int(i) for i in idx]

