"""Progress on long work, whatever the output is.

On a terminal: a live line (spinner, what is happening, a bar when the total is known, elapsed time) that
disappears when the work is done. Anywhere else (a pipe, a log file, CI): plain lines, each starting with the
seconds since the command started (``[ 12.4 s]``), the first ``QUIET_S`` after the work starts (quicker work
prints nothing), then at least every ``EVERY_S`` seconds while it lasts, and one when it ends. The figures are this process's own clock, so a log
shows how long each step took without a timestamping wrapper.

Estimates are measured, not guessed: :func:`remember` records how long a step took on this machine (in the
user's cache dir) and the next run says "took N s last time"; before any run, the caller's ``first`` text,
measured on a small machine, is shown.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

EVERY_S = 4.0  # plain output: a line at least this often while work lasts (well inside a 10 s promise)
QUIET_S = 0.5  # plain output: work that ends sooner prints no line at all


def _process_start() -> float:
    """This process's start on the monotonic clock (Linux: /proc; elsewhere: when this module was imported)."""
    now = time.monotonic()
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        age = uptime - ticks / os.sysconf("SC_CLK_TCK")
        return now - age if 0 <= age < 60 else now
    except (OSError, ValueError, IndexError):
        return now


_START = _process_start()


def elapsed() -> float:
    """Seconds since this command started."""
    return time.monotonic() - _START


def stamp(text: str) -> str:
    """A plain progress line: the seconds since the command started, then ``text``."""
    return f"[{elapsed():5.1f} s] {text}"


class Work:
    """What :func:`working` yields: ``work(what, done=0, total=0)`` says what is happening now (and how far)."""

    def __init__(self, out: Console, what: str, live: Progress | None, plain: bool) -> None:
        self.out, self.title, self.what, self.done, self.total = out, what, what, 0, 0
        self._live, self._plain = live, plain
        self._task = live.add_task(what, total=None, count="") if live is not None else None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.t0 = self._said = time.monotonic()
        self._shown = False  # plain output: work that ends within QUIET_S prints nothing
        if plain:
            self._beat = threading.Thread(target=self._heartbeat, name="soul-progress", daemon=True)
            self._beat.start()

    def __call__(self, what: str, done: int = 0, total: int = 0) -> None:
        with self._lock:
            changed = what != self.what
            finished = 0 < total <= done != self.done  # the end of a stage is always shown
            self.what, self.done, self.total = what, done, total
        if self._live is not None and self._task is not None:
            self._live.update(self._task, description=what, completed=done, total=total or None,
                              count=f"{done}/{total}" if total else "")
        elif self._shown and (changed or finished or time.monotonic() - self._said >= EVERY_S):
            self._say(self._line())

    def _line(self) -> str:
        return f"{self.what}: {self.done}/{self.total}" if self.total else f"{self.what}…"

    def _say(self, text: str) -> None:
        with self._lock:
            self._said, self._shown = time.monotonic(), True
            self.out.print(stamp(text), soft_wrap=True, highlight=False, markup=False)
            self.out.file.flush()

    def _heartbeat(self) -> None:
        while not self._stop.wait(0.1 if not self._shown else 0.5):
            now = time.monotonic()
            if not self._shown and now - self.t0 >= QUIET_S:
                self._say(self._line())
            elif self._shown and now - self._said >= EVERY_S:
                self._say(f"{self._line()} ({now - self.t0:.0f} s)")

    def close(self, ok: bool) -> None:
        self._stop.set()
        if self._plain:
            self._beat.join()
            if self._shown:
                self._say(f"{self.title}: {'done' if ok else 'stopped'} in {time.monotonic() - self.t0:.1f} s")


@contextlib.contextmanager
def working(out: Console, what: str, *, live: bool = True) -> Iterator[Work]:
    """Show progress on ``out`` while the block runs. ``live=False``: on a terminal show nothing (the block's
    own output is the progress there, e.g. the demo's turns), elsewhere the plain lines all the same."""
    plain = not out.is_terminal
    if plain or not live:
        work = Work(out, what, None, plain)
        try:
            yield work
        except BaseException:
            work.close(False)
            raise
        work.close(True)
        return
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[count]}"),
                  TimeElapsedColumn(), console=out, transient=True) as bar:
        work = Work(out, what, bar, False)
        yield work


# ---- measured estimates ----------------------------------------------------------------

def _timings_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "soul-runtime" / "timings.json"


def estimate(key: str, first: str = "") -> str:
    """`` (took 38 s last time)`` when this step was timed here before, else ``first`` (a figure measured on a
    small machine, e.g. `` (~20-45 s the first time on 2 cores)``), else nothing."""
    with contextlib.suppress(OSError, ValueError, TypeError, LookupError):
        seconds = float(json.loads(_timings_file().read_text())[key])
        return f" (took {seconds:.0f} s last time)"
    return first


def remember(key: str, seconds: float) -> None:
    """Record how long ``key`` took on this machine, for the next :func:`estimate`."""
    path = _timings_file()
    with contextlib.suppress(OSError, ValueError, TypeError):
        try:
            data = json.loads(path.read_text())
            data = data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            data = {}
        data[key] = round(seconds, 1)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
