"""The memory inspector at ``/ui/`` in a real browser (Debian's headless Chromium through Playwright) against a real
``soul serve`` with two tenants: a key per browser session, a soul's layers, a fact's history after a correction, the
turn that made it, forgetting an episode, erasing a soul, and another tenant's key seeing none of it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.inspector_browser import Served, chromium, observe, sign_in, turn

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def srv(served_pair: Served) -> Served:
    """``soul serve`` with tenants acme and beta, shared with the TypeScript client's and the HTTP client's tests
    (tests/conftest.py)."""
    return served_pair


@pytest.fixture(scope="module")
def souls(srv: Served) -> dict[str, Any]:
    """acme's soul with a stated, confirmed then corrected fact and an observed message; a scratch soul to erase;
    beta's own soul."""
    a, b = srv.client("acme"), srv.client("beta")
    maya, scratch, other = (f"{n}-{uuid.uuid4().hex[:6]}" for n in ("maya", "scratch", "beta-soul"))
    turn(a, maya, "The production database for Tendril is Postgres 15.", "2026-03-02T09:00:00Z")
    turn(a, maya, "Yes, that's right.", "2026-03-02T09:01:00Z")
    fix = turn(a, maya, "Actually, it's Postgres 16.", "2026-03-03T09:00:00Z")
    obs = observe(a, maya, [{"speaker": "Maya", "text": "We rolled back the cache deploy after the latency spike.",
                             "id": "standup-7"}], "2026-03-03T10:00:00Z", "standup")
    turn(a, scratch, "Our staging cluster is in Frankfurt.", "2026-03-04T09:00:00Z")
    turn(b, other, "The refund window for annual plans is 30 days.", "2026-03-05T09:00:00Z")
    [update] = [w for w in fix["writes"] if w["op"] == "UPDATE"]
    [episode] = [w["key"] for w in obs["writes"] if w["store"] == "episodic"]
    return {"maya": maya, "scratch": scratch, "other": other, "fix_seq": fix["seq"], "update": update,
            "episode": episode}


def test_the_shipped_page_is_the_built_one() -> None:
    """The committed ``ui_dist/index.html`` is what the UI build copies from ``ui/src/index.html``, and the
    bundles it loads are there (a change to the source page without a build is noticed here)."""
    from soul_apps.service.inspector import DIST
    root = Path(__file__).resolve().parents[1]
    page = (DIST / "index.html").read_text()
    assert page == (root / "ui" / "src" / "index.html").read_text()
    refs = re.findall(r'(?:src|href)="([\w.-]+\.(?:js|css))"', page)
    assert refs and all((DIST / ref).is_file() for ref in refs), refs


def test_the_mount_is_off_the_v1_path(tmp_path: Path) -> None:
    """The pages are one mount after every /v1 route, and no middleware: a /v1 request is matched by its own route
    before the mount is tried, so it runs as it would without the inspector."""
    from soul_apps.service.app import build_service
    app = build_service(str(tmp_path))
    paths = [getattr(r, "path", "") for r in app.router.routes]
    ui = paths.index("/ui")
    assert ui == len(paths) - 1 and sum(p.startswith("/v1") for p in paths) >= 15
    from fastapi import FastAPI

    from soul_apps.service.inspector import mount_inspector
    bare = FastAPI()
    assert mount_inspector(bare).user_middleware == []  # the inspector adds no middleware of its own


def test_without_the_inspector_ui_is_a_404_and_v1_is_the_same(tmp_path: Path) -> None:
    """The app a replica builds with and without the inspector (``soul serve --no-inspector``), read through
    FastAPI's test client: /ui/ serves the page or is a 404; every other route, the OpenAPI document and a /v1
    answer are the same either way."""
    from fastapi.testclient import TestClient

    from soul_apps.service.app import build_service
    from soul_apps.service.tenants import TenantTable
    key = TenantTable(str(tmp_path)).add("acme")
    apps = {on: build_service(str(tmp_path), inspector=on) for on in (True, False)}
    with_ui, without = (TestClient(apps[on]) for on in (True, False))
    assert with_ui.get("/ui/").status_code == 200 and 'id="app"' in with_ui.get("/ui/").text
    for path in ("/ui/", "/ui", "/ui/app.js"):
        r = without.get(path, follow_redirects=False)
        assert r.status_code == 404, (path, r.status_code, r.text[:200])
    paths = {on: [getattr(r, "path", "") for r in apps[on].router.routes] for on in (True, False)}
    assert paths[True] == paths[False] + ["/ui"]
    assert with_ui.get("/openapi.json").json() == without.get("/openapi.json").json()
    for c in (with_ui, without):  # no key, a wrong key, a tenant's key on a soul id /v1 refuses
        assert c.get("/v1/souls").status_code == 401
        assert c.get("/v1/souls", headers={"Authorization": "Bearer soul_nope"}).status_code == 401
        bad = c.get("/v1/souls/no%20such/stats", headers={"Authorization": f"Bearer {key}"})
        assert bad.status_code in (400, 422) and bad.json()["error"]["type"] == "InvalidInput", bad.text


