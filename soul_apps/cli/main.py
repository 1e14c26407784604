"""The ``soul`` command line: a demo, a chat REPL, ingestion, memory inspection, audits, a local cluster.

Every command takes ``--address`` (default: the data dir's local runtime, see
:mod:`soul_apps.cluster.local_runtime`;
``ray://host:port`` for a cluster; env ``SOUL_ADDRESS``), ``--data-dir`` (env
``SOUL_DATA_DIR``, default ``~/.soul-runtime``), ``--namespace``, ``--model`` / ``--embedder``
(env ``SOUL_MODEL`` / ``SOUL_EMBEDDER``), ``--json`` and ``--debug``. Ray is only reached through :func:`actors.runtime.connect`.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from soul_apps.cli import progress, render
from soul_apps.cli.context import Ctx
from soul_apps.cluster import local_runtime as background
from soul_runtime import telemetry
from soul_runtime.clock import time_arg
from soul_runtime.errors import InvalidInput, NotFound, RuntimeUnavailable, SoulError
from soul_runtime.owner_only import write_file
from soul_runtime.text import check_id

EPILOG = """examples:
  soul demo                                   the four-day Maya/Atlas scenario on a local Ray
  soul cluster up --num-cpus 2                start a head; prints the ray:// address and auth env
  soul observe atlas chat.jsonl --address ray://127.0.0.1:10001
  soul recall atlas "postgres version" -k 5 --json
  soul history atlas tendril production_database
  soul audit-writes transcript.jsonl          where would each exchange be written? (no Ray)

