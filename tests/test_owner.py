"""One owner per soul: two processes racing for one soul, and a paused old owner resumed after a new one
took over. Real processes, real signals, real files; no Ray.

Invariants checked after every run: every acknowledged turn is stored once (its trace and its episode),
sequence numbers are 1..n without gaps or repeats, and nothing a superseded owner was refused is stored
unless the new owner completed it from the write intent and it was then acknowledged by a retry.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from soul_runtime.loop.soul_state import SoulState
from soul_runtime.memory.soul_memory import SoulMemory
from tests.fakes import HashEmbedder

ROOT = Path(__file__).resolve().parents[1]


def start(d: Path, name: str, turns: int, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.owner_worker", str(d), name, str(turns), mode],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def events(p: subprocess.Popen[str], timeout: float = 120) -> list[dict[str, Any]]:
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, err
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def stored(d: Path) -> tuple[dict[str, int], dict[int, int], set[int]]:
    """request id → seq of every trace, seq → number of episodes recorded from that turn, and the turns
    whose trace says they added an episode or merged into one."""
    state = SoulState(d, 8000)
    traces = {t.request_id: t.seq for t in state.last(100_000)}
    added = {t.seq for t in state.last(100_000) if any(w.store.value == "episodic" and w.op.value in ("ADD", "UPDATE")
                                                        for w in t.writes)}
    state.close()
    mem = SoulMemory(d, embedder=HashEmbedder())
    per_turn: dict[int, int] = {}
    for e in mem.episodes():
        for s in e.sources:
            if not s.endswith("/user"):  # an episode may also cite the question it answers (the soul's reply)
                continue
            seq = int(s.split("/")[1])
            per_turn[seq] = per_turn.get(seq, 0) + 1
    mem.close()
    return traces, per_turn, added


def check_exactly_once(d: Path, acked: dict[str, int]) -> None:
    traces, per_turn, added = stored(d)
    assert traces == acked  # every acknowledged turn is there, and nothing else is
    assert sorted(traces.values()) == list(range(1, len(traces) + 1))
    assert added and set(per_turn) == added and set(per_turn.values()) == {1}  # stored once, as acknowledged


def test_two_processes_racing_for_one_soul(tmp_path: Path) -> None:
    a, b = start(tmp_path, "alpha", 25, "race"), start(tmp_path, "beta", 25, "race")
    ev = events(a) + events(b)
    acked = {e["ack"]: e["seq"] for e in ev if "ack" in e}
    refused = [e for e in ev if "refused" in e]
    assert len(acked) == 50
    check_exactly_once(tmp_path, acked)
    print(f"\nrace: 2 processes, 50 turns acknowledged, {len(refused)} stale writes refused")


def paused_takeover(d: Path, where: str) -> tuple[dict[str, int], list[str]]:
    """An owner pauses (SIGSTOP) inside its 3rd turn; a new owner takes over and runs 4 turns; the old one
    resumes (SIGCONT) and must be refused."""
    old = start(d, "old", 3, f"pause-{where}")
    assert old.stdout is not None
    seen: list[dict[str, Any]] = []
    for line in old.stdout:
        seen.append(json.loads(line))
        if "pause" in seen[-1]:
            os.kill(old.pid, signal.SIGSTOP)
            break
    try:
        new = events(start(d, "new", 4, "race"))
    finally:
        os.kill(old.pid, signal.SIGCONT)
    seen += events(old)
    acked = {e["ack"]: e["seq"] for e in seen + new if "ack" in e}
    refused = [e["refused"] for e in seen if "refused" in e]
    return acked, refused


def test_a_paused_owner_resumed_after_a_takeover_is_refused(tmp_path: Path) -> None:
    # paused in the model call: its turn never reached the disk, so it is not stored at all
    d1 = tmp_path / "reply"
    acked, refused = paused_takeover(d1, "reply")
    assert refused == ["old-2"] and "old-2" not in acked and len(acked) == 6
    check_exactly_once(d1, acked)
    # paused between its write intent and the layer writes: the new owner completed the turn from the intent
    # (stored once, under the old request id); the resumed old owner's layer writes are refused
    d2 = tmp_path / "write"
    acked, refused = paused_takeover(d2, "write")
    assert refused == ["old-2"]
    traces, per_turn, _ = stored(d2)
    assert traces["old-2"] == 3 and per_turn[3] == 1
    check_exactly_once(d2, {**acked, "old-2": 3})
