"""The HTTP API's document tells the truth: it states the limits the service enforces (from
:mod:`soul_runtime.limits`, the one place they are defined), every error answer with its body, ``Allow`` on 405,
and a value past its bounds is refused 400 ``InvalidInput`` before it reaches the runtime.

Most tests read the app through FastAPI's test client with a runtime that cannot be reached (a request the HTTP
layer lets through answers 503, one it refuses answers 400/422 without touching the runtime); the last ones run
against a real ``soul serve`` (the fixture of tests/test_service.py): the integer that once answered 500, and a
bounded schemathesis run over the whole document (examples, coverage and fuzzing, every check but the
response-time limit, a wall-clock bound that belongs in benchmarks), which must find nothing.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from soul_apps.service.http_api import Backend, build_app
from soul_apps.service.tenants import TenantTable
from soul_runtime import limits
from soul_runtime.errors import InvalidInput, RuntimeUnavailable
from soul_runtime.text import check_id, check_text
from tests.test_service import _client, server  # noqa: F401  (the real `soul serve` fixture)

V = "/v1/souls/maya"
ERROR_CODES = {"400", "401", "404", "405", "422", "429", "500", "503"}


def _unreachable() -> Any:
    raise RuntimeUnavailable("no runtime in this test")


@pytest.fixture(scope="module")
def app() -> Iterator[tuple[TestClient, dict[str, Any]]]:
    data = tempfile.mkdtemp(prefix="openapi-")
    key = TenantTable(data).add("acme")
    with TestClient(build_app(Backend(data, _unreachable)), headers={"Authorization": f"Bearer {key}"}) as c:
        yield c, c.get("/openapi.json").json()


def _param(spec: dict[str, Any], path: str, method: str, name: str) -> dict[str, Any]:
    for p in spec["paths"][path][method].get("parameters", []):
        if p["name"] == name:
            return dict(p["schema"])
    raise AssertionError(f"{method} {path} has no parameter {name}")


def _choices(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """The non-null alternatives of a schema, nested ``anyOf`` flattened."""
    if "anyOf" not in schema:
        return [] if schema.get("type") == "null" else [schema]
    return [c for s in schema["anyOf"] for c in _choices(s)]


def test_the_document_states_the_limits(app: tuple[TestClient, dict[str, Any]]) -> None:
    _, spec = app
    paths = spec["paths"]
    with_soul = [(p, m) for p, ops in paths.items() if "{soul_id}" in p for m in ops]
    assert len(with_soul) >= 14
    for p, m in with_soul:
        sid = _param(spec, p, m, "soul_id")
        assert sid["pattern"] == limits.SOUL_ID_PATTERN and sid["maxLength"] == limits.SOUL_ID_MAX, (p, m)
    recall = "/v1/souls/{soul_id}/recall"
    assert _param(spec, recall, "get", "k")["maximum"] == limits.K_MAX
    assert _param(spec, recall, "get", "q")["maxLength"] == limits.QUERY_MAX
    store = _choices(_param(spec, recall, "get", "store"))[0]
    assert store["maxItems"] == 3 and spec["components"]["schemas"]["Store"]["enum"] == list(limits.STORES)
    episodes = "/v1/souls/{soul_id}/episodes"
    assert _param(spec, episodes, "get", "sessions_ago")["anyOf"][0]["maximum"] == limits.SESSIONS_AGO_MAX
    for name in ("since", "until"):
        number, text = _choices(_param(spec, episodes, "get", name))
        assert (number["minimum"], number["maximum"]) == (limits.TIME_MIN, limits.TIME_MAX)
        assert text["format"] == "date-time" and text["pattern"] == limits.ISO_PATTERN
    assert _param(spec, "/v1/souls/{soul_id}/traces", "get", "last")["maximum"] == limits.LAST_MAX
    assert _param(spec, "/v1/souls/{soul_id}/traces/{seq}", "get", "seq")["maximum"] == limits.SEQ_MAX
    key = _param(spec, "/v1/souls/{soul_id}/turns", "post", "Idempotency-Key")
    assert _choices(key)[0]["pattern"] == limits.KEY_PATTERN
    turn = spec["components"]["schemas"]["TurnIn"]["properties"]
    assert turn["text"]["pattern"] == limits.TEXT_PATTERN and turn["text"]["maxLength"] == limits.TEXT_MAX
    assert _choices(turn["user"])[0]["pattern"] == limits.ID_PATTERN
    assert {"required": ["query"], "properties": {"query": {"type": "string"}}} in \
        spec["components"]["schemas"]["ForgetIn"]["anyOf"]
    # every error answer declared, with its body; the key scheme on every /v1 operation
    error = {"$ref": "#/components/schemas/ErrorOut"}
    assert spec["components"]["schemas"]["ErrorDetail"]["required"] == ["type", "message"]
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    for p, ops in paths.items():
        for m, op in ops.items():
            codes = {c for c in op["responses"] if c[0] in "45"}
            assert codes >= ({"405", "500"} | (ERROR_CODES if p.startswith("/v1/") else set())), (p, m, codes)
            assert ("413" in codes) == ("requestBody" in op), (p, m, codes)
            for c in codes:
                assert op["responses"][c]["content"]["application/json"]["schema"] == error, (p, m, c)
            assert op["responses"]["405"]["headers"]["Allow"]["required"] is True
            assert (op.get("security") == [{"bearer": []}]) == p.startswith("/v1/"), (p, m)
    assert spec["components"]["securitySchemes"]["bearer"] == {
        "type": "http", "scheme": "bearer", "description": "the tenant's API key (`soul tenants add NAME`)"}


def test_the_service_doc_states_the_limits_the_document_and_limits_py_state(app: tuple[TestClient, dict[str, Any]]
                                                                             ) -> None:
    """docs/service.md's table of limits says what soul_runtime/limits.py and the OpenAPI document say."""
    _, spec = app
    doc = (Path(__file__).parent.parent / "docs" / "service.md").read_text()
    row = next(line for line in doc.splitlines() if line.startswith("| turn `text`, message `text` |"))
    low, high = re.search(r"\| (\d+)-([\d,]+) characters", row).groups()  # type: ignore[union-attr]
    turn = spec["components"]["schemas"]["TurnIn"]["properties"]["text"]
    assert (int(low), int(high.replace(",", ""))) == (turn["minLength"], turn["maxLength"]) == (1, limits.TEXT_MAX)
    message = spec["components"]["schemas"]["Message"]["properties"]["text"]
    assert message["maxLength"] == limits.TEXT_MAX


