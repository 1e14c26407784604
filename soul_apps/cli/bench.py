"""`soul bench …`: benchmarks with a table on screen, a JSON file and a PNG plot."""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table

from soul_apps.bench import HTTP_CLIENTS, fsyncs, plotting
from soul_apps.cli.progress import working
from soul_apps.service import INGRESSES
from soul_runtime.memory.sqlite_db import use_storage
from soul_runtime.owner_only import write_file
from soul_runtime.storage_modes import check_storage

if TYPE_CHECKING:
    from soul_apps.cli.context import Ctx

README_START = "<!-- bench:locomo:start -->"
README_END = "<!-- bench:locomo:end -->"


def _budgets(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"budgets must be comma-separated integers, got {text!r}") from None
    if not out or min(out) <= 0:
        raise argparse.ArgumentTypeError("budgets must be positive")
    return out


def _f(v: float | None) -> str:
    return "—" if v is None else f"{v:.3f}"


def locomo_markdown(res: dict[str, Any]) -> str:
    from soul_apps.bench.locomo import LABELS, SYSTEMS
    budgets = [str(b) for b in res["budgets"]]
    d, head, sysres = res["details"], str(res["headline_budget"]), res["systems"]
    rows = ["| system | " + " | ".join(f"answer recall @ {b}" for b in budgets) + " | "
            + " | ".join(f"evidence recall @ {b}" for b in budgets) + " |",
            "|---|" + "---|" * (2 * len(budgets))]
    for s in SYSTEMS:
        rows.append(f"| {LABELS[s]} | " + " | ".join(_f(sysres[s][b]["answer_recall"]) for b in budgets) + " | "
                    + " | ".join(_f(sysres[s][b]["evidence_recall"]) for b in budgets) + " |")
    for s in ("full", "full_dated"):
        c = res["ceiling"][s]
        tokens = d.get("full_dated_tokens_mean") if s == "full_dated" else None
        rows.append(f"| {LABELS[s]} (~{tokens or d['full_context_tokens_mean']:.0f} tokens) | "
                    + " | ".join(_f(c["answer_recall"]) for _ in budgets) + " |" + " — |" * len(budgets))
    for s in ("bm25", "hybrid", "bm25_dated"):
        rows.append(f"| answer recall, soul / {LABELS[s]} | "
                    + " | ".join(f"{res['ratios'][b][f'answer_vs_{s}']:.2f}×" for b in budgets) + " |" + " |" * len(budgets))
    cats = sorted({c for s in SYSTEMS for c in sysres[s][head]["by_category"]}, key=int)
    rows += ["", f"Per category at {head} tokens (answer recall / evidence recall; 1 multi-hop, 2 temporal, "
                 "3 inference, 4 single-hop):", "",
             "| system | " + " | ".join(f"cat {c}" for c in cats) + " |", "|---|" + "---|" * len(cats)]
    for s in SYSTEMS:
        bc = sysres[s][head]["by_category"]
        rows.append(f"| {LABELS[s]} | " + " | ".join(
            f"{_f(bc.get(c, {}).get('answer_recall'))} / {_f(bc.get(c, {}).get('evidence_recall'))}" for c in cats) + " |")
    rows.append("")
    rows.append(f"{d['conversations']} conversations, {d['questions']} questions (categories 1–4; answer recall on "
                f"{d['answer_questions']} of categories 1, 2, 4), {d['raw_turns']} raw turns → "
                f"{d['stored']['episodes']} episodes, {d['stored']['facts']} facts; recall_k {res['recall_k']}; "
                f"memory lines at {head} tokens: {d['tokens_used_mean']:.0f} tokens of a full conversation of "
                f"{d['full_context_tokens_mean']:.0f} ({100 * d['token_share']:.1f}%); ingest "
                f"{d['ingest_messages_per_s']} messages/s; recall p50 {d['recall_p50_ms']} ms, p99 "
                f"{d['recall_p99_ms']} ms; embedder `{d['embedder']}`, model `{d['model']}`.")
    return "\n".join(rows)


def update_readme(path: Path, block: str) -> bool:
    text = path.read_text()
    pattern = re.compile(re.escape(README_START) + r".*?" + re.escape(README_END), re.S)
    if not pattern.search(text):
        return False
    path.write_text(pattern.sub(lambda _: f"{README_START}\n{block}\n{README_END}", text))
    return True


STORAGE_HELP = ("the storage of the souls' records: local (SQLite, the default) or a postgresql:// URL (PostgreSQL, "
                "this process's caches in temp dirs)")


def cmd_rebuild(ctx: Ctx) -> int:
    from soul_apps.bench import rebuild
    args = ctx.args
    res = rebuild.run(args.storage, args.data, args.episodes, args.repeats,
                      progress=lambda line: ctx.out.print(line, soft_wrap=True))
    ctx.out.print(json.dumps(res, indent=1))
    if args.json:
        write_file(args.json, json.dumps(res, indent=1) + "\n", durable=False)
    return 0


def cmd_locomo(ctx: Ctx) -> int:
    args, out = ctx.args, ctx.out
    if args.plot:
        plotting.require()
    from soul_apps.bench import locomo as bench_locomo
    use_storage(args.storage)
    with working(out, "loading the embedder") as progress:
        res = bench_locomo.run(args.data, args.budget, progress=progress, limit=args.limit,
                               ablation=args.ablation)
    from soul_apps.bench.ablation import LABELS as ABLATION_LABELS
    from soul_apps.bench.locomo import LABELS, SYSTEMS
    budgets = [str(b) for b in res["budgets"]]
    table = Table(title="LoCoMo: answer recall / evidence recall of the lines shown (same run, same budgets)")
    table.add_column("system")
    for b in budgets:
        table.add_column(f"@{b} tok", justify="right")
    for s in [s for s in SYSTEMS + tuple(ABLATION_LABELS) if s in res["systems"]]:
        table.add_row({**LABELS, **ABLATION_LABELS}[s], *(f"{_f(res['systems'][s][b]['answer_recall'])} / "
                                   f"{_f(res['systems'][s][b]['evidence_recall'])}" for b in budgets))
    for s in ("full", "full_dated"):
        table.add_row(LABELS[s], *(f"{_f(res['ceiling'][s]['answer_recall'])} / —" for _ in budgets))
    out.print(table)
    out.print(json.dumps(res["details"], indent=1))
    if args.json:
        write_file(args.json, json.dumps(res, indent=1), durable=False)
    if args.plot:
        bench_locomo.plot(res, args.plot)
    if args.readme and not update_readme(Path(args.readme), locomo_markdown(res)):
        out.print(f"{args.readme} has no {README_START} block; not updated")
    return 0


