"""Each tenant's weight in the hosts' fair order, as the service's tenant table sets it (``soul tenants set NAME
--weight W``; :class:`soul_apps.service.tenants.TenantTable` writes the table, a file in the data dir or a
document on a PostgreSQL storage's server). The hosts only read it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from soul_runtime.memory.pg_records import PgDocument
from soul_runtime.memory.postgres_db import is_postgres

TENANTS_FILE = "tenants.json"
"""The tenant table's file in a data dir (SQLite storage)."""


def weights_of(doc: dict[str, Any]) -> dict[str, float]:
    """Each tenant's weight in a tenant table's document: its own, else the defaults', else 1."""
    default = float((doc.get("defaults") or {}).get("weight", 1.0))
    return {str(name): float(((t or {}).get("limits") or {}).get("weight", default))
            for name, t in (doc.get("tenants") or {}).items()}


class TableReader:
    """The tenant table's document (the data dir's file, or the document on a PostgreSQL ``storage``'s server;
    ``None`` takes ``SOUL_STORAGE``), read again at most every ``every_s``."""

    def __init__(self, data_dir: str | os.PathLike[str], storage: str | None, every_s: float = 1.0) -> None:
        url = os.environ.get("SOUL_STORAGE", "") if storage is None else storage
        self._doc = PgDocument(url, "tenants") if is_postgres(url) else None
        self.path = Path(data_dir) / TENANTS_FILE
        self.every_s = every_s
        self._read_at = -every_s

    def _read(self) -> dict[str, Any]:
        if self._doc is not None:
            return self._doc.read() or {}
        try:
            return dict(json.loads(self.path.read_text()))
        except FileNotFoundError:
            return {}

    def due(self) -> dict[str, Any] | None:
        """The document, when it is due to be read again; else None, and None when it cannot be read (a table
        being written, a server away): the caller goes on with what it read last."""
        now = time.monotonic()
        if now - self._read_at < self.every_s:
            return None
        self._read_at = now
        try:
            return self._read()
        except Exception:  # noqa: BLE001 — see above
            return None


class TenantWeights:
    """Each tenant's weight, read from the tenant table at most every ``every_s``; 1 for souls of no tenant, for
    a tenant the table does not name, and when the table cannot be read."""

    def __init__(self, data_dir: str | os.PathLike[str], storage: str | None, every_s: float = 1.0) -> None:
        self._table = TableReader(data_dir, storage, every_s)
        self._weights: dict[str, float] = {}

    def __call__(self, tenant: str) -> float:
        if not tenant:
            return 1.0
        doc = self._table.due()
        if doc is not None:
            try:
                self._weights = weights_of(doc)
            except (TypeError, ValueError, AttributeError):  # a table written by hand wrong: the weights known
                pass
        return self._weights.get(tenant, 1.0)
