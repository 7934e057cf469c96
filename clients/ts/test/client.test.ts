// RetrydClient against a live retryd: recover's re-attach after a broken
// stream, its cancelled outcome, awaitRetry's abort, the error helpers and
// watchEvents. The scripted decisions are in the conformance vectors.

import assert from "node:assert/strict";
import { createServer, connect, type Server, type Socket } from "node:net";
import { after, before, test } from "node:test";
import { setTimeout as delay } from "node:timers/promises";
import { Code, ConnectError } from "@connectrpc/connect";
import { CancelReason, DelaySource, type Event } from "../src/gen/retryd/v1/events_pb.js";
import { Mode } from "../src/gen/retryd/v1/policy_pb.js";
import { RetryStatus } from "../src/gen/retryd/v1/retry_service_pb.js";
import { KEEPALIVE_TIME_MS, KEEPALIVE_TIMEOUT_MS, RetrydClient, type FailedStepInit } from "../src/client.js";
import { errorReason, fieldViolations, Reason, retryPendingId } from "../src/errors.js";
import { startRetryd, type RetrydServer } from "./server.js";

let server: RetrydServer;
let client: RetrydClient;

before(async () => {
  server = await startRetryd();
  client = new RetrydClient(server.addr, { insecure: true });
});

after(async () => {
  client.close();
  await server.verify();
  await server.stop();
});

// failure is a retryable failure of (turn, step) under a normal policy
// without jitter: retry n waits initialMs * 2^(n-1).
function failure(sessionId: string, turn: number, step: number, initialMs: number): FailedStepInit {
  return {
    sessionId,
    turn: BigInt(turn),
    step: BigInt(step),
    provider: "anthropic",
    failure: { code: "RATE_LIMIT", httpStatus: 429 },
    policySource: {
      case: "policy",
      value: { mode: Mode.NORMAL, maxRetries: 2, backoff: { initialDelayMs: BigInt(initialMs), maxDelayMs: 60000n, jitterRatio: 0 } },
    },
  };
}

// waitAwaiters polls GetChains until the session's pending retry has n
// connected AwaitRetry streams.
async function waitAwaiters(sessionId: string, n: number): Promise<void> {
  const deadline = Date.now() + 30_000;
  for (;;) {
    const resp = await client.getChains(sessionId).catch(() => undefined);
    const pending = resp?.chains.find((c) => c.latest?.status === RetryStatus.PENDING);
    if (pending?.latest?.awaiters === n) {
      return;
    }
    assert.ok(Date.now() < deadline, `session ${sessionId}: no pending retry with ${n} awaiters after 30s`);
    await delay(10);
  }
}

async function sessionEvents(sessionId: string): Promise<Event[]> {
  const out: Event[] = [];
  for await (const ev of client.watchEvents({ sessionId, stopAtEnd: true })) {
    out.push(ev);
  }
  return out;
}

// A loopback TCP proxy that can sever every connection open at the time,
// to break streams in flight, or silence them (what either side sends is
// dropped, nothing closes), as a path that went silent would; new
// connections are forwarded as before.
class Proxy {
  readonly #server: Server;
  readonly #sockets = new Set<Socket>();
  readonly #pairs = new Set<[Socket, Socket]>();
  accepted = 0;

  constructor(target: string) {
    const i = target.lastIndexOf(":");
    const host = target.slice(0, i);
    const port = Number(target.slice(i + 1));
    this.#server = createServer((down) => {
      this.accepted++;
      const up = connect(port, host);
      for (const s of [down, up]) {
        this.#sockets.add(s);
        s.on("close", () => this.#sockets.delete(s));
        s.on("error", () => s.destroy());
      }
      down.pipe(up);
      up.pipe(down);
      const pair: [Socket, Socket] = [down, up];
      this.#pairs.add(pair);
      down.on("close", () => {
        this.#pairs.delete(pair);
        up.destroy();
      });
      up.on("close", () => down.destroy());
    });
  }

  async listen(): Promise<string> {
    await new Promise<void>((resolve) => this.#server.listen(0, "127.0.0.1", resolve));
    const a = this.#server.address();
    assert.ok(a !== null && typeof a === "object");
    return `127.0.0.1:${a.port}`;
  }

  // silence drops, from now on, whatever either side of every open
  // connection sends, and keeps the connections open (their TCP segments
  // are still acknowledged: the silence is what HTTP/2 pings see). It
  // returns how many it silenced.
  silence(): number {
    for (const [down, up] of this.#pairs) {
      down.unpipe(up);
      up.unpipe(down);
      for (const s of [down, up]) {
        s.on("data", () => {});
        s.resume();
      }
    }
    return this.#pairs.size;
  }

  sever(): void {
    for (const s of this.#sockets) {
      s.destroy();
    }
  }

  async close(): Promise<void> {
    this.sever();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }
}

