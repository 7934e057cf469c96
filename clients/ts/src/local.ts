// The client's own decisions while no retryd replica answers (degraded
// mode): the server's policy engine (./policy.ts) over retry chains kept in
// this process, per (session, provider, policy key), bounded in number,
// with a conservative cap on how many retries a chain may take locally.
//
// What it produces has the server's shapes: a FailedStepResponse whose
// event is a scheduled or delegated Event, RetryStarted confirmations and
// ChainClosed records. A local record is marked so nobody mistakes it for
// the server's: its sequence is 0 (the server numbers its log from 1), a
// local retry id starts with "local-", and the detail of a local schedule
// or delegation starts with "decided locally".

import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { timestampFromMs, timestampMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";
import { randomUUID } from "node:crypto";
import {
  ChainClosedSchema,
  CloseReason,
  DelegateReason,
  Downstream,
  EventSchema,
  FailureSchema,
  RetryStartedSchema,
  type ChainClosed,
  type Event,
  type RetryScheduled,
  type RetryStarted,
} from "./gen/retryd/v1/events_pb.js";
import { BackoffSchema, Mode, RetryPolicySchema, type RetryPolicy } from "./gen/retryd/v1/policy_pb.js";
import {
  FailedStepResponseSchema,
  type FailedStepRequest,
  type FailedStepResponse,
  type Schedule,
} from "./gen/retryd/v1/retry_service_pb.js";
import { badRequestDetail } from "./errors.js";
import { decide, PolicyValidationError, providerRetryAfter, resolvePolicy, type Rand, type ResolvedPolicy } from "./policy.js";

/** The prefix of every retry id the client made up itself. */
export const LOCAL_RETRY_ID_PREFIX = "local-";
/** The prefix of the detail of every local schedule and delegation. */
export const LOCAL_DETAIL_PREFIX = "decided locally";
/** How many local chains the client keeps by default (least recently used go first). */
export const DEFAULT_LOCAL_MAX_CHAINS = 10_000;
/** How many retries one chain of an unlimited policy may take locally by default. */
export const DEFAULT_LOCAL_RETRY_BUDGET = 5;

/** Whether an event (or retry id) was made by the client in degraded mode. */
export function isLocal(x: Event | string): boolean {
  if (typeof x === "string") {
    return x.startsWith(LOCAL_RETRY_ID_PREFIX);
  }
  switch (x.kind.case) {
    case "scheduled":
    case "started":
    case "cancelled":
      return x.sequence === 0n && x.kind.value.retryId.startsWith(LOCAL_RETRY_ID_PREFIX);
    case "delegated":
      return x.sequence === 0n && x.kind.value.detail.startsWith(LOCAL_DETAIL_PREFIX);
    case "closed":
      return x.sequence === 0n;
    default:
      return false;
  }
}

/** A RetryPolicy as an object literal. */
export type RetryPolicyInit = MessageInitShape<typeof RetryPolicySchema>;

/** Options of the local decider (see {@link ClientOptions.degraded}). */
export interface LocalOptions {
  /**
   * The server's named policies (its policy file's `policies`), so a
   * report by policy_name can be decided locally; a name missing here is
   * refused locally with INVALID_ARGUMENT (policy_name).
   */
  policies?: Record<string, RetryPolicyInit>;
  /**
   * The server's per-provider defaults (its policy file's `providers`),
   * for reports without a policy; a provider missing here gets the
   * built-in default (normal mode, 2 retries).
   */
  providerPolicies?: Record<string, RetryPolicyInit>;
  /**
   * The most retries one chain may take locally under a bounded policy:
   * min(this, the policy's max_retries). Default: the policy's own budget.
   */
  maxRetries?: number;
  /**
   * The most retries one chain may take locally under an unlimited policy
   * (always mode, schedule mode without max_retries); their delays stay the
   * policy's. Default {@link DEFAULT_LOCAL_RETRY_BUDGET}.
   */
  retryBudget?: number;
  /** How many chains to keep (least recently used go first). Default {@link DEFAULT_LOCAL_MAX_CHAINS}. */
  maxChains?: number;
  /** The jitter source (default Math.random). */
  rand?: Rand;
  /** The clock in ms since the epoch (default Date.now). */
  now?: () => number;
}

interface LocalChain {
  session: string;
  provider: string;
  policyKey: string;
  mode: Mode;
  retries: number;
  open: boolean;
}

/** A retry the local decider scheduled. */
interface LocalRetry {
  id: string;
  session: string;
  turn: bigint;
  step: bigint;
  retryNumber: number;
  dueMs: number;
  chain: string;
  status: "pending" | "started" | "cancelled";
}

const resolved = new Map<string, ResolvedPolicy>();

/**
 * LocalDecider decides failed steps as retryd would, from chains it keeps in
 * this process. It is pure apart from its clock, jitter source and id
 * generator, all of which the options can replace.
 */
export class LocalDecider {
  readonly #chains = new Map<string, LocalChain>();
  readonly #retries = new Map<string, LocalRetry>();
  // The last report of each session and its answer: the same report again
  // gets the same answer, as from the server's step records.
  readonly #records = new Map<string, { turn: bigint; step: bigint; phase: Downstream; response: FailedStepResponse }>();
  readonly #opts: Required<Omit<LocalOptions, "policies" | "providerPolicies" | "maxRetries">> & LocalOptions;

  constructor(options: LocalOptions = {}) {
    this.#opts = {
      ...options,
      retryBudget: options.retryBudget ?? DEFAULT_LOCAL_RETRY_BUDGET,
      maxChains: Math.max(1, options.maxChains ?? DEFAULT_LOCAL_MAX_CHAINS),
      rand: options.rand ?? Math.random,
      now: options.now ?? Date.now,
    };
  }

  /** How many chains it holds (at most maxChains). */
  get chainCount(): number {
    return this.#chains.size;
  }

  /**
   * Decides one failed step. Throws a ConnectError INVALID_ARGUMENT with
   * the server's field paths for an invalid inline policy or an unknown
   * policy name.
   */
  failedStep(req: FailedStepRequest): FailedStepResponse {
    const phase = req.downstream === Downstream.UNSPECIFIED ? Downstream.NOT_ASKED : req.downstream;
    const rec = this.#records.get(req.sessionId);
    if (rec !== undefined && rec.turn === req.turn && rec.step === req.step && rec.phase === phase) {
      return rec.response;
    }
    const response = this.#decide(req, phase);
    this.#records.delete(req.sessionId);
    this.#records.set(req.sessionId, { turn: req.turn, step: req.step, phase, response });
    while (this.#records.size > this.#opts.maxChains) {
      this.#records.delete(this.#records.keys().next().value as string);
    }
    return response;
  }

  #decide(req: FailedStepRequest, phase: Downstream): FailedStepResponse {
    const now = this.#opts.now();
    const policy = this.#policyOf(req);
    const failure = req.failure ?? create(FailureSchema);
    if (policy === undefined) {
      return delegated(req, now, phase, DelegateReason.NO_PROVIDER, "the failure happened before any provider adapter was selected");
    }
    const key = chainKey(req.sessionId, req.provider, policy.key);
    const chain = this.#touch(key);
    const used = chain?.open ? chain.retries : 0;
    const d = decide(
      policy,
      {
        retries: used,
        code: failure.code,
        retryAfter: providerRetryAfter(failure.providerRetryAfterMs, failure.retryAfter, now),
        downstream: phase,
        replay: req.replay,
        ...(req.deadline !== undefined ? { deadlineMs: timestampMs(req.deadline) } : {}),
      },
      now,
      this.#opts.rand,
    );
    if (!d.schedule) {
      const resp = delegated(req, now, phase, d.reason, d.detail, policy);
      if (d.reason === DelegateReason.BUDGET_EXHAUSTED && chain?.open) {
        chain.open = false;
      }
      return resp;
    }
    const cap = this.#cap(policy);
    if (used >= cap) {
      if (chain?.open) chain.open = false;
      return delegated(
        req,
        now,
        phase,
        DelegateReason.BUDGET_EXHAUSTED,
        `${used} of ${cap} retries used: the local cap while no retryd replica answers`,
        policy,
      );
    }
    let c = chain;
    if (c === undefined) {
      c = { session: req.sessionId, provider: req.provider, policyKey: policy.key, mode: policy.mode, retries: 0, open: false };
      this.#add(key, c);
    }
    if (!c.open) {
      c.open = true;
      c.retries = 0;
    }
    c.retries = d.retryNumber;
    const retry: LocalRetry = {
      id: LOCAL_RETRY_ID_PREFIX + randomUUID(),
      session: req.sessionId,
      turn: req.turn,
      step: req.step,
      retryNumber: d.retryNumber,
      dueMs: now + d.delayMs,
      chain: key,
      status: "pending",
    };
    this.#retries.set(retry.id, retry);
    this.#trimRetries();
    const dueAt = timestampFromMs(retry.dueMs);
    const maxRetries = policy.bounded ? policy.maxRetries : undefined;
    const detail = `${LOCAL_DETAIL_PREFIX}: no retryd replica answered`;
    // The messages are written out rather than made by create(): this is
    // the hot path of degraded mode, and the compiler checks every field.
    const scheduled: RetryScheduled = {
      $typeName: "retryd.v1.RetryScheduled",
      retryId: retry.id,
      turn: req.turn,
      step: req.step,
      logicalTurnId: req.logicalTurnId,
      provider: req.provider,
      mode: policy.mode,
      policyKey: policy.key,
      failure,
      retryNumber: d.retryNumber,
      maxRetries,
      delayMs: BigInt(d.delayMs),
      delaySource: d.source,
      dueAt,
      policy: sharedPolicyProto(policy),
      traceparent: "",
      detail,
    };
    const event: Event = {
      $typeName: "retryd.v1.Event",
      sequence: 0n,
      sessionId: req.sessionId,
      time: timestampFromMs(now),
      kind: { case: "scheduled", value: scheduled },
    };
    const schedule: Schedule = {
      $typeName: "retryd.v1.Schedule",
      retryId: retry.id,
      retryNumber: d.retryNumber,
      maxRetries,
      delayMs: scheduled.delayMs,
      delaySource: d.source,
      dueAt,
      policyKey: policy.key,
      mode: policy.mode,
      detail,
    };
    return {
      $typeName: "retryd.v1.FailedStepResponse",
      decision: { $typeName: "retryd.v1.Decision", outcome: { case: "schedule", value: schedule } },
      event,
    };
  }

  /**
   * Starts a local retry once its due time has passed: returns its
   * RetryStarted (once; again the same for a started retry), or undefined
   * for an unknown or cancelled retry, or one not yet due. `waited` says
   * the caller has waited the delay on a timer, which may fire a
   * millisecond before the clock reaches the due time.
   */
  start(retryId: string, waited = false): RetryStarted | undefined {
    const r = this.#retries.get(retryId);
    const now = this.#opts.now();
    if (r === undefined || r.status === "cancelled" || (!waited && now < r.dueMs)) {
      return undefined;
    }
    r.status = "started";
    return create(RetryStartedSchema, {
      retryId: r.id,
      turn: r.turn,
      step: r.step,
      retryNumber: r.retryNumber,
      startedAt: timestampFromMs(Math.max(now, r.dueMs)),
    });
  }

  /**
   * Mirrors a chain as the server answered it (retries taken, open or
   * closed), so that a later outage continues the server's count instead
   * of starting the chain over.
   */
  observe(session: string, provider: string, policyKey: string, mode: Mode, retries: number, open: boolean): void {
    if (policyKey === "") return;
    const key = chainKey(session, provider, policyKey);
    const c = this.#touch(key);
    if (c !== undefined) {
      c.retries = retries;
      c.open = open;
      return;
    }
    if (open) {
      this.#add(key, { session, provider, policyKey, mode, retries, open });
    }
  }

  /** The due time of a local retry in ms since the epoch, or undefined. */
  dueMs(retryId: string): number | undefined {
    return this.#retries.get(retryId)?.dueMs;
  }

  /**
   * Cancels a pending local retry and closes its chain (as the server does);
   * returns whether it was pending.
   */
  cancel(retryId: string): boolean {
    const r = this.#retries.get(retryId);
    if (r === undefined || r.status !== "pending") {
      return false;
    }
    r.status = "cancelled";
    const c = this.#chains.get(r.chain);
    if (c?.open && c.retries === r.retryNumber) {
      c.open = false;
    }
    return true;
  }

  /** Cancels the session's pending local retries and closes its open chains. */
  cancelSession(session: string): void {
    for (const r of this.#retries.values()) {
      if (r.session === session) this.cancel(r.id);
    }
    this.#closeSession(session, CloseReason.CANCELLED);
  }

  /**
   * Records a successful step: the session's open local chains close, so
   * its next failure starts at retry 1. Returns the closed chains.
   */
  stepSucceeded(session: string): ChainClosed[] {
    return this.#closeSession(session, CloseReason.SUCCEEDED);
  }

  #closeSession(session: string, reason: CloseReason): ChainClosed[] {
    const out: ChainClosed[] = [];
    const chains = [...this.#chains.values()].filter((c) => c.session === session && c.open);
    chains.sort((a, b) => (a.provider === b.provider ? cmp(a.policyKey, b.policyKey) : cmp(a.provider, b.provider)));
    for (const c of chains) {
      c.open = false;
      out.push(create(ChainClosedSchema, { provider: c.provider, policyKey: c.policyKey, reason, retries: c.retries }));
    }
    return out;
  }

  #cap(p: ResolvedPolicy): number {
    if (p.bounded) {
      return Math.min(p.maxRetries, this.#opts.maxRetries ?? Infinity);
    }
    return this.#opts.retryBudget;
  }

  #policyOf(req: FailedStepRequest): ResolvedPolicy | undefined {
    let p: RetryPolicy | undefined;
    let field = "policy";
    switch (req.policySource.case) {
      case "policy":
        p = req.policySource.value;
        break;
      case "policyName": {
        const name = req.policySource.value;
        const named = this.#opts.policies?.[name];
        if (named === undefined) {
          throw invalidArgument([
            { field: "policy_name", description: `no policy named ${JSON.stringify(name)} is known to the client in degraded mode` },
          ]);
        }
        p = create(RetryPolicySchema, named);
        field = "policy";
        break;
      }
      default: {
        const byProvider = this.#opts.providerPolicies?.[req.provider];
        p = byProvider === undefined ? undefined : create(RetryPolicySchema, byProvider);
      }
    }
    let out: ResolvedPolicy;
    try {
      out = resolveCached(p);
    } catch (err) {
      if (err instanceof PolicyValidationError) {
        throw invalidArgument(err.violations.map((v) => ({ field: `${field}.${v.field}`, description: v.description })));
      }
      throw err;
    }
    return req.provider === "" ? undefined : out;
  }

  // #touch returns the chain and marks it most recently used.
  #touch(key: string): LocalChain | undefined {
    const c = this.#chains.get(key);
    if (c !== undefined) {
      this.#chains.delete(key);
      this.#chains.set(key, c);
    }
    return c;
  }

  #add(key: string, c: LocalChain): void {
    this.#chains.set(key, c);
    while (this.#chains.size > this.#opts.maxChains) {
      const oldest = this.#chains.keys().next().value as string;
      this.#chains.delete(oldest);
    }
  }

  #trimRetries(): void {
    const limit = 4 * this.#opts.maxChains;
    while (this.#retries.size > limit) {
      const oldest = this.#retries.keys().next().value as string;
      this.#retries.delete(oldest);
    }
  }
}

