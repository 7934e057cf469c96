// Degraded mode against a real retryd that is killed (SIGKILL) and
// restarted on the same address and state directory: local decisions while
// it is down (marked in the outcome, the event, the span and the counts),
// the local cap, fail-closed, a server-scheduled retry whose await cannot
// re-attach, the RETRY_PENDING answer for it after the restart, and server
// decisions again once a replica answers.

import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer, type AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { setTimeout as delay } from "node:timers/promises";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import { CancelReason, DelaySource, DelegateReason, Downstream } from "../src/gen/retryd/v1/events_pb.js";
import { Mode } from "../src/gen/retryd/v1/policy_pb.js";
import { RetryStatus } from "../src/gen/retryd/v1/retry_service_pb.js";
import { RecoverAbortedError, RetrydClient, RetrydUnreachableError, type FailedStepInit, type Outcome } from "../src/client.js";
import { isLocal, LOCAL_DETAIL_PREFIX, type RetryPolicyInit } from "../src/local.js";
import { startRetryd, type RetrydServer } from "./server.js";

function report(
  sessionId: string,
  turn: number,
  step: number,
  delayMs: number,
  extra: { policy?: RetryPolicyInit; downstream?: Downstream } = {},
): FailedStepInit {
  return {
    sessionId,
    turn: BigInt(turn),
    step: BigInt(step),
    provider: "anthropic",
    failure: { code: "RATE_LIMIT", httpStatus: 429 },
    policySource: {
      case: "policy",
      value: extra.policy ?? { maxRetries: 5, backoff: { initialDelayMs: BigInt(delayMs), maxDelayMs: 60_000n, jitterRatio: 0 } },
    },
    downstream: extra.downstream ?? Downstream.UNSPECIFIED,
  };
}

function summary(o: Outcome): string {
  switch (o.kind) {
    case "retry":
      return `retry ${o.schedule.retryNumber} after ${o.schedule.delayMs} ms${o.local ? " (local)" : ""}${o.localStart ? " (local start)" : ""}`;
    case "delegate":
      return `delegate ${DelegateReason[o.delegate.reason]}${o.local ? " (local)" : ""}`;
    case "cancelled":
      return "cancelled";
  }
}

