"""The episodic store's consolidated memory: digests of sessions and spans of sessions, kept in its ``digests``
table (migration 0009), derived from the episodes they name.

* :meth:`EpisodeDigests.consolidate` is work after the turn (run with retention, :meth:`sweep`, or on its own):
  a session whose episodes (or the words said in most sessions, which a digest's head leaves out) changed since
  its digest was written (their fingerprint) gets its digest rewritten, and so does every span holding it; a
  digest whose episodes are all gone is deleted. The digests are the same whenever consolidation ran.
* A forget deletes every digest that names an erased episode in the same transaction as the episodes (then the
  file is compacted with them: no byte left); the next consolidation writes it again from what is left.
* Recall offers the digests that share most of a question's words when the question gathers what was said
  over time (:data:`soul_runtime.memory.digest.SPANNING`), at most ``MemoryConfig.digests_recalled`` (2; 0:
  none), each scored DIGEST_SHARE of the best episode times the square root of the share of the question's
  terms it holds (DIGEST_FLOOR at least), so a precise line that answers still comes first.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from soul_runtime.memory.digest import (
    SPAN_SESSIONS,
    SPANNING,
    Digest,
    DigestWriter,
    Said,
    common_words,
    fingerprint,
    session_digest,
    span_digest,
    text_terms,
)
from soul_runtime.memory.episodic_table import EpisodeTable
from soul_runtime.memory.layer_db import pack, unpack
from soul_runtime.memory.sqlite_db import transaction
from soul_runtime.records import RecalledItem

DIGEST_SHARE = 0.9
"""A digest's recall score is at most this share of the best episode's: it comes after the line that answers."""
DIGEST_FLOOR = 0.75
"""...and at least this share of that (times DIGEST_SHARE) when it holds any of the question's words: the question
gathers what was said over time, which is what a digest holds."""
DIGEST_ID = "dg-"
"""A digest's id in recall: ``dg-session:<name>``, ``dg-span:<first>..<last>``."""


def _row(r: Sequence[Any]) -> Digest:
    return Digest(str(r[1]), tuple(unpack(r[2])), str(r[3]), tuple(unpack(r[4])), tuple(unpack(r[5])),
                  float(r[6]), float(r[7]), str(r[8]))


def digest_key(d: Digest) -> str:
    return f"{d.kind}:{d.sessions[0]}" if d.kind == "session" else f"span:{d.sessions[0]}..{d.sessions[-1]}"


class EpisodeDigests(EpisodeTable):
    def digests(self) -> list[Digest]:
        """Every digest held, sessions first in order, then spans (what the inspector shows, with provenance)."""
        rows = self.db.execute("SELECT key, kind, sessions, text, episodes, sources, first_at, last_at, fingerprint "
                               "FROM digests ORDER BY kind DESC, first_at").fetchall()
        return [_row(r) for r in rows]

    def current_digests(self) -> list[Digest]:
        """:meth:`digests` after bringing them up to date (:meth:`consolidate`): what a reader is shown."""
        self.consolidate()
        return self.digests()

    def _said_by_session(self) -> dict[str, list[Said]]:
        out: dict[str, list[Said]] = {}
        for rowid, at, text, sources, session in self.db.execute(
                "SELECT e.rowid, e.at, e.summary, e.sources, e.session FROM episodes e JOIN sessions s "
                "ON s.name = e.session WHERE e.superseded = 0 ORDER BY s.idx, e.at, e.rowid"):
            out.setdefault(session, []).append(Said(f"ep-{rowid}", at, text, tuple(unpack(sources))))
        return out

    def consolidate(self, now: float | None = None, writer: DigestWriter = session_digest) -> dict[str, int]:
        """Bring the digests up to date with the episodes (see the module doc); ``writer`` writes a session's
        digest (extractive offline, a model's words through the same interface). Counts of what was done."""
        at = time.time() if now is None else now
        sessions = self._said_by_session()
        held = {str(r[0]): str(r[1]) for r in self.db.execute("SELECT key, fingerprint FROM digests")}
        digests: list[Digest] = []
        written = 0
        common = common_words(sessions.values())
        for name, said in sessions.items():
            key = f"session:{name}"
            mark = fingerprint(said, common)
            if held.get(key) == mark:
                row = self.db.execute("SELECT key, kind, sessions, text, episodes, sources, first_at, last_at, "
                                      "fingerprint FROM digests WHERE key = ?", (key,)).fetchone()
                digests.append(_row(row))
                continue
            d = writer(name, said, common)
            if d is not None:
                d = replace(d, fingerprint=mark)
                digests.append(d)
                self._put(d, at)
                written += 1
        spans = [d for i in range(0, len(digests), SPAN_SESSIONS)
                 if (d := span_digest(digests[i:i + SPAN_SESSIONS])) is not None]
        for d in spans:
            if held.get(digest_key(d)) != d.fingerprint:
                self._put(d, at)
                written += 1
        keep = {digest_key(d) for d in digests + spans}
        stale = [k for k in held if k not in keep]
        if stale:
            with transaction(self.db):
                self.db.executemany("DELETE FROM digests WHERE key = ?", [(k,) for k in stale])
        return {"digests_written": written, "digests_dropped": len(stale), "digests": len(keep)}

    def _put(self, d: Digest, at: float) -> None:
        with transaction(self.db):
            self.db.execute("INSERT OR REPLACE INTO digests VALUES (?,?,?,?,?,?,?,?,?,?)",
                            (digest_key(d), d.kind, pack(list(d.sessions)), d.text, pack(list(d.episodes)),
                             pack(list(d.sources)), d.first_at, d.last_at, d.fingerprint, at))

    def _drop_digests(self, episode_ids: Iterable[str]) -> int:
        """Delete every digest naming one of ``episode_ids`` (inside the caller's transaction)."""
        gone = set(episode_ids)
        if not gone:
            return 0
        keys = [(str(k),) for k, eps in self.db.execute("SELECT key, episodes FROM digests")
                if gone.intersection(unpack(eps))]
        self.db.executemany("DELETE FROM digests WHERE key = ?", keys)
        return len(keys)

    def _digest_items(self, query: str, best: float) -> list[RecalledItem]:
        """The digests a question that gathers what was said over time is offered (module doc)."""
        if not self.cfg.digests_recalled or not SPANNING.search(query):
            return []
        rows = self.db.execute("SELECT key, kind, sessions, text, episodes, sources, first_at, last_at, fingerprint "
                               "FROM digests").fetchall()
        if not rows:
            return []
        ds = {str(r[0]): _row(r) for r in rows}
        asked = text_terms(query)
        if not asked:
            return []
        held = {k: len(asked & text_terms(d.text)) / len(asked) for k, d in ds.items()}
        top = sorted((k for k in ds if held[k] > 0), key=lambda k: (-held[k], k))[:self.cfg.digests_recalled]
        return [RecalledItem("episodic", DIGEST_ID + k, ds[k].text, round(best * DIGEST_SHARE * max(DIGEST_FLOOR, math.sqrt(held[k])), 6),
                             ds[k].sources, ds[k].first_at) for k in top]
