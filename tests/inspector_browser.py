"""A real ``soul serve`` and Debian's headless Chromium (driven by Playwright), for the memory inspector's browser
tests and for its screenshots in docs/inspector/:

    python -m tests.inspector_browser docs/inspector

serves a fresh data dir on a free 127.0.0.1 port, plays the demo's four days into a soul through ``/v1``, and saves
a screenshot of each page of ``/ui/``. Chromium is the system's (``apt-get install chromium``): none is downloaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.fakes import stop_serve

SOUL = shutil.which("soul")
CHROMIUM = os.environ.get("SOUL_CHROMIUM", "/usr/bin/chromium")
STARTS = 3
"""How many times ``soul serve`` is started when Ray's own start times out."""
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


@dataclass
class Served:
    url: str
    keys: dict[str, str]
    data: Path
    base: Path
    proc: subprocess.Popen[bytes]
    start_s: float = 0.0
    clients: dict[str, httpx.Client] = field(default_factory=dict)

    def client(self, tenant: str) -> httpx.Client:
        if tenant not in self.clients:
            self.clients[tenant] = httpx.Client(base_url=self.url, timeout=120,
                                                headers={"Authorization": f"Bearer {self.keys[tenant]}"})
        return self.clients[tenant]


def _soul(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    assert SOUL, "the `soul` console script is not installed: run `pip install -e .`"
    p = subprocess.run([SOUL, *args], env=env, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    if check and p.returncode != 0:
        raise AssertionError(f"soul {' '.join(args)} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(env: dict[str, str], port: int, log: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen([str(SOUL), "serve", "--port", str(port), "--ingress", "proxy"], env=env, stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _up(proc: subprocess.Popen[bytes], url: str, log: Path, t0: float) -> bool:
    """True once the service answers; False if ``soul serve`` exited because Ray's start failed."""
    while True:
        if proc.poll() is not None:
            text = log.read_text(errors="replace")
            assert "could not start the local runtime" in text, text[-4000:]
            return False
        try:
            if httpx.get(url + "/healthz", timeout=10).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        assert time.monotonic() - t0 < 600, log.read_text(errors="replace")[-4000:]
        time.sleep(0.5)


@contextlib.contextmanager
def served(tenants: tuple[str, ...]) -> Iterator[Served]:
    """``soul serve`` on a fresh data dir with a key per tenant; stopped (and its local runtime) on exit. Serve's
    Python proxy ingress (the pages are the same with either). HOME is the run's own, so a Ray token of the user's
    is not offered to this runtime's Ray."""
    base = Path(tempfile.mkdtemp(prefix="insp", dir="/tmp"))
    data, home = base / "data", base / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "SOUL_"))}
    env.update(SOUL_DATA_DIR=str(data), HOME=str(home), RAY_USAGE_STATS_ENABLED="0")
    keys = {t: json.loads(_soul(env, "tenants", "add", t, "--json").stdout)["key"] for t in tenants}
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(base / "serve.log", "ab")  # noqa: SIM115 - closed below
    t0 = time.monotonic()
    proc = _start(env, port, log)
    try:
        for attempt in range(1, STARTS + 1):
            if _up(proc, url, base / "serve.log", t0):
                break
            # Ray's own start timed out (a raylet waits a fixed time for its agents: a loaded machine misses it);
            # the same command is tried again on the same data dir
            assert attempt < STARTS, (base / "serve.log").read_text(errors="replace")[-4000:]
            proc = _start(env, port, log)
        srv = Served(url, keys, data, base, proc, round(time.monotonic() - t0, 1))
        yield srv
        for c in srv.clients.values():
            c.close()
    finally:
        stop_serve(proc, log, lambda: _soul(env, "down", check=False))
        shutil.rmtree(base, ignore_errors=True)


def turn(c: httpx.Client, soul: str, text: str, at: str) -> dict[str, Any]:
    r = c.post(f"/v1/souls/{soul}/turns", json={"text": text, "user": "Maya", "at": at})
    assert r.status_code == 200, r.text
    return dict(r.json())


