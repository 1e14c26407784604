// The client against the OpenAPI document of the running server (its /openapi.json, not a copy): every request
// the client makes, with every option, goes to a route and method the document declares, with the parameters,
// headers and body the document declares (values checked against their schemas), and every answer fits the
// schema the document declares for its status; and the client has a method for every route of the document.

import { test } from "node:test";
import assert from "node:assert/strict";
import { SoulClient } from "../dist/index.js";
import { freshSoul, service } from "./support.js";

const { url, key } = service();

/** Problems of `value` against the JSON schema `schema` of `doc` (the subset the document uses). */
function violations(doc, schema, value, where) {
  if (schema === undefined || schema === true) return [];
  if (schema.$ref) return violations(doc, schema.$ref.split("/").slice(1).reduce((o, k) => o[k], doc), value, where);
  const alts = schema.anyOf ?? schema.oneOf;
  if (alts) {
    const each = alts.map((s) => violations(doc, s, value, where));
    return each.some((v) => v.length === 0) ? [] : [`${where}: fits none of ${JSON.stringify(alts)}: ${each.flat().join("; ")}`];
  }
  const out = [];
  const kind = value === null ? "null" : Array.isArray(value) ? "array" : typeof value;
  const types = schema.type === undefined ? undefined : [schema.type].flat();
  const isType = (t) => t === kind || (t === "integer" && Number.isInteger(value)) || (t === "number" && kind === "number");
  if (types && !types.some(isType)) return [`${where}: ${JSON.stringify(value)} is not ${types.join("|")}`];
  if (schema.enum && !schema.enum.some((e) => e === value)) out.push(`${where}: ${value} not in ${schema.enum}`);
  if ("const" in schema && schema.const !== value) out.push(`${where}: ${value} is not ${schema.const}`);
  if (kind === "string") {
    if (schema.pattern && !new RegExp(schema.pattern, "u").test(value)) out.push(`${where}: ${value} !~ ${schema.pattern}`);
    if (schema.minLength !== undefined && [...value].length < schema.minLength) out.push(`${where}: shorter than ${schema.minLength}`);
    if (schema.maxLength !== undefined && [...value].length > schema.maxLength) out.push(`${where}: longer than ${schema.maxLength}`);
  }
  if (kind === "number") {
    if (schema.minimum !== undefined && value < schema.minimum) out.push(`${where}: < ${schema.minimum}`);
    if (schema.maximum !== undefined && value > schema.maximum) out.push(`${where}: > ${schema.maximum}`);
    if (schema.exclusiveMinimum !== undefined && value <= schema.exclusiveMinimum) out.push(`${where}: <= ${schema.exclusiveMinimum}`);
    if (schema.exclusiveMaximum !== undefined && value >= schema.exclusiveMaximum) out.push(`${where}: >= ${schema.exclusiveMaximum}`);
  }
  if (kind === "array") {
    if (schema.minItems !== undefined && value.length < schema.minItems) out.push(`${where}: fewer than ${schema.minItems}`);
    if (schema.maxItems !== undefined && value.length > schema.maxItems) out.push(`${where}: more than ${schema.maxItems}`);
    value.forEach((v, i) => out.push(...violations(doc, schema.items, v, `${where}[${i}]`)));
  }
  if (kind === "object") {
    const props = schema.properties ?? {};
    for (const r of schema.required ?? []) if (!(r in value)) out.push(`${where}: no ${r}`);
    for (const [k, v] of Object.entries(value)) {
      if (k in props) out.push(...violations(doc, props[k], v, `${where}.${k}`));
      else if (schema.additionalProperties === false) out.push(`${where}: undeclared ${k}`);
      else if (typeof schema.additionalProperties === "object") {
        out.push(...violations(doc, schema.additionalProperties, v, `${where}.${k}`));
      }
    }
  }
  return out;
}

/** A query or path value (text) as its schema's type reads it. */
function typed(doc, schema, text) {
  const kindsOf = (s) => {
    if (s.$ref) return kindsOf(s.$ref.split("/").slice(1).reduce((o, k) => o[k], doc));
    return [s.type ?? [], ...(s.anyOf ?? s.oneOf ?? []).map(kindsOf)].flat(Infinity);
  };
  const kinds = kindsOf(schema);
  if (kinds.includes("integer") && /^-?\d+$/.test(text)) return Number(text);
  if (kinds.includes("number") && text !== "" && !Number.isNaN(Number(text))) return Number(text);
  return text;
}

/** The route declares the query parameter `name`. */
function declares(doc, path, method, name) {
  return (doc.paths[path]?.[method]?.parameters ?? []).some((p) => p.in === "query" && p.name === name);
}

