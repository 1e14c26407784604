"""A local channel: an actor's batch methods served over a Unix socket to processes on the same machine.

A Ray actor call costs ≈ 1 ms of round trip and a few hundred µs of CPU on each side; a soul host calls the
store shards twice or more per turn, one call after the other. When host and shard run on the same machine the
host sends those calls over the shard's channel instead: the same methods with the same arguments, pickled,
a round trip of tens of µs.

- The server (:class:`ChannelServer`) listens on a socket in this user's channel directory (mode 0700, so only
  this user's processes can connect; a server removes the sockets that killed processes left there) and serves
  its connections on an event loop, one call at a time per connection, with a fixed set of methods: the
  actor's own loop for an async actor (a soul host: its coroutine methods are awaited there, no thread per
  connection or call), else the process's step loop, with the actor's plain methods run on at most
  ``concurrency`` threads (a store shard). An exception a method raises is sent back: a ``SoulError`` arrives
  as itself, anything else (or an answer that cannot be pickled) as :class:`TurnFailed`, as through Ray.
- The client (:class:`ChannelClient`) keeps a pool of connections per event loop: a call takes one, writes its
  request and reads its answer on it. A method that is an async generator answers in parts: each part it
  yields goes back as soon as it is yielded (a soul host's batch of turns, each turn's answer as it is done), to
  the caller's ``parts`` callback, and the call ends when the generator does. Coroutines await :meth:`ChannelClient.call_async` (no thread); a
  blocking caller's :meth:`ChannelClient.start` runs the same call on the process's step loop and can start
  calls to several actors before waiting for any.
- A channel that breaks (the actor died or restarted, the socket went away) raises :class:`ChannelBroken`;
  the caller sends the call again the ordinary way (Ray), which waits for the restarted actor. The calls
  are idempotent (writes are keyed by turn), as for Ray's own retries.

Nothing here imports Ray; :mod:`actors.layer_shard` starts the server and :class:`ShardCalls` uses the client.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import os
import pickle
import secrets
import socket
import stat
import struct
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

from soul_runtime.errors import SoulError, TurnFailed
from soul_runtime.steps import on_pool, step_loop

from .fair_pool import TENANT

_HEAD = struct.Struct("<I")
MAX_FRAME = 256 * 1024 * 1024
MAX_CONNS = 1024
"""Connections a server serves at once (a descriptor each); more are refused."""
MAX_OPEN = 64
"""Connections a client keeps to one server; a call beyond them goes through Ray."""
PART = "part"
"""The first element of a frame that carries one part of an answer (an async generator method's yield)."""
PROBE_S = 1.0
"""How long a server removing dead sockets waits on one that may still be listened on."""


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
    """Does a server listen on ``path``? A listener whose queue is full (it does not accept: stopped, or busy) counts
    as one; the probe never waits for it."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(PROBE_S)  # a blocking connect would wait as long as that queue stays full
    try:
        probe.connect(path)
        return True
    except (BlockingIOError, TimeoutError):
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


def _frame(payload: Any) -> bytes:
    data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEAD.pack(len(data)) + data


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (n,) = _HEAD.unpack(await reader.readexactly(_HEAD.size))
    if n > MAX_FRAME:
        raise ConnectionError(f"channel frame of {n} bytes")
    return await reader.readexactly(n)


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
    connections; a coroutine method is awaited on ``loop`` (default: the process's step loop), a plain one runs
    on at most ``concurrency`` threads (the rest wait, as Ray queues calls beyond an actor's
    ``max_concurrency``). ``address`` is what a client needs: (machine, socket path). Made on ``loop``'s own
    thread (an async actor's ``__init__``), it starts serving once that thread is free."""

    def __init__(self, target: Any, methods: Sequence[str], *, max_conns: int = MAX_CONNS,
                 concurrency: int = 16, loop: asyncio.AbstractEventLoop | None = None,
                 pool: Executor | None = None, tenant: Callable[[str, tuple[Any, ...]], str] | None = None) -> None:
        """``pool``: where plain methods run (default a pool of ``concurrency`` threads); ``tenant``: the tenant of
        a call (method, args), set as :data:`~actors.fair_pool.TENANT` while it is handed to the pool (a
        :class:`~actors.fair_pool.FairPool` then serves tenants in fair order)."""
        self.target = target
        self.methods = frozenset(methods)
        self.max_conns = max_conns
        self.concurrency = max(1, concurrency)
        self._pool: Executor | None = pool
        self._tenant = tenant
        self.dir = socket_dir()  # 0700: this user's processes only
        sweep_dead(self.dir)
        self.path = os.path.join(self.dir, f"{os.getpid()}-{secrets.token_hex(4)}")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.path)
        self._sock.listen(1024)  # clients that connect before the loop serves wait in the backlog
        self._sock.setblocking(False)
        self.loop = loop or step_loop()
        self._closed = False
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.calls = 0
        if _on(self.loop):
            self._started: Any = self.loop.create_task(self._start())
        else:
            self._started = asyncio.run_coroutine_threadsafe(self._start(), self.loop)

    @property
    def address(self) -> tuple[str, str]:
        return machine_id(), self.path

    async def _start(self) -> None:
        """Serve the socket. The server is known before it is registered with the loop, so a :meth:`close` that
        comes while it starts stops it through the loop (``Server.close``); closing only the socket then would
        leave the loop's selector a registration for a closed descriptor, and a later socket given the same
        number would be taken for registered and never polled (a server that never accepts)."""
        if self._closed:
            return
        self.loop.remove_reader(self._sock.fileno())  # such a stale registration left by anyone else: not ours
        server = await asyncio.start_unix_server(self._serve, sock=self._sock, limit=MAX_FRAME, start_serving=False)
        self._server = server
        if not self._closed:
            await server.start_serving()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closed or len(self._writers) >= self.max_conns:  # its client finds it broken and uses Ray
            writer.close()
            return
        self._writers.add(writer)
        try:
            while True:
                method, args = pickle.loads(await _read_frame(reader))
                self.calls += 1
                try:
                    if method not in self.methods:
                        raise TurnFailed(f"{method!r} is not served on this channel")
                    if self._tenant is not None:
                        TENANT.set(self._tenant(method, args))  # this connection's task: its next hand-off
                    fn = getattr(self.target, method)
                    if inspect.isasyncgenfunction(fn):
                        await self._parts(fn(*args), writer)
                        answer: tuple[Any, Any] = (True, None)
                    else:
                        answer = (True, await self._call(fn, args))
                except Exception as e:  # the call's own error goes back to its caller
                    answer = (False, _as_sent(e))
                try:
                    data = _frame(answer)
                except (pickle.PicklingError, TypeError, AttributeError, struct.error) as e:  # cannot travel
                    data = _frame((False, TurnFailed(f"{method} answered what cannot be sent back: {e}")))
                writer.write(data)
                await writer.drain()
        except Exception:  # noqa: BLE001 — the client went away (or spoke garbage): drop the connection
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    @staticmethod
    async def _parts(parts: Any, writer: asyncio.StreamWriter) -> None:
        """Send each part an async generator yields as it comes (its error ends the call as its answer)."""
        try:
            async for part in parts:
                writer.write(_frame((PART, part)))
                await writer.drain()
        finally:
            await parts.aclose()

    async def _call(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        if inspect.iscoroutinefunction(fn):
            return await fn(*args)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="channel-call")
        return await on_pool(asyncio.get_running_loop(), self._pool, fn, *args)

    def _shut(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.close()  # a client waiting for an answer finds its channel broken
        self._writers.clear()
        try:
            self._sock.close()
        except OSError:
            pass

    def close(self) -> None:
        self._closed = True
        if _on(self.loop):
            self._shut()
        elif not self.loop.is_closed():
            done = concurrent.futures.Future[None]()

            def shut() -> None:
                try:
                    self._shut()
                finally:
                    done.set_result(None)
            self.loop.call_soon_threadsafe(shut)
            try:
                done.result(timeout=5)
            except concurrent.futures.TimeoutError:
                pass
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        try:
            os.unlink(self.path)
        except OSError:
            pass


def _on(loop: asyncio.AbstractEventLoop) -> bool:
    """Is ``loop`` the loop running in this thread?"""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class _Slot:
    """One call's place among a client's ``max_open``; given back once (by the call, or by a caller that gives
    up on it)."""

    __slots__ = ("client", "held")

    def __init__(self, client: ChannelClient) -> None:
        self.client, self.held = client, True

    def give_back(self) -> None:
        with self.client._lock:
            if self.held:
                self.held = False
                self.client._out -= 1


class Pending:
    """A call started by a blocking caller (:meth:`ChannelClient.start`); :meth:`result` waits for its answer
    (once). A call timed out or dropped unread gives its place up at once (its connection closes)."""

    __slots__ = ("future", "slot", "read")

    def __init__(self, future: concurrent.futures.Future[Any], slot: _Slot) -> None:
        self.future = future
        self.slot = slot
        self.read = False

    def result(self, timeout: float | None = None) -> Any:
        if self.read:
            raise RuntimeError("a channel call's answer is read once")
        self.read = True
        try:
            return self.future.result(timeout)
        except concurrent.futures.TimeoutError:  # the answer would arrive later: its connection goes, the channel stays
            self._give_up()
            raise ChannelTimeout(f"no answer within {timeout} s") from None
        except concurrent.futures.CancelledError:
            raise ChannelBroken("cancelled") from None

    def _give_up(self) -> None:
        self.future.cancel()
        self.slot.give_back()

    def __del__(self) -> None:
        if not self.read:  # never read: nobody waits for the answer
            self._give_up()


_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class ChannelClient:
    """Calls to one :class:`ChannelServer` (see the module's doc); :attr:`broken` once any call found it gone.
    At most ``max_open`` calls out at once (all loops); one beyond raises :class:`ChannelBroken` (send it the
    ordinary way) without breaking the channel."""

    def __init__(self, path: str, *, max_open: int = MAX_OPEN) -> None:
        self.path = path
        self.max_open = max_open
        self._idle: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[_Conn]] = weakref.WeakKeyDictionary()
        self._out = 0  # calls out
        # reentrant: a Pending dropped unread gives its slot back from the garbage collector, which may run in a
        # thread that holds this lock (an allocation inside close())
        self._lock = threading.RLock()
        self.broken = False

    def _reserve(self) -> _Slot:
        if self.broken:
            raise ChannelBroken(self.path)
        with self._lock:
            if self._out >= self.max_open:  # this call goes the ordinary way; the channel stays
                raise ChannelBroken(f"{self.path}: {self.max_open} calls out")
            self._out += 1
        return _Slot(self)

    def start(self, method: str, *args: Any) -> Pending:
        """Send a call from a blocking caller; raises :class:`ChannelBroken` if it cannot go (send it the
        ordinary way)."""
        slot = self._reserve()
        try:
            data = _frame((method, args))
        except Exception as e:  # noqa: BLE001 — a request the channel cannot carry: the ordinary way reports it
            slot.give_back()
            raise ChannelBroken(f"cannot send: {e}") from None
        return Pending(asyncio.run_coroutine_threadsafe(self._exchange(data, slot), step_loop()), slot)

    def call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        return self.start(method, *args).result(timeout)

    async def call_async(self, method: str, *args: Any, parts: Callable[[Any], None] | None = None) -> Any:
        """The call from a coroutine of any loop (its connections are that loop's). ``parts``: told each part of
        the answer of an async generator method as it arrives (the call's own answer is then None)."""
        slot = self._reserve()
        try:
            data = _frame((method, args))
        except Exception as e:  # noqa: BLE001
            slot.give_back()
            raise ChannelBroken(f"cannot send: {e}") from None
        return await self._exchange(data, slot, parts)

    async def _exchange(self, data: bytes, slot: _Slot, parts: Callable[[Any], None] | None = None) -> Any:
        """Send one reserved call's frame and read its answer, its parts to ``parts`` as they come (the
        reservation ends here)."""
        loop = asyncio.get_running_loop()
        conn: _Conn | None = None
        try:
            idle = self._idle.setdefault(loop, [])
            try:
                conn = idle.pop() if idle else await asyncio.open_unix_connection(self.path, limit=MAX_FRAME)
                conn[1].write(data)
                await conn[1].drain()
                frame = await _read_frame(conn[0])
                while parts is not None:  # an answer in parts: each as it comes, up to the last frame
                    kind, value = pickle.loads(frame)  # cannot be loaded: as a bad frame
                    if kind != PART:
                        break
                    parts(value)
                    frame = await _read_frame(conn[0])
            except asyncio.CancelledError:  # timed out or given up: the answer would arrive on it later
                if conn is not None:
                    conn[1].close()
                raise
            except Exception as e:  # noqa: BLE001 — closed, reset, a bad frame: the actor is gone or restarting
                if conn is not None:
                    conn[1].close()
                self._break()
                raise ChannelBroken(str(e) or type(e).__name__) from None
            if self.broken:
                conn[1].close()
            else:
                idle.append(conn)  # the whole frame was read: the connection is clean whatever it holds
        finally:
            slot.give_back()
        try:
            ok, value = pickle.loads(frame)
        except Exception as e:  # noqa: BLE001 — an answer this process cannot load (a class it lacks)
            raise TurnFailed(f"remote call's answer cannot be read here: {type(e).__name__}: {e}") from None
        if not ok:  # the call's own error: ours as itself, anything else as a Ray call would report it
            if isinstance(value, SoulError):
                raise value
            raise TurnFailed(f"remote call failed: {type(value).__name__}: {value}")
        return value

    def _break(self) -> None:
        self.broken = True
        self.close()

    def close(self) -> None:
        """Close the idle connections (of every loop; from that loop's thread or any other)."""
        with self._lock:
            pools = list(self._idle.items())
            self._idle = weakref.WeakKeyDictionary()
        for loop, conns in pools:
            for _, w in conns:
                try:
                    if _on(loop):
                        w.close()
                    elif not loop.is_closed():
                        loop.call_soon_threadsafe(w.close)
                except RuntimeError:  # its loop closed meanwhile: the socket goes with the transport
                    pass


