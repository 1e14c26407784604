"""`soul bench claude`: model calls, tokens and reply latency of the Claude path, against a local server.

The real :class:`~soul_runtime.models.claude.AnthropicModel` (the ``anthropic`` SDK over HTTP) talks
to :class:`~soul_apps.bench.messages_api.MessagesApiServer`, which answers every call after a fixed
delay (a model's latency), counts tokens as characters / 4 and emulates the prompt cache. Its memory
answers keep every message (the upper bound of calls and writes). Measured through the public
in-process API (:class:`~soul_runtime.loop.soul.Soul` over :class:`~soul_runtime.memory.soul_memory.SoulMemory`):

* turns: model calls before the reply returns and in all, reply latency p50 / p95 with
  ``wait_writes=False`` and, as the baseline in the same run, with ``wait_writes=True``;
* observe of LoCoMo conversations: calls and tokens sent per message with windows of
  ``observe_window`` messages and, as the baseline in the same run, windows of one message.
"""

from __future__ import annotations

import re
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from soul_apps.bench.messages_api import MessagesApiServer, Scripted, message
from soul_runtime.config import SoulConfig, TurnConfig
from soul_runtime.embedding.base import Embedder
from soul_runtime.embedding.choice import default_embedder
from soul_runtime.loop.ingest import load_locomo
from soul_runtime.loop.soul import Soul
from soul_runtime.memory.soul_memory import SoulMemory
from soul_runtime.models.claude import AnthropicModel

REPLY_MODEL = "claude-bench-reply"
MEMORY_MODEL = "claude-bench-memory"
_MESSAGE = re.compile(r"^\[([^\]]+)\] ([^:]+): (.*)$")


def _tool(name: str, data: dict[str, Any], out_tokens: int) -> Scripted:
    return Scripted(200, message([{"type": "tool_use", "id": "toolu_bench", "name": name, "input": data}],
                                 stop_reason="tool_use", output_tokens=out_tokens))


_EXCHANGE = re.compile(r"<exchange[^>]*>\n(.*)")


def keep_everything(body: dict[str, Any]) -> Scripted:
    """A stand-in model that keeps every message: the episode is the message's first 100 characters."""
    tool = (body.get("tool_choice") or {}).get("name")
    prompt = str(body["messages"][-1]["content"])
    if tool == "record_memory":
        found = _EXCHANGE.search(prompt)  # the exchange's first line: who said what
        said = found.group(1) if found else ""
        return _tool(tool, {"persist": True, "categories": ["event"], "reason": "bench: keep", "facts": [],
                            "episode": said[:100], "event": True, "entities": [], "task": None}, 40)
    if tool == "record_memories":
        block = prompt.rsplit("<messages>\n", 1)[-1].split("\n</messages>", 1)[0]
        items = [{"message_id": m.group(1), "categories": ["event"], "reason": "bench: keep", "facts": [],
                  "episode": f"{m.group(2)} said: {m.group(3)[:100]}", "event": True, "entities": [], "task": None}
                 for m in map(_MESSAGE.match, block.splitlines()) if m]
        return _tool(tool, {"items": items}, 40 * len(items))
    return Scripted(200, message([{"type": "text", "text": "Noted."}], output_tokens=3))


def _model(api: MessagesApiServer, cache_min: int | None) -> AnthropicModel:
    return AnthropicModel(model_id=REPLY_MODEL, memory_model_id=MEMORY_MODEL, api_key="bench", base_url=api.base_url,
                          cache_min=cache_min)


def _soul(directory: str, model: AnthropicModel, cfg: SoulConfig, embedder: Embedder) -> Soul:
    return Soul("bench", directory, memory=SoulMemory(directory, embedder=embedder, config=cfg.memory),
                model=model, config=cfg)


