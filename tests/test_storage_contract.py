"""What every storage promises, on SQLite files and on PostgreSQL (a real server, tests/pg.py), and what the
PostgreSQL storage adds: caches rebuilt from the server's rows on any node, one writer per soul by a version the
server keeps, erasure that leaves nothing in a pg_dump, a server away or refusing answered with the error tree."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from soul_runtime.clock import DAY
from soul_runtime.errors import RuntimeUnavailable, StaleOwner, StorageError
from soul_runtime.loop.soul_state import SoulState
from soul_runtime.memory import pg_cache, postgres_db
from soul_runtime.memory.soul_memory import SoulMemory
from soul_runtime.memory.soul_records import known, remove_soul, soul_ids, stored
from soul_runtime.memory.sqlite_db import use_storage
from soul_runtime.records import Extraction, FactCandidate, TaskReport, WriteRequest
from tests.fakes import HashEmbedder

NOW = 1_780_000_000.0
SECRET = "the vault code is 7741 orchid"


def req(key: str, ex: Extraction, at: float = NOW, session: str = "s1", epoch: int = 0) -> WriteRequest:
    return WriteRequest(turn_key=key, now=at, actor="maya", sources=(f"{key}/u",), extraction=ex, session=session,
                        epoch=epoch)


def fill(m: SoulMemory, n: int = 40) -> None:
    """Episodes over several sessions, a fact and its correction, a procedure's runs."""
    for i in range(n):
        m.write(req(f"t{i}", Extraction(episode=f"Maya worked on ticket {i} about the {['billing', 'search', 'login'][i % 3]}"
                                        f" service, step {i * 7}", event=True), NOW + i * 3600, session=f"s{i // 10}"))
    m.write(req("f1", Extraction(facts=(FactCandidate("tendril", "db", "Postgres 15", "confirmed", ("f1/u",), "Tendril",
                                                      "db"),)), NOW + DAY))
    m.write(req("f2", Extraction(facts=(FactCandidate("tendril", "db", "Postgres 16", "corrected", ("f2/u",),
                                                      "Tendril", "db"),)), NOW + 2 * DAY))
    for i in range(3):
        m.write(req(f"p{i}", Extraction(task=TaskReport("deploy", ("build", "test", "ship"), "success")),
                    NOW + 3 * DAY + i))


def snapshot(m: SoulMemory) -> dict[str, object]:
    """What a user reads of a soul: recalls (ids and scores), facts with history, procedures, stats."""
    recalls = {q: [(it.id, round(it.score, 9)) for it in m.recall(q, 8, at=NOW + 4 * DAY)]
               for q in ("billing ticket", "which database does tendril use", "how to deploy", "step 91")}
    return {"recalls": recalls, "facts": [(f.entity, f.value) for f in m.facts()],
            "history": [h.value for h in m.fact_history("tendril", "db")],
            "procedures": [(p.task_class, p.version, p.steps) for p in m.procedures()],
            "stats": {k: v for k, v in m.stats().items() if not k.endswith("bytes")}}


@pytest.fixture
def pg() -> str:
    """A fresh database of the tests' server as this process's storage, for the PostgreSQL-only tests."""
    from tests.pg import fresh_database
    url = fresh_database()
    use_storage(url)
    yield url
    use_storage("local")
    pg_cache.forget_known()


def test_every_layer_reads_back_what_was_written(tmp_path: Path, backend: str) -> None:
    m = SoulMemory(tmp_path / "souls" / "ana", embedder=HashEmbedder())
    fill(m)
    got = snapshot(m)
    m.close()
    assert got["history"] == ["Postgres 15", "Postgres 16"] and got["facts"] == [("tendril", "Postgres 16")]
    assert got["procedures"] and got["recalls"]["billing ticket"]
    m = SoulMemory(tmp_path / "souls" / "ana", embedder=HashEmbedder())
    assert snapshot(m) == got  # reopened: the same
    m.close()


def test_postgres_returns_what_sqlite_returns(tmp_path: Path, pg: str) -> None:
    """The same writes on both storages: every read (recall ids and scores included) is the same, also from a
    cache rebuilt on another node from the server's rows alone."""
    use_storage("local")
    local = SoulMemory(tmp_path / "local" / "souls" / "ana", embedder=HashEmbedder())
    fill(local)
    want = snapshot(local)
    local.close()
    use_storage(pg)
    m = SoulMemory(tmp_path / "node1" / "souls" / "ana", embedder=HashEmbedder())
    fill(m)
    assert snapshot(m) == want
    m.close()
    shutil.rmtree(tmp_path / "node1")  # the node is lost with its disk
    moved = SoulMemory(tmp_path / "node2" / "souls" / "ana", embedder=HashEmbedder())
    assert moved.episodic.db.mirror.rebuilt and moved.episodic.index.rebuilt
    assert snapshot(moved) == want
    moved.close()


