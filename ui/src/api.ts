// The service's own /v1 API, with the tenant key this browser session holds (sessionStorage, never a URL).

const KEY = "soul-inspector.key";
const BASE = new URL("../v1/", document.baseURI);
const MAX_IN_FLIGHT = 4;

export function getKey(): string | null {
  return sessionStorage.getItem(KEY);
}

export function setKey(key: string | null): void {
  if (key) sessionStorage.setItem(KEY, key);
  else sessionStorage.removeItem(KEY);
}

export class ApiError extends Error {
  constructor(public status: number, public kind: string, message: string) {
    super(message);
  }
}

let inFlight = 0;
const waiting: (() => void)[] = [];

async function slot<T>(run: () => Promise<T>): Promise<T> {
  while (inFlight >= MAX_IN_FLIGHT) await new Promise<void>((r) => waiting.push(r));
  inFlight++;
  try {
    return await run();
  } finally {
    inFlight--;
    waiting.shift()?.();
  }
}

let onUnauthorized: () => void = () => {};
export function whenUnauthorized(f: () => void): void {
  onUnauthorized = f;
}

type Params = Record<string, string | number | string[] | undefined>;

export function path(parts: (string | number)[], params?: Params): string {
  const p = parts.map((x) => encodeURIComponent(String(x))).join("/");
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params ?? {})) {
    if (v === undefined) continue;
    for (const one of Array.isArray(v) ? v : [v]) q.append(k, String(one));
  }
  const qs = q.toString();
  return qs ? `${p}?${qs}` : p;
}

export async function api<T>(where: string, init: { method?: string; body?: unknown; key?: string } = {}): Promise<T> {
  const key = init.key ?? getKey();
  if (!key) throw new ApiError(401, "Unauthorized", "enter an API key");
  const headers: Record<string, string> = { Authorization: `Bearer ${key}`, Accept: "application/json" };
  if (init.body !== undefined) headers["Content-Type"] = "application/json";
  const r = await slot(() =>
    fetch(new URL(where, BASE), {
      method: init.method ?? "GET",
      headers,
      body: init.body === undefined ? undefined : JSON.stringify(init.body),
      credentials: "omit",
      cache: "no-store",
      referrerPolicy: "no-referrer",
    }),
  );
  const data = await r.json().catch(() => null);
  if (!r.ok) {
    const err = data?.error ?? {};
    const e = new ApiError(r.status, String(err.type ?? "HTTPError"), String(err.message ?? r.statusText));
    if (r.status === 401 && init.key === undefined) onUnauthorized();
    throw e;
  }
  return data as T;
}

// ---- the shapes /v1 answers with ---------------------------------------------------------------

export interface Stats {
  episodes: number;
  promoted_episodes: number;
  facts: number;
  archived_facts: number;
  observations: number;
  procedures: number;
  candidate_procedures: number;
  task_runs: number;
  model_usage?: Usage;
}

export interface UsagePart {
  calls: number;
  input_tokens: number;
  output_tokens: number;
  cache_read_tokens: number;
  cache_write_tokens: number;
}

export interface Usage extends UsagePart {
  reply?: UsagePart;
  memory?: UsagePart;
  by_model?: Record<string, UsagePart>;
}

export interface Episode {
  id: string;
  at: number;
  actor: string;
  summary: string;
  sources: string[];
  entities: string[];
  tags: string[];
  session: string;
  session_index: number;
  promoted: boolean;
}

export type { Digest } from "../../clients/typescript/src/api";

export interface FactVersion {
  value: string;
  sources: string[];
  valid_from: number;
  valid_to: number;
  reason: string;
}

export interface Fact {
  entity: string;
  attribute: string;
  value: string;
  sources: string[];
  valid_from: number;
  confidence: number;
  status: string;
  history: FactVersion[];
  display_entity: string;
  display_attribute: string;
}

export interface Procedure {
  task_class: string;
  version: number;
  steps: string[];
  status: string;
  sources: string[];
  created_at: number;
  clean_runs: number;
  failures: number;
}

export interface Recalled {
  store: string;
  id: string;
  text: string;
  score: number;
  sources: string[];
  at: number;
}

export interface Write {
  store: string;
  op: "ADD" | "UPDATE" | "DELETE" | "NOOP";
  key: string;
  reason: string;
  payload: Record<string, unknown>;
}

export interface Trace {
  turn_id: string;
  seq: number;
  soul_id: string;
  kind: string;
  at: number;
  query: string;
  request_id: string;
  recalled: Recalled[];
  persisted: boolean;
  persist_reason: string;
  categories: string[];
  writes: Write[];
  tokens: Record<string, number>;
  timings_ms: Record<string, number>;
  model: string;
  usage: Usage;
  reply: string;
  pending: boolean;
  mended: string[];
}

export interface PackedItem extends Recalled {
  rank: number;
  shown: boolean;
  line: string | null;
  tokens: number | null;
}

export interface Packed {
  query: string;
  budget: number;
  used_tokens: number;
  items: PackedItem[];
}

export interface Forgotten {
  turn_id: string;
  seq: number;
  deleted: string[];
  writes: Write[];
}