@pytest.mark.parametrize("body", [b'{"text": "\xff\xfe"}', b"[" * 100_000 + b"]" * 100_000,
                                  b'{"text": ' + b"[" * 5_000 + b"]" * 5_000 + b"}"],
                         ids=["invalid-utf-8", "deep-array", "deep-field"])
def test_a_body_the_parser_cannot_read_is_invalid_input(app: tuple[TestClient, dict[str, Any]], body: bytes) -> None:
    """Invalid UTF-8 and nesting past the JSON parser's depth answer 400 with a type of the error tree."""
    c, _ = app
    r = c.post("/v1/souls/maya/turns", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "InvalidInput", r.text[:300]


def test_405_names_the_methods_a_path_takes(app: tuple[TestClient, dict[str, Any]]) -> None:
    c, spec = app
    for path, ops in spec["paths"].items():
        url = path.replace("{soul_id}", "maya").replace("{seq}", "1").replace("{entity}", "e") \
            .replace("{attribute}", "a")
        declared = {m.upper() for m in ops}
        for method in ("TRACE", "PATCH", "PUT", "GET", "POST", "DELETE"):
            if method in declared:
                continue
            r = c.request(method, url)
            assert r.status_code == 405, (method, url, r.status_code, r.text)
            allowed = {m.strip() for m in r.headers["allow"].split(",")}
            assert allowed - {"HEAD"} == declared, (method, url, allowed)
            assert r.json()["error"]["type"] == "MethodNotAllowed"


def test_without_a_key_nothing_else_is_checked(app: tuple[TestClient, dict[str, Any]]) -> None:
    c, _ = app
    for method, url in (("GET", "/v1/souls/-bad/facts"), ("TRACE", V + "/turns"), ("GET", V + "/nothing"),
                        ("GET", V + "/episodes?sessions_ago=-1")):
        r = c.request(method, url, headers={"Authorization": ""})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", (method, url, r.text)
        assert r.json()["error"]["type"] == "Unauthorized"


BIG = str(2**63)
PAST_BOUNDS = [
    ("GET", V + "/episodes", {"sessions_ago": BIG}),
    ("GET", V + "/episodes", {"sessions_ago": str(limits.SESSIONS_AGO_MAX + 1)}),
    ("GET", V + "/episodes", {"sessions_ago": "-1"}),
    ("GET", V + "/episodes", {"since": BIG}),
    ("GET", V + "/episodes", {"since": "1e300"}),
    ("GET", V + "/episodes", {"since": "nan"}),
    ("GET", V + "/episodes", {"until": "-0.5"}),
    ("GET", V + "/episodes", {"until": ""}),
    ("GET", V + "/episodes", {"until": "1970-01-01T00:00:00Z"}),  # a year the text form does not take
    ("GET", V + "/episodes", {"until": "2026-02-30T00:00:00Z"}),  # no such day
    ("GET", V + "/episodes", {"until": "2026-03-02T09:00:00"}),  # no offset: which time is it?
    ("GET", V + "/recall", {"q": "x", "k": BIG}),
    ("GET", V + "/recall", {"q": "x", "k": str(limits.K_MAX + 1)}),
    ("GET", V + "/recall", {"q": "x", "k": "0"}),
    ("GET", V + "/episodes", {"since": str(2**1100)}),
    ("GET", V + "/recall", {"q": "x" * (limits.QUERY_MAX + 1)}),
    ("GET", V + "/recall", {"q": "x", "store": "nowhere"}),
    ("GET", V + "/traces", {"last": BIG}),
    ("GET", V + "/traces", {"last": str(limits.LAST_MAX + 1)}),
    ("GET", V + f"/traces/{limits.SEQ_MAX + 1}", {}),
    ("GET", V + f"/traces/{2**64}", {}),
    ("GET", V + "/facts", {"entity": ""}),
    ("GET", V + "/facts", {"entity": "e" * (limits.NAME_MAX + 1)}),
    ("GET", "/v1/souls/" + "m" * (limits.SOUL_ID_MAX + 1) + "/facts", {}),
    ("GET", "/v1/souls/-maya/facts", {}),
]


@pytest.mark.parametrize(("method", "url", "params"), PAST_BOUNDS)
def test_past_its_bounds_a_value_is_refused_400(app: tuple[TestClient, dict[str, Any]], method: str, url: str,
                                                params: dict[str, str]) -> None:
    c, _ = app
    r = c.request(method, url, params=params)
    assert r.status_code == 400, (url, params, r.status_code, r.text)
    assert r.json()["error"]["type"] == "InvalidInput" and r.json()["error"]["message"]


AT_BOUNDS = [
    ("GET", V + "/episodes", {"sessions_ago": str(limits.SESSIONS_AGO_MAX)}),
    ("GET", V + "/episodes", {"since": "0", "until": str(int(limits.TIME_MAX))}),
    ("GET", V + "/episodes", {"since": "1971-01-01T00:00:00+23:59", "until": "2998-12-31t23:59:59.999999999-23:59"}),
    ("GET", V + "/recall", {"q": " x\t", "k": str(limits.K_MAX), "store": ["semantic", "episodic", "procedural"]}),
    ("GET", V + "/recall", {"q": "\u00e9" * limits.QUERY_MAX}),
    ("GET", V + "/traces", {"last": str(limits.LAST_MAX)}),
    ("GET", V + f"/traces/{limits.SEQ_MAX}", {}),
    ("GET", "/v1/souls/" + "m" * limits.SOUL_ID_MAX + "/facts", {"entity": "e" * limits.NAME_MAX}),
]


@pytest.mark.parametrize(("method", "url", "params"), AT_BOUNDS)
def test_at_its_bounds_a_value_reaches_the_runtime(app: tuple[TestClient, dict[str, Any]], method: str, url: str,
                                                   params: dict[str, Any]) -> None:
    c, _ = app
    r = c.request(method, url, params=params)
    assert r.status_code == 503 and r.json()["error"]["type"] == "RuntimeUnavailable", (url, params, r.text)


@pytest.mark.parametrize(("body", "code"), [
    ({"text": "hi", "at": 2**63}, 400), ({"text": "hi", "at": -1}, 400), ({"text": "hi", "at": 1e30}, 400),
    ({"text": "hi", "at": "2026-03-02 09:00:00Z"}, 400), ({"text": "hi", "at": True}, 422),
    ({"text": " \u3000 "}, 400), ({"text": "x" * (limits.TEXT_MAX + 1)}, 400), ({"text": "hi", "user": "a b"}, 400),
    ({"text": "hi", "at": limits.TIME_MAX}, 503), ({"text": "x" * limits.TEXT_MAX, "at": "2026-03-02T09:00:00Z"}, 503),
])
def test_a_turn_body_past_its_bounds(app: tuple[TestClient, dict[str, Any]], body: dict[str, Any], code: int) -> None:
    c, _ = app
    r = c.post(V + "/turns", json=body)
    assert r.status_code == code, (body, r.text[:300])


def test_observe_and_forget_bodies(app: tuple[TestClient, dict[str, Any]]) -> None:
    c, _ = app
    m = {"speaker": "Maya", "text": "hello", "id": "m1"}
    assert c.post(V + "/observe", json={"messages": [m, {**m, "text": "again"}]}).status_code == 400  # same id
    assert c.post(V + "/observe", json={"messages": []}).status_code == 400
    assert c.post(V + "/observe", json={"messages": [{**m, "at": 2**63}]}).status_code == 400
    assert c.post(V + "/observe", json={"messages": [m, {**m, "id": "m2"}]}).status_code == 503
    assert c.post(V + "/forget", json={}).status_code == 400
    assert c.post(V + "/forget", json={"ids": []}).status_code == 400
    assert c.post(V + "/forget", json={"ids": ["ep-1"]}).status_code == 503
    assert c.post(V + "/forget", json={"ids": [], "query": "Postgres"}).status_code == 503
    bad_key = c.post(V + "/forget", json={"query": "x"}, headers={"Idempotency-Key": "k" * (limits.KEY_MAX + 1)})
    assert bad_key.status_code == 400


# ---- the patterns say what the runtime's own checks accept -------------------------------
TEXTS = st.text(st.sampled_from(list(" \t\n\r\x00\x07\x0b\x1f\x7f\x85\xa0\u2028\u3000aZ9é😀")), max_size=6)


@settings(max_examples=300, deadline=None)
@given(TEXTS)
def test_the_text_pattern_is_what_check_text_accepts(text: str) -> None:
    try:
        check_text(text)
        accepted = True
    except InvalidInput:
        accepted = False
    assert accepted == (re.fullmatch(limits.TEXT_PATTERN, text) is not None), repr(text)


@settings(max_examples=300, deadline=None)
@given(st.text(st.sampled_from(list("aZ09_.:@- /é")), max_size=limits.ID_MAX + 2))
def test_the_id_pattern_is_what_check_id_accepts(value: str) -> None:
    try:
        check_id(value)
        accepted = True
    except InvalidInput:
        accepted = False
    assert accepted == (re.fullmatch(limits.ID_PATTERN, value) is not None), repr(value)


@settings(max_examples=200, deadline=None)
@given(st.datetimes(min_value=datetime(limits.YEAR_MIN, 1, 1), max_value=datetime(limits.YEAR_MAX, 12, 31, 23, 59)),
       st.integers(-(24 * 60 - 1), 24 * 60 - 1), st.booleans())
def test_a_date_time_in_the_pattern_is_a_time_in_bounds(when: datetime, offset_min: int, lower: bool) -> None:
    tz = timezone(timedelta(minutes=offset_min))
    text = when.replace(tzinfo=tz).isoformat()
    text = text.replace("+00:00", "z" if lower else "Z") if offset_min == 0 else text
    text = text.replace("T", "t") if lower else text
    assert re.fullmatch(limits.ISO_PATTERN, text), text
    got = limits.iso_seconds(text)
    assert math.isclose(got, when.replace(tzinfo=tz).timestamp(), abs_tol=1e-6)
    assert limits.TIME_MIN <= got <= limits.TIME_MAX


# ---- against a real `soul serve` ---------------------------------------------------------
@pytest.mark.ray
def test_an_integer_past_64_bits_is_refused_not_a_server_error(server: dict[str, Any]) -> None:  # noqa: F811
    c = _client(server, "acme")
    assert c.post("/v1/souls/big/turns", json={"text": "We moved the staging cluster to Frankfurt."}).status_code == 200
    for url, params in (("/v1/souls/big/episodes", {"sessions_ago": BIG}), ("/v1/souls/big/traces", {"last": BIG}),
                        (f"/v1/souls/big/traces/{BIG}", {}), ("/v1/souls/big/recall", {"q": "staging", "k": BIG}),
                        ("/v1/souls/big/episodes", {"since": BIG})):
        r = c.get(url, params=params)
        assert r.status_code == 400 and r.json()["error"]["type"] == "InvalidInput", (url, r.text)
    assert c.get("/v1/souls/big/episodes", params={"sessions_ago": "0"}).json()["episodes"]


SEED = 20261204
CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,"
          "response_schema_conformance,negative_data_rejection,positive_data_accepted,missing_required_header,"
          "unsupported_method,allow_header_conformance,use_after_free,ensure_resource_availability,ignored_auth,"
          "object_level_authorization")