Without --address the first call starts a local runtime for the data dir in the background
(~20-40 s on 2 cores, once; it listens on 127.0.0.1 only); later calls attach to it (~1 s); `soul down`
stops it (SOUL_LOCAL_RUNTIME=per-call: a private Ray for each call instead). Against a cluster
(`soul cluster up`, which listens on the node's address so other machines can join, and
--address ray://...) the actors stay up between calls and a call costs ~3-4 s."""

STORES = ("episodic", "semantic", "procedural")


# ---- commands ------------------------------------------------------------------------

def cmd_demo(ctx: Ctx) -> int:
    from soul_apps.cli import demo
    return demo.run_cli(ctx)


CHAT_HELP = """commands:
  /recall QUERY     what memory returns for QUERY (all layers)
  /facts [ENTITY]   the soul's facts
  /trace [N]        the last N turn traces (default 5)
  /help             this help
  /quit             leave (also Ctrl-D)
anything else is a turn."""


def cmd_chat(ctx: Ctx) -> int:
    sid = check_id(ctx.args.soul, what="soul id")
    user = ctx.args.user
    tty = sys.stdin.isatty()
    with ctx.runtime() as rt:
        soul = rt.soul(sid)
        if not ctx.json:
            ctx.out.print(f"chatting with soul '{sid}' as {user} (data in {ctx.data_dir}); /help for commands")
        while True:
            try:
                line = input(f"{user}> " if tty else "").strip()
            except EOFError:
                break
            if not line:
                continue
            try:
                if not _chat_line(ctx, soul, user, line):
                    break
            except SoulError as e:
                ctx.err.print(f"[red]error:[/] {e}")
    return 0


def _chat_line(ctx: Ctx, soul: Any, user: str, line: str) -> bool:
    if not line.startswith("/"):
        res = soul.turn(line, user=user)
        if ctx.json:
            render.print_json({"text": line, **render.plain(res)})
        else:
            render.print_turn(ctx.out, user, line, res, assistant=soul.id)
        return True
    cmd, _, arg = line[1:].partition(" ")
    arg = arg.strip()
    if cmd in ("quit", "exit", "q"):
        return False
    if cmd == "help":
        ctx.out.print(CHAT_HELP)
    elif cmd == "recall":
        if not arg:
            raise InvalidInput("usage: /recall QUERY")
        items = soul.recall(arg, k=10)
        ctx.emit(items, render.recalled_table(items, f"recall {arg!r}") if items else "nothing recalled")
    elif cmd == "facts":
        facts = soul.facts(arg or None)
        ctx.emit(facts, render.facts_table(facts) if facts else "no facts yet")
    elif cmd == "trace":
        n = int(arg) if arg.isdigit() and int(arg) > 0 else 5
        traces = soul.traces(last=n)
        ctx.emit(traces, render.traces_table(traces))
    else:
        ctx.err.print(f"unknown command /{cmd}; /help lists them")
    return True


def cmd_observe(ctx: Ctx) -> int:
    from soul_runtime.loop.ingest import load
    sid = check_id(ctx.args.soul, what="soul id")
    convs = load(ctx.args.file, ctx.args.format)  # a bad file fails here, before Ray starts
    batches = [b for c in convs for b in c.batches]
    n_msgs = sum(len(b.messages) for b in batches)
    writes: dict[str, int] = {}
    persisted = 0
    t0 = time.perf_counter()
    with ctx.runtime() as rt:
        soul = rt.soul(sid)
        t1 = time.perf_counter()
        with progress.working(ctx.err, f"observing {n_msgs} messages") as work:
            for i, b in enumerate(batches):
                work(f"observe {b.label}", i, len(batches))
                res = soul.observe(b.messages, at=b.at, session=b.session)
                for w in res.writes:
                    if w.op.value != "NOOP":
                        writes[w.store.value] = writes.get(w.store.value, 0) + 1
                persisted += bool(res.writes)
            work("observed", len(batches), len(batches))
    seconds = time.perf_counter() - t1
    data = {"soul": sid, "file": str(ctx.args.file), "conversations": len(convs), "batches": len(batches),
            "messages": n_msgs, "batches_with_writes": persisted, "writes": writes,
            "qa": sum(len(c.qa) for c in convs), "observe_seconds": round(seconds, 2),
            "total_seconds": round(time.perf_counter() - t0, 2), "data_dir": ctx.data_dir}
    ctx.emit(data, render.kv_table(f"observed into '{sid}'", data))
    return 0


def cmd_recall(ctx: Ctx) -> int:
    sid = ctx.require_soul(ctx.args.soul)
    with ctx.runtime() as rt:
        items = rt.soul(sid).recall(ctx.args.query, k=ctx.args.k, at=time_arg(ctx.args.at), stores=ctx.args.store)
    ctx.emit(items, render.recalled_table(items, f"recall {ctx.args.query!r} (k={ctx.args.k})") if items
             else "nothing recalled")
    return 0


def cmd_facts(ctx: Ctx) -> int:
    sid = ctx.require_soul(ctx.args.soul)
    with ctx.runtime() as rt:
        facts = rt.soul(sid).facts(ctx.args.entity)
    ctx.emit(facts, render.facts_table(facts) if facts else "no facts")
    return 0


def cmd_history(ctx: Ctx) -> int:
    sid = ctx.require_soul(ctx.args.soul)
    with ctx.runtime() as rt:
        versions = rt.soul(sid).fact_history(ctx.args.entity, ctx.args.attribute)
    ctx.emit(versions, render.history_table(versions, f"history of {ctx.args.entity}:{ctx.args.attribute}"),
             render.history_line(versions))
    return 0


def cmd_procedures(ctx: Ctx) -> int:
    sid = ctx.require_soul(ctx.args.soul)
    with ctx.runtime() as rt:
        procs = rt.soul(sid).procedures(ctx.args.task)
    ctx.emit(procs, render.procedures_table(procs) if procs else "no procedures")
    return 0


def cmd_episodes(ctx: Ctx) -> int:
    a = ctx.args
    sid = ctx.require_soul(a.soul)
    with ctx.runtime() as rt:
        eps = rt.soul(sid).episodes(since=time_arg(a.since), until=time_arg(a.until), session=a.session,
                                    sessions_ago=a.sessions_ago)
    shown = eps[-a.limit:] if a.limit else eps
    ctx.emit(shown, render.episodes_table(shown, f"episodes of '{sid}' ({len(shown)} of {len(eps)})"))
    return 0


def cmd_trace(ctx: Ctx) -> int:
    sid = ctx.require_soul(ctx.args.soul)
    with ctx.runtime() as rt:
        soul = rt.soul(sid)
        got: Any = soul.trace(ctx.args.turn_id) if ctx.args.turn_id else soul.traces(last=ctx.args.last)
    if ctx.json:
        render.print_json(got)
    elif isinstance(got, list):
        ctx.out.print(render.traces_table(got, f"last {len(got)} turn traces of '{sid}'"))
    else:
        render.print_trace(ctx.out, got)
    return 0


def cmd_stats(ctx: Ctx) -> int:
    sid = ctx.require_soul(ctx.args.soul) if ctx.args.soul else None
    with ctx.runtime() as rt:
        data = rt.soul(sid).stats() if sid else {**rt.stats(), "soul_ids": rt.souls()}
    ctx.emit(data, render.kv_table(f"soul '{sid}'" if sid else "runtime", data))
    return 0


def cmd_turn(ctx: Ctx) -> int:
    sid = check_id(ctx.args.soul, what="soul id")
    with ctx.runtime() as rt:
        res = rt.soul(sid).turn(ctx.args.text, user=ctx.args.user, at=time_arg(ctx.args.at))
    if ctx.json:
        render.print_json(res)
    else:
        render.print_turn(ctx.out, ctx.args.user or "user", ctx.args.text, res, assistant=sid)
    return 0


def cmd_audit(ctx: Ctx) -> int:
    from soul_runtime.loop.audit import audit, load_transcript, save_fixture
    transcript = load_transcript(ctx.args.transcript)
    report = audit(transcript, ctx.args.threshold)
    if ctx.args.save_fixture:
        save_fixture(ctx.args.save_fixture, report.rows, transcript)
    if ctx.json:
        render.print_json(report.to_dict())
    else:
        for t in render.audit_tables(report):
            ctx.out.print(t)
        ctx.out.print(render.audit_verdict(report))
        if ctx.args.save_fixture:
            ctx.out.print(f"fixture written to {ctx.args.save_fixture}: review each 'expected' by hand")
    return 1 if ctx.args.strict and report.unbalanced else 0


def cmd_export(ctx: Ctx) -> int:
    sid = ctx.require_soul(ctx.args.soul)
    with ctx.runtime() as rt, progress.working(ctx.err, f"Exporting soul '{sid}'"):
        blob = rt.soul(sid).export()
    write_file(ctx.args.file, blob)  # owner-only (0600): an export is the soul's whole memory
    digest = hashlib.sha256(blob).hexdigest()
    data = {"soul": sid, "file": str(ctx.args.file), "bytes": len(blob), "sha256": digest}
    ctx.emit(data, f"exported soul '{sid}' to {ctx.args.file} ({len(blob)} bytes, sha256 {digest[:16]}…)")
    return 0


def cmd_import(ctx: Ctx) -> int:
    from soul_runtime.memory.export import unpack_export
    sid = check_id(ctx.args.soul, what="soul id")
    blob = Path(ctx.args.file).read_bytes()
    unpack_export(blob)  # a bad file fails here, before Ray starts
    if ctx.local_data() and (Path(ctx.data_dir) / "souls" / sid).exists():
        raise InvalidInput(f"soul '{sid}' already exists in {ctx.data_dir}; import needs a new soul id (--soul)")
    with ctx.runtime() as rt, progress.working(ctx.err, f"Importing {len(blob)} bytes as soul '{sid}'"):
        rt.soul(sid).import_(blob)
    data = {"soul": sid, "file": str(ctx.args.file), "bytes": len(blob), "data_dir": ctx.data_dir}
    ctx.emit(data, f"imported {ctx.args.file} as soul '{sid}' in {ctx.data_dir}")
    return 0


def cmd_forget(ctx: Ctx) -> int:
    sid = ctx.require_soul(ctx.args.soul)
    a = ctx.args
    if (a.id or a.query) and a.store:
        raise InvalidInput("--store erases whole layers; --id/--query delete single memories: use one or the other")
    with ctx.runtime() as rt:
        if a.id or a.query:
            res = rt.soul(sid).forget_where(ids=a.id, query=a.query)
            deleted = [w.key for w in res.writes]
            data: dict[str, Any] = {"soul": sid, "deleted": deleted, "turn_id": res.turn_id}
            text = f"deleted {len(deleted)} memories of '{sid}' ({', '.join(deleted) or 'none matched'}); " \
                   f"recorded as {res.turn_id}"
        else:
            data = {"soul": sid, **rt.soul(sid).forget(stores=a.store)}
            text = f"erased '{sid}': " + ", ".join(f"{k} {v}" for k, v in data.items() if k != "soul")
    ctx.emit(data, text)
    return 0


def cmd_down(ctx: Ctx) -> int:
    """Stop the data dir's local runtime (the actors flush first)."""
    return _stop_head(ctx, str(background.state_dir(ctx.data_dir)))


def _stop_head(ctx: Ctx, state_dir: str) -> int:
    from soul_apps.cluster import local_cluster as lc
    info = lc.head_info(state_dir)
    if info is not None and lc.head_alive(state_dir) and Path(state_dir) == background.state_dir(ctx.data_dir):
        with contextlib.suppress(SoulError), progress.working(ctx.err, "Flushing the soul actors"):
            if not ctx.args.debug:
                os.environ.setdefault("RAY_LOGGER_LEVEL", "error")
            os.environ.update(lc.client_env(info))  # before Ray is imported: it reads the auth mode then
            from actors import raycalls
            from actors.runtime import connect as connect_ray
            try:
                with connect_ray(info.gcs_address, data_dir=ctx.data_dir, namespace=ctx.namespace) as rt:
                    rt.shutdown_actors()
            finally:
                raycalls.shutdown()  # disconnect before the head goes, or its dying words reach this terminal
    with progress.working(ctx.err, "Stopping the Ray head"):
        stopped = lc.stop_head_locked(state_dir)
    ctx.emit({"stopped": stopped, "state_dir": state_dir},
             f"stopped the Ray head of {state_dir}" if stopped else f"no Ray head recorded in {state_dir}")
    return 0


def cmd_cluster(ctx: Ctx) -> int:
    from soul_apps.cluster import local_cluster as lc
    a = ctx.args
    state_dir = os.path.abspath(os.path.expanduser(a.state_dir or background.state_dir(ctx.data_dir)))
    if a.action == "up" and lc.head_alive(state_dir):
        pass  # already up (perhaps the local runtime of the data dir): show it
    elif a.action == "up":
        t0 = time.perf_counter()
        with progress.working(ctx.err, "Starting a Ray head" + progress.estimate("ray-head")):
            try:
                lc.start_head(port=a.port, client_port=a.client_port, num_cpus=a.num_cpus, state_dir=state_dir,
                              node_ip=a.node_ip)
                progress.remember("ray-head", time.perf_counter() - t0)
            except (RuntimeError, ValueError) as e:
                raise RuntimeUnavailable(str(e).splitlines()[0] + (" (--debug for ray's output)" if not a.debug
                                                                   else "\n" + str(e))) from None
    elif a.action == "down":
        return _stop_head(ctx, state_dir)
    status = lc.head_status(state_dir)
    if status is None:
        ctx.emit({"running": False, "state_dir": state_dir}, f"no Ray head recorded in {state_dir}")
        return 1 if a.action == "status" else 0
    status["state_dir"] = state_dir
    env = " ".join(f"{k}={v}" for k, v in status["client_env"].items())
    exports = "\n".join(f"  export {k}={v}" for k, v in status["client_env"].items())
    ctx.emit(status, status["text"], f"\nto use it from a shell:\n{exports}\n  export SOUL_ADDRESS="
             f"{status['client_address']}\n(or prefix one command: {env} soul facts SOUL --address "
             f"{status['client_address']})\nstop it with: soul cluster down --state-dir {state_dir}")
    return 0


# ---- parser ---------------------------------------------------------------------------

def _common(p: argparse.ArgumentParser, top: bool) -> None:
    d: Callable[[Any], Any] = (lambda v: v) if top else (lambda v: argparse.SUPPRESS)
    g = p.add_argument_group("common options")
    g.add_argument("--address", default=d(None), metavar="ADDR",
                   help="Ray to use: ray://host:port (a cluster, see `soul cluster up`), 'local' or unset for the "
                        "data dir's local runtime, started in the background by the first call (env SOUL_ADDRESS)")
    g.add_argument("--data-dir", default=d(None), metavar="DIR",
                   help="where souls' memory lives (env SOUL_DATA_DIR, default ~/.soul-runtime)")
    g.add_argument("--namespace", default=d(None), metavar="NS",
                   help="Ray namespace (env SOUL_NAMESPACE, default 'souls'); one namespace serves one data dir")
    g.add_argument("--model", dest="soul_model", default=d(None), metavar="NAME",
                   help="the language model of the runtime a command starts: auto (the default: Anthropic when "
                        "ANTHROPIC_API_KEY is set, else offline), offline, anthropic, openai (an OpenAI-compatible "
                        "server) or your own as package.module:attr (env SOUL_MODEL; see docs/models.md)")
    g.add_argument("--embedder", dest="soul_embedder", default=d(None), metavar="NAME",
                   help="the embedder: default (MiniLM), fast, or your own as package.module:attr (env SOUL_EMBEDDER); "
                        "a data dir keeps the embedder it was first served with")
    g.add_argument("--json", action="store_true", default=d(False), help="machine-readable JSON output")
    g.add_argument("--debug", action="store_true", default=d(False), help="show tracebacks and Ray's logs")


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(prog="soul", formatter_class=fmt, epilog=EPILOG,
                                description="soul-runtime: long-term memory (episodic, semantic, procedural) "
                                            "for LLM agents, hosted on Ray.")
    _common(p, True)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, fn: Callable[[Ctx], int], help: str, *positional: str, description: str = ""
            ) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help, description=description or help, formatter_class=fmt)
        _common(sp, False)
        sp.set_defaults(fn=fn)
        for arg in positional:
            sp.add_argument(arg)
        return sp

    sp = add("demo", cmd_demo, "play the 4-day Maya/Atlas scenario and show every recall and write",
             description="Play the scripted scenario (soul 'atlas') in a fresh data dir: for every turn the user text, the "
             "reply, what was recalled and what was written; then each layer's contents and the history of "
             "tendril:production_database. Uses the offline rule-based model unless ANTHROPIC_API_KEY is set.")
    sp.add_argument("--days", type=int, default=None, help="play only the first N days (1-4)")
    sp = add("chat", cmd_chat, "talk to a soul (REPL; reads stdin, so it can be piped)", "soul",
             description=CHAT_HELP)
    sp.add_argument("--user", default="user", help="who is talking (default: user)")
    sp = add("observe", cmd_observe, "ingest a conversation file (JSONL messages or LoCoMo JSON)", "soul", "file")
    sp.add_argument("--format", choices=("auto", "jsonl", "locomo"), default="auto")
    sp = add("recall", cmd_recall, "what memory returns for a query", "soul", "query")
    sp.add_argument("-k", type=int, default=10, help="how many items (default 10)")
    sp.add_argument("--at", help="recall as of this time (ISO-8601 or epoch seconds)")
    sp.add_argument("--store", action="append", choices=STORES, help="only these layers (repeatable)")
    sp = add("facts", cmd_facts, "a soul's current facts (semantic layer)", "soul")
    sp.add_argument("entity", nargs="?")
    sp = add("history", cmd_history, "every value a fact has had, with sources", "soul", "entity")
    sp.add_argument("attribute", help="e.g. production_database")
    sp = add("procedures", cmd_procedures, "a soul's procedures with versions and status", "soul")
    sp.add_argument("task", nargs="?", help="one task class, e.g. 'draft postmortem'")
    sp = add("episodes", cmd_episodes, "a soul's episodes (episodic layer)", "soul")
    sp.add_argument("--since", help="ISO-8601 or epoch seconds")
    sp.add_argument("--until", help="ISO-8601 or epoch seconds")
    sp.add_argument("--session")
    sp.add_argument("--sessions-ago", type=int, help="0 = the latest session, 1 = the one before ...")
    sp.add_argument("--limit", type=int, default=0, help="show only the last N")
    sp = add("trace", cmd_trace, "turn traces: recalled items, persistence decision, writes, timings", "soul")
    sp.add_argument("turn_id", nargs="?", help="one turn, e.g. atlas/3 (default: the last --last turns)")
    sp.add_argument("--last", type=int, default=10)
    sp = add("stats", cmd_stats, "runtime stats, or one soul's counts per layer")
    sp.add_argument("soul", nargs="?")
    sp = add("turn", cmd_turn, "one turn (handy for scripts)", "soul", "text")
    sp.add_argument("--user")
    sp.add_argument("--at", help="ISO-8601 or epoch seconds (default: now)")
    sp = add("audit-writes", cmd_audit, "classify a transcript's exchanges by the layer they would be written to "
             "(no Ray)", description="Run every exchange through the persistence decision, extraction, guards and write "
             "policies (offline model) and tally episodic / semantic / procedural / nothing. UNBALANCED when one "
             "store takes more than --threshold of all exchanges.")
    sp.add_argument("transcript", help="JSONL of {speaker, text, id, at?} (or a JSON list of them)")
    sp.add_argument("--save-fixture", metavar="FILE", help="write the classification as a reviewable fixture")
    sp.add_argument("--threshold", type=float, default=0.6)
    sp.add_argument("--strict", action="store_true", help="exit 1 when the policy is unbalanced")
    add("export", cmd_export, "write a soul's memory to FILE (msgpack export bytes)", "soul", "file")
    sp = add("import", cmd_import, "load an export FILE into a new soul (--soul)", "file")
    sp.add_argument("--soul", required=True, help="the new soul id (an export does not carry one)")
    sp = add("forget", cmd_forget, "erase a soul's memory for good, or single memories (--id / --query)", "soul",
             description="Without options: erase every layer, the traces and the buffer of SOUL; its files are "
             "unlinked, so nothing of it stays on disk, and the soul starts again empty. --store erases only those "
             "layers (with the traces and buffer). --id / --query delete single memories (an id such as ep-3 or "
             "tendril:production_database, or every memory containing a phrase) and redact the traces that held "
             "them.")
    sp.add_argument("--store", action="append", choices=STORES, help="only these layers (repeatable)")
    sp.add_argument("--id", action="append", help="a memory id to delete (repeatable)")
    sp.add_argument("--query", help="delete every memory whose text contains this phrase (case-insensitive)")
    add("down", cmd_down, "stop the data dir's local runtime (started by the first command without --address)")
    sp = add("cluster", cmd_cluster, "start / stop / inspect a Ray head for --address ray://... (listens on the "
             "node's address unless --node-ip 127.0.0.1)")
    sp.add_argument("action", choices=("up", "down", "status"))
    sp.add_argument("--port", type=int, default=0, help="GCS port (default: a free one)")
    sp.add_argument("--client-port", type=int, default=0, help="Ray Client port (default: a free one)")
    sp.add_argument("--num-cpus", type=int)
    sp.add_argument("--node-ip", metavar="IP",
                    help="address the head binds and advertises (default: this node's address as Ray picks it, "
                         "reachable from other machines, which is what a cluster is for; 127.0.0.1 keeps the "
                         "head to this machine)")
    sp.add_argument("--state-dir", help="where the head is recorded (default DATA_DIR/cluster, where the local "
                                        "runtime of the data dir is recorded too)")
    from soul_apps.cli.service import register as register_service
    register_service(add)
    from soul_apps.cli.storage import register as register_storage
    register_storage(add)
    from soul_apps.cli.bench import register
    register(sub, fmt)
    return p


def _exit_code(e: BaseException) -> int:
    if isinstance(e, (NotFound, InvalidInput)):
        return 2
    if isinstance(e, RuntimeUnavailable):
        return 3
    return 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    err = Console(stderr=True, highlight=False)
    try:
        ctx = Ctx(args)
        code = int(args.fn(ctx))
        if ctx.quick_exit and argv is None:  # skip Ray's driver shutdown (~0.3 s): the actors are detached and
            telemetry.flush()  # the GCS notices the driver is gone by itself; the exit handlers are skipped too
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        return code
    except KeyboardInterrupt:
        if args.debug:
            raise
        err.print("interrupted")
        return 130
    except (SoulError, OSError) as e:
        if args.debug:
            raise
        msg = str(e).strip().splitlines()[0] if str(e).strip() else e.__class__.__name__
        err.print(f"soul: error: {msg}", markup=False, highlight=False, soft_wrap=True)
        return _exit_code(e)
    except Exception as e:  # an unexpected failure: one line, the traceback with --debug
        if args.debug:
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        err.print(f"soul: error: {e.__class__.__name__}: {first} (run with --debug for the traceback)",
                  markup=False, highlight=False, soft_wrap=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
