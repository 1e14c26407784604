"""The TypeScript client (``clients/typescript``) against a real ``soul serve``: its dev dependencies installed
from its lock file (``npm ci``, unless they already are), built with ``tsc``, type-checked against types generated
afresh from the running server's ``/openapi.json``, and its Node test suite (``node --test``) run against the
server; any Node test failing fails here. Skipped only where ``node`` or ``npm`` is not installed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = [pytest.mark.ray,
              pytest.mark.skipif(not (shutil.which("node") and shutil.which("npm")),
                                 reason="the TypeScript client's tests need Node.js >= 20 and npm on PATH")]

PKG = Path(__file__).resolve().parent.parent / "clients" / "typescript"
SOUL = shutil.which("soul")


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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server() -> Iterator[dict[str, Any]]:
    """``soul serve`` on a temp data dir with two tenants; stopped by its pid, its local runtime by ``soul down``."""
    assert SOUL, "the `soul` console script is not installed: run `pip install -e .`"
    base = Path(tempfile.mkdtemp(prefix="svts", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "SOUL_"))}
    env["SOUL_DATA_DIR"] = str(base / "data")

    def soul(*args: str, check: bool = True) -> str:
        p = subprocess.run([SOUL, *args], env=env, capture_output=True, text=True, timeout=180,
                           stdin=subprocess.DEVNULL)
        assert p.returncode == 0 or not check, f"soul {' '.join(args)}: {p.stdout}\n{p.stderr}"
        return p.stdout

    keys = [json.loads(soul("tenants", "add", t, "--json"))["key"] for t in ("acme", "beta")]
    port = _free_port()
    log_path = base / "serve.log"
    log = open(log_path, "w")  # noqa: SIM115 - closed at teardown
    # Serve's Python proxy, not HAProxy: HAProxy binds fixed ports of its own (stats, metrics) that another
    # `soul serve` on the machine may hold; what the client sees does not depend on the ingress
    proc = subprocess.Popen([SOUL, "serve", "--port", str(port), "--ingress", "proxy"], env=env, stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        t0 = time.monotonic()
        while True:
            assert proc.poll() is None, log_path.read_text()
            try:
                if httpx.get(url + "/healthz", timeout=10).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() - t0 < 300, log_path.read_text()
            time.sleep(0.5)
        yield {"url": url, "key": keys[0], "other_key": keys[1], "log": log_path}
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
        log.close()
        soul("down", check=False)
        shutil.rmtree(base, ignore_errors=True)


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
