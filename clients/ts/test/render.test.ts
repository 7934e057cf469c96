// Table tests of the pure UI-line function, and a check that its module
// stays importable by a browser (no runtime imports at all).

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { create } from "@bufbuild/protobuf";
import { EventSchema, RetryScheduledSchema, RetryStartedSchema } from "../src/gen/retryd/v1/events_pb.js";
import { Mode, RetryPolicySchema } from "../src/gen/retryd/v1/policy_pb.js";
import { formatDelay, renderRetryLine, retryDenominator, type RetryLineInput } from "../src/render.js";

const DSH_RETRY = [2000n, 5000n, 5000n, 5000n, 10000n];

function scheduled(retryNumber: number, delayMs: bigint, maxRetries: number | undefined, mode: Mode, schedule: bigint[] = []) {
  return create(RetryScheduledSchema, {
    retryNumber,
    delayMs,
    maxRetries,
    mode,
    policy: create(RetryPolicySchema, { mode, schedule, maxRetries }),
  });
}

test("renderRetryLine", async (t) => {
  const cases: { name: string; input: Parameters<typeof renderRetryLine>[0]; want: string | undefined }[] = [
    { name: "normal: the finite maximum", input: scheduled(2, 1000n, 2, Mode.NORMAL), want: "Retrying model request (2/2). 1s" },
    { name: "normal: sub-second delay", input: scheduled(1, 505n, 2, Mode.NORMAL), want: "Retrying model request (1/2). 0.5s" },
    { name: "always: unlimited", input: scheduled(7, 30000n, undefined, Mode.ALWAYS), want: "Retrying model request (7/∞). 30s" },
    {
      name: "schedule: within the schedule, its length (dsh-retry 2/5)",
      input: scheduled(2, 4000n, undefined, Mode.SCHEDULE, DSH_RETRY),
      want: "Retrying model request (2/5). 4s",
    },
    {
      name: "schedule: the last schedule entry",
      input: scheduled(5, 10000n, undefined, Mode.SCHEDULE, DSH_RETRY),
      want: "Retrying model request (5/5). 10s",
    },
    {
      name: "schedule: the tail is unlimited",
      input: scheduled(6, 20000n, undefined, Mode.SCHEDULE, DSH_RETRY),
      want: "Retrying model request (6/∞). 20s",
    },
    {
      name: "schedule: a finite maximum wins over the schedule's length",
      input: scheduled(2, 5000n, 3, Mode.SCHEDULE, DSH_RETRY),
      want: "Retrying model request (2/3). 5s",
    },
    {
      name: "a scheduled event",
      input: create(EventSchema, { kind: { case: "scheduled", value: scheduled(1, 2000n, undefined, Mode.SCHEDULE, DSH_RETRY) } }),
      want: "Retrying model request (1/5). 2s",
    },
    {
      name: "another kind of event has no line",
      input: create(EventSchema, { kind: { case: "started", value: create(RetryStartedSchema, { retryNumber: 1 }) } }),
      want: undefined,
    },
    { name: "an empty event has no line", input: create(EventSchema), want: undefined },
    {
      name: "a plain object",
      input: { retryNumber: 3, delayMs: 1500, mode: 3, policy: { schedule: [1, 2, 3] } } satisfies RetryLineInput,
      want: "Retrying model request (3/3). 1.5s",
    },
  ];
  for (const c of cases) {
    await t.test(c.name, () => {
      assert.equal(renderRetryLine(c.input), c.want);
    });
  }
});

test("retryDenominator", () => {
  assert.equal(retryDenominator(scheduled(1, 1n, 0, Mode.NORMAL)), 0);
  assert.equal(retryDenominator(scheduled(1, 1n, undefined, Mode.ALWAYS)), undefined);
  assert.equal(retryDenominator(scheduled(5, 1n, undefined, Mode.SCHEDULE, DSH_RETRY)), 5);
  assert.equal(retryDenominator(scheduled(6, 1n, undefined, Mode.SCHEDULE, DSH_RETRY)), undefined);
  assert.equal(retryDenominator({ retryNumber: 1, delayMs: 1 }), undefined);
});

// formatDelay prints what the Go client's RenderRetry prints (the table is
// its output), so both clients show the same text.
test("formatDelay matches the Go client", () => {
  const cases: [bigint | number, string][] = [
    [0n, "0s"],
    [1n, "0s"],
    [20, "0s"],
    [50n, "0.1s"],
    [150n, "0.1s"],
    [250n, "0.2s"],
    [450n, "0.5s"],
    [505n, "0.5s"],
    [750n, "0.8s"],
    [999n, "1s"],
    [1000n, "1s"],
    [1001n, "1s"],
    [1050n, "1.1s"],
    [1250n, "1.2s"],
    [1500, "1.5s"],
    [4000n, "4s"],
    [59999n, "60s"],
    [90000n, "90s"],
    [3723400n, "3723.4s"],
    [2147483647n, "2147483.6s"],
  ];
  for (const [ms, want] of cases) {
    assert.equal(formatDelay(ms), want, `formatDelay(${ms})`);
  }
});

test("the render module has no runtime imports (browser-safe)", () => {
  const js = readFileSync(fileURLToPath(new URL("../src/render.js", import.meta.url)), "utf8");
  assert.doesNotMatch(js, /^\s*import\s/m, "render.js imports a module at run time");
  assert.doesNotMatch(js, /\bimport\s*\(/, "render.js imports a module dynamically");
  assert.doesNotMatch(js, /\brequire\s*\(|["']node:|\bprocess\.|\bBuffer\b/, "render.js uses Node.js");
});