"""Every check of schemathesis but ``max_response_time`` (a wall-clock bound), with ``positive_data_acceptance``
as tests/openapi_hooks.py narrows it."""


@pytest.mark.ray
def test_schemathesis_finds_nothing(server: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    hooks = Path(__file__).with_name("openapi_hooks.py")
    cmd = [sys.executable, "-m", "schemathesis.cli", "run", server["url"] + "/openapi.json",
           "-H", f"Authorization: Bearer {server['keys']['acme']}", "--checks", CHECKS,
           "--phases", "examples,coverage,fuzzing", "--max-examples", "25", "--max-time", "120",
           "--seed", str(SEED), "--workers", "1", "--request-timeout", "120", "--suppress-health-check", "all"]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
                       env={**os.environ, "SCHEMATHESIS_HOOKS": str(hooks), "NO_COLOR": "1"})
    out = p.stdout + p.stderr
    cases = re.search(r"(\d+) generated", out)
    summary = out[out.rfind("SUMMARY"):] if "SUMMARY" in out else out[-3000:]
    with capsys.disabled():
        print(f"\nschemathesis: seed {SEED}, {cases.group(1) if cases else '?'} cases, "
              f"{time.monotonic() - t0:.0f} s, exit {p.returncode}")
    assert cases is not None and int(cases.group(1)) > 0, out[-3000:]
    assert p.returncode == 0 and "Failures:" not in summary and "Errors:" not in summary, out[-20000:]
