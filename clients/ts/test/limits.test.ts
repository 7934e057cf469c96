// Admission control as a TypeScript agent sees it: a server whose tenant
// may hold one pending retry refuses the second with RESOURCE_EXHAUSTED,
// and limitReached / retryDelayMs read the bound and the delay the server
// asks for; once the first retry is cancelled the same report is admitted.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { Code, ConnectError } from "@connectrpc/connect";
import { Mode } from "../src/gen/retryd/v1/policy_pb.js";
import { RetrydClient, type FailedStepInit } from "../src/client.js";
import { AccessReason, errorReason, limitReached, retryDelayMs } from "../src/errors.js";
import { startRetryd, type RetrydServer } from "./server.js";

let server: RetrydServer;
let client: RetrydClient;

before(async () => {
  server = await startRetryd("--max-pending-retries-per-tenant", "1");
  client = new RetrydClient(server.addr, { insecure: true, retry: false }); // the raw refusals
});

after(async () => {
  client.close();
  await server.verify();
  await server.stop();
});

function failure(sessionId: string): FailedStepInit {
  return {
    sessionId,
    turn: 1n,
    step: 1n,
    provider: "openai",
    failure: { code: "SERVER", httpStatus: 503 },
    policySource: {
      case: "policy",
      value: { mode: Mode.NORMAL, maxRetries: 2, backoff: { initialDelayMs: 60000n, maxDelayMs: 60000n, jitterRatio: 0 } },
    },
  };
}

test("limitReached and retryDelayMs read an admission refusal", async () => {
  const first = await client.failedStep(failure("ts-limits-1"));
  assert.equal(first.decision?.outcome.case, "schedule");

  const err = await client.failedStep(failure("ts-limits-2")).then(
    () => assert.fail("the second pending retry was admitted"),
    (e: unknown) => e,
  );
  assert.ok(err instanceof ConnectError && err.code === Code.ResourceExhausted, `got ${String(err)}`);
  assert.equal(errorReason(err), AccessReason.LimitReached);
  assert.equal(limitReached(err), "pending_retries_per_tenant");
  assert.equal(retryDelayMs(err), 1000);

  // Not an admission refusal: nothing to read.
  assert.equal(limitReached(new ConnectError("too big", Code.ResourceExhausted)), undefined);
  assert.equal(retryDelayMs(new Error("plain")), undefined);

  // Room again once the first retry is cancelled (the server learns it
  // from its event log, so the report is sent again until admitted).
  const retryId = first.decision?.outcome.case === "schedule" ? first.decision.outcome.value.retryId : "";
  await client.cancelRetry(retryId);
  for (let i = 0; ; i++) {
    try {
      const again = await client.failedStep(failure("ts-limits-2"));
      assert.equal(again.decision?.outcome.case, "schedule");
      break;
    } catch (e) {
      assert.ok(limitReached(e) !== undefined && i < 200, `not admitted after the cancel: ${String(e)}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }
});
