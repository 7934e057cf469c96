// Degraded mode under load, end to end: agents call a scripted provider
// through the openai SDK wrapper (every call fails twice with 503, then
// succeeds), one RetrydClient shared by all, while retryd is killed
// (SIGKILL) mid-run and restarted on the same address and state directory.
// No agent call may fail for want of a decision; while retryd is down the
// retries stay within the local cap; after the restart the decisions are
// the server's again. The counts are printed as test diagnostics.

import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { setTimeout as delay } from "node:timers/promises";
import OpenAI from "openai";
import { BasicTracerProvider, InMemorySpanExporter, type ReadableSpan, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import { RetrydClient } from "../src/client.js";
import { withRetryd } from "../src/openai.js";
import { FakeProvider } from "./fakeprovider.js";
import { startRetryd, type RetrydServer } from "./server.js";

const AGENTS = 16;
const CALLS = 12;
const MAX_RETRIES = 4;

test("agents through the middleware keep working across a SIGKILL and restart of retryd", { timeout: 240_000 }, async (t) => {
  const dir = mkdtempSync(join(tmpdir(), "retryd-ts-load-"));
  const args = ["--store", `file:${dir}`];
  let server: RetrydServer = await startRetryd(...args);
  const addr = server.addr;
  const fake = new FakeProvider();
  const counts = new Map<string, number>();
  fake.responder = (model) => {
    const n = (counts.get(model) ?? 0) + 1;
    counts.set(model, n);
    return n % 3 === 0
      ? { kind: "complete", text: "ok" }
      : { kind: "error", status: 503, body: { error: { message: "unavailable", type: "server_error" } } };
  };
  const baseURL = await fake.listen();
  const exporter = new InMemorySpanExporter();
  const client = new RetrydClient(addr, {
    insecure: true,
    retry: { maxAttempts: 2, initialBackoffMs: 20 },
    degraded: { answerTimeoutMs: 1000, awaitGraceMs: 200 },
    reattachInitialMs: 20,
    reattachMaxMs: 100,
    tracerProvider: new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }),
  });
  const policy = { maxRetries: MAX_RETRIES, backoff: { initialDelayMs: 20n, maxDelayMs: 1000n, jitterRatio: 0 } };
  let failedCalls = 0;
  let calls = 0;
  let restartedAt = 0;
  // Each agent makes CALLS calls, and goes on until it has begun two after
  // the restart: on a fast machine the calls would otherwise all end while
  // retryd is down, and nothing would show the server deciding again.
  const agent = async (i: number) => {
    const openai = withRetryd(new OpenAI({ baseURL, apiKey: "test" }), { client, provider: "openai", policy, sessionId: `load-${i}` });
    let afterRestart = 0;
    for (let c = 0; c < CALLS || afterRestart < 2; c++) {
      if (restartedAt !== 0) afterRestart++;
      calls++;
      try {
        const out = await openai.chat.completions.create({ model: `agent-${i}`, messages: [{ role: "user", content: `call ${c}` }] });
        assert.equal(out.choices[0]?.message.content, "ok");
      } catch (err) {
        failedCalls++;
        t.diagnostic(`agent ${i} call ${c} failed: ${String(err)}`);
      }
      await delay(30);
    }
  };
  try {
    const run = Promise.all(Array.from({ length: AGENTS }, (_, i) => agent(i)));
    await delay(700);
    await server.kill();
    const killedAt = Date.now();
    await delay(1500);
    const atKill = client.stats();
    server = await startRetryd(...args, "--listen", addr);
    restartedAt = Date.now();
    await run;
    const stats = client.stats();
    const spans = exporter.getFinishedSpans().filter((s) => s.name === "retryd.recover");
    const local = spans.filter((s) => s.attributes["retryd.decision.local"] === true);
    const maxLocalRetry = Math.max(0, ...local.map((s) => Number(s.attributes["retryd.retry.number"] ?? 0)));
    // A span's start is [seconds, nanoseconds]: both count, or every span
    // begun in the restart's second would be taken for one begun before it.
    const startMs = (s: ReadableSpan) => s.startTime[0] * 1000 + s.startTime[1] / 1e6;
    const afterRestart = spans.filter((s) => s.attributes["retryd.decision.local"] === false && startMs(s) >= restartedAt);
    t.diagnostic(
      `${AGENTS} agents, ${calls} calls: ${fake.received.length} provider attempts, ${failedCalls} failed calls; ` +
        `retryd down ${restartedAt - killedAt} ms; decisions: ${stats.serverDecisions} server (${afterRestart.length} after the restart), ` +
        `${stats.localDecisions} local (${atKill.localDecisions} in the first 1.5 s down), ${stats.localStarts} local starts, ` +
        `${stats.pendingResolved} RETRY_PENDING resolved, ${stats.localSuccesses} local successes; largest local retry number ${maxLocalRetry}`,
    );
    const down = spans.filter((s) => startMs(s) >= killedAt && startMs(s) < restartedAt);
    t.diagnostic(
      `recover calls begun while retryd was down: ${down.length}; their durations (ms): ` +
        down.map((s) => `${s.attributes["retryd.decision.local"] === true ? "L" : "S"}${Math.round(s.duration[0] * 1000 + s.duration[1] / 1e6)}`).join(" "),
    );
    assert.equal(failedCalls, 0, "an agent call failed");
    assert.equal(fake.received.length, calls * 3, "every call took two retries");
    assert.ok(atKill.localDecisions > 0, "no local decision while retryd was down");
    assert.ok(maxLocalRetry <= MAX_RETRIES, `a local chain went past the cap: ${maxLocalRetry}`);
    assert.ok(afterRestart.length > 0, "no server decision after the restart");
    // The restarted server's log (the file store keeps it) is clean.
    t.diagnostic(await server.verify());
  } finally {
    client.close();
    await fake.close();
    await server.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});
