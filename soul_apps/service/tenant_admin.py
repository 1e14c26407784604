"""Removing a tenant with all its souls: each soul erased through its owner, closed everywhere, then its
directory deleted, so nothing of it stays on disk and no actor keeps a file of it open."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from actors import raycalls
from actors.routing import Routed
from soul_apps.service.idempotency import Ledger
from soul_apps.service.tenants import Scope, souls_of
from soul_runtime.memory.soul_records import remove_soul
from soul_runtime.memory.sqlite_db import postgres_url
from soul_runtime.records import LAYERS


def erase_souls(rt: Any | None, data_dir: str, tenant: str) -> list[str]:
    """Delete every soul of ``tenant`` (ids as the tenant names them). ``rt``: the runtime that may hold them
    open (None when no runtime runs on the data dir)."""
    scope = Scope(tenant)
    internal = souls_of(data_dir, tenant)
    if rt is not None:
        internal = sorted(set(internal) | {s for s in rt.souls() if scope.owns(s)})
    for sid in internal:
        if rt is not None:
            rt.soul(sid).forget()  # the owner settles the soul's last turn, then every layer is unlinked
            rt.router.run(Routed(sid, "passivate", ()), 120)
            raycalls.get([raycalls.call(rt.store(s.value, sid), "close_soul", sid) for s in LAYERS], timeout=120)
        remove_soul(data_dir, sid)  # its rows on a PostgreSQL storage's server, then its directory
    url = postgres_url()
    if url is not None or (Path(data_dir) / "service" / "idempotency.sqlite").exists():
        led = Ledger(data_dir, url)
        led.forget_prefix(scope.prefix)
        led.close()
    return scope.souls(internal)
