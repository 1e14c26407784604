/**
 * The client of soul-runtime's HTTP service (`soul serve`): a {@link SoulClient} per service and key, and a
 * {@link Soul} per soul with the methods of the Python API's soul handle.
 */

import type {
  ContextAnswer, DigestsAnswer, EpisodesAnswer, ErasedAnswer, FactsAnswer, ForgetResult, HistoryAnswer, ImportAnswer, Message, ProceduresAnswer,
  RecallAnswer, SoulsAnswer, Stats, Store, Time, TraceAnswer, TracesAnswer, TurnResult, Usage,
} from "./api.js";
import { errorFromResponse, RuntimeBusy, RuntimeUnavailable, SoulError } from "./errors.js";

export interface RetryOptions {
  /** Attempts after the first one when the service answered busy (429) or failed (500, a timed-out attempt)
   * (default 4). 0: no retry. */
  retries?: number;
  /** How long in ms a call is sent again while the service is not there — the connection refused or lost, a 503
   * (starting, stopping, restarting), or an answer of the ingress rather than the service (a 404, 500, 502 or 504
   * without the service's JSON error: Serve's proxy while no app is deployed, HAProxy's plain 500 for a replica
   * that died) — with the same Idempotency-Key
   * (default 60000). 0: not sent again. */
  retryForMs?: number;
  /** The first back-off in ms, doubled each attempt, with full jitter (default 250). */
  baseDelayMs?: number;
  /** The longest wait between attempts in ms (default 20000); a `Retry-After` beyond it is not waited for. */
  maxDelayMs?: number;
}

export interface ClientOptions {
  /** The service's URL, e.g. `http://127.0.0.1:8000`. */
  baseUrl: string;
  /** The tenant's API key (`soul tenants add NAME`); default: the `SOUL_API_KEY` variable where there is one. */
  apiKey?: string;
  /** Each attempt's time limit in ms (default 120000: a turn waits for the model and the memory writes). */
  timeoutMs?: number;
  retry?: RetryOptions;
  /** The `fetch` to use (default: the global one). */
  fetch?: typeof globalThis.fetch;
  /** Headers sent with every request (tracing, a proxy's own auth...). */
  headers?: Record<string, string>;
}

/** Per-call options every method takes. */
export interface CallOptions {
  /** Aborts the call, its retries included; the abort's reason is thrown as it is. */
  signal?: AbortSignal;
}

/** Options of the writes that are retried with an `Idempotency-Key`. */
export interface WriteOptions extends CallOptions {
  /** The key that makes the write idempotent (at most 200 printable characters). Default: a new random one per
   * call, sent again on every retry of that call. Pass your own to make a write you retry yourself (after a
   * crash, from a queue) idempotent too: the same key with the same body is applied once. */
  idempotencyKey?: string;
}

export interface TurnOptions extends WriteOptions {
  /** The user's name, as the memory should know them. */
  user?: string;
  /** When the turn happened (default: now): ISO-8601, epoch seconds or a `Date`. */
  at?: Time | Date;
  /** false: answer once the reply is there and write memory after (default true). */
  waitWrites?: boolean;
}

export interface ObserveOptions extends WriteOptions {
  at?: Time | Date;
  /** The session the conversation belongs to. */
  session?: string;
}

export interface RecallOptions extends CallOptions {
  /** How many items (1-1000; default 10). */
  k?: number;
  /** Only these layers. */
  stores?: Store[];
  /** Recall as of this time (default: now). */
  at?: Time | Date;
}

export interface ContextOptions extends CallOptions {
  /** Tokens for memory lines (default: the turn's own budget). */
  budget?: number;
  /** How many items recall ranks (default: as a turn). */
  k?: number;
  /** Only these layers. */
  stores?: Store[];
  /** As of this time (default: now). */
  at?: Time | Date;
}

export interface EpisodesOptions extends CallOptions {
  since?: Time | Date;
  until?: Time | Date;
  session?: string;
  /** 0: the current session, 1: the one before... */
  sessionsAgo?: number;
}

