// An MCP host as TypeScript hosts are written (the official TypeScript SDK,
// @modelcontextprotocol/sdk): one tool call through the opledger gateway, followed until
// it settles. It shows where a call's run goes (`_meta`, next to `name` and `arguments`),
// that a refusal is a result with `isError: true` (not a thrown error), which answers are
// final, and what to do when the gateway is gone (ask again, the same call, the same run).
//
//   npm install @modelcontextprotocol/sdk
//   OPLEDGER_MCP_TOKEN=<the token> node mcp_host.mjs --url http://127.0.0.1:8765/mcp \
//       --run onboarding-42 --tool crm_update_case_v1 --target case-318 \
//       --payload '{"fields": {"status": "resolved"}}'
//
// Over stdio (--stdio), everything after -- is the server's command line. The TypeScript SDK's
// StdioClientTransport gives the server only HOME, LOGNAME, PATH, SHELL, TERM and USER
// unless told otherwise: this host passes on its OPLEDGER_* (and OTEL_*,
// PROMETHEUS_MULTIPROC_DIR) variables explicitly.
//
//   node mcp_host.mjs --tool ... --stdio -- opledger mcp serve --transport stdio
//
// Leave --run out when the client's run mode is `token` (the gateway derives the run) or
// pass --run-argument for a client of the `argument` mode. Prints each answer (its
// structured content) as one JSON line. Exit codes: 0 an answer (see docs/mcp.md),
// 1 refused: the call (nothing was written) or a status poll (the call was recorded: its
// op_id is on an earlier line, and it is not settled as far as this host knows), 3 the
// gateway was not reached or died mid-call, 4 the host's own request timeout ran out.
// After 3 or 4, ask again: the same call, the same run.

import { parseArgs } from "node:util";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { StdioClientTransport, getDefaultEnvironment } from "@modelcontextprotocol/sdk/client/stdio.js";
import { ErrorCode, McpError } from "@modelcontextprotocol/sdk/types.js";

const RUN_META = "opledger/run";
const STATUS_TOOL = "opledger_status";

const { values: opts, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    url: { type: "string", default: process.env.OPLEDGER_MCP_URL ?? "http://127.0.0.1:8765/mcp" },
    stdio: { type: "boolean", default: false },
    run: { type: "string" },
    "run-argument": { type: "boolean", default: false },
    tool: { type: "string" },
    target: { type: "string" },
    payload: { type: "string", default: "{}" },
    "timeout-ms": { type: "string", default: "60000" },
    polls: { type: "string", default: "30" },
  },
});

function transport() {
  const token = process.env.OPLEDGER_MCP_TOKEN;
  if (!token) throw new Error("set OPLEDGER_MCP_TOKEN to the agent's token (opledger mcp token)");
  if (opts.stdio) {
    const env = { ...getDefaultEnvironment() };
    for (const [name, value] of Object.entries(process.env)) {
      if (/^(OPLEDGER_|OTEL_)/.test(name) || name === "PROMETHEUS_MULTIPROC_DIR") env[name] = value;
    }
    const [command, ...args] = positionals;
    return new StdioClientTransport({ command, args, env, stderr: "inherit" });
  }
  return new StreamableHTTPClientTransport(new URL(opts.url), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  });
}

// Final for the host: confirmed, rejected, cancelled, and unknown once a review is open (a
// person decides). pending, and unknown before a review opens, are not: ask opledger_status.
function settled(answer) {
  return answer.kind !== "pending" && !(answer.kind === "unknown" && !answer.review_id);
}

async function main() {
  const timeout = Number(opts["timeout-ms"]);
  const client = new Client({ name: "opledger-example-host", version: "1.0.0" });
  await client.connect(transport(), { timeout });
  try {
    const args = { target: opts.target, payload: JSON.parse(opts.payload) };
    if (opts["run-argument"]) args.run = opts.run; // the `argument` run mode
    const call = { name: opts.tool, arguments: args };
    if (opts.run && !opts["run-argument"]) call._meta = { [RUN_META]: opts.run };
    let result = await client.callTool(call, undefined, { timeout });
    let answer = { tool: opts.tool, isError: Boolean(result.isError), ...result.structuredContent };
    console.log(JSON.stringify(answer));
    if (result.isError) return 1; // refused: nothing was written; fix the call, do not retry it
    for (let n = Number(opts.polls); n > 0 && !settled(answer); n--) {
      result = await client.callTool(
        { name: STATUS_TOOL, arguments: { op_id: answer.op_id, wait: 20 } },
        undefined,
        { timeout },
      );
      answer = { tool: STATUS_TOOL, isError: Boolean(result.isError), ...result.structuredContent };
      console.log(JSON.stringify(answer));
      if (result.isError) return 1; // the poll was refused: the call's answer is not known here
    }
    return 0;
  } finally {
    await client.close();
  }
}

main().then(
  (code) => process.exit(code),
  (error) => {
    const timedOut = error instanceof McpError && error.code === ErrorCode.RequestTimeout;
    const failure = { error: timedOut ? "timeout" : "transport", message: String(error?.message ?? error) };
    console.log(JSON.stringify(failure));
    process.exit(timedOut ? 4 : 3);
  },
);
