"""Tenants of the HTTP service: their API keys, and the souls each of them may reach.

A tenant is a name (``[a-z0-9][a-z0-9-]{0,31}``) with one API key. The key is shown once, when the tenant is
added; the data dir keeps only its SHA-256 (``DATA_DIR/tenants.json``, mode 0600), so a copy of the data dir
does not give anyone a key. A key is 32 random bytes (``soul_`` + URL-safe base64); a presented key is hashed
and compared with every tenant's hash in constant time.

A tenant's soul ``maya`` is the runtime's soul ``TENANT:maya`` (``:`` is allowed in soul ids and never in a
tenant name, so the prefix is unambiguous). Everything shown to the tenant has the prefix taken off again
(:class:`Scope`): turn ids, sources, traces, error messages. The key table is read again whenever the file
changes, so every process that sees the data dir sees ``add``, ``revoke`` and ``remove`` at once. With a
PostgreSQL storage the table is a versioned document on the server instead of the file (every replica on every
node reads it again when its version changed).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from actors.tenant_limits import Limits, changed_limits
from actors.tenant_weights import TENANTS_FILE
from soul_runtime.errors import InvalidInput, NotFound
from soul_runtime.limits import SOUL_ID_MAX, TENANT_MAX
from soul_runtime.memory.pg_records import PgDocument
from soul_runtime.memory.postgres_db import is_postgres
from soul_runtime.memory.soul_records import soul_ids
from soul_runtime.owner_only import make_dir, write_file
from soul_runtime.text import check_id

KEY_PREFIX = "soul_"
KEY_BYTES = 32
NAME_RE = re.compile(f"^[a-z0-9][a-z0-9-]{{0,{TENANT_MAX - 1}}}$")
MAX_SOUL_ID = SOUL_ID_MAX  # the runtime's 128 characters, less the longest tenant name and the ':'


def check_tenant(name: object) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise InvalidInput(f"tenant name must be 1-32 characters of a-z, 0-9 and '-', starting with a letter or "
                           f"digit; got {name!r}")
    return name


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(KEY_BYTES)


@dataclass(frozen=True)
class Tenant:
    name: str
    key_sha256: str
    created_at: float
    revoked_at: float | None = None
    limits: Limits = Limits()

    @property
    def active(self) -> bool:
        return self.revoked_at is None

    def to_dict(self) -> dict[str, Any]:
        out = {"name": self.name, "key_sha256": self.key_sha256, "created_at": self.created_at,
               "revoked_at": self.revoked_at}
        return {**out, "limits": self.limits.to_dict()} if self.limits.to_dict() else out


class TenantTable:
    """The key table of one data dir (or, with a PostgreSQL ``storage``, of its server: ``None`` takes
    ``SOUL_STORAGE``, as ``soul`` commands do). Safe for concurrent writers (a file lock; a row lock) and for
    readers in other processes (the file is replaced atomically; readers reload it when its identity or mtime
    changes, or the document's version)."""

    def __init__(self, data_dir: str | os.PathLike[str], storage: str | None = None) -> None:
        self.path = Path(data_dir) / TENANTS_FILE
        self._seen: tuple[int, int, int] | None = None
        self._tenants: dict[str, Tenant] = {}
        self._defaults = Limits()
        url = os.environ.get("SOUL_STORAGE", "") if storage is None else storage
        self._doc = PgDocument(url, "tenants") if is_postgres(url) else None

    # ---- reading ----------------------------------------------------------------------
    def _stamp(self) -> tuple[int, int, int] | None:
        if self._doc is not None:
            version = self._doc.version()
            return None if version is None else (0, version, 0)
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _load(self) -> dict[str, Tenant]:
        stamp = self._stamp()
        if stamp is None:
            self._seen, self._tenants, self._defaults = None, {}, Limits()
            return {}
        if stamp != self._seen:
            book = _parse(self._doc.read() if self._doc is not None else json.loads(self.path.read_text()))
            self._tenants, self._defaults = book.tenants, book.defaults
            self._seen = stamp
        return self._tenants

    def tenants(self) -> list[Tenant]:
        return sorted(self._load().values(), key=lambda t: t.name)

    def get(self, name: str) -> Tenant:
        found = self._load().get(check_tenant(name))
        if found is None:
            raise NotFound(f"no tenant '{name}'")
        return found

    def authenticate(self, key: object) -> str | None:
        """The active tenant whose key this is, or None. Every tenant's hash is compared (constant time)."""
        if not isinstance(key, str) or not key:
            return None
        digest = key_hash(key)
        found = None
        for t in self._load().values():
            if hmac.compare_digest(digest, t.key_sha256) and t.active:
                found = t.name
        return found

    # ---- writing ----------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[Book]:
        if self._doc is not None:
            with self._doc.locked() as doc:
                book = _parse(doc)
                yield book
                doc.clear()
                doc.update(_document(book))
            self._seen = None
            return
        make_dir(self.path.parent)
        fd = os.open(self.path.parent / f".{TENANTS_FILE}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._seen = None
            book = Book(dict(self._load()), self._defaults)
            yield book
            write_file(self.path, json.dumps(_document(book), indent=2) + "\n")
            self._seen = None
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def add(self, name: str, *, now: float | None = None) -> str:
        """Add a tenant; returns its API key (the only time it is shown)."""
        check_tenant(name)
        key = new_key()
        with self._locked() as book:
            tenants = book.tenants
            if name in tenants:
                raise InvalidInput(f"tenant '{name}' exists already (revoke it, or remove it first)")
            tenants[name] = Tenant(name, key_hash(key), time.time() if now is None else now)
        return key

    def revoke(self, name: str, *, now: float | None = None) -> Tenant:
        """The tenant's key stops working at once; its souls stay."""
        with self._locked() as book:
            tenants = book.tenants
            t = tenants.get(check_tenant(name))
            if t is None:
                raise NotFound(f"no tenant '{name}'")
            if t.active:
                t = replace(t, revoked_at=time.time() if now is None else now)
                tenants[name] = t
        return t

    def set_limits(self, name: str | None, limits: Limits | None = None, **changes: Any) -> Limits:
        """Set a tenant's limits and weight (``name`` None: the defaults, for every tenant without a value of its
        own): ``limits`` as a whole, and/or only the ones named in ``changes`` (``None`` unsets one). Every
        replica and host sees them within about a second. The Python API of ``soul tenants set``; returns the
        record's limits as set."""
        with self._locked() as book:
            if name is None:
                book.defaults = changed_limits(book.defaults if limits is None else limits, changes)
                return book.defaults
            t = book.tenants.get(check_tenant(name))
            if t is None:
                raise NotFound(f"no tenant '{name}'")
            t = book.tenants[name] = replace(t, limits=changed_limits(t.limits if limits is None else limits, changes))
        return t.limits

    def limits(self, name: str) -> Limits:
        """A tenant's limits in force: its own, else the defaults' (for each limit and the weight)."""
        t = self._load().get(name)
        own = {} if t is None else t.limits.to_dict()
        return Limits.from_dict({**self._defaults.to_dict(), **own})

    def defaults(self) -> Limits:
        self._load()
        return self._defaults

    def remove(self, name: str) -> None:
        with self._locked() as book:
            if book.tenants.pop(check_tenant(name), None) is None:
                raise NotFound(f"no tenant '{name}'")


@dataclass
class Book:
    """The key table as read: the tenants and the default limits."""

    tenants: dict[str, Tenant]
    defaults: Limits


def _parse(raw: dict[str, Any]) -> Book:
    return Book({n: Tenant(n, t["key_sha256"], float(t["created_at"]), t.get("revoked_at"),
                           Limits.from_dict(t.get("limits") or {}))
                 for n, t in raw.get("tenants", {}).items()}, Limits.from_dict(raw.get("defaults") or {}))


def _document(book: Book) -> dict[str, Any]:
    out: dict[str, Any] = {"tenants": {n: {k: v for k, v in t.to_dict().items() if k != "name"}
                                       for n, t in sorted(book.tenants.items())}}
    return {**out, "defaults": book.defaults.to_dict()} if book.defaults.to_dict() else out


class Scope:
    """A tenant's view of soul ids: its ids in, the runtime's ids out, and the prefix taken off what it sees."""

    def __init__(self, tenant: str) -> None:
        self.tenant = check_tenant(tenant)
        self.prefix = tenant + ":"

    def soul(self, soul_id: object) -> str:
        """The runtime's id of the tenant's soul ``soul_id`` (checked by the runtime's id rules)."""
        if not isinstance(soul_id, str) or len(soul_id) > MAX_SOUL_ID:
            raise InvalidInput(f"soul id must be 1-{MAX_SOUL_ID} characters of letters, digits, '_.:@-' starting "
                               f"with a letter or digit; got {soul_id!r}"[:300])
        return self.prefix + check_id(soul_id, what="soul id")

    def owns(self, internal: str) -> bool:
        return internal.startswith(self.prefix)

    def souls(self, internal_ids: list[str]) -> list[str]:
        """The tenant's own souls among the runtime's ids, as the tenant names them."""
        return sorted(i[len(self.prefix):] for i in internal_ids if self.owns(i))

    def _pattern(self) -> re.Pattern[str]:
        return re.compile(r"(?<![A-Za-z0-9_.:@-])" + re.escape(self.prefix) + r"(?=[A-Za-z0-9])")

    def text(self, s: str) -> str:
        """``s`` with the tenant prefix taken off every id of the tenant's souls in it."""
        return self._pattern().sub("", s) if self.prefix in s else s

    def tree(self, obj: Any) -> Any:
        """A JSON-ready tree with :meth:`text` applied to every string (keys included)."""
        pat = self._pattern()
        prefix = self.prefix

        def walk(o: Any) -> Any:
            if isinstance(o, str):
                return pat.sub("", o) if prefix in o else o
            if isinstance(o, dict):
                return {walk(k): walk(v) for k, v in o.items()}
            if isinstance(o, (list, tuple)):
                return [walk(v) for v in o]
            return o
        return walk(obj)


class Whole(Scope):
    """No tenant: the runtime's own ids, as the trusted local path sees them (``soul mcp`` without ``--tenant``)."""

    def __init__(self) -> None:
        self.tenant = ""
        self.prefix = ""

    def soul(self, soul_id: object) -> str:
        return check_id(soul_id, what="soul id")

    def owns(self, internal: str) -> bool:
        return True

    def souls(self, internal_ids: list[str]) -> list[str]:
        return sorted(internal_ids)

    def text(self, s: str) -> str:
        return s

    def tree(self, obj: Any) -> Any:
        return obj


def souls_of(data_dir: str | os.PathLike[str], tenant: str) -> list[str]:
    """The runtime's ids of a tenant's souls (those with records: in the data dir, or on a PostgreSQL storage's
    server)."""
    return soul_ids(Path(data_dir), check_tenant(tenant) + ":")
