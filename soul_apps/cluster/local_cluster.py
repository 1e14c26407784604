"""Start, inspect and stop a local Ray head for Ray Client use.

The head runs as ``ray start --head`` in its own session (``setsid``), so every
process it spawns (GCS, raylet, client server, dashboard leftovers, workers)
shares one session id; ``stop_head`` signals exactly those processes and never
runs ``ray stop`` (which would stop every Ray process of the user).

Token auth (Ray 2.60): the head is started with ``RAY_AUTH_MODE=token`` and
``RAY_AUTH_TOKEN_PATH``.  A Ray Client needs the same two variables
(``client_env``); without ``RAY_AUTH_MODE=token`` it never sends the token and
``ray.init("ray://...")`` retries for ~30 s before a bare
``ConnectionError("ray client connection timeout")`` (RAY_CLIENT_INITIAL_CONNECTION_TIMEOUT_S=1
and RAY_CLIENT_MAX_CONNECTION_TIMEOUT_S=1 shorten that to ~3 s, same message).
``client_session.check_client_access`` tells "refused for lack of token" (AuthError) apart
from "unreachable" (RuntimeUnavailable) in ~10 ms.

Where it listens: by default on the node's address, as Ray picks it — a cluster's head is
meant to be reached by worker nodes and clients on other machines (token auth guards it).
Measured with Ray 2.60 on Linux: the GCS and raylet listen on every interface (``::``), the
Ray Client server on 127.0.0.1 and the node address, the runtime-env agent on the node
address; workers (actors) on every interface. ``node_ip="127.0.0.1"`` keeps the whole head on
loopback (see ``ray_addresses.loopback_node`` for why Ray needs ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``
for that). ``head_status`` reports what the head's processes actually listen on.
Nothing here imports ray at module import time.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from actors.auth_token import new_token_file
from actors.ray_addresses import (
    LOOPBACK_HOSTS,
    RAY_CLUSTERS_ENV,
    bearer_of,
    ping_client_server,
    port_open,
    process_bearer,
    wait_for_client_server,
)
from soul_runtime.owner_only import make_dir, write_file

from . import listening_ports

STATE_FILE = "head.json"
TOKEN_FILE = "auth_token"
START_TIMEOUT_S = 60.0
MAX_TEMP_DIR_LEN = 45  # session dir + socket name must stay < 108 chars (AF_UNIX)

log = logging.getLogger("soul_runtime.connect")


@dataclass(frozen=True)
class HeadInfo:
    gcs_address: str
    client_address: str  # "ray://127.0.0.1:PORT"
    temp_dir: str
    token_path: str | None  # None: the head runs without token auth
    pid_file: str  # state_dir/head.json


def _free_port(host: str = "127.0.0.1", avoid: tuple[int, ...] = ()) -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in avoid:
            return port


def _resolve_token(state_dir: Path, own: bool = False) -> str:
    """Token file the head will use: $RAY_AUTH_TOKEN_PATH, $RAY_AUTH_TOKEN (copied
    into state_dir), ~/.ray/auth_token, else a new token in state_dir (mode 0600);
    ``own``: always a token of its own in state_dir."""
    own_path = state_dir / TOKEN_FILE
    env_path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if not own and env_path and Path(env_path).is_file():
        return str(Path(env_path).resolve())
    env_token = "" if own else os.environ.get("RAY_AUTH_TOKEN", "").strip()
    default = Path.home() / ".ray" / "auth_token"
    if not own and not env_token and default.is_file() and default.read_text().strip():
        return str(default)
    if env_token or not own_path.is_file():
        new_token_file(own_path, env_token or None)
    return str(own_path)


def _matches_dir(args: list[str], temp_dir: str) -> bool:
    return any(a == temp_dir or temp_dir + "/" in a or a.endswith("=" + temp_dir) for a in args)


def _scan(sid: int, temp_dir: str) -> dict[int, str]:
    """Live processes of one head: same session id, or temp dir on the command line."""
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            args = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # state ppid pgrp session ...
        if fields[0] in ("Z", "X"):
            continue
        if int(fields[3]) == sid or _matches_dir(args, temp_dir):
            found[int(entry)] = " ".join(a for a in args if a)[:200]
    return found


def _read_state(state_dir: str | os.PathLike[str]) -> dict | None:
    try:
        return json.loads((Path(state_dir) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _wait_gone(sid: int, temp_dir: str, pids: set[int], timeout: float) -> set[int]:
    deadline = time.monotonic() + timeout
    while True:
        alive = pids & set(_scan(sid, temp_dir))
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.1)


def _kill_head(sid: int, temp_dir: str, grace: float) -> None:
    procs = _scan(sid, temp_dir)
    # Same order as `ray stop`: raylet first, then the rest, GCS last.
    raylets = [p for p, c in procs.items() if "raylet/raylet" in c]
    gcs = [p for p, c in procs.items() if "gcs_server" in c]
    rest = [p for p in procs if p not in raylets and p not in gcs]
    deadline = time.monotonic() + grace
    for group in (raylets, rest, gcs):
        _signal(group, signal.SIGTERM)
        _wait_gone(sid, temp_dir, set(group), max(0.0, min(2.0, deadline - time.monotonic())))
    _wait_gone(sid, temp_dir, set(procs), max(0.0, deadline - time.monotonic()))
    for _ in range(3):  # workers may have been forked meanwhile: rescan
        left = _scan(sid, temp_dir)
        if not left:
            return
        _signal(list(left), signal.SIGKILL)
        _wait_gone(sid, temp_dir, set(left), 3.0)


HEAD_ENV = {"GRPC_ENABLE_FORK_SUPPORT": "0"}
"""Environment every head is started with (also set by cluster/start-head.sh and the manifests).

