"""The service's deployment as Serve and KubeRay see it: options, the RayService manifest (no Ray started)."""

from __future__ import annotations

import importlib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((ROOT / "cluster" / name).read_text()) if d]


def test_rayservice_builds_the_app_on_postgres_with_the_secrets_of_the_raycluster(monkeypatch) -> None:
    """The RayService keeps the souls in PostgreSQL: its replicas take the URL from the Secret (SOUL_STORAGE), not
    from the Serve config, and every pod's data dir is its own disk (its caches)."""
    (svc,) = _docs("rayservice.yaml")
    assert svc["kind"] == "RayService" and svc["spec"]["upgradeStrategy"] == {"type": "None"}
    conf = yaml.safe_load(svc["spec"]["serveConfigV2"])
    (app,) = conf["applications"]
    assert "storage" not in app["args"]  # no password in the config
    module, _, fn = app["import_path"].partition(":")
    url = "postgresql://souls:secret@db.internal:5432/souls"
    monkeypatch.setenv("SOUL_STORAGE", url)  # what the Secret gives every pod
    built = getattr(importlib.import_module(module), fn)(app["args"])
    dep = built._bound_deployment
    assert dep.name == "soul-service" and dep.num_replicas == app["args"]["replicas"]
    assert dep.max_ongoing_requests == 1000 and dep.ray_actor_options["num_cpus"] == 0
    assert conf["http_options"]["port"] == 8000
    assert dep.init_args == (app["args"]["data_dir"], "souls", url, app["args"].get("embedder"))
    raycluster = next(d for d in _docs("kuberay.yaml") if d["kind"] == "RayCluster")
    secret = raycluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
    secret_name = next(e["valueFrom"]["secretKeyRef"]["name"] for e in secret if e["name"] == "RAY_AUTH_TOKEN")
    for spec in (svc["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"],
                 svc["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]):
        env = {e["name"]: e for e in spec["containers"][0]["env"]}
        assert env["SOUL_DATA_DIR"]["value"] == app["args"]["data_dir"] == "/data/souls"
        assert env["SOUL_STORAGE"]["valueFrom"]["secretKeyRef"] == {"name": secret_name, "key": "storage_url"}
        assert spec["containers"][0]["volumeMounts"][0]["mountPath"] == "/data/souls"
        assert spec["volumes"] == [{"name": "soul-data", "emptyDir": {}}]  # node-local caches


def test_serve_app_defaults() -> None:
    from soul_apps.service import serve_app
    dep = serve_app.application("/tmp/nowhere")._bound_deployment
    assert dep.ray_actor_options == {"num_cpus": 0}
    assert dep.num_replicas == serve_app.REPLICAS and dep.max_ongoing_requests == serve_app.MAX_ONGOING > 5


def test_replicas_join_the_runtime_with_its_embedder() -> None:
    """A replica connects with the embedder the runtime serves (a data dir keeps the one it was first served with:
    any other is refused), from `soul serve` and from a Serve config's args alike."""
    from soul_apps.service import serve_app
    def args(app: object) -> tuple[object, ...]:
        return tuple(app._bound_deployment.init_args)  # type: ignore[attr-defined]
    assert args(serve_app.application("/tmp/nowhere", embedder="fast"))[-1] == "fast"
    assert args(serve_app.app_builder({"data_dir": "/tmp/nowhere", "embedder": "fast"}))[-1] == "fast"
    assert args(serve_app.app_builder({"data_dir": "/tmp/nowhere"}))[-1] is None


def test_ingress_choice(monkeypatch) -> None:
    """auto: HAProxy when a binary is found and the replicas are reachable (one node, or a host that is not a
    loopback address), else Serve's proxy, with the caller's RAY_SERVE_ENABLE_HA_PROXY deciding when set; the
    value is always explicit (a node's own environment never decides); haproxy and proxy win over the caller's
    variable; haproxy without a binary or with replicas out of reach is refused; Serve's throughput mode and a 2 s
    draining period are on with either ingress; the caller's RAY_SERVE_* settings pass and win (the throughput
    mode's among them)."""
    import os

    import pytest

    from soul_apps.service import serve_app
    from soul_runtime.errors import ConfigError, InvalidInput
    for k in [k for k in os.environ if k.startswith("RAY_SERVE_")]:
        monkeypatch.delenv(k)

    def ha(ingress: str, **kw: object) -> str:
        return serve_app.ingress_env(ingress, **kw)["RAY_SERVE_ENABLE_HA_PROXY"]  # type: ignore[arg-type]
    drain = {"RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2"}  # with either ingress: a stop holds 2 s, not 30
    assert serve_app.ingress_env("auto", binary=True) == {"RAY_SERVE_ENABLE_HA_PROXY": "1",
                                                          "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", **drain}
    assert serve_app.ingress_env("proxy", binary=True) == {"RAY_SERVE_ENABLE_HA_PROXY": "0",
                                                           "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", **drain}
    assert ha("auto", binary=False) == "0" and ha("haproxy", binary=True) == "1"
    assert ha("auto", binary=True, nodes=3) == "0" and ha("auto", binary=True, nodes=3, host="0.0.0.0") == "1"
    with pytest.raises(InvalidInput, match="--host 0.0.0.0"):
        serve_app.ingress_env("haproxy", binary=True, nodes=3, host="127.0.0.1")
    with pytest.raises(ConfigError, match="haproxy binary"):
        serve_app.ingress_env("haproxy", binary=False)
    with pytest.raises(InvalidInput, match="ingress must be one of"):
        serve_app.ingress_env("nginx", binary=True)
    monkeypatch.setenv("RAY_SERVE_HAPROXY_MAXCONN", "4096")
    monkeypatch.setenv("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "10")
    monkeypatch.setenv("RAY_SERVE_THROUGHPUT_OPTIMIZED", "0")
    assert serve_app.ingress_env("auto", binary=True) == {"RAY_SERVE_ENABLE_HA_PROXY": "1",
                                                          "RAY_SERVE_THROUGHPUT_OPTIMIZED": "0",
                                                          "RAY_SERVE_HAPROXY_MAXCONN": "4096",
                                                          "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "10"}
    monkeypatch.setenv("RAY_SERVE_ENABLE_HA_PROXY", "0")
    assert ha("auto", binary=True) == "0" and ha("haproxy", binary=True) == "1"
    monkeypatch.setenv("RAY_SERVE_ENABLE_HA_PROXY", "1")
    assert ha("auto", binary=False) == "1" and ha("proxy", binary=True) == "0"


def test_the_haproxy_binary_is_found_as_serve_finds_it(monkeypatch, tmp_path) -> None:
    """RAY_SERVE_HAPROXY_BINARY_PATH first (not an executable: none, as Serve refuses it), then ray[serve]'s."""
    import os
    import sys

    import pytest

    from soul_apps.service import serve_app
    exe = tmp_path / "haproxy"
    exe.write_text("#!/bin/sh\n")
    monkeypatch.setenv("RAY_SERVE_HAPROXY_BINARY_PATH", str(exe))
    assert serve_app.haproxy_binary() is None
    exe.chmod(0o755)
    assert serve_app.haproxy_binary() == str(exe)
    monkeypatch.delenv("RAY_SERVE_HAPROXY_BINARY_PATH")
    if not sys.platform.startswith("linux"):
        pytest.skip("ray[serve] brings a haproxy binary on Linux only")
    found = serve_app.haproxy_binary()  # the default ingress of `soul serve` here is HAProxy
    assert found is not None and os.access(found, os.X_OK)


def test_rayservice_nodes_run_serve_as_soul_serve_does() -> None:
    """Every node of the manifest runs Serve's HAProxy ingress and throughput mode, the settings `soul serve`
    gives Serve's controller by default."""
    from soul_apps.service import serve_app
    (svc,) = _docs("rayservice.yaml")
    spec = svc["spec"]["rayClusterConfig"]
    pods = [spec["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in spec["workerGroupSpecs"]]
    for pod in pods:
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        for k, v in {**serve_app.THROUGHPUT_ENV, "RAY_SERVE_ENABLE_HA_PROXY": "1"}.items():
            assert env[k] == v, k
