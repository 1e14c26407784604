"""`soul bench longchat`: the generated chats and their questions, the chunk baseline, one small run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from soul_apps.bench import longchat
from soul_apps.bench.longchat_data import DEV, HELD_OUT, generate, load, write
from soul_apps.bench.longchat_ray import plot_memory, timeline
from tests.fakes import HashEmbedder


def test_chats_are_seeded_varied_and_their_questions_have_their_evidence() -> None:
    a, b = generate(3, 20_000), generate(3, 20_000)
    assert a.to_json() == b.to_json() and generate(4, 20_000).to_json() != a.to_json()
    assert not set(DEV) & set(HELD_OUT)
    assert 60_000 <= a.chars <= 110_000 and all(2_000 <= len(m["text"]) <= 11_000 for m in a.messages)
    assert {m["speaker"] for m in a.messages} == {a.user, "assistant"}
    texts = {m["id"]: m["text"] for m in a.messages}
    kinds = set()
    for q in a.questions:
        kinds.add(q.kind)
        assert all(e in texts for e in q.evidence)
        first = texts[q.evidence[0]].lower()
        assert all(k.lower() in first for k in q.key_phrases), q
    assert kinds == {"version", "figure", "updated", "date", "code", "proposal"}
    forms = "".join(texts.values())
    assert "```python" in forms and "|---|" in forms and "\n- " in forms


def test_chunks_split_at_sentence_ends_and_stay_near_400_characters() -> None:
    text = generate(5, 20_000).messages[2]["text"]
    parts = longchat.chunks(text)
    assert all(len(p) <= longchat.CHUNK_CHARS for p in parts)
    assert set(" ".join(parts).split()) == set(text.split())


def test_a_small_run_reports_every_system_budget_and_kind(tmp_path: Path) -> None:
    write(tmp_path / "chats", [7], [12_000])
    res = longchat.run(tmp_path / "chats", (500, 1000), embedder=HashEmbedder(), workdir=str(tmp_path / "w"))
    assert res["details"]["refused"] == [] and res["details"]["chats"] == 1
    assert res["details"]["questions"] == len(load(tmp_path / "chats")[0].questions)
    for s in longchat.SYSTEMS:
        for b in ("500", "1000"):
            got = res["systems"][s][b]
            assert 0 <= got["evidence_recall"] <= 1 and 0 <= got["key_phrase_recall"] <= 1
            assert got["tokens_mean"] <= int(b)
    assert res["details"]["ingest_messages_per_s"] > 0 and res["details"]["rss_peak_mib"] > 0
    json.dumps(res)
    longchat.plot(res, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_the_memory_timeline_keeps_at_most_its_points_and_the_last_sample() -> None:
    samples = [{"s": i / 10, "done": i * 3, "rss_mib": {"ray::LayerShard 7": 100.0 + i, "ray::IDLE 9": 50.0}}
               for i in range(1001)]
    line = timeline(samples, points=300)
    assert len(line) <= 301 and line[0]["messages"] == 0 and line[-1]["messages"] == 3000
    assert all(list(x["rss_mib"]) == ["ray::LayerShard 7"] for x in line)
    assert timeline([]) == [] and len(timeline(samples[:5])) == 5


RAY_CHILD = """
import json, sys
from soul_apps.bench.longchat_ray import run_on_ray
res = run_on_ray(sys.argv[1], (500, 1000), callers=2, embedder="fast", sample_every_s=0.2)
open(sys.argv[2], "w").write(json.dumps(res))
"""


@pytest.mark.ray
def test_chats_observed_by_souls_of_a_runtime_report_recall_rate_and_each_process_memory(tmp_path: Path) -> None:
    write(tmp_path / "chats", [7, 8], [12_000])
    out = tmp_path / "res.json"
    ray_tmp = tempfile.mkdtemp(prefix="slc", dir="/tmp")  # short: Ray's socket paths
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "SOUL_", "ANTHROPIC_"))}
    env.update(RAY_TMPDIR=ray_tmp, SOUL_DATA_DIR=str(tmp_path / "data"))
    try:
        p = subprocess.run([sys.executable, "-c", RAY_CHILD, str(tmp_path / "chats"), str(out)], env=env,
                           capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(out.read_text())
    d = res["details"]
    chats = load(tmp_path / "chats")
    assert d["refused"] == [] and d["chats"] == 2 and d["messages"] == sum(len(c.messages) for c in chats)
    assert d["questions"] == sum(len(c.questions) for c in chats) and d["episodes"] > d["messages"]  # units
    assert d["ingest_messages_per_s"] > 0
    mem = d["memory"]
    assert mem["shard_rss_peak_mib"] > 0 and mem["host_rss_peak_mib"] > 0
    assert any(q["name"] == "ray::LayerShard" for q in mem["processes"])
    for b in ("500", "1000"):
        got = res["systems"]["soul"][b]
        assert 0 < got["evidence_recall"] <= 1 and 0 < got["key_phrase_recall"] <= 1 and got["tokens_mean"] <= int(b)
    line = d["memory_timeline"]  # each process's memory as the messages came in, and its plot
    assert len(line) >= 2 and [x["messages"] for x in line] == sorted(x["messages"] for x in line)
    assert line[-1]["messages"] == d["messages"]
    assert any("LayerShard" in k for k in line[-1]["rss_mib"]) and all(v > 0 for v in line[-1]["rss_mib"].values())
    plot_memory(res, tmp_path / "m.png")
    assert (tmp_path / "m.png").stat().st_size > 1000
