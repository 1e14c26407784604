"""The episodic store's deletions: retention sweeps and forgetting by query."""

from __future__ import annotations

from soul_runtime.memory.episodic_digests import EpisodeDigests
from soul_runtime.memory.episodic_table import INDEXED
from soul_runtime.memory.erasure import Erased, ForgetQuery, compact, is_episode_id
from soul_runtime.memory.layer_db import drop_applied, unpack
from soul_runtime.memory.policy_episodic import in_recall, past_ttl
from soul_runtime.memory.sqlite_db import transaction


class EpisodeErasure(EpisodeDigests):
    def _delete(self, keys: list[int]) -> int:
        ops = []
        self._max_key = None
        with transaction(self.db):
            for key in keys:
                if self.db.execute("DELETE FROM episodes WHERE rowid = ?", (key,)).rowcount:
                    self._drop_digests([f"ep-{key}"])
                    self.db.execute("DELETE FROM episodes_fts WHERE rowid = ?", (key,))
                    ops.append((key, self._log("remove", key)))
        for key, seq in ops:
            self.index.remove(key, seq)
        self._unsaved += len(ops)
        return len(ops)

    def forget_where(self, q: ForgetQuery) -> Erased:
        """Delete the episodes ``q`` names or whose text contains its phrase, with the idempotency records of
        the turns that wrote them; then leave no copy in free pages, FTS segments, the WAL or the index."""
        wanted = {int(i[3:]) for i in q.ids if is_episode_id(i)}
        rows = self.db.execute("SELECT rowid, summary, key_text, sources, turn_key FROM episodes").fetchall()
        hit = [r for r in rows if r[0] in wanted or q.matches(r[1], r[2]) or q.from_sources(unpack(r[3]))]
        if not hit:
            return Erased()
        ids = tuple(f"ep-{r[0]}" for r in hit)
        texts = tuple(r[1] for r in hit)
        sources = tuple(dict.fromkeys(s for r in hit for s in unpack(r[3])))
        turn_keys = {r[4] for r in hit}
        self._max_key = None
        with transaction(self.db):
            for r in hit:
                self.db.execute("DELETE FROM episodes WHERE rowid = ?", (r[0],))
                self.db.execute("DELETE FROM episodes_fts WHERE rowid = ?", (r[0],))
            drop_applied(self.db, turn_keys, set(ids), q.with_texts(texts))
            self._drop_digests(ids)
            self.db.execute("DELETE FROM index_log")
        compact(self.db, ("episodes_fts",))
        self.index.rebuild(self.db.execute(f"SELECT rowid, vector FROM episodes WHERE {INDEXED} ORDER BY rowid"),
                           self._last_seq())
        self.flush()
        return Erased(ids, texts, sources)

    def sweep(self, now: float) -> dict[str, int]:
        """Retention: delete unpromoted episodes past ``episodic_ttl_days``; then bring the digests up to date
        (:meth:`consolidate`)."""
        rows = self.db.execute("SELECT rowid, at, promoted FROM episodes").fetchall()
        doomed = [r[0] for r in rows if past_ttl(r[1], bool(r[2]), now, self.cfg)]
        decayed = sum(1 for r in rows if not in_recall(r[1], bool(r[2]), now, self.cfg))
        deleted = self._delete(doomed)
        return {"episodes_deleted": deleted, "episodes_out_of_recall": decayed - len(doomed), **self.consolidate(now)}