def bench_turns(turns: int = 20, delay_s: float = 0.5, cache_min: int | None = None,
                embedder: Embedder | None = None) -> dict[str, Any]:
    """Reply latency and calls per turn, ``wait_writes=False`` beside ``wait_writes=True``."""
    embedder = embedder or default_embedder()
    out: dict[str, Any] = {"turns": turns, "delay_s": delay_s}
    for wait in (False, True):
        with MessagesApiServer(responder=keep_everything, delay_s=delay_s, count_tokens=True) as api, \
                tempfile.TemporaryDirectory() as d:
            soul = _soul(d, _model(api, cache_min), SoulConfig(), embedder)
            lat, before = [], []
            for i in range(turns):
                soul.wait_memory_work()  # a user's pause between turns: the previous memory work is done (not timed)
                n0 = len(api.requests)
                t0 = time.perf_counter()
                r = soul.turn(f"Turn {i}: we moved the staging database of project {i % 7} to the new cluster.",
                              user="maya", at=1_780_000_000.0 + 60 * i, wait_writes=wait)
                lat.append(time.perf_counter() - t0)
                before.append(len(api.requests) - n0 if not wait else 1)
                assert r.writes_pending is not wait
            soul.wait_memory_work()
            traces = soul.traces(turns)
            soul.close()
            calls = [t.usage["calls"] for t in traces]
            reply_calls = [t.usage["reply"]["calls"] for t in traces]
            key = "no_wait" if not wait else "wait_writes"
            timing = {k: round(statistics.median(t.timings_ms.get(k, 0.0) for t in traces), 1)
                      for k in ("recall", "inference", "intent", "persist_decision", "write")}
            out[key] = {"timings_ms_p50": timing, "reply_p50_s": round(statistics.median(lat), 3),
                        "reply_p95_s": round(sorted(lat)[int(0.95 * (len(lat) - 1))], 3),
                        "calls_on_reply_path_max": max(reply_calls), "calls_per_turn_max": max(calls),
                        "calls_per_turn_mean": round(statistics.mean(calls), 2),
                        "requests_seen_before_reply_max": max(before),
                        "tokens_sent_per_turn": round(statistics.mean(
                            t.usage["input_tokens"] + t.usage["cache_read_tokens"] + t.usage["cache_write_tokens"]
                            for t in traces), 1),
                        "cache_read_tokens": sum(t.usage["cache_read_tokens"] for t in traces)}
    return out


def bench_observe(data: str | Path, limit: int | None = None, window: int = 40,
                  progress: Callable[[str, int, int], None] | None = None,
                  embedder: Embedder | None = None) -> dict[str, Any]:
    """Calls and tokens per observed message over LoCoMo conversations, windows of ``window`` vs 1 message."""
    embedder = embedder or default_embedder()
    paths = sorted(Path(data).glob("*.json")) if Path(data).is_dir() else [Path(data)]
    convs = [c for p in paths for c in load_locomo(p)][:limit]
    out: dict[str, Any] = {"conversations": len(convs)}
    for w in (window, 1):
        with MessagesApiServer(responder=keep_everything, count_tokens=True) as api:
            model = _model(api, None)
            msgs = writes = 0
            for i, conv in enumerate(convs):
                if progress:
                    progress(f"observe, windows of {w}", i, len(convs))
                with tempfile.TemporaryDirectory() as d:
                    soul = _soul(d, model, SoulConfig(turn=TurnConfig(observe_window=w)), embedder)
                    for b in conv.batches:
                        r = soul.observe(b.messages, at=b.at, session=b.session)
                        msgs += len(b.messages)
                        writes += len(r.writes)
                    soul.close()
            u = model.usage_total
            out[f"window_{w}"] = {"messages": msgs, "calls": u.calls, "calls_per_message": round(u.calls / msgs, 4),
                                  "messages_per_call": round(msgs / max(1, u.calls), 1),
                                  "tokens_sent_per_message": round(u.sent_tokens / msgs, 1),
                                  "output_tokens_per_message": round(u.output_tokens / msgs, 1),
                                  "cache_read_tokens": u.cache_read_tokens, "writes": writes}
    return out
