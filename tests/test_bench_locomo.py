"""`soul bench locomo` on a tiny synthetic LoCoMo file (the real data is never in the repo)."""

from __future__ import annotations

import json
from pathlib import Path

from soul_runtime.bench import locomo as bench_locomo
from soul_runtime.cli.bench import locomo_markdown, update_readme
from tests.fakes import HashEmbedder


def conversation(name: str) -> dict:
    return {
        "speaker_a": "Ana", "speaker_b": "Ben",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [
            {"speaker": "Ana", "dia_id": "D1:1", "text": "Hey Ben! Good to see you!"},
            {"speaker": "Ana", "dia_id": "D1:2", "text": f"I adopted a beagle named {name} last weekend."},
            {"speaker": "Ben", "dia_id": "D1:3", "text": "I started learning the cello in April."},
        ],
        "session_2_date_time": "10:00 am on 20 June, 2023",
        "session_2": [
            {"speaker": "Ben", "dia_id": "D2:1", "text": "My cello teacher moved to Lisbon, so lessons are online."},
            {"speaker": "Ana", "dia_id": "D2:2", "text": "Wow, that's great!"},
        ],
        "qa": [{"question": "What is the name of Ana's dog?", "answer": name, "evidence": ["D1:2"], "category": 4},
               {"question": "Which instrument does Ben play and where did his teacher move?", "answer": "cello",
                "evidence": ["D1:3; D2:1"], "category": 1},
               {"question": "adversarial", "answer": "", "evidence": ["D1:1"], "category": 5}],
    }


def test_bench_runs_and_reports_every_system(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.json").write_text(json.dumps(conversation("Biscuit")))
    (data / "b.json").write_text(json.dumps([conversation("Pepper"), conversation("Miso")]))  # a list file
    res = bench_locomo.run(data, (50, 200), embedder=HashEmbedder(), workdir=str(tmp_path / "w"))
    for s in ("soul", "bm25", "dense"):
        assert set(res[s]) == {"50", "200"} and all(0.0 <= v <= 1.0 for v in res[s].values())
    d = res["details"]
    assert d["conversations"] == 3 and d["questions"] == 6 and d["raw_turns"] == 15
    assert res["soul"]["200"] > 0.5  # prefixed ids in the list file still match their evidence
    assert 0 < d["token_share_at_1000"] <= 1
    bench_locomo.plot(res, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000
    readme = tmp_path / "README.md"
    readme.write_text("x\n<!-- bench:locomo:start -->\nold\n<!-- bench:locomo:end -->\ny\n")
    assert update_readme(readme, locomo_markdown(res))
    assert "soul-runtime" in readme.read_text() and "old" not in readme.read_text()


def test_bench_claude_counts_calls_against_the_local_server(tmp_path: Path) -> None:
    from soul_runtime.bench import claude_path
    (tmp_path / "conv.json").write_text(json.dumps(conversation("Biscuit")))
    obs = claude_path.bench_observe(tmp_path, embedder=HashEmbedder())
    batched, single = obs["window_40"], obs["window_1"]
    assert batched["messages"] == single["messages"] == 5
    assert batched["calls"] == 2  # one per session
    assert single["calls"] == 5  # one per message (every message passes the length filter)
    assert batched["writes"] == single["writes"] >= 5
    assert 0 < batched["tokens_sent_per_message"] < single["tokens_sent_per_message"]
    turns = claude_path.bench_turns(turns=2, delay_s=0.0, embedder=HashEmbedder())
    for key in ("no_wait", "wait_writes"):
        assert turns[key]["calls_on_reply_path_max"] == 1 and turns[key]["calls_per_turn_max"] == 2
