"""A local channel: an actor's batch methods served over a Unix socket to processes on the same machine.

A Ray actor call costs ≈ 1 ms of round trip and a few hundred µs of CPU on each side; a soul host calls the
store shards twice or more per turn, one call after the other. When host and shard run on the same machine the
host sends those calls over the shard's channel instead: the same methods with the same arguments, pickled,
a round trip of tens of µs.

- The server (:class:`ChannelServer`) listens on a socket in this user's channel directory (mode 0700, so only
  this user's processes can connect; a server removes the sockets that killed processes left there) and serves each connection on a thread of its own, one call at a time, with
  a fixed set of methods. An exception a method raises is sent back: a ``SoulError`` arrives as itself,
  anything else (or an answer that cannot be pickled) as :class:`TurnFailed`, as through Ray.
- The client (:class:`ChannelClient`) keeps a pool of connections: a call takes one, writes its request and
  later reads its answer on it (so a caller can start calls to several shards before waiting for any).
- A channel that breaks (the actor died or restarted, the socket went away) raises :class:`ChannelBroken`;
  the caller sends the call again the ordinary way (Ray), which waits for the restarted actor. The calls
  are idempotent (writes are keyed by turn), as for Ray's own retries.

Nothing here imports Ray; :mod:`actors.layer_shard` starts the server and :class:`ShardCalls` uses the client.
"""

from __future__ import annotations

import os
import pickle
import secrets
import socket
import stat
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from soul_runtime.errors import SoulError, TurnFailed

_HEAD = struct.Struct("<I")
MAX_FRAME = 256 * 1024 * 1024
MAX_CONNS = 64
"""Connections a server serves at once (one thread and one descriptor each); more are refused."""
MAX_OPEN = 4
"""Connections a client keeps to one server; a call beyond them goes through Ray."""
WAIT_THREADS = 16
"""Threads a process's coroutines wait on for channel answers; a call beyond them goes through Ray."""


class ChannelBroken(Exception):
    """The channel cannot carry this call (send it the ordinary way); never reaches a user."""


class ChannelTimeout(Exception):
    """No answer within the caller's time (the call may still run; the connection is dropped)."""


def machine_id() -> str:
    """This machine (a channel's socket is only reachable from the machine it was created on)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def socket_dir() -> str:
    """The directory of this user's channel sockets: ``soul-channels-UID`` in the temp dir, mode 0700 (only this
    user's processes can connect); a private fresh one if that name is taken by anything else."""
    base = os.path.join(tempfile.gettempdir(), f"soul-channels-{os.getuid()}")
    try:
        os.mkdir(base, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(base)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) != 0o700:
        return tempfile.mkdtemp(prefix="soul-ch-")
    return base


def _answers(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


def sweep_dead(directory: str) -> int:
    """Remove the sockets of processes that are gone (a killed actor leaves its socket behind)."""
    n = 0
    for name in os.listdir(directory):
        pid = name.split("-", 1)[0]
        if not pid.isdigit():
            continue
        path = os.path.join(directory, name)
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            if _answers(path):  # a live server after all (a process of another pid namespace)
                continue
            try:
                os.unlink(path)
                n += 1
            except OSError:
                pass
        except OSError:  # alive (another user's pid: not ours to judge)
            pass
    return n


def _send(sock: socket.socket, payload: Any) -> None:
    data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_HEAD.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionError("channel closed")
        buf += chunk
    return bytes(buf)


def _recv_frame(sock: socket.socket) -> bytes:
    (n,) = _HEAD.unpack(_recv_exact(sock, _HEAD.size))
    if n > MAX_FRAME:
        raise ConnectionError(f"channel frame of {n} bytes")
    return _recv_exact(sock, n)


def travels(value: Any) -> bool:
    """Does ``value`` survive a trip to another process (pickled, and loaded again)?"""
    try:
        pickle.loads(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
        return True
    except Exception:  # noqa: BLE001 — any failure means no
        return False


def _as_sent(e: Exception) -> Exception:
    """An error as it travels back: a SoulError as itself if it survives the trip, anything else (or a
    SoulError that would not load again) as TurnFailed, as through Ray."""
    if isinstance(e, SoulError) and travels(e):
        return e
    return TurnFailed(f"remote call failed: {type(e).__name__}: {e}")


class ChannelServer:
    """Serves ``methods`` of ``target`` on a Unix socket (see the module's doc): at most ``max_conns``
    connections, and at most ``concurrency`` calls running at once (the rest wait, as Ray queues calls beyond
    an actor's ``max_concurrency``). ``address`` is what a client needs: (machine, socket path)."""

    def __init__(self, target: Any, methods: Sequence[str], *, max_conns: int = MAX_CONNS,
                 concurrency: int = MAX_CONNS) -> None:
        self.target = target
        self.methods = frozenset(methods)
        self.max_conns = max_conns
        self._running = threading.BoundedSemaphore(max(1, concurrency))
        self.dir = socket_dir()  # 0700: this user's processes only
        sweep_dead(self.dir)
        self.path = os.path.join(self.dir, f"{os.getpid()}-{secrets.token_hex(4)}")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.path)
        self._sock.listen(256)
        self._closed = False
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.calls = 0
        threading.Thread(target=self._accept, name="channel-accept", daemon=True).start()

    @property
    def address(self) -> tuple[str, str]:
        return machine_id(), self.path

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                full = self._closed or len(self._conns) >= self.max_conns
                if not full:
                    self._conns.add(conn)
            if full:  # its client finds the channel broken and uses Ray (fds stay bounded)
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), name="channel-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            while True:
                method, args = pickle.loads(_recv_frame(conn))
                with self._lock:
                    self.calls += 1
                try:
                    if method not in self.methods:
                        raise TurnFailed(f"{method!r} is not served on this channel")
                    with self._running:
                        answer: tuple[bool, Any] = (True, getattr(self.target, method)(*args))
                except Exception as e:  # the call's own error goes back to its caller
                    answer = (False, _as_sent(e))
                try:
                    _send(conn, answer)
                except (pickle.PicklingError, TypeError, AttributeError, struct.error) as e:  # cannot travel
                    _send(conn, (False, TurnFailed(f"{method} answered what cannot be sent back: {e}")))
        except Exception:  # noqa: BLE001 — the client went away (or spoke garbage): drop the connection
            pass
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._conns = list(self._conns), set()
        for c in [self._sock, *conns]:
            try:
                c.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked on it
            except OSError:
                pass
            c.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


