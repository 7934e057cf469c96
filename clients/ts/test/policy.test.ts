// Parity of the client's policy port (src/policy.ts) and local decider
// (src/local.ts) with the server: every shared conformance vector that needs
// no server state is played against the local decider with the same checks
// the live runner makes, and policy/testdata/canonical_keys.json (the Go
// package's golden keys) is resolved by the port.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { create, fromJson, type JsonObject } from "@bufbuild/protobuf";
import { CancelReasonSchema, CloseReasonSchema, DelaySource, DelegateReason, Replay } from "../src/gen/retryd/v1/events_pb.js";
import { Jitter, Mode, RetryPolicySchema } from "../src/gen/retryd/v1/policy_pb.js";
import { StepSucceededRequestSchema } from "../src/gen/retryd/v1/retry_service_pb.js";
import { isLocal, LocalDecider } from "../src/local.js";
import {
  backoffBounds,
  decide,
  goFloat,
  parseRetryAfter,
  PolicyValidationError,
  providerRetryAfter,
  resolvePolicy,
} from "../src/policy.js";
import { repoRoot } from "./server.js";
import {
  checkDelegate,
  checkError,
  checkSchedule,
  checkStarted,
  enumName,
  failedStepRequest,
  loadVectors,
  type Saved,
  type Vector,
} from "./vectors.js";

const vectors = loadVectors(repoRoot());

// needsServer says why a vector cannot be decided by one process alone,
// or undefined when it can: the server's step records (idempotent
// re-reports, conflicts, stale reports, a pending retry refusing the next
// report), fleet protection, always mode's open delegations, awaiting or
// cancelling what only the server holds.
function needsServer(v: Vector): string | undefined {
  for (const s of v.steps) {
    const e = s.expect;
    if (e.error !== undefined && e.error.code !== "INVALID_ARGUMENT") return `error ${e.error.code} ${e.error.reason ?? ""}`;
    if (e.sameRetryAs !== undefined) return "an idempotent re-report (server step records)";
    if (e.delaySource !== undefined && /FLEET|CIRCUIT|PACING/.test(e.delaySource)) return `fleet protection (${e.delaySource})`;
    if (e.reason !== undefined && /FLEET/.test(e.reason)) return `fleet protection (${e.reason})`;
    if (e.outcome === "aborted" || e.outcome === "cancelled") return `recover ${e.outcome} (a server-side cancel)`;
    if (e.delegationsCancelled !== undefined && e.delegationsCancelled > 0) return "an open always-mode delegation";
    if (s.op === "cancelRetries" && s.sessionId !== undefined && s.sessionId !== v.session) return "a session the server must know";
    if (s.op === "awaitRetry" && s.retry === undefined) return "a retry id only the server could know";
  }
  return undefined;
}

