// Drives a real agentrun server with Mastra's published client (@mastra/client-js, pinned in
// package.json) exactly as a Mastra user would: apiPrefix "/api/mastra", a Bearer token, the demo
// `support-agent` on the offline `directive` model. Prints one JSON report on stdout for
// tests/compat/test_real_clients.py to check; any exception exits non-zero.
//
// Environment: BASE_URL (http://127.0.0.1:<port>), TOKEN (an API token), THREAD (a fresh thread id).

import { MastraClient, MastraClientError } from "@mastra/client-js";

const { BASE_URL, TOKEN, THREAD } = process.env;
const client = new MastraClient({
  baseUrl: BASE_URL,
  apiPrefix: "/api/mastra",
  headers: { Authorization: `Bearer ${TOKEN}` },
  retries: 0,
});
const agent = client.getAgent("support-agent");
const memory = { thread: THREAD, resource: "customer-1" };

// The client parses every stream a second time to build its message list and reports what it cannot
// make sense of (a tool-result without its tool-call, say) on console.error: collect those.
const clientErrors = [];
const consoleError = console.error;
console.error = (...args) => {
  clientErrors.push(args.map(String).join(" "));
  consoleError(...args);
};

const tool = (id, args) => `/tool ${id} ${JSON.stringify(args)}`;

async function chunksOf(response) {
  const chunks = [];
  await response.processDataStream({
    onChunk: async (chunk) => {
      chunks.push(chunk);
    },
  });
  return chunks;
}

const summary = (chunks) => ({
  types: chunks.map((c) => c.type),
  runId: chunks[0]?.runId,
  text: chunks.filter((c) => c.type === "text-delta").map((c) => c.payload.text).join(""),
  finishReason: chunks.findLast((c) => c.type === "finish")?.payload.stepResult?.reason,
  results: chunks.filter((c) => c.type === "tool-result").map((c) => c.payload.result),
  denied: chunks.filter((c) => c.type === "tool-output-denied").map((c) => c.payload.approval),
});

async function suspend(message) {
  const chunks = await chunksOf(await agent.stream(message, { memory }));
  const open = chunks.find((c) => c.type === "tool-call-approval" || c.type === "tool-call-suspended");
  return { ...summary(chunks), toolCallId: open.payload.toolCallId, suspendPayload: open.payload.suspendPayload };
}

async function errorOf(promise) {
  try {
    await promise;
  } catch (error) {
    if (error instanceof MastraClientError) return { status: error.status, body: error.body };
    throw error;
  }
  return null;
}

const report = {};

const agents = await client.listAgents();
report.agents = Object.keys(agents).sort();
report.details = await agent.details();

// Start three runs that wait for people: an approval, an approval to decline, an ask-user.
report.email = await suspend(tool("send-email", { to: "ann@example.com", subject: "Refund", body: "Done." }));
report.delete = await suspend(tool("delete-record", { table: "customers", id: 7 }));
report.ask = await suspend(tool("ask-user", { question: "Which city?" }));

report.listed = await agent.listSuspendedRuns({ threadId: THREAD });
report.listedPage = await agent.listSuspendedRuns({ threadId: THREAD, perPage: 1, page: 0 });

report.approved = summary(
  await chunksOf(await agent.approveToolCall({ runId: report.email.runId, toolCallId: report.email.toolCallId })),
);
report.declined = summary(
  await chunksOf(
    await agent.declineToolCall({
      runId: report.delete.runId,
      toolCallId: report.delete.toolCallId,
      reason: "Not this customer",
    }),
  ),
);
report.resumed = summary(
  await chunksOf(
    await agent.resumeStream({ answer: "Paris" }, { runId: report.ask.runId, toolCallId: report.ask.toolCallId, memory }),
  ),
);
report.listedAfter = await agent.listSuspendedRuns({ threadId: THREAD });

// Deciding twice: the second answer is the contract's 409.
report.approveTwice = await errorOf(
  agent.approveToolCall({ runId: report.email.runId, toolCallId: report.email.toolCallId }),
);

// A plain stream, a stream until idle, and a replay of the first run from its start.
report.streamed = summary(await chunksOf(await agent.stream("hello from mastra", { memory })));
report.untilIdle = summary(await chunksOf(await agent.streamUntilIdle("still there", { memory })));
report.observed = summary(await chunksOf(await agent.observe({ runId: report.email.runId, offset: 0 })));

// The non-streaming decision.
const generated = await suspend(tool("send-email", { to: "bob@example.com", subject: "Hi", body: "Hello." }));
report.generated = await agent.approveToolCallGenerate({ runId: generated.runId, toolCallId: generated.toolCallId });

report.clientErrors = clientErrors;
process.stdout.write(JSON.stringify(report));
