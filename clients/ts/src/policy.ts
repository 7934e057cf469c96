// The retry rules of retryd's policy package (policy/*.go), ported so the
// client can decide on its own while no retryd replica answers: resolving a
// RetryPolicy to its canonical form and key, and deciding whether one
// failure is retried and after which delay.
//
// Like the Go package it is pure: the caller passes the current time (ms
// since the epoch) and a jitter source, so a test can state every delay.
// Its parity with the server is checked by running the shared conformance
// vectors and policy/testdata/canonical_keys.json against it
// (test/policy.test.ts).

import { DelaySource, DelegateReason, Downstream, Replay } from "./gen/retryd/v1/events_pb.js";
import { Jitter, Mode, RetryAfterOverCap, type RetryPolicy } from "./gen/retryd/v1/policy_pb.js";

export const DEFAULT_NORMAL_MAX_RETRIES = 2;
export const DEFAULT_INITIAL_DELAY_MS = 500;
export const DEFAULT_MAX_DELAY_MS = 10_000;
export const DEFAULT_MULTIPLIER = 2.0;
export const DEFAULT_JITTER_RATIO = 0.1;
export const DEFAULT_TAIL_DELAY_MS = 20_000;
export const DEFAULT_MIN_ATTEMPT_MS = 100;
/** The largest delay any policy may name (a signed 32-bit ms timer). */
export const MAX_DELAY_MS = 2 ** 31 - 1;
export const MAX_SCHEDULE_LEN = 64;
export const MAX_CODES = 64;
export const MAX_CODE_LEN = 64;
/** Never retried in any mode: cancellation stays terminal. */
export const CODE_ABORTED = "ABORTED";
/** The largest retry counter (uint32). */
const MAX_UINT32 = 2 ** 32 - 1;

/** The codes normal mode retries when the policy names none. */
export const DEFAULT_NORMAL_CODES: readonly string[] = ["EMPTY_RESPONSE", "RATE_LIMIT", "SERVER", "TIMEOUT", "TRANSPORT"];
/** The codes schedule mode retries when the policy names none (the dsh-retry plugin's list). */
export const DEFAULT_SCHEDULE_CODES: readonly string[] = [
  "EMPTY_RESPONSE", "RATE_LIMIT", "SERVER", "TIMEOUT", "TRANSPORT",
  "PI_AI_ERROR", "AUTH", "QUOTA", "ACCOUNT_QUOTA", "ACCOUNT_TOKEN_INVALID",
  "INVALID_CREDENTIAL", "MALFORMED_RESPONSE", "HTTP_*",
];
/** Schedule mode's delay list when the policy names none. */
export const DEFAULT_SCHEDULE: readonly number[] = [2000, 5000, 5000, 5000, 10000];

/** One invalid field of a policy, named by its path relative to the policy. */
export interface FieldViolation {
  field: string;
  description: string;
}

/** Every invalid field of a policy, as the server's BadRequest would list them. */
export class PolicyValidationError extends Error {
  override name = "PolicyValidationError";
  constructor(readonly violations: FieldViolation[]) {
    super("policy: invalid: " + violations.map((v) => `${v.field}: ${v.description}`).join("; "));
  }
}

/** A resolved retry policy: every default filled in, validated, keyed. Immutable. */
export interface ResolvedPolicy {
  readonly mode: Mode;
  /** The finite budget; meaningful only when bounded. */
  readonly maxRetries: number;
  readonly bounded: boolean;
  /** The sorted retryable codes (entries ending in * are prefix rules); empty in always mode. */
  readonly codes: readonly string[];
  readonly initialDelayMs: number;
  readonly maxDelayMs: number;
  readonly multiplier: number;
  readonly jitterRatio: number;
  readonly jitter: Jitter;
  readonly schedule: readonly number[];
  readonly tailDelayMs: number;
  readonly overCap: RetryAfterOverCap;
  readonly minAttemptMs: number;
  /** The canonical policy key, identical to the server's. */
  readonly key: string;
}

/** A provider's delay instruction after parsing. */
export interface RetryAfter {
  /** False when there was no instruction or it was malformed. */
  valid: boolean;
  /** The requested delay (meaningful when !over). */
  ms: number;
  /** Too large to represent as a timer: over any cap. */
  over: boolean;
}

