"""The HTTP service's own records in a PostgreSQL storage, for every replica on every node: the idempotency
ledger's digests (``service_keys``) and versioned JSON documents such as the tenants' table (``service_docs``).
The tables are created by :mod:`soul_runtime.memory.postgres_db`'s migrations."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from soul_runtime.memory import postgres_db


class PgLedger:
    """:class:`~soul_apps.service.idempotency.Ledger`'s table on the server (the caller passes digests)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def body_for(self, soul: str, key: str) -> str | None:
        def read() -> str | None:
            with postgres_db.statement(self.url) as con:
                row = con.execute("SELECT body FROM service_keys WHERE soul = %s AND key = %s", (soul, key)).fetchone()
            return None if row is None else str(row[0])
        return postgres_db.retrying(read, self.url)

    def record(self, soul: str, key: str, body: str) -> str:
        def write() -> str:
            with postgres_db.connection(self.url) as con:
                con.execute("INSERT INTO service_keys (soul, key, body) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                            (soul, key, body))
                row = con.execute("SELECT body FROM service_keys WHERE soul = %s AND key = %s", (soul, key)).fetchone()
            return str(row[0])
        return postgres_db.retrying(write, self.url)

    def forget(self, where: str, arg: str) -> int:
        def run() -> int:
            with postgres_db.connection(self.url) as con:
                return int(con.execute(f"DELETE FROM service_keys WHERE {where}", (arg,)).rowcount)
        return postgres_db.retrying(run, self.url)


class PgDocument:
    """One JSON document with a version: read when its version changed, written under a row lock."""

    def __init__(self, url: str, name: str) -> None:
        self.url, self.name = url, name

    def version(self) -> int | None:
        def read() -> int | None:
            with postgres_db.statement(self.url) as con:
                row = con.execute("SELECT version FROM service_docs WHERE name = %s", (self.name,)).fetchone()
            return None if row is None else int(row[0])
        return postgres_db.retrying(read, self.url)

    def read(self) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            with postgres_db.statement(self.url) as con:
                row = con.execute("SELECT body FROM service_docs WHERE name = %s", (self.name,)).fetchone()
            return {} if row is None else dict(json.loads(row[0]))
        return postgres_db.retrying(run, self.url)

    def put(self, doc: dict[str, Any]) -> None:
        """Write the whole document (a new version), whatever it held: for a document one process alone writes."""
        def run() -> None:
            with postgres_db.connection(self.url) as con:
                con.execute("INSERT INTO service_docs (name, version, body) VALUES (%s, 1, %s) ON CONFLICT (name) "
                            "DO UPDATE SET version = service_docs.version + 1, body = EXCLUDED.body",
                            (self.name, json.dumps(doc, sort_keys=True)))
        postgres_db.retrying(run, self.url)

    @staticmethod
    def all_named(url: str, prefix: str) -> list[tuple[str, dict[str, Any]]]:
        """(name, document) of every document whose name starts with ``prefix``, by name."""
        def run() -> list[tuple[str, dict[str, Any]]]:
            with postgres_db.statement(url) as con:
                rows = con.execute("SELECT name, body FROM service_docs WHERE starts_with(name, %s) ORDER BY name",
                                   (prefix,)).fetchall()
            return [(str(n), dict(json.loads(b))) for n, b in rows]
        return postgres_db.retrying(run, url)

    @contextmanager
    def locked(self) -> Iterator[dict[str, Any]]:
        """The document under a row lock: what the caller leaves in the dict is written back (a new version)
        when the block ends without an error."""
        with postgres_db.connection(self.url) as con:
            con.execute("INSERT INTO service_docs (name, version, body) VALUES (%s, 0, '{}') ON CONFLICT DO NOTHING",
                        (self.name,))
            row = con.execute("SELECT version, body FROM service_docs WHERE name = %s FOR UPDATE",
                              (self.name,)).fetchone()
            doc = dict(json.loads(row[1]))
            yield doc
            con.execute("UPDATE service_docs SET version = %s, body = %s WHERE name = %s",
                        (int(row[0]) + 1, json.dumps(doc, sort_keys=True), self.name))