The head's Ray Client proxy forks one server process per client while its own gRPC threads run.
With gRPC's fork handlers on (grpcio's default), the child re-creates gRPC threads on the parent's
polling state and can abort before it executes the server ("Check failed: next_worker->state ==
KICKED", ray-project/ray#63202): measured on a busy 2-core machine, 1 connect in 4-10 failed with
"Initialization failure from server". The proxy's child only executes a new program, so it needs no
fork handlers; with them off no child died in our runs (``soul bench client``)."""

SESSION_START_TIMEOUT_S = 30
"""How long the head's client proxy waits for a per-client server to answer (Ray's
RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S; 30 is Ray's default). Start-up of that server (import ray,
connect to the GCS) took 8-12 s on a 2-core machine at load 40: 10 s failed connects on a busy head."""


def start_head(*, port: int = 0, client_port: int = 0, num_cpus: int | None = None, temp_dir: str | None = None,
               resources: dict | None = None, state_dir: str, auth: bool = True, node_ip: str | None = None,
               timeout: float = START_TIMEOUT_S, session_start_timeout: int = SESSION_START_TIMEOUT_S,
               grpc_fork_handlers: bool = False, fingerprint: str = "", own_token: bool = False) -> HeadInfo:
    """Start a Ray head (GCS + Ray Client server) and record it in state_dir/head.json.

    Port 0 picks a free port. temp_dir None: a fresh /tmp/rtXXXX, removed by stop_head.
    node_ip None: the node's address as Ray picks it (reachable from other machines: a cluster);
    "127.0.0.1": loopback only (this machine only).
    auth: token auth with the token from _resolve_token; False starts with RAY_AUTH_MODE=disabled.
    session_start_timeout: see SESSION_START_TIMEOUT_S. grpc_fork_handlers=True leaves out HEAD_ENV
    (Ray's default behaviour: the benchmark's baseline, never for real use).
    Returns once the Ray Client server answers a session's ping with the head's token (:func:`wait_client_ready`):
    a client may connect at once. Raises RuntimeError (with the tail of `ray start` output) if `ray start` fails
    or the Ray Client server does not answer within `timeout` s of the start; whatever had started is stopped
    again."""
    sdir = make_dir(Path(state_dir).resolve())
    if _read_state(sdir) is not None:
        status = head_status(sdir)
        if status and status["running"]:
            raise RuntimeError(f"a Ray head is already running for {sdir} ({status['client_address']}); stop it first")
        stop_head(sdir)
    port = port or _free_port()
    client_port = client_port or _free_port(avoid=(port,))
    if port_open("127.0.0.1", port) or port_open("127.0.0.1", client_port):
        raise RuntimeError(f"port {port} or {client_port} is already in use on 127.0.0.1")
    own_temp = temp_dir is None
    tdir = tempfile.mkdtemp(prefix="rt", dir="/tmp") if temp_dir is None else os.path.abspath(temp_dir)
    if len(tdir) > MAX_TEMP_DIR_LEN:
        raise ValueError(f"temp_dir {tdir!r} is too long (> {MAX_TEMP_DIR_LEN} chars): Ray's Unix socket paths would exceed 107 chars")
    make_dir(tdir)
    token_path = _resolve_token(sdir, own_token) if auth else None
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | {"RAY_USAGE_STATS_ENABLED": "0"}
    env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": token_path} if token_path else {"RAY_AUTH_MODE": "disabled"}
    env["RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S"] = str(int(session_start_timeout))
    if grpc_fork_handlers:
        env.pop("GRPC_ENABLE_FORK_SUPPORT", None)
    else:
        env |= HEAD_ENV
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", f"--port={port}",
           f"--ray-client-server-port={client_port}",
           "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={tdir}",
           # a port of its own: Ray's fixed default (52365) is taken by any other head on the machine
           f"--dashboard-agent-listen-port={_free_port(avoid=(port, client_port))}"]
    if node_ip:
        cmd.append(f"--node-ip-address={node_ip}")
        if node_ip in LOOPBACK_HOSTS:
            env[RAY_CLUSTERS_ENV] = "0"  # else Ray swaps 127.0.0.1 for the routable address
    if num_cpus is not None:
        cmd.append(f"--num-cpus={num_cpus}")
    if resources:
        cmd.append(f"--resources={json.dumps(resources)}")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True, text=True)
    sid = proc.pid  # setsid(): the session id of everything `ray start` spawns
    try:
        out, _ = proc.communicate(timeout=timeout)
        ok = proc.returncode == 0
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        ok = False
    not_ready = ""
    if ok:  # `ray start` returns before its Ray Client server listens: wait until that answers a session's ping
        try:
            probes = wait_client_ready(f"ray://127.0.0.1:{client_port}", max(0.0, timeout - (time.monotonic() - t0)),
                                       bearer=bearer_of(token_path))
        except Exception as e:  # RuntimeUnavailable, AuthError (the head refused its own token)
            ok, not_ready = False, str(e)
    if not ok:
        _kill_head(sid, tdir, grace=2.0)
        if own_temp and not os.path.exists(os.path.join(tdir, "session_latest")):
            shutil.rmtree(tdir, ignore_errors=True)  # nothing logged: do not leave an empty dir
        tail = "\n".join(out.strip().splitlines()[-15:])
        logs = f"logs in {tdir}/session_latest/logs"
        if not_ready:
            raise RuntimeError(f"the head started but its Ray Client server did not accept a session within "
                               f"{timeout:.0f} s: {not_ready}; {logs} (ray_client_server.err):\n{tail}")
        cause = _raylet_cause(os.path.join(tdir, "session_latest", "logs", "raylet.err"))
        raise RuntimeError(f"`ray start --head` failed (exit {proc.returncode}){cause}; {logs}:\n{tail}")

    found = re.search(r"Local node IP: (\S+)", out)
    node_address = found.group(1) if found else (node_ip or "127.0.0.1")
    info = HeadInfo(gcs_address=f"{node_address}:{port}", client_address=f"ray://127.0.0.1:{client_port}",
                    temp_dir=tdir, token_path=token_path, pid_file=str(sdir / STATE_FILE))
    state = asdict(info) | {"session_id": sid, "pids": sorted(_scan(sid, tdir)), "own_temp_dir": own_temp,
                            "client_port": client_port, "node_ip": node_address, "started_at": time.time(),
                            "start_seconds": round(time.monotonic() - t0, 2), "client_probes": probes,
                            "fingerprint": fingerprint}
    write_file(sdir / STATE_FILE, json.dumps(state, indent=2), durable=False)
    return info


CLIENT_READY_TIMEOUT_S = 60.0
"""How long ``cluster/start-head.sh`` waits for its head's Ray Client server (``SOUL_HEAD_READY_TIMEOUT_S``)."""
def wait_client_ready(client_address: str, timeout: float, *, bearer: str | None) -> int:
    """Wait until the Ray Client server at ``client_address`` answers a client's first call with the token
    ``bearer`` (:func:`ping_client_server`), for up to ``timeout`` s; returns the number of tries. AuthError at
    once when the head refuses that token, RuntimeUnavailable when nothing answers in time. Imports no ray."""
    return wait_for_client_server(client_address, timeout,
                                  lambda a, t: ping_client_server(a, t, bearer=bearer), warn=False)