const NO_RETRY_AFTER: RetryAfter = { valid: false, ms: 0, over: false };

/** Everything about one failure a decision depends on, besides the policy. */
export interface Attempt {
  /** How many retries the chain has already scheduled. */
  retries: number;
  /** The canonical failure code. */
  code: string;
  retryAfter?: RetryAfter;
  downstream?: Downstream;
  replay?: Replay;
  /** The logical operation's deadline in ms since the epoch. */
  deadlineMs?: number;
}

/** The outcome of {@link decide}. */
export type PolicyDecision =
  | { schedule: true; retryNumber: number; delayMs: number; source: DelaySource }
  | { schedule: false; reason: DelegateReason; detail: string };

/** A jitter source: returns a number in [0, 1). */
export type Rand = () => number;

class Violations {
  readonly list: FieldViolation[] = [];
  add(field: string, description: string): void {
    this.list.push({ field, description });
  }
}

// toNum turns a proto uint64 (bigint) into a number, saturating beyond
// 2^53 (every such value is far over MAX_DELAY_MS anyway).
function toNum(v: bigint | number): number {
  return typeof v === "number" ? v : v > BigInt(Number.MAX_SAFE_INTEGER) ? Number.MAX_SAFE_INTEGER : Number(v);
}

/**
 * Validates p and fills in every default; undefined is the built-in
 * default policy (normal mode). Throws {@link PolicyValidationError}.
 */
export function resolvePolicy(p?: RetryPolicy): ResolvedPolicy {
  const vs = new Violations();
  let mode = p?.mode ?? Mode.UNSPECIFIED;
  if (mode === Mode.UNSPECIFIED) mode = Mode.NORMAL;
  if (Mode[mode] === undefined) {
    vs.add("mode", `unknown mode ${mode}`);
    throw new PolicyValidationError(vs.list);
  }
  let overCap = p?.retryAfterOverCap ?? RetryAfterOverCap.UNSPECIFIED;
  if (RetryAfterOverCap[overCap] === undefined) {
    vs.add("retry_after_over_cap", `unknown value ${overCap}`);
  }
  let minAttemptMs = DEFAULT_MIN_ATTEMPT_MS;
  if (p?.minAttemptMs !== undefined) {
    const v = toNum(p.minAttemptMs);
    if (v > MAX_DELAY_MS) vs.add("min_attempt_ms", `must be at most ${MAX_DELAY_MS} ms, got ${p.minAttemptMs}`);
    minAttemptMs = v;
  }
  const out = {
    mode,
    maxRetries: 0,
    bounded: false,
    codes: [] as string[],
    initialDelayMs: 0,
    maxDelayMs: 0,
    multiplier: 0,
    jitterRatio: 0,
    jitter: Jitter.UNSPECIFIED,
    schedule: [] as number[],
    tailDelayMs: 0,
    overCap,
    minAttemptMs,
    key: "",
  };
  const schedule = p?.schedule ?? [];
  switch (mode) {
    case Mode.NORMAL:
      out.bounded = true;
      out.maxRetries = p?.maxRetries ?? DEFAULT_NORMAL_MAX_RETRIES;
      out.codes = resolveCodes(vs, p?.retryableCodes ?? [], DEFAULT_NORMAL_CODES);
      resolveBackoff(vs, p, out);
      if (schedule.length > 0) vs.add("schedule", "only allowed in schedule mode");
      if (p?.tailDelayMs !== undefined) vs.add("tail_delay_ms", "only allowed in schedule mode");
      if (out.overCap === RetryAfterOverCap.UNSPECIFIED) out.overCap = RetryAfterOverCap.DELEGATE;
      break;
    case Mode.ALWAYS:
      if (p?.maxRetries !== undefined) {
        vs.add("max_retries", "always mode is unlimited; use normal or schedule mode for a finite budget");
      }
      if ((p?.retryableCodes.length ?? 0) > 0) {
        vs.add(
          "retryable_codes",
          "always mode retries every code except ABORTED; codes are only allowed in normal and schedule modes",
        );
      }
      resolveBackoff(vs, p, out);
      if (schedule.length > 0) vs.add("schedule", "only allowed in schedule mode");
      if (p?.tailDelayMs !== undefined) vs.add("tail_delay_ms", "only allowed in schedule mode");
      if (out.overCap === RetryAfterOverCap.UNSPECIFIED) out.overCap = RetryAfterOverCap.LOCAL;
      break;
    case Mode.SCHEDULE:
      if (p?.maxRetries !== undefined) {
        out.bounded = true;
        out.maxRetries = p.maxRetries;
      }
      out.codes = resolveCodes(vs, p?.retryableCodes ?? [], DEFAULT_SCHEDULE_CODES);
      if (p?.backoff !== undefined) vs.add("backoff", "not allowed in schedule mode; use schedule and tail_delay_ms");
      resolveSchedule(vs, p, out);
      if (out.overCap === RetryAfterOverCap.UNSPECIFIED) out.overCap = RetryAfterOverCap.LOCAL;
      break;
  }
  if (vs.list.length > 0) throw new PolicyValidationError(vs.list);
  out.key = canonicalKey(out);
  return Object.freeze(out);
}

