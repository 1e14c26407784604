"""A host's side of the store shards: where a soul's layer lives, and its calls batched across the host's souls."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from soul_runtime import telemetry
from soul_runtime.batching import AsyncBatcher

from . import raycalls
from .channel import ChannelBook
from .fair_pool import tenant_of
from .handles import ActorHandles
from .introspection import channel_address
from .placement import store_name, store_of
from .settings import RuntimeConfig
from .transport import DirectTransport, Reply, Transport

SHARD_CHANNEL_METHODS = ("recall_batch", "apply_batch")
"""What a store shard serves on its local channel (:meth:`actors.layer_shard.LayerShard.serve_channel`)."""
SPAN_NAMES = {"recall_batch": "recall", "apply_batch": "write"}


class StoreLocator:
    """Handles of the store shards, by layer and soul (light: no memory engine, for drivers too)."""

    def __init__(self, cfg: RuntimeConfig) -> None:
        self.cfg = cfg
        self.handles = ActorHandles(cfg.namespace)

    def name(self, layer: str, soul_id: str) -> str:
        return store_of(soul_id, layer, self.cfg.shards(layer))

    def handle(self, layer: str, soul_id: str) -> Any:
        return self.handles.get(self.name(layer, soul_id))


def _resolve(reply: Reply) -> Any:
    """A batch's answer, with Ray's errors as the project's own."""
    try:
        return reply.result()
    except Exception as e:  # noqa: BLE001 — translated, raised to the batch's callers
        raise raycalls.translate(e) from None


def results(replies: Sequence[Any], read: Callable[[Any], Any] = _resolve) -> list[Any]:
    """Every reply's answer (``read(reply)``), each read even when one fails — a batch's answer left unread
    would hold its channel connection; the first error is raised (as the project's own)."""
    out, error = [], None
    for r in replies:
        try:
            out.append(read(r))
        except BaseException as e:  # noqa: BLE001 — raised after the others are read
            error = error or e
    if error is not None:
        raise error
    return out


class ShardCalls:
    """A host's calls to the store shards, batched across its souls: the recalls (or writes) its turns send to
    one shard while its event loop runs one round go as one ``recall_batch`` (``apply_batch``) call
    (:class:`~soul_runtime.batching.AsyncBatcher`); at most ``max_calls`` calls per shard and method are out at
    a time, and what arrives meanwhile goes in the next one, so batches grow with the load. Each tenant's souls
    (:func:`~actors.fair_pool.tenant_of`) have batches and calls of their own: a flood of one tenant's recalls does
    not hold another's back. A turn waiting for its answer holds no thread.

    ``channels``: a shard on this machine is called over its local channel (:mod:`actors.channel`) rather than
    through Ray; one whose channel broke is asked for its address again at most once a second. ``transport``:
    how the calls travel (default: that; :class:`~actors.transport.DirectTransport` in tests)."""

    def __init__(self, stores: StoreLocator, *, max_batch: int = 64, max_calls: int = 2, channels: bool = False,
                 transport: Transport | DirectTransport | None = None) -> None:
        self.stores = stores
        self.max_batch = max_batch
        self.max_calls = max_calls
        self._batchers: dict[tuple[str, str, str], AsyncBatcher[Any, Any]] = {}
        self.transport = transport if transport is not None else \
            Transport(ChannelBook(channel_address, enabled=channels), SHARD_CHANNEL_METHODS)

    def counts(self) -> dict[str, int]:
        """Calls sent and items they carried, per method (``recall_batch``, ``apply_batch``), and how many of
        the calls went on a local channel."""
        out: dict[str, int] = {}
        for (_, method, _), b in list(self._batchers.items()):
            out[f"shard_calls:{method}"] = out.get(f"shard_calls:{method}", 0) + b.calls
            out[f"shard_items:{method}"] = out.get(f"shard_items:{method}", 0) + b.items
        for method, n in list(self.transport.channel_calls.items()):
            out[f"shard_channel_calls:{method}"] = n
        return out

    def send(self, layer: str, soul_id: str, method: str, *args: Any) -> Reply:
        """One call to the shard holding the soul's layer, alone (not batched; a blocking caller's)."""
        return self.transport.send(self.stores.name(layer, soul_id), self.stores.handle(layer, soul_id), method,
                                   *args)

    async def call(self, layer: str, soul_id: str, method: str, item: tuple[Any, ...]) -> Any:
        """``item``'s answer from the shard holding the soul's layer (``method`` is ``recall_batch`` or
        ``apply_batch``), in a batch with the other items sent to it meanwhile. When traces are on the call is a
        span (``recall LAYER`` / ``write LAYER``) and the item carries its context to the shard (a trailing
        element)."""
        if telemetry.tracer() is None:
            return await self._call(layer, soul_id, method, item)
        name = self.stores.name(layer, soul_id)
        with telemetry.span(f"{SPAN_NAMES.get(method, method)} {layer}", kind="client",
                            attributes={"soul.id": soul_id, "soul.layer": layer, "soul.shard": name,
                                        "rpc.method": method}):
            return await self._call(layer, soul_id, method, (*item, telemetry.carrier()))

    async def _call(self, layer: str, soul_id: str, method: str, item: tuple[Any, ...]) -> Any:
        name = self.stores.name(layer, soul_id)
        key = (name, method, tenant_of(soul_id))  # each tenant's items in calls of their own (fair order)
        b = self._batchers.get(key)
        if b is None:
            async def send(items: list[Any], _layer: str = layer, _soul: str = soul_id, _m: str = method,
                           _name: str = name) -> Any:
                try:
                    return await self.transport.send_async(_name, self.stores.handle(_layer, _soul), _m, items)
                except Exception as e:  # noqa: BLE001 — translated, raised to the batch's callers
                    raise raycalls.translate(e) from None
            b = self._batchers[key] = AsyncBatcher(send, max_batch=self.max_batch,
                                                              max_calls=self.max_calls)
        return await b.submit(item)


__all__ = ["SHARD_CHANNEL_METHODS", "ShardCalls", "StoreLocator", "results", "store_name"]
