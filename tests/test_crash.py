"""A process writing memories is SIGKILLed mid-stream: nothing acknowledged is lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from soul_runtime.memory.soul_memory import SoulMemory
from tests.fakes import HashEmbedder

ROOT = Path(__file__).resolve().parents[1]

WRITER = textwrap.dedent("""
    import sys
    from soul_runtime.memory.soul_memory import SoulMemory
    from soul_runtime.records import Extraction, FactCandidate, WriteRequest
    from tests.fakes import HashEmbedder
    m = SoulMemory(sys.argv[1], embedder=HashEmbedder())
    i = 0
    while True:
        key = f"t{i}"
        fact = FactCandidate("svc%d" % (i % 50), "owner", f"team {i}", "confirmed", (key,))
        m.write(WriteRequest(turn_key=key, now=1.7e9 + i, actor="maya", sources=(key,), session=f"s{i // 25}",
                             extraction=Extraction(facts=(fact,), episode=f"Event {i}: svc{i % 50} moved to team {i}.",
                                                   event=True)))
        print("ACK", key, flush=True)
        i += 1
""")


def write_then_kill(path: Path, n: int) -> list[str]:
    """Run the writer until ``n`` writes are acknowledged, then SIGKILL it; every turn key it acknowledged."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, env=env, cwd=ROOT,
                         text=True)
    acked: list[str] = []
    assert p.stdout is not None
    deadline = time.monotonic() + 120
    while len(acked) < n and time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        acked.append(line.split()[1])
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert len(acked) == n, "writer did not get far enough"
    # the writer may have run ahead of this reader (a busy machine): what it acknowledged before the kill is
    # still in the pipe
    acked += [line.split()[1] for line in p.stdout.read().splitlines() if line.startswith("ACK ")]
    return acked


@pytest.mark.parametrize("kill_after", [7, 61, 163])
def test_sigkill_during_writes_loses_nothing_acknowledged(tmp_path: Path, kill_after: int) -> None:
    acked = write_then_kill(tmp_path, kill_after)

    m = SoulMemory(tmp_path, embedder=HashEmbedder())
    sources = {s for e in m.episodes() for s in e.sources}
    assert set(acked) <= sources
    n = m.stats()["episodes"]
    assert n in (len(acked), len(acked) + 1)  # the one in flight is either complete or absent
    assert m.stats()["indexed"] == n  # the index agrees with the record
    last = acked[-1]
    i = int(last[1:])
    facts = {f.entity: f for f in m.facts()}
    assert facts[f"svc{i % 50}"].value in (f"team {i}", f"team {i + 1}")
    hits = m.recall(f"Event {i}: svc{i % 50} moved to team {i}.", 3, at=1.7e9 + 1e4, stores=["episodic"])
    assert any(last in h.sources for h in hits)
    m.close()