function route(doc, path) {
  const matches = Object.keys(doc.paths).filter((tpl) => {
    const re = new RegExp(`^${tpl.replace(/[.*+?^$()|[\]\\]/g, "\\$&").replace(/\{[^}]+\}/g, "([^/]+)")}$`);
    return re.test(path);
  });
  return matches.length === 1 ? matches[0] : undefined;
}

/** Problems of one request the client made and its answer, against the document (of the answer only, for a
 * request sent with values the document refuses on purpose: `call.invalid`). */
function check(doc, call) {
  const where = `${call.method} ${call.url.pathname}`;
  const tpl = route(doc, call.url.pathname);
  if (!tpl) return [`${where}: no route of the document`];
  const op = doc.paths[tpl][call.method.toLowerCase()];
  if (!op) return [`${where}: ${tpl} has no ${call.method}`];
  const out = call.invalid ? [] : checkRequest(doc, call, tpl, op, where);
  const answer = op.responses[String(call.status)];
  if (!answer) out.push(`${where}: status ${call.status} undeclared`);
  else if (call.answer !== undefined) {
    const schema = answer.content?.["application/json"]?.schema;
    if (!schema) out.push(`${where}: a JSON answer to ${call.status}, undeclared`);
    else out.push(...violations(doc, schema, call.answer, `${where} -> ${call.status}`));
  } else if (call.status < 300 && !answer.content?.[call.contentType]) {
    out.push(`${where}: a ${call.contentType} answer, undeclared`);
  }
  return out;
}

function checkRequest(doc, call, tpl, op, where) {
  const out = [];
  const params = [...(doc.paths[tpl].parameters ?? []), ...(op.parameters ?? [])];
  const names = tpl.match(/\{[^}]+\}/g) ?? [];
  const values = call.url.pathname.match(new RegExp(`^${tpl.replace(/\{[^}]+\}/g, "([^/]+)")}$`)).slice(1);
  names.forEach((n, i) => {
    const p = params.find((x) => x.in === "path" && `{${x.name}}` === n);
    if (!p) out.push(`${where}: path parameter ${n} undeclared`);
    else out.push(...violations(doc, p.schema, typed(doc, p.schema, decodeURIComponent(values[i])), `${where} ${n}`));
  });
  const sent = [...new Set(call.url.searchParams.keys())];
  for (const name of sent) {
    const p = params.find((x) => x.in === "query" && x.name === name);
    if (!p) { out.push(`${where}: query ${name} undeclared`); continue; }
    const all = call.url.searchParams.getAll(name);
    const items = p.schema.anyOf?.find((s) => s.type === "array") ?? (p.schema.type === "array" ? p.schema : undefined);
    const v = items ? all.map((t) => typed(doc, items.items, t)) : typed(doc, p.schema, all[0]);
    if (!items && all.length > 1) out.push(`${where}: query ${name} repeated`);
    out.push(...violations(doc, p.schema, v, `${where} ?${name}`));
  }
  for (const p of params.filter((x) => x.required && x.in === "query")) {
    if (!sent.includes(p.name)) out.push(`${where}: required query ${p.name} not sent`);
  }
  const headerNames = Object.keys(call.headers).map((h) => h.toLowerCase());
  if (headerNames.includes("idempotency-key")) {
    const p = params.find((x) => x.in === "header" && x.name.toLowerCase() === "idempotency-key");
    if (!p) out.push(`${where}: Idempotency-Key sent, undeclared`);
    else out.push(...violations(doc, p.schema, call.headers["idempotency-key"], `${where} Idempotency-Key`));
  }
  const ctype = call.headers["content-type"];
  if (ctype) {
    const content = op.requestBody?.content?.[ctype];
    if (!content) out.push(`${where}: a ${ctype} body, undeclared`);
    else if (ctype === "application/json") out.push(...violations(doc, content.schema, JSON.parse(call.body), `${where} body`));
  } else if (op.requestBody?.required) out.push(`${where}: no body`);
  return out;
}

