"""``soul bench scale --model stand-in``: the Anthropic adapter in the runtime's hosts over HTTP to the Messages-API
stand-in in a process of its own, at 0 s and at a delay, with the same warm souls.

The stand-in process alone (no Ray), then the benchmark function itself at a tiny size on an embedded local Ray
of its own (a subprocess with its own Ray directory, so the session's runtime is not touched)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from soul_apps.bench.model_standin import StandinProcess, connections_by_pid


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_the_standin_process_answers_counts_changes_its_delay_and_stops() -> None:
    import anthropic
    with StandinProcess(delay_s=0.3) as api:
        pid = api.pid
        assert pid != os.getpid() and api.stats()["delay_s"] == 0.3
        client = anthropic.Anthropic(api_key="k", base_url=api.base_url, max_retries=0)
        t0 = time.perf_counter()
        msg = client.messages.create(model="claude-bench-reply", max_tokens=10,
                                     messages=[{"role": "user", "content": "hello"}])
        assert msg.content[0].text == "Noted." and time.perf_counter() - t0 >= 0.3
        tool = client.messages.create(
            model="claude-bench-memory", max_tokens=10, messages=[{"role": "user", "content": "x"}],
            tools=[{"name": "record_memory", "input_schema": {"type": "object"}}],
            tool_choice={"type": "tool", "name": "record_memory"})
        assert tool.content[0].type == "tool_use"
        assert api.connections() >= 1 and connections_by_pid(api.port, [os.getpid()]).get(os.getpid(), 0) >= 1
        assert api.set_delay(0.6)["delay_s"] == 0.6  # a longer delay from now on: the next call waits it out
        t0 = time.perf_counter()
        client.messages.create(model="claude-bench-reply", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
        assert time.perf_counter() - t0 >= 0.6
        assert api.set_delay(0)["delay_s"] == 0 and api.stats()["delay_s"] == 0
        stats = api.settle()
        assert stats["calls"] == 3 and stats["by_kind"] == {"reply": 2, "record_memory": 1}
        assert stats["in_flight"] == 0 and stats["pid"] == pid
    assert _gone(pid) and not api.alive()


CHILD = """
import json, sys
from soul_apps.bench import scale
res = scale.run(souls=6, active=[1, 4], turns=1, embedder="fast", model="stand-in", model_delays=[0.2],
                overhead_sample=10, sample_every_s=0.2)
open(sys.argv[1], "w").write(json.dumps(res))
"""


@pytest.mark.ray
def test_scale_on_the_standin_instant_and_delayed_with_warm_souls(tmp_path: Path) -> None:
    out = tmp_path / "res.json"
    ray_tmp = tempfile.mkdtemp(prefix="sbm", dir="/tmp")  # short: Ray's socket paths
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "SOUL_", "ANTHROPIC_"))}
    env.update(RAY_TMPDIR=ray_tmp, SOUL_DATA_DIR=str(tmp_path / "data"))
    try:
        p = subprocess.run([sys.executable, "-c", CHILD, str(out)], env=env, capture_output=True, text=True,
                           timeout=180, stdin=subprocess.DEVNULL)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["model"] == "stand-in" and res["model_delays_s"] == [0.0, 0.2] and res["wait_writes"] == [False]
    assert res["errors"] == {}
    first = next(ph for ph in res["phases"] if ph["phase"] == "first turns")
    assert first["turns"] == 6 and first["model_delay_s"] == 0.0  # every soul warm before the measured phases
    steady = [ph for ph in res["phases"] if ph["phase"] == "turns"]
    assert [(ph["active"], ph["model_delay_s"]) for ph in steady] == [(1, 0.0), (1, 0.2), (4, 0.0), (4, 0.2)]
    for ph in steady:
        assert ph["turns"] == 8 and ph["errors"] == {} and ph["wait_writes"] is False  # 8 in flight's worth
        # a reply and a memory decision per turn, all over HTTP to the stand-in
        assert ph["model_calls"]["by_kind"] == {"reply": 8, "record_memory": 8}
        assert ph["model_connections_max"] >= 1
        rt = ph["runtime"]
        hosts = [q for q in rt["processes"] if q["name"] == "ray::SoulHost"]
        assert len(hosts) == res["hosts"] and all(q["threads_max"] > 1 and q["rss_bytes_max"] > 0 for q in hosts)
        assert sum(q["model_connections_max"] for q in hosts) >= 1  # the connections are the hosts'
        assert rt["by_kind"]["SoulHost"]["processes"] == res["hosts"]
    for ph in steady:
        if ph["model_delay_s"]:
            assert ph["turn_p50_ms"] >= 200  # the reply waited for the stand-in's 0.2 s
            instant = next(q for q in steady if q["active"] == ph["active"] and q["model_delay_s"] == 0.0)
            assert ph["vs_instant_turns_per_s"] == pytest.approx(ph["turns_per_s"] / instant["turns_per_s"],
                                                                  rel=0.01)
    si = res["standin"]
    assert si["reply_model"] == "claude-bench-reply" and si["memory_model"] == "claude-bench-memory"
    turns = 6 + 4 * 8
    assert si["calls"] == 2 * turns and si["by_kind"] == {"reply": turns, "record_memory": turns}
    assert si["stopped"] and _gone(si["pid"])
    assert not any(q["pid"] == si["pid"] for q in res["processes"])  # not counted as one of the runtime's
