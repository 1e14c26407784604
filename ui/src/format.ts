// Dates, numbers and provenance as the pages show them.

export function when(epoch: number): string {
  if (!epoch) return "—";
  const d = new Date(epoch * 1000);
  return d.toISOString().replace("T", " ").slice(0, 16) + " UTC";
}

export function day(epoch: number): string {
  return epoch ? new Date(epoch * 1000).toISOString().slice(0, 10) : "—";
}

export function ago(epoch: number, now = Date.now() / 1000): string {
  if (!epoch) return "";
  const s = Math.max(0, now - epoch);
  if (s < 90) return "just now";
  if (s < 5400) return `${Math.round(s / 60)} min ago`;
  if (s < 129600) return `${Math.round(s / 3600)} h ago`;
  if (s < 86400 * 60) return `${Math.round(s / 86400)} days ago`;
  if (s < 86400 * 730) return `${Math.round(s / (86400 * 30.4))} months ago`;
  return `${Math.round(s / (86400 * 365))} years ago`;
}

export function score(x: number): string {
  return x.toFixed(3);
}

export interface Source {
  raw: string;
  seq: number | null; // the turn of this soul the source is a message of
  role: string;
}

/** A source of a memory: ``SOUL/SEQ/ROLE`` is a message of one of the soul's turns; anything else is the id of an
 *  observed message (the turn that observed it is the one whose writes hold the memory). */
export function source(raw: string, soul: string): Source {
  const m = /^(.*)\/(\d+)\/([A-Za-z_]+)$/.exec(raw);
  if (m && m[1] === soul) return { raw, seq: Number(m[2]), role: m[3] };
  return { raw, seq: null, role: "" };
}

export function plural(n: number, one: string, many = one + "s"): string {
  return `${n} ${n === 1 ? one : many}`;
}
