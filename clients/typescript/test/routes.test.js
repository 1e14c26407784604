// Every method of the client against a real `soul serve` (offline model): what it sends is accepted, what it
// returns holds what the scenario wrote, and the records have exactly the fields src/api.ts declares.

import { test } from "node:test";
import assert from "node:assert/strict";
import { NotFound, SoulClient } from "../dist/index.js";
import { freshSoul, service } from "./support.js";
import { misfit } from "./shapes.js";

const { url, key, otherKey } = service();
const client = new SoulClient({ baseUrl: url, apiKey: key });

function fits(value, type) {
  assert.equal(misfit(value, type), "", `${type}: ${JSON.stringify(value).slice(0, 400)}`);
}

test("a soul's whole life: turn, observe, recall, facts, history, episodes, traces, stats, export, import, forget", async () => {
  const id = freshSoul("maya");
  const soul = client.soul(id);
  assert.deepEqual(await client.health(), { status: "ok" });

  const t1 = await soul.turn("The production database for Tendril is Postgres 15.",
    { user: "Maya", at: "2026-03-02T09:00:00Z" });
  assert.equal(t1.turn_id, `${id}/1`);
  assert.equal(t1.seq, 1);
  assert.ok(t1.reply.length > 0 && t1.writes.length > 0 && !t1.writes_pending);
  fits(t1.writes, "MemoryWrite[]");
  fits(t1.recalled, "RecallItem[]");

  const obs = await soul.observe([
    { speaker: "Maya", text: "Correct, Tendril runs Postgres 15 in production.", id: "c2" },
    { speaker: "Maya", text: "We rolled back the cache deploy after the latency spike.", id: "c3" },
  ], { at: new Date("2026-03-02T09:05:00Z") });
  assert.equal(obs.turn_id, `${id}/2`);

  const items = await soul.recall("Tendril production database", { k: 5 });
  fits(items, "RecallItem[]");
  assert.ok(items.length <= 5 && items.some((i) => i.text.includes("Postgres 15")), JSON.stringify(items));
  const semantic = await soul.recall("Tendril database", { stores: ["semantic"] });
  assert.ok(semantic.length > 0 && semantic.every((i) => i.store === "semantic"), JSON.stringify(semantic));

  const context = await soul.context("Tendril production database", { budget: 400, k: 5 });
  assert.equal(context.query, "Tendril production database");
  assert.ok(context.items.length > 0 && context.items.length <= 5, JSON.stringify(context));
  assert.ok(context.used_tokens <= 400 && context.items.some((i) => i.shown && i.line.includes("Postgres 15")));

  const facts = await soul.facts();
  fits(facts, "Fact[]");
  const fact = facts.find((f) => f.value === "Postgres 15");
  assert.ok(fact, JSON.stringify(facts));
  assert.deepEqual((await soul.facts(fact.entity)).map((f) => f.value), ["Postgres 15"]);
  const history = await soul.factHistory(fact.entity, fact.attribute);
  fits(history, "FactVersion[]");
  assert.deepEqual(history.map((v) => v.value), ["Postgres 15"]);

  const episodes = await soul.episodes();
  fits(episodes, "Episode[]");
  assert.ok(episodes.length >= 2, JSON.stringify(episodes));
  const digests = await soul.digests();
  fits(digests, "Digest[]");
  assert.ok(digests.some((d) => d.episodes.length > 0 && d.episodes.every((id) => episodes.some((e) => e.id === id))),
    JSON.stringify(digests));
  const cut = Date.parse("2026-03-02T09:03:00Z") / 1000;
  const later = await soul.episodes({ since: new Date(cut * 1000) });
  const earlier = await soul.episodes({ until: cut });
  assert.ok(later.length > 0 && later.every((e) => e.at >= cut), JSON.stringify(later));
  assert.ok(earlier.length > 0 && earlier.every((e) => e.at <= cut), JSON.stringify(earlier));
  assert.equal(later.length + earlier.length, episodes.length);
  assert.ok((await soul.episodes({ sessionsAgo: 0 })).length > 0);

  const traces = await soul.traces(5);
  fits(traces, "TurnTrace[]");
  assert.deepEqual(traces.map((t) => t.turn_id), [`${id}/1`, `${id}/2`]);
  assert.equal(traces[0].soul_id, id);
  assert.equal((await soul.trace(2)).kind, "observe");
  assert.equal((await soul.trace(t1.turn_id)).seq, 1);
  assert.deepEqual((await soul.traces(1)).map((t) => t.seq), [2]);

  const stats = await soul.stats();
  assert.ok(stats.facts >= 1 && stats.episodes >= 2, JSON.stringify(stats));
  assert.ok((await client.souls()).includes(id));

  // export, then import into a new soul: the same facts
  const blob = await soul.export();
  assert.ok(blob instanceof Uint8Array && blob.length > 0);
  assert.ok(Buffer.from(blob).includes(id));
  const copy = client.soul(`${id}-copy`);
  assert.deepEqual(await copy.import(blob), { soul_id: copy.id, bytes: blob.length });
  assert.deepEqual((await copy.facts()).map((f) => f.value), facts.map((f) => f.value));

  // single memories, then the whole soul
  const gone = await soul.forgetWhere({ query: "latency spike" });
  assert.ok(gone.deleted.length > 0, JSON.stringify(gone));
  fits(gone.writes, "MemoryWrite[]");
  assert.ok((await soul.episodes()).every((e) => !e.summary.includes("latency spike")));
  const erased = await copy.forget();
  assert.ok(erased.semantic >= 1 && erased.episodic >= 1, JSON.stringify(erased));
  assert.deepEqual(await copy.facts(), []);
  assert.deepEqual(await copy.traces(), []);
});

test("procedures: a task told three times with its steps", async () => {
  const soul = client.soul(freshSoul("olu"));
  for (const text of [
    "I backed up the photo library this morning. First I plugged in the external drive, then I ran rsync on the photos folder, then I verified the checksums. Success.",
    "Backed up the photo library again. First I plugged in the external drive, then I ran rsync on the photos folder, then I verified the checksums. No issues.",
    "Another photo library backup: first I plugged in the external drive, then I ran rsync on the photos folder, then I verified the checksums. Done, it worked.",
  ]) await soul.turn(text, { user: "Olu" });
  const procedures = await soul.procedures();
  fits(procedures, "Procedure[]");
  const backup = procedures.find((p) => p.steps.some((s) => s.includes("rsync")));
  assert.ok(backup, JSON.stringify(procedures));
  assert.deepEqual((await soul.procedures(backup.task_class)).map((p) => p.task_class), [backup.task_class]);
});

test("a tenant never sees another tenant's soul", async () => {
  const id = freshSoul("shared-name");
  await client.soul(id).turn("Our staging cluster is in Frankfurt.");
  const other = new SoulClient({ baseUrl: url, apiKey: otherKey });
  assert.ok(!(await other.souls()).includes(id));
  // the other tenant's soul of that name does not exist: every read is NotFound, and none creates it
  for (const read of [(s) => s.facts(), (s) => s.traces(), (s) => s.recall("staging cluster"), (s) => s.stats()]) {
    const e = await read(other.soul(id)).catch((err) => err);
    assert.ok(e instanceof NotFound && e.status === 404 && e.message.includes(id), String(e));
  }
  assert.ok(!(await other.souls()).includes(id));
  assert.ok((await client.soul(id).recall("staging cluster")).length > 0);
});
