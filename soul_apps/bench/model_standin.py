"""The Messages-API stand-in in a process of its own, for benchmarks that run many souls against a slow model.

    python -m soul_apps.bench.model_standin --port P --delay S

serves ``POST /v1/messages`` on ``127.0.0.1:P`` the way :func:`soul_apps.bench.claude_path.keep_everything`
answers (a reply, or a memory tool call that keeps the message), each answer after ``S`` seconds, a thread per
connection (a thousand requests asleep at once are a thousand threads), nothing recorded but counts. Control:

* ``GET /stats``: ``{"pid", "port", "delay_s", "calls", "by_kind", "in_flight"}`` — ``calls`` counts the
  ``/v1/messages`` requests so far, ``by_kind`` splits them into ``reply`` / ``record_memory`` / ... (the tool a
  request forces), ``in_flight`` is how many are being answered now;
* ``POST /delay`` with ``{"delay_s": S}``: the delay from now on (requests already asleep keep theirs).

SIGTERM or SIGINT stops it. :class:`StandinProcess` starts it from a benchmark (``subprocess.Popen``), waits
until it answers, talks to its control routes and stops it by its pid.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from soul_apps.bench.messages_api import MessagesApiServer, Scripted
from soul_apps.cluster.listening_ports import socket_inodes


class CountingStandin(MessagesApiServer):
    """The stand-in: every message kept, calls counted by kind, the delay settable over HTTP."""

    name = "model-standin"

    def __init__(self, *, port: int, delay_s: float) -> None:
        from soul_apps.bench.claude_path import keep_everything
        self.kinds: Counter[str] = Counter()
        self._keep = keep_everything
        super().__init__(responder=self._respond, delay_s=delay_s, port=port, record=False)

    def _respond(self, body: dict[str, Any]) -> Scripted:
        kind = str((body.get("tool_choice") or {}).get("name") or "reply")
        with self._lock:
            self.kinds[kind] += 1
        return self._keep(body)

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"pid": os.getpid(), "port": self.port, "delay_s": self.delay_s, "calls": self.received,
                    "by_kind": dict(self.kinds), "in_flight": self.in_flight}

    def control(self, method: str, path: str, body: dict[str, Any]) -> Scripted | None:
        route = path.split("?")[0]
        if method == "GET" and route == "/stats":
            return Scripted(200, self.stats())
        if method == "POST" and route == "/delay":
            delay = body.get("delay_s")
            if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not 0 <= delay <= 3600:
                return self.error(400, "invalid_request_error", f"delay_s must be seconds in 0..3600, got {delay!r}")
            self.delay_s = float(delay)
            return Scripted(200, self.stats())
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m soul_apps.bench.model_standin",
                                 description="The Messages-API stand-in: every answer after --delay seconds.")
    ap.add_argument("--port", type=int, required=True, help="port on 127.0.0.1 (0: any free one)")
    ap.add_argument("--delay", type=float, default=0.0, help="seconds per model call (default 0)")
    args = ap.parse_args(argv)
    if args.delay < 0:
        ap.error("--delay must be >= 0")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with CountingStandin(port=args.port, delay_s=args.delay) as api:
        print(f"listening on {api.base_url} (pid {os.getpid()}), {args.delay:g} s per call", flush=True)
        while not stop.wait(0.5):
            pass
    return 0


# ---- the benchmark's side -------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class StandinProcess:
    """The stand-in as a child process: started by :meth:`start`, which waits until it answers, stopped by
    :meth:`stop` (SIGTERM to its pid, SIGKILL if it has not gone within 10 s). A context manager."""

    def __init__(self, delay_s: float = 0.0, port: int | None = None) -> None:
        self.delay_s = delay_s
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = tempfile.NamedTemporaryFile(prefix="soul-model-standin-", suffix=".log", delete=False)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None, "the stand-in is not started"
        return self.proc.pid

    def start(self, timeout_s: float = 60.0) -> StandinProcess:
        self.proc = subprocess.Popen([sys.executable, "-m", "soul_apps.bench.model_standin", "--port",
                                      str(self.port), "--delay", repr(self.delay_s)],
                                     stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the model stand-in exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                self.stats(timeout_s=2)
                return self
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"the model stand-in did not answer on port {self.port} within "
                                       f"{timeout_s:g} s: {self.log_tail()}") from None
                time.sleep(0.1)

    def _call(self, method: str, path: str, body: dict[str, Any] | None, timeout_s: float) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", "Connection": "close"})
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            out: dict[str, Any] = json.loads(r.read())
            return out

    def stats(self, timeout_s: float = 30.0) -> dict[str, Any]:
        return self._call("GET", "/stats", None, timeout_s)

    def set_delay(self, delay_s: float) -> dict[str, Any]:
        self.delay_s = delay_s
        return self._call("POST", "/delay", {"delay_s": delay_s}, 30.0)

    def settle(self, quiet_s: float = 0.3, timeout_s: float = 120.0) -> dict[str, Any]:
        """Wait until no request has been in flight for ``quiet_s`` with the call count unchanged (the memory work
        of turns already answered has reached the model and come back); returns the stats then."""
        deadline = time.monotonic() + timeout_s
        last = self.stats()
        while time.monotonic() < deadline:
            time.sleep(quiet_s)
            now = self.stats()
            if now["in_flight"] == 0 and last["in_flight"] == 0 and now["calls"] == last["calls"]:
                return now
            last = now
        return last

    def connections(self) -> int:
        """Established TCP connections to the stand-in's port (its server side, from the network namespace's
        table: each one is a client's connection, whichever process holds it)."""
        return sum(1 for local, _, state, _ in tcp_sockets() if local == self.port and state == ESTABLISHED)

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return Path(self._log.name).read_text(errors="replace")[-chars:].strip() or "(no output)"
        except OSError:
            return "(no output)"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> int | None:
        """SIGTERM to the stand-in's pid, SIGKILL after 10 s; returns its exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)
        return self.proc.returncode

    def __enter__(self) -> StandinProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


ESTABLISHED = "01"


def tcp_sockets(pid: int | str = "self") -> list[tuple[int, int, str, int]]:
    """The IPv4 and IPv6 TCP sockets of a process's network namespace: (local port, remote port, state as the
    kernel's hex code, inode)."""
    out = []
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9:
                out.append((int(f[1].rsplit(":", 1)[1], 16), int(f[2].rsplit(":", 1)[1], 16), f[3], int(f[9])))
    return out


def connections_by_pid(port: int, pids: list[int]) -> dict[int, int]:
    """Established TCP connections to ``port`` held by each of ``pids`` (client sockets whose remote port it is)."""
    theirs = {inode for _, remote, state, inode in tcp_sockets() if remote == port and state == ESTABLISHED}
    if not theirs:
        return {}
    out = {}
    for pid in pids:
        n = len(socket_inodes(pid) & theirs)
        if n:
            out[pid] = n
    return out


if __name__ == "__main__":
    sys.exit(main())
