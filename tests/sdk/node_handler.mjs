// A handler service in Node.js (no dependencies): the handler contract without the SDK.
// Run: FERRY_HANDLER_SECRETS='{"billing__from_shop":"s3cret"}' PORT=8080 node handler.mjs
import { createHmac, timingSafeEqual } from "node:crypto";
import { createServer } from "node:http";

const SECRETS = JSON.parse(process.env.FERRY_HANDLER_SECRETS ?? "{}");
const TOLERANCE = 300; // seconds either side of our clock
const applied = new Set(); // a real handler claims in its database, in the effect's transaction

function answer(res, status, body, headers = {}) {
  res.writeHead(status, { "Content-Type": "application/json", ...headers });
  res.end(JSON.stringify(body));
}

function verify(headers, body) {
  const durable = headers["ferry-durable"];
  const stamp = headers["ferry-timestamp"];
  const given = headers["ferry-signature"] ?? "";
  if (!durable || !stamp || !given) return "unsigned request";
  const secret = SECRETS[durable];
  if (secret === undefined) return `no secret for durable ${durable}`;
  if (!/^[0-9]{1,15}$/.test(stamp)) return "Ferry-Timestamp is not Unix seconds";
  if (Math.abs(Date.now() / 1000 - Number(stamp)) > TOLERANCE) return "stale request";
  const mac = createHmac("sha256", secret).update(`${stamp}.${durable}.`).update(body);
  const expected = Buffer.from("v1=" + mac.digest("hex"));
  const actual = Buffer.from(given);
  if (actual.length !== expected.length || !timingSafeEqual(actual, expected)) {
    return "signature does not match the body";
  }
  return null;
}

const routes = {
  "order_paid.v1": (payload) => {
    if (typeof payload.order_id !== "string") throw { reason: "SCHEMA_INVALID", detail: "payload.order_id" };
    // ... apply the effect here, in the same transaction as the claim
  },
};

createServer((req, res) => {
  const chunks = [];
  req.on("data", (chunk) => chunks.push(chunk));
  req.on("end", () => {
    const body = Buffer.concat(chunks); // verify the exact bytes, before parsing
    const refused = verify(req.headers, body);
    if (refused) {
      return answer(res, 401, { error: "unauthenticated", reason_code: "BAD_SIGNATURE", detail: refused, retryable: true });
    }
    let call;
    try {
      call = JSON.parse(body.toString("utf8"));
    } catch {
      return answer(res, 400, { error: "body is not JSON", reason_code: "MALFORMED_JSON", retryable: false });
    }
    if (req.headers["idempotency-key"] !== call.message_id) {
      return answer(res, 400, { error: "Idempotency-Key differs from message_id", reason_code: "IDEMPOTENCY_KEY_MISMATCH", retryable: false });
    }
    const route = routes[`${call.event_type}.v${call.event_version}`];
    if (!route) {
      return answer(res, 422, { error: `unknown event ${call.event_type}.v${call.event_version}`, reason_code: "UNKNOWN_EVENT", retryable: false });
    }
    if (applied.has(call.message_id)) {
      return answer(res, 409, { status: "already_processed", message_id: call.message_id });
    }
    try {
      route(call.payload, call.delivery);
    } catch (err) {
      return answer(res, 422, { error: err.detail, reason_code: err.reason, retryable: false });
    }
    applied.add(call.message_id);
    return answer(res, 200, { status: "processed", message_id: call.message_id });
  });
}).listen(Number(process.env.PORT ?? 8080), "127.0.0.1", () => console.log("listening"));