function cmp(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

function chainKey(session: string, provider: string, policyKey: string): string {
  return `${session}\u0000${provider}\u0000${policyKey}`;
}

// resolveCached resolves p once per distinct content (bounded like the
// server's policy cache: once full, new policies are resolved each time).
function resolveCached(p: RetryPolicy | undefined): ResolvedPolicy {
  if (p === undefined) return resolvePolicy(undefined);
  const key = policyCacheKey(p);
  const hit = resolved.get(key);
  if (hit !== undefined) return hit;
  const out = resolvePolicy(p);
  if (resolved.size < 1024) resolved.set(key, out);
  return out;
}

// policyCacheKey names every field of p that resolving reads, so two
// policies with one key resolve alike (the server caches by encoding).
function policyCacheKey(p: RetryPolicy): string {
  const b = p.backoff;
  return [
    p.mode,
    p.maxRetries ?? "-",
    p.retryableCodes.join("\u0000"),
    b === undefined ? "-" : [b.initialDelayMs ?? "-", b.maxDelayMs ?? "-", b.multiplier ?? "-", b.jitterRatio ?? "-", b.jitter].join(","),
    p.schedule.join(","),
    p.tailDelayMs ?? "-",
    p.retryAfterOverCap,
    p.minAttemptMs ?? "-",
  ].join("\u0001");
}

function delegated(
  req: FailedStepRequest,
  now: number,
  phase: Downstream,
  reason: DelegateReason,
  detail: string,
  policy?: ResolvedPolicy,
): FailedStepResponse {
  const localDetail = `${LOCAL_DETAIL_PREFIX}: ${detail}`;
  const event = create(EventSchema, {
    sessionId: req.sessionId,
    time: timestampFromMs(now),
    kind: {
      case: "delegated",
      value: {
        turn: req.turn,
        step: req.step,
        provider: req.provider,
        policyKey: policy?.key ?? "",
        mode: policy?.mode ?? Mode.UNSPECIFIED,
        ...(req.failure !== undefined ? { failure: req.failure } : {}),
        reason,
        detail: localDetail,
        downstream: phase,
      },
    },
  });
  return create(FailedStepResponseSchema, {
    decision: { outcome: { case: "delegate", value: { reason, detail: localDetail } } },
    event,
  });
}

const shared = new WeakMap<ResolvedPolicy, RetryPolicy>();

// sharedPolicyProto is policyProto(p) made once per resolved policy and
// shared by its scheduled records (as the server's SharedProto): callers
// must not modify it.
function sharedPolicyProto(p: ResolvedPolicy): RetryPolicy {
  let out = shared.get(p);
  if (out === undefined) {
    out = policyProto(p);
    shared.set(p, out);
  }
  return out;
}

/** The resolved policy with every field explicit, as the server records it in scheduled events. */
export function policyProto(p: ResolvedPolicy): RetryPolicy {
  const out = create(RetryPolicySchema, {
    mode: p.mode,
    retryableCodes: [...p.codes],
    retryAfterOverCap: p.overCap,
    minAttemptMs: BigInt(p.minAttemptMs),
  });
  if (p.bounded) out.maxRetries = p.maxRetries;
  if (p.mode === Mode.SCHEDULE) {
    out.schedule = p.schedule.map((d) => BigInt(d));
    out.tailDelayMs = BigInt(p.tailDelayMs);
  } else {
    out.backoff = create(BackoffSchema, {
      initialDelayMs: BigInt(p.initialDelayMs),
      maxDelayMs: BigInt(p.maxDelayMs),
      multiplier: p.multiplier,
      jitterRatio: p.jitterRatio,
      jitter: p.jitter,
    });
  }
  return out;
}

function invalidArgument(violations: { field: string; description: string }[]): ConnectError {
  const err = new ConnectError(
    "retryd (local): invalid request: " + violations.map((v) => `${v.field}: ${v.description}`).join("; "),
    Code.InvalidArgument,
  );
  err.details.push(badRequestDetail(violations));
  return err;
}
