"""Group commit of soul databases' pushes: the batching itself (threads and a sender that records what it was
given), and the one statement on a real PostgreSQL server (each change of a batch stands or falls alone)."""

from __future__ import annotations

import threading

import pytest

from soul_runtime.memory import pg_commits
from soul_runtime.memory.pg_commits import Change, GroupCommit


def change(soul: str, v0: int = 1, rows: int = 1, db: str = "episodic", txn: str = "t") -> Change:
    return Change(soul, db, v0, 9, txn, [("episodes", i, f"{soul}-{i}".encode()) for i in range(rows)], [])


class GatedSender:
    """Records each batch; the first one waits at a gate until the test opens it, so others queue behind it."""

    def __init__(self, refuse: frozenset[str] = frozenset(), fail: bool = False) -> None:
        self.batches: list[list[str]] = []
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.refuse, self.fail = refuse, fail

    def __call__(self, batch: list[Change]) -> set[tuple[str, str]]:
        self.batches.append([c.soul for c in batch])
        if len(self.batches) == 1:
            self.entered.set()
            self.gate.wait(10)
        if self.fail:
            raise ConnectionError("server went away")
        return {(c.soul, c.db) for c in batch if c.soul not in self.refuse}


def run_threads(g: GroupCommit, changes: list[Change], sender: GatedSender) -> dict[str, object]:
    out: dict[str, object] = {}

    def one(c: Change) -> None:
        try:
            out[c.soul] = g.commit(c)
        except Exception as e:  # noqa: BLE001 — what the caller would see
            out[c.soul] = e

    first = threading.Thread(target=one, args=(changes[0],))
    first.start()
    assert sender.entered.wait(10)
    rest = [threading.Thread(target=one, args=(c,)) for c in changes[1:]]
    for t in rest:
        t.start()
    while len(g._queue) < len(changes) - 1:  # every other push waits behind the first batch
        threading.Event().wait(0.01)
    sender.gate.set()
    for t in [first, *rest]:
        t.join(10)
    return out


def test_pushes_that_arrive_while_one_is_on_its_way_go_together_next() -> None:
    sender = GatedSender(refuse=frozenset({"s3"}))
    g = GroupCommit(sender)
    out = run_threads(g, [change(f"s{i}") for i in range(6)], sender)
    assert sender.batches[0] == ["s0"]
    assert sorted(sender.batches[1]) == ["s1", "s2", "s3", "s4", "s5"] and len(sender.batches) == 2
    assert out == {"s0": True, "s1": True, "s2": True, "s3": False, "s4": True, "s5": True}
    assert (g.batches, g.changes) == (2, 6)


def test_a_batch_the_server_did_not_take_fails_every_push_in_it() -> None:
    sender = GatedSender(fail=True)
    g = GroupCommit(sender)
    out = run_threads(g, [change(f"s{i}") for i in range(4)], sender)
    assert all(isinstance(v, ConnectionError) for v in out.values()) and len(out) == 4


def test_a_second_change_of_one_database_waits_for_the_next_batch() -> None:
    queue = [pg_commits._Waiting(change("a", txn="1")), pg_commits._Waiting(change("b")),
             pg_commits._Waiting(change("a", txn="2")), pg_commits._Waiting(change("a", db="semantic"))]
    batch, rest = pg_commits._one_per_database(queue)
    assert [(w.change.soul, w.change.db, w.change.txn) for w in batch] == [
        ("a", "episodic", "1"), ("b", "episodic", "t"), ("a", "semantic", "t")]
    assert [w.change.txn for w in rest] == ["2"]


@pytest.fixture
def pg_url() -> str:
    from soul_runtime.memory import postgres_db
    from tests.pg import fresh_database
    url = fresh_database("commits")
    postgres_db.pool(url)  # migrated
    return url


def rows(url: str) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str, int], bytes]]:
    import psycopg
    with psycopg.connect(url) as con:
        dbs = {(s, d): int(v) for s, d, v in con.execute("SELECT soul, db, version FROM soul_dbs")}
        cells = {(s, t, int(r)): bytes(c) for s, t, r, c in con.execute("SELECT soul, tbl, rid, cells FROM soul_rows")}
    return dbs, cells


