"""Group commit: the changes of many soul databases, pushed by any thread of a process, sent to PostgreSQL as one
statement in one transaction.

Each soul database's push (:meth:`soul_runtime.memory.pg_cache.Mirror.push`) is a compare-and-set of its
``version`` and the rows it changed. A process (a soul host, a store shard) pushes for many souls at once from
its threads; sending each as its own round trip and transaction costs the server and the process more than the
rows themselves. Here the first push to arrive while none is on its way goes at once; those that arrive while
it is on its way wait and go together as the next statement. Nothing waits for a batch to fill, so a lone push
goes as fast as before, and under load the batches grow with it.

Each change in a batch stands or falls alone: its rows are written only if its own compare-and-set took (a soul
database another owner wrote is left as it is, and its caller finds out why on the slow path). A batch the
server does not take at all (down, restarting) fails every push in it, each of which its caller retries.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from soul_runtime.memory import postgres_db


@dataclass(frozen=True)
class Change:
    """One soul database's commit: take ``version`` ``v0`` → ``v0 + 1`` (a first write when ``v0`` is 0), then
    delete ``dels`` and write ``puts`` (``(table, rowid, cells)``)."""

    soul: str
    db: str
    v0: int
    schema: int
    txn: str
    puts: list[tuple[str, int, bytes]]
    dels: list[tuple[str, int]]


MANY_COMMIT = """
WITH want AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::int[], $5::text[])
    AS w(soul, db, v0, sch, txn)),
moved AS (
    UPDATE soul_dbs AS o SET version = w.v0 + 1, schema = w.sch, txn = w.txn FROM want AS w
    WHERE o.soul = w.soul AND o.db = w.db AND o.version = w.v0 AND w.v0 > 0 RETURNING o.soul, o.db),
born AS (
    INSERT INTO soul_dbs (soul, db, version, schema, txn) SELECT soul, db, 1, sch, txn FROM want WHERE v0 = 0
    ON CONFLICT (soul, db) DO NOTHING RETURNING soul, db),
took AS (SELECT soul, db FROM moved UNION ALL SELECT soul, db FROM born),
gone AS (
    DELETE FROM soul_rows AS r USING unnest($6::text[], $7::text[], $8::text[], $9::bigint[])
    AS x(soul, db, tbl, rid)
    WHERE r.soul = x.soul AND r.db = x.db AND r.tbl = x.tbl AND r.rid = x.rid
    AND (x.soul, x.db) IN (SELECT soul, db FROM took)),
put AS (
    INSERT INTO soul_rows (soul, db, tbl, rid, cells)
    SELECT x.soul, x.db, x.tbl, x.rid, x.cells
    FROM unnest($10::text[], $11::text[], $12::text[], $13::bigint[], $14::bytea[])
    AS x(soul, db, tbl, rid, cells)
    WHERE (x.soul, x.db) IN (SELECT soul, db FROM took)
    ON CONFLICT (soul, db, tbl, rid) DO UPDATE SET cells = EXCLUDED.cells)
SELECT soul, db FROM took
"""
"""A batch of changes as one statement: each change's compare-and-set (or, for a first write, the database's
row created if no one else created it), then the deletes and upserts of the changes whose version was taken.
Each array goes as one string in PostgreSQL's array syntax (:func:`array`): the server parses it, and the
process is spared psycopg's per-element look at a list, the part of a push it paid most for. The parameters are
positional (``$1`` …, in the order of :data:`COLUMNS`): the statement is prepared once per connection and sent
with libpq's own call."""

COLUMNS = ("s", "d", "v0", "sch", "txn", "ds", "dd", "dt", "dr", "ps", "pd", "pt", "pr", "pc")
"""The statement's parameters, in their order: the changes' soul, database, version, schema and transaction; the
deletes' soul, database, table and row; the puts' soul, database, table, row and cells."""
STATEMENT = b"soul_group_commit"


def params(batch: list[Change]) -> dict[str, str]:
    """The statement's parameters for ``batch`` (one array per column, the rows of every change together)."""
    p: dict[str, list[Any]] = {k: [] for k in COLUMNS}
    for c in batch:
        p["s"].append(c.soul)
        p["d"].append(c.db)
        p["v0"].append(c.v0)
        p["sch"].append(c.schema)
        p["txn"].append(c.txn)
        for t, r in c.dels:
            p["ds"].append(c.soul)
            p["dd"].append(c.db)
            p["dt"].append(t)
            p["dr"].append(r)
        for t, r, cells in c.puts:
            p["ps"].append(c.soul)
            p["pd"].append(c.db)
            p["pt"].append(t)
            p["pr"].append(r)
            p["pc"].append(cells)
    return {k: array(v, INTS if k in ("v0", "sch", "dr", "pr") else BYTES if k == "pc" else TEXTS)
            for k, v in p.items()}


TEXTS, INTS, BYTES = "text", "int", "bytes"


def array(values: list[Any], kind: str) -> str:
    """``values`` (all str, int or bytes, as ``kind`` says) as a PostgreSQL array literal, e.g. ``{"a","b"}``,
    ``{1,2}``, ``{"\\\\x0a0b"}``: text quoted with its backslashes and double quotes escaped, bytes in bytea's hex
    form."""
    if kind == INTS:
        return "{" + ",".join(str(int(v)) for v in values) + "}"
    if kind == BYTES:
        return "{" + ",".join('"\\\\x' + v.hex() + '"' for v in values) + "}"
    return "{" + ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "}"


