"""Heads started by ``cluster/start-head.sh`` take a client at once: 20 fresh heads in a row, each started by the
script on loopback (its own HOME, token, temp dir and data dir), a ``soul_runtime.connect("ray://…")`` right after
the script returned, one turn, the head stopped again (only the processes of the script's own session).

The client gets ``SOUL_CONNECT_WAIT_S=0``: it does not wait for a port that refuses it, so every connect tests the
script's promise (it returns only once the Ray Client server answers), not the client's patience (which
tests/test_cluster_connect.py covers).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from soul_apps.cluster import local_cluster as lc

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
HEADS = 20

CLIENT = r"""
import json, sys, time
import soul_runtime
address, data_dir = sys.argv[1:3]
out = {}
t0 = time.monotonic()
try:
    rt = soul_runtime.connect(address, data_dir=data_dir, embedder="fast", hosts=1, episodic_shards=1,
                              semantic_shards=1, procedural_shards=1)
    out["connect_s"] = round(time.monotonic() - t0, 2)
    out["seq"] = rt.soul("maya").turn("The production database for Tendril is Postgres 15.", user="maya").seq
    rt.close()
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(script_pid: int, temp_dir: str, home: str) -> None:
    lc.stop_session(script_pid, temp_dir)  # the script's own session: nothing another test started
    shutil.rmtree(home, ignore_errors=True)
    shutil.rmtree(temp_dir, ignore_errors=True)


def _one_head(i: int, stops: ThreadPoolExecutor) -> dict:
    home = tempfile.mkdtemp(prefix="c50h", dir="/tmp")  # an empty HOME: the script makes its own token there
    temp_dir = tempfile.mkdtemp(prefix="rt", dir="/tmp")
    gcs, client = _free_port(), _free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SOUL_"))} | {
        "HOME": home, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    env = base | {"SOUL_DATA_DIR": f"{home}/data", "NODE_IP": "127.0.0.1", "RAY_TEMP_DIR": temp_dir,
                  "RAY_PORT": str(gcs), "RAY_CLIENT_PORT": str(client), "NUM_CPUS": "2",
                  "SOUL_PYTHON": sys.executable}
    t0 = time.monotonic()
    script = subprocess.Popen(["bash", str(ROOT / "cluster" / "start-head.sh")], env=env, cwd=str(ROOT),
                              start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    row: dict = {"i": i}
    try:
        out, _ = script.communicate(timeout=180)
        row.update(script_rc=script.returncode, script_s=round(time.monotonic() - t0, 1),
                   said_ready=f"Ray Client server at ray://127.0.0.1:{client} ready" in out)
        if script.returncode != 0:
            row["error"] = "start-head.sh: " + out[-1500:]
            return row
        t0 = time.monotonic()  # at once: no pause between the script's return and the connect
        client_env = base | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": f"{home}/.ray/auth_token",
                             "SOUL_CONNECT_WAIT_S": "0", "RAY_LOGGER_LEVEL": "error"}
        r = subprocess.run([sys.executable, "-c", CLIENT, f"ray://127.0.0.1:{client}", f"{home}/data"],
                           env=client_env, cwd=str(ROOT), capture_output=True, text=True, timeout=240)
        row["client_s"] = round(time.monotonic() - t0, 1)
        try:
            row |= json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            row["error"] = f"client exit {r.returncode}: {r.stderr[-1500:]}"
        return row
    finally:  # the head is stopped while the next one starts (its own ports, HOME and temp dir)
        row["stopped"] = stops.submit(_stop, script.pid, temp_dir, home)


def test_twenty_fresh_heads_from_the_script_each_take_a_client_at_once() -> None:
    rows = []
    with ThreadPoolExecutor(max_workers=1) as stops:
        for i in range(HEADS):
            row = _one_head(i, stops)
            print({k: v for k, v in row.items() if k != "stopped"})
            rows.append(row)
        for row in rows:
            row.pop("stopped").result()  # every head stopped (a failure to stop one is this test's)
    ok = [r for r in rows if "error" not in r and r.get("seq") == 1]
    print(f"{len(ok)}/{HEADS} immediate connects with a turn; script p50 "
          f"{sorted(r['script_s'] for r in rows)[HEADS // 2]} s")
    assert all(r["said_ready"] for r in rows), [r for r in rows if not r["said_ready"]]
    assert len(ok) == HEADS, [r for r in rows if r not in ok]