type Mutable = { -readonly [K in keyof ResolvedPolicy]: ResolvedPolicy[K] extends readonly (infer E)[] ? E[] : ResolvedPolicy[K] };

function resolveBackoff(vs: Violations, p: RetryPolicy | undefined, out: Mutable): void {
  out.initialDelayMs = DEFAULT_INITIAL_DELAY_MS;
  out.maxDelayMs = DEFAULT_MAX_DELAY_MS;
  out.multiplier = DEFAULT_MULTIPLIER;
  out.jitterRatio = DEFAULT_JITTER_RATIO;
  out.jitter = Jitter.SYMMETRIC;
  const b = p?.backoff;
  if (b === undefined) return;
  if (b.initialDelayMs !== undefined) out.initialDelayMs = toNum(b.initialDelayMs);
  if (b.maxDelayMs !== undefined) out.maxDelayMs = toNum(b.maxDelayMs);
  if (out.initialDelayMs === 0) {
    vs.add("backoff.initial_delay_ms", "must be greater than 0");
  } else if (out.initialDelayMs > MAX_DELAY_MS) {
    vs.add("backoff.initial_delay_ms", `must be at most ${MAX_DELAY_MS} ms, got ${b.initialDelayMs}`);
  }
  if (out.maxDelayMs > MAX_DELAY_MS) {
    vs.add("backoff.max_delay_ms", `must be at most ${MAX_DELAY_MS} ms, got ${b.maxDelayMs}`);
  } else if (out.maxDelayMs < out.initialDelayMs) {
    vs.add("backoff.max_delay_ms", `must be at least initial_delay_ms (${out.initialDelayMs}), got ${out.maxDelayMs}`);
  }
  if (b.multiplier !== undefined) {
    out.multiplier = b.multiplier;
    if (!Number.isFinite(out.multiplier) || out.multiplier < 1) {
      vs.add("backoff.multiplier", `must be a finite number >= 1, got ${goFloat(out.multiplier)}`);
    }
  }
  if (b.jitterRatio !== undefined) {
    out.jitterRatio = b.jitterRatio;
    if (Number.isNaN(out.jitterRatio) || out.jitterRatio < 0 || out.jitterRatio > 1) {
      vs.add("backoff.jitter_ratio", `must be within [0, 1], got ${goFloat(out.jitterRatio)}`);
    }
    if (out.jitterRatio === 0) out.jitterRatio = 0; // -0 behaves as 0 and must give the same key
  }
  switch (b.jitter) {
    case Jitter.UNSPECIFIED:
    case Jitter.SYMMETRIC:
      break;
    case Jitter.FULL:
      out.jitter = Jitter.FULL;
      break;
    default:
      vs.add("backoff.jitter", `unknown jitter ${b.jitter}`);
  }
}

function resolveSchedule(vs: Violations, p: RetryPolicy | undefined, out: Mutable): void {
  out.schedule = [...DEFAULT_SCHEDULE];
  const s = p?.schedule ?? [];
  if (s.length > 0) {
    if (s.length > MAX_SCHEDULE_LEN) {
      vs.add("schedule", `at most ${MAX_SCHEDULE_LEN} entries, got ${s.length}`);
      return;
    }
    s.forEach((d, i) => {
      const n = toNum(d);
      if (n === 0 || n > MAX_DELAY_MS) vs.add(`schedule[${i}]`, `must be within [1, ${MAX_DELAY_MS}] ms, got ${d}`);
    });
    out.schedule = s.map(toNum);
  }
  out.tailDelayMs = DEFAULT_TAIL_DELAY_MS;
  if (p?.tailDelayMs !== undefined) {
    out.tailDelayMs = toNum(p.tailDelayMs);
    if (out.tailDelayMs === 0 || out.tailDelayMs > MAX_DELAY_MS) {
      vs.add("tail_delay_ms", `must be within [1, ${MAX_DELAY_MS}] ms, got ${p.tailDelayMs}`);
    }
  }
}