def _raylet_cause(path: str) -> str:
    """The raylet's own reason for dying, which `ray start` does not print. On a busy machine it is mostly
    ``Timed out waiting for file .../metrics_agent_port_...``: in Ray 2.60 the raylet gives the dashboard
    agent a fixed 15 s to write each port file and aborts otherwise (ray-project/ray#65983)."""
    try:
        with open(path, errors="replace") as f:
            found = [ln for ln in f if "Check failed" in ln or "Timed out waiting for file" in ln]
    except OSError:
        return ""
    if not found:
        return ""
    line = found[-1].strip()
    return ": the raylet died: " + line[max(0, line.find("Check failed")):][:300]


def stop_session(session_id: int, temp_dir: str, grace: float = 10.0) -> None:
    """Stop a head started in a session of its own (``setsid``; say ``cluster/start-head.sh`` run with
    ``start_new_session``): every live process of that session or naming ``temp_dir`` (SIGTERM in `ray stop`'s
    order, SIGKILL after ``grace`` s). Nothing else is signalled: never ``ray stop``."""
    _kill_head(session_id, temp_dir, grace)


def stop_head(state_dir: str | os.PathLike[str], grace: float = 10.0) -> bool:
    """Stop only the processes of the head recorded in state_dir (SIGTERM, then SIGKILL
    after `grace` s) and remove head.json. False if nothing was recorded."""
    state = _read_state(state_dir)
    path = Path(state_dir) / STATE_FILE
    if state is not None:
        _kill_head(int(state["session_id"]), state["temp_dir"], grace)
    path.unlink(missing_ok=True)
    if state is None:
        return False
    if state.get("own_temp_dir"):
        shutil.rmtree(state["temp_dir"], ignore_errors=True)
    return True