export interface ForgetWhereOptions extends WriteOptions {
  /** Memory ids: `ep-3`, `entity:attribute`, `task@v2`. */
  ids?: string[];
  /** Every memory whose text holds it. */
  query?: string;
}

/** How a request may be retried: `always` (reads, erasure, writes with an Idempotency-Key), `busy` (only a 429:
 * the service did nothing), `never`. */
type Retry = "always" | "busy";

interface Request {
  method: "GET" | "POST" | "DELETE";
  path: string;
  query?: Record<string, string | number | readonly string[] | undefined>;
  json?: unknown;
  bytes?: Uint8Array | ArrayBuffer | Blob;
  idempotencyKey?: string;
  retry: Retry;
  binary?: boolean;
  signal?: AbortSignal;
}

const RETRIED = new Set([429, 500, 502, 503, 504]);
const INGRESS = new Set([404, 500, 502, 503, 504]);
/** The longest back-off while the service is not there (a restart is waited out in steps of at most this). */
const UNAVAILABLE_DELAY_MS = 2000;

/** An answer of the ingress in front of the service, not of the service (whose every answer is JSON). */
function fromIngress(status: number, contentType: string | null): boolean {
  return INGRESS.has(status) && !(contentType ?? "").toLowerCase().startsWith("application/json");
}

function env(name: string): string | undefined {
  const proc = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process;
  return proc?.env?.[name];
}

function time(t: Time | Date | undefined): Time | undefined {
  return t instanceof Date ? t.toISOString() : t;
}

/** A new idempotency key: a random UUID. */
export function newIdempotencyKey(): string {
  const c = globalThis.crypto;
  if (typeof c.randomUUID === "function") return c.randomUUID();
  const b = c.getRandomValues(new Uint8Array(16));  // a browser page that is not a secure context
  return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

/** The seconds of a `Retry-After` header (delta-seconds or an HTTP date), or undefined. */
export function parseRetryAfter(value: string | null, now: number = Date.now()): number | undefined {
  if (value === null || value.trim() === "") return undefined;
  const v = value.trim();
  if (/^\d+$/.test(v)) return Number(v);
  const when = Date.parse(v);
  return Number.isNaN(when) ? undefined : Math.max(0, (when - now) / 1000);
}

/** A controller whose signal aborts when either signal does (`AbortSignal.any`, which Node 20.0-20.2 and older
 * browsers lack); aborting it drops its listeners on both. */
function either(a: AbortSignal, b: AbortSignal): AbortController {
  const both = new AbortController();
  const abort = (s: AbortSignal) => () => both.abort(s.reason);
  for (const s of [a, b]) {
    if (s.aborted) both.abort(s.reason);
    else s.addEventListener("abort", abort(s), { once: true, signal: both.signal });
  }
  return both;
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const done = () => { signal?.removeEventListener("abort", stop); resolve(); };
    const timer = setTimeout(done, ms);
    const stop = () => { clearTimeout(timer); reject(signal?.reason); };
    signal?.addEventListener("abort", stop, { once: true });
  });
}

export class SoulClient {
  readonly baseUrl: string;
  private readonly apiKey: string | undefined;
  private readonly timeoutMs: number;
  private readonly retries: number;
  private readonly retryForMs: number;
  private readonly baseDelayMs: number;
  private readonly maxDelayMs: number;
  private readonly fetchImpl: typeof globalThis.fetch;
  private readonly headers: Record<string, string>;

  constructor(options: ClientOptions) {
    if (typeof options?.baseUrl !== "string" || !/^https?:\/\//.test(options.baseUrl)) {
      throw new TypeError("baseUrl must be an http(s) URL, e.g. http://127.0.0.1:8000");
    }
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.apiKey = options.apiKey ?? env("SOUL_API_KEY");
    this.timeoutMs = options.timeoutMs ?? 120_000;
    this.retries = options.retry?.retries ?? 4;
    this.retryForMs = options.retry?.retryForMs ?? 60_000;
    this.baseDelayMs = options.retry?.baseDelayMs ?? 250;
    this.maxDelayMs = options.retry?.maxDelayMs ?? 20_000;
    this.fetchImpl = options.fetch ?? globalThis.fetch.bind(globalThis);
    this.headers = { ...options.headers };
  }

