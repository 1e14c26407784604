"""Models and embedders by name: built-ins, import paths, entry points; the checks and their errors; the settings
that reach the actors; a data dir that records its embedder; a model with coroutine methods (no Ray here)."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from actors.settings import LAYOUT_FILE, RuntimeConfig, claim_data_dir
from soul_runtime.embedding.choice import embedder_identity, make_embedder
from soul_runtime.embedding.fast import FastEmbedder
from soul_runtime.embedding.minilm import MiniLMEmbedder
from soul_runtime.errors import ConfigError
from soul_runtime.loop.soul import Soul
from soul_runtime.memory.soul_memory import SoulMemory
from soul_runtime.models.choice import make_model
from soul_runtime.models.offline import OfflineModel
from soul_runtime.models.sync_view import SyncView, async_methods, sync_view
from soul_runtime.plugins import settings_env
from tests import user_models
from tests.fakes import HashEmbedder

UM = "tests.user_models"


# ---- models ------------------------------------------------------------------

def test_built_in_models(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    assert isinstance(make_model("offline"), OfflineModel)
    assert isinstance(make_model("auto"), OfflineModel)
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        make_model("anthropic")
    with pytest.raises(ConfigError, match="offline model takes no model_args.*found no ANTHROPIC_API_KEY"):
        make_model("auto", args={"model": "claude-x-1"})
    with pytest.raises(ConfigError, match="does not take model_args"):
        make_model("auto", args={"prefix": "x"})
    with pytest.raises(ConfigError, match="offline model takes no model_args"):
        make_model("offline", args={"prefix": "x"})


def test_the_built_in_models_are_published_as_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    """The installed metadata registers offline, anthropic and openai in the group a user's model uses, with the
    targets pyproject.toml and choice.PUBLISHED name; each target makes its model (the entry point or, in a source
    tree that was not installed, the same target by import path)."""
    import importlib.metadata

    import tomllib

    from soul_runtime import plugins
    from soul_runtime.models.choice import PUBLISHED
    from soul_runtime.models.claude import AnthropicModel
    from soul_runtime.models.openai_chat import OpenAIChatModel
    installed = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=plugins.MODEL_GROUP)
                 if ep.dist is not None and ep.dist.name == "soul-runtime"}
    declared = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert installed == PUBLISHED == declared["project"]["entry-points"][plugins.MODEL_GROUP]
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    monkeypatch.setenv("SOUL_OPENAI_MODEL", "local-1")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    kinds = {"offline": OfflineModel, "anthropic": AnthropicModel, "openai": OpenAIChatModel}
    for name, target in PUBLISHED.items():
        assert isinstance(make_model(name), kinds[name])
        by_path = plugins.build(name, plugins.load_factory(target, group=plugins.MODEL_GROUP, what="model"), {},
                                object, "model")
        assert isinstance(by_path, kinds[name])


def test_a_model_by_import_path_class_or_factory_with_its_args() -> None:
    m = make_model(f"{UM}:EchoModel")
    assert isinstance(m, user_models.EchoModel) and m.prefix == "echo"
    assert make_model(f"{UM}:EchoModel", args={"prefix": "hi"}).prefix == "hi"  # type: ignore[attr-defined]
    f = make_model(f"{UM}:echo_model")
    assert isinstance(f, user_models.EchoModel) and f.prefix == "factory"


@pytest.mark.parametrize(("name", "args", "message"), [
    ("tests.no_such_module:Model", {}, "cannot import module 'tests.no_such_module'.*importable in every process"),
    (f"{UM}:Missing", {}, "has no attribute 'Missing'"),
    (f"{UM}:EchoModel.nope", {}, "has no attribute 'nope'"),
    (f"{UM}:NotAModel", {}, "NotAModel is not a subclass of LanguageModel or AsyncLanguageModel"),
    (f"{UM}:not_a_model", {}, "the factory returned a NotAModel, not a LanguageModel"),
    (f"{UM}:TrigramEmbedder", {}, "not a subclass of LanguageModel"),
    (f"{UM}:EchoModel", {"colour": "red"}, r"could not be made with arguments \['colour'\]: TypeError"),
    (f"{UM}:_keep", {}, "could not be made"),
    ("no-such-model", {}, "unknown model 'no-such-model'.*entry-point group 'soul_runtime.models'"),
    ("tests.user_models", {}, "unknown model"),
    ("has space", {}, "not a short name"),
    ("mod:", {}, "is not an import path"),
    (":attr", {}, "is not an import path"),
    ("", {}, "non-empty"),
])
def test_a_model_that_cannot_be_made_is_one_config_error(name: str, args: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make_model(name, args=args)


def test_model_args_are_a_dict_of_str() -> None:
    for bad in ({"n": 3}, {"not an identifier": "x"}, ["prefix"]):
        with pytest.raises(ConfigError, match="model_args"):
            make_model(f"{UM}:EchoModel", args=bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="model_args"):
            RuntimeConfig(data_dir="/tmp/x", model_args=bad)  # type: ignore[arg-type]


def test_the_runtime_configuration_takes_any_well_formed_name_without_importing_it() -> None:
    cfg = RuntimeConfig(data_dir="/tmp/x", model="pkg.not_installed:Model", model_args={"url": "http://h"},
                        embedder="pkg.not_installed:Emb", embedder_args={"dim": "8"})
    assert RuntimeConfig.from_dict(cfg.to_dict()) == cfg
    for bad in ({"model": "a b"}, {"embedder": "x:"}, {"model": 3}):
        with pytest.raises(ConfigError):
            RuntimeConfig(data_dir="/tmp/x", **bad)  # type: ignore[arg-type]


def _distribution(root: Path) -> Path:
    """An installed distribution (a .dist-info on sys.path) that registers one model and one embedder."""
    info = root / "soul_user_plugins-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: soul-user-plugins\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[soul_runtime.models]\necho = {UM}:EchoModel\n"
                                           f"[soul_runtime.embedders]\ntrigram = {UM}:trigram_embedder\n"
                                           f"broken = {UM}:NoSuchThing\n")
    return root


def test_entry_points_register_short_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="unknown model 'echo'"):
        make_model("echo")
    monkeypatch.syspath_prepend(str(_distribution(tmp_path)))
    assert isinstance(make_model("echo"), user_models.EchoModel)
    emb = make_embedder("trigram", args={"dim": "16"})
    assert (emb.embedder_id, emb.dim) == ("user-trigram-16", 16)
    with pytest.raises(ConfigError, match=r"registered: anthropic, echo, offline, openai\)"):
        make_model("ohce")
    with pytest.raises(ConfigError, match="loading entry point 'tests.user_models:NoSuchThing' failed"):
        make_embedder("broken")


# ---- embedders ---------------------------------------------------------------

def test_an_embedder_by_import_path_and_its_identity() -> None:
    emb = make_embedder(f"{UM}:TrigramEmbedder")
    assert isinstance(emb, user_models.TrigramEmbedder) and emb.embed(["hello"]).shape == (1, 32)
    assert embedder_identity(f"{UM}:TrigramEmbedder") == ("user-trigram-32", 32)
    assert embedder_identity(f"{UM}:trigram_embedder", {"dim": "24"}) == ("user-trigram-24", 24)
    assert embedder_identity("fast") == (FastEmbedder.embedder_id, FastEmbedder.dim)
    assert embedder_identity("default") == (MiniLMEmbedder.embedder_id, 384)


@pytest.mark.parametrize(("name", "args", "message"), [
    (f"{UM}:NoDimEmbedder", {}, "dim must be an int"),
    (f"{UM}:trigram_embedder", {"dim": "0"}, r"dim must be an int in 1\.\.65536 .*got 0"),
    (f"{UM}:WrongDimEmbedder", {}, r"failed its first text: .*returned shape \(1, 32\), expected \(1, 48\)"),
    (f"{UM}:EchoModel", {}, "not a subclass of Embedder"),
    ("fast", {"dim": "3"}, "takes no embedder_args"),
    ("tests.no_such_module:E", {}, "cannot import module"),
])
def test_an_embedder_that_cannot_be_used_is_one_config_error(name: str, args: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        embedder_identity(name, args)


# ---- the data dir records its embedder ----------------------------------------------

def test_the_data_dir_records_the_real_embedder_and_refuses_another(tmp_path: Path) -> None:
    mine = RuntimeConfig(data_dir=str(tmp_path), hosts=1, episodic_shards=1, semantic_shards=1, procedural_shards=1,
                         embedder=f"{UM}:TrigramEmbedder", model=f"{UM}:EchoModel")
    rec = claim_data_dir(mine)
    on_disk = json.loads((tmp_path / LAYOUT_FILE).read_text())
    assert on_disk == rec and (rec["embedder"], rec["embedder_dim"]) == ("user-trigram-32", 32)
    assert rec["model"] == f"{UM}:EchoModel"
    assert claim_data_dir(RuntimeConfig(data_dir=str(tmp_path), model="offline",
                                        embedder=f"{UM}:TrigramEmbedder")) == rec  # another model: fine
    for other, args in (("fast", {}), ("default", {}), (f"{UM}:trigram_embedder", {"dim": "16"})):
        with pytest.raises(ConfigError, match="served with the embedder 'user-trigram-32' \\(32-d\\)"):
            claim_data_dir(RuntimeConfig(data_dir=str(tmp_path), embedder=other, embedder_args=args))
    assert json.loads((tmp_path / LAYOUT_FILE).read_text()) == on_disk  # the record is untouched


def test_a_record_without_an_embedder_dimension_is_read_as_minilms(tmp_path: Path) -> None:
    legacy = {"format": "soul-runtime/data@1", "namespace": "souls", "hosts": 1, "episodic_shards": 1,
              "semantic_shards": 1, "procedural_shards": 1, "embedder": "whatever it said", "storage": "local"}
    (tmp_path / LAYOUT_FILE).write_text(json.dumps(legacy))
    assert claim_data_dir(RuntimeConfig(data_dir=str(tmp_path))) == legacy  # the default embedder: accepted
    with pytest.raises(ConfigError, match=f"embedder '{MiniLMEmbedder.embedder_id}' \\(384-d\\), not 'fast-hash-64'"):
        claim_data_dir(RuntimeConfig(data_dir=str(tmp_path), embedder="fast"))


def test_the_controller_refuses_a_client_with_another_embedder_and_checks_the_model(tmp_path: Path) -> None:
    from actors.controller import RuntimeController
    base = {"data_dir": str(tmp_path), "hosts": 1, "episodic_shards": 1, "semantic_shards": 1, "procedural_shards": 1}
    orch = RuntimeController(RuntimeConfig(**base, embedder="fast").to_dict())
    with pytest.raises(ConfigError, match="not 'user-trigram-32'"):
        asyncio.run(orch.check_layout(RuntimeConfig(**base, embedder=f"{UM}:TrigramEmbedder").to_dict()))
    assert not (tmp_path / LAYOUT_FILE).exists()  # refused before anything was recorded
    broken = RuntimeController(RuntimeConfig(**base, embedder="fast", model=f"{UM}:NotAModel").to_dict())
    with pytest.raises(ConfigError, match="not a subclass of LanguageModel"):
        asyncio.run(broken.check_layout(RuntimeConfig(**base, embedder="fast").to_dict()))


# ---- the settings that reach every actor ------------------------------------------

def test_settings_env_is_the_declared_set() -> None:
    env = {"SOUL_MODEL": "m", "SOUL_EMBEDDER": "e", "OPENAI_BASE_URL": "u", "ANTHROPIC_API_KEY": "k",
           "SOUL_OPENAI_MODEL": "x", "SOUL_MODEL_ECHO_SUFFIX": "!", "SOUL_DATA_DIR": "/d", "HOME": "/h",
           "MY_GATEWAY_URL": "g", "OTHER": "o", "SOUL_MODEL_ENV": "MY_GATEWAY_URL, HF_TOKEN"}
    assert settings_env(env) == {k: env[k] for k in ("SOUL_MODEL", "SOUL_EMBEDDER", "OPENAI_BASE_URL",
                                                     "ANTHROPIC_API_KEY", "SOUL_OPENAI_MODEL",
                                                     "SOUL_MODEL_ECHO_SUFFIX", "MY_GATEWAY_URL", "SOUL_MODEL_ENV")}


def test_the_local_runtime_fingerprint_covers_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from soul_apps.cluster import local_runtime
    for k in list(settings_env()):
        monkeypatch.delenv(k)
    base = local_runtime.fingerprint()
    seen = {base}
    for k, v in (("SOUL_MODEL", f"{UM}:EchoModel"), ("SOUL_EMBEDDER", "fast"), ("OPENAI_BASE_URL", "http://h/v1"),
                 ("SOUL_MODEL_ENV", "MY_URL"), ("MY_URL", "http://g")):
        monkeypatch.setenv(k, v)
        fp = local_runtime.fingerprint()
        assert fp not in seen, k
        seen.add(fp)
    monkeypatch.setenv("SOUL_DATA_DIR", "/elsewhere")  # not a model setting
    assert local_runtime.fingerprint() in seen


def test_the_cli_options_set_the_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    from soul_apps.cli.context import Ctx
    from soul_apps.cli.main import build_parser
    monkeypatch.setenv("SOUL_MODEL", "")  # restored after the test, whatever Ctx sets
    monkeypatch.setenv("SOUL_EMBEDDER", "")
    Ctx(build_parser().parse_args(["--model", f"{UM}:EchoModel", "facts", "x"]))
    import os
    assert os.environ["SOUL_MODEL"] == f"{UM}:EchoModel" and os.environ["SOUL_EMBEDDER"] == ""
    Ctx(build_parser().parse_args(["facts", "x", "--embedder", "fast"]))
    assert os.environ["SOUL_EMBEDDER"] == "fast"


# ---- a model with coroutine methods -------------------------------------------

def test_a_model_with_coroutines_runs_from_the_synchronous_turn_loop(tmp_path: Path) -> None:
    inner = user_models.AsyncEchoModel()
    assert async_methods(inner) == {"reply", "decide", "classify_task"}
    assert sync_view(OfflineModel()).__class__ is OfflineModel  # a synchronous model is left as it is
    made = make_model(f"{UM}:AsyncEchoModel")
    assert isinstance(made, user_models.AsyncEchoModel)  # as made: a host awaits its coroutines on its loop
    view = sync_view(made)  # blocking calls, for a caller on threads
    assert isinstance(view, SyncView) and sync_view(view) is view and view.model_id == "user-async-echo-1"
    soul = Soul("a", tmp_path, memory=SoulMemory(tmp_path, embedder=HashEmbedder()), model=inner)
    r = soul.turn("Ana planted three olive trees in the garden.", user="ana", at=1_780_000_000)
    assert r.reply == "async echo: Ana planted three olive trees in the garden." and r.writes
    assert inner.threads == ["soul-step-loop"]  # on the step loop, not the turn's thread
    obs = soul.observe([{"speaker": "Ben", "id": "b1", "text": "Ben bought a red kayak for the lake trip."}],
                       at=1_780_000_100)  # the window default judges through the coroutine decide
    assert "kept by the user's model" in soul.trace(obs.turn_id).persist_reason
    assert any("kayak" in e.text for e in soul.memory.episodes())  # type: ignore[attr-defined]

    async def inside_a_running_loop() -> str:  # a caller on its own event loop (e.g. an async web handler)
        return soul.turn("Ana watered the olive trees today.", user="ana", at=1_780_000_200).reply
    assert asyncio.run(inside_a_running_loop()).startswith("async echo: Ana watered")
    results: list[str] = []
    threads = [threading.Thread(target=lambda i=i: results.append(view.reply(  # type: ignore[misc]
        _request(f"hello {i}")).text)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == sorted(f"async echo: hello {i}" for i in range(8))
    soul.close()


def _request(text: str) -> object:
    from soul_runtime.models.base import ReplyRequest
    return ReplyRequest(system="", memory_lines=(), history=(), user_text=text, user="u", max_tokens=10)


def test_connect_reads_soul_model_and_forwards_the_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from actors import raycalls, runtime
    seen: dict[str, object] = {}

    class Made:
        def __init__(self, cfg: RuntimeConfig, **kw: object) -> None:
            seen["cfg"] = cfg

    def start(address: object, attach: object, *, namespace: str, env_vars: object = None, **kw: object) -> object:
        seen["env"] = env_vars
        return attach(False)  # type: ignore[operator]
    monkeypatch.setattr(raycalls, "start", start)
    monkeypatch.setattr(runtime, "Runtime", Made)
    monkeypatch.setenv("SOUL_MODEL", f"{UM}:EchoModel")
    monkeypatch.setenv("SOUL_EMBEDDER", "fast")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("UNRELATED_SETTING", "x")
    runtime.connect(data_dir=str(tmp_path), model_args={"prefix": "p"})
    cfg = seen["cfg"]
    assert isinstance(cfg, RuntimeConfig) and (cfg.model, cfg.embedder, cfg.model_args) == (
        f"{UM}:EchoModel", "fast", {"prefix": "p"})
    env = seen["env"]
    assert isinstance(env, dict) and env["OPENAI_BASE_URL"] == "http://127.0.0.1:9/v1" and "UNRELATED_SETTING" not in env
    runtime.connect(data_dir=str(tmp_path), model="offline")  # an explicit choice wins over SOUL_MODEL
    assert seen["cfg"].model == "offline"  # type: ignore[attr-defined]
