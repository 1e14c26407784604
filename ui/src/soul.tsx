// One soul: its layers (episodic timeline, facts with history, procedures), its turns, recall, and erasure.
import type { ComponentChildren } from "preact";
import { useMemo, useState } from "preact/hooks";
import { api, ApiError, path, type Digest, type Episode, type Fact, type FactVersion, type Forgotten, type Procedure, type Stats,
  type Trace, type Write } from "./api";
import { ago, day, plural, when } from "./format";
import { RecallPlayground } from "./recall";
import { TurnDetail, Turns } from "./turns";
import { Badge, Confirm, ErrorBox, href, Show, Sources, Status, useLoad, type Loaded, type Tab } from "./ui";

/** How many of the newest turns the pages read to link memories to the turns that wrote them. */
export const TRACE_WINDOW = 300;

export interface KeyWrite {
  seq: number;
  at: number;
  write: Write;
}

/** The writes of the loaded turns by memory (``store:key``), oldest first. */
export function writesByKey(traces: Trace[]): Map<string, KeyWrite[]> {
  const m = new Map<string, KeyWrite[]>();
  for (const t of traces)
    for (const w of t.writes) {
      const k = `${w.store}:${w.key}`;
      const list = m.get(k) ?? [];
      list.push({ seq: t.seq, at: t.at, write: w });
      m.set(k, list);
    }
  return m;
}

function madeBy(writes: Map<string, KeyWrite[]>, store: string, key: string): number | undefined {
  return writes.get(`${store}:${key}`)?.find((w) => w.write.op === "ADD" || w.write.op === "UPDATE")?.seq;
}

interface Ctx {
  soul: string;
  traces: Loaded<{ traces: Trace[] }>;
  writes: Map<string, KeyWrite[]>;
  forget: (id: string, what: string, after: () => void) => void;
}

const LABELS: Record<Tab, string> = {
  timeline: "Timeline",
  digests: "Digests",
  facts: "Facts",
  procedures: "Procedures",
  turns: "Turns",
  recall: "Recall",
  erase: "Erase",
};

export function SoulPage({ soul, tab, seq }: { soul: string; tab: Tab | "turn"; seq?: number }) {
  const traces = useLoad(() => api<{ traces: Trace[] }>("souls/" + path([soul, "traces"], { last: TRACE_WINDOW })), [soul]);
  const writes = useMemo(() => writesByKey(traces.data?.traces ?? []), [traces.data]);
  const [asking, setAsking] = useState<{ id: string; what: string; after: () => void } | null>(null);
  const [status, setStatus] = useState("");
  const ctx: Ctx = {
    soul,
    traces,
    writes,
    forget: (id, what, after) => setAsking({ id, what, after }),
  };
  const current: Tab = tab === "turn" ? "turns" : tab;
  return (
    <main id="main">
      <nav aria-label="Breadcrumb" class="crumbs">
        <a href={href()}>Souls</a> / <span>{soul}</span>
      </nav>
      <h1>{soul}</h1>
      <nav aria-label="Soul" class="tabs">
        <ul>
          {(Object.keys(LABELS) as Tab[]).map((t) => (
            <li key={t}>
              <a href={href(soul, t)} aria-current={t === current ? "page" : undefined}>
                {LABELS[t]}
              </a>
            </li>
          ))}
        </ul>
      </nav>
      <Status text={status} />
      {tab === "timeline" && <Timeline ctx={ctx} />}
      {tab === "digests" && <Digests ctx={ctx} />}
      {tab === "facts" && <Facts ctx={ctx} />}
      {tab === "procedures" && <Procedures ctx={ctx} />}
      {tab === "turns" && <Turns soul={soul} />}
      {tab === "turn" && seq !== undefined && <TurnDetail soul={soul} seq={seq} />}
      {tab === "recall" && <RecallPlayground soul={soul} />}
      {tab === "erase" && <Erase soul={soul} />}
      {asking && (
        <Confirm
          title={`Forget ${asking.what}?`}
          action="Forget"
          onClose={() => setAsking(null)}
          onConfirm={async () => {
            const r = await api<Forgotten>("souls/" + path([soul, "forget"]), { method: "POST", body: { ids: [asking.id] } });
            setStatus(
              r.deleted.length
                ? `Forgot ${r.deleted.join(", ")} (turn ${r.seq}); turns that held it are redacted.`
                : `Nothing was forgotten: ${asking.id} is not stored (turn ${r.seq}).`,
            );
            asking.after();
            traces.reload();
          }}
        >
          <p>
            <code>{asking.id}</code> is deleted for good from this soul's memory, and the turns that recalled or wrote
            it are redacted. The deletion itself is recorded as a turn.
          </p>
        </Confirm>
      )}
    </main>
  );
}

