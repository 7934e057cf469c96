// The user-visible line of a scheduled retry, as the harness's chat UI shows
// it: `Retrying model request (2/5). 4s`.
//
// This module is pure and has no runtime imports (only type imports, which
// compile away), so a browser renderer can import "@retryd/client/render"
// without pulling in Node.js, Connect or the protobuf runtime.

import type { Event, RetryScheduled } from "./gen/retryd/v1/events_pb.js";
import type { Mode } from "./gen/retryd/v1/policy_pb.js";

// MODE_SCHEDULE's number; the annotation makes the compiler check it
// against the generated enum without importing the enum at run time.
const MODE_SCHEDULE: Mode.SCHEDULE = 3;

/**
 * The fields of a scheduled retry that the UI line reads. A RetryScheduled
 * message (the `scheduled` event of the log, or `RetryState.scheduled`) has
 * them all; a plain object with the same fields works too.
 */
export interface RetryLineInput {
  /** 1-based number of the retry within its chain. */
  retryNumber: number;
  /** The chain's finite budget; absent when unlimited. */
  maxRetries?: number | undefined;
  /** The scheduled wait in milliseconds. */
  delayMs: bigint | number;
  /** The mode of the policy that scheduled the retry. */
  mode?: Mode | number | undefined;
  /** The resolved policy; in schedule mode, its schedule. */
  policy?: { schedule: readonly (bigint | number)[] } | undefined;
}

/** An event of the log, or anything with an event's `kind`. */
export type EventLike = Pick<Event, "kind">;

/**
 * Returns the denominator of the UI line: the finite maximum when the chain
 * has one; the schedule's length while a schedule-mode retry is within the
 * schedule (dsh-retry shows 2/5); undefined when unlimited (rendered `∞`).
 */
export function retryDenominator(s: RetryLineInput): number | undefined {
  if (s.maxRetries !== undefined) {
    return s.maxRetries;
  }
  const schedule = s.policy?.schedule ?? [];
  if (s.mode === MODE_SCHEDULE && s.retryNumber <= schedule.length) {
    return schedule.length;
  }
  return undefined;
}

/**
 * Formats a delay in milliseconds exactly as the Go client's RenderRetry
 * does, so both clients render the same text: whole seconds as `4s`,
 * anything else in seconds with one decimal (`1.5s`, `0.5s`) with a
 * trailing `.0` dropped, so that 20 ms prints `0s`. The decimal is rounded
 * like Go's `%.1f` of the float64 number of seconds: exactly, with ties to
 * even (1250 ms prints `1.2s`, 1050 ms `1.1s`).
 */
export function formatDelay(ms: bigint | number): string {
  const n = typeof ms === "bigint" ? ms : BigInt(Math.trunc(ms));
  if (n < 0n) {
    return "-" + formatDelay(-n);
  }
  if (n % 1000n === 0n) {
    return `${n / 1000n}s`;
  }
  // Go's time.Duration.Seconds: whole seconds plus the nanoseconds / 1e9,
  // in float64 arithmetic, which JavaScript numbers share.
  const secs = Number(n / 1000n) + Number((n % 1000n) * 1_000_000n) / 1e9;
  const tenths = roundHalfEven(secs, 10n);
  const text = `${tenths / 10n}.${tenths % 10n}`;
  return (text.endsWith(".0") ? text.slice(0, -2) : text) + "s";
}

// roundHalfEven returns x * scale rounded to an integer, computed on the
// exact binary value of the float64 x (finite, not negative), with ties to
// even, as Go's strconv rounds a fixed-precision decimal.
function roundHalfEven(x: number, scale: bigint): bigint {
  const view = new DataView(new ArrayBuffer(8));
  view.setFloat64(0, x);
  const bits = view.getBigUint64(0);
  const biased = Number((bits >> 52n) & 0x7ffn);
  let mantissa = bits & ((1n << 52n) - 1n);
  let exponent = -1074;
  if (biased !== 0) {
    mantissa |= 1n << 52n;
    exponent = biased - 1075;
  }
  let num = mantissa * scale;
  let den = 1n;
  if (exponent >= 0) {
    num <<= BigInt(exponent);
  } else {
    den <<= BigInt(-exponent);
  }
  let q = num / den;
  const twice = 2n * (num % den);
  if (twice > den || (twice === den && q % 2n === 1n)) {
    q += 1n;
  }
  return q;
}

/**
 * Renders the UI line of a scheduled retry,
 * `Retrying model request (n/max). delay`, where max is the finite maximum,
 * the schedule's length while a schedule-mode retry is within it, or `∞`.
 *
 * Given an event, it renders the event's `scheduled` record and returns
 * undefined for every other kind of event (delegated, started, cancelled,
 * closed), which has no retry line.
 */
export function renderRetryLine(input: RetryScheduled | RetryLineInput): string;
export function renderRetryLine(input: EventLike): string | undefined;
export function renderRetryLine(input: RetryScheduled | RetryLineInput | EventLike): string | undefined;
export function renderRetryLine(input: RetryScheduled | RetryLineInput | EventLike): string | undefined {
  let s: RetryLineInput;
  if ("kind" in input) {
    if (input.kind.case !== "scheduled") {
      return undefined;
    }
    s = input.kind.value;
  } else {
    s = input;
  }
  const max = retryDenominator(s);
  return `Retrying model request (${s.retryNumber}/${max ?? "∞"}). ${formatDelay(s.delayMs)}`;
}
