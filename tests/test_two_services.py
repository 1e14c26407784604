"""Two ``soul serve`` on one machine at once, each on its own data dir (its own local runtime, Serve and HAProxy):
both start and answer, each with its own tenants. Serve's HAProxy also listens on a stats port and a Prometheus
port, fixed by Serve; the service gives each HAProxy ports of its own, so the second no longer fails to start.

The first is started with ``--cors-origin``: through its real ingress (HAProxy, the replica), a page of that origin
gets its preflight and its answers with the CORS headers, any other origin none; the second, started without,
sends none to anyone. The second is also started with ``--no-inspector``: its ``/ui/`` is a 404, the first's serves
the pages, and both answer ``/v1``.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes import wait_healthy

pytestmark = pytest.mark.ray

SOUL = shutil.which("soul")
PAGE_HTML = b"<!doctype html><title>a web app on another origin</title>"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _haproxy_ports(serve_port: int) -> set[int]:
    """Every port the haproxy whose configuration binds ``serve_port`` binds."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() != "haproxy":
                continue
            args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            conf = Path(args[args.index("-f") + 1]).read_text()
        except (OSError, ValueError, IndexError):
            continue
        ports = {int(p) for p in re.findall(r"^\s*bind\s+\S*:(\d+)\b", conf, re.M)}
        if serve_port in ports:
            return ports
    return set()


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the handler's protocol
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(PAGE_HTML)))
        self.end_headers()
        self.wfile.write(PAGE_HTML)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def pages() -> Iterator[tuple[str, str]]:
    """Two web apps' origins, each a real page server on 127.0.0.1 (a page the browser loaded from loopback may call
    a service on loopback; one it did not load from there needs a permission for that): the first is allowed by
    the first service, the second by none."""
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page) for _ in range(2)]
    for srv in servers:
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        allowed, other = (f"http://localhost:{srv.server_address[1]}" for srv in servers)
        yield allowed, other
    finally:
        for srv in servers:
            srv.shutdown()
            srv.server_close()


