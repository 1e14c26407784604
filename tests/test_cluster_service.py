"""Every SQLite database follows the data dir's ``storage``: the idempotency ledger on its own (no Ray), and every
database file a real ``soul serve`` on a ``storage="shared"`` data dir leaves behind (the runtime's per-soul
databases and the service's ledger), each one's journal read from its file header."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from soul_apps.service.idempotency import LEDGER_FILE, Ledger
from soul_runtime.errors import ConfigError
from soul_runtime.storage_modes import JOURNAL, journal_of, recorded_storage
from tests.fakes import stop_serve, wait_healthy

SOUL = shutil.which("soul")


def _sqlite_files(root: Path) -> list[Path]:
    """Every file under ``root`` that is a SQLite database, found by its header (not by its name)."""
    return sorted(p for p in root.rglob("*") if p.is_file() and journal_of(p) is not None)


def _sidecars(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.name.endswith(("-wal", "-shm", "-journal")))


# ---- the ledger on its own ----------------------------------------------------------------------

def test_the_ledger_journal_follows_storage(tmp_path: Path) -> None:
    for storage, journal in (("local", "wal"), ("shared", "rollback")):
        d = tmp_path / storage
        led = Ledger(d, storage)
        assert not (d / LEDGER_FILE).exists()  # opened at first use
        assert led.record("s1", "k", "body") == "body" and led.body_for("s1", "k") == "body"
        assert journal_of(d / LEDGER_FILE) == journal
        assert bool(_sidecars(d)) == (storage == "local")  # no -wal or -shm beside a shared ledger, ever
        led.close()


def test_the_ledger_reads_the_data_dirs_storage_and_converts_an_old_wal_ledger(tmp_path: Path) -> None:
    old = Ledger(tmp_path)  # no runtime.json yet: local
    old.record("s1", "k", "body")
    old.close()
    assert journal_of(tmp_path / LEDGER_FILE) == "wal"
    (tmp_path / "runtime.json").write_text(json.dumps({"storage": "shared"}))
    assert recorded_storage(tmp_path) == "shared"
    led = Ledger(tmp_path)
    assert led.body_for("s1", "k") == "body"  # the keys kept
    assert journal_of(tmp_path / LEDGER_FILE) == "rollback" and _sidecars(tmp_path) == []
    led.close()
    (tmp_path / "runtime.json").write_text(json.dumps({"storage": "nfs"}))
    with pytest.raises(ConfigError, match="storage must be one of"):
        Ledger(tmp_path).body_for("s1", "k")
    with pytest.raises(ConfigError):
        Ledger(tmp_path, "nfs")


def test_one_journal_mapping() -> None:
    """The souls' databases (memory.sqlite_db) and the ledger name the same journal for each storage: one function
    over one mapping (a PostgreSQL storage's node-local caches use WAL)."""
    from soul_apps.service import idempotency
    from soul_runtime.memory import sqlite_db
    from soul_runtime.storage_modes import journal_for
    assert sqlite_db.journal_for is journal_for is idempotency.journal_for  # one mapping
    assert JOURNAL == {"local": "wal", "shared": "delete"}
    assert [journal_for(k) for k in ("local", "shared", "postgresql://u@h/db")] == ["wal", "delete", "wal"]


# ---- a real `soul serve` on a shared-storage data dir ------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _soul(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    assert SOUL, "the `soul` console script is not installed: run `pip install -e .`"
    p = subprocess.run([SOUL, *args], env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    if check and p.returncode != 0:
        raise AssertionError(f"soul {' '.join(args)} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


@pytest.fixture(scope="module")
def shared_server() -> Iterator[dict[str, Any]]:
    base = Path(tempfile.mkdtemp(prefix="svs", dir="/tmp"))
    data = base / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "SOUL_"))}
    env |= {"SOUL_DATA_DIR": str(data), "SOUL_STORAGE": "shared", "SOUL_EMBEDDER": "fast"}
    key = json.loads(_soul(env, "tenants", "add", "acme", "--json").stdout)["key"]
    port = _free_port()
    log = open(base / "serve.log", "w")  # noqa: SIM115 - closed at teardown
    proc = subprocess.Popen([SOUL, "serve", "--port", str(port), "--ingress", "proxy"], env=env, stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(proc, url, base / "serve.log")
    try:
        yield {"url": url, "key": key, "env": env, "data": data, "base": base}
    finally:
        stop_serve(proc, log, lambda: _soul(env, "down", check=False))
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.ray
def test_every_database_of_a_shared_runtime_and_its_service_has_a_rollback_journal(
        shared_server: dict[str, Any]) -> None:
    import httpx
    data: Path = shared_server["data"]
    with httpx.Client(base_url=shared_server["url"], timeout=120,
                      headers={"Authorization": f"Bearer {shared_server['key']}"}) as c:
        for sid in ("maya", "omar"):
            r = c.post(f"/v1/souls/{sid}/turns", json={"text": "The production database for Tendril is Postgres 15.",
                                                       "user": "maya"}, headers={"Idempotency-Key": f"k-{sid}"})
            assert r.status_code == 200, r.text
            r = c.post(f"/v1/souls/{sid}/observe", json={"messages": [
                {"speaker": "maya", "text": "We deploy with Argo CD; to deploy: merge, tag, sync.", "id": "m1"}]})
            assert r.status_code == 200, r.text
    assert recorded_storage(data) == "shared"
    files = _sqlite_files(data)
    rel = {str(p.relative_to(data)) for p in files}
    print("\n".join(f"{p.relative_to(data)}: {journal_of(p)}" for p in files))
    assert str(LEDGER_FILE) in rel  # the service's ledger ...
    for sid in ("maya", "omar"):  # ... and each soul's state and the layer databases its turns wrote
        assert {f"souls/acme:{sid}/{n}.sqlite" for n in ("soul", "episodic", "semantic")} <= rel, rel
    assert {journal_of(p) for p in files} == {"rollback"}, {str(p): journal_of(p) for p in files}
    assert [p for p in _sidecars(data) if not p.name.endswith("-journal")] == []  # no WAL, no shared memory


@pytest.mark.ray
def test_a_body_over_the_limit_is_413_naming_it(shared_server: dict[str, Any]) -> None:
    """Through the real service (its ingress, Serve, the replica): a body larger than the runtime's longest
    message could need is refused with 413 and the limit, never a 500; the service goes on serving."""
    import httpx

    from soul_apps.service.body_limit import max_body_bytes
    from soul_runtime.config import TurnConfig
    chars = TurnConfig().max_text_chars
    limit = max_body_bytes(chars)
    body = b'{"text": "' + b"x" * (limit + 1) + b'"}'
    with httpx.Client(base_url=shared_server["url"], timeout=120,
                      headers={"Authorization": f"Bearer {shared_server['key']}"}) as c:
        r = c.post("/v1/souls/maya/turns", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 413, r.text[:500]
        err = r.json()["error"]
        assert f"limit of {limit} bytes" in err["message"] and f"{chars} characters" in err["message"]
        r = c.post("/v1/souls/maya/turns", json={"text": "Still here?", "user": "maya"})
        assert r.status_code == 200, r.text