/**
 * Why code is not a valid failure code, or "" when it is: an upper-snake
 * identifier, A-Z first, then A-Z, 0-9 or _, at most 64 bytes.
 */
export function validateCode(code: string): string {
  if (code === "") return "must not be empty";
  if (code.length > MAX_CODE_LEN || (/[^\x00-\x7f]/.test(code) && Buffer.byteLength(code, "utf8") > MAX_CODE_LEN)) {
    return `must be at most ${MAX_CODE_LEN} bytes`;
  }
  if (!/^[A-Z][A-Z0-9_]*$/.test(code)) {
    return `must be an upper-snake identifier such as RATE_LIMIT, got ${JSON.stringify(code)}`;
  }
  return "";
}

// byteOrder sorts as Go's slices.Sorted does on strings: by UTF-8 bytes
// (for ASCII, which every valid code is, the same as UTF-16 order).
function byteOrder(a: string, b: string): number {
  if (/^[\x00-\x7f]*$/.test(a) && /^[\x00-\x7f]*$/.test(b)) return a < b ? -1 : a > b ? 1 : 0;
  return Buffer.compare(Buffer.from(a, "utf8"), Buffer.from(b, "utf8"));
}

function resolveCodes(vs: Violations, codes: readonly string[], defaults: readonly string[]): string[] {
  if (codes.length === 0) return [...defaults].sort(byteOrder);
  if (codes.length > MAX_CODES) {
    vs.add("retryable_codes", `at most ${MAX_CODES} codes, got ${codes.length}`);
    return [];
  }
  const seen = new Set<string>();
  codes.forEach((c, i) => {
    const field = `retryable_codes[${i}]`;
    if (c === "*") {
      vs.add(field, "a bare * would retry every failure; name the codes or use a prefix rule such as HTTP_*");
      return;
    }
    const msg = validateCode(c.endsWith("*") ? c.slice(0, -1) : c);
    if (msg !== "") {
      vs.add(field, msg);
      return;
    }
    if (c === CODE_ABORTED) {
      vs.add(field, "ABORTED is never retried: cancellation stays terminal");
      return;
    }
    if (seen.has(c)) {
      vs.add(field, `duplicate code ${c}`);
      return;
    }
    seen.add(c);
  });
  return [...codes].sort(byteOrder);
}

/** Whether the policy may retry a failure with this code. */
export function retryable(p: ResolvedPolicy, code: string): boolean {
  if (code === CODE_ABORTED) return false;
  if (p.mode === Mode.ALWAYS) return true;
  for (const c of p.codes) {
    if (c.endsWith("*") ? code.startsWith(c.slice(0, -1)) : c === code) return true;
  }
  return false;
}

/** The largest local delay: the backoff cap, or the largest schedule or tail delay. */
export function delayCapMs(p: ResolvedPolicy): number {
  if (p.mode !== Mode.SCHEDULE) return p.maxDelayMs;
  return Math.max(...p.schedule, p.tailDelayMs);
}

/** The unjittered backoff delay of retry n (1-based): min(initial * multiplier^(n-1), max). */
export function backoffBase(p: ResolvedPolicy, n: number): number {
  return Math.min(p.initialDelayMs * Math.pow(p.multiplier, n - 1), p.maxDelayMs);
}

/**
 * The closed range of jittered delays for retry n in whole ms:
 * [base*(1-r), min(base*(1+r), max)] for symmetric jitter, [0, base] for full.
 */
export function backoffBounds(p: ResolvedPolicy, n: number): [number, number] {
  const base = backoffBase(p, n);
  if (p.jitter === Jitter.FULL) return [0, Math.floor(base)];
  const lo = Math.ceil(base * (1 - p.jitterRatio));
  let hi = Math.floor(Math.min(base * (1 + p.jitterRatio), p.maxDelayMs));
  if (hi < lo) hi = lo;
  return [lo, hi];
}

