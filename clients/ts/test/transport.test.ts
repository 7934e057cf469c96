// The client's transport against real retryd processes: plaintext only when
// asked for by name, idempotent calls sent again on UNAVAILABLE (a server
// that is down, then up on the same address) and after the RetryInfo delay
// of a RESOURCE_EXHAUSTED refusal, and everything else sent once.

import assert from "node:assert/strict";
import { test } from "node:test";
import { setTimeout as delay } from "node:timers/promises";
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { Mode } from "../src/gen/retryd/v1/policy_pb.js";
import { RetrydClient, type FailedStepInit } from "../src/client.js";
import { baseUrlOf, retryInterceptor, type RetryOptions } from "../src/transport.js";
import { startRetryd } from "./server.js";

function failure(sessionId: string, delayMs = 60_000): FailedStepInit {
  return {
    sessionId,
    turn: 1n,
    step: 1n,
    provider: "openai",
    failure: { code: "SERVER", httpStatus: 503 },
    policySource: {
      case: "policy",
      value: { mode: Mode.NORMAL, maxRetries: 2, backoff: { initialDelayMs: BigInt(delayMs), maxDelayMs: 60000n, jitterRatio: 0 } },
    },
  };
}

// counted returns a client whose every attempt (inside the retry
// interceptor) is counted per method.
function counted(addr: string, retry: RetryOptions): { client: RetrydClient; attempts: Map<string, number> } {
  const attempts = new Map<string, number>();
  const count: Interceptor = (next) => (req) => {
    attempts.set(req.method.name, (attempts.get(req.method.name) ?? 0) + 1);
    return next(req);
  };
  const transport = createGrpcTransport({ baseUrl: `http://${addr}`, interceptors: [retryInterceptor(retry), count] });
  return { client: new RetrydClient(transport, { degraded: false }), attempts };
}

test("plaintext only when asked for by name; TLS by default", () => {
  assert.equal(baseUrlOf("127.0.0.1:7700", false), "https://127.0.0.1:7700");
  assert.equal(baseUrlOf("127.0.0.1:7700", true), "http://127.0.0.1:7700");
  assert.equal(baseUrlOf("https://retryd.svc:7700", false), "https://retryd.svc:7700");
  assert.equal(baseUrlOf("http://127.0.0.1:7700", true), "http://127.0.0.1:7700");
  assert.throws(() => baseUrlOf("http://127.0.0.1:7700", false), /plaintext: set insecure: true/);
  assert.throws(() => baseUrlOf("https://retryd.svc:7700", true), /TLS target/);
  assert.throws(() => baseUrlOf("unix:///tmp/x", false), /unsupported target scheme/);
  assert.throws(() => new RetrydClient("http://127.0.0.1:7700"), TypeError);
});

test("a TLS client does not fall back to plaintext", async () => {
  const server = await startRetryd();
  const client = new RetrydClient(server.addr, { degraded: false, retry: false });
  try {
    const err = await client.getChains("ts-transport-tls").then(
      () => assert.fail("a TLS call to a plaintext server succeeded"),
      (e: unknown) => e,
    );
    assert.ok(err instanceof ConnectError, String(err));
    assert.notEqual(err.code, Code.NotFound, "the call reached the server in plaintext");
  } finally {
    client.close();
    await server.stop();
  }
});

test("idempotent calls are sent again on UNAVAILABLE until the server is up", async () => {
  const first = await startRetryd();
  const addr = first.addr;
  await first.stop();
  const { client, attempts } = counted(addr, { maxAttempts: 50, initialBackoffMs: 100, maxBackoffMs: 200 });
  let server;
  try {
    const call = client.stepSucceeded({ sessionId: "ts-transport-up", turn: 1n, step: 1n, provider: "openai" });
    await delay(600);
    server = await startRetryd("--listen", addr);
    const resp = await call;
    assert.deepEqual(resp.closed, []);
    const n = attempts.get("StepSucceeded") ?? 0;
    assert.ok(n >= 3, `StepSucceeded was sent ${n} times; want retries while the server was down`);

    // Bounded by maxAttempts, and only the idempotent methods.
    await server.kill();
    const bounded = counted(addr, { maxAttempts: 3, initialBackoffMs: 10 });
    for (const call of [
      () => bounded.client.failedStep(failure("ts-transport-down")),
      () => bounded.client.getChains("ts-transport-down"),
      () => bounded.client.cancelSession("ts-transport-down"),
      () => bounded.client.getProviderState("openai"),
    ]) {
      await assert.rejects(call(), (e: unknown) => e instanceof ConnectError && e.code === Code.Unavailable);
    }
    bounded.client.close();
    assert.deepEqual(Object.fromEntries(bounded.attempts), { FailedStep: 3, GetChains: 3, CancelRetries: 3, GetProviderState: 1 });
  } finally {
    client.close();
    await server?.stop();
  }
});

test("RESOURCE_EXHAUSTED with RetryInfo is sent again after the delay retryd asks for", async () => {
  const server = await startRetryd("--max-pending-retries-per-tenant", "1");
  const { client, attempts } = counted(server.addr, { maxAttempts: 4 });
  try {
    const first = await client.failedStep(failure("ts-transport-limit-1"));
    assert.equal(first.decision?.outcome.case, "schedule");
    const retryId = first.decision?.outcome.case === "schedule" ? first.decision.outcome.value.retryId : "";
    const began = Date.now();
    const second = client.failedStep(failure("ts-transport-limit-2"));
    await delay(300);
    await client.cancelRetry(retryId); // room again: a later attempt is admitted
    const resp = await second;
    const took = Date.now() - began;
    assert.equal(resp.decision?.outcome.case, "schedule");
    assert.ok((attempts.get("FailedStep") ?? 0) >= 3, `FailedStep sent ${attempts.get("FailedStep")} times`);
    assert.ok(took >= 1000, `admitted after ${took} ms: the RetryInfo delay (1000 ms) was not honoured`);

    // A RetryInfo delay over maxRetryInfoDelayMs is returned as is.
    const impatient = counted(server.addr, { maxRetryInfoDelayMs: 500 });
    await assert.rejects(impatient.client.failedStep(failure("ts-transport-limit-3")), (e: unknown) => e instanceof ConnectError && e.code === Code.ResourceExhausted);
    assert.equal(impatient.attempts.get("FailedStep"), 1);
    impatient.client.close();
  } finally {
    client.close();
    await server.verify();
    await server.stop();
  }
});