def client_env(info: HeadInfo) -> dict[str, str]:
    """Variables a Ray Client process needs for this head (set them before `import ray`).

    RAY_AUTH_MODE=token is required: with an explicit ray:// address Ray 2.60 does
    not enable auth on its own, even when a token file exists. A RAY_AUTH_TOKEN
    variable in the client environment must be unset or equal to the token."""
    if info.token_path is None:
        return {"RAY_AUTH_MODE": "disabled"}
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": info.token_path}


def head_status(state_dir: str | os.PathLike[str]) -> dict | None:
    """What a CLI prints about the head recorded in state_dir; None if none is."""
    state = _read_state(state_dir)
    if state is None:
        return None
    alive = sorted(_scan(int(state["session_id"]), state["temp_dir"]))
    running = bool(alive) and port_open("127.0.0.1", int(state["client_port"]))
    info = HeadInfo(**{k: state[k] for k in HeadInfo.__dataclass_fields__})
    env = client_env(info)
    auth = "token" if info.token_path else "disabled"
    env_text = " ".join(f"{k}={v}" for k, v in env.items())
    listening = listening_ports.listeners(alive)
    local_only = bool(listening) and all(s.loopback for s in listening)
    reach = "this machine only" if local_only else "other machines too (a cluster: worker nodes and clients join here)"
    text = "\n".join([
        f"Ray head: {'running' if running else 'NOT running'} ({len(alive)} processes alive)",
        f"  Ray Client address: {info.client_address}",
        f"  GCS address:        {info.gcs_address}",
        f"  listens on:         {listening_ports.summary(listening)} — reachable from {reach}",
        f"  temp dir:           {info.temp_dir}",
        f"  auth:               {auth}" + (f" (token file {info.token_path})" if info.token_path else ""),
        f"  connect with:       {env_text} soul ... --address {info.client_address}",
    ])
    return {"running": running, "client_address": info.client_address, "gcs_address": info.gcs_address,
            "temp_dir": info.temp_dir, "token_path": info.token_path, "auth_mode": auth,
            "listening": sorted({s.host for s in listening}), "loopback_only": local_only,
            "pids": state.get("pids", []), "pids_alive": alive, "client_env": env, "text": text}


