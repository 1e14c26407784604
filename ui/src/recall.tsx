// The recall playground: a query, the ranked items with their scores, and which lines fit a token budget.
import { useState } from "preact/hooks";
import { api, path, type Packed } from "./api";
import { score } from "./format";
import { Badge, ErrorBox, Sources } from "./ui";

const STORES = ["episodic", "semantic", "procedural"];

export function RecallPlayground({ soul }: { soul: string }) {
  const [q, setQ] = useState("");
  const [budget, setBudget] = useState(1000);
  const [k, setK] = useState(64);
  const [stores, setStores] = useState<string[]>(STORES);
  const [result, setResult] = useState<Packed | null>(null);
  const [error, setError] = useState<Error | undefined>();
  const [busy, setBusy] = useState(false);
  const run = async (e: Event) => {
    e.preventDefault();
    if (!q.trim()) return;
    setBusy(true);
    setError(undefined);
    try {
      setResult(await api<Packed>("souls/" + path([soul, "context"], { q, budget, k, store: stores })));
    } catch (err) {
      setError(err as Error);
    } finally {
      setBusy(false);
    }
  };
  const num = (set: (n: number) => void) => (e: Event) => set(Number((e.target as HTMLInputElement).value));
  return (
    <section aria-labelledby="h-recall">
      <h2 id="h-recall">Recall playground</h2>
      <p class="muted">
        What memory returns for a query, best first, and which of its lines a turn asking it would show the model
        within the token budget.
      </p>
      <form class="recall-form" onSubmit={run}>
        <div class="field grow">
          <label for="r-q">Query</label>
          <input id="r-q" type="search" required value={q} onInput={(e) => setQ((e.target as HTMLInputElement).value)} />
        </div>
        <div class="field">
          <label for="r-budget">Token budget</label>
          <input id="r-budget" type="number" min={1} max={100000} value={budget} onInput={num(setBudget)} />
        </div>
        <div class="field">
          <label for="r-k">Items (k)</label>
          <input id="r-k" type="number" min={1} max={1000} value={k} onInput={num(setK)} />
        </div>
        <fieldset>
          <legend>Layers</legend>
          {STORES.map((s) => (
            <label key={s} class="check">
              <input
                type="checkbox"
                checked={stores.includes(s)}
                onChange={(e) =>
                  setStores((e.target as HTMLInputElement).checked ? [...stores, s] : stores.filter((x) => x !== s))
                }
              />{" "}
              {s}
            </label>
          ))}
        </fieldset>
        <button type="submit" disabled={busy || !stores.length}>
          {busy ? "Recalling…" : "Recall"}
        </button>
      </form>
      {error && <ErrorBox error={error} />}
      {result && (
        <>
          <p role="status">
            {result.items.filter((i) => i.shown).length} of {result.items.length} items shown to the model:{" "}
            {result.used_tokens} of {result.budget} tokens.
          </p>
          <div class="scroll">
            <table class="packed">
              <thead>
                <tr>
                  <th scope="col">Rank</th>
                  <th scope="col">Layer</th>
                  <th scope="col">Memory</th>
                  <th scope="col">Score</th>
                  <th scope="col">In context</th>
                  <th scope="col">Line the model reads</th>
                  <th scope="col">Sources</th>
                </tr>
              </thead>
              <tbody>
                {result.items.map((it) => (
                  <tr key={`${it.store}:${it.id}`} class={it.shown ? "shown" : "cut"}>
                    <td class="num">{it.rank}</td>
                    <td>
                      <Badge kind={it.store}>{it.store}</Badge>
                    </td>
                    <th scope="row">
                      <code>{it.id}</code>
                    </th>
                    <td class="num">{score(it.score)}</td>
                    <td>{it.shown ? `${it.tokens} tokens` : <span class="muted">over budget</span>}</td>
                    <td>{it.line ?? <span class="muted">{it.text}</span>}</td>
                    <td>
                      <Sources soul={soul} sources={it.sources} />
                    </td>
                  </tr>
                ))}
              </tbody>
            </table>
          </div>
        </>
      )}
    </section>
  );
}
