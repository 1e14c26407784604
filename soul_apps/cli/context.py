"""What every ``soul`` command is given: its arguments, where the runtime is (``--address``, the data dir, the
namespace), the consoles it prints to, and a connected runtime while it runs (:meth:`Ctx.runtime`)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console

from soul_apps.cli import progress, render
from soul_runtime.errors import NotFound, RuntimeUnavailable
from soul_runtime.text import check_id

# Ray and the soul actors from nothing, measured with `soul demo` on a 2-core machine (18-38 s, the machine
# shared or not); after the first run the estimate is this machine's own last time (progress.remember)
FIRST_START = " (~20-40 s the first time on 2 cores)"


class Ctx:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.json: bool = bool(getattr(args, "json", False))
        width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 120  # rich uses 80 when piped
        self.out = Console(highlight=False, soft_wrap=False, width=width)
        self.err = Console(stderr=True, highlight=False, soft_wrap=not sys.stderr.isatty())  # a log gets lines whole
        addr = getattr(args, "address", None) or os.environ.get("SOUL_ADDRESS") or None
        self.address: str | None = None if addr in (None, "", "local") else addr
        self.explicit_data_dir = getattr(args, "data_dir", None) or os.environ.get("SOUL_DATA_DIR")
        self.data_dir = os.path.abspath(os.path.expanduser(self.explicit_data_dir or os.path.join("~", ".soul-runtime")))
        self.namespace: str = getattr(args, "namespace", None) or os.environ.get("SOUL_NAMESPACE") or "souls"
        self.quick_exit = False  # a driver of the local runtime: nothing to tear down on exit
        for opt, var in (("soul_model", "SOUL_MODEL"), ("soul_embedder", "SOUL_EMBEDDER")):
            value = getattr(args, opt, None)
            if value:  # as the variable: connect() and the local runtime's fingerprint read it
                os.environ[var] = value

    @property
    def where(self) -> str:
        return self.address or "a local Ray (embedded)"

    def local_data(self) -> bool:
        """Can this process see the data dir (local Ray or a head on this machine)?"""
        if self.address is None:
            return True
        host = self.address.removeprefix("ray://").rpartition(":")[0]
        return host in ("127.0.0.1", "localhost", "::1", "[::1]")

    def require_soul(self, soul_id: str) -> str:
        sid = check_id(soul_id, what="soul id")
        if self.local_data() and not (Path(self.data_dir) / "souls" / sid).is_dir():
            raise NotFound(f"unknown soul '{sid}' in {self.data_dir}")
        return sid

    @contextlib.contextmanager
    def runtime(self, *, data_dir: str | None = None, namespace: str | None = None,
                background: bool = True) -> Iterator[Any]:
        """A connected runtime. On the embedded default it is the data dir's local runtime (started in the
        background by the first command, attached to by the next ones) unless ``background`` is False or
        ``SOUL_LOCAL_RUNTIME=per-call``: then a private Ray lives for this call only."""
        from soul_apps.cluster import local_runtime as bg
        if not self.args.debug:
            os.environ.setdefault("RAY_LOGGER_LEVEL", "error")
        data_dir = data_dir or self.data_dir
        address = self.address
        local = address is None and background and (bg.mode() == "background" or bg.running(data_dir))
        t0 = time.perf_counter()
        if local:
            if bg.running(data_dir):
                what = "Connecting to the local runtime"
            else:
                what = "Starting the local runtime in the background, once" + progress.estimate(
                    "local-runtime", FIRST_START)
            with progress.working(self.err, what):
                address, started = bg.attach(data_dir)
            if started:
                progress.remember("local-runtime", time.perf_counter() - t0)
                self.err.print(f"[dim]started a local runtime for {data_dir} in {time.perf_counter() - t0:.0f} s; "
                               "later commands attach to it; `soul down` stops it[/]")
        private = address is None
        what = "Starting a local Ray and the soul actors" + progress.estimate("private-ray", FIRST_START) \
            if private else "Attaching to the local runtime" if local else f"Connecting to {address}"
        t1 = time.perf_counter()
        with progress.working(self.err, what):
            from actors.runtime import connect as connect_ray  # after attach: Ray reads the head's auth then
            try:
                rt = connect_ray(address, data_dir=data_dir, namespace=namespace or self.namespace)
            except RuntimeUnavailable:
                if not local:
                    raise
                address, _ = bg.attach(data_dir, replace=True)  # a head that accepts ports but is broken
                rt = connect_ray(address, data_dir=data_dir, namespace=namespace or self.namespace)
        if private:
            progress.remember("private-ray", time.perf_counter() - t1)
        if self.args.debug:
            self.err.print(f"[dim]connected in {time.perf_counter() - t0:.1f} s[/]")
        try:
            yield rt
        finally:
            with progress.working(self.err, "Closing"):
                rt.close(flush=not local)  # the local runtime's actors stay up; `soul down` flushes them
            self.quick_exit = local

    def emit(self, data: Any, *renderables: Any) -> None:
        if self.json:
            render.print_json(data)
        else:
            for r in renderables:  # a line of text is never wrapped: a log or a pipe gets it whole, for grep
                self.out.print(r, soft_wrap=isinstance(r, str))
