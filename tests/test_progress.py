"""soul_apps.cli.progress: what long work shows when the output is not a terminal (no Ray)."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import pytest
from rich.console import Console

from soul_apps.cli import progress

STAMP = re.compile(r"^\[\s*(\d+\.\d) s\] (.*)$")


def _piped() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=False, width=200), buf


def _lines(buf: io.StringIO) -> list[tuple[float, str]]:
    out = []
    for line in buf.getvalue().splitlines():
        m = STAMP.match(line)
        assert m, f"not a stamped line: {line!r}"
        out.append((float(m[1]), m[2]))
    return out


def test_plain_lines_say_each_stage_and_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "QUIET_S", 0.0)
    out, buf = _piped()
    with progress.working(out, "loading") as work:
        while not buf.getvalue():  # the first line comes from the heartbeat, as soon as QUIET_S has passed
            time.sleep(0.01)
        work("turns", 1, 3)
        work("turns", 2, 3)  # same stage, not finished, within EVERY_S: no line
        work("turns", 3, 3)  # a finished stage is always shown
    lines = _lines(buf)
    assert [text for _, text in lines] == ["loading…", "turns: 1/3", "turns: 3/3", lines[-1][1]]
    assert re.fullmatch(r"loading: done in \d+\.\d s", lines[-1][1])
    assert [t for t, _ in lines] == sorted(t for t, _ in lines)


def test_quick_work_prints_nothing_and_a_failure_says_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "QUIET_S", 3600.0)
    out, buf = _piped()
    with progress.working(out, "quick"):
        pass
    assert buf.getvalue() == ""
    monkeypatch.setattr(progress, "QUIET_S", 0.0)
    with pytest.raises(KeyError), progress.working(out, "failing"):
        while not buf.getvalue():
            time.sleep(0.01)
        raise KeyError("x")
    assert _lines(buf)[-1][1].startswith("failing: stopped in ")


def test_heartbeat_repeats_the_stage_with_its_age(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "QUIET_S", 0.0)
    monkeypatch.setattr(progress, "EVERY_S", 0.0)
    out, buf = _piped()
    with progress.working(out, "waiting"):
        while len(buf.getvalue().splitlines()) < 3:
            time.sleep(0.01)
    texts = [text for _, text in _lines(buf)]
    assert texts[0] == "waiting…" and re.fullmatch(r"waiting… \(\d+ s\)", texts[1])


def test_estimates_are_this_machines_last_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert progress.estimate("start", " (first)") == " (first)"
    progress.remember("start", 31.26)
    progress.remember("other", 2.0)
    assert progress.estimate("never") == ""  # a record without this step
    assert progress.estimate("start", " (first)") == " (took 31 s last time)"
    (tmp_path / "soul-runtime" / "timings.json").write_text("not json")
    assert progress.estimate("start") == ""  # a damaged record is no estimate, not an error
    progress.remember("start", 5.0)
    assert progress.estimate("start") == " (took 5 s last time)"