def test_a_cache_behind_the_server_is_caught_up_on_opening(tmp_path: Path, pg: str) -> None:
    """Node 1 kept its cache while the soul was written on node 2: opening it on node 1 again reads node 2's
    writes, not its own stale file."""
    a = SoulMemory(tmp_path / "n1" / "souls" / "bo", embedder=HashEmbedder())
    fill(a, 6)
    a.close()
    b = SoulMemory(tmp_path / "n2" / "souls" / "bo", embedder=HashEmbedder())
    b.write(req("late", Extraction(episode="Bo moved the standup to Thursday mornings", event=True), NOW + 9 * DAY))
    want = snapshot(b)
    b.close()
    a = SoulMemory(tmp_path / "n1" / "souls" / "bo", embedder=HashEmbedder())
    assert a.episodic.db.mirror.rebuilt and snapshot(a) == want
    assert any("Thursday" in it.text for it in a.recall("when is the standup", 5, at=NOW + 10 * DAY))
    a.close()


def test_an_old_owner_on_another_node_is_refused_and_writes_nothing(tmp_path: Path, pg: str) -> None:
    old = SoulMemory(tmp_path / "n1" / "souls" / "cy", embedder=HashEmbedder())
    old.write(req("a", Extraction(episode="Cy opened the quarterly plan", event=True)))
    state_old = SoulState(tmp_path / "n1" / "souls" / "cy", 1000)
    assert state_old.claim() == 1
    # a new owner on another node takes the soul over and fences every layer
    new = SoulMemory(tmp_path / "n2" / "souls" / "cy", embedder=HashEmbedder())
    state_new = SoulState(tmp_path / "n2" / "souls" / "cy", 1000)
    assert state_new.claim() == 2
    new.fence(2)
    with pytest.raises(StaleOwner):
        old.write(req("b", Extraction(episode="Cy wrote from the zombie", event=True), epoch=1))
    with pytest.raises(StaleOwner):
        state_old.save_intent({"trace": {"seq": 1}})
    new.write(req("c", Extraction(episode="Cy closed the quarterly plan", event=True), NOW + 60, epoch=2))
    texts = [e.summary for e in new.episodes()]
    assert texts == ["Cy opened the quarterly plan", "Cy closed the quarterly plan"]
    for m in (old, new):
        m.close()
    state_old.close()
    state_new.close()


def test_two_owners_racing_for_a_new_soul_one_wins(tmp_path: Path, pg: str) -> None:
    a = SoulState(tmp_path / "n1" / "souls" / "dee", 1000)
    b = SoulState(tmp_path / "n2" / "souls" / "dee", 1000)
    assert a.claim() == 1
    with pytest.raises(StaleOwner):
        b.claim()  # its cache was opened before a's claim: behind the server
    b.close()
    b = SoulState(tmp_path / "n2" / "souls" / "dee", 1000)
    assert b.claim() == 2
    a.close()
    b.close()


def _dump(url: str) -> str:
    pgbin = sorted(Path("/usr/lib/postgresql").glob("*/bin"))[-1]
    args = [str(pgbin / "pg_dump"), "--data-only", url]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    # pg_dump's \restrict / \unrestrict lines carry a random key of its own, which may hold any short string
    return "\n".join(line for line in out.splitlines() if not line.startswith(("\\restrict", "\\unrestrict")))


def test_forget_leaves_no_byte_of_the_text_on_the_server_or_the_node(tmp_path: Path, pg: str) -> None:
    d = tmp_path / "souls" / "eve"
    m = SoulMemory(d, embedder=HashEmbedder())
    fill(m, 5)
    m.write(req("x", Extraction(episode=f"Eve said {SECRET}", event=True), NOW + 100))
    hexed = SECRET.encode().hex()
    assert hexed in _dump(pg)  # the dump shows rows' cells as hex
    m.forget_where(query="vault code")
    m.close()
    dump = _dump(pg)
    assert SECRET not in dump and hexed not in dump
    for f in d.iterdir():
        assert SECRET.encode() not in f.read_bytes(), f
    assert SoulMemory(d, embedder=HashEmbedder()).stats()["episodes"] == 5


