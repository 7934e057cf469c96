// The part of the SDK middleware (./ai-sdk.ts, ./openai.ts) that needs no
// SDK: numbering the session's turns and steps, reporting a failed
// attempt and waiting for Started or a delegation, opening each attempt's
// span linked to retryd's backoff span, and StepSucceeded after a success.

import { randomUUID } from "node:crypto";
import { trace, SpanStatusCode, TraceFlags, type Link, type Span, type TracerProvider } from "@opentelemetry/api";
import type { Event, RetryStarted } from "./gen/retryd/v1/events_pb.js";
import type { Delegate } from "./gen/retryd/v1/retry_service_pb.js";
import type { Classification } from "./classify.js";
import type { Outcome, RetrydClient } from "./client.js";
import type { RetryPolicyInit } from "./local.js";

/** Where one provider attempt sits in retryd's session: the report's coordinates. */
export interface Position {
  sessionId: string;
  turn: bigint;
  step: bigint;
  /** Stable id of the user-visible turn across its retries, if the harness has one. */
  logicalTurnId?: string;
}

/** What the numbering hook is told about an attempt. */
export interface AttemptContext {
  /** 1 for the first call of each model request; the request's retries count on. */
  attempt: number;
  /** The 1-based number of the model request (generate or stream call) through this wrapper. */
  call: number;
}

/** Options shared by the middleware. */
export interface MiddlewareOptions {
  /** The retryd client that decides. */
  client: RetrydClient;
  /** retryd's provider name for this model ("openai", "deepseek", "anthropic"). */
  provider: string;
  /** An inline policy for the reports; without it and policyName, the server's default for the provider. */
  policy?: RetryPolicyInit;
  /** A policy configured on the server by name. */
  policyName?: string;
  /**
   * The session of the default numbering; default a random UUID per
   * wrapper. One session is one agent loop: its model requests must not
   * overlap (give concurrent loops wrappers, or a position hook, of their own).
   */
  sessionId?: string;
  /**
   * The numbering hook: the session, turn and step of each attempt, for a
   * harness that numbers its own. Default: every model request is the next
   * turn of `sessionId` and every attempt the next step (turn 1 step 1,
   * its retry turn 1 step 2, the next request turn 2 step 3, …).
   */
  position?: (ctx: AttemptContext) => Position;
  /** Where the attempt spans go (default: the global tracer provider). */
  tracerProvider?: TracerProvider;
}

/**
 * What the middleware attaches, as `retryd`, to the provider's error it
 * throws when retryd delegates (or the caller's retry was cancelled).
 */
export interface DelegatedInfo {
  /** The delegate decision (reason and detail); undefined for a cancelled retry. */
  delegate: Delegate | undefined;
  /** The delegated (or scheduled) event record. */
  event: Event;
  /** The decision was the client's own: no replica answered. */
  local: boolean;
}

/** The retryd decision attached to a provider error the middleware threw, if any. */
export function delegatedInfo(err: unknown): DelegatedInfo | undefined {
  if (err !== null && typeof err === "object" && "retryd" in err) {
    return (err as { retryd: DelegatedInfo }).retryd;
  }
  return undefined;
}

/** Parses a W3C traceparent into a link to that span (retryd's backoff span). */
export function backoffLink(started: RetryStarted | undefined): Link[] {
  const m = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/.exec(started?.traceparent ?? "");
  if (!m || /^0+$/.test(m[1]!) || /^0+$/.test(m[2]!)) return [];
  return [
    {
      context: { traceId: m[1]!, spanId: m[2]!, traceFlags: parseInt(m[3]!, 16) & TraceFlags.SAMPLED, isRemote: true },
      attributes: { "retryd.link": "backoff" },
    },
  ];
}

/**
 * An attempt loop for one model request: the state the SDK wrappers
 * share. Create one per request with {@link Attempts.begin}.
 */
export class Attempts {
  readonly #opts: MiddlewareOptions;
  readonly #call: number;
  readonly #numbering: (ctx: AttemptContext) => Position;
  attempt = 0;
  started: RetryStarted | undefined;
  position: Position | undefined;
  span: Span | undefined;