class ChannelBook:
    """Clients of named actors' channels. Each actor is asked for its address (``ask(handle)``: None, or an
    exception, when it has none) the first time; again ``reask_s`` after its channel broke (it restarted), and
    ``reask_none_s`` after it had none reachable from here (another machine). Only one caller asks at a time
    for an actor, and never while holding up another actor's callers; the others go the ordinary way meanwhile."""

    def __init__(self, ask: Callable[[Any], Any], *, enabled: bool = True, reask_s: float = 1.0,
                 reask_none_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.ask = ask
        self.enabled = enabled
        self.reask_s = reask_s
        self.reask_none_s = reask_none_s
        self.clock = clock
        self._clients: dict[str, ChannelClient | None] = {}
        self._next_ask: dict[str, float] = {}
        self._asking: set[str] = set()
        self._lock = threading.Lock()

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

    async def call_async(self, name: str, handle: Any, method: str, *args: Any,
                         parts: Callable[[Any], None] | None = None) -> Any:
        """``method(*args)`` over the actor's channel, from a coroutine (``parts``: see
        :meth:`ChannelClient.call_async`). Raises :class:`ChannelBroken` when there
        is no channel (or it broke, or it has as many calls out as it takes): send it the ordinary way. Asking an
        actor for its address (first contact, or after a break) runs on a thread; calls do not."""
        ch = self.known(name)
        if ch is None:
            with self._lock:
                due = self._due(name)
            if not due:  # none here, and not to be asked yet: no thread hop
                raise ChannelBroken(f"{name} has no channel here")
            ch = await asyncio.get_running_loop().run_in_executor(None, self.client, name, handle)
            if ch is None:
                raise ChannelBroken(f"{name} has no channel here")
        return await ch.call_async(method, *args, parts=parts)


def connect(address: Any) -> ChannelClient | None:
    """A client for a server's ``address``, or None when it is not reachable from here (another machine, no
    server, no socket)."""
    if not (isinstance(address, (tuple, list)) and len(address) == 2):
        return None
    machine, path = address
    if machine != machine_id() or not isinstance(path, str) or not os.path.exists(path):
        return None
    return ChannelClient(path)