test("recover re-attaches after the stream breaks, and the retry starts once", async () => {
  const session = "ts-client-reattach";
  const proxy = new Proxy(server.addr);
  const viaProxy = new RetrydClient(await proxy.listen(), { insecure: true, reattachInitialMs: 20, reattachMaxMs: 100 });
  try {
    const pending = viaProxy.recover(failure(session, 1, 1, 400), { signal: AbortSignal.timeout(30_000) });
    await waitAwaiters(session, 1);
    proxy.sever();
    const out = await pending;
    assert.equal(out.kind, "retry");
    assert.equal(out.schedule.retryNumber, 1);
    assert.equal(out.schedule.delaySource, DelaySource.BACKOFF);
    assert.equal(out.started.retryId, out.schedule.retryId);
    assert.ok(proxy.accepted >= 2, `the client connected ${proxy.accepted} times; want a re-attach`);
    const started = (await sessionEvents(session)).filter((e) => e.kind.case === "started");
    assert.equal(started.length, 1, "one Started in the log");
  } finally {
    viaProxy.close();
    await proxy.close();
  }
});

test("the default keepalive closes a connection that went silent", async () => {
  // A ping after KEEPALIVE_TIME_MS without traffic, the connection closed
  // when none is answered within KEEPALIVE_TIMEOUT_MS: a call made with a
  // minute's deadline on a connection that drops everything ends within
  // keepalive time + timeout, where without keepalive it would wait for
  // its deadline.
  const proxy = new Proxy(server.addr);
  const viaProxy = new RetrydClient(await proxy.listen(), { insecure: true });
  try {
    await viaProxy.failedStep(failure("ts-keepalive", 1, 1, 5_000));
    assert.equal(proxy.silence(), 1);
    const began = Date.now();
    const err: unknown = await viaProxy
      .getChains("ts-keepalive", { signal: AbortSignal.timeout(60_000) })
      .then(() => undefined, (e: unknown) => e);
    const took = Date.now() - began;
    // Answered over a new connection (the client's retry of UNAVAILABLE),
    // or UNAVAILABLE: either way the silent connection was given up.
    if (err !== undefined) {
      assert.equal(ConnectError.from(err).code, Code.Unavailable, `the call failed: ${String(err)}`);
    }
    // No sooner than an unanswered ping can time out, no later than the
    // first ping's timeout (plus slack for a loaded machine).
    assert.ok(
      took >= KEEPALIVE_TIMEOUT_MS - 1000 && took <= KEEPALIVE_TIME_MS + KEEPALIVE_TIMEOUT_MS + 5000,
      `the call ended after ${took} ms`,
    );
  } finally {
    viaProxy.close();
    await proxy.close();
  }
});

test("recover returns cancelled when the retry is cancelled while it waits", async () => {
  const session = "ts-client-cancelled";
  const pending = client.recover(failure(session, 1, 1, 10_000), { signal: AbortSignal.timeout(30_000) });
  await waitAwaiters(session, 1);
  const resp = await client.cancelSession(session);
  assert.equal(resp.retries.length, 1);
  const out = await pending;
  assert.equal(out.kind, "cancelled");
  assert.equal(out.cancelled.reason, CancelReason.REQUESTED);
  assert.equal(out.cancelled.retryId, out.schedule.retryId);
  assert.equal(out.event.kind.case, "scheduled");
});