  private constructor(opts: MiddlewareOptions, call: number, numbering: (ctx: AttemptContext) => Position) {
    this.#opts = opts;
    this.#call = call;
    this.#numbering = numbering;
  }

  /** Starts the attempts of one model request (the wrapper's next call). */
  static begin(opts: MiddlewareOptions, state: WrapperState): Attempts {
    state.calls++;
    return new Attempts(opts, state.calls, opts.position ?? ((ctx) => state.next(ctx)));
  }

  /** Opens the next attempt: its position and its span, linked to the backoff span of its Started. */
  next(): void {
    this.attempt++;
    this.position = this.#numbering({ attempt: this.attempt, call: this.#call });
    const tracer = (this.#opts.tracerProvider ?? trace.getTracerProvider()).getTracer("@retryd/client");
    this.span = tracer.startSpan("llm.attempt", {
      links: backoffLink(this.started),
      attributes: {
        "retryd.session.id": this.position.sessionId,
        "retryd.turn": Number(this.position.turn),
        "retryd.step": Number(this.position.step),
        "gen_ai.provider.name": this.#opts.provider,
        "retryd.attempt": this.attempt,
        ...(this.started !== undefined ? { "retryd.retry.id": this.started.retryId, "retryd.retry.number": this.started.retryNumber } : {}),
      },
    });
  }

  /**
   * Reports the failed attempt and waits for retryd: true when the retry
   * started (call {@link next} and try again), or throws err with the
   * decision attached (delegated, or the retry cancelled).
   */
  async failed(err: unknown, c: Classification, signal: AbortSignal | undefined): Promise<true> {
    const pos = this.position!;
    this.span?.setStatus({ code: SpanStatusCode.ERROR, message: `${c.failure.code}: ${c.failure.message}` });
    this.span?.setAttribute("retryd.failure.code", c.failure.code);
    this.span?.end();
    const req = {
      sessionId: pos.sessionId,
      turn: pos.turn,
      step: pos.step,
      provider: this.#opts.provider,
      ...(pos.logicalTurnId !== undefined ? { logicalTurnId: pos.logicalTurnId } : {}),
      failure: c.failure,
      replay: c.replay,
      ...(this.#opts.policy !== undefined
        ? { policySource: { case: "policy" as const, value: this.#opts.policy } }
        : this.#opts.policyName !== undefined
          ? { policySource: { case: "policyName" as const, value: this.#opts.policyName } }
          : {}),
    };
    const out: Outcome = await this.#opts.client.recover(req, signal === undefined ? {} : { signal });
    if (out.kind === "retry") {
      this.started = out.started;
      return true;
    }
    throw attach(err, {
      delegate: out.kind === "delegate" ? out.delegate : undefined,
      event: out.event,
      local: out.local,
    });
  }

  /** Records the success (StepSucceeded); a failure to record it does not fail the request. */
  async succeeded(): Promise<void> {
    const pos = this.position!;
    this.span?.end();
    try {
      await this.#opts.client.stepSucceeded({ sessionId: pos.sessionId, turn: pos.turn, step: pos.step, provider: this.#opts.provider });
    } catch {
      // The chains stay open on the server; the next failure counts on.
    }
  }
}

/** The default numbering's state, one per wrapper. */
export class WrapperState {
  calls = 0;
  #turn = 0n;
  #step = 0n;
  #lastCall = 0;
  readonly sessionId: string;

  constructor(sessionId?: string) {
    this.sessionId = sessionId ?? randomUUID();
  }

  /** The default numbering: each call the next turn, each attempt the next step. */
  next(ctx: AttemptContext): Position {
    if (ctx.call !== this.#lastCall) {
      this.#lastCall = ctx.call;
      this.#turn++;
    }
    this.#step++;
    return { sessionId: this.sessionId, turn: this.#turn, step: this.#step };
  }
}

function attach(err: unknown, info: DelegatedInfo): unknown {
  if (err !== null && typeof err === "object") {
    try {
      Object.defineProperty(err, "retryd", { value: info, enumerable: false, configurable: true, writable: true });
      return err;
    } catch {
      // a frozen error: wrap it below
    }
  }
  return Object.assign(new Error(String(err), { cause: err }), { retryd: info });
}