def test_a_forgotten_soul_is_gone_from_the_server_and_from_every_list(tmp_path: Path, pg: str) -> None:
    root = tmp_path / "n1"
    for sid in ("acme:one", "acme:two", "beta:one"):
        m = SoulMemory(root / "souls" / sid, embedder=HashEmbedder())
        fill(m, 3)
        m.close()
    assert soul_ids(root) == ["acme:one", "acme:two", "beta:one"] == soul_ids(tmp_path / "elsewhere")
    assert soul_ids(root, "acme:") == ["acme:one", "acme:two"]
    assert known(tmp_path / "elsewhere", "acme:two") and not known(tmp_path / "elsewhere", "acme:nobody")
    remove_soul(root, "acme:two")
    assert not known(tmp_path / "elsewhere", "acme:two")
    assert soul_ids(tmp_path / "elsewhere") == ["acme:one", "beta:one"]
    assert not stored(tmp_path / "n2" / "souls" / "acme:two" / "episodic.sqlite")
    assert "acme:two" not in _dump(pg)
    m = SoulMemory(root / "souls" / "acme:one", embedder=HashEmbedder())
    m.forget()
    m.close()
    assert SoulMemory(tmp_path / "n3" / "souls" / "acme:one", embedder=HashEmbedder()).stats()["episodes"] == 0


def test_export_and_import_cross_storages(tmp_path: Path, pg: str) -> None:
    m = SoulMemory(tmp_path / "pg" / "souls" / "fay", embedder=HashEmbedder())
    fill(m, 12)
    blob, want = m.export(), snapshot(m)
    m.close()
    use_storage("local")
    local = SoulMemory(tmp_path / "local" / "souls" / "fay", embedder=HashEmbedder())
    local.import_(blob)
    assert snapshot(local) == want
    back = local.export()
    local.close()
    use_storage(pg)
    again = SoulMemory(tmp_path / "pg2" / "souls" / "gus", embedder=HashEmbedder())
    again.import_(back)
    again.close()
    moved = SoulMemory(tmp_path / "pg3" / "souls" / "gus", embedder=HashEmbedder())
    assert snapshot(moved) == want
    moved.close()


def test_a_server_away_is_runtime_unavailable_after_bounded_retries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                    ) -> None:
    from tests.pg import _free_port
    monkeypatch.setattr(postgres_db, "RETRY_S", 1.0)
    url = f"postgresql://postgres@127.0.0.1:{_free_port()}/postgres?connect_timeout=1"
    use_storage(url)
    try:
        with pytest.raises(RuntimeUnavailable, match="unreachable"):
            SoulMemory(tmp_path / "souls" / "hal", embedder=HashEmbedder())
    finally:
        use_storage("local")
        postgres_db.close_pools()


def test_a_write_the_server_refuses_is_a_storage_error_naming_the_cause(tmp_path: Path, pg: str) -> None:
    import psycopg
    m = SoulMemory(tmp_path / "souls" / "ida", embedder=HashEmbedder())
    m.write(req("a", Extraction(episode="Ida planned the offsite", event=True)))
    name = pg.rsplit("/", 1)[1]
    with psycopg.connect(pg, autocommit=True) as con:
        con.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
    postgres_db.close_pools()  # new sessions take the setting
    try:
        with pytest.raises(StorageError, match="read-only server"):
            m.write(req("b", Extraction(episode="Ida booked the venue", event=True), NOW + 60))
        assert [e.summary for e in m.episodes()] == ["Ida planned the offsite"]  # nothing half applied
    finally:
        with psycopg.connect(pg, autocommit=True, options="-c default_transaction_read_only=off") as con:
            con.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = off')
        postgres_db.close_pools()
    m.write(req("b", Extraction(episode="Ida booked the venue", event=True), NOW + 60))
    assert len(m.episodes()) == 2
    m.close()


def test_a_sqlite_data_dir_moves_into_postgres_and_its_files_become_caches(tmp_path: Path, pg: str) -> None:
    from soul_apps.cli.main import main
    from soul_runtime.memory.pg_move import move
    use_storage("local")
    data = tmp_path / "data"
    want = {}
    for sid in ("ana", "bo"):
        m = SoulMemory(data / "souls" / sid, embedder=HashEmbedder())
        fill(m, 10)
        want[sid] = snapshot(m)
        m.close()
        st = SoulState(data / "souls" / sid, 1000)
        st.claim()
        st.close()
    (data / "runtime.json").write_text('{"storage": "local", "format": "soul-runtime/data@1"}\n')
    lines: list[str] = []
    moved = move(data, pg, progress=lines.append)
    assert (moved.souls, moved.databases, moved.skipped) == (2, 8, 0) and moved.rows > 40
    assert lines[0].startswith("moving 2 souls") and lines[-1].startswith("moved 2 souls")
    assert main(["storage", "migrate", "--to", pg, "--data-dir", str(data), "--json"]) == 0  # again: all there
    use_storage(pg)
    for sid in ("ana", "bo"):
        here = SoulMemory(data / "souls" / sid, embedder=HashEmbedder())  # the moved files serve as caches
        assert not here.episodic.db.mirror.rebuilt and snapshot(here) == want[sid]
        here.close()
        there = SoulMemory(tmp_path / "node2" / "souls" / sid, embedder=HashEmbedder())  # from the rows alone
        assert there.episodic.db.mirror.rebuilt and snapshot(there) == want[sid]
        there.close()
        assert SoulState(tmp_path / "node2" / "souls" / sid, 1000).claim() == 2
    assert '"storage": "postgresql://' in (data / "runtime.json").read_text()