class Pending:
    """A call sent on a connection; :meth:`result` reads its answer (once). A call dropped unread gives its
    connection up (the answer would arrive on it later)."""

    __slots__ = ("client", "conn")

    def __init__(self, client: ChannelClient, conn: socket.socket) -> None:
        self.client: ChannelClient | None = client
        self.conn = conn

    def result(self, timeout: float | None = None) -> Any:
        client, self.client = self.client, None
        if client is None:
            raise RuntimeError("a channel call's answer is read once")
        try:
            if timeout is not None:
                self.conn.settimeout(timeout)
            frame = _recv_frame(self.conn)
            if timeout is not None:
                self.conn.settimeout(None)
        except TimeoutError:  # the answer would arrive on this connection later: it goes, the channel stays
            client._drop(self.conn)
            raise ChannelTimeout(f"no answer within {timeout} s") from None
        except Exception as e:  # noqa: BLE001 — closed, reset, a bad frame: the actor is gone or restarting
            client._broken(self.conn)
            raise ChannelBroken(str(e)) from None
        client._release(self.conn)  # the whole frame was read: the connection is clean whatever it holds
        try:
            ok, value = pickle.loads(frame)
        except Exception as e:  # noqa: BLE001 — an answer this process cannot load (a class it lacks)
            raise TurnFailed(f"remote call's answer cannot be read here: {type(e).__name__}: {e}") from None
        if not ok:  # the call's own error: ours as itself, anything else as a Ray call would report it
            if isinstance(value, SoulError):
                raise value
            raise TurnFailed(f"remote call failed: {type(value).__name__}: {value}")
        return value

    def __del__(self) -> None:
        client = self.client
        if client is not None:  # never read: the connection cannot carry another call
            self.client = None
            client._drop(self.conn)


class ChannelClient:
    """Calls to one :class:`ChannelServer` (see the module's doc); :attr:`broken` once any call found it gone."""

    def __init__(self, path: str, *, max_open: int = MAX_OPEN) -> None:
        self.path = path
        self.max_open = max_open
        self._idle: list[socket.socket] = []
        self._open = 0  # connections, idle or carrying a call
        self._lock = threading.Lock()
        self.broken = False

    def start(self, method: str, *args: Any) -> Pending:
        """Send a call; raises :class:`ChannelBroken` if it could not be sent (send it the ordinary way)."""
        if self.broken:
            raise ChannelBroken(self.path)
        with self._lock:
            conn = self._idle.pop() if self._idle else None
            if conn is None:
                if self._open >= self.max_open:  # this call goes the ordinary way; the channel stays
                    raise ChannelBroken(f"{self.path}: {self.max_open} calls out")
                self._open += 1
        try:
            data = pickle.dumps((method, args), protocol=pickle.HIGHEST_PROTOCOL)
            head = _HEAD.pack(len(data))
        except Exception as e:  # noqa: BLE001 — a request the channel cannot carry: the ordinary way reports it
            if conn is None:
                with self._lock:
                    self._open -= 1
            else:
                self._release(conn)
            raise ChannelBroken(f"cannot send: {e}") from None
        try:
            if conn is None:
                conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                conn.connect(self.path)
            conn.sendall(head + data)
        except OSError as e:
            self._broken(conn)
            raise ChannelBroken(str(e)) from None
        return Pending(self, conn)

    def call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        return self.start(method, *args).result(timeout)

    def _release(self, conn: socket.socket) -> None:
        with self._lock:
            if not self.broken:
                self._idle.append(conn)
                return
            self._open -= 1
        conn.close()

    def _drop(self, conn: socket.socket) -> None:
        with self._lock:
            self._open -= 1
        conn.close()

    def _broken(self, conn: socket.socket | None) -> None:
        self.broken = True
        with self._lock:
            self._open -= 1
        if conn is not None:
            conn.close()
        self.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
            self._open -= len(idle)
        for c in idle:
            c.close()


