// `npm test`: runs test/*.test.js with Node's test runner against a real `soul serve`. With SOUL_TEST_URL,
// SOUL_TEST_KEY and SOUL_TEST_OTHER_KEY set, against that server; otherwise it starts one: a temp data dir, two
// tenants (`soul tenants add`), `soul serve` on a free 127.0.0.1 port; stopped by its pid afterwards (SIGTERM),
// its local runtime with `soul down`, the data dir removed. `soul` is taken from SOUL_BIN or PATH.

import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, readdirSync, rmSync, openSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { deadUrl } from "./support.js";

const here = fileURLToPath(new URL(".", import.meta.url));
const files = readdirSync(here).filter((f) => f.endsWith(".test.js")).sort().map((f) => join(here, f));

function runTests(env) {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, ["--test", ...files], { env, stdio: "inherit" });
    child.on("exit", (code, signal) => resolve(code ?? (signal ? 1 : 0)));
  });
}

async function withServer() {
  const soul = process.env.SOUL_BIN || "soul";
  const base = mkdtempSync(join(tmpdir(), "soul-ts-"));
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("SOUL_") && !k.startsWith("RAY_AUTH")));
  Object.assign(env, { SOUL_DATA_DIR: join(base, "data"), RAY_USAGE_STATS_ENABLED: "0" });
  const rayTmp = env.RAY_TMPDIR ? undefined : mkdtempSync(join(tmpdir(), "rt"));  // short: Ray's socket paths
  if (rayTmp) env.RAY_TMPDIR = rayTmp;
  const key = (tenant) => JSON.parse(execFileSync(soul, ["tenants", "add", tenant, "--json"], { env, encoding: "utf8" })).key;
  const keys = [key("acme"), key("beta")];
  const url = await deadUrl();  // a free port
  const log = join(base, "serve.log");
  // Serve's Python proxy as ingress: HAProxy binds fixed ports of its own that another `soul serve` may hold
  const args = ["serve", "--port", new URL(url).port, "--ingress", "proxy"];
  const out = openSync(log, "w");
  const server = spawn(soul, args, { env, stdio: ["ignore", out, out] });
  let exited = false;
  server.on("exit", () => { exited = true; });
  try {
    for (const t0 = Date.now(); ;) {
      if (exited) throw new Error(`soul serve exited:\n${readFileSync(log, "utf8")}`);
      try {
        if ((await fetch(`${url}/healthz`)).ok) break;
      } catch { /* not up yet */ }
      if (Date.now() - t0 > 300_000) throw new Error(`soul serve did not start:\n${readFileSync(log, "utf8")}`);
      await new Promise((r) => setTimeout(r, 500));
    }
    return await runTests({ ...process.env, SOUL_TEST_URL: url, SOUL_TEST_KEY: keys[0], SOUL_TEST_OTHER_KEY: keys[1] });
  } finally {
    if (!exited) {
      const gone = new Promise((r) => server.on("exit", r));
      process.kill(server.pid, "SIGTERM");
      await Promise.race([gone, new Promise((r) => setTimeout(r, 120_000))]);
      if (!exited) process.kill(server.pid, "SIGKILL");
    }
    try { execFileSync(soul, ["down"], { env, stdio: "ignore" }); } catch { /* nothing left to stop */ }
    rmSync(base, { recursive: true, force: true });
    if (rayTmp) rmSync(rayTmp, { recursive: true, force: true });
  }
}

const given = process.env.SOUL_TEST_URL && process.env.SOUL_TEST_KEY && process.env.SOUL_TEST_OTHER_KEY;
process.exitCode = given ? await runTests(process.env) : await withServer();
