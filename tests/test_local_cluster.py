"""A real local Ray head (soul_apps.cluster.local_cluster) used through Ray Client from subprocesses."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from soul_apps.cluster import local_cluster as lc

pytestmark = pytest.mark.ray

ROOT = str(Path(__file__).resolve().parents[1])
NS = "lc-test"

CLIENT = r"""
import json, os, sys, time
mode, address, ns = sys.argv[1:4]
out = {}
t0 = time.monotonic()
if mode == "probe":
    from actors.client_session import check_client_access  # imports ray: not part of the probe's time
    t0 = time.monotonic()
    try:
        check_client_access(address, timeout=5)
        out["probe"] = "ok"
    except Exception as e:
        out["probe"] = type(e).__name__
        out["probe_msg"] = str(e)
    out["probe_s"] = time.monotonic() - t0
    t0 = time.monotonic()
import ray
try:  # no retry: heads from local_cluster start with HEAD_ENV, so the session server does not die at fork
    ray.init(address, namespace=ns, log_to_driver=False)
except Exception as e:
    out.update(init_error=f"{type(e).__module__}.{type(e).__qualname__}", msg=str(e), fail_s=time.monotonic() - t0)
    print(json.dumps(out)); sys.exit(0)
out["connect_s"] = time.monotonic() - t0

@ray.remote
def plus_one(x):
    return x + 1

@ray.remote(resources={"soul_slot": 1})
class Counter:
    def __init__(self):
        self.n = 0
    def incr(self):
        self.n += 1
        return self.n
    def pid(self):
        return os.getpid()

if mode == "create":
    out["task"] = ray.get(plus_one.remote(41))
    c = Counter.options(name="counter", lifetime="detached").remote()
    out["count"] = ray.get(c.incr.remote())
    out["actor_pid"] = ray.get(c.pid.remote())
elif mode == "find":
    c = ray.get_actor("counter", namespace=ns)
    out["count"] = ray.get(c.incr.remote())
ray.shutdown()
print(json.dumps(out))
"""


def _env(extra: dict[str, str], home: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(extra, HOME=home, PYTHONPATH=ROOT)
    return env


def _client(mode: str, address: str, env: dict[str, str], timeout: float = 90) -> dict:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", CLIENT, mode, address, NS], env=env, capture_output=True,
                       text=True, timeout=timeout, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["wall_s"] = time.monotonic() - t0
    print(mode, {k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()})
    return out


def _proc_of_head(sid: int, temp_dir: str) -> list[str]:
    """Independent /proc scan: live processes in the head's session or naming its temp dir."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            st = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        state, _ppid, _pgrp, session = st[st.rfind(")") + 2 :].split()[:4]
        if state != "Z" and (int(session) == sid or temp_dir in cmd):
            found.append(f"{entry}: {cmd[:120]}")
    return found