class ChannelBook:
    """Clients of named actors' channels. Each actor is asked for its address (``ask(handle)``: None, or an
    exception, when it has none) the first time; again ``reask_s`` after its channel broke (it restarted), and
    ``reask_none_s`` after it had none reachable from here (another machine). Only one thread asks at a time
    for an actor, and never while holding up another actor's callers; the others go the ordinary way meanwhile."""

    def __init__(self, ask: Callable[[Any], Any], *, enabled: bool = True, reask_s: float = 1.0,
                 reask_none_s: float = 60.0, threads: int = WAIT_THREADS, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.ask = ask
        self.enabled = enabled
        self.reask_s = reask_s
        self.reask_none_s = reask_none_s
        self.threads = threads
        self.clock = clock
        self._clients: dict[str, ChannelClient | None] = {}
        self._next_ask: dict[str, float] = {}
        self._asking: set[str] = set()
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._busy = 0  # pool threads waiting for an answer

    def _due(self, name: str) -> bool:
        """May the actor be asked for its address now (enabled, nobody asking, its next ask reached)?"""
        return self.enabled and name not in self._asking and self.clock() >= self._next_ask.get(name, -1e18)

    def known(self, name: str) -> ChannelClient | None:
        """The actor's channel if it is known and whole (never blocks)."""
        ch = self._clients.get(name)
        return ch if ch is not None and not ch.broken else None

    def client(self, name: str, handle: Any) -> ChannelClient | None:
        """The actor's channel, asking the actor for it if that is due (blocks for that one call)."""
        ch = self.known(name)
        if ch is not None or not self.enabled:
            return ch
        with self._lock:
            if not self._due(name):
                return None
            self._asking.add(name)
        try:
            try:
                found = connect(self.ask(handle))
            except Exception:  # noqa: BLE001 — not up (yet), or an actor without a channel: the ordinary way
                found = None
            old = self._clients.get(name)
            with self._lock:
                self._clients[name] = found
                self._next_ask[name] = self.clock() + (self.reask_s if found is not None or old is not None
                                                       else self.reask_none_s)
            if old is not None and old is not found:
                old.close()
            return found
        finally:
            with self._lock:
                self._asking.discard(name)

    def forget(self, name: str) -> None:
        """Drop what is known of an actor that has gone (a dedicated actor): its idle connections close."""
        with self._lock:
            ch = self._clients.pop(name, None)
            self._next_ask.pop(name, None)
        if ch is not None:
            ch.close()

    async def call_async(self, name: str, handle: Any, method: str, *args: Any) -> Any:
        """``method(*args)`` over the actor's channel, from a coroutine: the wait runs on one of the book's
        ``threads``. Raises :class:`ChannelBroken` when there is no channel (or it broke, or every thread is
        waiting already): send it the ordinary way."""
        import asyncio
        loop = asyncio.get_running_loop()
        known = self.known(name)
        with self._lock:
            if known is None and not self._due(name):  # none here, and not to be asked yet: no thread hop
                raise ChannelBroken(f"{name} has no channel here")
            if self._busy >= self.threads:
                raise ChannelBroken(f"{self.threads} channel calls out")
            self._busy += 1
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="channel-wait")
            pool = self._pool
        try:
            ch = known or await loop.run_in_executor(pool, self.client, name, handle)
            if ch is None:
                raise ChannelBroken(f"{name} has no channel here")
            return await loop.run_in_executor(pool, partial(ch.call, method, *args))
        finally:
            with self._lock:
                self._busy -= 1


def connect(address: Any) -> ChannelClient | None:
    """A client for a server's ``address``, or None when it is not reachable from here (another machine, no
    server, no socket)."""
    if not (isinstance(address, (tuple, list)) and len(address) == 2):
        return None
    machine, path = address
    if machine != machine_id() or not isinstance(path, str) or not os.path.exists(path):
        return None
    return ChannelClient(path)
