"""The procedural layer: versioned workflows, recalled by task classification."""

from __future__ import annotations

from typing import Any

from soul_runtime.errors import InvalidInput
from soul_runtime.memory.erasure import Erased, ForgetQuery, compact
from soul_runtime.memory.layer_db import (
    apply_idempotent,
    drop_applied,
    pack,
    unpack,
)
from soul_runtime.memory.layer_store import LayerStore
from soul_runtime.memory.policy_procedural import TaskRun, decide_procedure, step_signature
from soul_runtime.memory.procedural_schema import MIGRATIONS
from soul_runtime.memory.sqlite_db import transaction
from soul_runtime.records import MemoryWrite, Op, Procedure, RecalledItem, Store, WriteRequest
from soul_runtime.text import terms


def classify_lexically(query: str, classes: list[str]) -> list[tuple[str, float]]:
    """Task classes ranked by how much of the class's words the request contains."""
    q = set(terms(query))
    out = []
    for c in classes:
        ct = set(terms(c))
        if ct and q & ct:
            out.append((c, len(q & ct) / len(ct)))
    return sorted(out, key=lambda x: (-x[1], x[0]))


TABLES = ("procedures", "runs", "applied")


class ProceduralStore(LayerStore):
    store = Store.PROCEDURAL
    MIGRATIONS = MIGRATIONS
    TABLES = TABLES
    COUNTED = "procedures"

    @staticmethod
    def _proc(r: tuple[Any, ...]) -> Procedure:
        return Procedure(task_class=r[0], version=r[1], steps=tuple(unpack(r[2])), status=r[3],
                         sources=tuple(unpack(r[4])), created_at=r[5], clean_runs=r[6], failures=r[7])

    def procedures(self, task_class: str | None = None, *, include_retired: bool = True) -> list[Procedure]:
        rows = self.db.execute("SELECT * FROM procedures WHERE (? IS NULL OR task_class = ?) "
                               "ORDER BY task_class, version", (task_class, task_class)).fetchall()
        procs = [self._proc(r) for r in rows]
        return procs if include_retired else [p for p in procs if p.status != "retired"]

    def task_classes(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT DISTINCT task_class FROM runs UNION "
                                              "SELECT DISTINCT task_class FROM procedures")]

    def apply(self, req: WriteRequest) -> list[MemoryWrite]:
        return self.apply_many([req])[0]

    @staticmethod
    def writes_without_store(reqs: list[WriteRequest]) -> list[list[MemoryWrite]] | None:
        """The answer of :meth:`apply_many` when no request reports a task run or a save (whatever is stored);
        else None."""
        return None if any(_reports_run(r) for r in reqs) else [[] for _ in reqs]

    def apply_many(self, reqs: list[WriteRequest]) -> list[list[MemoryWrite]]:
        """Record task runs and decide procedure changes, several exchanges in one durable transaction."""
        return apply_idempotent(self.db, reqs, self._one, f"soul {self.dir.name} procedural")

    def _one(self, req: WriteRequest) -> list[MemoryWrite]:
        writes: list[MemoryWrite] = []
        report = req.extraction.task
        if report is None or not _reports_run(req):
            return writes
        runs = [TaskRun(r[0], r[1], tuple(unpack(r[2])), r[3], r[4], tuple(unpack(r[5])))
                for r in self.db.execute("SELECT task_class, signature, steps, outcome, at, sources FROM runs "
                                         "WHERE task_class = ? ORDER BY id", (report.task_class,))]
        changes = decide_procedure(report, runs, self.procedures(report.task_class), sources=req.sources,
                                   now=req.now, cfg=self.cfg)
        if report.outcome:
            self.db.execute("INSERT INTO runs (task_class, signature, steps, outcome, at, sources, turn_key)"
                            " VALUES (?,?,?,?,?,?,?)",
                            (report.task_class, step_signature(report.steps), pack(list(report.steps)),
                             report.outcome, req.now, pack(list(req.sources)), req.turn_key))
        for ch in changes:
            p = ch.procedure
            self.db.execute("INSERT OR REPLACE INTO procedures VALUES (?,?,?,?,?,?,?,?)",
                            (p.task_class, p.version, pack(list(p.steps)), p.status, pack(list(p.sources)),
                             p.created_at, p.clean_runs, p.failures))
            writes.append(MemoryWrite(Store.PROCEDURAL, ch.op, p.id, ch.reason,
                                      {"status": p.status, "steps": list(p.steps), "clean_runs": p.clean_runs}))
        if not changes:
            what = f"task run recorded ({report.outcome})" if report.outcome else "already saved: nothing new"
            writes.append(MemoryWrite(Store.PROCEDURAL, Op.NOOP, report.task_class, what))
        return writes

    def recall(self, query: str, k: int, task_class: str | None = None) -> list[RecalledItem]:
        """The active version (and a candidate under rollout) of the task class the request belongs to."""
        if k <= 0:
            raise InvalidInput("k must be >= 1")
        active = [p for p in self.procedures(include_retired=False)]
        classes = sorted({p.task_class for p in active})
        ranked = [(task_class, 1.0)] if task_class in classes else classify_lexically(query, classes)
        items = []
        for cls, score in ranked:
            for p in active:
                if p.task_class == cls:
                    s = score if p.status == "active" else score * 0.5
                    items.append(RecalledItem("procedural", p.id, p.text, round(s, 6), p.sources, p.created_at))
        items.sort(key=lambda it: (-it.score, it.id))
        return items[:k]

    def forget_where(self, q: ForgetQuery) -> Erased:
        """Delete the procedure versions ``q`` names (``task@vN``, or a task class for all its versions) or
        whose steps contain its phrase, the task runs they were learned from (or that contain the phrase),
        and the idempotency records of those turns; then the file is compacted."""
        procs = self.procedures()
        hit = [p for p in procs if p.id in q.ids or p.task_class in q.ids or q.matches(p.task_class, *p.steps)]
        classes = {p.task_class for p in hit}
        gone_classes = {c for c in classes if all(p in hit for p in procs if p.task_class == c)}
        runs = self.db.execute("SELECT id, task_class, steps, sources, turn_key FROM runs").fetchall()
        doomed = [r for r in runs if r[1] in gone_classes or q.matches(r[1], *unpack(r[2]))]
        if not hit and not doomed:
            return Erased()
        ids = tuple(p.id for p in hit)
        texts = tuple(s for p in hit for s in p.steps) + tuple(s for r in doomed for s in unpack(r[2]))
        sources = tuple(dict.fromkeys([*(s for p in hit for s in p.sources),
                                       *(s for r in doomed for s in unpack(r[3]))]))
        with transaction(self.db):
            self.db.executemany("DELETE FROM procedures WHERE task_class = ? AND version = ?",
                                [(p.task_class, p.version) for p in hit])
            self.db.executemany("DELETE FROM runs WHERE id = ?", [(r[0],) for r in doomed])
            drop_applied(self.db, {r[4] for r in doomed}, set(ids),
                         q.with_texts(p.text for p in hit))
        compact(self.db)
        return Erased(ids, tuple(dict.fromkeys(texts)), sources)

    def stats(self) -> dict[str, int]:
        a = self.db.execute("SELECT COUNT(*) FROM procedures WHERE status = 'active'").fetchone()[0]
        c = self.db.execute("SELECT COUNT(*) FROM procedures WHERE status = 'candidate'").fetchone()[0]
        r = self.db.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
        size = self.file_bytes()
        return {"procedures": int(a), "candidate_procedures": int(c), "task_runs": int(r), "procedural_bytes": size}



def _reports_run(req: WriteRequest) -> bool:
    report = req.extraction.task
    return report is not None and bool(report.task_class) and bool(report.outcome or report.save_requested)