def _seeds(text: str) -> list[int]:
    """"0-4" or "0,3,7" -> seeds."""
    try:
        out: list[int] = []
        for part in text.split(","):
            a, _, b = part.strip().partition("-")
            out += list(range(int(a), int(b) + 1)) if b else [int(a)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds are like 0-4 or 0,3,7, got {text!r}") from None
    return out


def cmd_longchat(ctx: Ctx) -> int:
    args, out = ctx.args, ctx.out
    from soul_apps.bench import longchat as bench_longchat
    from soul_apps.bench.longchat_data import write
    if args.make is not None:
        made = write(args.data, args.make, args.tokens)
        out.print(f"wrote {len(made)} chats to {args.data}")
    with working(out, "starting the runtime" if args.ray else "loading the embedder") as progress:
        if args.ray:
            from soul_apps.bench.longchat_ray import run_on_ray
            res = run_on_ray(args.data, args.budget, callers=args.callers, limit=args.limit,
                             questions=not args.no_questions, progress=progress)
        else:
            res = bench_longchat.run(args.data, args.budget, progress=progress, limit=args.limit)
    if "systems" not in res:
        out.print(json.dumps({k: v for k, v in res["details"].items() if k != "memory_timeline"}, indent=1))
        if args.json:
            write_file(args.json, json.dumps(res, indent=1), durable=False)
        if args.plot:
            from soul_apps.bench.longchat_ray import plot_memory
            plot_memory(res, args.plot)
        return 0
    budgets = [str(b) for b in res["budgets"]]
    table = Table(title="Long technical chats: evidence recall / key-phrase recall of the lines shown (same run)")
    table.add_column("system")
    for b in budgets:
        table.add_column(f"@{b} tok", justify="right")
    for s in bench_longchat.SYSTEMS:
        table.add_row(bench_longchat.LABELS[s], *(f"{_f(res['systems'][s][b]['evidence_recall'])} / "
                                                  f"{_f(res['systems'][s][b]['key_phrase_recall'])}" for b in budgets))
    out.print(table)
    head = str(res["headline_budget"])
    kinds = Table(title=f"per question kind @{head} tok: evidence / key-phrase recall")
    kinds.add_column("kind")
    for s in bench_longchat.SYSTEMS:
        kinds.add_column(bench_longchat.LABELS[s], justify="right")
    for kind in sorted(res["systems"]["soul"][head]["by_kind"]):
        kinds.add_row(kind, *(f"{_f(res['systems'][s][head]['by_kind'][kind]['evidence_recall'])} / "
                              f"{_f(res['systems'][s][head]['by_kind'][kind]['key_phrase_recall'])}"
                              for s in bench_longchat.SYSTEMS))
    out.print(kinds)
    details = {k: v for k, v in res["details"].items() if k != "per_chat"}
    out.print(json.dumps({"ratios": res["ratios"][head], **details}, indent=1))
    if args.json:
        write_file(args.json, json.dumps(res, indent=1), durable=False)
    if args.plot:
        bench_longchat.plot(res, args.plot)
    return 0


def cmd_beam(ctx: Ctx) -> int:
    args, out = ctx.args, ctx.out
    from soul_apps.bench import beam as bench_beam
    use_storage(args.storage)
    with working(out, "loading the embedder") as progress:
        res = bench_beam.run(args.data, args.budget, progress=progress, limit=args.limit,
                             chats=args.chats or None, baselines=not args.no_baselines, dense=not args.no_dense,
                             ablation=args.ablation, stores=args.stores)
    budgets = [str(b) for b in res["budgets"]]
    systems = [s for s in bench_beam.SYSTEMS if s in res["systems"]]
    table = Table(title="BEAM chats: evidence recall / key-phrase recall of the lines shown (same run)")
    table.add_column("system")
    for b in budgets:
        table.add_column(f"@{b} tok", justify="right")
    for s in systems:
        table.add_row(bench_beam.LABELS[s], *(f"{_f(res['systems'][s][b]['evidence_recall'])} / "
                                              f"{_f(res['systems'][s][b]['key_phrase_recall'])}" for b in budgets))
    out.print(table)
    head = str(res["headline_budget"])
    kinds = Table(title=f"per question kind @{head} tok: evidence / key-phrase recall")
    kinds.add_column("kind")
    for s in systems:
        kinds.add_column(bench_beam.LABELS[s], justify="right")
    for kind in sorted(res["systems"]["soul"][head]["by_kind"]):
        kinds.add_row(kind, *(f"{_f(res['systems'][s][head]['by_kind'].get(kind, {}).get('evidence_recall'))} / "
                              f"{_f(res['systems'][s][head]['by_kind'].get(kind, {}).get('key_phrase_recall'))}"
                              for s in systems))
    out.print(kinds)
    details = {k: v for k, v in res["details"].items() if k != "per_chat"}
    out.print(json.dumps({"ratios": {k: v for k, v in res["ratios"][head].items() if not k.startswith("by_kind")},
                          **details}, indent=1))
    if args.json:
        write_file(args.json, json.dumps(res, indent=1), durable=False)
    if args.plot:
        bench_beam.plot(res, args.plot)
    return 0


def cmd_latency(ctx: Ctx) -> int:
    args = ctx.args
    from soul_apps.bench import latency as bench_latency
    argv = ["--sizes", args.sizes, "--queries", str(args.queries), "--turns", str(args.turns),
            "--embedder", args.embedder]
    for flag, value in (("--json", args.json), ("--plot", args.plot), ("--locomo", args.locomo),
                        ("--cache-dir", args.cache_dir), ("--data-dir", args.data_dir), ("--storage", args.storage)):
        if value:
            argv += [flag, value]
    if args.million:
        argv.append("--million")
    if args.reuse_stores:
        argv.append("--reuse-stores")
    if args.fsyncs:
        argv.append("--fsyncs")
    return int(bench_latency.main(argv))


def cmd_embedders(ctx: Ctx) -> int:
    args, out = ctx.args, ctx.out
    from soul_apps.bench import embedders as bench_embedders
    with working(out, "embedders on LoCoMo"):
        res = bench_embedders.compare_embedders(args.data)
    out.print(bench_embedders.format_table(res))
    if args.json:
        write_file(args.json, json.dumps(res, indent=1, default=str), durable=False)
    return 0


def _levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError("every level must be >= 1")
    return levels


def _delays(text: str) -> list[float]:
    try:
        out = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated seconds, got {text!r}") from None
    if not out or min(out) < 0 or max(out) > 3600:
        raise argparse.ArgumentTypeError("every delay must be seconds in 0..3600")
    return out


WAIT_WRITES = {"false": [False], "true": [True], "both": [False, True]}


def cmd_scale(ctx: Ctx) -> int:
    args, out = ctx.args, ctx.out
    if args.plot:
        plotting.require()
    from soul_apps.bench import scale as bench_scale
    with working(out, "starting the runtime") as progress:
        res = bench_scale.run(souls=args.souls, active=args.active, turns=args.turns, embedder=args.embedder,
                              host_capacity=args.host_capacity, store_capacity=args.store_capacity,
                              reactivate=args.reactivate, local_channels=not args.ray_only, model=args.model,
                              model_delays=args.model_delay,
                              wait_writes=WAIT_WRITES[args.wait_writes] if args.wait_writes else None,
                              progress=progress, data_dir=args.data_dir, storage=args.storage,
                              count_fsyncs=args.fsyncs)
        if args.beside_offline and args.model == "stand-in":
            levels = [a for a in args.active if a >= 64] or list(args.active)
            off = bench_scale.run(souls=args.souls, active=levels, turns=1, embedder=args.embedder,
                                  host_capacity=args.host_capacity, store_capacity=args.store_capacity,
                                  local_channels=not args.ray_only, model="offline", wait_writes=[False],
                                  progress=progress)
            res["beside_offline"] = bench_scale.beside_offline(res, off)
    if args.json == "-":
        out.print_json(json.dumps(res))
    else:
        standin = res["model"] == "stand-in"
        if standin:
            model = (f"Anthropic adapter on the Messages-API stand-in (instant and "
                     f"{', '.join(f'{d:g} s' for d in res['model_delays_s'] if d) or 'no other delay'})")
        else:
            model = "offline model"
        table = Table(title=f"{res['souls']} souls, {res['embedder']} embedder, {model} "
                            f"({res['machine']['cpus']} cores, {res['hosts']} hosts × {res['host_threads']} threads)",
                      caption=bench_scale.LEGEND if standin else None)
        for i, col in enumerate(bench_scale.summary_columns(res)):
            table.add_column(col, justify="left" if standin and not i else "right", no_wrap=standin)
        for row in bench_scale.summary_rows(res):
            table.add_row(*row)
        out.print(table)
        if standin:
            cols, rows = bench_scale.kind_rows(res)
            kinds = Table(title="per kind of process (×N: its processes), at the peak of each phase: threads / RSS "
                                "MiB / TCP connections to the model stand-in")
            for i, col in enumerate(cols):
                kinds.add_column(col, justify="right" if i else "left", no_wrap=not i)
            for row in rows:
                kinds.add_row(*row)
            out.print(kinds)
            si = res.get("standin") or {}
            out.print(f"model stand-in (pid {si.get('pid')}, port {si.get('port')}): {si.get('calls')} calls "
                      f"{si.get('by_kind')}; stopped: {si.get('stopped')}", highlight=False)
        out.print(f"activations {res['activations']}, passivations {res['passivations']}, "
                  f"disk/soul {res['disk_bytes_per_soul'] / 1024:.1f} KiB (a passivated one: p50 "
                  f"{(res['disk_bytes_per_closed_soul_p50'] or 0) / 1024:.1f} KiB), Ray RSS "
                  f"{res['cluster_rss_bytes'] / 2**20:.0f} MiB in {len(res['processes'])} processes, "
                  f"max open fds {res['max_open_fds']}")
        if res.get("errors"):
            examples = {k: v for p in res["phases"] for k, v in (p.get("error_examples") or {}).items()}
            for k, n in sorted(res["errors"].items()):
                out.print(f"[red]{n} × {k}[/]: {examples.get(k, '')}", highlight=False)
        cpu = res.get("cpu_ms_per_turn")
        if cpu:
            parts = ", ".join(f"{k} {v:.2f}" for k, v in sorted(cpu.items(), key=lambda kv: -kv[1]) if k != "total")
            out.print(f"CPU per turn at {max(res['active'])} in flight: {cpu['total']:.2f} ms ({parts}); "
                      f"{res.get('turns_per_host_call')} turns per host call, store items per call "
                      f"{res.get('shard_items_per_call')}")
        if res.get("server_commits_per_turn") is not None:
            server_cpu = res.get("server_cpu_ms_per_turn")
            out.print(f"PostgreSQL: {res['server_commits_per_turn']} commits per turn, server CPU per turn "
                      f"{'not on this machine' if server_cpu is None else f'{server_cpu:.2f} ms'}")
        for row in (res.get("beside_offline") or {}).get("rows", []):
            out.print(f"{row['active']} in flight, wait_writes=False: runtime CPU per turn, instant stand-in "
                      f"{row['standin_cpu_ms_per_turn']['total']:.2f} ms against the offline model's "
                      f"{row['offline_cpu_ms_per_turn']['total']:.2f} ms ({row['cpu_ratio']}×); turns/s "
                      f"{row['standin_turns_per_s']:.1f} against {row['offline_turns_per_s']:.1f}", highlight=False)
        if res.get("reactivation_p50_ms") is not None:
            out.print(f"next turn of a random soul (1 in flight, {res['reactivated']} reactivated of "
                      f"{args.reactivate}): p50 {res['reactivation_p50_ms']:.0f} ms, "
                      f"p99 {res['reactivation_p99_ms']:.0f} ms")
    if args.json and args.json != "-":
        write_file(args.json, json.dumps(res, indent=1), durable=False)
    if args.plot:
        bench_scale.plot(res, args.plot)
    return 0


def cmd_async_model(ctx: Ctx) -> int:
    args, out = ctx.args, ctx.out
    from soul_apps.bench import async_model
    with working(out, "starting the runtime") as progress:
        res = async_model.run(souls=args.souls, in_flight=args.in_flight, delay_s=args.delay, rounds=args.rounds,
                              embedder=args.embedder, baseline=not args.no_baseline, progress=progress)
    table = Table(title=f"a user's model by import path, {res['in_flight']} turns in flight, {res['souls']} souls "
                        f"({res['machine']['cpus']} cores, shared)")
    for col in ("model", "phase", "turns/s", "steady turns/s", "p50 ms", "p99 ms", "calls waiting (max, per host)",
                "threads per host (max)", "CPU ms/turn"):
        table.add_column(col, justify="left" if col in ("model", "phase") else "right")
    for kind in ("async", "blocking"):
        for p in (res.get(kind) or {}).get("phases", []):
            steady = "—" if p.get("steady_turns_per_s") is None else f"{p['steady_turns_per_s']:.1f}"
            table.add_row(kind, p["phase"], f"{p['turns_per_s']:.1f}", steady, f"{p['p50_ms']:.0f}", f"{p['p99_ms']:.0f}",
                          ", ".join(str(v) for v in p["model_calls_waiting_max"].values()),
                          ", ".join(str(v) for v in p["host_threads_max"]), f"{p['cpu_ms_per_turn']:.2f}")
    out.print(table)
    a = res["async"]
    out.print(f"async model, ramped, steady: {a['phases'][3]['steady_turns_per_s']} turns/s = {a['of_latency_bound']}x "
              f"the latency bound ({a['latency_bound_turns_per_s']:g}/s), {a['of_bound']}x min(latency bound, "
              f"instant); in lockstep {a['of_latency_bound_lockstep_steady']}x steady, "
              f"{a['of_latency_bound_lockstep_whole_phase']}x over the whole phase", highlight=False)
    if "blocking" in res:
        b = res["blocking"]
        out.print(f"blocking model: {b['phases'][3]['turns_per_s']:.1f} turns/s against its thread bound "
                  f"{b['thread_bound_turns_per_s']:g}/s ({b['hosts']} hosts x {b['host_threads']} threads)",
                  highlight=False)
    if args.json:
        write_file(args.json, json.dumps(res, indent=1), durable=False)
    return 0


def cmd_claude(ctx: Ctx) -> int:
    args, out = ctx.args, ctx.out
    from soul_apps.bench import claude_path
    res: dict[str, Any] = {"turns": claude_path.bench_turns(args.turns, args.delay)}
    if args.data:
        res["observe"] = claude_path.bench_observe(args.data, limit=args.limit, window=args.window)
    table = Table(title=f"The Claude path against a local server ({args.delay:g} s per call)")
    table.add_column("turns")
    for col in ("reply p50 s", "reply p95 s", "calls before reply", "calls per turn", "tokens sent per turn"):
        table.add_column(col, justify="right")
    for key, label in (("no_wait", "wait_writes=False"), ("wait_writes", "wait_writes=True (baseline)")):
        t = res["turns"][key]
        table.add_row(label, f"{t['reply_p50_s']:.3f}", f"{t['reply_p95_s']:.3f}", str(t["calls_on_reply_path_max"]),
                      f"{t['calls_per_turn_mean']:.2f}", f"{t['tokens_sent_per_turn']:.0f}")
    out.print(table)
    if "observe" in res:
        ot = Table(title=f"observe, {res['observe']['conversations']} LoCoMo conversations")
        for col in ("windows", "messages", "calls", "calls per message", "tokens sent per message"):
            ot.add_column(col, justify="right")
        for key in sorted((k for k in res["observe"] if k.startswith("window_")), key=lambda k: -int(k[7:])):
            o = res["observe"][key]
            ot.add_row(f"{key[7:]} message(s)", str(o["messages"]), str(o["calls"]), f"{o['calls_per_message']:.3f}",
                       f"{o['tokens_sent_per_message']:.0f}")
        out.print(ot)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


def cmd_client(ctx: Ctx) -> int:
    args, out = ctx.args, ctx.out
    from soul_apps.bench import client as bench_client
    with working(out, "starting") as progress:
        res = bench_client.run(args.fresh, args.busy, variants=tuple(v for v in args.variants.split(",") if v),
                               inflight=args.inflight, progress=progress, checkpoint=args.json,
                               keep_logs=args.keep_logs)
    out.print(bench_client.table(res))
    for key, s in sorted(res["summary"].items()):
        for err in s["errors"]:
            out.print(f"[dim]{key}: {err}[/]")
    out.print(f"[dim]{res['note']} ({res['cpus']} CPUs)[/]")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


def cmd_cli(ctx: Ctx) -> int:
    args, out = ctx.args, ctx.out
    from soul_apps.bench import cli_latency
    with working(out, "starting") as progress:
        res = cli_latency.run(args.rounds, baseline=not args.no_baseline, progress=progress)
    table = Table(title="`soul` commands on the embedded default: wall seconds (client CPU seconds)")
    for col in ("", "n", "p50", "p90", "max"):
        table.add_column(col, justify="right" if col else "left")

    def row(label: str, wall: dict[str, float], cpu: dict[str, float] | None = None) -> None:
        table.add_row(label, str(wall["n"]), *(f"{wall[k]:.2f}" + (f" ({cpu[k]:.2f})" if cpu else "")
                                               for k in ("p50", "p90", "max")))
    if "per_call" in res:
        row("baseline: a private Ray per command", res["per_call"]["wall"], res["per_call"]["cpu"])
    if "first" in res:
        table.add_row("first command (starts the runtime)", "1", f"{res['first']['wall']:.2f} ({res['first']['cpu']:.2f})",
                      "", "")
    if "attached" in res:
        row("later commands (attach)", res["attached"]["wall"], res["attached"]["cpu"])
        for k, v in res["attached"]["per_command"].items():
            row(f"  {k}", v)
    out.print(table)
    floor = res.get("floor", {})
    out.print(f"floor: every later command ≤ {floor.get('max_s')} s and p50 ≤ {floor.get('p50_s')} s — "
              f"{'met' if floor.get('met') else 'NOT met'}; load average before / after: "
              f"{res['load_before'][0]:.1f} / {res['load_after'][0]:.1f} on {os.cpu_count()} cores")
    out.print(f"soul down: {res.get('down', {}).get('wall', float('nan')):.2f} s; processes left behind: "
              f"{res.get('left_behind', '?')}")
    for f in res["failures"]:
        out.print(f"[red]failed[/] {f}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 1 if res["failures"] or res.get("left_behind") else 0


def cmd_phrasing(ctx: Ctx) -> int:
    args, out = ctx.args, ctx.out
    from soul_apps.bench import phrasing
    from soul_runtime.embedding.choice import default_embedder
    cases = phrasing.load(args.corpus)
    with working(out, f"{len(cases)} conversations on the offline model"):
        res = phrasing.run(cases, default_embedder())
    table = Table(title=f"offline model: exactly the expected current facts and procedures ({args.corpus})")
    for col in ("", "passed", "cases", "accuracy"):
        table.add_column(col, justify="right" if col else "left")
    for axis in ("by_kind", "by_split"):
        for k, v in res[axis].items():
            table.add_row(f"{axis[3:]}: {k}", str(v["passed"]), str(v["cases"]), f"{v['passed'] / v['cases']:.0%}")
    table.add_row("all", str(res["passed"]), str(res["cases"]), f"{res['accuracy']:.0%}")
    out.print(table)
    for f in res["failures"]:
        procs = (f" procedures {f['got_procedures']} (expected {f['expected_procedures']})"
                 if "got_procedures" in f else "")
        out.print(f"[red]{f['id']}[/] ({f['split']}, {f['kind']}) {f['turns']} → {f['got']} (expected {f['expected']})"
                  f"{procs}", markup=True, highlight=False)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


def cmd_english(ctx: Ctx) -> int:
    args, out = ctx.args, ctx.out
    from soul_apps.bench import ordinary_english
    from soul_runtime.embedding.choice import make_embedder
    cases = ordinary_english.load(args.corpus)
    with working(out, f"{len(cases)} conversations on the offline model"):
        res = ordinary_english.run(cases, make_embedder(args.embedder))
    table = Table(title=f"offline model: the right current fact and no stale value ({args.corpus}, "
                        f"{args.embedder} embedder)")
    for col in ("", "passed", "cases", "accuracy", "keys only"):
        table.add_column(col, justify="right" if col else "left")
    base = res["baseline"]
    for axis in ("by_kind", "by_split"):
        for k, v in res[axis].items():
            b = base[axis][k]
            table.add_row(f"{axis[3:]}: {k}", str(v["passed"]), str(v["cases"]), f"{v['passed'] / v['cases']:.0%}",
                          f"{b['passed'] / b['cases']:.0%}")
    table.add_row("all", str(res["passed"]), str(res["cases"]), f"{res['accuracy']:.0%}", f"{base['accuracy']:.0%}")
    out.print(table)
    out.print("keys only: the same run with the store matching facts by exact and normalised keys, not by meaning",
              highlight=False)
    out.print(f"facts beyond the expected ones: {res['extra_facts']} (keys only: {base['extra_facts']})", highlight=False)
    for f in res["failures"]:
        want = "; ".join(f"{e['about'][0]} {e['attribute'][0]} = {e['value'][0]}".replace("  ", " ") for e in f["expected"])
        out.print(f"[red]{f['id']}[/] ({f['split']}) {f['turns']} → {f['got']} (expected {want or 'nothing'}"
                  f"{', stale ' + ', '.join(f['stale']) if f['stale'] else ''})", markup=True, highlight=False)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


def cmd_acts(ctx: Ctx) -> int:
    args, out = ctx.args, ctx.out
    from soul_apps.bench import dialogue_act, phrasing
    from soul_runtime.embedding.choice import default_embedder
    cases = phrasing.load(args.corpus)
    with working(out, "dialogue acts: rules vs classifiers over the embedder"):
        res = dialogue_act.run(cases, default_embedder())
    table = Table(title=f"dialogue act of a message, {res['turns']} corpus turns ({args.corpus})")
    table.add_column("method")
    for act in dialogue_act.ACTS:
        table.add_column(act, justify="right")
    table.add_column("all", justify="right")
    for name, v in res["by_method"].items():
        table.add_row(name, *[v["by_act"].get(a, "-") for a in dialogue_act.ACTS], f"{v['accuracy']:.1%}")
    out.print(table)
    out.print("cost: " + ", ".join(f"{k} {v}" for k, v in res["cost"].items()), highlight=False)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


def cmd_serve(ctx: Ctx) -> int:
    args, out = ctx.args, ctx.out
    from soul_apps.bench import serve as bench_serve
    try:
        delays = [float(x) for x in args.delays.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--delays must be comma-separated seconds, got {args.delays!r}") from None
    if args.turns < 1 or args.min_turns < 0 or not delays or min(delays) < 0:
        raise argparse.ArgumentTypeError("--turns must be >= 1, --min-turns >= 0 and --delays >= 0")
    with working(out, "running") as progress:
        res = bench_serve.run(levels=args.levels, turns=args.turns, delays=delays, embedder=args.embedder,
                              replicas=args.replicas, model=args.model, wait_writes=args.wait_writes == "true",
                              ingress=args.ingress, min_turns=args.min_turns, http_client=args.http_client,
                              inspector=args.inspector, progress=progress)
    out.print(bench_serve.table(res))
    out.print(json.dumps({k: v for k, v in res.items() if k != "rows"}, indent=1))
    if args.json:
        write_file(args.json, json.dumps(res, indent=1), durable=False)
    return 0


def cmd_fairness(ctx: Ctx) -> int:
    args, out = ctx.args, ctx.out
    from soul_apps.bench import fairness
    if args.plot:
        from soul_apps.bench.plotting import require
        require()
    if args.seconds <= 0 or args.a_in_flight < 1 or args.b_in_flight < 1:
        raise argparse.ArgumentTypeError("--seconds must be > 0, --a-in-flight and --b-in-flight >= 1")
    with working(out, "running") as progress:
        res = fairness.run(models=args.models, seconds=args.seconds, a_in_flight=args.a_in_flight,
                           b_in_flight=args.b_in_flight, delay_s=args.delay, model_cap=args.model_cap,
                           hosts=args.hosts, host_steps=args.host_steps, progress=progress)
    out.print(fairness.table(res))
    if args.json:
        write_file(args.json, json.dumps(res, indent=1), durable=False)
    if args.plot:
        fairness.plot(res, args.plot)
    return 0


def register(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    """Add ``soul bench locomo|longchat|beam|latency|embedders|scale|async-model|serve|fairness|claude|client|cli|phrasing|english|acts`` to the
    CLI's subcommands."""
    bench = sub.add_parser("bench", help="benchmarks: retrieval quality (LoCoMo), latency, embedders, many souls, the "
                                         "Claude path's cost, Ray Client connects, the CLI, the offline model on "
                                         "ordinary phrasing",
                           formatter_class=fmt)
    bsub = bench.add_subparsers(dest="bench", metavar="BENCH", required=True)
    lp = bsub.add_parser("locomo", help="answer and evidence recall of the memory lines shown vs budget, against raw-turn baselines")
    lp.add_argument("data", help="a LoCoMo JSON file or a directory of them (never copied into the repo)")
    lp.add_argument("--budget", type=_budgets, default=[500, 1000, 2000], help="comma-separated token budgets")
    lp.add_argument("--limit", type=int, default=None, help="only the first N conversations")
    lp.add_argument("--storage", type=check_storage, default="local", metavar="STORAGE", help=STORAGE_HELP)
    lp.add_argument("--ablation", action="store_true", help="also score the soul without its re-ranker, without "
                                                             "its digests and without both, on the same stores")
    lp.add_argument("--json", metavar="FILE")
    lp.add_argument("--plot", metavar="PNG")
    lp.add_argument("--readme", metavar="MARKDOWN",
                    help="rewrite the results block (between the bench:locomo markers) of this Markdown file, "
                         "e.g. docs/benchmarks.md")
    lp.set_defaults(bench_fn=cmd_locomo)
    lc = bsub.add_parser("longchat", help="evidence and key-phrase recall on long technical chats, against BM25 over "
                                          "raw messages and ~400-character chunks")
    lc.add_argument("data", help="a directory of chat files (see --make) or one chat file")
    lc.add_argument("--make", type=_seeds, metavar="SEEDS", help="first write chats of these seeds (like 0-4) into DATA")
    lc.add_argument("--tokens", type=_budgets, default=[150_000], help="with --make: sizes in tokens, comma-separated")
    lc.add_argument("--budget", type=_budgets, default=[500, 1000, 2000], help="comma-separated token budgets")
    lc.add_argument("--limit", type=int, default=None, help="only the first N chats")
    lc.add_argument("--ray", action="store_true",
                    help="every chat a soul of an embedded local runtime, observed through the public API, several "
                         "at once; reports the peak memory of every shard and host process")
    lc.add_argument("--callers", type=int, default=4, help="with --ray: chats observed at once")
    lc.add_argument("--no-questions", action="store_true", help="with --ray: ingest only (rate and memory)")
    lc.add_argument("--json", metavar="FILE")
    lc.add_argument("--plot", metavar="PNG")
    lc.set_defaults(bench_fn=cmd_longchat)
    bm = bsub.add_parser("beam", help="evidence and key-phrase recall on real long chats (BEAM), against BM25 over "
                                      "messages and ~400-character chunks and dense retrieval over the same chunks")
    bm.add_argument("data", help="a BEAM chat directory (chat.json + probing_questions/) or a directory of them, "
                                 "read in place (never copied into the repo)")
    bm.add_argument("--storage", type=check_storage, default="local", metavar="STORAGE", help=STORAGE_HELP)
    bm.add_argument("--budget", type=_budgets, default=[500, 1000, 2000], help="comma-separated token budgets")
    bm.add_argument("--chats", type=lambda t: [c for c in t.split(",") if c], default=[],
                    help="only these chat directories, comma-separated (like 3,4)")
    bm.add_argument("--limit", type=int, default=None, help="only the first N chats")
    bm.add_argument("--no-baselines", action="store_true", help="the soul only (the baselines embed every chunk)")
    bm.add_argument("--no-dense", action="store_true", help="the lexical baselines only (no chunk embedded)")
    bm.add_argument("--ablation", action="store_true", help="also score the soul without its re-ranker, without "
                                                             "its digests and without both, on the same stores")
    bm.add_argument("--stores", metavar="DIR", default=None,
                    help="keep each chat's soul in DIR/<chat>; a chat an earlier run observed there to the end is "
                         "not observed again (its ingest figures are that run's, marked so)")
    bm.add_argument("--json", metavar="FILE")
    bm.add_argument("--plot", metavar="PNG")
    bm.set_defaults(bench_fn=cmd_beam)
    tp = bsub.add_parser("latency", help="search / exact scan / write latency vs store size, query embedding")
    tp.add_argument("--sizes", default="1000,10000,100000")
    tp.add_argument("--queries", type=int, default=200)
    tp.add_argument("--json", metavar="FILE")
    tp.add_argument("--plot", metavar="PNG")
    tp.add_argument("--locomo", metavar="DIR", help="LoCoMo dir to draw real sentences from")
    tp.add_argument("--million", action="store_true", help="also try 1M episodes when the build fits")
    tp.add_argument("--turns", type=int, default=200, help="instant-model turns in all (split among the sizes)")
    tp.add_argument("--reuse-stores", action="store_true",
                    help="keep each size's bulk-loaded store in the cache dir and start from it next time")
    tp.add_argument("--embedder", choices=("default", "fast"), default="default")
    tp.add_argument("--cache-dir", metavar="DIR", help="embedding cache (default ~/.cache/soul-runtime/bench)")
    fsyncs.add_storage_args(tp)
    tp.set_defaults(bench_fn=cmd_latency)
    cp = bsub.add_parser("cli", help="wall time of `soul` commands on the local runtime vs a Ray per command")
    cp.add_argument("--rounds", type=int, default=3, help="rounds of turn/facts/recall/stats/trace (default 3)")
    cp.add_argument("--no-baseline", action="store_true", help="skip the per-call baseline (two commands, ~25 s)")
    cp.add_argument("--json", metavar="FILE")
    cp.set_defaults(bench_fn=cmd_cli)
    pp = bsub.add_parser("phrasing", help="offline model: current facts after ordinary phrasings, per kind")
    pp.add_argument("corpus", help="a JSONL phrasing corpus (tests/fixtures/phrasings.jsonl)")
    pp.add_argument("--json", metavar="FILE")
    pp.set_defaults(bench_fn=cmd_phrasing)
    gp = bsub.add_parser("english", help="offline model: the right current fact and no stale value after ordinary "
                                         "English, per kind (tests/fixtures/ordinary_english.jsonl)")
    gp.add_argument("corpus", help="a JSONL corpus of expected facts by meaning (tests/fixtures/ordinary_english.jsonl)")
    gp.add_argument("--embedder", choices=("default", "fast"), default="default")
    gp.add_argument("--json", metavar="FILE")
    gp.set_defaults(bench_fn=cmd_english)
    ap = bsub.add_parser("acts", help="dialogue act per message: the offline rules vs classifiers over the embedder")
    ap.add_argument("corpus", help="a JSONL phrasing corpus (tests/fixtures/phrasings.jsonl)")
    ap.add_argument("--json", metavar="FILE")
    ap.set_defaults(bench_fn=cmd_acts)
    sv = bsub.add_parser("serve", help="HTTP service turns/s and p50/p99 beside the Python async API (same run)")
    sv.add_argument("--levels", type=_levels, default=[1, 64, 300], help="concurrent clients (default 1,64,300)")
    sv.add_argument("--turns", type=int, default=3, help="counted turns per client (default 3)")
    sv.add_argument("--min-turns", type=int, default=600,
                    help="with an instant model (offline, or the stand-in at 0 s), at least this many counted turns "
                         "per level: more per client at low levels (default 600)")
    sv.add_argument("--ingress", choices=INGRESSES, default="auto",
                    help="as soul serve's --ingress (default auto)")
    sv.add_argument("--http-client", choices=HTTP_CLIENTS, default="httpx",
                    help="the HTTP callers' client, one connection each (default httpx); they run on the same cores "
                         "as the service")
    sv.add_argument("--model", choices=("stand-in", "offline"), default="stand-in",
                    help="stand-in: the Anthropic adapter against the Messages-API stand-in in a process of its own "
                         "(default); offline: the built-in model (--delays ignored)")
    sv.add_argument("--delays", default="0,1", help="stand-in model delays in seconds (default 0,1)")
    sv.add_argument("--wait-writes", choices=("true", "false"), default="true",
                    help="turns return after their writes (true, the default) or after the reply (false)")
    sv.add_argument("--embedder", choices=("default", "fast"), default="fast")
    sv.add_argument("--replicas", type=int, default=1)
    sv.add_argument("--inspector", action=argparse.BooleanOptionalAction, default=True,
                    help="the service serves the inspector's pages at /ui/, as soul serve does (default); "
                         "--no-inspector leaves the mount out")
    sv.add_argument("--json", metavar="FILE")
    sv.set_defaults(bench_fn=cmd_serve)
    fp = bsub.add_parser("fairness", help="tenant B's latency beside tenant A's flood on one node, against B alone "
                                          "(offline model and a slow model stand-in, same run)")
    fp.add_argument("--models", type=lambda v: [m for m in v.split(",") if m], default=["offline", "stand-in"],
                    help="comma-separated: offline, stand-in (default both)")
    fp.add_argument("--seconds", type=float, default=20.0, help="seconds per phase (6 phases a model; default 20)")
    fp.add_argument("--a-in-flight", type=int, default=200, help="tenant A's turns in flight (default 200)")
    fp.add_argument("--b-in-flight", type=int, default=4, help="tenant B's turns in flight (default 4)")
    fp.add_argument("--delay", type=float, default=1.0, help="the stand-in's seconds per model call (default 1)")
    fp.add_argument("--model-cap", type=int, default=32, help="model calls out at once on the node (default 32)")
    fp.add_argument("--hosts", type=int, default=2, help="soul hosts (default 2)")
    fp.add_argument("--host-steps", type=int, default=0, help="the runtime's host_steps (default 0: host_threads)")
    fp.add_argument("--json", metavar="FILE")
    fp.add_argument("--plot", metavar="PNG")
    fp.set_defaults(bench_fn=cmd_fairness)
    ep = bsub.add_parser("embedders", help="compare embedders on LoCoMo dense evidence recall and speed")
    ep.add_argument("data")
    ep.add_argument("--json", metavar="FILE")
    ep.set_defaults(bench_fn=cmd_embedders)
    sp = bsub.add_parser("scale", help="many souls on one node: turns/s, latency, overhead, RSS, fds, disk; "
                                       "the offline model or a slow model stand-in")
    sp.add_argument("--souls", type=int, default=1000, help="souls created, each given a first turn")
    sp.add_argument("--active", type=_levels, default=[64], help="turns in flight, comma-separated levels")
    sp.add_argument("--turns", type=int, default=2, help="further turns per soul at each level (with --model "
                                                         "stand-in: per turn in flight)")
    sp.add_argument("--embedder", choices=("default", "fast"), default="default")
    sp.add_argument("--host-capacity", type=int, default=None, help="active souls per host (LRU)")
    sp.add_argument("--store-capacity", type=int, default=None, help="open stores per shard (LRU)")
    sp.add_argument("--reactivate", type=int, default=0, metavar="K",
                    help="then the next turn of K souls picked at random, one at a time (reactivation latency)")
    sp.add_argument("--json", nargs="?", const="-", metavar="FILE", help="write JSON to FILE (stdout without FILE)")
    sp.add_argument("--ray-only", action="store_true",
                    help="every call through Ray, no local channels (local_channels=False)")
    sp.add_argument("--model", choices=("offline", "stand-in"), default="offline",
                    help="offline: the rule-based model (default); stand-in: the Anthropic adapter over HTTP to "
                         "the Messages-API stand-in in a process of its own, every level at 0 s (the instant "
                         "baseline) and at each --model-delay")
    sp.add_argument("--model-delay", type=_delays, default=[3.0], metavar="S[,S...]",
                    help="with --model stand-in: seconds per model call, comma-separated (default 3); a phase is "
                         "--turns turns per turn in flight (at least 8 in flight's worth)")
    sp.add_argument("--wait-writes", choices=("false", "true", "both"), default=None,
                    help="turns return after their writes (true), after the reply (false), or each level both "
                         "ways (default: false with --model stand-in, true with the offline model)")
    sp.add_argument("--beside-offline", action="store_true",
                    help="with --model stand-in: then the offline model on a fresh runtime at the levels >= 64 "
                         "(one turn per soul each, wait_writes=False), its runtime CPU per turn beside the instant "
                         "stand-in's")
    sp.add_argument("--plot", metavar="PNG", help="throughput and latency against turns in flight, a line per "
                                                  "model delay")
    fsyncs.add_storage_args(sp)
    sp.set_defaults(bench_fn=cmd_scale)
    rb = bsub.add_parser("rebuild", help="opening a soul on a node with no cache of it (PostgreSQL storage): "
                                         "its caches rebuilt from the server's rows, by size")
    rb.add_argument("data", help="a LoCoMo JSON file or directory: the episodes' texts (read in place)")
    rb.add_argument("--storage", type=check_storage, required=True, metavar="URL", help="postgresql://…")
    rb.add_argument("--episodes", type=_budgets, default=[1000, 10_000, 100_000], help="comma-separated sizes")
    rb.add_argument("--repeats", type=int, default=5)
    rb.add_argument("--json", metavar="FILE")
    rb.set_defaults(bench_fn=cmd_rebuild)
    am = bsub.add_parser("async-model", help="a user's own model named by import path at a remote model's "
                                             "latency: async (awaited on the hosts' loops) against blocking")
    am.add_argument("--souls", type=int, default=1000)
    am.add_argument("--in-flight", type=int, default=300, help="turns in flight (default 300)")
    am.add_argument("--delay", type=float, default=3.0, help="seconds a model call (default 3)")
    am.add_argument("--rounds", type=int, default=2, help="turns per soul at the delay (default 2)")
    am.add_argument("--embedder", choices=("default", "fast"), default="fast")
    am.add_argument("--no-baseline", action="store_true", help="skip the blocking model")
    am.add_argument("--json", metavar="FILE")
    am.set_defaults(bench_fn=cmd_async_model)
    cp = bsub.add_parser("claude", help="model calls, tokens and reply latency of the Claude path (local server)")
    cp.add_argument("--data", help="LoCoMo JSON file or directory: also measure observe (windows vs one message)")
    cp.add_argument("--limit", type=int, default=None, help="only the first N conversations")
    cp.add_argument("--turns", type=int, default=30)
    cp.add_argument("--delay", type=float, default=0.5, help="seconds the local server takes per call")
    cp.add_argument("--window", type=int, default=40, help="observe_window for the batched run")
    cp.add_argument("--json", metavar="FILE")
    cp.set_defaults(bench_fn=cmd_claude)
    clp = bsub.add_parser("client", help="Ray Client connect time and failures on fresh and busy heads")
    clp.add_argument("--fresh", type=int, default=20, help="fresh heads (one connect each) per variant")
    clp.add_argument("--busy", type=int, default=20, help="connects to one busy head per variant")
    clp.add_argument("--inflight", type=int, default=32, help="turns the busy head's other client keeps in flight")
    clp.add_argument("--variants", default="runtime,ray-default",
                    help="runtime (heads as `soul cluster up` starts them, connect() with its retries) and/or "
                         "ray-default (Ray's default head settings, a 10 s session-start wait, no retry)")
    clp.add_argument("--json", metavar="FILE")
    clp.add_argument("--keep-logs", metavar="DIR", help="copy the head's logs here after each failed connect")
    clp.set_defaults(bench_fn=cmd_client)
    bench.set_defaults(fn=lambda ctx: ctx.args.bench_fn(ctx))  # every handler of the CLI takes its Ctx
