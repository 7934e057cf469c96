// The runner of the shared conformance vectors (testdata/conformance/*.json,
// schema in its README.md): it plays each step through RetrydClient against
// a live retryd and checks the expectations. The Go client's runner is
// clients/go/conformance_test.go; both must accept every vector.

import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { fromJson, type JsonObject } from "@bufbuild/protobuf";
import { timestampFromMs, type Timestamp } from "@bufbuild/protobuf/wkt";
import type { DescEnum } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import {
  CancelReasonSchema,
  CloseReasonSchema,
  DelaySourceSchema,
  DelegateReasonSchema,
  type Event,
  type RetryStarted,
} from "../src/gen/retryd/v1/events_pb.js";
import { ModeSchema } from "../src/gen/retryd/v1/policy_pb.js";
import {
  FailedStepRequestSchema,
  RetryStatusSchema,
  StepSucceededRequestSchema,
  type CancelRetriesResponse,
  type FailedStepRequest,
  type Schedule,
} from "../src/gen/retryd/v1/retry_service_pb.js";
import { RecoverAbortedError, type RetrydClient } from "../src/client.js";
import { errorReason, fieldViolations, retryPendingId } from "../src/errors.js";
import { renderRetryLine } from "../src/render.js";

/** One scripted scenario. */
export interface Vector {
  name: string;
  description: string;
  session: string;
  steps: Step[];
}

/** One call of a scenario and what it must answer. */
export interface Step {
  op: "failedStep" | "recover" | "awaitRetry" | "cancelRetries" | "stepSucceeded";
  comment?: string;
  request?: JsonObject;
  deadlineInMs?: number;
  save?: string;
  abortAfterMs?: number;
  retry?: string;
  retryId?: string;
  sessionId?: string;
  expect: Expect;
}

/** What a step must answer; only the fields present are checked. */
export interface Expect {
  error?: { code: string; reason?: string; retry?: string; fieldViolations?: string[] };
  decision?: "schedule" | "delegate";
  outcome?: "retry" | "delegate" | "cancelled" | "aborted";
  retryNumber?: number;
  maxRetries?: number | null;
  delayMs?: number;
  delayMsMin?: number;
  delayMsMax?: number;
  delaySource?: string;
  mode?: string;
  policyKey?: string;
  reason?: string;
  sameRetryAs?: string;
  line?: string;
  cancelReason?: string;
  terminal?: "started" | "cancelled";
  retries?: { retry: string; status: string; cancelReason?: string }[];
  delegationsCancelled?: number;
  closed?: { provider: string; policyKey?: string; reason: string; retries: number }[];
}

const stepKeys = new Set(["op", "comment", "request", "deadlineInMs", "save", "abortAfterMs", "retry", "retryId", "sessionId", "expect"]);
const expectKeys = new Set([
  "error", "decision", "outcome", "retryNumber", "maxRetries", "delayMs", "delayMsMin", "delayMsMax", "delaySource",
  "mode", "policyKey", "reason", "sameRetryAs", "line", "cancelReason", "terminal", "retries", "delegationsCancelled", "closed",
]);
const vectorKeys = new Set(["name", "description", "session", "steps"]);

/** The directory of the vectors. */
export function vectorDir(root: string): string {
  return join(root, "testdata", "conformance");
}

/** Loads every vector, sorted by name, and checks the file's shape. */
export function loadVectors(root: string): Vector[] {
  const dir = vectorDir(root);
  const files = readdirSync(dir).filter((f) => f.endsWith(".json")).sort();
  return files.map((f) => {
    const v = JSON.parse(readFileSync(join(dir, f), "utf8")) as Vector;
    const where = `${f}`;
    assertKnownKeys(where, v as unknown as Record<string, unknown>, vectorKeys);
    assert.equal(v.name + ".json", f, `${where}: name must match the file name`);
    assert.ok(v.session, `${where}: session is required`);
    assert.ok(Array.isArray(v.steps) && v.steps.length > 0, `${where}: steps are required`);
    v.steps.forEach((s, i) => {
      assertKnownKeys(`${where} step ${i + 1}`, s as unknown as Record<string, unknown>, stepKeys);
      assertKnownKeys(`${where} step ${i + 1} expect`, s.expect as unknown as Record<string, unknown>, expectKeys);
    });
    return v;
  });
}

function assertKnownKeys(where: string, obj: Record<string, unknown>, known: Set<string>): void {
  for (const k of Object.keys(obj)) {
    assert.ok(known.has(k), `${where}: unknown key ${JSON.stringify(k)}`);
  }
}

/** The proto name of an enum number, e.g. DELAY_SOURCE_BACKOFF. */
export function enumName(desc: DescEnum, n: number): string {
  return desc.value[n]?.name ?? `${desc.typeName}(${n})`;
}

