"""``soul storage migrate``: a data dir's SQLite records moved into PostgreSQL."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from soul_runtime.errors import InvalidInput
from soul_runtime.storage_modes import POSTGRES

if TYPE_CHECKING:
    from soul_apps.cli.context import Ctx

MIGRATE_HELP = """Move the data dir's souls (SQLite files) into a PostgreSQL server: every soul database's rows
go to the server in one transaction each, and the files stay as this node's caches of them. Stop the runtime
serving the data dir first (`soul down`). Run again after an interruption: what the server holds already is
kept. Then serve with `--storage URL` (or SOUL_STORAGE=URL): every node of a cluster uses the server, each with a
data dir (cache) on its own disk; docs/deploying.md."""


def cmd_storage(ctx: Ctx) -> int:
    from soul_runtime.memory.pg_move import move
    a = ctx.args
    url = a.to or os.environ.get("SOUL_STORAGE", "")
    if not url.startswith(POSTGRES):
        raise InvalidInput("soul storage migrate needs --to postgresql://… (or SOUL_STORAGE set to one)")
    moved = move(ctx.data_dir, url, progress=lambda line: print(line, file=sys.stderr, flush=True))
    ctx.emit(moved.__dict__, f"moved {moved.souls} souls ({moved.databases} databases, {moved.rows} rows) into "
             f"PostgreSQL; {moved.skipped} were there already")
    return 0


def register(add: Callable[..., argparse.ArgumentParser]) -> None:
    sp = add("storage", cmd_storage, "move a data dir's records into PostgreSQL", description=MIGRATE_HELP)
    sp.add_argument("action", choices=("migrate",))
    sp.add_argument("--to", metavar="URL", help="the PostgreSQL server: postgresql://user:password@host:port/db")