test("every request and answer of the client fits the running server's OpenAPI document", async () => {
  const doc = await (await fetch(`${url}/openapi.json`)).json();
  const calls = [];
  let invalid = false;
  const recording = async (input, init) => {
    const res = await fetch(input, init);
    const contentType = (res.headers.get("content-type") ?? "").split(";")[0];
    const answer = contentType === "application/json" ? await res.clone().json() : undefined;
    calls.push({ url: new URL(String(input)), method: init.method, headers: init.headers, body: init.body,
      status: res.status, contentType, answer, invalid });
    return res;
  };
  const client = new SoulClient({ baseUrl: url, apiKey: key, fetch: recording, retry: { retries: 0 } });
  const id = freshSoul("doc");
  const soul = client.soul(id);
  await client.health();
  await soul.turn("The production database for Tendril is Postgres 15.",
    { user: "Maya", at: "2026-03-02T09:00:00Z", waitWrites: true, idempotencyKey: "doc-1" });
  await soul.turn("Our staging cluster is in Frankfurt.", { at: 1772442000, waitWrites: false });
  await soul.observe([{ speaker: "Maya", text: "Correct, Tendril runs Postgres 15 in production.", id: "c2", at: 1772442100 },
    { speaker: "Maya", text: "Yes, Postgres 15 it is.", id: "c3" }], { at: new Date(), session: "s2" });
  await soul.recall("database", { k: 3, stores: ["semantic", "episodic"] });
  if (declares(doc, "/v1/souls/{soul_id}/recall", "get", "at")) await soul.recall("database", { at: new Date() });
  await soul.context("database", { budget: 300, k: 4, stores: ["episodic"], at: 1900000000 });
  const facts = await soul.facts();
  await soul.facts("tendril");
  const f = facts[0] ?? { entity: "tendril", attribute: "database" };
  await soul.factHistory(f.entity, f.attribute).catch(() => {});
  await soul.episodes({ since: "2026-03-01T00:00:00Z", until: 1900000000, session: "s2", sessionsAgo: 0 });
  await soul.digests();
  await soul.procedures();
  await soul.procedures("backup");
  await soul.traces(2);
  await soul.trace(1);
  await soul.stats();
  await client.souls();
  await client.usage();
  const blob = await soul.export();
  await client.soul(`${id}-copy`).import(blob);
  await soul.forgetWhere({ ids: ["ep-1"], query: "Frankfurt", idempotencyKey: "doc-2" });
  await client.soul(`${id}-copy`).forget();
  // refusals: their bodies as the document declares them for their status
  await soul.trace(999).catch(() => {});
  invalid = true;
  await soul.recall("x", { k: 0 }).catch(() => {});
  await client.soul("-bad").stats().catch(() => {});
  invalid = false;
  await new SoulClient({ baseUrl: url, apiKey: "soul_wrong", fetch: recording, retry: { retries: 0 } }).souls().catch(() => {});

  const problems = calls.flatMap((c) => check(doc, c));
  assert.deepEqual(problems, []);
  assert.ok(calls.some((c) => c.status >= 400) && calls.some((c) => c.status === 201));
  const covered = new Set(calls.map((c) => `${c.method.toLowerCase()} ${route(doc, c.url.pathname)}`));
  const methods = ["get", "put", "post", "delete", "patch"];
  const declared = Object.entries(doc.paths).flatMap(([p, item]) => methods.filter((m) => item[m]).map((m) => `${m} ${p}`));
  assert.deepEqual(declared.filter((r) => !covered.has(r)), [], "routes of the document the client has no method for");
});

test("the checker finds what does not fit", async () => {
  const doc = await (await fetch(`${url}/openapi.json`)).json();
  const base = { method: "POST", headers: { "content-type": "application/json" }, status: 200, contentType: "application/json" };
  const turn = (extra) => ({ ...base, url: new URL(`${url}/v1/souls/maya/turns`), ...extra });
  const ok = await new SoulClient({ baseUrl: url, apiKey: key }).soul(freshSoul("chk")).turn("Our CI runs nightly.");
  assert.deepEqual(check(doc, turn({ body: JSON.stringify({ text: "hi" }), answer: ok })), []);
  assert.match(check(doc, turn({ body: JSON.stringify({ text: "hi", wait: true }), answer: ok })).join(), /undeclared wait/);
  assert.match(check(doc, turn({ body: JSON.stringify({ user: "a" }), answer: ok })).join(), /no text/);
  assert.match(check(doc, turn({ body: JSON.stringify({ text: "hi" }), answer: { ...ok, seq: "1" } })).join(), /seq/);
  const { reply, ...noReply } = ok;
  assert.match(check(doc, turn({ body: JSON.stringify({ text: "hi" }), answer: noReply })).join(), /no reply/);
  assert.match(check(doc, { ...base, method: "GET", url: new URL(`${url}/v1/souls/maya/recall?q=x&top=3`), answer: { items: [] } }).join(),
    /query top undeclared/);
  assert.match(check(doc, { ...base, method: "GET", url: new URL(`${url}/v1/souls/maya/recall`), answer: { items: [] } }).join(),
    /required query q/);
  assert.match(check(doc, { ...base, method: "PUT", url: new URL(`${url}/v1/souls/maya/turns`) }).join(), /has no PUT/);
  assert.match(check(doc, { ...base, method: "GET", url: new URL(`${url}/v1/nowhere`) }).join(), /no route/);
});
