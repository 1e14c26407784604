// A soul's turns: the list of traces, and one turn with what it recalled, decided and wrote.
import { Fragment } from "preact";
import { useState } from "preact/hooks";
import { api, path, type Trace, type Usage, type Write } from "./api";
import { score, when } from "./format";
import { Badge, href, Show, Sources, useLoad } from "./ui";

const STEP = 50;

function ops(writes: Write[]): string {
  const n = new Map<string, number>();
  for (const w of writes) n.set(w.op, (n.get(w.op) ?? 0) + 1);
  return [...n.entries()].map(([op, c]) => `${op} ${c}`).join(" · ") || "none";
}

export function Turns({ soul }: { soul: string }) {
  const [last, setLast] = useState(STEP);
  const traces = useLoad(() => api<{ traces: Trace[] }>("souls/" + path([soul, "traces"], { last })), [soul, last]);
  return (
    <section aria-labelledby="h-turns">
      <h2 id="h-turns">Turns</h2>
      <Show what={traces} label="turns">
        {({ traces: list }) => (
          <>
            <p class="muted">The newest {list.length} turns, newest first. Open one for what it recalled and wrote.</p>
            <div class="scroll">
              <table class="turns">
                <thead>
                  <tr>
                    <th scope="col">Turn</th>
                    <th scope="col">When</th>
                    <th scope="col">Kind</th>
                    <th scope="col">Message</th>
                    <th scope="col">Recalled</th>
                    <th scope="col">Writes</th>
                    <th scope="col">Model</th>
                  </tr>
                </thead>
                <tbody>
                  {[...list].reverse().map((t) => (
                    <tr key={t.seq}>
                      <th scope="row">
                        <a href={href(soul, undefined, t.seq)}>{t.seq}</a>
                      </th>
                      <td>{when(t.at)}</td>
                      <td>
                        <Badge kind={t.kind}>{t.kind}</Badge>
                      </td>
                      <td class="clip">{t.query}</td>
                      <td>{t.recalled.length}</td>
                      <td>{t.pending ? "pending" : ops(t.writes)}</td>
                      <td class="clip">{t.model}</td>
                    </tr>
                  ))}
                </tbody>
              </table>
            </div>
            {list.length >= last && last < 10_000 && (
              <button type="button" onClick={() => setLast(Math.min(10_000, last + STEP))}>
                Load {STEP} older turns
              </button>
            )}
          </>
        )}
      </Show>
    </section>
  );
}

function payloadText(w: Write): string {
  const p = w.payload;
  const main = p.value ?? p.summary ?? (Array.isArray(p.steps) ? (p.steps as string[]).join("; ") : undefined);
  const extra = [p.kind && `kind ${p.kind}`, p.previous !== undefined && `was ${JSON.stringify(p.previous)}`]
    .filter(Boolean)
    .join(", ");
  return [main !== undefined ? String(main) : "", extra && `(${extra})`].filter(Boolean).join(" ");
}