def head_info(state_dir: str | os.PathLike[str]) -> HeadInfo | None:
    state = _read_state(state_dir)
    return HeadInfo(**{k: state[k] for k in HeadInfo.__dataclass_fields__}) if state else None


def pid_alive(pid: int) -> bool:
    """Is process ``pid`` running (not a zombie)?"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X")


def head_alive(state_dir: str | os.PathLike[str]) -> bool:
    """Is the head recorded in state_dir up: its processes alive and its GCS and client ports answering?"""
    state = _read_state(state_dir)
    if state is None or not any(pid_alive(p) for p in state.get("pids", [])):
        return False  # (the recorded pids, not a scan of /proc: this runs before every command)
    host, _, port = str(state["gcs_address"]).rpartition(":")
    return port_open(host, int(port)) and port_open("127.0.0.1", int(state["client_port"]))


@contextlib.contextmanager
def _locked(state_dir: Path) -> Iterator[None]:
    """One process at a time starts, replaces or stops the head of a state dir."""
    make_dir(state_dir)
    fd = os.open(state_dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def ensure_head(state_dir: str | os.PathLike[str], *, fingerprint: str = "", num_cpus: int | None = None,
                resources: dict | None = None, replace: bool = False) -> tuple[HeadInfo, bool]:
    """The running head of state_dir, started when there is none, or when the recorded one is dead
    (crashed, killed, a stale head.json), was started for another ``fingerprint`` (say another model
    setting), or ``replace`` is set. Returns (head, started_now). Safe against concurrent callers."""
    sdir = Path(state_dir).resolve()
    with _locked(sdir):
        state = _read_state(sdir)
        if state is not None and not replace and head_alive(sdir) and (
                not state.get("fingerprint") or not fingerprint or state["fingerprint"] == fingerprint):
            info = head_info(sdir)
            assert info is not None
            return info, False
        if state is not None:
            stop_head(sdir, grace=5.0)
        return start_head(state_dir=str(sdir), num_cpus=num_cpus, resources=resources, fingerprint=fingerprint,
                          own_token=True, node_ip="127.0.0.1"), True


def stop_head_locked(state_dir: str | os.PathLike[str], grace: float = 10.0) -> bool:
    """:func:`stop_head` under the state dir's lock (no start or replace runs meanwhile)."""
    sdir = Path(state_dir).resolve()
    if not sdir.is_dir():
        return False
    with _locked(sdir):
        return stop_head(sdir, grace)


def main(argv: list[str] | None = None) -> int:
    """``python -m soul_apps.cluster.local_cluster wait-ready ray://HOST:PORT [--timeout S]``: what ``cluster/start-head.sh``
    runs after ``ray start`` (with the head's auth environment) so that it returns only once a client can
    connect. Exit 0: ready; 2: the token was refused; 3: nothing answered in time."""
    import argparse

    from soul_runtime.errors import AuthError, RuntimeUnavailable

    parser = argparse.ArgumentParser(prog="python -m soul_apps.cluster.local_cluster")
    sub = parser.add_subparsers(dest="action", required=True)
    ready = sub.add_parser("wait-ready", help="wait until a Ray Client server answers (with this environment's token)")
    ready.add_argument("address", help="ray://HOST:PORT")
    ready.add_argument("--timeout", type=float, default=CLIENT_READY_TIMEOUT_S)
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    try:
        tries = wait_client_ready(args.address, args.timeout, bearer=process_bearer())
    except AuthError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RuntimeUnavailable as e:
        print(f"error: the Ray Client server did not answer within {args.timeout:g} s: {e}", file=sys.stderr)
        return 3
    print(f"Ray Client server at {args.address} ready ({time.monotonic() - t0:.1f} s, {tries} tries)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
