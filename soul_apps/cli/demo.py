"""``soul demo``: Maya and Atlas over four days (:mod:`soul_apps.cli.scenario`), turn by turn.

For every turn it shows the user text, the reply, what was recalled (layer, id,
score, sources) and what was written (layer, op, key, reason); afterwards each
layer's contents and the history of Tendril's production database.
The demo never imports Ray: it is handed a connected runtime.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.rule import Rule

from soul_apps.cli import progress, render
from soul_apps.cli.scenario import ASSISTANT, EXPECTED_FACTS, EXPECTED_TASK_CLASS, SCENARIO, USER
from soul_runtime.clock import iso
from soul_runtime.errors import InvalidInput

SOUL_ID = "atlas"
HISTORY_KEY = ("tendril", "production_database")
ANTHROPIC_DEFAULT = "claude-sonnet-5-5"  # mirrors models.claude.DEFAULT_MODEL_ID (no SDK import here)


def model_banner(env: Mapping[str, str] | None = None) -> tuple[str, bool]:
    """(what the soul will run, offline?) — decided the way model_factory.make_model decides."""
    env = os.environ if env is None else env
    chosen = (env.get("SOUL_MODEL") or "").strip()
    if chosen and chosen != "auto":
        if chosen == "offline":
            return "soul-offline-rules-v1 — the OFFLINE model (--model offline)", True
        return f"model {chosen} (--model / SOUL_MODEL)", False
    if (env.get("ANTHROPIC_API_KEY") or "").strip():
        model = (env.get("SOUL_ANTHROPIC_MODEL") or "").strip() or ANTHROPIC_DEFAULT
        return f"Anthropic model {model} (ANTHROPIC_API_KEY is set; replies come from the API)", False
    return ("soul-offline-rules-v1 — the OFFLINE model: rule-based and deterministic, no network, no API key "
            "(set ANTHROPIC_API_KEY to use Claude)"), True


def scenario_days(days: int | None) -> tuple[Any, ...]:
    n = len(SCENARIO) if days is None else days
    if not 1 <= n <= len(SCENARIO):
        raise InvalidInput(f"--days must be between 1 and {len(SCENARIO)}, got {days}")
    return SCENARIO[:n]


def play(rt: Any, console: Console, *, days: int | None = None, as_json: bool = False,
         soul_id: str = SOUL_ID, work: Callable[[str, int, int], None] | None = None) -> dict[str, Any]:
    """Play the scenario against ``rt`` (a connected Runtime) and show it; returns everything shown as data.
    ``work(what, done, total)`` is told each turn (see :mod:`soul_apps.cli.progress`)."""
    soul = rt.soul(soul_id)
    say = work or (lambda what, done, total: None)
    n_turns = sum(len(day.turns) for day in scenario_days(days))
    out: dict[str, Any] = {"soul": soul_id, "turns": []}
    t_start = time.perf_counter()
    show = not as_json
    model_seen = ""
    for d, day in enumerate(scenario_days(days), 1):
        if show:
            console.print(Rule(f"Day {d} — {day.date:%A %d %B %Y}"))
            console.print(f"[dim]{escape(day.note)}[/]")
        for i, text in enumerate(day.turns):
            at = day.date.timestamp() + 60 * i
            say(f"day {d}, turns", len(out["turns"]), n_turns)
            res = soul.turn(text, user=USER, at=at)
            model_seen = res.model
            out["turns"].append({"day": d, "at": iso(at), "user": USER, "text": text, "reply": res.reply,
                                 "turn_id": res.turn_id, "recalled": render.plain(res.recalled),
                                 "writes": [w.to_dict() for w in res.writes], "model": res.model,
                                 "offline": res.offline})
            if show:
                console.print()
                render.print_turn(console, USER, text, res, assistant=ASSISTANT)
    out["turn_seconds"] = round(time.perf_counter() - t_start, 2)
    say("reading back what the soul remembers", 0, 0)
    out["model"] = model_seen
    facts = soul.facts()
    procs = soul.procedures()
    episodes = soul.episodes()
    history = soul.fact_history(*HISTORY_KEY)
    stats = soul.stats()
    out.update(facts=render.plain(facts), procedures=render.plain(procs), episode_count=len(episodes),
               recent_episodes=render.plain(episodes[-5:]), history=render.plain(history),
               history_line=render.history_line(history), stats=stats)
    found = {(f.entity, f.attribute): f.value for f in facts if f.status == "active"}
    days_played = len(scenario_days(days))
    expected = EXPECTED_FACTS if days_played == len(SCENARIO) else {}
    out["expected_facts_missing"] = [f"{e}:{a} = {v}" for (e, a), v in expected.items() if found.get((e, a)) != v]
    if show:
        _summary(console, facts, procs, episodes, history, stats, out, expected)
    return out


def _summary(console: Console, facts: Any, procs: Any, episodes: Any, history: Any, stats: Mapping[str, Any],
             out: Mapping[str, Any], expected: Mapping[Any, str]) -> None:
    console.print(Rule("What the soul remembers"))
    console.print(render.facts_table(facts))
    console.print(render.procedures_table(procs) if procs else "[dim]procedures: none yet[/]")
    versions = ", ".join(f"v{p.version} {p.status}" for p in procs if p.task_class == EXPECTED_TASK_CLASS)
    if versions:
        console.print(f"procedure [bold]{EXPECTED_TASK_CLASS}[/]: {versions}")
    console.print(f"episodes: [bold]{len(episodes)}[/] stored; the {min(5, len(episodes))} most recent:")
    console.print(render.episodes_table(episodes[-5:], "recent episodes"))
    ent, att = HISTORY_KEY
    console.print(render.history_table(history, f"fact history of {ent}:{att}"))
    console.print(f"[bold]{ent}:{att}[/]: {escape(out['history_line'])}")
    console.print(render.kv_table("layer counts", stats))
    missing = out["expected_facts_missing"]
    if expected:
        console.print(f"scenario's expected facts: {len(expected) - len(missing)}/{len(expected)} are facts"
                      + (f"; not (yet) a fact: {escape(', '.join(missing))} — a statement only counts as an "
                         "observation until confirmed or seen in 3 episodes" if missing else ""))
    console.print(f"{len(out['turns'])} turns in {out['turn_seconds']:.1f} s with {escape(out['model'])}")


def run_cli(ctx: Any) -> int:
    """``soul demo`` (``ctx`` is the CLI's context: args, consoles, ``runtime()``)."""
    days = scenario_days(ctx.args.days)
    label, offline = model_banner()
    data_dir = os.path.abspath(os.path.expanduser(ctx.args.data_dir)) if ctx.args.data_dir else \
        tempfile.mkdtemp(prefix="soul-demo-")
    if ctx.args.data_dir and (Path(data_dir) / "souls" / SOUL_ID).exists():
        raise InvalidInput(f"{data_dir} already holds a soul '{SOUL_ID}'; a demo needs a fresh data dir")
    namespace = ctx.args.namespace or ("souls" if ctx.address is None else f"demo-{os.getpid()}")
    if not ctx.json:
        ctx.out.print(f"[bold]soul demo[/] — {len(days)} day(s) of {USER} and {ASSISTANT}")
        ctx.out.print(f"model:    [bold]{label}[/]")
        ctx.out.print(f"data dir: {data_dir}  (fresh; soul id '{SOUL_ID}')")
        ctx.out.print(f"ray:      {ctx.where}")
    t0 = time.perf_counter()
    with ctx.runtime(data_dir=data_dir, namespace=namespace, background=False) as rt:
        connected = time.perf_counter() - t0
        with progress.working(ctx.err, "playing the scenario", live=False) as work:
            out = play(rt, ctx.out, days=ctx.args.days, as_json=ctx.json, work=work)
        if ctx.address is not None:
            rt.shutdown_actors()  # detached actors on a cluster: do not leave the demo's behind
    out.update(data_dir=data_dir, model_label=label, offline=offline, connect_seconds=round(connected, 2),
               total_seconds=round(time.perf_counter() - t0, 2))
    if ctx.json:
        render.print_json(out)
    else:
        ctx.out.print(f"done in {out['total_seconds']:.1f} s (Ray + actors {connected:.1f} s); "
                      f"data in {data_dir}; inspect it with  soul facts atlas --data-dir {data_dir}")
    return 0
