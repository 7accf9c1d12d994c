// A review-webhook receiver written from docs/webhooks.md alone (Node.js 20, no packages).
//
// Usage: RECEIVER_SECRETS="<current> [<previous>]" node receiver.mjs [port]
//   port: argv[2], else RECEIVER_PORT, else 0 (any free port). Listens on 127.0.0.1 and
//   prints the port it got as the first line of stdout.
//   RECEIVER_SECRETS: the secrets this receiver accepts, separated by whitespace (the docs
//   say a secret never holds whitespace), current first. Kept out of argv so `ps` does not
//   show them.
//   RECEIVER_CLOCK_OFFSET_SECONDS: added to this receiver's clock (a receiver whose clock
//   is off, to see the tolerance window from the other side). Default 0.
// POST <any path>: verified as the docs say; 200 when valid, 401 when not.
// GET /log: a JSON list, one record per POST: whether it verified, and why not.
//
// Where docs/webhooks.md was ambiguous or incomplete, and what this receiver assumes:
//  1. Status for every refusal. The docs say "Answer 401 to a bad signature" and
//     "Refuse the request" for a malformed header or a stale `t`, without a status for the
//     latter two. Assumed: 401 for all of them, including a request with no
//     Opledger-Signature at all (the docs never say what an unsigned request should get
//     when the receiver has a secret; it cannot be trusted, so 401).
//  2. Tolerance boundary and clock precision. "more than 5 minutes (300 s) away": a
//     difference of exactly 300 s is accepted. The docs do not say whether "your clock" is
//     read in whole or fractional seconds; this receiver uses milliseconds (fractional),
//     as the Python example does with time.time().
//  3. Item order. The example header starts with `t`, but the docs do not say `t` comes
//     first; items are accepted in any order.
//  4. Whitespace. "joined by `,`, with no spaces": nothing is trimmed, so ` v1=...` has
//     the key " v1" and is ignored as an unknown key (the Python example does the same).
//  5. Items without `=` and empty items (a trailing comma): not named by the docs; treated
//     as an item with another key and ignored. An item is split at its first `=`.
//  6. Repeated `t` items make the header malformed ("exactly one `t`"), even if identical.
//     Repeated Opledger-Signature header lines are not mentioned; Node would join them with
//     ", " (a space the format forbids), so more than one line is refused as malformed.
//  7. "made of digits": read as one or more ASCII 0-9 (no sign, no spaces); leading zeros
//     are allowed and the signed string keeps `t` exactly as sent. A value too large to
//     be a real time is simply outside the window.
//  8. `v1` case and length. The sender writes 64 lowercase hex characters; a `v1` in
//     upper case or of another length never matches (compared as the hex text, as the
//     docs say: "compare its hex form"). Node's timingSafeEqual needs equal lengths, so a
//     wrong-length `v1` is a non-match without comparing (its length is not a secret).
//  9. The secret's bytes: "printable ASCII", so its UTF-8 bytes are its ASCII bytes. A
//     configured secret that is not 32+ printable non-space ASCII characters is refused at
//     start (the docs give that rule for opledger's own settings).
// 10. Idempotency-Key is not covered by the signature (only `t`, `.` and the body are).
//     The docs say to deduplicate on it but do not say what to answer to a duplicate.
//     Assumed: dedupe only after verification, and answer a verified duplicate with the
//     first answer (200), recording it as a duplicate. A missing Idempotency-Key on a
//     verified request is accepted (the docs do not make it mandatory) and not deduplicated.
// 11. The docs say the body is canonical JSON but not what to do with a verified body that
//     is not JSON; this receiver answers 400 (never expected from opledger). Content-Type
//     is not part of the check. The body size is not bounded by the docs: 1 MiB here (413).
// 12. Which 2xx: not said; 200.
// 13. Any path and only POST: the docs show "POST /your/path"; other methods get 405,
//     except GET /log.

import { createHmac, timingSafeEqual } from "node:crypto";
import { createServer } from "node:http";

const TOLERANCE_SECONDS = 300;
const MAX_BODY_BYTES = 1 << 20;

function fail(message) {
  process.stderr.write(`receiver: ${message}\n`);
  process.exit(2);
}

function readSecrets() {
  const raw = process.env.RECEIVER_SECRETS ?? "";
  const secrets = raw.split(/\s+/).filter((s) => s.length > 0);
  if (secrets.length === 0) fail("RECEIVER_SECRETS is not set: a receiver needs a secret");
  secrets.forEach((secret, index) => {
    if (secret.length < 32 || !/^[\x21-\x7e]+$/.test(secret)) {
      fail(`RECEIVER_SECRETS item ${index + 1} is not 32+ printable ASCII characters`);
    }
  });
  return secrets.map((secret) => Buffer.from(secret, "ascii"));
}

