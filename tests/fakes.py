"""Test doubles shared by the test suite."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from soul_runtime.embedding.fast import FastEmbedder

_WORD = re.compile(r"\w+")


class HashEmbedder(FastEmbedder):
    """The project's fast embedder under the id the test suites' stores were written with."""

    embedder_id = "test-hash-64"


def disk_hits(root: object, *words: str) -> dict[str, int]:
    """Every file under ``root`` (WAL and shm files too) that holds one of ``words``, case-insensitively
    (FTS5 keeps terms lower-cased), with how many times: the byte-level check behind "forget means gone"."""
    from pathlib import Path

    needles = [w.lower().encode("utf-8") for w in words]
    hits: dict[str, int] = {}
    for f in sorted(Path(str(root)).rglob("*")):
        if f.is_file():
            data = f.read_bytes().lower()
            n = sum(data.count(w) for w in needles)
            if n:
                hits[str(f.relative_to(str(root)))] = n
    return hits


def stop_serve(proc: subprocess.Popen[bytes], log: IO[Any], down: Callable[[], object]) -> None:
    """Stop the ``soul serve`` started as ``proc`` by its pid (SIGTERM; killed if it has not exited in 120 s),
    close its log, then ``down()`` (``soul down``: the local runtime it used)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
    log.close()
    down()


def wait_healthy(proc: subprocess.Popen[bytes], url: str, log: Path, limit_s: float = 300) -> None:
    """Wait until the ``soul serve`` started as ``proc`` answers ``/healthz`` at ``url``; its log on failure."""
    import httpx

    t0 = time.monotonic()
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(url + "/healthz", timeout=10).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() - t0 < limit_s, log.read_text()
        time.sleep(0.5)