/** The canonical upper-snake gRPC code name, e.g. FAILED_PRECONDITION. */
function codeName(code: Code): string {
  return (Code[code] ?? `CODE_${code}`).replace(/([a-z])([A-Z])/g, "$1_$2").toUpperCase();
}

function nanos(ts: Timestamp | undefined): bigint {
  return ts === undefined ? 0n : ts.seconds * 1_000_000_000n + BigInt(ts.nanos);
}

export interface Saved {
  schedule: Schedule;
  turn: bigint;
  step: bigint;
}

/** Plays one vector against a live server through client. */
export async function runVector(client: RetrydClient, v: Vector): Promise<void> {
  const saved = new Map<string, Saved>();
  const lookup = (where: string, name: string): Saved => {
    const s = saved.get(name);
    assert.ok(s, `${where}: no retry saved as ${JSON.stringify(name)}`);
    return s;
  };
  for (const [i, step] of v.steps.entries()) {
    const where = `${v.name} step ${i + 1} (${step.op}${step.comment ? `: ${step.comment}` : ""})`;
    const exp = step.expect;
    const signal = AbortSignal.timeout(30_000);
    switch (step.op) {
      case "failedStep": {
        const req = failedStepRequest(v, step);
        let resp;
        try {
          resp = await client.failedStep(req, { signal });
        } catch (err) {
          checkError(where, err, exp, lookup);
          break;
        }
        assert.equal(exp.error, undefined, `${where}: want error ${JSON.stringify(exp.error)}, got a decision`);
        const d = resp.decision?.outcome;
        assert.ok(resp.event, `${where}: response without an event`);
        if (d?.case === "schedule") {
          assert.equal("schedule", exp.decision ?? "schedule", `${where}: decision`);
          checkSchedule(where, req, d.value, resp.event, exp, lookup);
          if (step.save) {
            saved.set(step.save, { schedule: d.value, turn: req.turn, step: req.step });
          }
        } else if (d?.case === "delegate") {
          assert.equal("delegate", exp.decision ?? "delegate", `${where}: decision (${d.value.detail})`);
          checkDelegate(where, req, d.value.reason, resp.event, exp);
        } else {
          assert.fail(`${where}: neither schedule nor delegate`);
        }
        break;
      }
      case "recover": {
        const req = failedStepRequest(v, step);
        const callSignal = step.abortAfterMs !== undefined ? AbortSignal.timeout(step.abortAfterMs) : signal;
        let out;
        try {
          out = await client.recover(req, { signal: callSignal });
        } catch (err) {
          if (err instanceof RecoverAbortedError) {
            assert.equal(exp.outcome, "aborted", `${where}: recover aborted (${String(err.cause)})`);
            checkSchedule(where, req, err.schedule, err.event, exp, lookup);
            assert.equal(err.cancelError, undefined, `${where}: the cancel call failed: ${String(err.cancelError)}`);
            assert.ok(err.cancelled, `${where}: no cancelled state after the abort`);
            assert.equal(err.cancelled.retryId, err.schedule.retryId, `${where}: cancelled retry id`);
            if (exp.cancelReason !== undefined) {
              assert.equal(enumName(CancelReasonSchema, err.cancelled.reason), exp.cancelReason, `${where}: cancel reason`);
            }
            if (step.save) {
              saved.set(step.save, { schedule: err.schedule, turn: req.turn, step: req.step });
            }
            break;
          }
          checkError(where, err, exp, lookup);
          break;
        }
        assert.equal(exp.error, undefined, `${where}: want error ${JSON.stringify(exp.error)}, got outcome ${out.kind}`);
        assert.equal(out.kind, exp.outcome ?? out.kind, `${where}: outcome`);
        switch (out.kind) {
          case "retry":
            checkSchedule(where, req, out.schedule, out.event, exp, lookup);
            checkStarted(where, out.started, { schedule: out.schedule, turn: req.turn, step: req.step });
            break;
          case "cancelled":
            checkSchedule(where, req, out.schedule, out.event, exp, lookup);
            assert.equal(out.cancelled.retryId, out.schedule.retryId, `${where}: cancelled retry id`);
            if (exp.cancelReason !== undefined) {
              assert.equal(enumName(CancelReasonSchema, out.cancelled.reason), exp.cancelReason, `${where}: cancel reason`);
            }
            break;
          case "delegate":
            checkDelegate(where, req, out.delegate.reason, out.event, exp);
            break;
        }
        if (step.save && out.kind !== "delegate") {
          saved.set(step.save, { schedule: out.schedule, turn: req.turn, step: req.step });
        }
        break;
      }
      case "awaitRetry": {
        const target = step.retry !== undefined ? lookup(where, step.retry) : undefined;
        const id = target?.schedule.retryId ?? step.retryId ?? "";
        let term;
        try {
          term = await client.awaitRetry(id, { signal });
        } catch (err) {
          checkError(where, err, exp, lookup);
          break;
        }
        assert.equal(exp.error, undefined, `${where}: want error ${JSON.stringify(exp.error)}, got ${term.message.case}`);
        assert.equal(term.message.case, exp.terminal ?? term.message.case, `${where}: terminal message`);
        if (term.message.case === "started") {
          assert.ok(target, `${where}: started for a retry the vector did not save`);
          checkStarted(where, term.message.value, target);
          if (exp.retryNumber !== undefined) {
            assert.equal(term.message.value.retryNumber, exp.retryNumber, `${where}: retry number`);
          }
        } else if (term.message.case === "cancelled") {
          const c = term.message.value;
          assert.equal(c.retryId, id, `${where}: cancelled retry id`);
          if (exp.cancelReason !== undefined) {
            assert.equal(enumName(CancelReasonSchema, c.reason), exp.cancelReason, `${where}: cancel reason`);
          }
          if (exp.retryNumber !== undefined) {
            assert.equal(c.retryNumber, exp.retryNumber, `${where}: retry number`);
          }
        }
        break;
      }
      case "cancelRetries": {
        let resp: CancelRetriesResponse;
        try {
          resp =
            step.retry !== undefined
              ? await client.cancelRetry(lookup(where, step.retry).schedule.retryId, { signal })
              : await client.cancelSession(step.sessionId ?? v.session, { signal });
        } catch (err) {
          checkError(where, err, exp, lookup);
          break;
        }
        assert.equal(exp.error, undefined, `${where}: want error ${JSON.stringify(exp.error)}`);
        if (exp.retries !== undefined) {
          const got = resp.retries.map((r) => ({
            retryId: r.retryId,
            status: enumName(RetryStatusSchema, r.status),
            cancelReason: r.cancelled ? enumName(CancelReasonSchema, r.cancelled.reason) : undefined,
          }));
          const want = exp.retries.map((r) => ({
            retryId: lookup(where, r.retry).schedule.retryId,
            status: r.status,
            cancelReason: r.cancelReason,
          }));
          assert.deepEqual(got, want, `${where}: retries`);
        }
        if (exp.delegationsCancelled !== undefined) {
          assert.equal(resp.delegationsCancelled, exp.delegationsCancelled, `${where}: delegations cancelled`);
        }
        break;
      }
      case "stepSucceeded": {
        const req = fromJson(StepSucceededRequestSchema, step.request ?? {});
        req.sessionId ||= v.session;
        let resp;
        try {
          resp = await client.stepSucceeded(req, { signal });
        } catch (err) {
          checkError(where, err, exp, lookup);
          break;
        }
        assert.equal(exp.error, undefined, `${where}: want error ${JSON.stringify(exp.error)}`);
        if (exp.closed !== undefined) {
          const got = resp.closed.map((c, j) => ({
            provider: c.provider,
            policyKey: exp.closed?.[j]?.policyKey === undefined ? undefined : c.policyKey,
            reason: enumName(CloseReasonSchema, c.reason),
            retries: c.retries,
          }));
          const want = exp.closed.map((c) => ({ provider: c.provider, policyKey: c.policyKey, reason: c.reason, retries: c.retries }));
          assert.deepEqual(got, want, `${where}: closed chains`);
        }
        break;
      }
      default:
        assert.fail(`${where}: unknown op`);
    }
  }
}

