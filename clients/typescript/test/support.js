// What the tests share: the real `soul serve` they run against (started by test/run.js or by the Python suite's
// tests/test_typescript_client.py, which pass its URL and two tenants' keys in the environment), fresh soul ids,
// and a fault-injecting HTTP proxy in front of the server.

import http from "node:http";
import { randomUUID } from "node:crypto";

/** The server under test: `{url, key, otherKey}` (two tenants' keys). */
export function service() {
  const url = process.env.SOUL_TEST_URL;
  const key = process.env.SOUL_TEST_KEY;
  const otherKey = process.env.SOUL_TEST_OTHER_KEY;
  if (!url || !key || !otherKey) {
    throw new Error("no server to test against: run `npm test` (it starts `soul serve`), or set SOUL_TEST_URL, " +
      "SOUL_TEST_KEY and SOUL_TEST_OTHER_KEY");
  }
  return { url, key, otherKey };
}

/** A soul id nobody used. */
export function freshSoul(prefix) {
  return `${prefix}-${randomUUID().slice(0, 8)}`;
}

/**
 * An HTTP proxy on 127.0.0.1 in front of `target`. For each request `plan({method, path, headers, body, n})`
 * (`n`: how many requests came before, from 0) says what to do:
 *   "forward"             pass it on and return the answer;
 *   "lose-answer"         pass it on, wait for the server's whole answer, then close the connection without
 *                         answering (the request was applied; the client sees a network error);
 *   "hang"                never answer (until the proxy closes);
 *   {status, headers, body}  answer this without passing it on.
 * `seen` lists every request that came in.
 */
export async function faultProxy(target, plan) {
  const seen = [];
  const upstream = new URL(target);
  const server = http.createServer(async (req, res) => {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const body = Buffer.concat(chunks);
    const info = { method: req.method, path: req.url, headers: req.headers, body: body.toString(), n: seen.length };
    seen.push(info);
    const action = plan(info);
    if (action === "hang") return;
    if (typeof action === "object") {
      res.writeHead(action.status, action.headers ?? {});
      res.end(action.body ?? "");
      return;
    }
    const answer = await new Promise((resolve, reject) => {
      const headers = { ...req.headers, host: upstream.host };
      const up = http.request({ host: upstream.hostname, port: upstream.port, method: req.method, path: req.url, headers },
        async (r) => {
          const parts = [];
          for await (const c of r) parts.push(c);
          resolve({ status: r.statusCode, headers: r.headers, body: Buffer.concat(parts) });
        });
      up.on("error", reject);
      up.end(body);
    });
    if (action === "lose-answer") {
      req.socket.destroy();
      return;
    }
    const headers = { ...answer.headers };
    delete headers["transfer-encoding"];
    delete headers.connection;
    headers["content-length"] = String(answer.body.length);
    res.writeHead(answer.status, headers);
    res.end(answer.body);
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address();
  return {
    url: `http://127.0.0.1:${port}`,
    seen,
    close: () => new Promise((resolve) => { server.closeAllConnections(); server.close(resolve); }),
  };
}

/** A URL where nothing listens. */
export async function deadUrl() {
  const s = http.createServer();
  await new Promise((resolve) => s.listen(0, "127.0.0.1", resolve));
  const { port } = s.address();
  await new Promise((resolve) => s.close(resolve));
  return `http://127.0.0.1:${port}`;
}
