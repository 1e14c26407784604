"""The service's ASGI app as one replica builds it: the JSON API, ``/mcp/``, the inspector's pages at ``/ui/``, and the
runtime it talks to."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI

from soul_runtime.config import SoulConfig

from .body_limit import BodyLimit
from .context_api import add_context_route
from .cors import add_cors
from .http_api import Backend, build_app
from .inspector import mount_inspector
from .mcp_tools import build_mcp, http_endpoint, http_resolver
from .souls_api import TenantSouls


def build_service(data_dir: str, namespace: str = "souls", address: str = "auto", storage: str = "local",
                  embedder: str | None = None, cors_origins: tuple[str, ...] = (), inspector: bool = True,
                  replicas: int = 1, tenant_limits: dict[str, Any] | None = None) -> FastAPI:
    """The app of one replica. The runtime is reached with ``connect(address)`` on first use (``"auto"``: the
    Ray cluster the replica runs in); ``storage`` and ``embedder`` as the data dir was first served with;
    ``cors_origins``: the other origins whose pages may call it from a browser (:mod:`.cors`; none by default);
    ``inspector``: serve the inspector's pages at ``/ui/`` (:mod:`.inspector`; without, ``/ui/`` is a 404);
    ``replicas``: how many replicas share the tenants' per-replica limits; ``tenant_limits``: the service config's
    limits of tenants that set none (:mod:`.quotas`)."""

    def connect() -> Any:
        from actors.runtime import connect as connect_runtime
        chosen: dict[str, Any] = {} if embedder is None else {"embedder": embedder}  # None: SOUL_EMBEDDER or default
        return connect_runtime(address, data_dir=data_dir, namespace=namespace, storage=storage, limits=False,
                               **chosen)  # the service limits its turns itself (Backend.quotas)

    backend = Backend(data_dir, connect, storage, replicas=replicas, tenant_limits=tenant_limits)

    async def souls_for(tenant: str) -> TenantSouls:
        rt = await backend.runtime()
        return TenantSouls(rt, tenant, backend.ledger, souls=rt.souls)

    mcp = build_mcp(http_resolver(backend.tenant_of, souls_for), data_dir)
    mcp_app, manager = http_endpoint(mcp, backend.tenant_of)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with manager.run():
            yield

    app = build_app(backend, mcp_app, lifespan)
    add_context_route(app, backend)
    # a body larger than the runtime's longest message could need: 413 naming the limit (body_limit)
    chars = SoulConfig().turn.max_text_chars  # the runtime's message limit, as this replica connects with it
    app.add_middleware(BodyLimit, max_text_chars=lambda: chars)
    add_cors(app, cors_origins)  # outermost: its headers on every answer, the body limit's 413 too
    return mount_inspector(app) if inspector else app
