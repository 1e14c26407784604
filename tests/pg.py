"""A real PostgreSQL server for the tests: ``SOUL_TEST_PG_URL`` (.ci/run starts a throwaway cluster and sets it),
else a throwaway cluster started here with Debian's binaries (stopped by pid at exit). Each caller gets a
database of its own."""

from __future__ import annotations

import atexit
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

_started: list[str] = []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_postgres(args: list[str]) -> list[str]:
    """Run as the ``postgres`` user when root (the server refuses to run as root)."""
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


def start_cluster() -> tuple[str, Path]:
    """initdb + pg_ctl start in a temp dir, listening on a free loopback port; returns (URL, data dir)."""
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    if not bins:
        raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql)")
    pgbin = bins[-1]
    d = Path(tempfile.mkdtemp(prefix="soul-pg-"))
    if os.geteuid() == 0:
        shutil.chown(d, "postgres")
    port = _free_port()
    subprocess.run(_as_postgres([f"{pgbin}/initdb", "-D", str(d / "data"), "-A", "trust", "-U", "postgres"]),
                   check=True, capture_output=True)
    subprocess.run(_as_postgres([f"{pgbin}/pg_ctl", "-D", str(d / "data"), "-o",
                                 f"-p {port} -k {d} -c listen_addresses=127.0.0.1 -c fsync=on",
                                 "-l", str(d / "log"), "start", "-w"]), check=True, capture_output=True)
    return f"postgresql://postgres@127.0.0.1:{port}/postgres", d


def _stop(d: Path) -> None:
    pidfile = d / "data" / "postmaster.pid"
    try:
        pid = int(pidfile.read_text().split()[0])
        os.kill(pid, signal.SIGINT)  # fast shutdown
        for _ in range(100):
            os.kill(pid, 0)
            time.sleep(0.05)
    except (OSError, ValueError):
        pass
    shutil.rmtree(d, ignore_errors=True)


def server_url() -> str:
    """The URL of the server the tests use (started once per process if none is given)."""
    url = os.environ.get("SOUL_TEST_PG_URL")
    if url:
        return url
    if not _started:
        url, d = start_cluster()
        atexit.register(_stop, d)
        _started.append(url)
        os.environ["SOUL_TEST_PG_URL"] = url  # subprocesses (soul serve, Ray workers) use the same server
    return _started[0]


def fresh_database(prefix: str = "t") -> str:
    """A new empty database on the tests' server; its URL."""
    import psycopg

    url = server_url()
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as con:
        con.execute(f'CREATE DATABASE "{name}"')
    return url.rsplit("/", 1)[0] + f"/{name}"