  /** The soul `id` of this key's tenant (letters, digits, `_.:@-`, starting with a letter or digit; at most 95
   * characters). Nothing is sent until a method is called. */
  soul(id: string): Soul {
    return new Soul(this, id);
  }

  /** The tenant's souls (those with data). */
  async souls(options: CallOptions = {}): Promise<string[]> {
    const out = await this.request<SoulsAnswer>({ method: "GET", path: "/v1/souls", retry: "always", ...options });
    return out.souls;
  }

  /** `GET /v1/usage`: what the tenant uses, and its limits (over one, a turn is refused with `QuotaExceeded`). */
  async usage(options: CallOptions = {}): Promise<Usage> {
    return this.request<Usage>({ method: "GET", path: "/v1/usage", retry: "always", ...options });
  }

  /** `GET /healthz`: resolves once the service and its runtime answer. */
  async health(options: CallOptions = {}): Promise<{ status: string }> {
    return this.request({ method: "GET", path: "/healthz", retry: "always", ...options });
  }

  /** One request with its retries. Exposed for the routes' methods on {@link Soul}; not a public API. */
  async request<T>(req: Request): Promise<T> {
    const url = new URL(this.baseUrl + req.path);
    for (const [name, value] of Object.entries(req.query ?? {})) {
      if (value === undefined) continue;
      for (const v of Array.isArray(value) ? value : [value]) url.searchParams.append(name, String(v));
    }
    const headers: Record<string, string> = { accept: "application/json", ...this.headers };
    if (this.apiKey) headers.authorization = `Bearer ${this.apiKey}`;
    let body: BodyInit | undefined;
    if (req.json !== undefined) {
      headers["content-type"] = "application/json";
      body = JSON.stringify(req.json);
    } else if (req.bytes !== undefined) {
      headers["content-type"] = "application/octet-stream";
      body = req.bytes as BodyInit;
    }
    if (req.idempotencyKey !== undefined) headers["idempotency-key"] = req.idempotencyKey;
    if (req.binary) headers.accept = "application/octet-stream";

    const started = Date.now();
    let busyTries = 0;
    for (let attempt = 0; ; attempt++) {
      const last = busyTries >= this.retries;
      let waitMs: number | undefined;
      let away = false;  // the service is not there: sent again for retryForMs, whatever `retries` says
      req.signal?.throwIfAborted();
      const timeout = AbortSignal.timeout(this.timeoutMs);
      const joined = req.signal ? either(req.signal, timeout) : undefined;
      const signal = joined?.signal ?? timeout;
      try {
        const res = await this.fetchImpl(url, { method: req.method, headers, body, signal });
        if (res.ok) {
          return (req.binary ? new Uint8Array(await res.arrayBuffer()) : await res.json()) as T;
        }
        const text = await res.text();
        let parsed: unknown = text;
        try { parsed = JSON.parse(text); } catch { /* not JSON: a proxy's page; keep the text */ }
        const retryAfter = parseRetryAfter(res.headers.get("retry-after"));
        const ingress = fromIngress(res.status, res.headers.get("content-type"));
        const failure = ingress
          ? new RuntimeUnavailable(`the service is not there: its ingress answered ${res.status}`, { status: res.status })
          : errorFromResponse(res.status, parsed, retryAfter);
        // a 404 of the ingress never reached the service: safe to send again whatever the call
        away = (ingress && res.status === 404) || (req.retry === "always" && (res.status === 503 || ingress));
        const retried = away || (req.retry === "always" ? RETRIED.has(res.status) : res.status === 429);
        if (!retried || (!away && last)) throw failure;
        if (retryAfter !== undefined) {
          if (retryAfter * 1000 > this.maxDelayMs) throw failure;
          waitMs = retryAfter * 1000;
        }
        waitMs ??= this.backoff(attempt, away);
        if (away && Date.now() - started + waitMs > this.retryForMs) throw failure;
      } catch (e) {
        if (e instanceof SoulError) throw e;
        if (req.signal?.aborted) throw req.signal.reason;
        const timedOut = timeout.aborted;
        const failure = new RuntimeUnavailable(
          timedOut ? `the service did not answer within ${this.timeoutMs} ms` : `the service cannot be reached (${this.baseUrl})`,
          { cause: e });
        if (req.retry !== "always") throw failure;
        away = !timedOut;
        waitMs = this.backoff(attempt, away);
        if (away ? Date.now() - started + waitMs > this.retryForMs : last) throw failure;
      } finally {
        joined?.abort();  // the attempt is over (its body read): the caller's signal keeps no listener of it
      }
      if (!away) busyTries++;
      await sleep(waitMs ?? this.backoff(attempt, away), req.signal);
    }
  }

