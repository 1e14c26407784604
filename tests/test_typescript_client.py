"""The TypeScript client (``clients/typescript``) against a real ``soul serve``: its dev dependencies installed
from its lock file (``npm ci``, unless they already are), built with ``tsc``, type-checked against types generated
afresh from the running server's ``/openapi.json``, and its Node test suite (``node --test``) run against the
server (any Node test failing fails here), and the built module run in headless Chromium. Skipped where ``node``
or ``npm`` is not installed (the browser test also where Chromium is not)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.inspector_browser import CHROMIUM, Served, chromium

pytestmark = [pytest.mark.ray,
              pytest.mark.skipif(not (shutil.which("node") and shutil.which("npm")),
                                 reason="the TypeScript client's tests need Node.js >= 20 and npm on PATH")]

PKG = Path(__file__).resolve().parent.parent / "clients" / "typescript"


def _run(args: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None) -> str:
    p = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 0, f"{' '.join(args)} exited {p.returncode}\n{p.stdout[-20000:]}\n{p.stderr[-5000:]}"
    return p.stdout


@pytest.fixture(scope="module")
def built() -> Path:
    """The package with its dev dependencies installed and built into dist/."""
    major = int(_run(["node", "--version"], PKG, 30).strip().lstrip("v").split(".")[0])
    if major < 20:
        pytest.skip(f"the TypeScript client needs Node.js >= 20 (found {major})")
    installed = PKG / "node_modules" / ".package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < (PKG / "package-lock.json").stat().st_mtime:
        _run(["npm", "ci", "--no-audit", "--no-fund"], PKG, 600)
    _run([str(PKG / "node_modules" / ".bin" / "tsc"), "-p", "tsconfig.json"], PKG, 300)
    return PKG


@pytest.fixture(scope="module")
def server(served_pair: Served) -> dict[str, Any]:
    """``soul serve`` on a temp data dir with two tenants (:func:`tests.inspector_browser.served`: Serve's Python
    proxy ingress, Ray's start tried again on a loaded machine), shared with the inspector's and the HTTP client's
    tests (tests/conftest.py); stopped by its pid, its runtime by ``soul down``."""
    return {"url": served_pair.url, "key": served_pair.keys["acme"], "other_key": served_pair.keys["beta"]}


def test_client_compiles_against_the_running_servers_document(built: Path, server: dict[str, Any],
                                                              tmp_path: Path) -> None:
    """The client's sources type-check with ``src/openapi.ts`` generated afresh from the live ``/openapi.json``:
    its types follow the document on regeneration (``npm run generate``)."""
    (tmp_path / "openapi.json").write_text(httpx.get(server["url"] + "/openapi.json", timeout=30).text)
    shutil.copytree(built / "src", tmp_path / "src")
    for name in ("tsconfig.json", "package.json"):  # package.json: "type": "module"
        shutil.copy(built / name, tmp_path / name)
    bin_dir = built / "node_modules" / ".bin"
    _run([str(bin_dir / "openapi-typescript"), str(tmp_path / "openapi.json"), "-o", str(tmp_path / "src" / "openapi.ts")],
         tmp_path, 120)
    _run([str(bin_dir / "tsc"), "-p", str(tmp_path / "tsconfig.json"), "--noEmit"], tmp_path, 300)


def test_readme_examples_compile(built: Path, tmp_path: Path) -> None:
    """The README's TypeScript examples that import the package type-check against its built declarations."""
    blocks = [b.split("\n", 1)[1] for b in (built / "README.md").read_text().split("```")[1::2]
              if b.startswith("ts\n") and '"@soul-runtime/client"' in b]
    assert len(blocks) >= 2, "the README's examples of the client are gone"
    for i, block in enumerate(blocks):
        (tmp_path / f"example{i}.ts").write_text("declare const process: { env: Record<string, string | undefined> };\n"
                                                 + block + "\nexport {};\n")
    (tmp_path / "package.json").write_text('{"type": "module"}')
    (tmp_path / "tsconfig.json").write_text(json.dumps({
        "compilerOptions": {"target": "ES2022", "module": "NodeNext", "moduleResolution": "NodeNext", "strict": True,
                            "lib": ["ES2022", "DOM"], "types": [], "noEmit": True, "skipLibCheck": True,
                            "paths": {"@soul-runtime/client": [str(built / "dist" / "index.d.ts")]}},
        "include": ["*.ts"]}))
    _run([str(built / "node_modules" / ".bin" / "tsc"), "-p", str(tmp_path / "tsconfig.json")], tmp_path, 300)


def test_node_suite_against_a_real_server(built: Path, server: dict[str, Any]) -> None:
    """``node --test`` on every test file of the package (routes, errors, retries, the OpenAPI document)."""
    files = sorted(str(p.relative_to(built)) for p in (built / "test").glob("*.test.js"))
    assert files, "no Node test files"
    env = {**os.environ, "SOUL_TEST_URL": server["url"], "SOUL_TEST_KEY": server["key"],
           "SOUL_TEST_OTHER_KEY": server["other_key"]}
    p = subprocess.run(["node", "--test", *files], cwd=built, env=env, capture_output=True, text=True, timeout=600,
                       stdin=subprocess.DEVNULL)
    tail = "\n".join(p.stdout.splitlines()[-12:])
    print(tail)
    assert p.returncode == 0, f"node --test exited {p.returncode}\n{p.stdout[-30000:]}\n{p.stderr[-5000:]}"
    counts = {k: int(v) for k, v in (line[2:].split(" ", 1) for line in p.stdout.splitlines()
                                     if line.startswith("# ") and line[2:].split(" ")[0] in ("tests", "pass", "fail"))}
    assert counts.get("fail") == 0 and counts.get("pass", 0) == counts.get("tests", -1) > 0, tail


def test_the_built_module_in_a_browser(built: Path, server: dict[str, Any]) -> None:
    """The built ESM in headless Chromium (the system's, through Playwright), on a page of the service's origin
    (the module's files are answered by the page's router, not the service): a turn, a recall, an export and a
    refusal as its class."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    dist = built / "dist"

    def module(route: Any) -> None:
        name = route.request.url.rsplit("/__client__/", 1)[1].split("?")[0]
        if (dist / name).is_file():
            route.fulfill(path=str(dist / name), content_type="text/javascript")
        else:
            route.fulfill(status=404)

    with chromium() as browser:
        page = browser.new_page()
        page.route("**/__client__/**", module)
        page.goto(server["url"] + "/healthz")
        out = page.evaluate("""async (key) => {
            const { SoulClient, NotFound } = await import("/__client__/index.js");
            const soul = new SoulClient({ baseUrl: location.origin, apiKey: key })
                .soul("browser-" + crypto.randomUUID().slice(0, 8));
            const turn = await soul.turn("Our staging cluster is in Frankfurt.", { user: "Ana" });
            const items = await soul.recall("staging cluster");
            const blob = await soul.export();
            const refused = await soul.trace(99).catch((e) => [e.name, e instanceof NotFound, e.status]);
            return { turn: turn.turn_id, texts: items.map((i) => i.text), bytes: blob instanceof Uint8Array
                     ? blob.length : -1, refused, agent: navigator.userAgent };
        }""", server["key"])
    assert out["turn"].startswith("browser-") and out["turn"].endswith("/1"), out
    assert any("Frankfurt" in t for t in out["texts"]), out
    assert out["bytes"] > 0 and out["refused"] == ["NotFound", True, 404], out
    assert "Chrome" in out["agent"], out
