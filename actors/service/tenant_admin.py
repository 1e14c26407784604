"""Removing a tenant with all its souls: each soul erased through its owner, closed everywhere, then its
directory deleted, so nothing of it stays on disk and no actor keeps a file of it open."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from actors.service.idempotency import Ledger
from actors.service.tenants import Scope, souls_of
from soul_runtime.records import LAYERS

from .. import raycalls
from ..routing import Routed
from ..soul_presence import soul_dir


def erase_souls(rt: Any | None, data_dir: str, tenant: str) -> list[str]:
    """Delete every soul of ``tenant`` (ids as the tenant names them). ``rt``: the runtime that may hold them
    open (None when no runtime runs on the data dir)."""
    scope = Scope(tenant)
    internal = [p.name for p in souls_of(data_dir, tenant)]
    if rt is not None:
        internal = sorted(set(internal) | {s for s in rt.souls() if scope.owns(s)})
    for sid in internal:
        if rt is not None:
            rt.soul(sid).forget()  # the owner settles the soul's last turn, then every layer is unlinked
            rt.router.run(Routed(sid, "passivate", ()), 120)
            raycalls.get([raycalls.call(rt.store(s.value, sid), "close_soul", sid) for s in LAYERS], timeout=120)
        path = soul_dir(data_dir, sid)
        if path.exists():
            shutil.rmtree(path)
    ledger = Path(data_dir) / "service" / "idempotency.sqlite"
    if ledger.exists():
        led = Ledger(data_dir)
        led.forget_prefix(scope.prefix)
        led.close()
    return scope.souls(internal)
