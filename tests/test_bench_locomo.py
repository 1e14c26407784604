"""`soul bench locomo` on a tiny synthetic LoCoMo file (the real data is never in the repo)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from soul_apps.bench import locomo as bench_locomo
from soul_apps.bench import plotting
from soul_apps.bench.ablation import ABLATIONS
from soul_apps.cli.bench import locomo_markdown, update_readme
from soul_apps.cli.main import main
from soul_runtime.errors import ConfigError
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
    res = bench_locomo.run(data, (50, 200), embedder=HashEmbedder(), workdir=str(tmp_path / "w"), ablation=True)
    for s in bench_locomo.SYSTEMS + tuple(ABLATIONS):  # the soul's parts apart too, on the same stores
        for b in ("50", "200"):
            r = res["systems"][s][b]
            assert 0.0 <= r["evidence_recall"] <= 1.0 and 0.0 <= r["answer_recall"] <= 1.0
            assert r["tokens_mean"] <= int(b)  # lines are counted as shown, within the budget
    d = res["details"]
    assert d["conversations"] == 3 and d["questions"] == 6 and d["raw_turns"] == 15 and d["answer_questions"] == 6
    soul = res["systems"]["soul"]["200"]
    assert soul["evidence_recall"] > 0.5  # prefixed ids in the list file still match their evidence
    assert soul["answer_recall"] == 1.0  # the dog's name and the instrument are in the lines shown
    assert res["ceiling"]["full"]["answer_recall"] == 1.0
    # the share is what the soul shows over the whole conversation's tokens; on a five-line chat with a budget
    # of 200 its dated lines may hold more than the chat itself
    assert d["token_share"] == pytest.approx(soul["tokens_mean"] / d["full_context_tokens_mean"], rel=1e-2)
    bench_locomo.plot(res, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000
    readme = tmp_path / "README.md"
    readme.write_text("x\n<!-- bench:locomo:start -->\nold\n<!-- bench:locomo:end -->\ny\n")
    assert update_readme(readme, locomo_markdown(res))
    text = readme.read_text()
    assert "soul-runtime" in text and "answer recall @ 200" in text and "old" not in text


def test_bench_claude_counts_calls_against_the_local_server(tmp_path: Path) -> None:
    from soul_apps.bench import claude_path
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


def test_answer_recall_counts_content_words_of_the_text_shown() -> None:
    assert bench_locomo.answer_recall("The week before 9 June 2023", "(8 June 2023) the week before") == 0.8  # 9 is missing
    assert bench_locomo.answer_recall("Chile", "Ana moved from Chile.") == 1.0
    assert bench_locomo.answer_recall("the", "anything") is None  # no content words: not scored
    assert bench_locomo.answer_recall("art", "Ana starts painting") == 0.0  # words, not substrings


def test_baseline_lines_are_taken_in_rank_order_within_the_budget() -> None:
    lines = [("a" * 40, ("x",)), ("b" * 400, ("y",)), ("c" * 40, ("z",))]
    taken = bench_locomo.take_within(lines, 30)
    assert [src for _, src in taken] == [("x",), ("z",)]  # the long line does not fit and is skipped
    order = bench_locomo.rrf(np.array([3, 0, 1, 2]), np.array([3, 2, 1, 0]))
    assert order[0] == 3 and set(order[1:]) == {0, 1, 2}  # first in both is first


def test_a_plot_without_matplotlib_fails_at_once_saying_how_to_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the `bench` extra were not installed
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(ConfigError, match=re.escape("pip install 'soul-runtime[bench]'")):
        plotting.pyplot()
    png = tmp_path / "p.png"
    code = main(["bench", "locomo", str(tmp_path / "no-such-data"), "--plot", str(png)])
    err = capsys.readouterr().err
    assert code != 0 and "soul-runtime[bench]" in err and "no-such-data" not in err  # refused before the run
    assert not png.exists()