  private backoff(attempt: number, away = false): number {
    const cap = away ? Math.min(this.maxDelayMs, UNAVAILABLE_DELAY_MS) : this.maxDelayMs;
    return Math.random() * Math.min(cap, this.baseDelayMs * 2 ** attempt);
  }
}

/** One soul of the tenant: the methods of the Python API's soul handle, over HTTP. */
export class Soul {
  readonly id: string;
  private readonly client: SoulClient;
  private readonly path: string;

  constructor(client: SoulClient, id: string) {
    this.client = client;
    this.id = id;
    this.path = `/v1/souls/${encodeURIComponent(id)}`;
  }

  /** One turn: recall, the model's reply and the memory writes. Retried with one Idempotency-Key: a retried
   * turn is applied once. */
  async turn(text: string, options: TurnOptions = {}): Promise<TurnResult> {
    const { user, at, waitWrites, idempotencyKey, signal } = options;
    return this.client.request({
      method: "POST", path: `${this.path}/turns`, retry: "always", signal,
      json: { text, user, at: time(at), wait_writes: waitWrites },
      idempotencyKey: idempotencyKey ?? newIdempotencyKey(),
    });
  }

  /** Ingest a conversation the soul was not part of. Retried with one Idempotency-Key. */
  async observe(messages: Message[], options: ObserveOptions = {}): Promise<TurnResult> {
    const { at, session, idempotencyKey, signal } = options;
    return this.client.request({
      method: "POST", path: `${this.path}/observe`, retry: "always", signal,
      json: { messages: messages.map((m) => ({ ...m, at: time(m.at ?? undefined) })), at: time(at), session },
      idempotencyKey: idempotencyKey ?? newIdempotencyKey(),
    });
  }

  /** What memory returns for a query, best first. */
  async recall(query: string, options: RecallOptions = {}): Promise<RecallAnswer["items"]> {
    const { k, stores, at, signal } = options;
    const out = await this.client.request<RecallAnswer>({
      method: "GET", path: `${this.path}/recall`, retry: "always", signal,
      query: { q: query, k, store: stores, at: time(at) },
    });
    return out.items;
  }

  /** The memory lines a turn asking `query` would be shown, within `budget` tokens: what the model would read. */
  async context(query: string, options: ContextOptions = {}): Promise<ContextAnswer> {
    const { budget, k, stores, at, signal } = options;
    return this.client.request<ContextAnswer>({
      method: "GET", path: `${this.path}/context`, retry: "always", signal,
      query: { q: query, budget, k, store: stores, at: time(at) },
    });
  }

  /** The facts memory holds now (about `entity`, or all). */
  async facts(entity?: string, options: CallOptions = {}): Promise<FactsAnswer["facts"]> {
    const out = await this.client.request<FactsAnswer>({
      method: "GET", path: `${this.path}/facts`, retry: "always", query: { entity }, ...options,
    });
    return out.facts;
  }