@pytest.fixture(scope="module")
def services(pages: tuple[str, str]) -> Iterator[list[dict[str, Any]]]:
    assert SOUL, "the `soul` console script is not installed: run `pip install -e .`"
    base = Path(tempfile.mkdtemp(prefix="two", dir="/tmp"))
    started: list[dict[str, Any]] = []
    try:
        for i, extra in enumerate((["--cors-origin", pages[0]], ["--no-inspector"])):
            env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "SOUL_"))}
            env["SOUL_DATA_DIR"] = str(base / f"data{i}")
            add = subprocess.run([SOUL, "tenants", "add", "acme", "--json"], env=env, capture_output=True, text=True,
                                 timeout=120, stdin=subprocess.DEVNULL, check=True)
            port = _free_port()
            log = base / f"serve{i}.log"
            with open(log, "w") as out:
                proc = subprocess.Popen([SOUL, "serve", "--port", str(port), *extra], env=env, stdout=out,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            started.append({"url": f"http://127.0.0.1:{port}", "port": port, "proc": proc, "log": log, "env": env,
                            "key": json.loads(add.stdout)["key"]})
        for s in started:  # started side by side, then each waited for
            wait_healthy(s["proc"], s["url"], s["log"])
        yield started
    finally:
        for s in started:
            if s["proc"].poll() is None:
                s["proc"].send_signal(signal.SIGTERM)
        for s in started:
            try:
                s["proc"].wait(120)
            except subprocess.TimeoutExpired:
                s["proc"].kill()
            subprocess.run([SOUL, "down"], env=s["env"], capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
        shutil.rmtree(base, ignore_errors=True)


def _listening_ports(data_dir: str) -> set[int]:
    """The ports every process of the data dir's local runtime (its head, workers, HAProxy) listens on."""
    from soul_apps.cluster.listening_ports import listeners
    from soul_apps.cluster.local_cluster import head_status
    from soul_apps.cluster.local_runtime import state_dir
    status = head_status(state_dir(data_dir))
    assert status is not None and status["running"], data_dir
    return {s.port for s in listeners(status["pids_alive"])}


def test_ports_not_set_are_free_ones_with_haproxy_only() -> None:
    from soul_apps.service.serve_app import HAPROXY_ENV, HAPROXY_PORTS, ingress_env, node_ports
    free = node_ports()
    assert len(set(free)) == len(HAPROXY_PORTS) and all(p > 0 for p in free)
    env = ingress_env("haproxy", binary=True, free_ports=free)
    assert {k: env[k] for k in HAPROXY_PORTS} == {k: str(p) for k, p in zip(HAPROXY_PORTS, free, strict=True)}
    assert env["RAY_SERVE_ENABLE_HA_PROXY"] == HAPROXY_ENV["RAY_SERVE_ENABLE_HA_PROXY"]
    assert not set(HAPROXY_PORTS) & set(ingress_env("proxy", binary=True, free_ports=free))
    os.environ["RAY_SERVE_HAPROXY_STATS_PORT"] = "18404"  # the operator's own choice stays
    try:
        assert ingress_env("haproxy", binary=True, free_ports=free)["RAY_SERVE_HAPROXY_STATS_PORT"] == "18404"
    finally:
        del os.environ["RAY_SERVE_HAPROXY_STATS_PORT"]


def test_two_services_side_by_side_each_with_its_own_tenants(services: list[dict[str, Any]]) -> None:
    a, b = services
    shared = _listening_ports(a["env"]["SOUL_DATA_DIR"]) & _listening_ports(b["env"]["SOUL_DATA_DIR"])
    assert not shared, shared  # a port both listen on (SO_REUSEPORT) hands one's requests to the other
    for s, other in ((a, b), (b, a)):
        assert httpx.get(s["url"] + "/healthz", timeout=30).json() == {"status": "ok"}
        for _ in range(10):
            mine = httpx.get(s["url"] + "/v1/souls", headers={"Authorization": f"Bearer {s['key']}"}, timeout=60)
            assert mine.status_code == 200, (s["url"], mine.text)
            theirs = httpx.get(s["url"] + "/v1/souls", headers={"Authorization": f"Bearer {other['key']}"},
                               timeout=60)
            assert theirs.status_code == 401  # another data dir's key
    if sys.platform.startswith("linux"):  # ray[serve] brings haproxy there: each service's binds ports of its own
        pa, pb = _haproxy_ports(a["port"]), _haproxy_ports(b["port"])
        assert len(pa) >= 3 and len(pb) >= 3 and not pa & pb, (pa, pb)  # the service's, stats, Prometheus
        for s, binds in ((a, pa), (b, pb)):  # soul serve says where HAProxy's stats and metrics are
            deadline = time.monotonic() + 60  # it says so once it has seen /healthz answer too
            while "Ctrl-C stops" not in s["log"].read_text() and time.monotonic() < deadline:
                time.sleep(0.2)
            text = " ".join(s["log"].read_text().split())
            found = re.search(r"stats at :(\d+)/stats, its metrics at :(\d+)/metrics", text)
            assert found, text[-2000:]
            stats, metrics = int(found[1]), int(found[2])
            assert {stats, metrics} <= binds, (stats, metrics, binds)
            assert httpx.get(f"http://127.0.0.1:{stats}/stats", timeout=30).status_code == 200
            assert "haproxy_" in httpx.get(f"http://127.0.0.1:{metrics}/metrics", timeout=30).text


def test_a_service_without_the_inspector(services: list[dict[str, Any]]) -> None:
    a, b = services
    page = httpx.get(a["url"] + "/ui/", timeout=60)
    assert page.status_code == 200 and 'id="app"' in page.text
    for path in ("/ui/", "/ui/app.js"):
        assert httpx.get(b["url"] + path, timeout=60).status_code == 404
    souls = httpx.get(b["url"] + "/v1/souls", headers={"Authorization": f"Bearer {b['key']}"}, timeout=60)
    assert souls.status_code == 200 and "souls" in souls.json(), souls.text
    assert httpx.get(b["url"] + "/v1/souls", timeout=60).status_code == 401  # /v1 as it is: a key is needed


def test_cors_through_a_real_service(services: list[dict[str, Any]], pages: tuple[str, str]) -> None:
    a, b = services
    page = pages[0]
    preflight = {"Origin": page, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type,idempotency-key"}
    pre = httpx.options(a["url"] + "/v1/souls/maya/turns", headers=preflight, timeout=60)
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == page, (pre.status_code,
                                                                                          pre.headers)
    turn = httpx.post(a["url"] + "/v1/souls/maya/turns", json={"text": "Hello, I am Maya."}, timeout=120,
                      headers={"Origin": page, "Authorization": f"Bearer {a['key']}", "Idempotency-Key": "t-1"})
    assert turn.status_code == 200, turn.text
    assert turn.headers["access-control-allow-origin"] == page
    assert "retry-after" in turn.headers["access-control-expose-headers"].lower()

    def cors(r: httpx.Response) -> dict[str, str]:
        return {k: v for k, v in r.headers.items() if k.lower().startswith("access-control-")}

    other = httpx.get(a["url"] + "/v1/souls", timeout=60,
                      headers={"Origin": "http://elsewhere.test", "Authorization": f"Bearer {a['key']}"})
    assert other.status_code == 200 and cors(other) == {}
    assert cors(httpx.options(a["url"] + "/v1/souls/maya/turns", timeout=60,
                              headers={**preflight, "Origin": "http://elsewhere.test"})) == {}
    assert cors(httpx.options(b["url"] + "/v1/souls/maya/turns", headers=preflight, timeout=60)) == {}
    plain = httpx.get(b["url"] + "/v1/souls", headers={"Origin": page, "Authorization": f"Bearer {b['key']}"},
                      timeout=60)
    assert plain.status_code == 200 and cors(plain) == {}


def test_a_page_of_the_named_origin_calls_the_service_from_a_browser_and_another_cannot(
        services: list[dict[str, Any]], pages: tuple[str, str]) -> None:
    """Headless Chromium (the system's, through Playwright) on each web app's page sends a turn to the first service
    with the headers the TypeScript client sends (the key, a JSON body, an Idempotency-Key): the browser's own
    preflight and request, its own CORS check. The allowed page reads the answer; the other gets the browser's
    refusal, and the service applied nothing for it."""
    from tests.inspector_browser import CHROMIUM, chromium
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    a = services[0]
    sent: dict[str, Any] = {}
    with chromium() as browser:
        page = browser.new_page()
        for origin in pages:
            page.goto(origin + "/app")
            sent[origin] = page.evaluate("""async ([url, key, soul]) => {
                try {
                    const r = await fetch(url + "/v1/souls/" + soul + "/turns", { method: "POST",
                        headers: { authorization: "Bearer " + key, "content-type": "application/json",
                                   "idempotency-key": crypto.randomUUID(), accept: "application/json" },
                        body: JSON.stringify({ text: "Hello from a web app." }) });
                    return { status: r.status, turn: (await r.json()).turn_id, origin: location.origin };
                } catch (e) {
                    return { error: e.name, origin: location.origin };
                }
            }""", [a["url"], a["key"], "page-" + origin.rsplit(":", 1)[1]])
    allowed, other = pages
    assert sent[allowed] == {"status": 200, "turn": f"page-{allowed.rsplit(':', 1)[1]}/1", "origin": allowed}, sent
    assert sent[other] == {"error": "TypeError", "origin": other}, sent
    souls = httpx.get(a["url"] + "/v1/souls", headers={"Authorization": f"Bearer {a['key']}"}, timeout=60).json()
    assert f"page-{allowed.rsplit(':', 1)[1]}" in json.dumps(souls)
    assert f"page-{other.rsplit(':', 1)[1]}" not in json.dumps(souls)  # refused at the preflight: nothing sent
