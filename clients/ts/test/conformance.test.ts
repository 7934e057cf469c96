// Runs every shared conformance vector (testdata/conformance/*.json)
// through RetrydClient against one live retryd binary this test starts,
// one subtest per vector, then the invariant checker over the server's log.
// clients/go/conformance_test.go runs the same vectors through the Go
// client.

import assert from "node:assert/strict";
import { join } from "node:path";
import { test } from "node:test";
import { DelaySourceSchema, DelegateReasonSchema } from "../src/gen/retryd/v1/events_pb.js";
import { ModeSchema } from "../src/gen/retryd/v1/policy_pb.js";
import { RetrydClient } from "../src/client.js";
import { Reason } from "../src/errors.js";
import { repoRoot, startRetryd } from "./server.js";
import { loadVectors, runVector } from "./vectors.js";

const vectors = loadVectors(repoRoot());

test("conformance vectors against a live retryd", { concurrency: true }, async (t) => {
  // The vectors' server config protects the fleet vector's providers.
  const server = await startRetryd("--config", join(repoRoot(), "testdata", "conformance", "retryd.yaml"));
  const client = new RetrydClient(server.addr, { insecure: true });
  try {
    await Promise.all(vectors.map((v) => t.test(v.name, () => runVector(client, v))));
    await t.test("invariant checker over the event log", async () => {
      const out = await server.verify();
      t.diagnostic(out);
    });
  } finally {
    client.close();
    await server.stop();
  }
});

// The vectors must keep covering what the issue lists: every mode, every
// delegate reason, every delay source, every FAILED_PRECONDITION reason,
// both Retry-After forms, and each op and recover outcome.
test("conformance vectors cover every mode, reason and op", () => {
  assert.ok(vectors.length >= 12, `only ${vectors.length} vectors`);
  const sessions = new Set(vectors.map((v) => v.session));
  assert.equal(sessions.size, vectors.length, "every vector needs its own session id");

  const seen = new Set<string>();
  for (const v of vectors) {
    for (const s of v.steps) {
      seen.add(`op:${s.op}`);
      const e = s.expect;
      if (e.mode) seen.add(e.mode);
      if (e.reason) seen.add(e.reason);
      if (e.delaySource) seen.add(e.delaySource);
      if (e.error?.reason) seen.add(`error:${e.error.reason}`);
      if (e.outcome) seen.add(`outcome:${e.outcome}`);
      if (e.terminal) seen.add(`terminal:${e.terminal}`);
      if (e.delayMsMin !== undefined || e.delayMsMax !== undefined) seen.add("jitter-bounds");
      if (e.sameRetryAs) seen.add("same-retry");
      const failure = (s.request?.["failure"] ?? {}) as Record<string, unknown>;
      if ("providerRetryAfterMs" in failure) seen.add("retry-after:ms");
      if ("retryAfter" in failure) seen.add("retry-after:header");
    }
  }
  const named = (x: { number: number; name: string }) => x.number !== 0;
  const want = [
    ...ModeSchema.values.filter(named).map((x) => x.name),
    ...DelegateReasonSchema.values.filter(named).map((x) => x.name),
    ...DelaySourceSchema.values.filter(named).map((x) => x.name),
    ...Object.values(Reason).map((r) => `error:${r}`),
    ...["failedStep", "recover", "awaitRetry", "cancelRetries", "stepSucceeded"].map((op) => `op:${op}`),
    "outcome:retry",
    "outcome:delegate",
    "outcome:aborted",
    "terminal:started",
    "terminal:cancelled",
    "jitter-bounds",
    "same-retry",
    "retry-after:ms",
    "retry-after:header",
  ];
  const missing = want.filter((w) => !seen.has(w));
  assert.deepEqual(missing, [], "not covered by any vector");
});