def test_pg_dump_and_pg_restore_bring_every_soul_back(tmp_path: Path, pg: str) -> None:
    """The backup docs/deploying.md describes: pg_dump -Fc, then pg_restore into a new database; nodes with no
    cache rebuild every soul from it."""
    from tests.pg import fresh_database
    m = SoulMemory(tmp_path / "n1" / "souls" / "cat", embedder=HashEmbedder())
    fill(m, 15)
    want = snapshot(m)
    m.close()
    pgbin = sorted(Path("/usr/lib/postgresql").glob("*/bin"))[-1]
    dump = tmp_path / "souls.dump"
    subprocess.run([str(pgbin / "pg_dump"), "-Fc", "-f", str(dump), pg], check=True)
    restored = fresh_database("restored")
    subprocess.run([str(pgbin / "pg_restore"), "--no-owner", "-d", restored, str(dump)], check=True)
    use_storage(restored)
    back = SoulMemory(tmp_path / "n2" / "souls" / "cat", embedder=HashEmbedder())
    assert back.episodic.db.mirror.rebuilt and snapshot(back) == want
    back.close()
    use_storage(pg)


def test_the_service_ledger_on_postgres_is_shared_by_replicas_and_keeps_digests(tmp_path: Path, pg: str) -> None:
    from soul_apps.service.idempotency import Ledger
    led, other = Ledger(tmp_path / "node1", pg), Ledger(tmp_path / "node2", pg)  # two replicas, two nodes
    key = "idempotency-key-7731"
    assert led.body_for("acme:maya", key) is None
    assert led.record("acme:maya", key, "B1") == "B1"
    assert other.record("acme:maya", key, "B2") == "B1"  # the first body stays, whichever replica saw it
    assert other.body_for("acme:maya", key) == "B1" and other.body_for("beta:maya", key) is None
    led.record("acme:zed", key, "B3")
    led.record("beta:maya", key, "B4")
    dump = _dump(pg)
    assert key not in dump and "acme:maya" in dump  # the key's digest, never the key
    assert led.forget_soul("acme:maya") == 1 and other.body_for("acme:maya", key) is None
    assert other.forget_prefix("acme:") == 1 and led.body_for("beta:maya", key) == "B4"
    assert not (tmp_path / "node1" / "service").exists()  # nothing on the nodes' disks


def test_tenants_on_postgres_are_one_table_for_every_replica(tmp_path: Path, pg: str) -> None:
    from soul_apps.service.tenants import TenantTable
    a, b = TenantTable(tmp_path / "node1", pg), TenantTable(tmp_path / "node2", pg)
    key = a.add("acme")
    assert b.authenticate(key) == "acme" and [t.name for t in b.tenants()] == ["acme"]
    b.add("beta")
    assert [t.name for t in a.tenants()] == ["acme", "beta"]
    a.revoke("acme")
    assert b.authenticate(key) is None  # at once, on the other replica
    assert key not in _dump(pg)  # its hash only
    b.remove("beta")
    assert [t.name for t in a.tenants()] == ["acme"]
    assert not (tmp_path / "node1").exists() and not (tmp_path / "node2").exists()