// ---- episodic ---------------------------------------------------------------------------------------

function Timeline({ ctx }: { ctx: Ctx }) {
  const eps = useLoad(() => api<{ episodes: Episode[] }>("souls/" + path([ctx.soul, "episodes"])), [ctx.soul]);
  const [q, setQ] = useState("");
  const [session, setSession] = useState("");
  return (
    <section aria-labelledby="h-timeline">
      <h2 id="h-timeline">Episodic timeline</h2>
      <Show what={eps} label="episodes">
        {({ episodes }) => {
          const sessions = [...new Map(episodes.map((e) => [e.session, e.session_index])).entries()].sort(
            (a, b) => b[1] - a[1],
          );
          const needle = q.trim().toLowerCase();
          const shown = episodes
            .filter((e) => (!session || e.session === session) && (!needle || e.summary.toLowerCase().includes(needle)
              || e.id === needle))
            .sort((a, b) => b.at - a.at || b.id.localeCompare(a.id, undefined, { numeric: true }));
          return (
            <>
              <div class="toolbar">
                <label for="ep-q">Filter</label>
                <input id="ep-q" type="search" value={q} onInput={(e) => setQ((e.target as HTMLInputElement).value)} />
                <label for="ep-s">Session</label>
                <select id="ep-s" value={session} onChange={(e) => setSession((e.target as HTMLSelectElement).value)}>
                  <option value="">all ({sessions.length})</option>
                  {sessions.map(([s, i]) => (
                    <option key={s} value={s}>
                      #{i} {s}
                    </option>
                  ))}
                </select>
              </div>
              <p class="muted">
                {plural(shown.length, "episode")} shown of {episodes.length}, newest first. A promoted episode backs a
                fact and stops decaying; the others weigh less in recall as they age.
              </p>
              <ol class="timeline">
                {shown.map((e) => (
                  <li key={e.id} class="episode" data-id={e.id}>
                    <div class="meta">
                      <time dateTime={new Date(e.at * 1000).toISOString()}>{when(e.at)}</time>
                      <span>
                        session <strong>{e.session}</strong> (#{e.session_index})
                      </span>
                      <span>{e.actor}</span>
                      <code>{e.id}</code>
                    </div>
                    <p class="summary">{e.summary}</p>
                    <div class="meta">
                      {e.promoted ? <Badge kind="promoted">promoted · kept</Badge> : <Badge kind="decaying">decaying · {ago(e.at)}</Badge>}
                      {e.tags.map((t) => (
                        <Badge key={t} kind="tag">
                          {t}
                        </Badge>
                      ))}
                    </div>
                    <div class="provenance">
                      <span class="muted">From </span>
                      <Sources soul={ctx.soul} sources={e.sources} writtenBy={madeBy(ctx.writes, "episodic", e.id)} />
                    </div>
                    <button type="button" class="danger small" aria-label={`Forget episode ${e.id}`}
                      onClick={() => ctx.forget(e.id, `episode ${e.id}`, eps.reload)}>
                      Forget
                    </button>
                  </li>
                ))}
              </ol>
            </>
          );
        }}
      </Show>
    </section>
  );
}

// ---- consolidated ----------------------------------------------------------------------------------

function Digests({ ctx }: { ctx: Ctx }) {
  const got = useLoad(() => api<{ digests: Digest[] }>("souls/" + path([ctx.soul, "digests"])), [ctx.soul]);
  return (
    <section aria-labelledby="h-digests">
      <h2 id="h-digests">Digests</h2>
      <Show what={got} label="digests">
        {({ digests }) => (
          <>
            <p class="muted">
              {plural(digests.length, "digest")}: what each session was about, and timelines over spans of sessions,
              written from the episodes named under each (brought up to date as this page reads them; rewritten when
              those episodes change, deleted when they are forgotten).
            </p>
            <ol class="timeline">
              {digests.map((d) => (
                <li key={d.kind + d.sessions.join(",")} class="episode digest" data-kind={d.kind}>
                  <div class="meta">
                    <Badge kind="tag">{d.kind}</Badge>
                    <span>
                      {d.kind === "session" ? "session " : "sessions "}
                      <strong>{d.sessions.length > 1 ? `${d.sessions[0]} … ${d.sessions[d.sessions.length - 1]}` : d.sessions[0]}</strong>
                    </span>
                    <time dateTime={new Date(d.first_at * 1000).toISOString()}>{day(d.first_at)}</time>
                    {d.last_at !== d.first_at && <span>to {day(d.last_at)}</span>}
                  </div>
                  <p class="summary">{d.text}</p>
                  <div class="provenance">
                    <span class="muted">Written from {plural(d.episodes.length, "episode")}: </span>
                    <ul class="sources episodes-of">
                      {d.episodes.map((e) => (
                        <li key={e}>
                          <code>{e}</code>
                        </li>
                      ))}
                    </ul>
                  </div>
                  <div class="provenance">
                    <span class="muted">Quoting </span>
                    <Sources soul={ctx.soul} sources={d.sources} />
                  </div>
                </li>
              ))}
            </ol>
          </>
        )}
      </Show>
    </section>
  );
}

// ---- semantic --------------------------------------------------------------------------------------

function factName(f: { entity: string; attribute: string; display_entity?: string; display_attribute?: string }) {
  return `${f.display_entity || f.entity} · ${(f.display_attribute || f.attribute).replace(/_/g, " ")}`;
}

function splitKey(key: string): [string, string] {
  const i = key.lastIndexOf(":");
  return [key.slice(0, i), key.slice(i + 1)];
}

function History({ ctx, entity, attribute }: { ctx: Ctx; entity: string; attribute: string }) {
  const key = `${entity}:${attribute}`;
  const hist = useLoad(
    () => api<{ versions: FactVersion[] }>("souls/" + path([ctx.soul, "facts", entity, attribute, "history"])),
    [ctx.soul, key],
  );
  const writes = ctx.writes.get(`semantic:${key}`) ?? [];
  if (hist.error instanceof ApiError && hist.error.status === 404)
    return <p class="muted">This fact is no longer stored: it was forgotten.</p>;
  return (
    <Show what={hist} label="history">
      {({ versions }) => (
        <>
          <div class="scroll">
            <table class="history">
              <caption>Every value, oldest first</caption>
              <thead>
                <tr>
                  <th scope="col">Value</th>
                  <th scope="col">Established by</th>
                  <th scope="col">From</th>
                  <th scope="col">Until</th>
                  <th scope="col">Sources</th>
                </tr>
              </thead>
              <tbody>
                {versions.map((v, i) => {
                  const w = writes.find((x) => (x.write.op === "ADD" || x.write.op === "UPDATE")
                    && x.write.payload.value === v.value);
                  return (
                    <tr key={i} class={v.reason === "current" ? "current" : "past"}>
                      <th scope="row">{v.value || <span class="muted">(no value)</span>}</th>
                      <td>
                        {w ? (
                          <>
                            <Badge kind={String(w.write.payload.kind ?? w.write.op)}>{String(w.write.payload.kind ?? w.write.op)}</Badge>{" "}
                            <a href={href(ctx.soul, undefined, w.seq)}>turn {w.seq}</a>
                          </>
                        ) : (
                          <span class="muted">before the turns shown</span>
                        )}
                      </td>
                      <td>{when(v.valid_from)}</td>
                      <td>{v.reason === "current" ? <Badge kind="current">current</Badge> : <>{when(v.valid_to)} <Badge kind={v.reason}>{v.reason}</Badge></>}</td>
                      <td>
                        <Sources soul={ctx.soul} sources={v.sources} />
                      </td>
                    </tr>
                  );
                })}
              </tbody>
            </table>
          </div>
          {writes.length > 0 && (
            <>
              <h4>Writes to this fact</h4>
              <ol class="writes-of">
                {writes.map((w, i) => (
                  <li key={i}>
                    <a href={href(ctx.soul, undefined, w.seq)}>turn {w.seq}</a> ({day(w.at)}):{" "}
                    <Badge kind={w.write.op}>{w.write.op}</Badge> {w.write.payload.value !== undefined && <q>{String(w.write.payload.value)}</q>}{" "}
                    <span class="muted">{w.write.reason}</span>
                  </li>
                ))}
              </ol>
            </>
          )}
        </>
      )}
    </Show>
  );
}

function FactItem({ ctx, entity, attribute, title, children, onForget }: {
  ctx: Ctx; entity: string; attribute: string; title: ComponentChildren; children?: ComponentChildren;
  onForget?: () => void;
}) {
  const [open, setOpen] = useState(false);
  const key = `${entity}:${attribute}`;
  return (
    <li class="fact" data-key={key}>
      <details onToggle={(e) => setOpen((e.target as HTMLDetailsElement).open)}>
        <summary>{title}</summary>
        {children}
        {open && <History ctx={ctx} entity={entity} attribute={attribute} />}
        {onForget && (
          <button type="button" class="danger small" aria-label={`Forget fact ${key}`} onClick={onForget}>
            Forget
          </button>
        )}
      </details>
    </li>
  );
}

function Facts({ ctx }: { ctx: Ctx }) {
  const facts = useLoad(() => api<{ facts: Fact[] }>("souls/" + path([ctx.soul, "facts"])), [ctx.soul]);
  const stats = useLoad(() => api<Stats>("souls/" + path([ctx.soul, "stats"])), [ctx.soul]);
  const [q, setQ] = useState("");
  return (
    <section aria-labelledby="h-facts">
      <h2 id="h-facts">Facts</h2>
      <div class="toolbar">
        <label for="f-q">Filter</label>
        <input id="f-q" type="search" value={q} onInput={(e) => setQ((e.target as HTMLInputElement).value)} />
      </div>
      <Show what={facts} label="facts">
        {({ facts: list }) => {
          const needle = q.trim().toLowerCase();
          const current = list.filter((f) => !needle || `${factName(f)} ${f.value}`.toLowerCase().includes(needle));
          const active = new Set(list.map((f) => `${f.entity}:${f.attribute}`));
          const archived = [...ctx.writes.keys()]
            .filter((k) => k.startsWith("semantic:"))
            .map((k) => k.slice("semantic:".length))
            .filter((k) => !active.has(k) && (ctx.writes.get(`semantic:${k}`) ?? []).some((w) => w.write.op !== "NOOP"))
            .filter((k) => !needle || k.toLowerCase().includes(needle));
          return (
            <>
              <p class="muted">
                {plural(current.length, "current fact")}. Open one for every value it has had, how each was established
                (stated, confirmed, corrected, observed) and the turns that wrote it.
              </p>
              <ul class="facts">
                {current.map((f) => {
                  const last = (ctx.writes.get(`semantic:${f.entity}:${f.attribute}`) ?? []).filter((w) => w.write.op !== "NOOP").at(-1);
                  const kind = last ? String(last.write.payload.kind ?? "") : "";
                  return (
                    <FactItem key={`${f.entity}:${f.attribute}`} ctx={ctx} entity={f.entity} attribute={f.attribute}
                      title={
                        <>
                          <span class="fact-name">{factName(f)}</span> = <strong class="fact-value">{f.value}</strong>{" "}
                          {kind && <Badge kind={kind}>{kind}</Badge>}
                          {f.history.length > 0 && <Badge kind="versions">{f.history.length + 1} values</Badge>}
                        </>
                      }
                      onForget={() => ctx.forget(`${f.entity}:${f.attribute}`, `fact ${f.entity}:${f.attribute}`, facts.reload)}
                    >
                      <p class="muted">
                        since {when(f.valid_from)} · confidence {f.confidence.toFixed(2)} · key <code>{f.entity}:{f.attribute}</code>
                      </p>
                    </FactItem>
                  );
                })}
              </ul>
              <h3>Archived facts</h3>
              {stats.data && (
                <p class="muted">
                  {plural(stats.data.archived_facts, "archived fact")} in this soul (retracted, or whose entity was
                  forgotten).{" "}
                  {archived.length < stats.data.archived_facts && "Those written before the newest turns read here are not listed."}
                </p>
              )}
              <ul class="facts archived">
                {archived.map((k) => {
                  const [entity, attribute] = splitKey(k);
                  return (
                    <FactItem key={k} ctx={ctx} entity={entity} attribute={attribute}
                      title={<><span class="fact-name">{factName({ entity, attribute })}</span> <Badge kind="archived">archived</Badge></>} />
                  );
                })}
              </ul>
            </>
          );
        }}
      </Show>
    </section>
  );
}

// ---- procedural ------------------------------------------------------------------------------------

const ROLLOUT: Record<string, string> = {
  candidate: "rolling out: runs beside the active version until its clean runs are enough; rolled back if it fails",
  active: "in use: recalled for its task",
  retired: "replaced by a newer version, or rolled back",
};

function Procedures({ ctx }: { ctx: Ctx }) {
  const procs = useLoad(() => api<{ procedures: Procedure[] }>("souls/" + path([ctx.soul, "procedures"])), [ctx.soul]);
  return (
    <section aria-labelledby="h-procs">
      <h2 id="h-procs">Procedures</h2>
      <Show what={procs} label="procedures">
        {({ procedures }) => {
          const byTask = new Map<string, Procedure[]>();
          for (const p of procedures) byTask.set(p.task_class, [...(byTask.get(p.task_class) ?? []), p]);
          if (!byTask.size) return <p class="muted">No procedures yet: one is kept after three clean runs of a task, or when asked to save one.</p>;
          return (
            <>
              {[...byTask.entries()].map(([task, versions]) => (
                <article key={task} class="procedure">
                  <h3>{task}</h3>
                  <ol class="versions" reversed>
                    {versions.sort((a, b) => b.version - a.version).map((p) => {
                      const id = `${p.task_class}@v${p.version}`;
                      return (
                        <li key={id} data-id={id}>
                          <div class="meta">
                            <strong>v{p.version}</strong>
                            <Badge kind={p.status}>{p.status}</Badge>
                            <span class="muted">{ROLLOUT[p.status] ?? ""}</span>
                          </div>
                          <div class="meta">
                            <span>created {when(p.created_at)}</span>
                            <span>{plural(p.clean_runs, "clean run")}</span>
                            <span>{plural(p.failures, "failure")}</span>
                            <span>made by turn{madeBy(ctx.writes, "procedural", id) !== undefined ? " " : "s "}
                              {madeBy(ctx.writes, "procedural", id) !== undefined
                                ? <a href={href(ctx.soul, undefined, madeBy(ctx.writes, "procedural", id))}>{madeBy(ctx.writes, "procedural", id)}</a>
                                : <span class="muted">before those shown</span>}
                            </span>
                          </div>
                          <ol class="steps">
                            {p.steps.map((s, i) => (
                              <li key={i}>{s}</li>
                            ))}
                          </ol>
                          <div class="provenance">
                            <span class="muted">From </span>
                            <Sources soul={ctx.soul} sources={p.sources} />
                          </div>
                          <button type="button" class="danger small" aria-label={`Forget procedure ${id}`}
                            onClick={() => ctx.forget(id, `procedure ${id}`, procs.reload)}>
                            Forget
                          </button>
                        </li>
                      );
                    })}
                  </ol>
                </article>
              ))}
            </>
          );
        }}
      </Show>
    </section>
  );
}

// ---- erasure --------------------------------------------------------------------------------------

function Erase({ soul }: { soul: string }) {
  const stats = useLoad(() => api<Stats>("souls/" + path([soul, "stats"])), [soul]);
  const [asking, setAsking] = useState(false);
  const [done, setDone] = useState<Record<string, number> | null>(null);
  const [error, setError] = useState<Error | undefined>();
  return (
    <section aria-labelledby="h-erase">
      <h2 id="h-erase">Erase this soul</h2>
      {done ? (
        <div role="status">
          <p>
            <strong>{soul}</strong> is erased:{" "}
            {Object.entries(done).map(([k, v]) => `${k} ${v}`).join(", ")}.
          </p>
          <p>
            <a href={href()}>Back to the souls</a>
          </p>
        </div>
      ) : (
        <>
          <p>
            Every layer of <strong>{soul}</strong>'s memory, its turns' traces and its session buffer are deleted for
            good, and their files are unlinked.
          </p>
          {stats.data && (
            <p class="muted">
              It holds {plural(stats.data.episodes, "episode")}, {plural(stats.data.facts, "fact")} (
              {stats.data.archived_facts} archived) and {plural(stats.data.procedures, "procedure")}.
            </p>
          )}
          <button type="button" class="danger" onClick={() => setAsking(true)}>
            Erase {soul}…
          </button>
          {error && <ErrorBox error={error} />}
        </>
      )}
      {asking && (
        <Confirm title={`Erase ${soul}?`} action="Erase for good" typeToConfirm={soul} onClose={() => setAsking(false)}
          onConfirm={async () => {
            setError(undefined);
            const r = await api<{ erased: Record<string, number> }>("souls/" + path([soul]), { method: "DELETE" });
            setDone(r.erased);
          }}>
          <p>This cannot be undone.</p>
        </Confirm>
      )}
    </section>
  );
}