def test_one_statement_takes_each_change_alone_on_a_real_server(pg_url: str) -> None:
    # first writes: each creates its database's row at version 1
    took = pg_commits.send(pg_url, [change("a", v0=0, rows=2), change("b", v0=0), change("c", v0=0)])
    assert took == {("a", "episodic"), ("b", "episodic"), ("c", "episodic")}
    # a first write of a database someone created, a stale version, a new database and a good one, in one batch
    took = pg_commits.send(pg_url, [change("a", v0=0, rows=3), change("c", v0=5, rows=3),
                                    Change("a", "semantic", 0, 9, "t", [("facts", 1, b"f")], []),
                                    Change("b", "episodic", 1, 9, "t", [("episodes", 7, b"new")], [("episodes", 0)])])
    assert took == {("a", "semantic"), ("b", "episodic")}
    dbs, cells = rows(pg_url)
    assert dbs == {("a", "episodic"): 1, ("b", "episodic"): 2, ("c", "episodic"): 1, ("a", "semantic"): 1}
    # a's episodic rows are the first write's (2 rows), not the refused one's; b lost row 0 and gained row 7
    assert sorted(k for k in cells if k[0] == "a") == [("a", "episodes", 0), ("a", "episodes", 1), ("a", "facts", 1)]
    assert sorted(k for k in cells if k[0] == "b") == [("b", "episodes", 7)]
    assert cells[("b", "episodes", 7)] == b"new"
    assert sorted(k for k in cells if k[0] == "c") == [("c", "episodes", 0)]  # the stale change wrote nothing


def test_names_and_cells_of_any_characters_arrive_as_they_were(pg_url: str) -> None:
    """The batch's arrays go as array literals: quotes, backslashes, commas, braces, spaces, non-ASCII and every
    byte value come back unchanged."""
    odd = ['we"ird\\ soul,{x}', "tenant:é ü", "", "NULL", " lead and trail "]
    cells = bytes(range(256))
    batch = [Change(s, 'db "q"\\', 0, 9, f"t{i}", [('t,"x"', 2**40 + i, cells + s.encode())], [])
             for i, s in enumerate(odd)]
    assert pg_commits.send(pg_url, batch) == {(s, 'db "q"\\') for s in odd}
    dbs, got = rows(pg_url)
    assert set(dbs) == {(s, 'db "q"\\') for s in odd}
    assert got == {(s, 't,"x"', 2**40 + i): cells + s.encode() for i, s in enumerate(odd)}
    assert pg_commits.array([], pg_commits.TEXTS) == "{}" and pg_commits.array([-3, 4], pg_commits.INTS) == "{-3,4}"


def test_a_commit_connection_the_server_dropped_is_replaced_and_the_retry_goes_through(pg_url: str) -> None:
    import psycopg

    from soul_runtime.memory import postgres_db

    assert pg_commits.send(pg_url, [change("a", v0=0)]) == {("a", "episodic")}
    pid = pg_commits.sender(pg_url)._con.info.backend_pid
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(psycopg.OperationalError) as lost:
        pg_commits.send(pg_url, [change("b", v0=0)])
    assert postgres_db.unreachable(lost.value)  # what its callers retry
    took = postgres_db.retrying(lambda: pg_commits.send(pg_url, [change("b", v0=0)]), pg_url)
    assert took == {("b", "episodic")}
    assert pg_commits.sender(pg_url)._con.info.backend_pid != pid
    assert rows(pg_url)[0] == {("a", "episodic"): 1, ("b", "episodic"): 1}


def test_a_batch_the_server_refuses_raises_its_error_and_the_connection_goes_on(pg_url: str) -> None:
    import psycopg

    from soul_runtime.errors import StorageError
    from soul_runtime.memory import postgres_db

    with pytest.raises(psycopg.DataError):  # text may not hold a NUL character
        pg_commits.send(pg_url, [change("a\x00b", v0=0)])
    with pytest.raises(StorageError):
        postgres_db.retrying(lambda: pg_commits.send(pg_url, [change("a\x00b", v0=0)]), pg_url)
    pid = pg_commits.sender(pg_url)._con.info.backend_pid
    assert pg_commits.send(pg_url, [change("c", v0=0)]) == {("c", "episodic")}
    assert pg_commits.sender(pg_url)._con.info.backend_pid == pid
    assert rows(pg_url)[0] == {("c", "episodic"): 1}


def test_a_pool_of_one_connection_gets_it_back_after_each_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    from soul_runtime.memory import postgres_db
    from tests.pg import fresh_database

    url = fresh_database("commits_one")
    monkeypatch.setattr(postgres_db, "POOL_SIZE", 1)  # SOUL_PG_POOL=1
    pool = postgres_db.pool(url)
    assert pool.max_size == 1
    assert pg_commits.send(url, [change("a", v0=0)]) == {("a", "episodic")}
    con = pool.getconn(timeout=2)  # the one connection is free for the process's other statements
    try:
        assert con.execute("SELECT count(*) FROM soul_dbs").fetchone()[0] == 1
    finally:
        pool.putconn(con)
    assert pg_commits.send(url, [change("a", v0=1)]) == {("a", "episodic")}  # prepared again, or already
    assert rows(url)[0] == {("a", "episodic"): 2}
