// Small pieces every page uses: loading state, errors, provenance links, the confirmation dialog.
import type { ComponentChildren } from "preact";
import { useCallback, useEffect, useRef, useState } from "preact/hooks";
import { ApiError } from "./api";
import { source } from "./format";

export type Tab = "timeline" | "digests" | "facts" | "procedures" | "turns" | "recall" | "erase";

export function href(soul?: string, tab?: Tab, seq?: number): string {
  if (soul === undefined) return "#/";
  const base = `#/souls/${encodeURIComponent(soul)}`;
  if (seq !== undefined) return `${base}/turns/${seq}`;
  return tab ? `${base}/${tab}` : base;
}

export interface Loaded<T> {
  data?: T;
  error?: Error;
  loading: boolean;
  reload: () => void;
}

export function useLoad<T>(load: () => Promise<T>, deps: unknown[]): Loaded<T> {
  const [state, setState] = useState<{ data?: T; error?: Error; loading: boolean }>({ loading: true });
  const [tick, setTick] = useState(0);
  useEffect(() => {
    let live = true;
    setState((s) => ({ data: s.data, loading: true }));
    load().then(
      (data) => live && setState({ data, loading: false }),
      (error: Error) => live && setState({ error, loading: false }),
    );
    return () => {
      live = false;
    };
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [...deps, tick]);
  const reload = useCallback(() => setTick((t) => t + 1), []);
  return { ...state, reload };
}

export function Show<T>(props: { what: Loaded<T>; label: string; children: (data: T) => ComponentChildren }) {
  const { data, error, loading } = props.what;
  if (error) return <ErrorBox error={error} />;
  if (data === undefined)
    return (
      <p class="muted" role="status">
        Loading {props.label}…
      </p>
    );
  return (
    <div aria-busy={loading ? "true" : "false"}>
      {props.children(data)}
    </div>
  );
}

export function ErrorBox({ error }: { error: Error }) {
  const kind = error instanceof ApiError ? `${error.kind} (${error.status})` : "Error";
  return (
    <p class="error" role="alert">
      {kind}: {error.message}
    </p>
  );
}

export function Badge({ kind, children }: { kind: string; children: ComponentChildren }) {
  return <span class={`badge badge-${kind.toLowerCase().replace(/[^a-z]+/g, "-")}`}>{children}</span>;
}

/** The sources of a memory as links: a message of one of the soul's turns links to that turn; an observed message's
 *  id links to the turn that wrote the memory, when it is known. */
export function Sources({ soul, sources, writtenBy }: { soul: string; sources: string[]; writtenBy?: number }) {
  if (!sources.length) return <span class="muted">—</span>;
  return (
    <ul class="sources">
      {sources.map((raw) => {
        const s = source(raw, soul);
        if (s.seq !== null)
          return (
            <li key={raw}>
              <a href={href(soul, undefined, s.seq)} title={raw}>
                turn {s.seq} · {s.role} message
              </a>
            </li>
          );
        return (
          <li key={raw}>
            message <code>{raw}</code>
            {writtenBy !== undefined && (
              <>
                {" "}
                · <a href={href(soul, undefined, writtenBy)}>observed in turn {writtenBy}</a>
              </>
            )}
          </li>
        );
      })}
    </ul>
  );
}

export function Confirm(props: {
  title: string;
  children: ComponentChildren;
  action: string;
  typeToConfirm?: string;
  onConfirm: () => Promise<void>;
  onClose: () => void;
}) {
  const ref = useRef<HTMLDialogElement>(null);
  const [typed, setTyped] = useState("");
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<Error | undefined>();
  useEffect(() => {
    const d = ref.current;
    if (d && !d.open) d.showModal();
  }, []);
  const ready = !busy && (props.typeToConfirm === undefined || typed === props.typeToConfirm);
  const submit = async (e: Event) => {
    e.preventDefault();
    if (!ready) return;
    setBusy(true);
    try {
      await props.onConfirm();
      ref.current?.close();
    } catch (err) {
      setError(err as Error);
      setBusy(false);
    }
  };
  return (
    <dialog ref={ref} class="confirm" aria-labelledby="confirm-title" onClose={props.onClose}>
      <form onSubmit={submit}>
        <h2 id="confirm-title">{props.title}</h2>
        <div>{props.children}</div>
        {props.typeToConfirm !== undefined && (
          <p>
            <label for="confirm-typed">
              Type <code>{props.typeToConfirm}</code> to confirm
            </label>
            <input
              id="confirm-typed"
              autocomplete="off"
              spellcheck={false}
              value={typed}
              onInput={(e) => setTyped((e.target as HTMLInputElement).value)}
            />
          </p>
        )}
        {error && <ErrorBox error={error} />}
        <div class="actions">
          <button type="button" autofocus onClick={() => ref.current?.close()}>
            Cancel
          </button>
          <button type="submit" class="danger" disabled={!ready}>
            {busy ? "Working…" : props.action}
          </button>
        </div>
      </form>
    </dialog>
  );
}

/** A polite live region: what an action did, read out by screen readers. */
export function Status({ text }: { text: string }) {
  return (
    <p class="status" role="status" aria-live="polite">
      {text}
    </p>
  );
}