function localDelay(p: ResolvedPolicy, n: number, rand: Rand): [number, DelaySource] {
  if (p.mode === Mode.SCHEDULE) {
    const s = p.schedule[n - 1];
    return s !== undefined ? [s, DelaySource.SCHEDULE] : [p.tailDelayMs, DelaySource.TAIL];
  }
  const [lo, hi] = backoffBounds(p, n);
  let u = rand();
  if (!(u >= 0 && u < 1)) u = 0;
  return [lo + Math.round(u * (hi - lo)), DelaySource.BACKOFF];
}

function delegate(reason: DelegateReason, detail: string): PolicyDecision {
  return { schedule: false, reason, detail };
}

function retryAfterString(r: RetryAfter): string {
  if (!r.valid) return "no retry-after";
  if (r.over) return "an unbounded delay";
  return `${r.ms} ms`;
}

/**
 * Applies the policy to one failure, in the server's order: ABORTED, unsafe
 * replay, always mode's downstream handshake, code eligibility, the finite
 * budget, the local or provider delay, and the deadline.
 */
export function decide(p: ResolvedPolicy, a: Attempt, nowMs: number, rand: Rand): PolicyDecision {
  if (a.code === CODE_ABORTED) {
    return delegate(DelegateReason.CODE_NOT_RETRYABLE, "ABORTED is never retried: cancellation stays terminal");
  }
  if (a.replay === Replay.UNSAFE) {
    return delegate(
      DelegateReason.REPLAY_UNSAFE,
      "the caller marked the request unsafe to replay; reconcile its outcome before trying again",
    );
  }
  if (p.mode === Mode.ALWAYS) {
    switch (a.downstream) {
      case Downstream.DECLINED:
        break;
      case Downstream.HANDLED:
        return delegate(DelegateReason.DOWNSTREAM_HANDLED, "a downstream recovery policy handled the failure; no retry scheduled");
      default:
        return delegate(
          DelegateReason.DOWNSTREAM_FIRST,
          "always mode asks downstream recovery first; report the step again with downstream DECLINED or HANDLED",
        );
    }
  }
  if (!retryable(p, a.code)) {
    return delegate(DelegateReason.CODE_NOT_RETRYABLE, `code ${a.code} is not retryable under policy ${p.key}`);
  }
  if (a.retries >= MAX_UINT32) {
    return delegate(DelegateReason.BUDGET_EXHAUSTED, `the chain's retry counter is exhausted (${a.retries} retries)`);
  }
  if (p.bounded && a.retries >= p.maxRetries) {
    return delegate(DelegateReason.BUDGET_EXHAUSTED, `${a.retries} of ${p.maxRetries} retries used`);
  }
  const retryNumber = a.retries + 1;
  let [delayMs, source] = localDelay(p, retryNumber, rand);
  const ra = a.retryAfter;
  if (ra?.valid) {
    const cap = delayCapMs(p);
    const overCap = ra.over || ra.ms > cap;
    const honorable = !ra.over && ra.ms <= MAX_DELAY_MS;
    if (!overCap) {
      [delayMs, source] = [ra.ms, DelaySource.PROVIDER_RETRY_AFTER];
    } else if (p.overCap === RetryAfterOverCap.HONOR && honorable) {
      [delayMs, source] = [ra.ms, DelaySource.PROVIDER_RETRY_AFTER];
    } else if (p.overCap === RetryAfterOverCap.LOCAL || (p.overCap === RetryAfterOverCap.HONOR && p.mode !== Mode.NORMAL)) {
      // Keep the local delay: unlimited modes must not end on a provider
      // instruction, even one too large to honour.
    } else {
      return delegate(
        DelegateReason.RETRY_AFTER_OVER_CAP,
        `provider asked for ${retryAfterString(ra)}, over the policy's cap of ${cap} ms`,
      );
    }
  }
  if (a.deadlineMs !== undefined) {
    const need = delayMs + p.minAttemptMs;
    const left = a.deadlineMs - nowMs;
    if (left < need) {
      return delegate(
        DelegateReason.DEADLINE,
        `a ${delayMs} ms delay plus a ${p.minAttemptMs} ms attempt does not fit the ${Math.max(Math.trunc(left), 0)} ms left before the deadline`,
      );
    }
  }
  return { schedule: true, retryNumber, delayMs, source };
}

