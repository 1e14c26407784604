// Retries: through a fault-injecting proxy in front of the real server. A write whose answer is lost is sent
// again with the same Idempotency-Key and applied once; 429/5xx are retried after their Retry-After; input
// errors and an import whose answer was lost are not retried.

import { test } from "node:test";
import assert from "node:assert/strict";
import { InvalidInput, parseRetryAfter, RuntimeBusy, RuntimeUnavailable, SoulClient } from "../dist/index.js";
import { deadUrl, faultProxy, freshSoul, service } from "./support.js";

const { url, key } = service();
const direct = new SoulClient({ baseUrl: url, apiKey: key });
const fast = { retries: 3, baseDelayMs: 10, retryForMs: 1500 };

/** Proxy requests whose path ends with `suffix`. */
const to = (seen, suffix) => seen.filter((r) => r.path.split("?")[0].endsWith(suffix));

test("a turn whose answer was lost is sent again with the same key and applied once", async (t) => {
  let lost = 0;
  const proxy = await faultProxy(url, (r) => (r.path.endsWith("/turns") && lost++ === 0 ? "lose-answer" : "forward"));
  t.after(proxy.close);
  const id = freshSoul("lost");
  const soul = new SoulClient({ baseUrl: proxy.url, apiKey: key, retry: fast }).soul(id);

  const res = await soul.turn("Our on-call rotation changes every Monday.", { user: "Ana" });
  const sent = to(proxy.seen, "/turns");
  assert.equal(sent.length, 2, "the first answer was lost: the turn was sent twice");
  const keys = sent.map((r) => r.headers["idempotency-key"]);
  assert.ok(keys[0] && keys[0] === keys[1], `one key for both attempts: ${keys}`);
  assert.equal(sent[0].body, sent[1].body);
  assert.equal(res.turn_id, `${id}/1`);
  const traces = await direct.soul(id).traces(10);
  assert.deepEqual(traces.map((x) => x.turn_id), [`${id}/1`], "applied once");
  assert.equal(traces[0].request_id, keys[0]);

  // the next turn has a key of its own
  const next = await soul.turn("The rotation starts at 9:00.");
  assert.equal(next.seq, 2);
  const third = to(proxy.seen, "/turns")[2];
  assert.ok(third.headers["idempotency-key"] && third.headers["idempotency-key"] !== keys[0]);
});

test("without the key the same turn sent twice is applied twice (what the key prevents)", async () => {
  const id = freshSoul("nokey");
  for (let i = 0; i < 2; i++) {
    const r = await fetch(`${url}/v1/souls/${id}/turns`, {
      method: "POST", body: JSON.stringify({ text: "Our on-call rotation changes every Monday." }),
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    });
    assert.equal(r.status, 200, await r.text());
  }
  assert.equal((await direct.soul(id).traces(10)).length, 2);
});

test("observe and forgetWhere whose answers were lost are applied once", async (t) => {
  const lost = new Set();
  const proxy = await faultProxy(url, (r) => {
    const route = r.path.split("/").pop();
    if ((route === "observe" || route === "forget") && !lost.has(route)) { lost.add(route); return "lose-answer"; }
    return "forward";
  });
  t.after(proxy.close);
  const id = freshSoul("obs");
  const soul = new SoulClient({ baseUrl: proxy.url, apiKey: key, retry: fast }).soul(id);
  const obs = await soul.observe([{ speaker: "Ana", text: "We moved the build servers to Dublin last week.", id: "m1" }]);
  assert.equal(obs.turn_id, `${id}/1`);
  const gone = await soul.forgetWhere({ query: "Dublin" });
  assert.ok(gone.deleted.length > 0, JSON.stringify(gone));
  assert.equal(gone.seq, 2);
  for (const route of ["/observe", "/forget"]) {
    const sent = to(proxy.seen, route);
    assert.equal(sent.length, 2, route);
    assert.equal(sent[0].headers["idempotency-key"], sent[1].headers["idempotency-key"]);
  }
  assert.deepEqual((await direct.soul(id).traces(10)).map((x) => x.seq), [1, 2]);
});

