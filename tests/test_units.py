"""Long messages become several units: every piece an episode of its own, found by its own words and meaning."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from soul_runtime.loop.soul import Soul
from soul_runtime.loop.units import HEAD_CHARS, OWN_VECTORS_UPTO, SCRAP_CHARS, UNIT_MAX, split_units
from soul_runtime.memory.soul_memory import SoulMemory
from soul_runtime.models.offline import OfflineModel
from tests.fakes import HashEmbedder

T0 = 1_780_000_000.0

LONG = "\n\n".join([
    "We spent the morning on the gateway again. " * 12,
    "Pinned for billing in requirements:\n```\nfastapi==0.110.2\norjson==3.9.15\n```",
    "| service | p95 latency |\n|---|---|\n| gateway | 41 ms |\n| search | 230 ms |",
    "```python\ndef make_client(env):\n\n    return Client(env, timeout=17, pool_size=9)\n```",
    "The dashboards look calm and the team is happy with the rollout so far. " * 6,
    "Sprint 12 ends on 14 February 2026; for the export I propose streaming it in pages of 10,000 rows.",
])


class CountingEmbedder(HashEmbedder):
    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        self.texts += texts
        return super()._embed_batch(texts)


def test_units_are_small_keep_code_fences_and_cover_the_text() -> None:
    units = split_units(LONG)
    assert all(len(u) <= UNIT_MAX for u in units)
    assert all(len(u) >= SCRAP_CHARS for u in units)
    fenced = "```python\ndef make_client(env):\n\n    return Client(env, timeout=17, pool_size=9)\n```"
    assert any(fenced in u for u in units)  # its blank line does not cut a fenced block
    joined = " ".join(units).split()
    assert set(LONG.split()) == set(joined)


def test_a_long_message_is_found_and_shown_by_each_of_its_units(tmp_path: Path) -> None:
    emb = CountingEmbedder()
    mem = SoulMemory(tmp_path, embedder=emb)
    soul = Soul("dev", tmp_path, memory=mem, model=OfflineModel())
    soul.observe([{"speaker": "maya", "text": "Short hello to start the day with the team.", "id": "m0", "at": T0},
                  {"speaker": "assistant", "text": LONG, "id": "m1", "at": T0 + 60}])
    written = list(emb.texts)
    units = [e for e in mem.episodes() if e.sources == ("m1",)]
    assert len(units) >= 2 and all(e.at == T0 + 60 and e.actor == "assistant" for e in units)
    for query, phrase in (("fastapi version pinned for billing", "fastapi==0.110.2"),
                          ("gateway p95 latency", "41 ms"), ("client timeout", "timeout=17"),
                          ("when does sprint 12 end", "14 February 2026")):
        hits = mem.recall(query, 5, at=T0 + 3600)
        assert any(phrase in h.text and h.sources == ("m1",) for h in hits), (query, [h.text for h in hits])
    # prose is a unit too: a sentence of it is found by its own words
    assert any("dashboards look calm" in h.text and h.sources == ("m1",)
               for h in mem.recall("are the dashboards calm after the rollout", 5, at=T0 + 3600))
    # a message this size gives each unit a vector of its own text
    assert len(LONG) <= OWN_VECTORS_UPTO
    assert all(any(u.summary in t for t in written) for u in units if u.summary != units[0].summary)
    soul.close()
    mem.close()


def test_the_units_of_a_longer_message_share_the_vector_of_its_opening(tmp_path: Path) -> None:
    emb = CountingEmbedder()
    mem = SoulMemory(tmp_path, embedder=emb)
    soul = Soul("dev", tmp_path, memory=mem, model=OfflineModel())
    longer = LONG + "\n\n" + "Notes from the retro: the search team wants more staging capacity. " * 40
    assert len(longer) > OWN_VECTORS_UPTO
    soul.observe([{"speaker": "assistant", "text": longer, "id": "m1", "at": T0}])
    units = [e for e in mem.episodes() if e.sources == ("m1",)]
    assert len(units) > 4
    embedded = [t for t in emb.texts if "gateway" in t or "fastapi" in t or "retro" in t]
    assert len(embedded) == 1 and len(embedded[0]) <= HEAD_CHARS and "fastapi" not in embedded[0]
    hits = mem.recall("fastapi version pinned for billing", 5, at=T0 + 60)
    assert any("fastapi==0.110.2" in h.text for h in hits)
    soul.close()
    mem.close()


def test_a_short_message_stays_one_episode(tmp_path: Path) -> None:
    mem = SoulMemory(tmp_path, embedder=HashEmbedder())
    soul = Soul("dev", tmp_path, memory=mem, model=OfflineModel())
    soul.observe([{"speaker": "maya", "text": "We pinned fastapi 0.110.2 for billing after the upgrade broke the build.",
                   "id": "m1", "at": T0}])
    [episode] = [e for e in mem.episodes() if e.sources == ("m1",)]  # stored, and as one episode
    assert "fastapi 0.110.2" in episode.summary
    soul.close()
    mem.close()


def test_a_short_message_is_embedded_whole(tmp_path: Path) -> None:
    emb = CountingEmbedder()
    mem = SoulMemory(tmp_path, embedder=emb)
    soul = Soul("dev", tmp_path, memory=mem, model=OfflineModel())
    said = ("We pinned fastapi 0.110.2 for billing after the upgrade broke the build, and the gateway team moved "
            "their canary to the eu-west cluster, where the p95 latency of checkout went from 230 ms to 180 ms "
            "over the week; the search team keeps its own pins until the March release, then follows. The billing "
            "team will revisit the pin when the next minor version of fastapi lands, and the gateway team plans "
            "to move the canary back once the latency holds for a sprint.")
    assert HEAD_CHARS < len(said) <= 800
    soul.observe([{"speaker": "maya", "text": said, "id": "m1", "at": T0}])
    assert any(said in t for t in emb.texts)
    soul.close()
    mem.close()


REPORT = ("Measured throughput of catalog this week:\n\n| service | throughput | change |\n|---|---|---|\n"
          "| catalog | 4533 req/s | -8% |\n\nHere is the client setup:\n\n```python\nfrom catalog_client import Client\n\n"
          "def make_client(env: str) -> Client:\n    return Client(env, max_connections=73, batch_size=42)\n"
          "    # step 0: log the config\n```\n\n```\n2026-03-20T16:30Z INFO matcher request_id=935325 took 539ms\n```\n\n"
          "The rollout went fine and we finished the migration of the catalog service to the new cluster.")


def test_the_model_reads_the_prose_and_the_units_keep_code_tables_and_logs(tmp_path: Path) -> None:
    from soul_runtime.models.base import Exchange
    from soul_runtime.text import prose

    assert prose(REPORT).count("\n") < REPORT.count("\n") and "max_connections" not in prose(REPORT)
    assert prose("No code here | just a bar.") == "No code here | just a bar."
    ex = OfflineModel().decide(Exchange(REPORT, "", "maya", ("m1",), T0)).extraction
    assert ex.task is None and "max_connections" not in ex.episode and "request_id" not in ex.episode
    mem = SoulMemory(tmp_path, embedder=HashEmbedder())
    soul = Soul("dev", tmp_path, memory=mem, model=OfflineModel())
    soul.observe([{"speaker": "maya", "text": REPORT, "id": "m1", "at": T0}])
    assert mem.procedures() == []
    for query, phrase in (("catalog client max_connections", "max_connections=73"),
                          ("catalog throughput", "4533 req/s")):
        assert any(phrase in h.text for h in mem.recall(query, 5, at=T0 + 60)), query
    soul.close()
    mem.close()


def test_a_list_of_items_named_by_service_is_not_a_procedure(tmp_path: Path) -> None:
    """ "- auth: pin httpx and re-run the load test" heads one item of a list, not a procedure named "auth"; a
    titled procedure told with its steps still is one."""
    from soul_runtime.models.offline_rules import parse_procedure
    plan = ("- auth: pin sqlalchemy and re-run the load test\n- matcher: profile pyarrow and re-run the smoke "
            "test\n- mailer: bump boto3 and re-run the soak test\n\nAll of that went fine and the tests pass now.")
    assert parse_procedure(plan) is None
    assert parse_procedure("Deploy: build the image, push it and restart the pods.") == (
        "Deploy", ("build the image", "push it", "restart the pods"))
    mem = SoulMemory(tmp_path, embedder=HashEmbedder())
    soul = Soul("dev", tmp_path, memory=mem, model=OfflineModel())
    soul.observe([{"speaker": "maya", "text": plan, "id": "m1", "at": T0}])
    assert mem.procedures() == [] and any("boto3" in e.summary for e in mem.episodes())
    soul.close()
    mem.close()


def test_units_share_one_near_duplicate_scan_that_sees_every_row_written_before_them(tmp_path: Path) -> None:
    """A message's units compare with the same stored rows (one scan for them all), and a row written between
    two of them by something else (another message's write in the same call) is a candidate for the next."""
    from dataclasses import replace

    from soul_runtime.records import Extraction, Op, WriteRequest
    mem = SoulMemory(tmp_path, embedder=HashEmbedder())
    head = "Notes on the gateway rollout and its pinned versions for the billing team."

    def write(key: str, text: str) -> WriteRequest:
        return WriteRequest(turn_key=key, now=T0, actor="maya", sources=(key[4:].split("#")[0],), session="s1",
                            extraction=Extraction(episode=text, event=True), vector_text=head)

    other = "The gateway p95 latency is 41 ms after the pool fix on Tuesday."
    reqs = [write("obs:m1", head), write("obs:m1#u1", "fastapi==0.110.2 and orjson==3.9.15 are pinned."),
            write("obs:m2", other), write("obs:m1#u2", other + " "),  # says what m2 said: merged into it
            write("obs:m1#u3", "Sprint 12 ends on 14 February 2026.")]
    writes = mem.write_many(reqs)
    ops = [[w.op for w in ws if w.store.value == "episodic"] for ws in writes]
    assert ops == [[Op.ADD], [Op.ADD], [Op.ADD], [Op.UPDATE], [Op.ADD]], ops
    merged = next(e for e in mem.episodes() if e.summary == other)
    assert set(merged.sources) == {"m1", "m2"}
    again = mem.write_many([replace(reqs[3], turn_key="obs:m3#u1", sources=("m3",))])  # a later write: merged too
    assert [w.op for w in again[0] if w.store.value == "episodic"] == [Op.UPDATE]
    assert set(next(e for e in mem.episodes() if e.summary == other).sources) == {"m1", "m2", "m3"}
    mem.close()


def test_a_message_of_a_million_characters_is_stored_as_units_and_found(tmp_path: Path) -> None:
    """A pasted log of a million characters is accepted (no size refusal below max_text_chars), stored as units
    of its own words to its end, its size in the trace; the model reads a window's worth of it."""
    from soul_runtime.config import TurnConfig

    lines = [f"2024-03-{1 + i % 28:02d} 12:{i % 60:02d}:00 INFO worker-{i % 97} handled batch {i} in {i % 500} ms"
             for i in range(20_000)]
    log = "Here is the whole log of last night:\n" + "\n".join(lines)
    log = log[:999_900].rsplit("\n", 1)[0] + "\nFINAL: the nightly export finished with checksum ab12cd34ef."
    assert 990_000 < len(log) <= 1_000_000 <= TurnConfig().max_text_chars
    mem = SoulMemory(tmp_path, embedder=HashEmbedder())
    soul = Soul("dev", tmp_path, memory=mem, model=OfflineModel())
    soul.observe([{"speaker": "maya", "text": log, "id": "m1", "at": T0}])
    assert mem.stats()["episodes"] > 2_000  # every part of it, not the first few
    hits = mem.recall("nightly export checksum", 5, at=T0 + 60)
    assert any("ab12cd34ef" in h.text and h.sources == ("m1",) for h in hits)
    [trace] = soul.traces(last=1)
    assert f"{len(log)} characters" in trace.query
    soul.close()
    mem.close()