// runLocalVector plays v against a LocalDecider whose clock only moves
// forward when a retry is awaited, with the checks of the live runner.
function runLocalVector(v: Vector): void {
  let offset = 0;
  const decider = new LocalDecider({ now: () => Date.now() + offset, retryBudget: Infinity });
  const saved = new Map<string, Saved>();
  const lookup = (where: string, name: string): Saved => {
    const s = saved.get(name);
    assert.ok(s, `${where}: no retry saved as ${JSON.stringify(name)}`);
    return s;
  };
  for (const [i, step] of v.steps.entries()) {
    const where = `${v.name} step ${i + 1} (${step.op}${step.comment ? `: ${step.comment}` : ""})`;
    const exp = step.expect;
    switch (step.op) {
      case "failedStep":
      case "recover": {
        const req = failedStepRequest(v, step);
        let resp;
        try {
          resp = decider.failedStep(req);
        } catch (err) {
          checkError(where, err, exp, lookup);
          break;
        }
        assert.equal(exp.error, undefined, `${where}: want error ${JSON.stringify(exp.error)}, got a decision`);
        assert.ok(resp.event && isLocal(resp.event), `${where}: the event is not marked local`);
        const d = resp.decision?.outcome;
        if (d?.case === "schedule") {
          assert.equal("schedule", exp.decision ?? (exp.outcome === "retry" ? "schedule" : exp.outcome ?? "schedule"), `${where}: decision`);
          checkSchedule(where, req, d.value, resp.event, exp, lookup);
          const target = { schedule: d.value, turn: req.turn, step: req.step };
          if (step.save) saved.set(step.save, target);
          if (step.op === "recover") {
            offset += Number(d.value.delayMs);
            const st = decider.start(d.value.retryId);
            assert.ok(st, `${where}: the local retry did not start`);
            checkStarted(where, st, target);
          }
        } else if (d?.case === "delegate") {
          assert.equal("delegate", exp.decision ?? exp.outcome ?? "delegate", `${where}: decision (${d.value.detail})`);
          checkDelegate(where, req, d.value.reason, resp.event, exp);
        } else {
          assert.fail(`${where}: neither schedule nor delegate`);
        }
        break;
      }
      case "awaitRetry": {
        const target = lookup(where, step.retry ?? "");
        const id = target.schedule.retryId;
        const due = decider.dueMs(id);
        assert.ok(due !== undefined, `${where}: unknown local retry`);
        offset += Math.max(0, due - (Date.now() + offset));
        const st = decider.start(id);
        if (exp.terminal === "cancelled") {
          assert.equal(st, undefined, `${where}: a cancelled retry started`);
          break;
        }
        assert.ok(st, `${where}: the local retry did not start`);
        checkStarted(where, st, target);
        if (exp.retryNumber !== undefined) assert.equal(st.retryNumber, exp.retryNumber, `${where}: retry number`);
        break;
      }
      case "cancelRetries": {
        if (step.retry !== undefined) {
          const target = lookup(where, step.retry);
          const wasPending = decider.cancel(target.schedule.retryId);
          if (exp.retries !== undefined) {
            const [want] = exp.retries;
            assert.equal(exp.retries.length, 1, `${where}: one retry`);
            assert.equal(want?.status, wasPending || decider.start(target.schedule.retryId) === undefined ? "RETRY_STATUS_CANCELLED" : "RETRY_STATUS_STARTED", `${where}: status`);
            if (want?.cancelReason !== undefined) assert.equal(want.cancelReason, enumName(CancelReasonSchema, 1), `${where}: cancel reason`);
          }
        } else {
          decider.cancelSession(step.sessionId ?? v.session);
        }
        break;
      }
      case "stepSucceeded": {
        const req = fromJson(StepSucceededRequestSchema, step.request ?? {});
        req.sessionId ||= v.session;
        const closed = decider.stepSucceeded(req.sessionId);
        if (exp.closed !== undefined) {
          const got = closed.map((c, j) => ({
            provider: c.provider,
            policyKey: exp.closed?.[j]?.policyKey === undefined ? undefined : c.policyKey,
            reason: enumName(CloseReasonSchema, c.reason),
            retries: c.retries,
          }));
          assert.deepEqual(got, exp.closed.map((c) => ({ ...c, policyKey: c.policyKey })), `${where}: closed chains`);
        }
        break;
      }
    }
  }
}

test("the local decider answers every conformance vector that needs no server state", async (t) => {
  const played: string[] = [];
  for (const v of vectors) {
    const why = needsServer(v);
    if (why !== undefined) {
      t.diagnostic(`${v.name}: needs the server (${why})`);
      continue;
    }
    await t.test(v.name, () => runLocalVector(v));
    played.push(v.name);
  }
  t.diagnostic(`played ${played.length} of ${vectors.length} vectors locally: ${played.join(", ")}`);
  // Every vector of pure policy semantics is played; a new server-only
  // feature must not silently shrink this set.
  for (const name of [
    "always-downstream-handshake",
    "default-policies",
    "delegate-reasons",
    "normal-backoff-exhaustion",
    "normal-jitter-bounds",
    "provider-change",
    "retry-after-header",
    "retry-after-ms",
    "schedule-mode-bounded",
    "schedule-mode-tail",
  ]) {
    assert.ok(played.includes(name), `${name} was not played locally`);
  }
});

test("the port resolves policy/testdata/canonical_keys.json to the Go keys", () => {
  const golden = JSON.parse(readFileSync(join(repoRoot(), "policy", "testdata", "canonical_keys.json"), "utf8")) as {
    name: string;
    policy: JsonObject;
    key: string;
  }[];
  assert.ok(golden.length >= 10);
  for (const g of golden) {
    assert.equal(resolvePolicy(fromJson(RetryPolicySchema, g.policy)).key, g.key, g.name);
  }
});

test("validation names every bad field as the server does", () => {
  const bad = create(RetryPolicySchema, {
    mode: Mode.ALWAYS,
    maxRetries: 3,
    retryableCodes: ["SERVER"],
    backoff: { initialDelayMs: 0n, multiplier: 0.5, jitterRatio: 2 },
    schedule: [10n],
  });
  assert.throws(
    () => resolvePolicy(bad),
    (err: unknown) => {
      assert.ok(err instanceof PolicyValidationError);
      assert.deepEqual(
        err.violations.map((v) => v.field),
        ["max_retries", "retryable_codes", "backoff.initial_delay_ms", "backoff.multiplier", "backoff.jitter_ratio", "schedule"],
      );
      return true;
    },
  );
  const codes = create(RetryPolicySchema, { retryableCodes: ["*", "rate", "ABORTED", "SERVER", "SERVER", "HTTP_*"] });
  assert.throws(
    () => resolvePolicy(codes),
    (err: unknown) =>
      err instanceof PolicyValidationError &&
      err.violations.map((v) => v.field).join() === "retryable_codes[0],retryable_codes[1],retryable_codes[2],retryable_codes[4]",
  );
});