class Sender:
    """Sends batches to one server on a connection of the process's pool kept for it: at most one batch is ever
    on its way (:class:`GroupCommit`), so a checkout per batch is work for nothing. The statement is prepared on
    the connection once and each batch goes with libpq's own call (no cursor, no adaptation, the interpreter lock
    let go while it waits). A connection the server dropped goes back to the pool, which replaces it; the batch's
    callers retry (:func:`soul_runtime.memory.postgres_db.retrying`). A pool of one connection
    (``SOUL_PG_POOL=1``) gets it back after each batch."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._con: Any = None
        self._pool: Any = None
        self._lock = threading.Lock()

    def __call__(self, batch: list[Change]) -> set[tuple[str, str]]:
        """One round trip: the batch as one statement (its own transaction); the (soul, db) whose version it
        took."""
        with self._lock:
            if self._con is not None and postgres_db.opened_pool(self.url) is not self._pool:
                self._give_back()  # the pools were closed (settings changed): a connection of the new one
            con = self._con if self._con is not None else self._take()
            p = params(batch)
            enc = con.info.encoding
            try:
                res = con.pgconn.exec_prepared(STATEMENT, [p[k].encode(enc) for k in COLUMNS])
            except BaseException:
                self._give_back()
                raise
            try:
                if res.status != _pq().ExecStatus.TUPLES_OK:
                    self._raise(con, res)
                return {(res.get_value(i, 0).decode(enc), res.get_value(i, 1).decode(enc))
                        for i in range(res.ntuples)}
            finally:
                if self._pool is not None and self._pool.max_size < 2:
                    self._give_back()  # a pool of one connection: keeping it would leave none for the rest

    def _take(self) -> Any:
        self._pool = postgres_db.pool(self.url)
        con = self._con = self._pool.getconn()
        res = con.pgconn.prepare(STATEMENT, MANY_COMMIT.encode())
        if res.status != _pq().ExecStatus.COMMAND_OK and res.error_field(_pq().DiagnosticField.SQLSTATE) != \
                b"42P05":  # 42P05: prepared already (a connection this process held before)
            self._raise(con, res)
        return con

    def _raise(self, con: Any, res: Any) -> None:
        import psycopg

        if con.pgconn.status != _pq().ConnStatus.OK:  # the connection is gone: a fresh one next time
            self._give_back()
            raise psycopg.OperationalError(res.error_message.decode(errors="replace") or "connection lost")
        raise psycopg.errors.error_from_result(res, encoding=con.info.encoding)

    def _give_back(self) -> None:
        con, self._con = self._con, None
        if con is not None:
            try:
                self._pool.putconn(con)
            except Exception:  # noqa: BLE001 — its pool was closed meanwhile: the connection goes with it
                con.close()


def _pq() -> Any:
    from psycopg import pq
    return pq


def send(url: str, batch: list[Change]) -> set[tuple[str, str]]:
    """One round trip: the batch as one statement (its own transaction); the (soul, db) whose version it took."""
    return sender(url)(batch)


def sender(url: str) -> Sender:
    """This process's sender to ``url`` (its group commit's)."""
    got = group(url).sender
    assert isinstance(got, Sender)
    return got


@dataclass
class _Waiting:
    change: Change
    done: bool = False
    took: bool = False
    error: BaseException | None = None


@dataclass
class GroupCommit:
    """The pushes of one process to one server: at most one batch on its way; those that arrive meanwhile go
    together next. ``sender`` sends a batch (:func:`send`); ``batches`` and ``changes`` count what went."""

    sender: Callable[[list[Change]], set[tuple[str, str]]]
    batches: int = 0
    changes: int = 0
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _queue: list[_Waiting] = field(default_factory=list)
    _busy: bool = False

    def commit(self, change: Change) -> bool:
        """Send ``change`` (with whatever else is waiting); whether its version was taken. Raises what sending
        its batch raised."""
        me = _Waiting(change)
        with self._cond:
            self._queue.append(me)
        while True:
            with self._cond:
                while self._busy and not me.done:
                    self._cond.wait()
                if me.done:
                    break
                self._busy = True  # nobody on the way: this thread takes what waits (itself, as a rule) and goes
                batch, self._queue = _one_per_database(self._queue)
            self._lead(batch)
        if me.error is not None:
            raise me.error
        return me.took

    def _lead(self, batch: list[_Waiting]) -> None:
        took: set[tuple[str, str]] = set()
        error: BaseException | None = None
        try:
            took = self.sender([w.change for w in batch])
        except BaseException as e:  # every push of the batch sees it (and retries on its own)
            error = e
        with self._cond:
            for w in batch:
                w.took = (w.change.soul, w.change.db) in took
                w.error, w.done = error, True
            self.batches += 1
            self.changes += len(batch)
            self._busy = False
            self._cond.notify_all()


def _one_per_database(queue: list[_Waiting]) -> tuple[list[_Waiting], list[_Waiting]]:
    """The batch to send and what stays queued: a database's second change waits for the next batch (its owner
    pushes one at a time, so this is only ever a retry beside an earlier try)."""
    seen: set[tuple[str, str]] = set()
    batch: list[_Waiting] = []
    rest: list[_Waiting] = []
    for w in queue:
        key = (w.change.soul, w.change.db)
        (rest if key in seen else batch).append(w)
        seen.add(key)
    return batch, rest


_groups: dict[str, GroupCommit] = {}
_groups_lock = threading.Lock()


def group(url: str) -> GroupCommit:
    """This process's group commit to ``url``."""
    with _groups_lock:
        g = _groups.get(url)
        if g is None:
            g = _groups[url] = GroupCommit(Sender(url))
        return g
