"""A user's model and embedder, named by import path, serve souls through real Ray: the hosts reply with the
user's model, the episodic shard indexes and recalls with the user's embedder; the data dir records that
embedder and refuses another one."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import msgpack
import pytest

pytestmark = pytest.mark.ray

UM = "tests.user_models"
T0 = 1_780_000_000


def test_a_users_model_and_embedder_serve_souls_through_ray(runtime) -> None:  # noqa: ARG001 - shares its Ray
    import soul_runtime
    from soul_runtime.errors import ConfigError

    data = Path(tempfile.mkdtemp(prefix="soul-user-models-"))
    sizes = {"hosts": 1, "episodic_shards": 1, "semantic_shards": 1, "procedural_shards": 1}
    rt = soul_runtime.connect(data_dir=str(data), namespace="user-models", model=f"{UM}:EchoModel",
                              model_args={"prefix": "mine"}, embedder=f"{UM}:TrigramEmbedder", **sizes)
    try:
        s = rt.soul("kayaker")
        first = s.turn("Ana keeps her red kayak at the north pier.", user="ana", at=T0)
        assert first.reply.startswith("mine: Ana keeps her red kayak at the north pier. (0 memories, pid ")
        host_pid = int(first.reply.rsplit("pid ", 1)[1].rstrip(")"))
        assert host_pid != os.getpid() and first.model == "user-echo-1"  # made and run in the host's process
        s.turn("Ben repaired the boathouse roof on Tuesday.", user="ben", at=T0 + 60)
        again = s.turn("Where is the red kayak kept?", user="ana", at=T0 + 120)
        assert "(0 memories" not in again.reply  # the user's model was shown what the user's embedder recalled
        hits = s.recall("red kayak north pier", k=2, stores=["episodic"])
        assert hits and "north pier" in hits[0].text
        dump = msgpack.unpackb(s.export(), raw=False)
        assert (dump["episodic"]["embedder_id"], dump["episodic"]["dim"]) == ("user-trigram-32", 32)
        rec = json.loads((data / "runtime.json").read_text())
        assert (rec["embedder"], rec["embedder_dim"], rec["model"]) == ("user-trigram-32", 32, f"{UM}:EchoModel")
        assert rt.cfg.model_args == {"prefix": "mine"}

        with pytest.raises(ConfigError, match="served with the embedder 'user-trigram-32'"):
            soul_runtime.connect(data_dir=str(data), namespace="user-models", model=f"{UM}:EchoModel",
                                 embedder="fast", **sizes)
        with pytest.raises(ConfigError, match="cannot import module 'tests.nowhere'"):
            soul_runtime.connect(data_dir=tempfile.mkdtemp(prefix="soul-bad-model-"), namespace="bad-model",
                                 model="tests.nowhere:Model", embedder="fast", **sizes)
        assert s.turn("Ana also owns a blue canoe.", user="ana", at=T0 + 180).seq == 4  # still served
    finally:
        rt.shutdown_actors()
        rt.close()
    with pytest.raises(ConfigError, match="served with the embedder 'user-trigram-32'"):  # the data dir itself
        soul_runtime.connect(data_dir=str(data), namespace="user-models", embedder="fast", **sizes)


def test_the_openai_adapter_serves_souls_through_ray_configured_by_model_args(runtime) -> None:  # noqa: ARG001
    import soul_runtime
    from soul_apps.bench.chat_api import ChatCompletionsServer, from_messages
    from soul_apps.bench.claude_path import keep_everything

    sizes = {"hosts": 1, "episodic_shards": 1, "semantic_shards": 1, "procedural_shards": 1}
    with ChatCompletionsServer(responder=from_messages(keep_everything)) as api:
        rt = soul_runtime.connect(data_dir=tempfile.mkdtemp(prefix="soul-openai-"), namespace="openai-model",
                                  model="openai", embedder="fast", **sizes,
                                  model_args={"base_url": api.base_url + "/v1", "model": "served-model-1",
                                              "memory_model": "served-memory-1", "max_retries": "0"})
        try:
            s = rt.soul("chatty")
            r = s.turn("Our staging cluster moved to the Frankfurt region last week.", user="maya", at=T0)
            assert r.reply == "Noted." and r.model == "served-model-1" and r.writes
            reply, memory = api.bodies()
            assert (reply["model"], memory["model"]) == ("served-model-1", "served-memory-1")
            assert memory["tool_choice"] == {"type": "function", "function": {"name": "record_memory"}}
            assert [e.sources for e in s.episodes()] == [("chatty/1/user",)]  # what the memory call kept
            assert s.trace(r.turn_id).usage["by_model"].keys() == {"served-model-1", "served-memory-1"}
        finally:
            rt.shutdown_actors()
            rt.close()
