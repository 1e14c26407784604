// Errors: the real server's refusals arrive as the classes of the tree, built from {"error": {"type", "message"}};
// what the client does with a body or status it does not know.

import { test } from "node:test";
import assert from "node:assert/strict";
import {
  AuthError, errorFromResponse, IdempotencyConflict, InvalidInput, ModelError, ModelTimeout, NotFound,
  QuotaExceeded, RuntimeBusy, RuntimeUnavailable, SoulClient, SoulError, StaleOwner, Unauthorized,
} from "../dist/index.js";
import { freshSoul, service } from "./support.js";

const { url, key } = service();
const client = new SoulClient({ baseUrl: url, apiKey: key, retry: { retries: 0 } });

/** The call fails with a `cls` of HTTP status `status` (or one of them). */
async function refused(promise, cls, status) {
  const e = await promise.then(() => assert.fail("no error"), (err) => err);
  assert.ok(e instanceof cls, `${e?.name}: ${e?.message} is not a ${cls.name}`);
  assert.ok(e instanceof SoulError && e instanceof Error);
  assert.ok([status].flat().includes(e.status), `${e.status}: ${e.message}`);
  assert.ok(e.message.length > 0 && !e.message.includes("acme"), e.message);
  return e;
}

test("the server's refusals are the tree's classes", async () => {
  const id = freshSoul("err");
  const soul = client.soul(id);
  await soul.turn("Our staging cluster is in Frankfurt.");

  for (const apiKey of ["soul_wrong", ""]) {
    const e = await refused(new SoulClient({ baseUrl: url, apiKey }).soul(id).facts(), Unauthorized, 401);
    assert.equal(e.type, "Unauthorized");
    assert.equal(e.name, "Unauthorized");
  }
  await refused(client.soul("-bad").facts(), InvalidInput, 400);
  await refused(client.soul("x".repeat(96)).facts(), InvalidInput, 400);
  await refused(soul.turn("   "), InvalidInput, 400);
  await refused(soul.turn("hi", { at: "not a time" }), InvalidInput, 400);
  await refused(soul.recall("x", { k: 0 }), InvalidInput, [400, 422]);  // out of the declared bounds
  await refused(soul.recall("x", { stores: ["nowhere"] }), InvalidInput, 400);
  await refused(soul.observe([]), InvalidInput, 400);
  await refused(soul.forgetWhere({}), InvalidInput, 400);
  const nf = await refused(soul.trace(99), NotFound, 404);
  assert.equal(nf.type, "NotFound");
  await refused(soul.factHistory("nobody", "nothing"), NotFound, 404);
  await refused(client.soul(`${id}-x`).import(new TextEncoder().encode("not an export")), InvalidInput, 400);
  await refused(soul.import(await soul.export()), InvalidInput, 400);  // the soul has memories

  // the same Idempotency-Key with another body: refused, nothing applied
  await soul.turn("Ship the release on Friday.", { idempotencyKey: "order-42" });
  const conflict = await refused(soul.turn("Ship it on Monday.", { idempotencyKey: "order-42" }), IdempotencyConflict, 422);
  assert.ok(conflict instanceof InvalidInput);
  assert.equal(conflict.type, "IdempotencyConflict");
  assert.deepEqual((await soul.traces(10)).map((t) => t.seq), [1, 2]);
});

test("the tree mirrors the Python one", () => {
  assert.ok(new ModelTimeout("m") instanceof ModelError);
  assert.ok(new RuntimeBusy("b") instanceof RuntimeUnavailable);
  assert.ok(new AuthError("a") instanceof RuntimeUnavailable);
  assert.ok(new IdempotencyConflict("c") instanceof InvalidInput);
  assert.ok(!(new StaleOwner("s") instanceof RuntimeUnavailable));
  assert.equal(new StaleOwner("s").name, "StaleOwner");
});

test("a body or a status the client does not know", () => {
  const stale = errorFromResponse(503, { error: { type: "StaleOwner", message: "the soul moved" } });
  assert.ok(stale instanceof StaleOwner && stale.status === 503 && stale.message === "the soul moved");
  const busy = errorFromResponse(429, { error: { type: "RuntimeBusy", message: "busy" } }, 3);
  assert.ok(busy instanceof RuntimeBusy && busy.retryAfter === 3);
  const quota = errorFromResponse(429, { error: { type: "QuotaExceeded", message: "over" } }, 7);
  assert.ok(quota instanceof QuotaExceeded && quota instanceof RuntimeBusy && quota.retryAfter === 7, quota.name);
  const unknown = errorFromResponse(503, { error: { type: "SomethingNew", message: "x" } });
  assert.ok(unknown instanceof RuntimeUnavailable && unknown.type === "SomethingNew");
  const inherited = errorFromResponse(404, { error: { type: "toString", message: "x" } });
  assert.ok(inherited instanceof NotFound, inherited.name);
  const model = errorFromResponse(502, { error: { type: "ModelTimeout", message: "slow" } });
  assert.ok(model instanceof ModelTimeout && model instanceof ModelError);
  const proxyPage = errorFromResponse(502, "<html>Bad Gateway</html>");
  assert.ok(proxyPage instanceof RuntimeUnavailable && proxyPage.message === "<html>Bad Gateway</html>");
  const internal = errorFromResponse(500, { error: { type: "InternalError", message: "internal error" } });
  assert.ok(internal.constructor === SoulError && internal.type === "InternalError" && internal.status === 500);
});