export function failedStepRequest(v: Vector, step: Step): FailedStepRequest {
  const req = fromJson(FailedStepRequestSchema, step.request ?? {});
  req.sessionId ||= v.session;
  if (step.deadlineInMs !== undefined) {
    req.deadline = timestampFromMs(Date.now() + step.deadlineInMs);
  }
  return req;
}

export function checkSchedule(
  where: string,
  req: FailedStepRequest,
  s: Schedule,
  event: Event,
  exp: Expect,
  lookup: (where: string, name: string) => Saved,
): void {
  assert.equal(exp.reason, undefined, `${where}: want delegate ${exp.reason}, got schedule retry ${s.retryNumber} after ${s.delayMs} ms`);
  assert.ok(s.retryId, `${where}: schedule without a retry id`);
  if (exp.retryNumber !== undefined) assert.equal(s.retryNumber, exp.retryNumber, `${where}: retry number`);
  if (exp.maxRetries !== undefined) assert.equal(s.maxRetries, exp.maxRetries ?? undefined, `${where}: max retries`);
  if (exp.delayMs !== undefined) assert.equal(s.delayMs, BigInt(exp.delayMs), `${where}: delay`);
  if (exp.delayMsMin !== undefined) assert.ok(s.delayMs >= BigInt(exp.delayMsMin), `${where}: delay ${s.delayMs} < ${exp.delayMsMin}`);
  if (exp.delayMsMax !== undefined) assert.ok(s.delayMs <= BigInt(exp.delayMsMax), `${where}: delay ${s.delayMs} > ${exp.delayMsMax}`);
  if (exp.delaySource !== undefined) assert.equal(enumName(DelaySourceSchema, s.delaySource), exp.delaySource, `${where}: delay source`);
  if (exp.mode !== undefined) assert.equal(enumName(ModeSchema, s.mode), exp.mode, `${where}: mode`);
  if (exp.policyKey !== undefined) assert.equal(s.policyKey, exp.policyKey, `${where}: policy key`);
  if (exp.sameRetryAs !== undefined) assert.equal(s.retryId, lookup(where, exp.sameRetryAs).schedule.retryId, `${where}: retry id`);

  // The event is the scheduled record of this very decision.
  assert.equal(event.sessionId, req.sessionId, `${where}: event session`);
  assert.equal(event.kind.case, "scheduled", `${where}: event kind`);
  if (event.kind.case === "scheduled") {
    const sc = event.kind.value;
    assert.equal(sc.retryId, s.retryId, `${where}: event retry id`);
    assert.equal(sc.retryNumber, s.retryNumber, `${where}: event retry number`);
    assert.equal(sc.maxRetries, s.maxRetries, `${where}: event max retries`);
    assert.equal(sc.delayMs, s.delayMs, `${where}: event delay`);
    assert.equal(sc.delaySource, s.delaySource, `${where}: event delay source`);
    assert.equal(sc.policyKey, s.policyKey, `${where}: event policy key`);
    assert.equal(sc.turn, req.turn, `${where}: event turn`);
    assert.equal(sc.step, req.step, `${where}: event step`);
    assert.equal(sc.provider, req.provider, `${where}: event provider`);
    assert.equal(nanos(sc.dueAt), nanos(s.dueAt), `${where}: event due time`);
  }
  if (exp.line !== undefined) {
    assert.equal(renderRetryLine(event), exp.line, `${where}: UI line`);
  }
}

