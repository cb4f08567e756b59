// An orders service in Node.js that gets txbroker's guarantee over its HTTP API alone: no
// txbroker code, only `pg` and Node's own http and crypto (docs/http-api.md, "The flow for a
// service in any language"; docs/checkback.md for the check-back endpoint).
//
//   POST /orders      {"order_id", "amount"}: the order row and its barrier row in one local
//                     transaction, between a prepare and a commit of the message
//   POST /txb/check   the broker's back-check: the signature verified, the answer from the
//                     barrier table with the fencing insert the Python SDK runs
//
// Settings, from the environment: TXB_URL (the broker's HTTP base), TXB_TOKEN (optional),
// TXB_TOPIC, TXB_GROUP, TXB_SECRET (the group's check-back secret), TXB_TX_TIMEOUT_MS (before
// the first back-check), DATABASE_URL (PostgreSQL, migrated by `txbroker db upgrade`), PORT.
// TXB_PAUSE_AT (before-barrier | before-local-commit | after-local-commit) stops an order at
// that point and prints "PAUSED <point> <tx_id>" until a line on stdin: the test kills the
// process there, or lets it go on.
"use strict";

const crypto = require("node:crypto");
const http = require("node:http");
const readline = require("node:readline");
const { Pool } = require("pg");

const env = (name, fallback) => {
  const value = process.env[name] ?? fallback;
  if (value === undefined) throw new Error(`${name} is not set`);
  return value;
};
const BROKER = env("TXB_URL").replace(/\/$/, "");
const TOKEN = process.env.TXB_TOKEN || "";
const TOPIC = env("TXB_TOPIC", "orders");
const GROUP = env("TXB_GROUP", "orders-svc");
const SECRET = env("TXB_SECRET");
const TX_TIMEOUT_MS = Number(env("TXB_TX_TIMEOUT_MS", "6000"));
const PORT = Number(env("PORT"));
const PAUSE_AT = process.env.TXB_PAUSE_AT || "";
const CHECK_PATH = "/txb/check";
const CHECK_URL = `http://127.0.0.1:${PORT}${CHECK_PATH}`;
// The check-back contract's bounds (docs/checkback.md): a check request is far below 64 KiB,
// and a timestamp more than five minutes off either way is refused.
const CHECK_BODY_MAX = 64 * 1024;
const MAX_SKEW_MS = 5 * 60 * 1000;
const UNIQUE_VIOLATION = "23505"; // PostgreSQL's SQLSTATE for a duplicate key

const pool = new Pool({ connectionString: env("DATABASE_URL"), max: 8 });

// --- the barrier: the same statements as txbroker_sdk.barrier, in PostgreSQL's dialect ---

// In the business transaction, before its commit. A back-check that answered ROLLBACK first
// holds the key: this insert then fails, and the order rolls back, as the broker was told.
const RECORD_COMMIT =
  "INSERT INTO txb_local_tx (tx_id, state, topic, key) VALUES ($1, 'committed', $2, $3)";
// A back-check's fencing insert: its row wins unless the business transaction's is there (an
// open business transaction holding the key makes it wait for that one's outcome).
const FENCE =
  "INSERT INTO txb_local_tx (tx_id, state, topic, key) VALUES ($1, 'rolled_back', $2, $3) " +
  "ON CONFLICT (tx_id) DO NOTHING";
const STATE = "SELECT state FROM txb_local_tx WHERE tx_id = $1";

async function inTransaction(work) {
  const client = await pool.connect();
  try {
    await client.query("BEGIN");
    const out = await work(client);
    await client.query("COMMIT");
    return out;
  } catch (e) {
    await client.query("ROLLBACK").catch(() => {});
    throw e;
  } finally {
    client.release();
  }
}

async function resolveCheck(check) {
  return inTransaction(async (db) => {
    const fenced = await db.query(FENCE, [check.tx_id, check.topic, check.key ?? null]);
    if (fenced.rowCount === 1) return "ROLLBACK"; // no local commit: none may come now
    const { rows } = await db.query(STATE, [check.tx_id]);
    return rows[0]?.state === "committed" ? "COMMIT" : "ROLLBACK";
  });
}

// --- the broker's HTTP API ---

class BrokerError extends Error {
  constructor(status, problem) {
    super(`${status} ${problem.code ?? ""}: ${problem.detail ?? JSON.stringify(problem)}`);
    this.status = status;
    this.problem = problem;
  }
}

