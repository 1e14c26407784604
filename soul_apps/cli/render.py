"""Output of the ``soul`` command: rich tables for people, JSON for scripts (pure, no Ray)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from soul_runtime.clock import iso
from soul_runtime.records import Episode, Fact, FactVersion, MemoryWrite, Procedure, RecalledItem, TurnTrace, to_plain

OFFLINE_LABEL = "offline model (rule-based, deterministic, no network)"


def plain(obj: Any) -> Any:
    """Records, traces and results as JSON-ready data."""
    if isinstance(obj, TurnTrace):
        return obj.to_dict()
    if isinstance(obj, (list, tuple)):
        return [plain(x) for x in obj]
    if isinstance(obj, Mapping):
        return {str(k): plain(v) for k, v in obj.items()}
    return to_plain(obj)


def print_json(obj: Any, console: Console | None = None) -> None:
    text = json.dumps(plain(obj), indent=2, ensure_ascii=False, default=str)
    if console is None:
        print(text)
    else:
        console.print_json(text) if console.is_terminal else print(text, file=console.file)


def _t(ts: float) -> str:
    return iso(ts) if ts else "-"


def _src(sources: Iterable[str], n: int = 3) -> str:
    s = list(sources)
    return ", ".join(s[:n]) + (f" (+{len(s) - n})" if len(s) > n else "")


def _table(title: str, *cols: str) -> Table:
    t = Table(title=title, title_justify="left", show_lines=False, expand=False)
    for c in cols:
        t.add_column(c, overflow="fold")
    return t


def recalled_table(items: Sequence[RecalledItem], title: str = "recalled") -> Table:
    t = _table(title, "layer", "id", "score", "text", "sources")
    for it in items:
        t.add_row(it.store, escape(it.id), f"{it.score:.3f}", escape(it.text), escape(_src(it.sources)))
    return t


def writes_table(writes: Sequence[MemoryWrite], title: str = "written") -> Table:
    t = _table(title, "layer", "op", "key", "reason")
    for w in writes:
        style = "dim" if w.op.value == "NOOP" else "bold"
        t.add_row(w.store.value, f"[{style}]{w.op.value}[/]", escape(w.key), escape(w.reason))
    return t


def facts_table(facts: Sequence[Fact], title: str = "facts (semantic)") -> Table:
    t = _table(title, "entity", "attribute", "value", "conf", "since", "sources", "history")
    for f in facts:
        t.add_row(escape(f.display_entity or f.entity), escape(f.display_attribute or f.attribute),
                  escape(f.value) + ("" if f.status == "active" else f" [dim]({f.status})[/]"), f"{f.confidence:.2f}",
                  _t(f.valid_from), escape(_src(f.sources)), str(len(f.history)))
    return t


def history_table(versions: Sequence[FactVersion], title: str) -> Table:
    t = _table(title, "value", "from", "to", "reason", "sources")
    for v in versions:
        t.add_row(escape(v.value), _t(v.valid_from), _t(v.valid_to) if v.valid_to else "now", escape(v.reason),
                  escape(_src(v.sources, 6)))
    return t


def history_line(versions: Sequence[FactVersion]) -> str:
    return " → ".join(f"{v.value} [{_src(v.sources, 6)}]" for v in versions)


def procedures_table(procs: Sequence[Procedure], title: str = "procedures (procedural)") -> Table:
    t = _table(title, "task", "version", "status", "clean runs", "failures", "steps", "sources")
    for p in procs:
        colour = {"active": "green", "candidate": "yellow"}.get(p.status, "dim")
        t.add_row(escape(p.task_class), f"v{p.version}", f"[{colour}]{p.status}[/]", str(p.clean_runs),
                  str(p.failures), escape("\n".join(f"{i + 1}. {s}" for i, s in enumerate(p.steps))),
                  escape(_src(p.sources)))
    return t


def episodes_table(eps: Sequence[Episode], title: str = "episodes (episodic)") -> Table:
    t = _table(title, "id", "at", "session", "actor", "summary", "sources")
    for e in eps:
        t.add_row(escape(e.id), _t(e.at), escape(e.session), escape(e.actor),
                  escape(e.summary) + (" [green](promoted)[/]" if e.promoted else ""), escape(_src(e.sources)))
    return t


def traces_table(traces: Sequence[TurnTrace], title: str = "turn traces") -> Table:
    t = _table(title, "turn", "kind", "at", "query", "recalled", "persisted", "writes", "model", "ms")
    for tr in traces:
        writes = ", ".join(f"{w.store.value[:4]} {w.op.value}" for w in tr.writes) or "-"
        ms = sum(v for k, v in tr.timings_ms.items())
        t.add_row(escape(tr.turn_id), tr.kind, _t(tr.at), escape(tr.query[:80]), str(len(tr.recalled)),
                  ("yes: " if tr.persisted else "no: ") + escape(tr.persist_reason[:120]), escape(writes),
                  escape(tr.model), f"{ms:.1f}")
    return t


def usage_line(u: dict[str, Any]) -> str:
    """A trace's ``usage`` on one line: calls (reply / memory), input (uncached, cache read, cache write), output."""
    def part(d: Any) -> str:
        d = d if isinstance(d, dict) else {}
        return (f"{d.get('calls', 0)} call(s), in {d.get('input_tokens', 0)} + cache read "
                f"{d.get('cache_read_tokens', 0)} + cache write {d.get('cache_write_tokens', 0)}, "
                f"out {d.get('output_tokens', 0)}")
    line = part(u) + f" (reply {u.get('reply', {}).get('calls', 0)}, memory {u.get('memory', {}).get('calls', 0)})"
    models = u.get("by_model") or {}
    return line + "".join(f"; {m}: {part(v)}" for m, v in models.items())


