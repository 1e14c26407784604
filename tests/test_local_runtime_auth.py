"""The local runtime uses its own token, whatever Ray token the machine or the process holds.

A ``~/.ray/auth_token`` of the user's (any earlier local ``ray.init()`` leaves one) and a Ray that the process
imported, or that read that token, before it attached: the attach and its turns still use the head's own token;
a token the head really refuses is an AuthError naming where the token came from. Run in a subprocess with a
HOME of its own (the real ``~/.ray`` is never read or written) on a fresh data dir, whose head it stops by pid.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json, os, sys
import ray  # loaded before the attach, as in any program that used Ray first
from ray._raylet import AuthenticationTokenLoader
# what any earlier Ray call of the process does: read (and keep) the token the environment names then
cached = AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True)

from soul_apps.cluster import local_runtime
from actors import raycalls
from actors.runtime import connect
from soul_runtime.errors import AuthError

data = os.environ["SOUL_DATA_DIR"]
out = {"stray_cached": cached}
address, out["started"] = local_runtime.attach(data)
out["env"] = {k: v for k, v in os.environ.items() if k.startswith("RAY_AUTH")}
rt = connect(address, data_dir=data)
soul = rt.soul("auth")
soul.turn("Our billing service is written in Go.", at="2026-03-02T09:00:00Z")
out["turns"] = [t.turn_id for t in soul.traces(last=5)]
rt.close(flush=False)
raycalls.shutdown()

os.environ["RAY_AUTH_TOKEN_PATH"] = sys.argv[1]  # a token the head does not hold
try:
    connect(address, data_dir=data)
    out["wrong_token"] = None
except AuthError as e:
    out["wrong_token"] = str(e)
print("RESULT " + json.dumps(out))
"""


def test_local_runtime_attaches_with_its_own_token_past_a_stray_one() -> None:
    from soul_apps.cluster import local_runtime
    base = Path(tempfile.mkdtemp(prefix="lra", dir="/tmp"))
    home, data = base / "home", base / "data"
    stray = home / ".ray" / "auth_token"
    stray.parent.mkdir(parents=True)
    stray_token = secrets.token_hex(32)
    stray.write_text(stray_token)
    stray.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "SOUL_"))}
    env.update(HOME=str(home), SOUL_DATA_DIR=str(data), PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0",
               RAY_AUTH_TOKEN=stray_token)  # a user's token value too: Ray prefers it to any file
    try:
        p = subprocess.run([sys.executable, "-c", SCRIPT, str(stray)], env=env, capture_output=True, text=True,
                           timeout=600, stdin=subprocess.DEVNULL)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        assert p.returncode == 0 and lines, f"exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
        out = json.loads(lines[-1].removeprefix("RESULT "))
        own = data / "cluster" / "auth_token"
        assert out["stray_cached"] is True  # the process's Ray had read the stray token before the attach
        assert out["env"] == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(own)}  # RAY_AUTH_TOKEN dropped
        assert own.read_text().strip() != stray_token
        assert out["turns"] == ["auth/1"]
        assert out["wrong_token"] is not None
        assert "refused this process's token" in out["wrong_token"] and str(stray) in out["wrong_token"]
        assert stray.read_text() == stray_token  # the user's file is left as it was
    finally:
        local_runtime.stop(str(data))
        shutil.rmtree(base, ignore_errors=True)