/**
 * Interprets the two ways a failure can carry a provider delay: ms (takes
 * precedence when present and not negative) and header (a raw HTTP
 * Retry-After, resolved against nowMs). Negative or malformed values are
 * ignored.
 */
export function providerRetryAfter(ms: bigint | number | undefined, header: string | undefined, nowMs: number): RetryAfter {
  if (ms !== undefined && ms >= 0) {
    const v = typeof ms === "bigint" ? ms : BigInt(Math.trunc(ms));
    if (v > BigInt(MAX_DELAY_MS)) return { valid: true, ms: 0, over: true };
    return { valid: true, ms: Number(v), over: false };
  }
  if (header !== undefined) return parseRetryAfter(header, nowMs);
  return NO_RETRY_AFTER;
}

/**
 * Parses an HTTP Retry-After value (RFC 9110 §10.2.3) as Go's
 * policy.ParseRetryAfter does: delta-seconds, or an HTTP-date in one of
 * the three forms net/http accepts. A date in the past means no wait.
 */
export function parseRetryAfter(value: string, nowMs: number): RetryAfter {
  const v = value.replace(/^[ \t\n\v\f\r\u0085\u00a0]+|[ \t\n\v\f\r\u0085\u00a0]+$/g, "");
  if (v === "") return NO_RETRY_AFTER;
  if (/^[0-9]+$/.test(v)) {
    const secs = BigInt(v);
    if (secs > BigInt(Math.floor(MAX_DELAY_MS / 1000))) return { valid: true, ms: 0, over: true };
    return { valid: true, ms: Number(secs) * 1000, over: false };
  }
  const t = parseHTTPDate(v);
  if (t === undefined) return NO_RETRY_AFTER;
  const d = t - nowMs;
  if (d <= 0) return { valid: true, ms: 0, over: false };
  if (d > MAX_DELAY_MS) return { valid: true, ms: 0, over: true };
  return { valid: true, ms: Math.ceil(d), over: false }; // round up: a little longer is always safe
}

const MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"];
const DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];
const LONG_DAYS = ["sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday"];

// The three layouts of net/http.ParseTime, with Go's time.Parse rules:
// a space matches a run of spaces, names are case-insensitive, an hour
// may have one digit, a fraction may follow the seconds.
const IMF = /^([A-Za-z]{3}), +(\d\d) +([A-Za-z]{3}) +(\d{4}) +(\d\d?):(\d\d):(\d\d)((?:[.,]\d+)?) +GMT$/;
const RFC850 = /^([A-Za-z]+), +(\d\d)-([A-Za-z]{3})-(\d\d) +(\d\d?):(\d\d):(\d\d)((?:[.,]\d+)?) +([A-Z]{3,5}|GMT[+-]\d{1,2})$/;
const ASCTIME = /^([A-Za-z]{3}) +([A-Za-z]{3}) +(\d\d?) +(\d\d?):(\d\d):(\d\d)((?:[.,]\d+)?) +(\d{4})$/;

// parseHTTPDate returns the time in ms since the epoch (with a fraction
// for sub-millisecond digits), or undefined when v is not an HTTP-date.
function parseHTTPDate(v: string): number | undefined {
  let m = IMF.exec(v);
  if (m) {
    if (!DAYS.includes(m[1]!.toLowerCase())) return undefined;
    return civil(+m[2]!, m[3]!, +m[5]!, +m[6]!, +m[7]!, m[8]!, +m[4]!);
  }
  m = RFC850.exec(v);
  if (m) {
    if (!LONG_DAYS.includes(m[1]!.toLowerCase())) return undefined;
    const yy = +m[4]!;
    const zone = m[9]!;
    if (!zoneOK(zone)) return undefined;
    let offsetH = 0;
    if (zone.startsWith("GMT") && zone.length > 3) offsetH = Number(zone.slice(3));
    const t = civil(+m[2]!, m[3]!, +m[5]!, +m[6]!, +m[7]!, m[8]!, yy >= 69 ? 1900 + yy : 2000 + yy);
    return t === undefined ? undefined : t - offsetH * 3_600_000;
  }
  m = ASCTIME.exec(v);
  if (m) {
    if (!DAYS.includes(m[1]!.toLowerCase())) return undefined;
    return civil(+m[3]!, m[2]!, +m[4]!, +m[5]!, +m[6]!, m[7]!, +m[8]!);
  }
  return undefined;
}