@pytest.fixture(scope="module")
def home() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="rth", dir="/tmp")  # empty HOME: no ~/.ray/auth_token leaks in
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def head(home: str) -> Iterator[lc.HeadInfo]:
    state_dir = tempfile.mkdtemp(prefix="rts", dir="/tmp")
    temp_dir = tempfile.mkdtemp(prefix="rt", dir="/tmp")
    with pytest.MonkeyPatch.context() as mp:
        for var in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE", "RAY_ADDRESS"):
            mp.delenv(var, raising=False)
        mp.setenv("HOME", home)  # the head gets a fresh token in state_dir
        t0 = time.monotonic()
        info = lc.start_head(num_cpus=2, temp_dir=temp_dir, resources={"soul_slot": 2}, state_dir=state_dir,
                             node_ip="127.0.0.1")  # a head for this machine only (`soul cluster up` is not)
        print(f"head started in {time.monotonic() - t0:.2f} s")
    try:
        yield info
    finally:
        lc.stop_head(state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _state_dir(info: lc.HeadInfo) -> str:
    return str(Path(info.pid_file).parent)


def test_head_recorded_and_status(head: lc.HeadInfo) -> None:
    state = json.loads(Path(head.pid_file).read_text())
    assert state["client_address"] == head.client_address and head.client_address.startswith("ray://127.0.0.1:")
    assert head.token_path == str(Path(_state_dir(head)) / "auth_token")
    assert stat.S_IMODE(os.stat(head.token_path).st_mode) == 0o600
    assert len(Path(head.token_path).read_text()) == 64
    status = lc.head_status(_state_dir(head))
    assert status is not None and status["running"] and status["auth_mode"] == "token"
    assert set(state["pids"]) <= set(status["pids_alive"])
    assert head.client_address in status["text"] and "RAY_AUTH_MODE=token" in status["text"]
    # node_ip 127.0.0.1: every process of the head listens on loopback only (Ray 2.60 would swap in the
    # machine's address without RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0)
    assert status["listening"] == ["127.0.0.1"] and status["loopback_only"], status["text"]
    assert head.gcs_address.startswith("127.0.0.1:") and "this machine only" in status["text"]
    assert lc.client_env(head) == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": head.token_path}
    with pytest.raises(RuntimeError, match="already running"):
        lc.start_head(state_dir=_state_dir(head))
    with pytest.raises(RuntimeError, match="already in use"):
        lc.start_head(state_dir=_state_dir(head) + "/other", client_port=int(head.client_address.rsplit(":", 1)[1]))
    with pytest.raises(ValueError, match="too long"):
        lc.start_head(state_dir=_state_dir(head) + "/other", temp_dir="/tmp/" + "x" * 60)


def test_client_task_and_detached_actor_found_from_second_client(head: lc.HeadInfo, home: str) -> None:
    env = _env(lc.client_env(head), home)
    first = _client("create", head.client_address, env)
    assert first["task"] == 42 and first["count"] == 1
    assert first["actor_pid"] in lc.head_status(_state_dir(head))["pids_alive"]  # type: ignore[index]
    second = _client("find", head.client_address, env)
    assert second["count"] == 2  # same detached actor, state kept across client disconnects


def test_client_without_token_is_refused(head: lc.HeadInfo, home: str) -> None:
    # Ray's own retry loop (5 + 10 + 15 s by default, ~30 s) shortened to ~3 s by these two knobs. The probe's
    # answer is the head's own refusal of the token (its message), not a time-out: the times are printed.
    env = _env({"RAY_CLIENT_INITIAL_CONNECTION_TIMEOUT_S": "1", "RAY_CLIENT_MAX_CONNECTION_TIMEOUT_S": "1"}, home)
    out = _client("probe", head.client_address, env)
    assert out["probe"] == "AuthError" and "Invalid or missing authentication token" in out["probe_msg"]
    assert out["init_error"] == "builtins.ConnectionError" and out["msg"] == "ray client connection timeout"
    wrong = Path(home) / "wrong_token"
    wrong.write_text("0" * 64)
    out = _client("probe", head.client_address, _env({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(wrong),
                                                      "RAY_CLIENT_MAX_CONNECTION_TIMEOUT_S": "1",
                                                      "RAY_CLIENT_INITIAL_CONNECTION_TIMEOUT_S": "1"}, home))
    assert out["probe"] == "AuthError" and out["init_error"] == "builtins.ConnectionError"


def test_probe_unreachable_is_runtime_unavailable(home: str) -> None:
    out = _client("probe", "ray://127.0.0.1:1", _env({"RAY_CLIENT_MAX_CONNECTION_TIMEOUT_S": "1",
                                                      "RAY_CLIENT_INITIAL_CONNECTION_TIMEOUT_S": "1"}, home))
    assert out["probe"] == "RuntimeUnavailable" and "nothing accepts connections" in out["probe_msg"], out


# ---- many clients: soul_runtime.connect() over Ray Client ---------------------------------------------

SITECUSTOMIZE = """
import os, sys, threading, time
_d = os.environ.get("SOUL_TEST_CRASH_DIR")
try:
    _cmd = open("/proc/self/cmdline", "rb").read()
except OSError:
    _cmd = b""
if _d and b"--mode=proxy" in _cmd and b"setup_worker" not in _cmd:
    # In the head's Ray Client proxy: the first N (file `limit`) per-client session servers it starts are
    # killed before the proxy looks at them - the process really dies, as it does in ray-project/ray#63202.
    def _patch():
        while getattr(sys.modules.get("ray.util.client.server.proxier"), "start_ray_client_server", None) is None:
            time.sleep(0.01)
        m = sys.modules["ray.util.client.server.proxier"]
        start = m.start_ray_client_server

        def crashing(*args, **kwargs):
            proc = start(*args, **kwargs)
            if len([f for f in os.listdir(_d) if f.startswith("crash-")]) < int(open(os.path.join(_d, "limit")).read()):
                open(os.path.join(_d, "crash-%d" % proc.process.pid), "w").close()
                proc.process.kill()
                os.waitid(os.P_PID, proc.process.pid, os.WEXITED | os.WNOWAIT)  # dead, left for the proxy to reap
            return proc
        m.start_ray_client_server = crashing
    threading.Thread(target=_patch, daemon=True).start()
"""


def _connect_clients(info: lc.HeadInfo, home: str, data_dir: str, souls: list[str], attempts: int = 3,
                     extra: dict[str, str] | None = None) -> list[dict]:
    """One process per soul, all at once: soul_runtime.connect(ray://...), one turn, close()."""
    env = _env(lc.client_env(info) | (extra or {}), home)
    procs = [subprocess.Popen([sys.executable, "-m", "soul_apps.bench.client", "one", info.client_address,
                               data_dir, soul, str(attempts)], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for soul in souls]
    outs = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=240)
        assert p.returncode == 0, stderr[-3000:]
        outs.append(json.loads(stdout.strip().splitlines()[-1]) | {"stderr": stderr})
    print([{k: v for k, v in o.items() if k != "stderr"} for o in outs])
    return outs


@pytest.fixture()
def crashing_head(home: str, tmp_path: Path) -> Iterator[tuple[lc.HeadInfo, Path]]:
    """A fresh head whose first session server dies at start-up (the real process is killed)."""
    inject, crash = tmp_path / "inject", tmp_path / "crash"
    inject.mkdir()
    crash.mkdir()
    (inject / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (crash / "limit").write_text("1")
    state_dir = tempfile.mkdtemp(prefix="rts", dir="/tmp")
    with pytest.MonkeyPatch.context() as mp:
        for var in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE", "RAY_ADDRESS"):
            mp.delenv(var, raising=False)
        mp.setenv("HOME", home)
        mp.setenv("PYTHONPATH", os.pathsep.join([str(inject), ROOT]))
        mp.setenv("SOUL_TEST_CRASH_DIR", str(crash))
        info = lc.start_head(num_cpus=2, state_dir=state_dir, node_ip="127.0.0.1")
    try:
        yield info, crash
    finally:
        lc.stop_head(state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)


def _crashes(crash: Path) -> int:
    return len(list(crash.glob("crash-*")))


def test_fresh_head_clients_connect_and_a_dead_session_server_is_retried(
        crashing_head: tuple[lc.HeadInfo, Path], home: str, tmp_path: Path) -> None:
    info, crash = crashing_head
    data = str(tmp_path / "data")
    outs = _connect_clients(info, home, data, ["f0", "f1", "f2"])
    assert all("error" not in o for o in outs), outs
    assert all(o["turn_s"] > 0 and o["session_s"] is not None for o in outs)
    assert _crashes(crash) == 1  # one session server died ...
    assert sum(o["retries"] for o in outs) == 1  # ... and exactly its client retried, with a warning naming why
    warned = "".join(o["stderr"] for o in outs)
    assert "failed (attempt 1 of 3" in warned and "Starting Ray client server failed" in warned

    (crash / "limit").write_text("1000")  # from now on every session server dies
    before = _crashes(crash)
    [failed] = _connect_clients(info, home, data, ["f3"])
    assert failed["error"].startswith("RuntimeUnavailable: ") and "could not open a session" in failed["error"]
    assert "attempts in" in failed["error"] and "GRPC_ENABLE_FORK_SUPPORT=0" in failed["error"]
    assert _crashes(crash) - before >= 2 and failed["retries"] == _crashes(crash) - before - 1
    # the failure is the connect's own account of its attempts, not Ray's (which took 30-45 s to report the first)
    assert "Failed to reconnect" not in failed["error"] and "grace period" not in failed["error"], failed

    [single] = _connect_clients(info, home, data, ["f4"], attempts=1)
    assert "error" in single and single["retries"] == 0

    before = _crashes(crash)
    wrong = tmp_path / "wrong_token"
    wrong.write_text("0" * 64)
    [refused] = _connect_clients(info, home, data, ["f5"], extra={"RAY_AUTH_TOKEN_PATH": str(wrong)})
    assert refused["error"].startswith("AuthError: ") and refused["retries"] == 0
    assert _crashes(crash) == before  # refused before any session server was started


def test_clients_connect_to_a_head_busy_with_many_turns(head: lc.HeadInfo, home: str, tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    busy = subprocess.Popen([sys.executable, "-m", "soul_apps.bench.client", "busy", head.client_address, data,
                             "16"], env=_env(lc.client_env(head), home), cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert busy.stdout is not None and "ready" in busy.stdout.readline()  # 16 turns in flight from now on
        outs = _connect_clients(head, home, data, ["b0", "b1", "b2"])
    finally:
        stdout, stderr = busy.communicate(timeout=180)
    assert busy.returncode == 0, stderr[-3000:]
    load = json.loads(stdout.strip().splitlines()[-1])
    assert all("error" not in o for o in outs), outs
    assert load["busy_errors"] == 0 and load["busy_turns"] > 0, load


LOSE_SESSION = r"""
import json, logging, os, signal, sys, time
from actors import runtime
address, data_dir, soul, gcs, attempts = sys.argv[1:6]


def servers():  # this head's per-client session servers (the GCS address names the head)
    found = set()
    for e in os.listdir("/proc"):
        try:
            cmd = open(f"/proc/{e}/cmdline", "rb").read().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"--mode=specific-server" in cmd and f"--address={gcs}".encode() in cmd:
            found.add(int(e))
    return found


before, seen = servers(), {}
attach = runtime.Runtime._start_actors


def lose_session(self):  # the session is open, nothing attached yet: its server dies (SIGKILL)
    runtime.Runtime._start_actors = attach  # once
    mine = servers() - before
    for pid in mine:
        os.kill(pid, signal.SIGKILL)
    seen.update(killed=len(mine), t_kill=time.monotonic())
    return attach(self)


class Warned(logging.Handler):
    def emit(self, record):
        if hasattr(record, "retry"):  # not the warnings of a slow session (extra "waiting_s")
            seen["retries"] = seen.get("retries", 0) + 1
            seen.setdefault("t_warn", time.monotonic())


runtime.Runtime._start_actors = lose_session
log = logging.getLogger("soul_runtime.connect")
log.addHandler(Warned())
log.addHandler(logging.StreamHandler())
import soul_runtime
out = {}
try:  # a namespace of its own: the module's head also serves the other tests' runtimes (other data dirs)
    rt = soul_runtime.connect(address, data_dir=data_dir, namespace="lost-session", connect_attempts=int(attempts))
    out["turn_seq"] = rt.soul(soul).turn("The production database is Postgres 15.", user="maya").seq
    rt.close()
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"
    out["error_after_s"] = time.monotonic() - seen["t_kill"] if "t_kill" in seen else None
out.update(killed=seen.get("killed"), retries=seen.get("retries", 0),
           warned_after_s=seen["t_warn"] - seen["t_kill"] if "t_warn" in seen else None)
print(json.dumps(out))
"""


def _lose_session(head: lc.HeadInfo, home: str, data: str, soul: str, attempts: int) -> tuple[dict, str]:
    r = subprocess.run([sys.executable, "-c", LOSE_SESSION, head.client_address, data, soul, head.gcs_address,
                        str(attempts)], env=_env(lc.client_env(head), home), cwd=ROOT, capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    print(out)
    assert out["killed"] == 1  # exactly this client's session server died
    return out, r.stderr


def test_a_session_lost_while_connecting_is_retried(head: lc.HeadInfo, home: str, tmp_path: Path) -> None:
    """The session server of a client dies after its session opened, before connect() found the actors:
    connect() notices it from the session's own streams (not from Ray's reconnect giving up after its grace
    period), says why at warning, and connects again; the turn then runs, once. With one attempt, connect()
    raises that cause."""
    data = str(tmp_path / "data")
    out, stderr = _lose_session(head, home, data, "l0", 3)
    assert "error" not in out and out["turn_seq"] == 1, (out, stderr[-3000:])  # the turn ran, once
    # The head's proxy ends the session's log stream at once but holds back the data stream's error for the
    # reconnect grace period (30 s), and a call that reaches it later waits 30 s for the dead server: before
    # connect() watched the streams it heard 30.1-30.6 s late in about half the runs; now 0.03-0.25 s.
    assert out["retries"] == 1 and out["warned_after_s"] is not None, out
    assert "failed (attempt 1 of 3" in stderr and "retrying" in stderr
    assert "session server for this client is gone" in stderr or "dropped" in stderr
    assert "reconnection grace period" not in stderr  # noticed by the connect's watch, not by Ray's reconnect

    out, stderr = _lose_session(head, home, data, "l1", 1)
    assert out["error"].startswith("RuntimeUnavailable: ") and "lost while connecting" in out["error"], out
    assert out["error_after_s"] is not None and out["retries"] == 0, out
    assert "reconnection grace period" not in out["error"], out


def test_stop_head_leaves_no_process(head: lc.HeadInfo) -> None:  # keep last: stops the module's head
    state = json.loads(Path(head.pid_file).read_text())
    sid, temp_dir = state["session_id"], head.temp_dir
    assert _proc_of_head(sid, temp_dir), "head should be running before stop"
    t0 = time.monotonic()
    assert lc.stop_head(_state_dir(head)) is True
    print(f"stop_head took {time.monotonic() - t0:.2f} s")
    assert _proc_of_head(sid, temp_dir) == []
    assert not Path(head.pid_file).exists()
    assert lc.head_status(_state_dir(head)) is None
    assert lc.stop_head(_state_dir(head)) is False  # idempotent