async function broker(method, path, body) {
  const headers = { "content-type": "application/json" };
  if (TOKEN) headers.authorization = `Bearer ${TOKEN}`;
  const res = await fetch(BROKER + path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const answer = await res.json();
  if (!res.ok) throw new BrokerError(res.status, answer);
  return answer;
}

// --- test hooks ---

const stdin = readline.createInterface({ input: process.stdin });
const goOn = [];
stdin.on("line", () => goOn.shift()?.());

async function pause(point, txId) {
  if (PAUSE_AT !== point) return;
  console.log(`PAUSED ${point} ${txId}`);
  await new Promise((resolve) => goOn.push(resolve));
}

// --- placing an order: both or neither ---

async function placeOrder(order) {
  const txId = crypto.randomUUID().replaceAll("-", "");
  const client = await pool.connect();
  let prepared = false;
  try {
    await client.query("BEGIN");
    await client.query("INSERT INTO orders (order_id, amount, tx_id) VALUES ($1, $2, $3)", [
      order.order_id,
      order.amount,
      txId,
    ]);
    // The tx_id is ours, so the barrier row below can name it before the broker answers.
    await broker("POST", "/v1/transactions", {
      topic: TOPIC,
      body: JSON.stringify(order),
      key: order.order_id,
      producer_group: GROUP,
      check_url: CHECK_URL,
      tx_id: txId,
      timeout_ms: TX_TIMEOUT_MS,
    });
    prepared = true;
    await pause("before-barrier", txId);
    try {
      await client.query(RECORD_COMMIT, [txId, TOPIC, order.order_id]);
    } catch (e) {
      if (e.code === UNIQUE_VIOLATION) {
        throw Object.assign(new Error(`transaction ${txId} was rolled back by a back-check`), {
          fenced: true,
        });
      }
      throw e;
    }
    await pause("before-local-commit", txId);
    await client.query("COMMIT");
  } catch (e) {
    await client.query("ROLLBACK").catch(() => {});
    client.release();
    if (prepared) {
      // Best effort: if it fails, the back-check finds no committed barrier row and rolls back.
      await broker("POST", `/v1/transactions/${txId}/rollback`).catch(() => {});
    }
    throw Object.assign(e, { txId });
  }
  client.release();
  await pause("after-local-commit", txId);
  // Committed locally: the message must follow. If this call is lost, the back-check commits.
  const ended = await broker("POST", `/v1/transactions/${txId}/commit`);
  return { tx_id: txId, state: ended.state };
}

// --- the HTTP server ---

function readBody(req, max) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    req.on("data", (chunk) => {
      size += chunk.length;
      if (size > max) {
        reject(Object.assign(new Error("body too large"), { status: 413 }));
        req.destroy();
        return;
      }
      chunks.push(chunk);
    });
    req.on("end", () => resolve(Buffer.concat(chunks)));
    req.on("error", reject);
  });
}

function send(res, status, body) {
  res.writeHead(status, { "content-type": "application/json" });
  res.end(JSON.stringify(body));
}

function verified(req, raw) {
  const ts = req.headers["x-txb-timestamp"];
  const sig = req.headers["x-txb-signature"];
  if (!ts || !sig) return "X-Txb-Timestamp and X-Txb-Signature are required";
  if (!/^\d+$/.test(ts) || Math.abs(Date.now() - Number(ts)) > MAX_SKEW_MS) {
    return "stale or malformed timestamp";
  }
  // hex(HMAC-SHA256(secret, "<timestamp>." + body)), over the exact bytes received.
  const mac = crypto.createHmac("sha256", SECRET);
  mac.update(`${ts}.`);
  mac.update(raw);
  const expected = Buffer.from(mac.digest("hex"));
  const given = Buffer.from(String(sig).trim().toLowerCase());
  if (given.length !== expected.length || !crypto.timingSafeEqual(given, expected)) {
    return "bad signature";
  }
  return null;
}

async function check(req, res) {
  const raw = await readBody(req, CHECK_BODY_MAX);
  let body;
  try {
    body = JSON.parse(raw.toString("utf8"));
  } catch {
    return send(res, 400, { error: "the body is not JSON" });
  }
  if (typeof body?.tx_id !== "string" || typeof body?.topic !== "string") {
    return send(res, 400, { error: "not a check request" });
  }
  if (body.producer_group !== GROUP) return send(res, 401, { error: "unknown producer group" });
  const refused = verified(req, raw);
  if (refused) return send(res, 401, { error: refused });
  const status = await resolveCheck(body);
  console.error(`check ${body.tx_id} (count ${body.check_count}): ${status}`);
  return send(res, 200, { status });
}

async function order(req, res) {
  const body = JSON.parse((await readBody(req, CHECK_BODY_MAX)).toString("utf8"));
  try {
    return send(res, 201, await placeOrder(body));
  } catch (e) {
    const status = e.fenced ? 409 : 500;
    return send(res, status, { error: e.message, tx_id: e.txId });
  }
}

const server = http.createServer((req, res) => {
  const route =
    req.method === "POST" && req.url === CHECK_PATH
      ? check
      : req.method === "POST" && req.url === "/orders"
        ? order
        : null;
  if (route === null) return send(res, 404, { error: `no ${req.method} ${req.url}` });
  route(req, res).catch((e) => {
    console.error(`${req.method} ${req.url} failed:`, e);
    if (!res.headersSent) send(res, e.status ?? 500, { error: String(e.message ?? e) });
  });
});

async function main() {
  // The service's own table; the barrier table is txbroker's (`txbroker db upgrade`).
  await pool.query(
    "CREATE TABLE IF NOT EXISTS orders (order_id text PRIMARY KEY, amount integer NOT NULL, " +
      "tx_id text NOT NULL)",
  );
  await pool.query("SELECT 1 FROM txb_local_tx LIMIT 1"); // migrated, or fail at start
  server.listen(PORT, "127.0.0.1", () => console.log(`READY ${PORT}`));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