// zoneOK is Go's parseTimeZone rule for an abbreviation: three upper-case
// letters, four ending in T (or WITA), five ending in T, or GMT±h.
function zoneOK(z: string): boolean {
  if (z.startsWith("GMT") && z.length > 3) {
    const h = Number(z.slice(3));
    return h >= -23 && h <= 23;
  }
  switch (z.length) {
    case 3:
      return true;
    case 4:
      return z[3] === "T" || z === "WITA";
    case 5:
      return z[4] === "T";
    default:
      return false;
  }
}

// civil is the UTC time of a parsed date in ms, or undefined when a
// field is out of range (Go's time.Parse refuses 32 March or 24:00).
function civil(day: number, month: string, hour: number, min: number, sec: number, frac: string, year: number): number | undefined {
  const mi = MONTHS.indexOf(month.toLowerCase());
  if (mi < 0 || !Number.isFinite(year) || hour >= 24 || min >= 60 || sec >= 60) return undefined;
  const daysIn = new Date(Date.UTC(year, mi + 1, 0)).getUTCDate();
  if (day < 1 || day > daysIn) return undefined;
  const base = Date.UTC(year, mi, day, hour, min, sec);
  const fraction = frac === "" ? 0 : Number("0." + frac.slice(1)) * 1000;
  return base + fraction;
}

function modeName(m: Mode): string {
  return (Mode[m] ?? String(m)).toLowerCase();
}

function jitterName(j: Jitter): string {
  return (Jitter[j] ?? String(j)).toLowerCase();
}

function overCapName(o: RetryAfterOverCap): string {
  return (RetryAfterOverCap[o] ?? String(o)).toLowerCase();
}

// canonicalKey renders the policy as the server does (policy.canonicalKey):
//
//	normal;max=2;codes=A,B;backoff=500..10000*2;jitter=symmetric:0.1;over_cap=delegate;min_attempt=100
//	always;max=inf;backoff=1000..30000*2;jitter=symmetric:0.2;over_cap=local;min_attempt=100
//	schedule;max=inf;codes=A,HTTP_*;schedule=2000,5000;tail=20000;over_cap=local;min_attempt=100
function canonicalKey(p: Mutable): string {
  let b = modeName(p.mode) + ";max=" + (p.bounded ? String(p.maxRetries) : "inf");
  if (p.mode !== Mode.ALWAYS) b += ";codes=" + p.codes.join(",");
  if (p.mode === Mode.SCHEDULE) {
    b += ";schedule=" + p.schedule.join(",") + ";tail=" + String(p.tailDelayMs);
  } else {
    b += `;backoff=${p.initialDelayMs}..${p.maxDelayMs}*${goFloat(p.multiplier)};jitter=${jitterName(p.jitter)}`;
    if (p.jitter === Jitter.SYMMETRIC) b += ":" + goFloat(p.jitterRatio);
  }
  return b + ";over_cap=" + overCapName(p.overCap) + ";min_attempt=" + String(p.minAttemptMs);
}

/**
 * Formats f as Go's strconv.FormatFloat(f, 'g', -1, 64) (and %v): the
 * shortest digits that round-trip, in exponent form when the exponent is
 * below -4 or at least 6 (Go decides with precision 6 when printing the
 * shortest digits), with a sign and at least two exponent digits.
 */
export function goFloat(f: number): string {
  if (Number.isNaN(f)) return "NaN";
  if (f === Infinity) return "+Inf";
  if (f === -Infinity) return "-Inf";
  if (f === 0) return Object.is(f, -0) ? "-0" : "0";
  const [mant, expStr] = f.toExponential().split("e") as [string, string];
  const exp = Number(expStr);
  if (exp < -4 || exp >= 6) {
    const abs = Math.abs(exp);
    return `${mant}e${exp < 0 ? "-" : "+"}${abs < 10 ? "0" : ""}${abs}`;
  }
  // Between 1e-4 and 1e6 JS prints the same shortest digits without an exponent.
  return String(f);
}
