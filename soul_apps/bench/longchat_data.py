"""Long technical chats for `soul bench longchat`: generated, seeded, with questions whose evidence is known.

A chat is a user working with an assistant on one software project over many sessions (one a working day).
Every message is long (2–10k characters) and mixes forms: markdown prose, fenced code, tables, bullet and
numbered lists, logs. Woven in are the facts the questions ask about, each stated in exactly one message:

* ``version``    — a library pinned for a service, in prose or in a requirements/pyproject block;
* ``figure``     — a measured figure of a service (p95 latency, error rate, throughput), often in a table;
* ``updated``    — a figure restated later ("p95 is now 41 ms"): the question asks for the current value,
                   evidence is the latest statement only, key phrase the latest figure;
* ``date``       — a sprint's end date or a release date in a sprint plan;
* ``code``       — a setting in a code block (a timeout, a pool size, a retry count);
* ``proposal``   — what the assistant proposed and the user accepted in the next message.

Around them, filler of the same kinds (other services, other figures, other versions) so that a figure's
words recur across the chat. ``generate(seed, tokens)`` is deterministic in its arguments. The chats are a smoke
test of the long-chat path, not a quality figure: the memory's long-chat features were tuned with these
templates, so every seed is development data (real chats: :mod:`soul_apps.bench.beam`).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

DEV = range(0, 100)
HELD_OUT = range(1000, 1100)
"""Seeds not used while writing the generator (its templates are development data all the same)."""

T0 = 1_767_261_600.0  # 2026-01-01 10:00 UTC
DAY = 86_400.0

_SERVICES = ["gateway", "billing", "search", "ingest", "auth", "notifier", "scheduler", "ledger", "catalog", "checkout",
             "profile", "reporting", "payments", "inventory", "telemetry", "exporter", "matcher", "router", "crawler",
             "indexer", "uploader", "renderer", "mailer", "quota"]
_LIBS = ["fastapi", "django", "sqlalchemy", "pydantic", "celery", "redis-py", "httpx", "uvicorn", "gunicorn", "numpy",
         "pandas", "polars", "grpcio", "protobuf", "kafka-python", "boto3", "psycopg", "asyncpg", "orjson", "structlog",
         "opentelemetry-sdk", "prometheus-client", "alembic", "tenacity", "aiohttp", "starlette", "ray", "pyarrow"]
_METRICS = [("p95 latency", "ms"), ("p99 latency", "ms"), ("error rate", "%"), ("throughput", "req/s"),
            ("cold start", "ms"), ("memory footprint", "MiB"), ("queue depth", "messages"), ("cache hit rate", "%")]
_SETTINGS = [("timeout", "s"), ("pool_size", ""), ("max_retries", ""), ("batch_size", ""), ("prefetch", ""),
             ("keepalive", "s"), ("max_connections", ""), ("backoff_base", "s")]
_PROBLEMS = ["the nightly export times out", "the cache stampedes after a deploy", "the queue backs up on Mondays",
             "login latency spikes at 9am", "the search index drifts from the database", "retries amplify an outage",
             "the billing job double-charges on restart", "the crawler hits rate limits", "p99 doubles under load",
             "memory grows until the pod is killed", "webhooks arrive out of order", "the migration locks the table"]
_FIXES = ["a token bucket in front of the worker pool", "request coalescing with a per-key lock",
          "an outbox table read by a single relay", "a circuit breaker with a half-open probe",
          "idempotency keys stored for 24 hours", "a read replica for the reporting queries",
          "jittered exponential backoff capped at 30 seconds", "sharding the queue by tenant id",
          "a bloom filter before the database lookup", "online schema change with a shadow table",
          "a bounded LRU cache with a 5 minute TTL", "streaming the export in pages of 10,000 rows"]
_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December"]
_PROSE = [
    "We looked at the traces again and the slow path is almost entirely in the serialisation step.",
    "The dashboards show the same shape every day, which points at a scheduled job rather than traffic.",
    "I would keep the change small and behind a flag so that we can roll it back without a deploy.",
    "The load test ran for forty minutes with the production mix of reads and writes.",
    "Most of the time goes into waiting on the connection pool, not into the queries themselves.",
    "The flame graph is flat apart from the JSON encoder and the TLS handshake.",
    "Let us write the runbook entry now while the details are fresh.",
    "The on-call rotation flagged this twice last week, both times after a config push.",
    "Nothing in the logs suggests data loss; the retries cover the gap.",
    "We should compare against last quarter's baseline before calling it a regression.",
    "The staging numbers are noisy because the cluster is shared with the data team.",
    "I checked the changelog of the library and the behaviour changed in the last minor release.",
]


@dataclass(frozen=True)
class Question:
    question: str
    kind: str
    evidence: tuple[str, ...]
    key_phrases: tuple[str, ...]


@dataclass
class Chat:
    chat_id: str
    seed: int
    user: str
    messages: list[dict[str, Any]]
    questions: list[Question]

    def to_json(self) -> dict[str, Any]:
        return {"chat_id": self.chat_id, "seed": self.seed, "user": self.user, "messages": self.messages,
                "questions": [asdict(q) for q in self.questions]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Chat:
        return cls(d["chat_id"], int(d["seed"]), d["user"], list(d["messages"]),
                   [Question(q["question"], q["kind"], tuple(q["evidence"]), tuple(q["key_phrases"]))
                    for q in d["questions"]])

    @property
    def chars(self) -> int:
        return sum(len(m["text"]) for m in self.messages)


def _day(at: float) -> str:
    import time
    t = time.gmtime(at)
    return f"{t.tm_mday} {_MONTHS[t.tm_mon - 1]} {t.tm_year}"


class _Writer:
    def __init__(self, rng: random.Random, services: list[str]) -> None:
        self.rng = rng
        self.services = services

    def prose(self, n: int) -> str:
        return " ".join(self.rng.choice(_PROSE) for _ in range(n))

    def version(self) -> str:
        r = self.rng
        return f"{r.randint(0, 5)}.{r.randint(0, 40)}.{r.randint(0, 12)}"

    def figure(self, unit: str) -> str:
        r = self.rng
        if unit == "%":
            return f"{r.randint(1, 99)}.{r.randint(0, 9)}%"
        if unit == "ms":
            return f"{r.randint(3, 900)} ms"
        return f"{r.randint(10, 9000)} {unit}"

    def table(self, rows: int, metric: tuple[str, str], fixed: dict[str, str] | None = None) -> str:
        name, unit = metric
        out = [f"| service | {name} | change |", "|---|---|---|"]
        shown = self.rng.sample(self.services, min(rows, len(self.services)))
        for i, s in enumerate(s for s in (fixed or {}) if s not in shown):
            shown[i] = s
        for s in shown:
            value = (fixed or {}).get(s) or self.figure(unit)
            out.append(f"| {s} | {value} | {self.rng.choice(['+', '-'])}{self.rng.randint(1, 30)}% |")
        return "\n".join(out)

    def code(self, lines: int, fixed: tuple[str, str, str] | None = None) -> str:
        r = self.rng
        svc = fixed[0] if fixed else r.choice(self.services)
        body = [f"from {svc}_client import Client", "", "", "def make_client(env: str) -> Client:"]
        settings = [(k, str(r.randint(1, 120))) for k, _ in r.sample(_SETTINGS, 4)]
        if fixed:
            settings = [(k, v) for k, v in settings if k != fixed[1]] + [(fixed[1], fixed[2])]
        body.append(f"    return Client(env, {', '.join(f'{k}={v}' for k, v in settings)})")
        for i in range(lines):
            body.append(f"    # step {i}: {r.choice(['warm the pool', 'check the quota', 'log the config', 'emit a metric'])}")
        return "```python\n" + "\n".join(body) + "\n```"

    def bullets(self, n: int) -> str:
        r = self.rng
        return "\n".join(f"- {r.choice(self.services)}: {r.choice(['bump', 'pin', 'audit', 'profile'])} "
                         f"{r.choice(_LIBS)} and re-run the {r.choice(['smoke', 'load', 'soak'])} test" for _ in range(n))

    def log(self, n: int) -> str:
        r = self.rng
        return "```\n" + "\n".join(f"2026-0{r.randint(1, 9)}-{r.randint(10, 28)}T{r.randint(10, 23)}:{r.randint(10, 59)}Z "
                                   f"{r.choice(['INFO', 'WARN', 'ERROR'])} {r.choice(self.services)} "
                                   f"request_id={r.randint(10**5, 10**6)} took {r.randint(2, 2000)}ms"
                                   for _ in range(n)) + "\n```"

    def filler(self, chars: int) -> str:
        """Technical text of about ``chars`` characters in mixed forms, about nothing the questions ask."""
        parts: list[str] = []
        size = 0
        while size < chars:
            kind = self.rng.choice(["prose", "table", "code", "bullets", "log", "prose"])
            part = {"prose": lambda: self.prose(self.rng.randint(3, 8)),
                    "table": lambda: self.table(self.rng.randint(3, 7), self.rng.choice(_METRICS)),
                    "code": lambda: self.code(self.rng.randint(2, 10)),
                    "bullets": lambda: self.bullets(self.rng.randint(3, 8)),
                    "log": lambda: self.log(self.rng.randint(4, 12))}[kind]()
            parts.append(part)
            size += len(part) + 2
        return "\n\n".join(parts)


def generate(seed: int, tokens: int = 150_000) -> Chat:
    """One chat of about ``tokens`` tokens (characters / 4), deterministic in ``seed`` and ``tokens``."""
    rng = random.Random(seed * 1_000_003 + tokens)
    user = rng.choice(["maya", "omar", "lena", "ravi", "chen", "sofia", "tom", "ines"])
    services = rng.sample(_SERVICES, 10)
    w = _Writer(rng, services)
    target = tokens * 4
    n_msgs = max(12, target // 6000)
    msgs: list[dict[str, Any]] = []
    questions: list[Question] = []
    planned: list[tuple[int, str]] = []  # (message index, kind) of the facts woven in
    kinds = ["version", "figure", "updated", "date", "code", "proposal"]
    n_facts = max(6, n_msgs // 4)
    slots = rng.sample(range(1, n_msgs - 2), min(n_facts, n_msgs - 3))
    for i, slot in enumerate(sorted(slots)):
        planned.append((slot, kinds[i % len(kinds)]))
    used_keys: set[tuple[str, str]] = set()
    at = T0
    session = 0
    texts: list[str] = [""] * n_msgs
    speakers = [user if i % 2 == 0 else "assistant" for i in range(n_msgs)]
    facts_at: dict[int, list[str]] = {}
    later: list[tuple[int, str]] = []  # updates to place after their first statement

    def fresh(kind: str) -> str:
        for _ in range(100):
            s = rng.choice(services)
            if (kind, s) not in used_keys:
                used_keys.add((kind, s))
                return s
        return rng.choice(services)

    for slot, kind in planned:
        s = fresh(kind)
        if kind == "proposal" and speakers[slot] != "assistant":
            slot += 1  # slots end two before the last message: the acceptance fits after it
        lines = facts_at.setdefault(slot, [])
        if kind == "version":
            lib, ver = rng.choice(_LIBS), w.version()
            if rng.random() < 0.5:
                lines.append(f"For {s} we pinned {lib} to {ver} after the last upgrade broke the build.")
            else:
                lines.append(f"Pinned for {s} in requirements:\n```\n{lib}=={ver}\n{rng.choice(_LIBS)}=={w.version()}\n```")
            questions.append(Question(f"Which version of {lib} did we pin for {s}?", kind, (f"m{slot}",), (lib, ver)))
        elif kind == "figure":
            name, unit = rng.choice(_METRICS)
            value = w.figure(unit)
            lines.append(f"Measured {name} of {s} this week:\n\n" + w.table(5, (name, unit), {s: value}))
            questions.append(Question(f"What {name} did we measure for {s}?", kind, (f"m{slot}",), (value,)))
        elif kind == "updated":
            name, unit = rng.choice(_METRICS[:3])
            first, last = w.figure(unit), w.figure(unit)
            while last == first:
                last = w.figure(unit)
            lines.append(f"The {name} of {s} is {first} on the current build.")
            where = rng.randint(slot + 2, n_msgs - 1) if slot + 2 < n_msgs else n_msgs - 1
            later.append((where, f"Update on {s}: after the fix, its {name} is now {last} (it was {first})."))
            questions.append(Question(f"What is the {name} of {s} now?", kind, (f"m{where}",), (last,)))
        elif kind == "date":
            sprint = rng.randint(3, 40)
            end = at + DAY * (slot // 2 + rng.randint(10, 40))
            lines.append(f"Sprint plan:\n\n1. Sprint {sprint} starts after the {s} freeze\n2. Scope: {s} hardening and "
                         f"the {rng.choice(_LIBS)} upgrade\n3. Sprint {sprint} ends on {_day(end)}")
            questions.append(Question(f"When does sprint {sprint} end?", kind, (f"m{slot}",), (_day(end),)))
        elif kind == "code":
            key, _ = rng.choice(_SETTINGS)
            value = str(rng.randint(2, 300))
            lines.append(f"Here is the client setup for {s}:\n\n" + w.code(3, (s, key, value)))
            questions.append(Question(f"What {key} did we set in the {s} client?", kind, (f"m{slot}",),
                                      (f"{key}={value}",)))
        else:  # proposal: the assistant proposes, the user accepts in the next message
            problem, fix = rng.choice(_PROBLEMS), rng.choice(_FIXES)
            lines.append(f"For {s}, where {problem}, I propose {fix}.")
            facts_at.setdefault(slot + 1, []).append(f"Agreed, let us go with {fix} for {s}.")
            questions.append(Question(f"What did we decide to do about {s}, where {problem}?", kind,
                                      (f"m{slot}", f"m{slot + 1}"), tuple(fix.split()[1:4])))
    for where, line in later:
        facts_at.setdefault(where, []).append(line)
    for i in range(n_msgs):
        size = rng.randint(2000, 10000)
        own = facts_at.get(i, [])
        filler = w.filler(max(200, size - sum(len(x) for x in own)))
        blocks = filler.split("\n\n")
        for line in own:
            blocks.insert(rng.randint(0, len(blocks)), line)
        texts[i] = "\n\n".join(blocks)
        if i and i % rng.randint(6, 14) == 0:
            session += 1
            at = T0 + DAY * session * rng.choice([1, 1, 2, 3])
        else:
            at += rng.randint(60, 900)
        msgs.append({"id": f"m{i}", "speaker": speakers[i], "text": texts[i], "at": at, "session": f"s{session}"})
    return Chat(f"chat-{seed}-{tokens // 1000}k", seed, user, msgs, questions)


def write(directory: str | Path, seeds: range | list[int], tokens: list[int]) -> list[Path]:
    """Write one JSON file per seed × size into ``directory``."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    out = []
    for seed in seeds:
        for t in tokens:
            chat = generate(seed, t)
            p = d / f"{chat.chat_id}.json"
            p.write_text(json.dumps(chat.to_json()))
            out.append(p)
    return out


def load(directory: str | Path) -> list[Chat]:
    p = Path(directory)
    files = sorted(p.glob("*.json")) if p.is_dir() else [p]
    return [Chat.from_json(json.loads(f.read_text())) for f in files]