test("429 and 503 are retried after their Retry-After; reads too", async (t) => {
  const proxy = await faultProxy(url, (r) => {
    if (r.n === 0) return { status: 503, headers: { "retry-after": "1", "content-type": "application/json" },
      body: JSON.stringify({ error: { type: "RuntimeUnavailable", message: "the runtime is unavailable; retry" } }) };
    if (r.n === 2) return { status: 429, headers: { "retry-after": "0" },
      body: JSON.stringify({ error: { type: "RuntimeBusy", message: "busy" } }) };
    return "forward";
  });
  t.after(proxy.close);
  const soul = new SoulClient({ baseUrl: proxy.url, apiKey: key, retry: fast }).soul(freshSoul("busy"));
  const t0 = performance.now();
  const res = await soul.turn("Our release train leaves on Thursdays.");
  assert.ok(performance.now() - t0 >= 1000, "waited the Retry-After of 1 s");
  assert.equal(res.seq, 1);
  assert.equal(to(proxy.seen, "/turns").length, 2);
  assert.ok((await soul.recall("release train")).length > 0);
  assert.equal(to(proxy.seen, "/recall").length, 2);
});

test("a restarting service (its ingress's plain 404, 503, connection lost) is waited out with one key", async (t) => {
  const plain404 = { status: 404, headers: { "content-type": "text/plain; charset=utf-8" },
    body: "Path '/v1/souls/x/turns' not found. Ping http://127.0.0.1/-/routes for available routes." };
  const proxy = await faultProxy(url, (r) => {
    if (r.n === 0 || r.n === 3) return plain404;
    if (r.n === 1) return { status: 503, headers: { "retry-after": "0", "content-type": "application/json" },
      body: JSON.stringify({ error: { type: "RuntimeUnavailable", message: "not ready" } }) };
    if (r.n === 2) return "lose-answer";
    return "forward";
  });
  t.after(proxy.close);
  const id = freshSoul("restart");
  const soul = new SoulClient({ baseUrl: proxy.url, apiKey: key, retry: { retries: 1, baseDelayMs: 10 } }).soul(id);
  const res = await soul.turn("Our staging database moved to Oslo.");
  const sent = to(proxy.seen, "/turns");
  assert.equal(sent.length, 5, "sent again past `retries` while the service was away");
  assert.equal(new Set(sent.map((r) => r.headers["idempotency-key"])).size, 1, "one key for every attempt");
  const traces = await direct.soul(id).traces(10);
  assert.deepEqual(traces.map((x) => x.turn_id), [`${id}/1`], "applied once (the lost answer's turn)");
  assert.equal(res.turn_id, `${id}/1`);

  const gone = await faultProxy(url, () => plain404);
  t.after(gone.close);
  const brief = new SoulClient({ baseUrl: gone.url, apiKey: key, retry: { baseDelayMs: 10, retryForMs: 300 } });
  const e = await brief.soul("x").facts().catch((err) => err);
  assert.ok(e instanceof RuntimeUnavailable && e.status === 404, String(e));
  assert.ok(gone.seen.length >= 2, "sent again until retryForMs was spent");
});

test("a busy service: RuntimeBusy with retryAfter once the retries are spent, or at once past maxDelayMs", async (t) => {
  let after = "0";
  const proxy = await faultProxy(url, () => ({ status: 429, headers: { "retry-after": after },
    body: JSON.stringify({ error: { type: "RuntimeBusy", message: "the runtime is busy; retry later" } }) }));
  t.after(proxy.close);
  const soul = new SoulClient({ baseUrl: proxy.url, apiKey: key, retry: fast }).soul(freshSoul("b"));
  const e = await soul.turn("hello").catch((err) => err);
  assert.ok(e instanceof RuntimeBusy && e.retryAfter === 0 && e.status === 429, String(e));
  assert.equal(proxy.seen.length, 4, "the first attempt and 3 retries");
  after = "120";
  const e2 = await soul.facts().catch((err) => err);
  assert.ok(e2 instanceof RuntimeBusy && e2.retryAfter === 120, String(e2));
  assert.equal(proxy.seen.length, 5, "a Retry-After past maxDelayMs is not waited for");
});