def test_a_rebuild_says_what_it_rebuilt_and_how_long_it_took(tmp_path: Path, pg: str,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    m = SoulMemory(tmp_path / "n1" / "souls" / "jo", embedder=HashEmbedder())
    fill(m, 4)
    m.close()
    with caplog.at_level("INFO", logger="soul_runtime.storage"):
        SoulMemory(tmp_path / "n2" / "souls" / "jo", embedder=HashEmbedder()).close()
    said = [r.getMessage() for r in caplog.records if r.name == "soul_runtime.storage"]
    assert any(s.startswith("rebuilding") and "episodic.sqlite" in s and "rows" in s for s in said), said
    assert any(s.startswith("rebuilt") and "episodic.sqlite" in s and s.endswith(" s") for s in said), said


def _server_state_keys(url: str, soul: str) -> tuple[list[str], list[str]]:
    """The soul database's state keys and traces' turn ids on the server (its rows' cells read back)."""
    import msgpack
    import psycopg
    with psycopg.connect(url) as con:
        cells = [(t, msgpack.unpackb(c, raw=False)) for t, c in con.execute(
            "SELECT tbl, cells FROM soul_rows WHERE soul = %s AND db = 'soul' AND tbl IN ('state', 'traces')",
            (soul,))]
    return sorted(c["key"] for t, c in cells if t == "state"), sorted(c["turn_id"] for t, c in cells if t == "traces")


def test_a_turns_commit_goes_with_the_next_push_and_a_crash_before_it_finishes_the_turn(tmp_path: Path,
                                                                                       pg: str) -> None:
    """A turn that wrote memory is acknowledged once its intent (with its writes) is on the server: its commit
    goes with the soul's next push. A node lost before that: the soul opened elsewhere finishes the turn from
    the intent — the same reply for the same request, its writes once."""
    from soul_runtime.loop.soul import Soul
    from soul_runtime.models.offline import OfflineModel

    def soul(node: str) -> tuple[SoulMemory, Soul]:
        d = tmp_path / node / "souls" / "eli"
        m = SoulMemory(d, embedder=HashEmbedder())
        return m, Soul("eli", d, memory=m, model=OfflineModel(), clock=lambda: NOW)

    m, s = soul("n1")
    first = s.turn("I moved the standup to Thursday mornings.", user="eli", request_id="r1")
    assert first.writes  # it wrote memory: its commit waits for the next push
    keys, traces = _server_state_keys(pg, "eli")
    assert "intent" in keys and first.turn_id not in traces
    second = s.turn("My sister Ada lives in Porto.", user="eli", request_id="r2")
    keys, traces = _server_state_keys(pg, "eli")
    assert first.turn_id in traces and second.turn_id not in traces  # the first commit went with the second intent
    episodes = sorted(e.summary for e in m.episodes())
    # node 1 is lost with its disk (nothing closed): node 2 finishes the second turn from its intent
    shutil.rmtree(tmp_path / "n1")
    m2, s2 = soul("n2")
    again = s2.turn("My sister Ada lives in Porto.", user="eli", request_id="r2")
    assert (again.turn_id, again.reply, again.seq) == (second.turn_id, second.reply, second.seq)
    assert sorted(e.summary for e in m2.episodes()) == episodes  # written once
    assert [t.turn_id for t in s2.state.last(5)] == [first.turn_id, second.turn_id]
    s2.close()
    m2.close()
    keys, traces = _server_state_keys(pg, "eli")  # closing pushed the recovered turn's commit
    assert "intent" not in keys and traces == sorted([first.turn_id, second.turn_id])


def test_usage_books_add_up_across_nodes_and_a_restarted_host_goes_on(tmp_path: Path, backend: str) -> None:
    """Each counting process's usage book is kept where the storage keeps records: on a PostgreSQL server every
    node's books add up (two data dirs, as two nodes' caches, read the same sums); in a data dir, its files."""
    from actors.tenant_usage import read_usage, usage_book

    storage = "" if backend == "local" else backend
    day = 86400.0 * 20000
    clock = [day + 10]
    node_a, node_b = tmp_path / "a", tmp_path / "b"
    a = usage_book(node_a, storage, "soul-host-0", clock=lambda: clock[0])
    b = usage_book(node_b if storage else node_a, storage, "service-b-1", clock=lambda: clock[0])
    a.add("acme", "turns")
    a.add("acme", "tokens", 100)
    b.add("acme", "throttled")
    b.add("beta", "queued_s", 0.5)
    assert a.flush() and b.flush() and not a.flush()
    for reader in ([node_a, node_b] if storage else [node_a]):
        got = read_usage(reader, day + 20, storage)
        assert got["acme"] == {"turns": 1, "tokens": 100, "throttled": 1, "queued_s": 0, "tokens_today": 100}
        assert got["beta"]["queued_s"] == 0.5
    again = usage_book(node_b if storage else node_a, storage, "soul-host-0", clock=lambda: clock[0])
    assert again.counts["acme"]["tokens"] == 100  # restarted, on another node when the books are on the server
    again.add("acme", "tokens", 5)
    assert again.flush() and read_usage(node_a, day + 20, storage)["acme"]["tokens"] == 105
    if storage:
        assert not (node_a / "service").exists() and not (node_b / "service").exists()  # no file written
