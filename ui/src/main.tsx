// The memory inspector: a key per browser session, then the tenant's souls and what each remembers.
import { render } from "preact";
import { useEffect, useMemo, useState } from "preact/hooks";
import { api, ApiError, getKey, path, setKey, whenUnauthorized, type Stats, type Trace } from "./api";
import { ago, when } from "./format";
import { SoulPage } from "./soul";
import { ErrorBox, href, Show, useLoad, type Tab } from "./ui";
import "./style.css";

type Route = { page: "souls" } | { page: "soul"; soul: string; tab: Tab | "turn"; seq?: number };
const TABS: Tab[] = ["timeline", "digests", "facts", "procedures", "turns", "recall", "erase"];

function route(hash: string): Route {
  const parts = hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
  if (parts[0] !== "souls" || !parts[1]) return { page: "souls" };
  const soul = parts[1];
  if (parts[2] === "turns" && parts[3] && /^\d+$/.test(parts[3])) return { page: "soul", soul, tab: "turn", seq: Number(parts[3]) };
  const tab = (TABS as string[]).includes(parts[2] ?? "") ? (parts[2] as Tab) : "timeline";
  return { page: "soul", soul, tab };
}

function useRoute(): Route {
  const [hash, setHash] = useState(location.hash);
  useEffect(() => {
    const on = () => setHash(location.hash);
    addEventListener("hashchange", on);
    return () => removeEventListener("hashchange", on);
  }, []);
  return useMemo(() => route(hash), [hash]);
}

function Login({ note, onKey }: { note?: string; onKey: (k: string) => void }) {
  const [key, setValue] = useState("");
  const [error, setError] = useState<Error | undefined>();
  const [busy, setBusy] = useState(false);
  const submit = async (e: Event) => {
    e.preventDefault();
    const k = key.trim();
    if (!k) return;
    setBusy(true);
    try {
      await api("souls", { key: k }); // checked before it is kept
      setError(undefined);
      onKey(k);
    } catch (err) {
      setError(err instanceof ApiError && err.status === 401 ? new Error("this key is not valid") : (err as Error));
    } finally {
      setBusy(false);
    }
  };
  return (
    <main id="main" class="login">
      <h1>Memory inspector</h1>
      <p>
        Enter your tenant's API key. It is kept for this browser tab's session only and sent only to this service's
        <code>/v1</code> API.
      </p>
      {note && <p class="muted">{note}</p>}
      <form onSubmit={submit}>
        <label for="key">API key</label>
        <div class="row">
          <input
            id="key"
            name="key"
            type="password"
            autocomplete="off"
            spellcheck={false}
            required
            value={key}
            onInput={(e) => setValue((e.target as HTMLInputElement).value)}
          />
          <button type="submit" disabled={busy}>
            {busy ? "Checking…" : "Open"}
          </button>
        </div>
      </form>
      {error && <ErrorBox error={error} />}
    </main>
  );
}

const PAGE = 25;

function SoulRow({ soul }: { soul: string }) {
  const info = useLoad(
    () =>
      Promise.all([
        api<Stats>("souls/" + path([soul, "stats"])),
        api<{ traces: Trace[] }>("souls/" + path([soul, "traces"], { last: 1 })),
      ]),
    [soul],
  );
  const [stats, traces] = info.data ?? [undefined, undefined];
  const last = traces?.traces.at(-1);
  const cell = (x: string | number | undefined) => (info.error ? "?" : x === undefined ? "…" : x);
  return (
    <tr>
      <th scope="row">
        <a href={href(soul)}>{soul}</a>
      </th>
      <td data-label="Episodes">
        {cell(stats?.episodes)}
        {stats && stats.promoted_episodes > 0 && <span class="muted"> ({stats.promoted_episodes} promoted)</span>}
      </td>
      <td data-label="Facts">
        {cell(stats?.facts)}
        {stats && stats.archived_facts > 0 && <span class="muted"> (+{stats.archived_facts} archived)</span>}
      </td>
      <td data-label="Procedures">
        {cell(stats?.procedures)}
        {stats && stats.candidate_procedures > 0 && <span class="muted"> (+{stats.candidate_procedures} candidate)</span>}
      </td>
      <td data-label="Turns">{cell(traces ? (last?.seq ?? 0) : undefined)}</td>
      <td data-label="Last activity">
        {info.error ? "?" : last ? <time title={when(last.at)}>{ago(last.at)}</time> : traces ? "—" : "…"}
      </td>
    </tr>
  );
}