  /** Every version a fact had, oldest first. */
  async factHistory(entity: string, attribute: string, options: CallOptions = {}): Promise<HistoryAnswer["versions"]> {
    const out = await this.client.request<HistoryAnswer>({
      method: "GET", retry: "always", ...options,
      path: `${this.path}/facts/${encodeURIComponent(entity)}/${encodeURIComponent(attribute)}/history`,
    });
    return out.versions;
  }

  /** Episodes, by time range, session or sessions ago. */
  async episodes(options: EpisodesOptions = {}): Promise<EpisodesAnswer["episodes"]> {
    const { since, until, session, sessionsAgo, signal } = options;
    const out = await this.client.request<EpisodesAnswer>({
      method: "GET", path: `${this.path}/episodes`, retry: "always", signal,
      query: { since: time(since), until: time(until), session, sessions_ago: sessionsAgo },
    });
    return out.episodes;
  }

  /** The consolidated memory, brought up to date first: each session's and span's digest with its provenance. */
  async digests(options: CallOptions = {}): Promise<DigestsAnswer["digests"]> {
    const out = await this.client.request<DigestsAnswer>({
      method: "GET", path: `${this.path}/digests`, retry: "always", ...options,
    });
    return out.digests;
  }

  /** The procedures memory holds (for a task class, or all). */
  async procedures(task?: string, options: CallOptions = {}): Promise<ProceduresAnswer["procedures"]> {
    const out = await this.client.request<ProceduresAnswer>({
      method: "GET", path: `${this.path}/procedures`, retry: "always", query: { task }, ...options,
    });
    return out.procedures;
  }

  /** The last `last` turn traces, oldest first. */
  async traces(last = 10, options: CallOptions = {}): Promise<TracesAnswer["traces"]> {
    const out = await this.client.request<TracesAnswer>({
      method: "GET", path: `${this.path}/traces`, retry: "always", query: { last }, ...options,
    });
    return out.traces;
  }

  /** One turn's trace: by its `seq`, or its turn id (`SOUL/SEQ`, as a result's `turn_id`). */
  async trace(turn: number | string, options: CallOptions = {}): Promise<TraceAnswer> {
    const seq = typeof turn === "number" ? String(turn) : turn.slice(turn.lastIndexOf("/") + 1);
    return this.client.request<TraceAnswer>({
      method: "GET", path: `${this.path}/traces/${encodeURIComponent(seq)}`, retry: "always", ...options,
    });
  }

  /** Counts per layer and the model usage. */
  async stats(options: CallOptions = {}): Promise<Stats> {
    return this.client.request<Stats>({ method: "GET", path: `${this.path}/stats`, retry: "always", ...options });
  }

  /** The soul's whole memory as bytes (msgpack), for {@link Soul.import} into a new soul. */
  async export(options: CallOptions = {}): Promise<Uint8Array> {
    return this.client.request<Uint8Array>({
      method: "GET", path: `${this.path}/export`, retry: "always", binary: true, ...options,
    });
  }

  /** Load an export into this soul, which must have no memories yet. Retried only when the service refused it as
   * busy (nothing applied). */
  async import(blob: Uint8Array | ArrayBuffer | Blob, options: CallOptions = {}): Promise<ImportAnswer> {
    return this.client.request<ImportAnswer>({
      method: "POST", path: `${this.path}/import`, retry: "busy", bytes: blob, ...options,
    });
  }

  /** Delete single memories (by id and/or every one whose text holds `query`); traces that held them are
   * redacted. Retried with one Idempotency-Key. */
  async forgetWhere(options: ForgetWhereOptions): Promise<ForgetResult> {
    const { ids, query, idempotencyKey, signal } = options;
    return this.client.request({
      method: "POST", path: `${this.path}/forget`, retry: "always", signal, json: { ids, query },
      idempotencyKey: idempotencyKey ?? newIdempotencyKey(),
    });
  }

  /** Erase the soul for good: every layer, its traces and buffer. Returns the counts erased. */
  async forget(options: CallOptions = {}): Promise<ErasedAnswer["erased"]> {
    const out = await this.client.request<ErasedAnswer>({ method: "DELETE", path: this.path, retry: "always", ...options });
    return out.erased;
  }
}