test("input errors are not retried; an import whose answer was lost is not sent again", async (t) => {
  const proxy = await faultProxy(url, (r) => (r.path.endsWith("/import") ? "lose-answer" : "forward"));
  t.after(proxy.close);
  const client = new SoulClient({ baseUrl: proxy.url, apiKey: key, retry: fast });
  const e = await client.soul(freshSoul("in")).turn("   ").catch((err) => err);
  assert.ok(e instanceof InvalidInput && e.status === 400);
  assert.equal(to(proxy.seen, "/turns").length, 1);

  const source = direct.soul(freshSoul("src"));
  await source.turn("Our staging cluster is in Frankfurt.");
  const id = freshSoul("imp");
  const e2 = await client.soul(id).import(await source.export()).catch((err) => err);
  assert.ok(e2 instanceof RuntimeUnavailable && e2.cause, String(e2));
  assert.equal(to(proxy.seen, "/import").length, 1);
  const copied = (await direct.soul(id).stats()).episodes;
  assert.ok(copied > 0 && copied === (await source.stats()).episodes, "the one import was applied");
});

test("no server: RuntimeUnavailable after the retries; a hung one: each attempt times out", async (t) => {
  const dead = new SoulClient({ baseUrl: await deadUrl(), apiKey: key, retry: fast });
  const e = await dead.soul("x").stats().catch((err) => err);
  assert.ok(e instanceof RuntimeUnavailable && e.cause instanceof Error && e.status === undefined, String(e));

  const proxy = await faultProxy(url, () => "hang");
  t.after(proxy.close);
  const hung = new SoulClient({ baseUrl: proxy.url, apiKey: key, timeoutMs: 200, retry: { retries: 1, baseDelayMs: 10 } });
  const e2 = await hung.soul("x").turn("hello").catch((err) => err);
  assert.ok(e2 instanceof RuntimeUnavailable && /within 200 ms/.test(e2.message), String(e2));
  assert.equal(proxy.seen.length, 2);
  const keys = proxy.seen.map((r) => r.headers["idempotency-key"]);
  assert.equal(keys[0], keys[1]);
});

test("an abort stops the retries and throws its reason", async (t) => {
  const proxy = await faultProxy(url, () => ({ status: 503, headers: { "retry-after": "5" }, body: "{}" }));
  t.after(proxy.close);
  const client = new SoulClient({ baseUrl: proxy.url, apiKey: key, retry: { retries: 5 } });
  const controller = new AbortController();
  const call = client.soul("x").turn("hello", { signal: controller.signal }).catch((err) => err);
  while (proxy.seen.length === 0) await new Promise((r) => setTimeout(r, 10));
  controller.abort(new Error("the user left"));
  const e = await call;
  assert.equal(e.message, "the user left");
  assert.equal(proxy.seen.length, 1);
});

test("Retry-After: seconds or an HTTP date", () => {
  const now = Date.parse("2026-12-04T20:00:00Z");
  assert.equal(parseRetryAfter("120", now), 120);
  assert.equal(parseRetryAfter(" 0 ", now), 0);
  assert.equal(parseRetryAfter("Fri, 04 Dec 2026 20:00:05 GMT", now), 5);
  assert.equal(parseRetryAfter("Fri, 04 Dec 2026 19:59:00 GMT", now), 0);
  assert.equal(parseRetryAfter("soon", now), undefined);
  assert.equal(parseRetryAfter(null, now), undefined);
});
