"""Cross-origin requests from browsers: none allowed unless named; a named origin's preflight and requests get the
CORS headers (the key, a JSON body and the retry key may be sent; Retry-After may be read), any other origin none.

The app is read through FastAPI's test client with a runtime that answers busy (as tests/test_openapi.py reads it):
a request that gets past the key answers 429 with Retry-After, the header a page must be able to read. The same
headers through a real ``soul serve --cors-origin`` are checked in tests/test_two_services.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from soul_apps.service.cors import ALLOW_HEADERS, add_cors, check_origins, parse_env
from soul_apps.service.http_api import Backend, build_app
from soul_apps.service.tenants import TenantTable
from soul_runtime.errors import InvalidInput, RuntimeBusy

PAGE = "https://app.example.com"
OTHER = "https://evil.example.net"


def _busy() -> Any:
    raise RuntimeBusy("the runtime admits no more turns now")


def _client(tmp_path: Path, origins: list[str]) -> tuple[TestClient, str]:
    key = TenantTable(str(tmp_path)).add("acme")
    app = build_app(Backend(str(tmp_path), _busy))
    add_cors(app, origins)
    return TestClient(app), key


def _preflight(c: TestClient, origin: str) -> Any:
    return c.options("/v1/souls/maya/turns", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, idempotency-key"})


def _cors(r: Any) -> dict[str, str]:
    return {k: v for k, v in r.headers.items() if k.lower().startswith("access-control-")}


def test_a_named_origin_is_allowed_the_key_the_body_and_the_retry_key(tmp_path: Path) -> None:
    c, key = _client(tmp_path, [PAGE, "http://localhost:5173"])
    pre = _preflight(c, PAGE)
    assert pre.status_code == 200, pre.text
    assert pre.headers["access-control-allow-origin"] == PAGE
    asked = {h.strip().lower() for h in pre.headers["access-control-allow-headers"].split(",")}
    assert {"authorization", "content-type", "idempotency-key"} <= asked
    assert "POST" in pre.headers["access-control-allow-methods"]
    assert "access-control-allow-credentials" not in pre.headers  # a key in a header, never a cookie

    r = c.post("/v1/souls/maya/turns", json={"text": "hi"},
               headers={"Origin": PAGE, "Authorization": f"Bearer {key}", "Idempotency-Key": "k-1"})
    assert r.status_code == 429 and r.headers["retry-after"], r.text
    assert r.headers["access-control-allow-origin"] == PAGE
    assert "retry-after" in r.headers["access-control-expose-headers"].lower()

    anon = c.get("/v1/souls", headers={"Origin": "http://localhost:5173"})  # a page can read its 401 too
    assert anon.status_code == 401 and anon.headers["access-control-allow-origin"] == "http://localhost:5173"


def test_another_origin_gets_no_cors_header(tmp_path: Path) -> None:
    c, key = _client(tmp_path, [PAGE])
    pre = _preflight(c, OTHER)
    assert pre.status_code == 400 and _cors(pre) == {}, pre.headers
    r = c.get("/v1/souls", headers={"Origin": OTHER, "Authorization": f"Bearer {key}"})
    assert r.status_code == 429 and _cors(r) == {}


def test_none_by_default(tmp_path: Path) -> None:
    c, key = _client(tmp_path, [])
    pre = _preflight(c, PAGE)
    assert pre.status_code == 401 and _cors(pre) == {}  # an OPTIONS without a key, as any other request
    r = c.get("/v1/souls", headers={"Origin": PAGE, "Authorization": f"Bearer {key}"})
    assert r.status_code == 429 and _cors(r) == {}


def test_every_origin_when_asked(tmp_path: Path) -> None:
    c, key = _client(tmp_path, ["*"])
    assert _preflight(c, OTHER).headers["access-control-allow-origin"] == "*"
    r = c.get("/v1/souls", headers={"Origin": OTHER, "Authorization": f"Bearer {key}"})
    assert r.headers["access-control-allow-origin"] == "*"


def test_origins_are_checked_and_written_as_a_browser_sends_them() -> None:
    assert check_origins(["HTTPS://App.Example.com/", "http://127.0.0.1:8080", "http://[::1]:3000",
                          "https://app.example.com"]) == ("https://app.example.com", "http://127.0.0.1:8080",
                                                          "http://[::1]:3000")
    assert parse_env(" https://a.example, http://b.example:81  https://a.example") == (
        "https://a.example", "http://b.example:81")
    assert parse_env("") == parse_env(None) == ()
    for bad in ("app.example.com", "https://app.example.com/path", "ftp://app.example.com", "https://",
                "https://a.example:123456", "https://a.example:99999", "null", "https://a b.example"):
        with pytest.raises(InvalidInput, match="not an origin"):
            check_origins([bad])
    assert {h.lower() for h in ALLOW_HEADERS} >= {"authorization", "idempotency-key", "content-type"}


def test_a_serve_config_file_names_its_origins_as_a_list() -> None:
    from soul_apps.service.serve_app import app_builder
    with pytest.raises(InvalidInput, match="list of origins"):
        app_builder({"data_dir": "/tmp/x", "cors_origins": PAGE})
    with pytest.raises(InvalidInput, match="not an origin"):
        app_builder({"data_dir": "/tmp/x", "cors_origins": ["app.example.com"]})
    bound = app_builder({"data_dir": "/tmp/x", "cors_origins": [PAGE + "/", PAGE]})._bound_deployment
    assert bound.init_kwargs["cors_origins"] == (PAGE,)  # what each replica builds its app with
    assert app_builder({"data_dir": "/tmp/x"})._bound_deployment.init_kwargs["cors_origins"] == ()


@pytest.mark.parametrize("how", ["flag", "env"])
def test_soul_serve_refuses_a_bad_origin_before_it_starts_anything(tmp_path: Path, how: str) -> None:
    soul = shutil.which("soul")
    assert soul, "the `soul` console script is not installed: run `pip install -e .`"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SOUL_"))}
    env["SOUL_DATA_DIR"] = str(tmp_path / "data")
    args = [soul, "serve", "--port", "1"]
    if how == "flag":
        args += ["--cors-origin", PAGE, "--cors-origin", "app.example.com"]
    else:
        env["SOUL_CORS_ORIGINS"] = f"{PAGE},app.example.com"
    p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert p.returncode == 2 and "not an origin: 'app.example.com'" in p.stderr, (p.returncode, p.stderr)
    assert not (tmp_path / "data" / "cluster").exists()  # no runtime was started for it