export function checkDelegate(where: string, req: FailedStepRequest, reason: number, event: Event, exp: Expect): void {
  const name = enumName(DelegateReasonSchema, reason);
  assert.equal(exp.retryNumber, undefined, `${where}: want schedule retry ${exp.retryNumber}, got delegate ${name}`);
  if (exp.reason !== undefined) assert.equal(name, exp.reason, `${where}: delegate reason`);
  assert.equal(event.sessionId, req.sessionId, `${where}: event session`);
  assert.equal(event.kind.case, "delegated", `${where}: event kind`);
  if (event.kind.case === "delegated") {
    assert.equal(event.kind.value.reason, reason, `${where}: event reason`);
    assert.equal(event.kind.value.turn, req.turn, `${where}: event turn`);
    assert.equal(event.kind.value.step, req.step, `${where}: event step`);
  }
  assert.equal(renderRetryLine(event), undefined, `${where}: a delegation has no UI line`);
}

export function checkStarted(where: string, st: RetryStarted, target: Saved): void {
  assert.equal(st.retryId, target.schedule.retryId, `${where}: started retry id`);
  assert.equal(st.retryNumber, target.schedule.retryNumber, `${where}: started retry number`);
  assert.equal(st.turn, target.turn, `${where}: started turn`);
  assert.equal(st.step, target.step, `${where}: started step`);
  assert.ok(nanos(st.startedAt) >= nanos(target.schedule.dueAt), `${where}: started before the due time`);
}

export function checkError(where: string, err: unknown, exp: Expect, lookup: (where: string, name: string) => Saved): void {
  if (exp.error === undefined) {
    throw err;
  }
  assert.ok(err instanceof ConnectError, `${where}: want a ConnectError, got ${String(err)}`);
  assert.equal(codeName(err.code), exp.error.code, `${where}: code (${err.message})`);
  if (exp.error.reason !== undefined) {
    assert.equal(errorReason(err), exp.error.reason, `${where}: error reason (${err.message})`);
  }
  if (exp.error.retry !== undefined) {
    assert.equal(retryPendingId(err), lookup(where, exp.error.retry).schedule.retryId, `${where}: pending retry id`);
  }
  if (exp.error.fieldViolations !== undefined) {
    const got = Object.keys(fieldViolations(err) ?? {}).sort();
    assert.deepEqual(got, [...exp.error.fieldViolations].sort(), `${where}: field violations (${err.message})`);
  }
}
