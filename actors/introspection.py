"""Every soul-runtime actor's base class, :class:`ActorBase`: its lifecycle, with pykka-style hooks, and what it
answers about itself (for tests, operators and fault injection).

The lifecycle of every actor (soul hosts, dedicated soul actors, store shards; the controller keeps the same
contract with nothing to stop):

- **start**: ``__init__`` takes the runtime's configuration and sets the actor's state, then calls
  :meth:`ActorBase.start`: its local channel is served (:meth:`ActorBase.serve_channel`), then the subclass's
  :meth:`ActorBase.on_start` starts what runs beside its calls (a ticker for idle passivation or retention
  sweeps). No soul is opened until a call asks for it.
- **calls**: every call on the turn path is idempotent (keyed by its request id or turn), so a caller may send
  it again after a failure, through Ray or a channel.
- **stop**: :meth:`ActorBase.stop`, called once at shutdown (``Runtime.shutdown_actors``, ``soul down``),
  closes the channel (callers go through Ray meanwhile), then the subclass's :meth:`ActorBase.on_stop` stops
  its ticker, closes every open soul or store (its last memory work lands, its vector index is saved) and
  waits for its closing thread. The actor is then killed; nothing acknowledged depends on a stop having run.
- **failure**: a crashed actor is restarted by Ray with nothing in memory. What was acknowledged is on disk
  (buffer checkpoints, write intents, the layers' files); the restarted actor reads it on a soul's next call,
  fencing the old activation out, and callers retry with the same request ids.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from . import raycalls
from .channel import ChannelServer
from .metrics import Metrics

ASK_TIMEOUT_S = 2.0
"""How long a caller waits for an actor to say where its channel is (meanwhile, and if it does not answer in
time, calls go through Ray, which waits for a restarting actor properly)."""


class ActorBase:
    """Every actor's base: :meth:`start` and :meth:`stop` run the lifecycle (see the module's doc), a subclass
    fills in :meth:`on_start` and :meth:`on_stop`; the other methods are what every actor answers about itself."""

    metrics: Metrics
    channel: ChannelServer | None = None
    """The actor's local channel (:mod:`actors.channel`), if it serves one."""

    def start(self, channel_methods: tuple[str, ...] = (), channel_concurrency: int = 0, **channel: Any) -> None:
        """The end of a subclass's ``__init__``: serve ``channel_methods`` on a local channel (see
        :meth:`serve_channel`; ``channel``: its ``pool`` and ``tenant``), then :meth:`on_start`."""
        self.serve_channel(channel_methods, channel_concurrency, **channel)
        self.on_start()

    def on_start(self) -> None:
        """Start what runs beside the calls (a ticker); the actor's state is set and its channel served."""

    def stop(self) -> Any:
        """Close the local channel, then :meth:`on_stop`; returns what it returns (how many souls or stores were
        closed; a coroutine when ``on_stop`` is one: an async actor awaits it in its own ``async def stop``)."""
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        return self.on_stop()

    def on_stop(self) -> Any:
        """Stop what :meth:`on_start` started and close every open soul or store; returns how many."""
        return 0

    def serve_channel(self, methods: tuple[str, ...], concurrency: int, **channel: Any) -> None:
        """Serve ``methods`` on a local channel too (0: no channel), when running as an actor (not as the plain
        class): an async actor's on its own event loop (its coroutine methods awaited there), a threaded actor's
        with at most ``concurrency`` calls at once."""
        if concurrency > 0 and raycalls.current_actor() is not None:
            try:
                loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            try:
                self.channel = ChannelServer(self, methods, concurrency=concurrency, loop=loop, **channel)
            except (OSError, AttributeError) as e:  # no Unix sockets here: Ray only
                logging.getLogger(__name__).warning("no local channel (%s): calls go through Ray", e)

    def channel_counts(self) -> dict[str, int]:
        """Calls served on the local channel (``channel_calls``), if it has one."""
        return {"channel_calls": self.channel.calls} if self.channel is not None else {}

    def channel_address(self) -> tuple[str, str] | None:
        """Where this actor's local channel listens (None: it has none)."""
        return self.channel.address if self.channel is not None else None

    def pid(self) -> int:
        return os.getpid()

    def where(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "node": raycalls.node_id()}

    def metrics_snapshot(self) -> dict[str, int]:
        """What this actor counted (also exported through ray.util.metrics)."""
        return dict(self.metrics.local)


def channel_address(handle: Any) -> Any:
    """Ask an actor where its local channel listens (None: it has none)."""
    return raycalls.get(raycalls.call(handle, "channel_address"), timeout=ASK_TIMEOUT_S)