def observe(c: httpx.Client, soul: str, messages: list[dict[str, str]], at: str, session: str) -> dict[str, Any]:
    r = c.post(f"/v1/souls/{soul}/observe", json={"messages": messages, "at": at, "session": session})
    assert r.status_code == 200, r.text
    return dict(r.json())


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """Debian's Chromium, headless, through Playwright (its driver ships in the PyPI wheel; no browser download)."""
    from playwright.sync_api import sync_playwright
    assert os.path.exists(CHROMIUM), f"no Chromium at {CHROMIUM}: apt-get install chromium (or set SOUL_CHROMIUM)"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def sign_in(page: Any, url: str, key: str) -> None:
    page.goto(url + "/ui/")
    page.get_by_label("API key").fill(key)
    page.get_by_label("API key").press("Enter")
    page.get_by_role("heading", name="Souls").wait_for()


# ---- the screenshots in docs/inspector/ ------------------------------------------------------------

def _demo(srv: Served) -> tuple[str, int]:
    """The demo's four days in soul ``atlas`` (and two small souls beside it); the correction's turn number."""
    from soul_apps.cli.scenario import SCENARIO
    c = srv.client("acme")
    correction = 0
    for day in SCENARIO:
        for i, text in enumerate(day.turns):
            at = day.date.replace(minute=day.date.minute + i).strftime("%Y-%m-%dT%H:%M:%SZ")
            out = turn(c, "atlas", text, at)
            if text.startswith("Actually"):
                correction = int(out["seq"])
    observe(c, "atlas", [{"speaker": "Maya", "text": "We rolled back the cache deploy after the latency spike.",
                          "id": "standup-7"}], "2026-03-05T11:00:00Z", "standup")
    turn(c, "kai", "Our staging cluster runs in Frankfurt.", "2026-03-04T08:00:00Z")
    turn(c, "support-bot", "The refund window for annual plans is 30 days.", "2026-03-05T15:00:00Z")
    turn(c, "support-bot", "Yes, that's right.", "2026-03-05T15:01:00Z")
    return "atlas", correction


def screenshots(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    with served(("acme",)) as srv:
        return take_screenshots(srv, out)


def take_screenshots(srv: Served, out: Path) -> list[Path]:
    """The demo played into ``srv``'s tenant ``acme``, then a screenshot of each page into ``out``."""
    shots: list[Path] = []
    with chromium() as browser:
        soul, correction = _demo(srv)
        page = browser.new_page(viewport={"width": 1200, "height": 760})

        def shot(name: str, full: bool = True) -> None:
            page.wait_for_load_state("networkidle")
            path = out / f"{name}.png"
            page.screenshot(path=str(path), full_page=full)
            shots.append(path)

        def go(fragment: str, ready: str) -> None:
            page.goto(f"{srv.url}/ui/#/souls/{soul}{fragment}")
            page.locator(ready).first.wait_for()

        page.goto(srv.url + "/ui/")
        page.get_by_label("API key").wait_for()
        shot("key", full=False)
        sign_in(page, srv.url, srv.keys["acme"])
        page.get_by_role("link", name=soul).wait_for()
        shot("souls", full=False)
        go("/timeline", "li.episode")
        shot("timeline")
        go("/facts", "li.fact")
        page.locator("li.fact", has_text="production database").locator("summary").click()
        page.locator("table.history").wait_for()
        shot("facts")
        go("/procedures", "article.procedure")
        shot("procedures")
        go("/turns", "table.turns")
        shot("turns", full=False)
        go(f"/turns/{correction}", "table.writes")
        shot("turn")
        go("/recall", "#r-q")
        page.get_by_label("Query").fill("Which Postgres does Tendril run in production?")
        page.get_by_label("Token budget").fill("120")
        page.get_by_role("button", name="Recall").click()
        page.locator("table.packed").wait_for()
        shot("recall")
        go("/timeline", "li.episode")
        page.get_by_role("button", name="Forget episode ep-").first.click()
        page.locator("dialog[open]").wait_for()
        shot("forget", full=False)
        page.keyboard.press("Escape")
        go("/erase", "#h-erase")
        page.get_by_role("button", name=f"Erase {soul}").click()
        page.get_by_label(f"Type {soul} to confirm").fill(soul)
        shot("erase", full=False)
        page.keyboard.press("Escape")
        page.set_viewport_size({"width": 390, "height": 844})
        go("/timeline", "li.episode")
        shot("narrow", full=False)
    return shots


if __name__ == "__main__":
    for p in screenshots(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/inspector")):
        print(p)