const LIMITED = [
  ["souls", "Souls", "souls"],
  ["stored_bytes", "Stored bytes", "stored_bytes"],
  ["tokens_today", "Model tokens today (UTC)", "tokens_per_day"],
  ["turns", "Turns", ""],
  ["tokens", "Model tokens in all", ""],
  ["throttled", "Turns refused over a limit", ""],
  ["queued_s", "Seconds waited in the fair queues", ""],
] as const;

/** `GET /v1/usage`: the counts above, and the limits in force. */
type Usage = Record<(typeof LIMITED)[number][0], number> & { limits: Record<string, number> };

function UsagePanel() {
  const usage = useLoad(() => api<Usage>("usage"), []);
  return (
    <section aria-labelledby="usage-h" class="usage">
      <h2 id="usage-h">Usage</h2>
      <Show what={usage} label="usage">
        {(u) => (
          <>
            <table class="usage">
              <tbody>
                {LIMITED.map(([k, label, limit]) => (
                  <tr key={k}>
                    <th scope="row">{label}</th>
                    <td data-label={label}>
                      {String(u[k])}
                      {limit && u.limits[limit] !== undefined && <span class="muted"> of {u.limits[limit]}</span>}
                    </td>
                  </tr>
                ))}
              </tbody>
            </table>
            <p class="muted">
              Limits:{" "}
              {Object.keys(u.limits).length
                ? Object.entries(u.limits)
                    .map(([k, v]) => `${k.replaceAll("_", " ")} ${v}`)
                    .join(", ")
                : "none"}
            </p>
          </>
        )}
      </Show>
    </section>
  );
}

function Souls() {
  const list = useLoad(() => api<{ souls: string[] }>("souls"), []);
  const [q, setQ] = useState("");
  const [shown, setShown] = useState(PAGE);
  return (
    <main id="main">
      <h1>Souls</h1>
      <UsagePanel />
      <div class="toolbar">
        <label for="search">Search souls</label>
        <input
          id="search"
          type="search"
          placeholder="soul id contains…"
          value={q}
          onInput={(e) => {
            setQ((e.target as HTMLInputElement).value);
            setShown(PAGE);
          }}
        />
      </div>
      <Show what={list} label="souls">
        {({ souls }) => {
          const found = souls.filter((s) => s.toLowerCase().includes(q.trim().toLowerCase())).sort();
          return (
            <>
              <p class="muted" role="status">
                {found.length} of {souls.length} souls
              </p>
              {found.length > 0 && (
                <div class="scroll">
                  <table class="souls">
                    <thead>
                      <tr>
                        <th scope="col">Soul</th>
                        <th scope="col">Episodes</th>
                        <th scope="col">Facts</th>
                        <th scope="col">Procedures</th>
                        <th scope="col">Turns</th>
                        <th scope="col">Last activity</th>
                      </tr>
                    </thead>
                    <tbody>
                      {found.slice(0, shown).map((s) => (
                        <SoulRow key={s} soul={s} />
                      ))}
                    </tbody>
                  </table>
                </div>
              )}
              {found.length > shown && (
                <button type="button" onClick={() => setShown(shown + PAGE)}>
                  Show {Math.min(PAGE, found.length - shown)} more
                </button>
              )}
            </>
          );
        }}
      </Show>
    </main>
  );
}

function App() {
  const [key, setK] = useState(getKey());
  const [note, setNote] = useState<string | undefined>();
  const r = useRoute();
  useEffect(() => {
    whenUnauthorized(() => {
      setKey(null);
      setK(null);
      setNote("The key was refused (revoked?): enter a valid one.");
    });
  }, []);
  const signOut = () => {
    setKey(null);
    setK(null);
    setNote(undefined);
    location.hash = "#/";
  };
  return (
    <>
      <a class="skip" href="#main">
        Skip to content
      </a>
      <header class="top">
        <a href={href()} class="brand">
          soul-runtime <span>memory inspector</span>
        </a>
        {key && (
          <button type="button" class="link" onClick={signOut}>
            Forget key
          </button>
        )}
      </header>
      {!key ? (
        <Login
          note={note}
          onKey={(k) => {
            setKey(k);
            setK(k);
          }}
        />
      ) : r.page === "souls" ? (
        <Souls />
      ) : (
        <SoulPage key={r.soul} soul={r.soul} tab={r.tab} seq={r.seq} />
      )}
    </>
  );
}

render(<App />, document.getElementById("app")!);