def test_the_switch_reaches_each_replica_and_bad_values_are_refused() -> None:
    """A Serve config's ``inspector`` and ``soul serve``'s env default are checked, and what a replica builds its
    app with is the bound deployment's keyword."""
    from soul_apps.service.inspector import parse_env
    from soul_apps.service.serve_app import app_builder
    from soul_runtime.errors import InvalidInput
    assert [parse_env(v) for v in (None, "", "on", "1", "True", " yes ")] == [True] * 6
    assert [parse_env(v) for v in ("off", "0", "FALSE", "no")] == [False] * 4
    with pytest.raises(InvalidInput, match="SOUL_INSPECTOR must be on or off"):
        parse_env("maybe")
    assert app_builder({"data_dir": "/tmp/x"})._bound_deployment.init_kwargs["inspector"] is True
    assert app_builder({"data_dir": "/tmp/x", "inspector": False})._bound_deployment.init_kwargs["inspector"] is False
    with pytest.raises(InvalidInput, match="inspector must be true or false"):
        app_builder({"data_dir": "/tmp/x", "inspector": "off"})


def test_soul_serve_refuses_a_bad_inspector_setting_before_it_starts_anything(tmp_path: Path) -> None:
    soul = shutil.which("soul")
    assert soul, "the `soul` console script is not installed: run `pip install -e .`"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SOUL_"))}
    env.update(SOUL_DATA_DIR=str(tmp_path / "data"), SOUL_INSPECTOR="maybe")
    p = subprocess.run([soul, "serve", "--port", "1"], env=env, capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 2 and "SOUL_INSPECTOR must be on or off" in p.stderr, (p.returncode, p.stderr)
    assert not (tmp_path / "data" / "cluster").exists()  # no runtime was started for it


def test_pages_are_static_and_the_context_route_is_the_tenants(srv: Served, souls: dict[str, Any]) -> None:
    """/ui/ serves files (no data, no key needed to load them); the one read route the pages add answers a key
    only about its own tenant's souls, like every /v1 route."""
    anon = httpx.Client(base_url=srv.url, timeout=60)
    page = anon.get("/ui/")
    assert page.status_code == 200 and 'id="app"' in page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert anon.get("/ui", follow_redirects=False).status_code in (301, 307, 308)
    assert anon.get("/ui/app.js").status_code == 200 and anon.get("/ui/nothing.js").status_code == 404
    assert anon.get("/ui/../v1/souls").status_code == 401  # a path out of /ui/ is a /v1 route: it needs a key
    maya = souls["maya"]
    ctx = f"/v1/souls/{maya}/context"
    assert anon.get(ctx, params={"q": "postgres"}).status_code == 401
    full = srv.client("acme").get(ctx, params={"q": "Which Postgres does Tendril run?", "budget": 2000}).json()
    assert full["items"] and all(i["shown"] for i in full["items"])
    assert full["used_tokens"] == sum(i["tokens"] for i in full["items"]) <= 2000
    assert [i["rank"] for i in full["items"]] == list(range(1, len(full["items"]) + 1))
    assert any("Postgres 16" in (i["line"] or "") for i in full["items"])
    assert sorted(i["position"] for i in full["items"]) == list(range(1, len(full["items"]) + 1))
    tight = srv.client("acme").get(ctx, params={"q": "Which Postgres does Tendril run?", "budget": 30}).json()
    shown = [i for i in tight["items"] if i["shown"]]
    assert len(shown) < len(tight["items"]) and tight["used_tokens"] <= 30
    assert all(i["line"] is None and i["tokens"] is None and i["position"] is None
               for i in tight["items"] if not i["shown"])
    bad = srv.client("acme").get(ctx, params={"q": "x", "budget": 0})
    assert bad.status_code in (400, 422) and bad.json()["error"]["type"] == "InvalidInput", bad.text
    theirs = srv.client("beta").get(ctx, params={"q": "Which Postgres does Tendril run?"})
    assert theirs.status_code == 404 and theirs.json()["error"]["type"] == "NotFound", theirs.text  # not beta's
    assert maya not in srv.client("beta").get("/v1/souls").text


def test_inspector_in_a_browser(srv: Served, souls: dict[str, Any]) -> None:
    maya, scratch, other, seq = souls["maya"], souls["scratch"], souls["other"], souls["fix_seq"]
    with chromium() as browser:
        ctx = browser.new_context(viewport={"width": 1100, "height": 800})
        page = ctx.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        requests: list[Any] = []
        page.on("request", lambda r: requests.append(r))

        # a wrong key is refused; the right one, typed and sent with Enter, is kept for the tab's session only
        page.goto(srv.url + "/ui/")
        key_box = page.get_by_label("API key")
        key_box.fill("soul_not-a-key")
        key_box.press("Enter")
        page.get_by_role("alert").filter(has_text="not valid").wait_for()
        sign_in(page, srv.url, srv.keys["acme"])
        assert page.evaluate("sessionStorage.getItem('soul-inspector.key')") == srv.keys["acme"]
        assert page.evaluate("localStorage.length") == 0 and not ctx.cookies()

        # souls of the tenant, searchable, with counts per layer and last activity
        row = page.get_by_role("row").filter(has=page.get_by_role("link", name=maya))
        row.get_by_text("ago").wait_for()  # last activity: the stats and the newest trace have come
        cells = row.locator("td").all_inner_texts()
        assert cells[1] == "1" and cells[3] == "4", cells  # one fact; four turns
        assert page.get_by_role("link", name=scratch).count() == 1 and page.get_by_role("link", name=other).count() == 0
        page.get_by_label("Search souls").fill("scratch-")
        page.get_by_role("link", name=maya).wait_for(state="detached")
        assert page.get_by_role("link", name=scratch).count() == 1
        page.get_by_label("Search souls").fill("")
        # the tenant's usage: its souls as the list counts them, and its counts
        usage = page.locator("section.usage")
        usage.locator("table.usage").wait_for()
        listed = page.get_by_role("status").filter(has_text=" of ").inner_text().split()[2]
        assert usage.get_by_role("row").filter(has_text="Souls").locator("td").inner_text() == listed
        assert "Limits: none" in usage.inner_text()
        page.get_by_role("link", name=maya).click()

        # the episodic timeline: dated, with its session and provenance down to the message
        ep = souls["episode"]
        item = page.locator(f"li.episode[data-id='{ep}']")
        item.wait_for()
        text = item.inner_text()
        assert "latency spike" in text and "standup" in text and "2026-03-03 10:00 UTC" in text and "decaying" in text
        observed = item.get_by_role("link", name="observed in turn 4")
        observed.wait_for()  # the link comes with the soul's writes, which the page loads after its episodes
        assert observed.count() == 1 and "standup-7" in text
        first = page.locator("li.episode", has_text="Postgres 15.").last
        assert first.get_by_role("link", name="turn 1 · user message").count() == 1

        # a fact's history after the correction: both values, how each came, and the turn that made the new one
        page.get_by_role("link", name="Facts").click()
        fact = page.locator("li.fact", has_text="production database")
        fact.locator("summary").click()
        hist = fact.locator("table.history")
        hist.wait_for()
        rows = hist.locator("tbody tr").all_inner_texts()
        assert len(rows) == 2 and rows[0].startswith("Postgres 15") and rows[1].startswith("Postgres 16"), rows
        assert "confirmed" in rows[0] and "corrected" in rows[0] and "corrected" in rows[1] and "current" in rows[1]
        hist.locator("tbody tr").nth(1).get_by_role("link", name=f"turn {seq}", exact=True).click()

        # the turn that made it: what it recalled, its decision, and the write with its op and reason
        page.get_by_role("heading", name=f"Turn {seq}").wait_for()
        w = page.locator(f"table.writes tr[data-op='UPDATE'][data-key='{souls['update']['key']}']")
        w.wait_for()
        assert souls["update"]["reason"] in w.inner_text() and "Postgres 16" in w.inner_text()
        assert page.locator("table.recalled tbody tr").count() >= 1
        assert "soul-offline-rules-v1" in page.locator("dl.facts-list").first.inner_text()
        assert page.locator("table.usage").get_by_role("row", name=re.compile("^all")).count() == 1

        # the recall playground: ranked items, and which lines fit the budget
        page.get_by_role("link", name="Recall").click()
        page.get_by_label("Query").fill("Which Postgres does Tendril run?")
        page.get_by_label("Token budget").fill("30")
        page.get_by_role("button", name="Recall").click()
        page.locator("table.packed").wait_for()
        assert page.locator("table.packed tr.shown").count() >= 1 and page.locator("table.packed tr.cut").count() >= 1

        # the digests, brought up to date as the page reads them: the standup session's names the observed
        # episode it was written from and the message it quotes
        page.get_by_role("link", name="Digests").click()
        standup = page.locator("li.digest[data-kind='session']", has_text="standup")
        standup.wait_for()
        assert "latency spike" in standup.inner_text() and "standup-7" in standup.inner_text()
        assert standup.locator("ul.episodes-of code").all_inner_texts() == [ep]

        # forget the observed episode: Escape cancels; confirming deletes it through POST /forget
        page.get_by_role("link", name="Timeline").click()
        forget = page.get_by_role("button", name=f"Forget episode {ep}")
        forget.click()
        page.locator("dialog[open]").wait_for()
        page.keyboard.press("Escape")
        page.locator("dialog[open]").wait_for(state="detached")
        assert item.count() == 1
        forget.click()
        page.locator("dialog[open]").get_by_role("button", name="Forget").click()
        page.get_by_role("status").filter(has_text=f"Forgot {ep}").wait_for()
        item.wait_for(state="detached")
        assert ep not in {e["id"] for e in srv.client("acme").get(f"/v1/souls/{maya}/episodes").json()["episodes"]}
        page.get_by_role("link", name="Digests").click()  # no digest names it or quotes it any more
        page.locator("#h-digests").wait_for()
        page.wait_for_load_state("networkidle")
        assert "latency spike" not in page.locator("main").inner_text() and page.locator(f"code:text-is('{ep}')").count() == 0

        # erase a soul: only once its id is typed
        page.goto(f"{srv.url}/ui/#/souls/{scratch}/erase")
        page.get_by_role("button", name=f"Erase {scratch}").click()
        go = page.locator("dialog[open]").get_by_role("button", name="Erase for good")
        assert go.is_disabled()
        page.get_by_label(f"Type {scratch} to confirm").fill(scratch)
        go.click()
        page.get_by_text("is erased").wait_for()
        assert srv.client("acme").get(f"/v1/souls/{scratch}/facts").json() == {"facts": []}

        # a narrow window: nothing runs off the side
        page.set_viewport_size({"width": 380, "height": 800})
        page.goto(f"{srv.url}/ui/#/souls/{maya}/timeline")
        page.locator("li.episode").first.wait_for()
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")

        # every request went to the service's own /ui/ and /v1, the key only ever in a header
        key = srv.keys["acme"]
        for r in requests:
            assert r.url.startswith(srv.url + "/ui/") or r.url.startswith(srv.url + "/v1/"), r.url
            assert key not in r.url
            if "/v1/" in r.url:
                assert r.headers.get("authorization", "").startswith("Bearer "), r.url
        page.get_by_role("button", name="Forget key").click()
        page.get_by_label("API key").wait_for()
        assert page.evaluate("sessionStorage.length") == 0
        assert not errors, errors
        ctx.close()

        # another tenant's key: its own soul only, and nothing of acme's, even at acme's soul's address
        other_ctx = browser.new_context()
        page = other_ctx.new_page()
        sign_in(page, srv.url, srv.keys["beta"])
        page.get_by_role("link", name=other).wait_for()
        assert page.get_by_role("link", name=maya).count() == 0 and maya not in page.content()
        for tab, ready in (("timeline", "#h-timeline"), ("digests", "#h-digests"), ("facts", "#h-facts"),
                           (f"turns/{seq}", "#h-turn")):
            page.goto(f"{srv.url}/ui/#/souls/{maya}/{tab}")
            page.locator(ready).wait_for()
            page.wait_for_load_state("networkidle")
            body = page.locator("main").inner_text()
            assert "Postgres" not in body and "latency" not in body, (tab, body)
        assert page.locator("li.episode").count() == 0
        other_ctx.close()