test("awaitRetry rejects with the signal's reason and leaves the retry pending", async () => {
  const session = "ts-client-await-abort";
  const resp = await client.failedStep(failure(session, 1, 1, 10_000));
  assert.equal(resp.decision?.outcome.case, "schedule");
  const retryId = resp.decision.outcome.value.retryId;
  const ac = new AbortController();
  const reason = new Error("the agent stopped");
  const waiting = client.awaitRetry(retryId, { signal: ac.signal });
  await waitAwaiters(session, 1);
  ac.abort(reason);
  await assert.rejects(waiting, (err) => err === reason);
  const chains = await client.getChains(session);
  assert.equal(chains.chains[0]?.latest?.status, RetryStatus.PENDING, "awaitRetry does not cancel");
  await client.cancelRetry(retryId);
});

test("error helpers read retryd's google.rpc details", async () => {
  const session = "ts-client-errors";
  const first = await client.failedStep(failure(session, 1, 1, 10_000));
  assert.equal(first.decision?.outcome.case, "schedule");
  const retryId = first.decision.outcome.value.retryId;

  const pendingErr = await client.failedStep(failure(session, 1, 2, 10_000)).then(
    () => assert.fail("a second failure while a retry is pending was accepted"),
    (err: unknown) => err,
  );
  assert.ok(pendingErr instanceof ConnectError);
  assert.equal(pendingErr.code, Code.FailedPrecondition);
  assert.equal(errorReason(pendingErr), Reason.RetryPending);
  assert.equal(retryPendingId(pendingErr), retryId);
  assert.equal(fieldViolations(pendingErr), undefined);

  const bad: FailedStepInit = { sessionId: session, turn: 1n, step: 3n, provider: "anthropic", failure: { code: "" } };
  const badErr = await client.failedStep(bad).then(
    () => assert.fail("an empty failure code was accepted"),
    (err: unknown) => err,
  );
  assert.ok(badErr instanceof ConnectError);
  assert.equal(badErr.code, Code.InvalidArgument);
  assert.ok(fieldViolations(badErr)?.["failure.code"], `violations: ${JSON.stringify(fieldViolations(badErr))}`);
  assert.equal(errorReason(badErr), undefined);
  assert.equal(retryPendingId(badErr), undefined);

  for (const notRetryd of [undefined, new Error("x"), new ConnectError("x", Code.FailedPrecondition)]) {
    assert.equal(errorReason(notRetryd), undefined);
    assert.equal(retryPendingId(notRetryd), undefined);
    assert.equal(fieldViolations(notRetryd), undefined);
  }
  await client.cancelRetry(retryId);
});

test("watchEvents yields a session's log in order", async () => {
  const session = "ts-client-watch";
  const out = await client.recover(failure(session, 1, 1, 20));
  assert.equal(out.kind, "retry");
  await client.stepSucceeded({ sessionId: session, turn: 2n, step: 2n, provider: "anthropic" });
  const events = await sessionEvents(session);
  assert.deepEqual(
    events.map((e) => e.kind.case),
    ["scheduled", "started", "closed"],
  );
  for (let i = 1; i < events.length; i++) {
    assert.ok((events[i]?.sequence ?? 0n) > (events[i - 1]?.sequence ?? 0n), "sequences increase");
  }
});

test("recover returns cancelled (shutdown) when the server stops while it waits", async () => {
  const session = "ts-client-shutdown";
  const own = await startRetryd();
  const ownClient = new RetrydClient(own.addr, { insecure: true });
  try {
    const pending = ownClient.recover(failure(session, 1, 1, 10_000), { signal: AbortSignal.timeout(30_000) });
    const deadline = Date.now() + 30_000;
    for (;;) {
      const chains = await ownClient.getChains(session).catch(() => undefined);
      if (chains?.chains[0]?.latest?.awaiters === 1) {
        break;
      }
      assert.ok(Date.now() < deadline, "the recover call never attached");
      await delay(10);
    }
    await own.stop();
    const out = await pending;
    assert.equal(out.kind, "cancelled");
    assert.equal(out.cancelled.reason, CancelReason.SHUTDOWN);
  } finally {
    ownClient.close();
    await own.stop();
  }
});
