"""Tenants and their keys, soul-id scoping, the idempotency ledger and the service's error mapping (no Ray)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soul_apps.cli.main import main
from soul_apps.service.idempotency import Ledger
from soul_apps.service.souls_api import IdempotencyConflict, Unauthorized, error_body, status_of
from soul_apps.service.tenants import MAX_SOUL_ID, Scope, TenantTable, Whole, check_tenant, key_hash
from soul_runtime import errors


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_keys_are_stored_hashed_owner_only_and_seen_by_other_readers(tmp_path: Path) -> None:
    writer, reader = TenantTable(tmp_path), TenantTable(tmp_path)
    assert reader.authenticate("anything") is None
    ka, kb = writer.add("acme"), writer.add("beta-2")
    assert ka != kb and ka.startswith("soul_") and len(ka) >= 40
    text = (tmp_path / "tenants.json").read_text()
    assert ka not in text and kb not in text and key_hash(ka) in text
    assert _mode(tmp_path / "tenants.json") == 0o600
    assert reader.authenticate(ka) == "acme" and reader.authenticate(kb) == "beta-2"
    assert reader.authenticate(ka[:-1]) is None and reader.authenticate("") is None and reader.authenticate(None) is None
    writer.revoke("acme")
    assert reader.authenticate(ka) is None and reader.authenticate(kb) == "beta-2"
    assert [t.name for t in reader.tenants()] == ["acme", "beta-2"] and not reader.get("acme").active
    with pytest.raises(errors.InvalidInput):
        writer.add("beta-2")
    writer.remove("acme")
    with pytest.raises(errors.NotFound):
        reader.get("acme")
    with pytest.raises(errors.NotFound):
        writer.revoke("acme")


@pytest.mark.parametrize("bad", ["", "A", "-x", "a_b", "a:b", "x" * 33, "é", None, 3])
def test_tenant_names(bad: object) -> None:
    with pytest.raises(errors.InvalidInput):
        check_tenant(bad)
    assert check_tenant("a") == "a" and check_tenant("0-" + "x" * 30) == "0-" + "x" * 30


def test_scope_maps_ids_in_and_takes_the_prefix_off_what_is_shown() -> None:
    a = Scope("acme")
    assert a.soul("maya") == "acme:maya"
    assert a.soul("x" * MAX_SOUL_ID) == "acme:" + "x" * MAX_SOUL_ID
    longest = Scope("t" * 32).soul("x" * MAX_SOUL_ID)
    assert len(longest) == 128
    for bad in ("x" * (MAX_SOUL_ID + 1), "", "a b", "-a", 7, None):
        with pytest.raises(errors.InvalidInput):
            a.soul(bad)
    assert a.souls(["acme:maya", "acme:b", "beta:maya", "acmex:c", "maya"]) == ["b", "maya"]
    assert a.text("no turn 'acme:maya/3'") == "no turn 'maya/3'"
    assert a.text("/data/souls/acme:maya/traces") == "/data/souls/maya/traces"
    assert a.text("xacme:maya and beta:acme:z") == "xacme:maya and beta:acme:z"  # only whole ids of the tenant
    tree = {"turn_id": "acme:maya/2", "sources": ["acme:maya/1/user", "m1"], "acme:maya": [("acme:q", 1)]}
    assert a.tree(tree) == {"turn_id": "maya/2", "sources": ["maya/1/user", "m1"], "maya": [["q", 1]]}
    w = Whole()
    assert w.soul("acme:maya") == "acme:maya" and w.text("acme:maya/1") == "acme:maya/1"


ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,20}", fullmatch=True)
prose = st.text(alphabet="abcme :/'\"()-", max_size=30).filter(lambda t: "acme:" not in t)


@settings(max_examples=200, deadline=None)
@given(ids, prose, prose)
def test_scope_text_shows_every_id_of_the_tenant_without_its_prefix(sid: str, pre: str, post: str) -> None:
    a = Scope("acme")
    shown = a.text(f"{pre} '{a.soul(sid)}/3' ({a.soul(sid)}){post}")
    assert shown == f"{pre} '{sid}/3' ({sid}){post}"
    assert a.text(pre + post) == pre + post


def test_ledger_keeps_digests_and_refuses_another_body(tmp_path: Path) -> None:
    led = Ledger(tmp_path)
    assert led.body_for("acme:maya", "k1") is None
    assert led.record("acme:maya", "k1", "B1") == "B1"
    assert led.record("acme:maya", "k1", "B2") == "B1"  # the first body stays
    assert led.body_for("acme:maya", "k1") == "B1" and led.body_for("beta:maya", "k1") is None
    led.record("acme:zed", "k1", "B3")
    led.record("beta:maya", "k1", "B4")
    raw = (tmp_path / "service" / "idempotency.sqlite").read_bytes()
    assert b"k1" not in raw
    assert _mode(tmp_path / "service" / "idempotency.sqlite") == 0o600
    assert led.forget_soul("acme:maya") == 1 and led.body_for("acme:maya", "k1") is None
    assert led.forget_prefix("acme:") == 1 and led.body_for("beta:maya", "k1") == "B4"
    other = Ledger(tmp_path)  # a second replica sees the same keys
    assert other.body_for("beta:maya", "k1") == "B4"


def test_error_mapping() -> None:
    a = Scope("acme")
    cases = [(errors.InvalidInput("x"), 400), (errors.ConfigError("x"), 400), (errors.NotFound("x"), 404),
             (errors.ModelError("x"), 502), (errors.ModelTimeout("x"), 502), (errors.RuntimeUnavailable("x"), 503),
             (errors.AuthError("x"), 503), (errors.StaleOwner("x"), 503), (Unauthorized("x"), 401),
             (IdempotencyConflict("x"), 422), (errors.StorageError("x"), 500), (RuntimeError("x"), 500),
             (errors.QuotaExceeded("x", 3.0), 429)]
    for e, code in cases:
        assert status_of(e) == code, e
    busy = type("RuntimeBusy", (errors.SoulError,), {})
    assert status_of(busy("full")) == 429
    body = error_body(errors.NotFound("no turn 'acme:maya/9' in /d/souls/acme:maya"), a, "/d")["error"]
    assert body == {"type": "NotFound", "message": "no turn 'maya/9' in maya"}
    hidden = error_body(errors.StorageError("disk /d/souls/acme:maya/semantic.sqlite broke"), a, "/d")["error"]
    assert hidden == {"type": "StorageError", "message": "internal error"}
    assert error_body(RuntimeError("secret"), a, "/d")["error"] == {"type": "InternalError", "message": "internal error"}


def test_cli_tenants(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = str(tmp_path)
    assert main(["tenants", "add", "acme", "--data-dir", d]) == 0
    key = capsys.readouterr().out.strip().splitlines()[-1].split()[-1]
    assert TenantTable(d).authenticate(key) == "acme"
    assert main(["tenants", "add", "Bad_Name", "--data-dir", d]) == 2
    assert main(["tenants", "list", "--data-dir", d, "--json"]) == 0
    assert '"acme"' in capsys.readouterr().out
    # a tenant with souls is removed only with --forget, which deletes them (no runtime holds them here)
    for sid in ("acme:maya", "acme:zed", "acmex:keep", "other"):
        (tmp_path / "souls" / sid).mkdir(parents=True)
        (tmp_path / "souls" / sid / "episodic.sqlite").write_bytes(b"x")
    assert main(["tenants", "remove", "acme", "--data-dir", d]) == 2
    assert (tmp_path / "souls" / "acme:maya").is_dir()
    assert main(["tenants", "revoke", "acme", "--data-dir", d]) == 0
    assert TenantTable(d).authenticate(key) is None
    assert main(["tenants", "remove", "acme", "--forget", "--data-dir", d]) == 0
    assert sorted(p.name for p in (tmp_path / "souls").iterdir()) == ["acmex:keep", "other"]
    assert TenantTable(d).tenants() == []


def test_cli_tenants_set_and_usage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from actors.tenant_usage import UsageBook, usage_dir
    d = str(tmp_path)
    assert main(["tenants", "add", "acme", "--data-dir", d]) == 0
    assert main(["tenants", "set", "acme", "--turns-per-s", "2.5", "--in-flight", "8", "--weight", "3",
                 "--data-dir", d]) == 0
    assert main(["tenants", "set", "--default", "--souls", "5", "--data-dir", d]) == 0
    assert main(["tenants", "set", "acme", "--in-flight", "0", "--data-dir", d]) == 0  # 0 unsets
    assert main(["tenants", "set", "--souls", "3", "--data-dir", d]) == 2  # neither a NAME nor --default
    assert main(["tenants", "set", "nobody", "--souls", "3", "--data-dir", d]) == 2
    assert main(["tenants", "set", "acme", "--souls", "-1", "--data-dir", d]) == 2
    capsys.readouterr()
    assert TenantTable(d).limits("acme") == TenantTable(d).limits("acme").__class__(turns_per_s=2.5, souls=5, weight=3)
    (tmp_path / "souls" / "acme:maya").mkdir(parents=True)
    (tmp_path / "souls" / "acme:maya" / "soul.sqlite").write_bytes(b"x" * 1000)
    book = UsageBook(usage_dir(tmp_path) / "host-0.json")
    book.add("acme", "turns", 3)
    book.add("acme", "tokens", 120)
    book.flush(force=True)
    assert main(["tenants", "usage", "--data-dir", d, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows == [{"tenant": "acme", "souls": 1, "stored_bytes": 1000, "turns": 3, "tokens": 120,
                     "tokens_today": 120, "throttled": 0, "queued_s": 0.0,
                     "limits": {"turns_per_s": 2.5, "souls": 5, "weight": 3.0}}]
    assert main(["tenants", "usage", "acme", "--data-dir", d]) == 0
    table = capsys.readouterr().out
    assert "acme" in table and "1000" in table and "turns_per_s=2.5" in table
    assert main(["tenants", "usage", "nobody", "--data-dir", d]) == 2


def test_hosts_read_each_tenants_weight_as_the_table_sets_it(tmp_path: Path) -> None:
    from actors.tenant_weights import TenantWeights
    from soul_apps.service.tenants import TenantTable

    table = TenantTable(tmp_path, storage="local")
    table.add("acme")
    table.add("zeta")
    table.add("plain")
    table.set_limits(None, weight=2.0)  # the defaults: every tenant without a weight of its own
    table.set_limits("acme", weight=5.0)
    table.set_limits("zeta", weight=0.5)
    weights = TenantWeights(tmp_path, "local", every_s=0.0)
    assert [weights(t) for t in ("acme", "zeta", "plain", "nobody", "")] == [5.0, 0.5, 2.0, 1.0, 1.0]
    table.set_limits("acme", weight=None)  # unset: the defaults' again
    assert weights("acme") == 2.0