test("decide states exact delays for a given jitter source", () => {
  const p = resolvePolicy(create(RetryPolicySchema, { maxRetries: 4, backoff: { initialDelayMs: 100n, maxDelayMs: 1000n, jitterRatio: 0.5 } }));
  const now = 1_000_000;
  const want: [number, number, number][] = [
    // [retries used, u, delay]
    [0, 0, 50],
    [0, 0.999999, 150],
    [1, 0.5, 200],
    [3, 0, 400],
    [3, 0.999999, 1000], // 800*1.5 clamped to max
  ];
  for (const [retries, u, delay] of want) {
    const d = decide(p, { retries, code: "SERVER" }, now, () => u);
    assert.ok(d.schedule, `retries ${retries}`);
    assert.equal(d.delayMs, delay, `retries ${retries}, u ${u}`);
    assert.equal(d.retryNumber, retries + 1);
    assert.equal(d.source, DelaySource.BACKOFF);
  }
  assert.deepEqual(backoffBounds(p, 4), [400, 1000]);
  const out = decide(p, { retries: 4, code: "SERVER" }, now, () => 0);
  assert.ok(!out.schedule && out.reason === DelegateReason.BUDGET_EXHAUSTED);
  // An out-of-range jitter value counts as 0, as in Go.
  const nan = decide(p, { retries: 0, code: "SERVER" }, now, () => NaN);
  assert.ok(nan.schedule && nan.delayMs === 50);
  const full = resolvePolicy(create(RetryPolicySchema, { backoff: { initialDelayMs: 300n, jitter: Jitter.FULL } }));
  assert.deepEqual(backoffBounds(full, 1), [0, 300]);
  const unsafe = decide(p, { retries: 0, code: "SERVER", replay: Replay.UNSAFE }, now, () => 0);
  assert.ok(!unsafe.schedule && unsafe.reason === DelegateReason.REPLAY_UNSAFE);
  const deadline = decide(p, { retries: 0, code: "SERVER", deadlineMs: now + 149 }, now, () => 0);
  assert.ok(!deadline.schedule && deadline.reason === DelegateReason.DEADLINE, JSON.stringify(deadline));
  assert.ok(decide(p, { retries: 0, code: "SERVER", deadlineMs: now + 150 }, now, () => 0).schedule);
});

test("Retry-After parses as Go's policy.ParseRetryAfter", () => {
  const now = Date.UTC(2026, 2, 1, 12, 0, 0);
  const wait = (ms: number) => ({ valid: true, ms, over: false });
  const over = { valid: true, ms: 0, over: true };
  const invalid = { valid: false, ms: 0, over: false };
  const cases: [string, number, object][] = [
    ["120", now, wait(120000)],
    ["0", now, wait(0)],
    ["007", now, wait(7000)],
    ["  120\t\n", now, wait(120000)],
    ["2147483", now, wait(2147483000)],
    ["2147484", now, over],
    ["99999999999999999999", now, over],
    ["", now, invalid],
    ["-1", now, invalid],
    ["+5", now, invalid],
    ["1.5", now, invalid],
    ["1e3", now, invalid],
    ["120s", now, invalid],
    ["１２０", now, invalid],
    ["0x10", now, invalid],
    ["Sun, 01 Mar 2026 12:02:00 GMT", now, wait(120000)],
    ["Sun, 01 Mar 2026 12:02:00 GMT", now + 250, wait(119750)],
    ["Sun, 01 Mar 2026 12:00:00 GMT", now, wait(0)],
    ["Sun, 01 Mar 2026 11:59:00 GMT", now, wait(0)],
    ["Wed, 25 Mar 2026 12:00:00 GMT", now, wait(24 * 86400 * 1000)],
    ["Thu, 26 Mar 2026 12:00:00 GMT", now, over],
    [" Sun, 01 Mar 2026 12:00:30 GMT ", now, wait(30000)],
    ["Sunday, 01-Mar-26 12:00:30 GMT", now, wait(30000)],
    ["Sunday, 06-Nov-94 08:49:37 GMT", now, wait(0)],
    ["Sun Mar  1 12:01:00 2026", now, wait(60000)],
    ["Sun, 32 Mar 2026 12:00:00 GMT", now, invalid],
    ["Sun, 01 Mar 2026 12:02:00 PST", now, invalid],
    ["2026-03-01T12:02:00Z", now, invalid],
    ["Sun, 01 Mar 2026", now, invalid],
  ];
  for (const [value, at, want] of cases) {
    assert.deepEqual(parseRetryAfter(value, at), want, JSON.stringify(value));
  }
  // The ms form wins unless negative; then the header decides.
  assert.deepEqual(providerRetryAfter(1500n, "9", now), wait(1500));
  assert.deepEqual(providerRetryAfter(-1n, "9", now), wait(9000));
  assert.deepEqual(providerRetryAfter(2n ** 40n, undefined, now), over);
  assert.deepEqual(providerRetryAfter(undefined, undefined, now), invalid);
});

