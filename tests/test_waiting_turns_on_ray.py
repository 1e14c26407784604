"""On real Ray with the real ``anthropic`` SDK over HTTP to the Messages-API stand-in (a process of its own):
a node keeps far more turns waiting for a slow model than it has threads, and a caller that gives up mid-call
leaves its turn whole. Run in a subprocess with its own local Ray (the session's runtime uses the offline model)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

CHILD = r"""
import asyncio, json, sys, time
from pathlib import Path
import soul_runtime
from soul_apps.bench.model_standin import StandinProcess
from soul_apps.bench.scale import process_table

out, data = sys.argv[1], sys.argv[2]
IN_FLIGHT = 160
with StandinProcess(delay_s=0.0) as api:
    args = {"base_url": api.base_url, "api_key": "k", "model": "claude-bench-reply", "memory_model": "claude-bench-memory"}
    with soul_runtime.connect(data_dir=data, model="anthropic", model_args=args, embedder="fast", hosts=2) as rt:
        souls = [f"s{i}" for i in range(IN_FLIGHT)]

        async def wave(label, wait_writes):
            return await asyncio.gather(*(rt.async_soul(s).turn(f"{s} deploys Orca {label} on Friday.", user="u",
                                                                 wait_writes=wait_writes) for s in souls))

        async def main():
            res = {}
            await wave("warm", True)  # every soul active, every connection made
            api.set_delay(1.0)
            peak = {"in_flight": 0, "host_threads": 0}

            async def watch():
                while True:
                    st = await asyncio.to_thread(api.stats)
                    peak["in_flight"] = max(peak["in_flight"], st["in_flight"])
                    hosts = [p for p in process_table() if p.get("name") == "ray::SoulHost"]
                    peak["host_threads"] = max([peak["host_threads"], *(p["threads"] for p in hosts)])
                    await asyncio.sleep(0.1)
            watcher = asyncio.ensure_future(watch())
            t0 = time.monotonic()
            replies = await wave("now", False)
            res["wave_s"] = time.monotonic() - t0
            await asyncio.sleep(1.5)  # the memory work of the wave reaches the model too
            watcher.cancel()
            res["peak"] = peak
            res["seqs"] = sorted({r.seq for r in replies})
            res["pending"] = all(r.writes_pending for r in replies)
            # a caller that gives up while its reply is being made
            h = rt.async_soul("quitter")
            try:
                await asyncio.wait_for(h.turn("The staging database is on port 6543.", user="u", request_id="q-1"),
                                       timeout=0.3)
                res["gave_up"] = False
            except asyncio.TimeoutError:
                res["gave_up"] = True
            again = await h.turn("The staging database is on port 6543.", user="u", request_id="q-1")
            nxt = await h.turn("Which port is the staging database on now?", user="u", request_id="q-2")
            res["again"] = [again.seq, again.turn_id, nxt.seq]
            res["traces"] = [(t.seq, t.request_id) for t in await h.traces(10)]
            return res
        res = asyncio.run(main())
    res["standin"] = api.settle()
Path(out).write_text(json.dumps(res))
"""


@pytest.mark.ray
def test_a_node_keeps_many_more_turns_waiting_for_its_model_than_it_has_threads(tmp_path: Path) -> None:
    out = tmp_path / "res.json"
    ray_tmp = tempfile.mkdtemp(prefix="wt", dir="/tmp")  # short: Ray's socket paths
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "SOUL_", "ANTHROPIC_"))}
    env.update(RAY_TMPDIR=ray_tmp)
    try:
        p = subprocess.run([sys.executable, "-c", CHILD, str(out), str(tmp_path / "data")], env=env,
                           capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["seqs"] == [2] and res["pending"]
    # 160 replies waiting for a 1 s model at once: more than two hosts' threads (8 each) could ever hold
    assert res["peak"]["in_flight"] >= 120, res
    assert res["peak"]["host_threads"] < 160, res  # the host processes' threads do not grow with what waits
    assert res["gave_up"] and res["again"] == [1, "quitter/1", 2]
    assert res["traces"] == [[1, "q-1"], [2, "q-2"]]  # applied once, in order
    # every turn of the wave: a reply and a memory decision; the cancelled turn's reply made once
    si = res["standin"]
    assert si["by_kind"] == {"reply": 2 * 160 + 2, "record_memory": 2 * 160 + 2}