function readOffset() {
  const raw = process.env.RECEIVER_CLOCK_OFFSET_SECONDS ?? "0";
  const offset = Number(raw);
  if (!/^-?[0-9]+(\.[0-9]+)?$/.test(raw) || !Number.isFinite(offset)) {
    fail("RECEIVER_CLOCK_OFFSET_SECONDS is not a number of seconds");
  }
  return offset;
}

class Refusal extends Error {}

/** The header's `t` (as sent) and its `v1` values, or a Refusal (docs step 1). */
function parseHeader(value) {
  const stamps = [];
  const macs = [];
  for (const item of value.split(",")) {
    const at = item.indexOf("=");
    if (at < 0) continue;
    const key = item.slice(0, at);
    if (key === "t") stamps.push(item.slice(at + 1));
    else if (key === "v1") macs.push(item.slice(at + 1));
  }
  if (stamps.length !== 1) throw new Refusal(`malformed header: ${stamps.length} t items`);
  if (!/^[0-9]+$/.test(stamps[0])) throw new Refusal("malformed header: t is not digits");
  if (macs.length === 0) throw new Refusal("malformed header: no v1 item");
  return { t: stamps[0], macs };
}

/** The index of the accepted secret that signed this request, or a Refusal (steps 1-3). */
function verify(body, headerValues, secrets, nowSeconds) {
  if (headerValues === undefined || headerValues.length === 0) {
    throw new Refusal("unsigned: no Opledger-Signature header");
  }
  if (headerValues.length > 1) throw new Refusal("malformed header: sent more than once");
  const { t, macs } = parseHeader(headerValues[0]);
  const skew = nowSeconds - Number(t);
  if (!(Math.abs(skew) <= TOLERANCE_SECONDS)) {
    throw new Refusal(`stale: t is ${Math.round(skew)} s away from this clock`);
  }
  const signed = Buffer.concat([Buffer.from(t, "ascii"), Buffer.from("."), body]);
  for (const [index, secret] of secrets.entries()) {
    const expected = Buffer.from(createHmac("sha256", secret).update(signed).digest("hex"));
    for (const mac of macs) {
      const candidate = Buffer.from(mac);
      if (candidate.length === expected.length && timingSafeEqual(expected, candidate)) {
        return index;
      }
    }
  }
  throw new Refusal("bad signature: no v1 matches a secret this receiver accepts");
}

const secrets = readSecrets();
const offset = readOffset();
const log = [];
const answered = new Map(); // Idempotency-Key -> first answer's status

function answer(response, status, payload) {
  const text = JSON.stringify(payload);
  response.writeHead(status, { "Content-Type": "application/json" });
  response.end(text);
}

function receive(request, response, body) {
  const key = request.headers["idempotency-key"] ?? null;
  const record = { path: request.url, idempotency_key: key, verified: false, reason: null };
  log.push(record);
  let secretIndex;
  try {
    secretIndex = verify(
      body,
      request.headersDistinct["opledger-signature"],
      secrets,
      Date.now() / 1000 + offset,
    );
  } catch (error) {
    if (!(error instanceof Refusal)) throw error;
    record.reason = error.message;
    record.status = 401;
    answer(response, 401, { error: error.message });
    return;
  }
  record.verified = true;
  record.secret_index = secretIndex;
  if (key !== null && answered.has(key)) {
    record.duplicate = true;
    record.status = answered.get(key);
    answer(response, record.status, { duplicate: true });
    return;
  }
  let status = 200;
  try {
    record.event = JSON.parse(body.toString("utf8")).event ?? null;
  } catch {
    record.reason = "verified, but the body is not JSON";
    status = 400;
  }
  record.duplicate = false;
  record.status = status;
  if (key !== null) answered.set(key, status);
  answer(response, status, status === 200 ? { received: true } : { error: record.reason });
}

const server = createServer((request, response) => {
  if (request.method === "GET" && request.url === "/log") {
    answer(response, 200, log);
    return;
  }
  if (request.method !== "POST") {
    answer(response, 405, { error: "POST only" });
    return;
  }
  const chunks = [];
  let size = 0;
  let tooLarge = false;
  request.on("data", (chunk) => {
    size += chunk.length;
    if (size > MAX_BODY_BYTES) tooLarge = true;
    else chunks.push(chunk);
  });
  request.on("end", () => {
    if (tooLarge) {
      log.push({ path: request.url, verified: false, reason: "body too large", status: 413 });
      answer(response, 413, { error: "body too large" });
      return;
    }
    receive(request, response, Buffer.concat(chunks));
  });
});

const requestedPort = Number(process.argv[2] ?? process.env.RECEIVER_PORT ?? "0");
if (!Number.isInteger(requestedPort) || requestedPort < 0 || requestedPort > 65535) {
  fail("the port must be an integer from 0 to 65535");
}
server.listen(requestedPort, "127.0.0.1", () => {
  process.stdout.write(`${server.address().port}\n`);
});
for (const signal of ["SIGTERM", "SIGINT"]) {
  process.on(signal, () => {
    server.closeAllConnections();
    server.close(() => process.exit(0));
  });
}