def print_trace(console: Console, tr: TurnTrace) -> None:
    console.print(f"[bold]{escape(tr.turn_id)}[/] ({tr.kind}, {_t(tr.at)}, model {escape(tr.model)})")
    console.print(f"  query:   {escape(tr.query)}")
    if tr.reply:
        console.print(f"  reply:   {escape(tr.reply)}")
    console.print(f"  persist: {'yes' if tr.persisted else 'no'} — {escape(tr.persist_reason)}")
    if tr.categories:
        console.print(f"  categories: {', '.join(tr.categories)}")
    console.print(f"  tokens: {tr.tokens}")
    console.print(f"  model cost: {escape(usage_line(tr.usage))}" + ("  [memory work still running]" if tr.pending else ""))
    console.print("  timings ms: " + ", ".join(f"{k} {v:.1f}" for k, v in tr.timings_ms.items()))
    if tr.recalled:
        console.print(recalled_table(tr.recalled))
    if tr.writes:
        console.print(writes_table(tr.writes))


def kv_table(title: str, data: Mapping[str, Any]) -> Table:
    t = _table(title, "key", "value")
    for k, v in data.items():
        t.add_row(escape(str(k)), escape(json.dumps(v) if isinstance(v, (dict, list)) else str(v)))
    return t


def print_turn(console: Console, user: str, text: str, result: Any, *, assistant: str = "soul",
               show_empty: bool = True) -> None:
    """One turn: what the user said, the reply, what was recalled and what was written."""
    console.print(f"[bold cyan]{escape(user)}:[/] {escape(text)}")
    console.print(f"[bold magenta]{escape(assistant)}:[/] {escape(result.reply)}")
    if result.recalled:
        console.print(recalled_table(result.recalled, "  recalled"))
    elif show_empty:
        console.print("  [dim]recalled: nothing[/]")
    if result.writes:
        console.print(writes_table(result.writes, "  written"))
    elif show_empty:
        console.print("  [dim]written: nothing (not persisted)[/]")


def audit_tables(report: Any) -> list[Table]:
    rows = _table("write-policy audit: one row per exchange", "id", "speaker", "text", "bucket", "labels", "reason")
    colour = {"procedural": "green", "semantic": "blue", "episodic": "yellow", "nothing": "dim"}
    for r in report.rows:
        rows.add_row(escape(r.id), escape(r.speaker), escape(r.text[:100]), f"[{colour[r.primary]}]{r.primary}[/]",
                     ", ".join(r.labels) or "-", escape(r.reason))
    tally = _table("tally (primary bucket)", "bucket", "exchanges", "share of all", "share of stored", "labelled")
    for b, n in report.tally.items():
        stored = f"{report.stored_share[b]:.0%}" if b in report.stored_share else "-"
        tally.add_row(b, str(n), f"{report.share[b]:.0%}", stored, str(report.labels.get(b, "-")))
    tally.add_row("(observation)", "-", "-", "-", str(report.labels.get("observation", 0)))
    nothing = _table("stored nothing", "id", "text", "reason")
    for r in report.nothing:
        nothing.add_row(escape(r.id), escape(r.text[:100]), escape(r.reason))
    return [rows, tally, nothing]


def audit_verdict(report: Any) -> str:
    if not report.rows:
        return "no exchanges"
    dom = report.dominant
    if report.unbalanced:
        return (f"[bold red]UNBALANCED[/]: {report.share[dom]:.0%} of all exchanges land in {dom} "
                f"(threshold {report.threshold:.0%})")
    if not dom:
        return "balanced: nothing would be stored"
    return (f"[green]balanced[/]: the largest store bucket is {dom} with {report.share[dom]:.0%} of all exchanges "
            f"({report.stored_share[dom]:.0%} of stored; threshold {report.threshold:.0%})")
