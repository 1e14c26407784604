"""`soul bench longchat --ray`: long technical chats taken in by the runtime's store actors, as a platform would.

The same chats, questions, metrics and baselines as :mod:`soul_runtime.bench.longchat`, but every chat is one
soul of an embedded local runtime (``soul_runtime.connect``): ``callers`` asyncio callers each take the next
chat and observe it session by session through the public async API, so the souls' episodic, semantic and
procedural shards take many chats at once. Every process of the local Ray is sampled while they do (resident
memory, threads): the peak RSS of each shard and host process is what the memory bound is stated on. Recall
goes through the same API (``soul.recall(question, k, at=…)``) and is packed as for a turn.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from soul_runtime.bench.longchat import Tally, _sessions, score_questions, summary
from soul_runtime.bench.longchat_data import load
from soul_runtime.bench.scale import Sampler
from soul_runtime.config import TurnConfig
from soul_runtime.errors import SoulError
from soul_runtime.records import RecalledItem

Progress = Callable[[str, int, int], None]


TIMELINE_POINTS = 300


def soul_id(chat_id: str) -> str:
    return f"longchat-{chat_id}"


def run_on_ray(data: str | Path, budgets: Sequence[int] = (500, 1000, 2000), *, callers: int = 4,
               embedder: str = "default", data_dir: str | None = None, limit: int | None = None,
               questions: bool = True, sample_every_s: float = 1.0, progress: Progress | None = None
               ) -> dict[str, Any]:
    """Ingest every chat in ``data`` on a fresh embedded runtime (``callers`` chats at a time), then (with
    ``questions``) ask every question through the public API. Returns the figures, ingest rate and the peak
    resident memory of every process of the local Ray."""
    import soul_runtime

    if callers < 1:
        raise soul_runtime.InvalidInput("callers must be >= 1")
    chats = load(data)[:limit]
    turn = TurnConfig()
    budgets = sorted(set(budgets))
    tally = Tally()
    refused: list[str] = []
    path = Path(data_dir or tempfile.mkdtemp(prefix="soul-bench-longchat-"))
    total = sum(len(c.messages) for c in chats)
    done = 0
    sampler = Sampler(sample_every_s, done=lambda: done)
    with soul_runtime.connect(data_dir=str(path), embedder=embedder, model="offline") as rt:

        async def ingest() -> None:
            todo = list(chats)

            async def caller() -> None:
                nonlocal done
                while todo:
                    chat = todo.pop(0)
                    soul = rt.async_soul(soul_id(chat.chat_id))
                    for name, batch in _sessions(chat):
                        try:
                            await soul.observe(batch, session=name)
                        except SoulError as e:  # counted, never hidden: the floor is none
                            refused.append(f"{chat.chat_id}/{name}: {type(e).__name__}: {e}")
                        done += len(batch)
                        if progress:
                            progress("ingest (messages)", done, total)
            await asyncio.gather(*(caller() for _ in range(callers)))

        t0 = time.perf_counter()
        with sampler:
            asyncio.run(ingest())
        ingest_s = time.perf_counter() - t0
        ingest_rss = sampler.report()
        recall_ms: list[float] = []
        if questions:
            for i, chat in enumerate(chats):
                handle = rt.soul(soul_id(chat.chat_id))

                def recall(q: str, at: float, soul: Any = handle) -> list[RecalledItem]:
                    return list(soul.recall(q, turn.recall_k, at=at))
                recall_ms += score_questions(chat, recall, tally, budgets)
                if progress:
                    progress("questions (chats)", i + 1, len(chats))
        stats = [rt.soul(soul_id(c.chat_id)).stats() for c in chats]
    res: dict[str, Any] = summary(tally, budgets, turn) if questions else {"budgets": budgets}
    n_chars = sum(c.chars for c in chats)
    res["details"] = {
        "chats": len(chats), "seeds": sorted({c.seed for c in chats}), "messages": total, "chars": n_chars,
        "questions": sum(len(c.questions) for c in chats) if questions else 0, "refused": refused,
        "callers": callers, "ingest_s": round(ingest_s, 1),
        "ingest_messages_per_s": round(total / ingest_s, 2), "ingest_chars_per_s": round(n_chars / ingest_s),
        "episodes": sum(int(s.get("episodes", 0)) for s in stats),
        "recall_p50_ms": round(sorted(recall_ms)[len(recall_ms) // 2], 2) if recall_ms else None,
        "embedder": embedder, "model": "offline", "memory": memory_by_role(ingest_rss),
        "memory_timeline": timeline(sampler.timeline)}
    return res


def timeline(samples: list[dict[str, Any]], points: int = TIMELINE_POINTS) -> list[dict[str, Any]]:
    """At most ``points`` of the sampler's samples (evenly spaced, the last one kept): seconds, messages
    ingested, and the RSS of every shard and host process (MiB)."""
    step = max(1, -(-len(samples) // points))
    kept = samples[::step] + ([samples[-1]] if samples and (len(samples) - 1) % step else [])
    return [{"s": x["s"], "messages": x["done"],
             "rss_mib": {k: v for k, v in x["rss_mib"].items() if "LayerShard" in k or "SoulHost" in k}}
            for x in kept]


def plot_memory(res: dict[str, Any], path: str | Path, limit_mib: float = 1024) -> None:
    """The RSS of every shard and host process against the messages ingested, with ``limit_mib`` drawn."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    d = res["details"]
    samples = d["memory_timeline"]
    names = sorted({k for x in samples for k in x["rss_mib"]}, key=lambda k: ("SoulHost" in k, k))
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for k in names:
        pts = [(x["messages"], x["rss_mib"][k]) for x in samples if k in x["rss_mib"]]
        ax.plot([m for m, _ in pts], [r for _, r in pts], "-" if "LayerShard" in k else "--",
                label=k.replace("ray::", ""), linewidth=1.2)
    ax.axhline(limit_mib, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("long messages ingested")
    ax.set_ylabel("resident memory (MiB)")
    ax.set_title(f"{d['chats']} long chats, {d['callers']} observed at once: RSS of each shard and host "
                 f"({d['ingest_messages_per_s']} messages/s)", fontsize=9)
    ax.set_ylim(0, max(limit_mib * 1.1, max((r for x in samples for r in x["rss_mib"].values()), default=0) * 1.1))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def memory_by_role(report: dict[str, Any]) -> dict[str, Any]:
    """Peak RSS (MiB) of the largest shard process and host process, and of each process of the local Ray."""
    procs = report["processes"]

    def peak(word: str) -> float | None:
        found = [p["rss_bytes_max"] for p in procs if word in p["name"]]
        return round(max(found) / 2**20, 1) if found else None
    return {"shard_rss_peak_mib": peak("LayerShard"), "host_rss_peak_mib": peak("SoulHost"),
            "runtime_rss_peak_mib": round(report["rss_bytes_max"] / 2**20, 1),
            "processes": [{"name": p["name"], "rss_peak_mib": round(p["rss_bytes_max"] / 2**20, 1),
                           "threads_max": p["threads_max"]} for p in procs]}