function UsageTable({ usage }: { usage: Usage }) {
  const rows: [string, Usage | undefined][] = [
    ["reply", usage.reply],
    ["memory decision", usage.memory],
    ...Object.entries(usage.by_model ?? {}).map(([m, u]) => [`model ${m}`, u] as [string, Usage]),
    ["all", usage],
  ];
  return (
    <div class="scroll">
      <table class="usage">
        <caption>Model calls and tokens</caption>
        <thead>
          <tr>
            <th scope="col">Part</th>
            <th scope="col">Calls</th>
            <th scope="col">Input</th>
            <th scope="col">Output</th>
            <th scope="col">Cache read</th>
            <th scope="col">Cache write</th>
          </tr>
        </thead>
        <tbody>
          {rows.filter(([, u]) => u).map(([name, u]) => (
            <tr key={name}>
              <th scope="row">{name}</th>
              <td>{u!.calls}</td>
              <td>{u!.input_tokens}</td>
              <td>{u!.output_tokens}</td>
              <td>{u!.cache_read_tokens}</td>
              <td>{u!.cache_write_tokens}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

export function TurnDetail({ soul, seq }: { soul: string; seq: number }) {
  const t = useLoad(() => api<Trace>("souls/" + path([soul, "traces", seq])), [soul, seq]);
  return (
    <section aria-labelledby="h-turn" class="turn">
      <nav class="pager" aria-label="Turns">
        {seq > 1 && <a href={href(soul, undefined, seq - 1)}>← turn {seq - 1}</a>}
        <a href={href(soul, "turns")}>all turns</a>
        <a href={href(soul, undefined, seq + 1)}>turn {seq + 1} →</a>
      </nav>
      <h2 id="h-turn">Turn {seq}</h2>
      <Show what={t} label={`turn ${seq}`}>
        {(tr) => (
          <>
            <dl class="facts-list">
              <dt>When</dt>
              <dd>{when(tr.at)}</dd>
              <dt>Kind</dt>
              <dd>
                <Badge kind={tr.kind}>{tr.kind}</Badge>
              </dd>
              <dt>Model</dt>
              <dd>
                <code>{tr.model || "—"}</code>
              </dd>
              <dt>Turn id</dt>
              <dd>
                <code>{tr.turn_id}</code> · request <code>{tr.request_id}</code>
              </dd>
            </dl>
            <h3>Message</h3>
            <blockquote class="message">{tr.query}</blockquote>
            {tr.reply && (
              <>
                <h3>Reply</h3>
                <blockquote class="reply">{tr.reply}</blockquote>
              </>
            )}
            <h3>Recalled ({tr.recalled.length})</h3>
            {tr.recalled.length ? (
              <div class="scroll">
                <table class="recalled">
                  <caption>What memory passed to the model, in the order it saw it</caption>
                  <thead>
                    <tr>
                      <th scope="col">Layer</th>
                      <th scope="col">Memory</th>
                      <th scope="col">Score</th>
                      <th scope="col">Text</th>
                      <th scope="col">Sources</th>
                    </tr>
                  </thead>
                  <tbody>
                    {tr.recalled.map((r, i) => (
                      <tr key={i}>
                        <td>
                          <Badge kind={r.store}>{r.store}</Badge>
                        </td>
                        <th scope="row">
                          <code>{r.id}</code>
                        </th>
                        <td class="num">{score(r.score)}</td>
                        <td>{r.text}</td>
                        <td>
                          <Sources soul={soul} sources={r.sources} />
                        </td>
                      </tr>
                    ))}
                  </tbody>
                </table>
              </div>
            ) : (
              <p class="muted">Nothing was recalled.</p>
            )}
            <h3>Decision</h3>
            <p>
              {tr.pending ? (
                <Badge kind="pending">writes pending</Badge>
              ) : tr.persisted ? (
                <Badge kind="persisted">kept</Badge>
              ) : (
                <Badge kind="skipped">nothing kept</Badge>
              )}{" "}
              {tr.persist_reason}
              {tr.categories.length > 0 && <span class="muted"> · categories: {tr.categories.join(", ")}</span>}
            </p>
            <h3>Writes ({tr.writes.length})</h3>
            {tr.writes.length ? (
              <div class="scroll">
                <table class="writes">
                  <thead>
                    <tr>
                      <th scope="col">Layer</th>
                      <th scope="col">Op</th>
                      <th scope="col">Memory</th>
                      <th scope="col">Reason</th>
                      <th scope="col">What</th>
                    </tr>
                  </thead>
                  <tbody>
                    {tr.writes.map((w, i) => (
                      <tr key={i} data-op={w.op} data-key={w.key}>
                        <td>
                          <Badge kind={w.store}>{w.store}</Badge>
                        </td>
                        <td>
                          <Badge kind={w.op}>{w.op}</Badge>
                        </td>
                        <th scope="row">
                          <code>{w.key}</code>
                        </th>
                        <td>{w.reason}</td>
                        <td>{payloadText(w)}</td>
                      </tr>
                    ))}
                  </tbody>
                </table>
              </div>
            ) : (
              <p class="muted">No writes.</p>
            )}
            {tr.mended.length > 0 && (
              <>
                <h3>Mended writes</h3>
                <ul>
                  {tr.mended.map((m, i) => (
                    <li key={i}>{m}</li>
                  ))}
                </ul>
              </>
            )}
            <h3>Tokens</h3>
            {Object.keys(tr.tokens).length ? (
              <dl class="facts-list tokens">
                {Object.entries(tr.tokens).map(([k, v]) => (
                  <Fragment key={k}>
                    <dt>{k.replace(/_/g, " ")}</dt>
                    <dd>{v}</dd>
                  </Fragment>
                ))}
              </dl>
            ) : (
              <p class="muted">No context was assembled (no reply in this kind of turn).</p>
            )}
            <UsageTable usage={tr.usage} />
            <details>
              <summary>Timings (ms)</summary>
              <dl class="facts-list">
                {Object.entries(tr.timings_ms).map(([k, v]) => (
                  <Fragment key={k}>
                    <dt>{k.replace(/_/g, " ")}</dt>
                    <dd>{v.toFixed(1)}</dd>
                  </Fragment>
                ))}
              </dl>
            </details>
          </>
        )}
      </Show>
    </section>
  );
}