test("degraded mode across a SIGKILL and a restart of retryd", { timeout: 180_000 }, async (t) => {
  const dir = mkdtempSync(join(tmpdir(), "retryd-ts-degraded-"));
  const args = ["--store", `file:${dir}`];
  let server: RetrydServer = await startRetryd(...args);
  const addr = server.addr;
  const restart = async () => {
    server = await startRetryd(...args, "--listen", addr);
  };
  const exporter = new InMemorySpanExporter();
  const tracerProvider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  const client = new RetrydClient(addr, {
    insecure: true,
    retry: { maxAttempts: 2, initialBackoffMs: 20 },
    reattachInitialMs: 20,
    reattachMaxMs: 100,
    degraded: { answerTimeoutMs: 2000, awaitGraceMs: 300, retryBudget: 3 },
    tracerProvider,
  });
  const failClosed = new RetrydClient(addr, { insecure: true, retry: false, degraded: { failClosed: true } });
  const signal = () => ({ signal: AbortSignal.timeout(30_000) });
  try {
    // Up: the server decides.
    const first = await client.recover(report("deg-a", 1, 1, 20), signal());
    assert.equal(summary(first), "retry 1 after 20 ms");
    assert.ok(!isLocal(first.event) && first.event.sequence > 0n);

    // Down (SIGKILL): decisions continue locally, from the chain's count.
    await server.kill();
    const began = Date.now();
    const local = await client.recover(report("deg-a", 1, 2, 20), signal());
    t.diagnostic(`local decision while down: ${summary(local)} in ${Date.now() - began} ms`);
    assert.equal(summary(local), "retry 2 after 40 ms (local)");
    assert.ok(local.kind === "retry");
    assert.ok(isLocal(local.event), "the event is marked local");
    assert.equal(local.event.sequence, 0n);
    assert.ok(local.event.kind.case === "scheduled" && local.event.kind.value.detail.startsWith(LOCAL_DETAIL_PREFIX));
    assert.equal(local.started.retryId, local.schedule.retryId);
    assert.equal(local.schedule.delaySource, DelaySource.BACKOFF);

    // The local cap: an unlimited policy takes at most retryBudget (3) retries locally.
    const always = { mode: Mode.ALWAYS, backoff: { initialDelayMs: 10n, jitterRatio: 0 } };
    const capped: string[] = [];
    for (let step = 1; step <= 4; step++) {
      const o = await client.recover(report("deg-b", 1, step, 10, { policy: always, downstream: Downstream.DECLINED }), signal());
      capped.push(summary(o));
    }
    assert.deepEqual(capped, [
      "retry 1 after 10 ms (local)",
      "retry 2 after 20 ms (local)",
      "retry 3 after 40 ms (local)",
      "delegate BUDGET_EXHAUSTED (local)",
    ]);

    // Fail closed: an error instead of a local decision.
    await assert.rejects(failClosed.recover(report("deg-fc", 1, 1, 10), signal()), RetrydUnreachableError);

    // stepSucceeded while down closes the local chains and does not fail.
    const ok = await client.stepSucceeded({ sessionId: "deg-a", turn: 1n, step: 3n, provider: "anthropic" });
    assert.equal(ok.closed.length, 1);

    // Up again: the next report is the server's.
    await restart();
    const back = await client.recover(report("deg-c", 1, 1, 750), signal());
    assert.equal(summary(back), "retry 1 after 750 ms");
    assert.ok(!isLocal(back.event));

    // A server-scheduled retry whose await cannot re-attach: retryd is
    // killed while recover waits, so the client starts it past its due
    // time plus awaitGraceMs.
    const pending = client.recover(report("deg-c", 1, 2, 750), signal());
    const deadline = Date.now() + 20_000;
    for (;;) {
      const chains = await client.getChains("deg-c").catch(() => undefined);
      if (chains?.chains.some((c) => c.latest?.status === RetryStatus.PENDING && c.latest.awaiters > 0)) break;
      assert.ok(Date.now() < deadline, "no awaiter attached");
      await delay(10);
    }
    await server.kill();
    const localStart = await pending;
    assert.equal(summary(localStart), "retry 2 after 1500 ms (local start)");
    assert.ok(localStart.kind === "retry" && !isLocal(localStart.event), "the decision itself was the server's");

    // After the restart the server still holds that retry (file store): the
    // next report's RETRY_PENDING names it; recover awaits it (the server
    // starts it, so the chain counts it) and reports again.
    await restart();
    const resumed = await client.recover(report("deg-c", 1, 3, 750), signal());
    assert.equal(summary(resumed), "retry 3 after 3000 ms");
    const stats = client.stats();
    t.diagnostic(`client stats: ${JSON.stringify(stats)}`);
    assert.deepEqual(
      { local: stats.localDecisions, localStarts: stats.localStarts, pendingResolved: stats.pendingResolved, localSuccesses: stats.localSuccesses },
      { local: 5, localStarts: 1, pendingResolved: 1, localSuccesses: 1 },
    );

    // The spans say which decisions were local.
    const spans = exporter.getFinishedSpans().filter((s) => s.name === "retryd.recover");
    const locals = spans.filter((s) => s.attributes["retryd.decision.local"] === true).length;
    const servers = spans.filter((s) => s.attributes["retryd.decision.local"] === false).length;
    t.diagnostic(`spans: ${locals} local, ${servers} server`);
    assert.equal(locals, 5);
    assert.equal(servers, 4);
    assert.equal(spans.filter((s) => s.attributes["retryd.retry.local_start"] === true).length, 1);
    // They name things as retryd's own spans do (docs/observability.md).
    for (const s of spans) {
      assert.ok(["schedule", "delegate"].includes(String(s.attributes["retryd.decision"])), `retryd.decision ${s.attributes["retryd.decision"]}`);
      assert.equal(typeof s.attributes["gen_ai.provider.name"], "string");
      assert.equal(typeof s.attributes["retryd.session.id"], "string");
    }

    // The server's own log holds no local record and passes the checker.
    t.diagnostic(await server.verify());
  } finally {
    client.close();
    failClosed.close();
    await server.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});

test("an abort while a local retry backs off rejects with a local cancel", async () => {
  // A loopback port with nothing behind it: connection refused.
  const probe = createServer();
  await new Promise<void>((resolve) => probe.listen(0, "127.0.0.1", resolve));
  const port = (probe.address() as AddressInfo).port;
  await new Promise<void>((resolve) => probe.close(() => resolve()));
  const client = new RetrydClient(`127.0.0.1:${port}`, { insecure: true, retry: false });
  try {
    const err = await client.recover(report("deg-abort", 1, 1, 10_000), { signal: AbortSignal.timeout(300) }).then(
      () => assert.fail("recover did not reject"),
      (e: unknown) => e,
    );
    assert.ok(err instanceof RecoverAbortedError, String(err));
    assert.ok(isLocal(err.schedule.retryId) && isLocal(err.event));
    assert.equal(err.cancelled?.reason, CancelReason.REQUESTED);
    assert.equal(err.cancelled?.retryId, err.schedule.retryId);
    assert.equal(client.stats().localDecisions, 1);
  } finally {
    client.close();
  }
});