test("goFloat prints as Go's strconv.FormatFloat(f, 'g', -1, 64)", () => {
  const cases: [number, string][] = [
    [2, "2"], [1.5, "1.5"], [0.1, "0.1"], [0, "0"], [1, "1"], [0.0001, "0.0001"], [0.00001, "1e-05"],
    [123456, "123456"], [1e6, "1e+06"], [1234567, "1.234567e+06"], [1e21, "1e+21"], [1e100, "1e+100"], [0.30000000000000004, "0.30000000000000004"],
  ];
  for (const [f, want] of cases) assert.equal(goFloat(f), want, String(f));
});

test("the local cap bounds unlimited modes and the chains are bounded in number", () => {
  let now = 1_000_000;
  const d = new LocalDecider({ now: () => now, rand: () => 0, retryBudget: 2, maxChains: 3 });
  const req = (session: string, step: number, provider = "p") => {
    const r = failedStepRequest(
      { name: "x", description: "", session, steps: [] },
      {
        op: "failedStep",
        request: { turn: step, step, provider, failure: { code: "SERVER" }, policy: { mode: "MODE_ALWAYS", backoff: { initialDelayMs: 10, jitterRatio: 0 } }, downstream: "DOWNSTREAM_DECLINED" },
        expect: {},
      },
    );
    return r;
  };
  const delays: string[] = [];
  for (let i = 1; i <= 3; i++) {
    const resp = d.failedStep(req("s", i));
    const o = resp.decision?.outcome;
    if (o?.case === "schedule") {
      delays.push(`schedule ${o.value.retryNumber} ${o.value.delayMs}`);
      now += Number(o.value.delayMs);
      assert.ok(d.start(o.value.retryId));
    } else {
      delays.push(`delegate ${o?.case === "delegate" ? `${DelegateReason[o.value.reason]} ${o.value.detail}` : "none"}`);
    }
  }
  assert.deepEqual(delays, [
    "schedule 1 10",
    "schedule 2 20",
    "delegate BUDGET_EXHAUSTED decided locally: 2 of 2 retries used: the local cap while no retryd replica answers",
  ]);
  // The exhausted chain closed: the next failure starts at retry 1 again.
  const again = d.failedStep(req("s", 4)).decision?.outcome;
  assert.ok(again?.case === "schedule" && again.value.retryNumber === 1);
  // A timer may fire a millisecond before the clock reaches the due time:
  // start refuses a retry not yet due unless the caller has waited on a timer.
  assert.ok(again?.case === "schedule");
  assert.equal(d.start(again.value.retryId), undefined);
  assert.equal(d.start(again.value.retryId, true)?.retryId, again.value.retryId);
  // The same report again gets the same answer, as from the server's step records.
  const repeated = d.failedStep(req("s", 4)).decision?.outcome;
  assert.ok(repeated?.case === "schedule" && repeated.value.retryId === again.value.retryId);
  // At most maxChains chains: the least recently used one goes first.
  for (const s of ["a", "b", "c"]) d.failedStep(req(s, 1));
  assert.equal(d.chainCount, 3);
  // "s" was evicted, so its chain starts over (retry 1, not 2).
  now += 1000;
  const evicted = d.failedStep(req("s", 5)).decision?.outcome;
  assert.ok(evicted?.case === "schedule" && evicted.value.retryNumber === 1);
  // A bounded policy keeps its own budget unless maxRetries is lower.
  const tight = new LocalDecider({ now: () => now, rand: () => 0, maxRetries: 1 });
  const bounded = (step: number) =>
    tight.failedStep(
      failedStepRequest(
        { name: "x", description: "", session: "b", steps: [] },
        { op: "failedStep", request: { turn: step, step, provider: "p", failure: { code: "SERVER" }, policy: { maxRetries: 5, backoff: { initialDelayMs: 10, jitterRatio: 0 } } }, expect: {} },
      ),
    ).decision?.outcome;
  assert.equal(bounded(1)?.case, "schedule");
  const second = bounded(2);
  assert.ok(second?.case === "delegate" && second.value.reason === DelegateReason.BUDGET_EXHAUSTED);
});
