"""The semantic layer: ``entity:attribute → value`` facts, updated in place with history.

Record of truth: ``semantic.sqlite``. Observations of stated (unconfirmed) facts
are counted per distinct episode until :func:`reconcile_fact` promotes them.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from soul_runtime.config import MemoryConfig
from soul_runtime.embedding.base import Embedder
from soul_runtime.errors import InvalidInput, NotFound
from soul_runtime.memory.erasure import Erased, ForgetQuery, compact
from soul_runtime.memory.fact_match import match_stored
from soul_runtime.memory.layer_db import (
    apply_idempotent,
    drop_applied,
    pack,
    unpack,
)
from soul_runtime.memory.layer_store import LayerStore
from soul_runtime.memory.policy_semantic import merge_sources, reconcile_fact, same_thing
from soul_runtime.memory.semantic_schema import MIGRATIONS
from soul_runtime.memory.sqlite_db import transaction
from soul_runtime.records import (
    Fact,
    FactCandidate,
    FactVersion,
    MemoryWrite,
    Op,
    RecalledItem,
    Store,
    WriteRequest,
    fact_key,
)
from soul_runtime.text import normalise, terms


def _history(raw: bytes) -> tuple[FactVersion, ...]:
    return tuple(FactVersion(h[0], tuple(h[1]), h[2], h[3], h[4]) for h in unpack(raw))


TABLES = ("facts", "observations", "applied")


class SemanticStore(LayerStore):
    store = Store.SEMANTIC
    MIGRATIONS = MIGRATIONS
    TABLES = TABLES
    COUNTED = "facts"

    def __init__(self, directory: Path, cfg: MemoryConfig, embedder: Embedder | None = None) -> None:
        self.embedder = embedder  # for reconciliation by meaning (fact_match); None: exact and normalised only
        self.matches = {"normalised": 0, "meaning": 0}
        super().__init__(directory, cfg)

    def _fact(self, r: tuple[Any, ...]) -> Fact:
        return Fact(entity=r[0], attribute=r[1], value=r[2], display_entity=r[3], display_attribute=r[4],
                    confidence=r[5], sources=tuple(unpack(r[6])), valid_from=r[7], status=r[8],
                    history=_history(r[9]))

    def _get(self, entity: str, attribute: str) -> Fact | None:
        r = self.db.execute("SELECT * FROM facts WHERE entity = ? AND attribute = ?", (entity, attribute)).fetchone()
        return self._fact(r) if r else None

    def _put(self, f: Fact) -> None:
        hist = [[h.value, list(h.sources), h.valid_from, h.valid_to, h.reason] for h in f.history]
        self.db.execute("INSERT OR REPLACE INTO facts VALUES (?,?,?,?,?,?,?,?,?,?)",
                        (f.entity, f.attribute, f.value, f.display_entity, f.display_attribute, f.confidence,
                         pack(list(f.sources)), f.valid_from, f.status, pack(hist)))

    # ---- writes ----------------------------------------------------------------------
    def apply(self, req: WriteRequest) -> list[MemoryWrite]:
        """Reconcile every fact candidate of one exchange; idempotent per ``turn_key``.

        A write's payload carries ``promoted_turns`` (the episodes a promotion drew
        on) so the episodic layer can mark them promoted.
        """
        return self.apply_many([req])[0]

    @staticmethod
    def writes_without_store(reqs: list[WriteRequest]) -> list[list[MemoryWrite]] | None:
        """The answer of :meth:`apply_many` when no request carries a fact (whatever is stored); else None."""
        return None if any(r.extraction.facts for r in reqs) else [[] for _ in reqs]

    def apply_many(self, reqs: list[WriteRequest]) -> list[list[MemoryWrite]]:
        """Several exchanges in one durable transaction (in order)."""
        return apply_idempotent(self.db, reqs, lambda req: [self._fact_write(req, c) for c in req.extraction.facts],
                                f"soul {self.dir.name} semantic")

    def _fact_write(self, req: WriteRequest, c: FactCandidate) -> MemoryWrite:
        if not c.entity or not c.attribute or not c.value.strip():
            return MemoryWrite(Store.SEMANTIC, Op.NOOP, "", "incomplete fact candidate ignored")
        key = fact_key(c.entity, c.attribute)
        vnorm = normalise(c.value)
        promoted_turns: list[str] = []
        observations = 0
        if c.kind == "stated":
            self.db.execute("INSERT OR IGNORE INTO observations VALUES (?,?,?,?,?,?,?)",
                            (c.entity, c.attribute, vnorm, c.value, req.turn_key, pack(list(c.sources)), req.now))
            c = self._gathering_key(c, vnorm)
            key = fact_key(c.entity, c.attribute)
            rows = self.db.execute("SELECT entity, turn_key, sources FROM observations WHERE value_norm = ? "
                                   "ORDER BY at", (vnorm,)).fetchall()
            obs = list({r[1]: (r[1], r[2]) for r in rows if same_thing(r[0], c.entity)}.values())
        else:
            obs = self.db.execute("SELECT turn_key, sources FROM observations WHERE entity = ? AND attribute = ? "
                                  "AND value_norm = ? ORDER BY at", (c.entity, c.attribute, vnorm)).fetchall()
        if obs:  # a confirmation or promotion draws on the messages that stated the value
            srcs: tuple[str, ...] = ()
            for _, s in obs:
                srcs = merge_sources(srcs, tuple(unpack(s)))
            c = replace(c, sources=merge_sources(srcs, c.sources))
        if c.kind == "stated":
            observations = len(obs)
            promoted_turns = [o[0] for o in obs]
        existing = self._get(c.entity, c.attribute)
        if existing is None or existing.status != "active":
            about = self._about(c)
            if about is not None:  # the same fact under another key: reconcile against it
                c = replace(c, entity=about.entity, attribute=about.attribute, display_entity=about.display_entity,
                            display_attribute=about.display_attribute)
                key, existing = about.key, about
        d = reconcile_fact(existing, c, observations=observations, now=req.now, cfg=self.cfg)
        payload: dict[str, Any] = {"value": c.value, "kind": c.kind, "sources": list(c.sources)}
        if d.fact is not None:
            self._put(d.fact)
        if d.op in (Op.ADD, Op.UPDATE) and c.kind == "stated":
            payload["promoted_turns"] = promoted_turns
        if d.op in (Op.UPDATE, Op.DELETE) and existing is not None:
            payload["previous"] = existing.value
            payload["superseded_sources"] = [s for s in existing.sources if s not in c.sources]
        return MemoryWrite(Store.SEMANTIC, d.op, key, d.reason, payload)

    def _about(self, c: FactCandidate) -> Fact | None:
        """The active fact ``c`` is about under another key (:func:`fact_match.match_stored`), else None."""
        rows = self.db.execute("SELECT * FROM facts WHERE status = 'active'").fetchall()
        by_meaning = self.embedder is not None and self.cfg.fact_match_similarity < 1.0
        m = match_stored(c, [self._fact(r) for r in rows], self._cosines if by_meaning else None,
                         self.cfg.fact_match_similarity)
        if m is None:
            return None
        self.matches[m.how] += 1
        return m.fact

    def _cosines(self, query: str, texts: list[str]) -> list[float]:
        assert self.embedder is not None
        vecs = self.embedder.embed([query, *texts])
        return [float(x) for x in vecs[1:] @ vecs[0]]

    def _gathering_key(self, c: FactCandidate, vnorm: str) -> FactCandidate:
        """The key under which the same value said of the same thing in other words is counted: a fact that
        already holds it, else the key it was stated under most often (the first on a tie)."""
        for f in map(self._fact, self.db.execute("SELECT * FROM facts WHERE status = 'active'").fetchall()):
            if normalise(f.value) == vnorm and same_thing(f.entity, c.entity):
                return replace(c, entity=f.entity, attribute=f.attribute, display_entity=f.display_entity,
                               display_attribute=f.display_attribute)
        rows = self.db.execute("SELECT entity, attribute FROM observations WHERE value_norm = ? ORDER BY at",
                               (vnorm,)).fetchall()
        keys = [(e, a) for e, a in rows if same_thing(e, c.entity)]
        best = max(dict.fromkeys(keys), key=keys.count, default=(c.entity, c.attribute))
        if best == (c.entity, c.attribute):
            return c
        return replace(c, entity=best[0], attribute=best[1], display_entity=best[0],
                       display_attribute=best[1].replace("_", " "))

    def forget_where(self, q: ForgetQuery) -> Erased:
        """Delete the facts ``q`` names (``entity:attribute``) or whose current value contains its phrase; a
        phrase found only in a fact's history removes those past values. Observations of forgotten values go
        too, with the idempotency records of the turns that wrote them; then the file is compacted."""
        ids: list[str] = []
        texts: list[str] = []
        sources: list[str] = []
        whole: set[str] = set()
        with transaction(self.db):
            for f in [self._fact(r) for r in self.db.execute("SELECT * FROM facts").fetchall()]:
                if f.key in q.ids or q.matches(f.value, f.entity, f.attribute, f.display_entity):
                    self.db.execute("DELETE FROM facts WHERE entity = ? AND attribute = ?", (f.entity, f.attribute))
                    ids.append(f.key)
                    whole.add(f.key)
                    texts.extend([f.value, *(h.value for h in f.history)])
                    sources.extend([*f.sources, *(s for h in f.history for s in h.sources)])
                    continue
                gone = [h for h in f.history if q.matches(h.value)]
                if gone:
                    self._put(replace(f, history=tuple(h for h in f.history if h not in gone)))
                    ids.append(f.key)
                    texts.extend(h.value for h in gone)
                    sources.extend(s for h in gone for s in h.sources if s not in f.sources)
            doomed = []
            turn_keys = set()
            for r in self.db.execute("SELECT entity, attribute, value_norm, value, turn_key, sources "
                                     "FROM observations").fetchall():
                if fact_key(r[0], r[1]) in whole or r[3] in texts or q.matches(r[3]):
                    doomed.append(r[:3] + (r[4],))
                    turn_keys.add(r[4])
                    texts.append(r[3])
                    sources.extend(unpack(r[5]))
            self.db.executemany("DELETE FROM observations WHERE entity = ? AND attribute = ? AND value_norm = ? "
                                "AND turn_key = ?", doomed)
            drop_applied(self.db, turn_keys, set(ids), q.with_texts(texts))
        if not ids and not doomed:
            return Erased()
        compact(self.db)
        return Erased(tuple(ids), tuple(dict.fromkeys(texts)), tuple(dict.fromkeys(sources)))

    def sweep(self, now: float) -> dict[str, int]:
        """Retention: drop archived facts and history entries past ``archived_fact_ttl_days``."""
        ttl = self.cfg.archived_fact_ttl_days * 86_400.0
        if ttl <= 0:
            return {"facts_purged": 0}
        n = 0
        with transaction(self.db):
            for f in [self._fact(r) for r in self.db.execute("SELECT * FROM facts").fetchall()]:
                if f.status == "archived" and now - f.valid_from > ttl:
                    self.db.execute("DELETE FROM facts WHERE entity = ? AND attribute = ?", (f.entity, f.attribute))
                    n += 1
        return {"facts_purged": n}

    # ---- reads -----------------------------------------------------------------------
    def facts(self, entity: str | None = None, *, include_archived: bool = False) -> list[Fact]:
        sql = "SELECT * FROM facts WHERE (? IS NULL OR entity = ?)" + ("" if include_archived else
                                                                     " AND status = 'active'")
        ent = normalise(entity) if entity is not None else None
        return [self._fact(r) for r in self.db.execute(sql + " ORDER BY entity, attribute", (ent, ent))]

    def history(self, entity: str, attribute: str) -> list[FactVersion]:
        """Every value the fact has had, oldest first; the current value last (``valid_to`` = 0)."""
        f = self._get(normalise(entity), normalise(attribute).replace(" ", "_"))
        if f is None:
            raise NotFound(f"no fact {entity}:{attribute}")
        current = () if f.status != "active" else (FactVersion(f.value, f.sources, f.valid_from, 0.0, "current"),)
        return list(f.history) + list(current)

    def entities(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT DISTINCT entity FROM facts WHERE status = 'active'")]

    def recall(self, query: str, k: int) -> list[RecalledItem]:
        """Entity and keyword lookup over current values only. The entity is hit when the query names it whole (every
        word of "loved ones", not one of them); a fact hit by its entity alone scores ``subject_only_score``."""
        if k <= 0:
            raise InvalidInput("k must be >= 1")
        q = set(terms(query))
        qn = normalise(query)
        items = []
        for f in self.facts():
            ent_terms = set(terms(f.entity))
            ent_hit = f.entity in qn or bool(ent_terms) and ent_terms <= q
            keys = set(terms(f.attribute.replace("_", " "))) | set(terms(f.value))
            kw = len(keys & q) / max(1, len(keys))
            if not ent_hit and kw == 0:
                continue
            score = min(1.0, 0.6 + 0.4 * kw + 0.2) if kw and ent_hit else 0.4 * kw or self.cfg.subject_only_score
            items.append(RecalledItem("semantic", f.key, f.text, round(score * f.confidence, 6), f.sources,
                                      f.valid_from))
        items.sort(key=lambda it: (-it.score, it.id))
        return items[:k]

    def stats(self) -> dict[str, int]:
        a = self.db.execute("SELECT COUNT(*) FROM facts WHERE status = 'active'").fetchone()[0]
        b = self.db.execute("SELECT COUNT(*) FROM facts WHERE status != 'active'").fetchone()[0]
        o = self.db.execute("SELECT COUNT(*) FROM observations").fetchone()[0]
        size = self.file_bytes()
        return {"facts": int(a), "archived_facts": int(b), "observations": int(o), "semantic_bytes": size}

