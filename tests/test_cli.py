"""The installed ``soul`` console script, run in subprocesses.

One Ray head (``soul cluster up``) serves the cluster tests; the demo runs on the
embedded default (a local Ray of its own). Needs ``pip install -e .`` (CI does it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from soul_runtime.loop.ingest import load, parse_locomo_date
from tests.audit_labels import CONTEXT, LABELLED
from tests.fakes import disk_hits

pytestmark = pytest.mark.ray

FIXTURES = Path(__file__).parent / "fixtures"
SOUL = shutil.which("soul")
TIMINGS: dict[str, float] = {}

CHAT = [
    {"speaker": "Maya", "text": "I'm Maya, a senior SRE on the platform team.", "id": "c1", "at": "2026-03-02T09:00:00Z"},
    {"speaker": "Maya", "text": "The production database for Tendril is Postgres 15.", "id": "c2",
     "at": "2026-03-02T09:01:00Z"},
    {"speaker": "Maya", "text": "Correct.", "id": "c3", "at": "2026-03-02T09:02:00Z"},
    {"speaker": "Maya", "text": "We rolled back the cache deploy after the latency spike this morning.", "id": "c4",
     "at": "2026-03-02T09:03:00Z"},
    {"speaker": "Maya", "text": "Actually, the Tendril production database is Postgres 16 \u2014 we upgraded it "
     "last night.", "id": "c5", "at": "2026-03-03T10:00:00Z"},
]
AT = "2026-03-04T12:00:00Z"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "SOUL_"))}
    env.update(extra)
    return env


def soul(*args: str, env: dict[str, str] | None = None, timeout: float = 120, stdin: str | None = None,
         check: bool = True, label: str = "") -> subprocess.CompletedProcess[str]:
    assert SOUL, "the `soul` console script is not installed: run `pip install -e .`"
    t0 = time.perf_counter()
    p = subprocess.run([SOUL, *args], env=env or _env(), capture_output=True, text=True, timeout=timeout,
                       input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL)
    retried = " (session server retried)" if "failed to start (attempt" in p.stderr else ""
    TIMINGS[(label or " ".join(args[:2])) + retried] = round(time.perf_counter() - t0, 1)
    if check and p.returncode != 0:
        raise AssertionError(f"soul {' '.join(args)} exited {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def souls_at_once(*calls: tuple[str, ...], env: dict[str, str], timeout: float = 120, failing: tuple[int, ...] = ()
                  ) -> list[subprocess.CompletedProcess[str]]:
    """Several independent ``soul`` commands run side by side (each waits mostly for its Ray Client session);
    each must succeed but those at the positions in ``failing``. Their results in the order given."""
    assert SOUL, "the `soul` console script is not installed: run `pip install -e .`"
    t0 = time.perf_counter()
    procs = [subprocess.Popen([SOUL, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              stdin=subprocess.DEVNULL) for args in calls]
    out = []
    for args, proc in zip(calls, procs, strict=True):
        stdout, stderr = proc.communicate(timeout=timeout)
        done = subprocess.CompletedProcess([SOUL, *args], proc.returncode, stdout, stderr)
        if (proc.returncode != 0) != (len(out) in failing):
            raise AssertionError(f"soul {' '.join(args)} exited {proc.returncode}\nstdout:\n{stdout}\nstderr:\n{stderr}")
        out.append(done)
    TIMINGS[" + ".join(" ".join(a[:2]) for a in calls)] = round(time.perf_counter() - t0, 1)
    return out


def one_line_error(p: subprocess.CompletedProcess[str]) -> str:
    assert p.returncode != 0
    assert "Traceback" not in p.stderr, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("soul: error:")]
    assert len(errors) == 1, p.stderr
    return errors[0]


# ---- no Ray needed ---------------------------------------------------------------------------

def test_help_is_useful() -> None:
    top = soul("--help").stdout
    for cmd in ("demo", "chat", "observe", "recall", "facts", "history", "procedures", "episodes", "trace", "stats",
                "turn", "audit-writes", "export", "import", "forget", "cluster"):
        assert cmd in top
    sub = soul("recall", "--help").stdout
    assert "--store" in sub and "--address" in sub and "--json" in sub and "-k" in sub
    assert "--soul" in soul("import", "--help").stdout


def test_audit_writes_cli(tmp_path: Path) -> None:
    out = tmp_path / "fixture.json"
    p = soul("audit-writes", str(FIXTURES / "audit_transcript.jsonl"), "--json", "--save-fixture", str(out))
    report = json.loads(p.stdout)
    assert report["tally"] == {"procedural": 3, "semantic": 4, "episodic": 7, "nothing": 5}
    assert report["unbalanced"] is False
    saved = {e["id"]: (e["expected"], sorted(e.get("labels", ()))) for e in json.loads(out.read_text())}
    assert saved == {**{i: (primary, sorted(labels)) for i, (primary, labels, _) in LABELLED.items()},
                     **{i: ("context", []) for i in CONTEXT}}  # the hand labels
    strict = soul("audit-writes", str(FIXTURES / "audit_transcript.jsonl"), "--threshold", "0.3", "--strict",
                  check=False)
    assert strict.returncode == 1 and "UNBALANCED" in strict.stdout


def test_errors_are_one_line(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    err = one_line_error(p := soul("facts", "nobody", "--data-dir", data, check=False))
    assert p.returncode == 2 and err == f"soul: error: unknown soul 'nobody' in {data}"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"speaker": "Maya", "text": "hi", "id": "1"}\nthis is not json\n')
    assert ":2:" in one_line_error(soul("observe", "x", str(bad), "--data-dir", data, check=False))
    assert "export" in one_line_error(soul("import", str(bad), "--soul", "x", "--data-dir", data, check=False))
    p = soul("stats", "--address", "ray://127.0.0.1:1", "--data-dir", data, check=False, label="unreachable",
             env=_env(SOUL_CONNECT_WAIT_S="1"))  # how long a refused port is tried again (default 30 s)
    assert "127.0.0.1:1" in one_line_error(p) and "SOUL_CONNECT_WAIT_S" in one_line_error(p)
    assert p.returncode == 3


def test_ingest_locomo(tmp_path: Path) -> None:
    assert parse_locomo_date("1:56 pm on 8 May, 2023") == 1683554160.0
    assert parse_locomo_date("12:05 am on 1 Jan, 2024") == 1704067500.0
    sample = {"sample_id": "conv-1", "conversation": {
        "speaker_a": "Caroline", "speaker_b": "Melanie",
        "session_2": [{"speaker": "Melanie", "dia_id": "D2:1", "text": "I ran a charity race."}],
        "session_2_date_time": "1:14 pm on 25 May, 2023",
        "session_1": [{"speaker": "Caroline", "dia_id": "D1:1", "text": "I went to a support group."},
                      {"speaker": "Melanie", "dia_id": "D1:2", "text": "That's great!", "blip_caption": "a dog"}],
        "session_1_date_time": "1:56 pm on 8 May, 2023"},
        "qa": [{"question": "When did Caroline go?", "answer": "7 May 2023", "evidence": ["D1:1"], "category": 2},
               {"question": "Trick?", "adversarial_answer": "no", "evidence": [], "category": 5}]}
    one = tmp_path / "one.json"
    one.write_text(json.dumps(sample))
    [conv] = load(one)
    assert [b.session for b in conv.batches] == ["session_1", "session_2"]
    assert [m["id"] for m in conv.batches[0].messages] == ["D1:1", "D1:2"]
    assert conv.batches[0].at == 1683554160.0 and "a dog" in conv.batches[0].messages[1]["text"]
    assert conv.qa[0] == {"question": "When did Caroline go?", "answer": "7 May 2023", "evidence": ["D1:1"],
                          "category": 2}
    assert conv.qa[1]["answer"] == "no" and conv.speakers == ("Caroline", "Melanie")
    two = tmp_path / "two.json"
    two.write_text(json.dumps([sample, {**sample, "sample_id": "conv-2"}]))
    convs = load(two, "locomo")
    assert [c.batches[0].messages[0]["id"] for c in convs] == ["conv-1:D1:1", "conv-2:D1:1"]
    jl = tmp_path / "c.jsonl"
    jl.write_text("\n".join(json.dumps(m) for m in CHAT))
    [c] = load(jl)
    assert [len(b.messages) for b in c.batches] == [4, 1]  # split at the >4 h gap


def test_demo_embedded() -> None:
    """The demo on the default address: a local Ray started for the call, the offline model."""
    p = soul("demo", env=_env(), timeout=120, label="demo")
    out = p.stdout
    assert "OFFLINE model" in out and "rule-based" in out
    assert "tendril:production_database" in out and "Postgres 15" in out and "Postgres 16" in out
    assert "Postgres 15 [atlas/4/user, atlas/5/user] → Postgres 16 [atlas/10/user]" in " ".join(out.split())
    assert "procedure draft postmortem: v1 active" in out
    assert "data dir: " in out
    # piped, its progress is plain lines stamped with the command's own clock: the Ray start-up is one of them,
    # and no two follow each other (nor the start) by more than 10 s of that clock
    stamps = [float(m[1]) for m in re.finditer(r"^\[\s*(\d+\.\d) s\] ", p.stderr, re.M)]
    assert "Starting a local Ray and the soul actors" in p.stderr and "playing the scenario: done" in p.stderr
    assert len(stamps) >= 3 and stamps == sorted(stamps), p.stderr
    gaps = [b - a for a, b in zip([0.0, *stamps], stamps, strict=False)]
    assert max(gaps) <= 10.0, p.stderr


def test_bench_scale_small_run(tmp_path: Path) -> None:
    """``soul bench scale`` end to end on its own embedded Ray: what it reports adds up."""
    out, ray_tmp = tmp_path / "scale.json", tempfile.mkdtemp(prefix="sb", dir="/tmp")  # short: Ray's sockets
    try:
        p = soul("bench", "scale", "--souls", "24", "--active", "1,8", "--turns", "1", "--embedder", "fast",
                 "--json", str(out), env=_env(RAY_TMPDIR=ray_tmp), timeout=240, label="bench scale")
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert re.search(r"^.+: 24/24$", p.stdout, re.M), p.stdout  # piped: its progress as plain lines
    res = json.loads(out.read_text())
    assert res["souls"] == 24 and res["activations"] >= 24 and res["first_turns_per_s"] > 0
    turns = [ph for ph in res["phases"] if ph["phase"] == "turns"]
    assert [ph["active"] for ph in turns] == [1, 8] and all(ph["turns"] == 24 for ph in turns)
    for ph in turns:  # every turn reached a host in some call, and a turn is at least one recall or write
        cpu, calls = ph["cpu_ms_per_turn"], ph["calls_per_turn"]
        assert cpu["total"] == pytest.approx(sum(v for k, v in cpu.items() if k != "total"), abs=0.05)
        assert cpu["SoulHost"] > 0 and cpu["LayerShard"] > 0
        assert 0 < calls["run_batch"] <= 1
    assert turns[0]["calls_per_turn"]["run_batch"] == 1  # one in flight: a call per turn
    for ph in turns:  # on one machine the turns and store calls go over the local channels
        for method, n in ph["calls_per_turn"].items():
            assert ph["channel_calls_per_turn"][method] >= 0.9 * n
    assert res["turns_per_host_call"] >= 1 and res["max_open_fds"] > 0 and res["cluster_rss_bytes"] > 0


# ---- against one Ray head --------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, Any]]:
    base = Path(tempfile.mkdtemp(prefix="sc", dir="/tmp"))
    state = base / "st"
    up = soul("cluster", "up", "--state-dir", str(state), "--num-cpus", "2", "--json", timeout=120, label="cluster up")
    info = json.loads(up.stdout)
    assert info["running"] and info["client_address"].startswith("ray://")
    # a cluster head listens on the node's address (so workers and clients can join), and says so
    node = info["gcs_address"].rpartition(":")[0]
    if node != "127.0.0.1":  # a machine with a network address
        assert not info["loopback_only"] and {node, "every interface"} & set(info["listening"]), info["text"]
    env = _env(**info["client_env"], SOUL_ADDRESS=info["client_address"], SOUL_DATA_DIR=str(base / "data"))
    c = {"base": base, "state": state, "info": info, "env": env}
    try:
        yield c
    finally:
        if not c.get("down"):
            soul("cluster", "down", "--state-dir", str(state), check=False)
        shutil.rmtree(base, ignore_errors=True)
        print("\nCLI timings (s):", json.dumps(TIMINGS))


def test_observe_and_read(cluster: dict[str, Any]) -> None:
    env, base = cluster["env"], cluster["base"]
    chat = base / "chat.jsonl"
    chat.write_text("\n".join(json.dumps(m) for m in CHAT) + "\n")
    obs = json.loads(soul("observe", "maya", str(chat), "--json", env=env).stdout)
    assert obs["messages"] == 5 and obs["batches"] == 2 and obs["writes"]["semantic"] >= 1

    recalled, listed, history, traced = souls_at_once(
        ("recall", "maya", "tendril production database", "-k", "5", "--at", AT, "--store", "semantic", "--store",
         "episodic", "--json"), ("facts", "maya", "--json"),
        ("history", "maya", "tendril", "production_database", "--json"), ("trace", "maya", "--last", "5", "--json"),
        env=env)
    items = json.loads(recalled.stdout)
    assert items and items[0]["id"] == "tendril:production_database" and "Postgres 16" in items[0]["text"]
    assert {"store", "id", "score", "sources", "text"} <= set(items[0])
    assert {i["store"] for i in items} <= {"semantic", "episodic"}

    facts = json.loads(listed.stdout)
    assert any(f["entity"] == "tendril" and f["value"] == "Postgres 16" for f in facts)
    hist = json.loads(history.stdout)
    assert [h["value"] for h in hist] == ["Postgres 15", "Postgres 16"]
    assert hist[0]["sources"] == ["c2", "c3"] and hist[1]["sources"] == ["c5"]

    traces = json.loads(traced.stdout)
    assert [t["kind"] for t in traces] == ["observe", "observe"] and traces[-1]["writes"]

    turn = json.loads(soul("turn", "maya", "Which Postgres version does Tendril run in production?", "--user",
                           "Maya", "--at", AT, "--json", env=env).stdout)
    assert "Postgres 16" in turn["reply"] and turn["offline"] is True
    assert any(r["id"] == "tendril:production_database" for r in turn["recalled"])


def test_errors_against_cluster(cluster: dict[str, Any]) -> None:
    env = cluster["env"]
    p = soul("history", "maya", "tendril", "no_such_attribute", env=env, check=False, label="history unknown")
    assert "no fact" in one_line_error(p) and p.returncode == 2
    no_token = {k: v for k, v in env.items() if not k.startswith("RAY_AUTH")}
    p = soul("facts", "maya", env=no_token, check=False, timeout=60, label="no token")
    assert "RAY_AUTH_MODE=token" in one_line_error(p)


def test_export_import_roundtrip(cluster: dict[str, Any]) -> None:
    env, base = cluster["env"], cluster["base"]
    blob = base / "maya.soul"
    soul("export", "maya", str(blob), env=env)
    assert stat.S_IMODE(blob.stat().st_mode) == 0o600  # an export is the soul's whole memory
    data2 = str(base / "data2")
    # one Ray namespace serves one data dir: a fresh data dir needs its own namespace
    other = ["--data-dir", data2, "--namespace", "copy-ns"]
    soul("import", str(blob), "--soul", "copy", *other, env=env)
    q = ("tendril postgres cache", "-k", "10", "--at", AT, "--json")
    blob2 = base / "copy.soul"
    original, copied, _, again = souls_at_once(("recall", "maya", *q), ("recall", "copy", *q, *other),
                                               ("export", "copy", str(blob2), *other),
                                               ("import", str(blob), "--soul", "copy", *other), env=env,
                                               failing=(3,))
    assert "already exists" in one_line_error(again)
    assert json.loads(copied.stdout) == json.loads(original.stdout) and len(json.loads(original.stdout)) >= 3
    assert blob2.read_bytes() == blob.read_bytes()


def test_chat_piped(cluster: dict[str, Any]) -> None:
    script = "/facts\nThe staging database for Tendril is Postgres 14.\n/recall staging database\n/trace 2\n/help\n/quit\n"
    p = soul("chat", "maya", "--user", "Maya", env=cluster["env"], stdin=script, timeout=120)
    assert "Postgres 16" in p.stdout  # /facts
    assert "[offline model]" in p.stdout and "staging database" in p.stdout
    assert "/recall QUERY" in p.stdout  # /help
    assert "turn traces" in p.stdout  # /trace
    assert "Traceback" not in p.stderr


def test_forget_leaves_nothing_on_disk(cluster: dict[str, Any]) -> None:
    env, base = cluster["env"], cluster["base"]
    soul_dir = base / "data" / "souls" / "maya"
    assert disk_hits(soul_dir, "Postgres 15") and disk_hits(soul_dir, "Postgres 16")
    one = json.loads(soul("forget", "maya", "--query", "postgres 15", "--json", env=env).stdout)
    assert "tendril:production_database" in one["deleted"]
    assert disk_hits(soul_dir, "Postgres 15") == {}
    assert "Postgres 16" in soul("facts", "maya", env=env).stdout  # only the past value went; the current stays
    everything = json.loads(soul("forget", "maya", "--json", env=env).stdout)
    assert everything["traces"] >= 1 and disk_hits(soul_dir, "postgres", "tendril") == {}
    assert json.loads(soul("stats", "maya", "--json", env=env).stdout)["episodes"] == 0


def test_cluster_down(cluster: dict[str, Any]) -> None:
    state = str(cluster["state"])
    status = json.loads(soul("cluster", "status", "--state-dir", state, "--json").stdout)
    pids = status["pids_alive"]
    assert status["running"] and pids
    soul("cluster", "down", "--state-dir", state)
    cluster["down"] = True
    deadline = time.time() + 15
    while time.time() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.2)
    alive = [p for p in pids if Path(f"/proc/{p}").exists()
             and Path(f"/proc/{p}/stat").read_text().split(") ")[1][0] not in "ZX"]
    assert alive == []
    assert soul("cluster", "status", "--state-dir", state, check=False).returncode == 1


# ---- the local runtime of the embedded default -------------------------------------------------

def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:][:1] not in "ZX"


def test_local_runtime_stays_up_is_replaced_when_dead_and_goes_down() -> None:
    """No --address: the first command starts a head for the data dir, the next ones attach to that same head;
    a head whose GCS died is replaced (the memory is on disk); `soul down` leaves no process behind."""
    from soul_apps.cluster import local_cluster, local_runtime
    data = Path(tempfile.mkdtemp(prefix="sl", dir="/tmp"))
    env = _env(SOUL_DATA_DIR=str(data))
    record = data / "cluster" / "head.json"
    try:
        soul("turn", "rt", "Our billing service is written in Go.", env=env, timeout=300, label="local: first turn")
        first = json.loads(record.read_text())
        assert first["gcs_address"].startswith("127.0.0.1:")
        assert record.stat().st_mode & 0o777 == 0o600
        assert first["token_path"] == str(data / "cluster" / "auth_token")  # a token of its own
        assert (data / "cluster" / "auth_token").stat().st_mode & 0o777 == 0o600
        soul("turn", "rt", "Yes.", env=env, label="local: attached turn")
        facts = json.loads(soul("facts", "rt", "--json", env=env, label="local: attached facts").stdout)
        assert [(f["entity"], f["value"]) for f in facts] == [("billing service", "Go")]
        assert json.loads(record.read_text())["session_id"] == first["session_id"]  # the same head, attached to

        status = local_cluster.head_status(data / "cluster")
        assert status is not None
        gcs = [p for p in status["pids_alive"] if "gcs_server" in Path(f"/proc/{p}/cmdline").read_text(errors="replace")]
        assert gcs
        os.kill(gcs[0], 9)  # the head crashes
        deadline = time.time() + 15
        while time.time() < deadline and _alive(gcs[0]):
            time.sleep(0.2)
        facts = json.loads(soul("facts", "rt", "--json", env=env, timeout=300, label="local: replaced").stdout)
        assert [(f["entity"], f["value"]) for f in facts] == [("billing service", "Go")]
        second = json.loads(record.read_text())
        assert second["session_id"] != first["session_id"]
        assert not any(_alive(p) for p in first["pids"])  # the dead head's leftovers were stopped

        pids = local_cluster.head_status(data / "cluster")["pids_alive"]
        assert "stopped" in soul("down", env=env, label="local: down").stdout
        deadline = time.time() + 15
        while time.time() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.2)
        assert [p for p in pids if _alive(p)] == [] and not record.exists()
        assert "no Ray head" in soul("down", env=env).stdout
    finally:
        local_runtime.stop(str(data))
        shutil.rmtree(data, ignore_errors=True)
