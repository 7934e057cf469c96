// The retryd client for Node.js agent loops: typed calls over
// @connectrpc/connect-node's gRPC transport, and recover(), the agent
// loop's one call for a failed model request.

import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { timestampFromMs, timestampMs, type Timestamp } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import type { CallOptions, Client, Interceptor, Transport } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import type { SecureClientSessionOptions } from "node:http2";
import { metrics, SpanStatusCode, trace, type Counter, type MeterProvider, type Span, type Tracer, type TracerProvider } from "@opentelemetry/api";
import {
  CancelReason,
  DelegateReason,
  RetryCancelledSchema,
  RetryStartedSchema,
  type Event,
  type RetryCancelled,
  type RetryStarted,
} from "./gen/retryd/v1/events_pb.js";
import {
  FailedStepRequestSchema,
  RetryService,
  StepSucceededRequestSchema,
  StepSucceededResponseSchema,
  type FailedStepRequest,
} from "./gen/retryd/v1/retry_service_pb.js";
import { retryPendingId } from "./errors.js";
import { isLocal, LocalDecider, type LocalOptions } from "./local.js";
import { bearerTokenInterceptor, isTLS } from "./token.js";
import { baseUrlOf, retryInterceptor, type RetryOptions } from "./transport.js";
import type {
  AwaitRetryResponse,
  CancelRetriesResponse,
  Delegate,
  FailedStepResponse,
  GetChainsResponse,
  GetProviderStateResponse,
  Schedule,
  StepSucceededResponse,
  WatchEventsRequestSchema,
} from "./gen/retryd/v1/retry_service_pb.js";

/** The first wait before awaitRetry re-attaches to a broken stream. */
export const DEFAULT_REATTACH_INITIAL_MS = 50;
/** The cap of the wait between re-attach attempts. */
export const DEFAULT_REATTACH_MAX_MS = 2000;
/** The bound of the CancelRetries call recover makes when its signal aborts. */
export const DEFAULT_CANCEL_TIMEOUT_MS = 5000;
/** How long recover and stepSucceeded wait for an answer before deciding locally. */
export const DEFAULT_ANSWER_TIMEOUT_MS = 3000;
/** How long past a server retry's due time recover keeps trying to re-attach before starting it locally. */
export const DEFAULT_AWAIT_GRACE_MS = 3000;

/**
 * Degraded mode: what recover does when no retryd replica answers (see
 * the README's "Degraded mode"). The {@link LocalOptions} bound the local
 * decisions: the named and per-provider policies of the server, the local
 * cap on retries per chain, and how many chains are kept.
 */
export interface DegradedOptions extends LocalOptions {
  /**
   * Reject with {@link RetrydUnreachableError} instead of deciding
   * locally: for agents that prefer an error to a decision the fleet's
   * budgets and circuits did not see. Default false.
   */
  failClosed?: boolean;
  /**
   * The bound on FailedStep and StepSucceeded, transport retries included:
   * with no answer by then the client decides locally. Default
   * {@link DEFAULT_ANSWER_TIMEOUT_MS}.
   */
  answerTimeoutMs?: number;
  /**
   * How long past a server-scheduled retry's due time recover keeps trying
   * to re-attach before it starts the retry locally. Default
   * {@link DEFAULT_AWAIT_GRACE_MS}.
   */
  awaitGraceMs?: number;
}

/** The counts of {@link RetrydClient.stats}. */
export interface ClientStats {
  /** recover and stepSucceeded calls the server answered. */
  serverDecisions: number;
  /** Failed steps decided locally because no replica answered. */
  localDecisions: number;
  /** Server-scheduled retries started locally because their await could not re-attach. */
  localStarts: number;
  /** Successes recorded locally because no replica answered. */
  localSuccesses: number;
  /** RETRY_PENDING answers for a retry this client had started locally, resolved by awaiting it. */
  pendingResolved: number;
}

/**
 * RetrydUnreachableError is what recover rejects with, in fail-closed
 * degraded mode, when no retryd replica answered; `cause` is the last
 * transport error.
 */
export class RetrydUnreachableError extends Error {
  override name = "RetrydUnreachableError";
  constructor(cause: unknown) {
    super(`retryd: no replica answered: ${cause instanceof Error ? cause.message : String(cause)}`, { cause });
  }
}

/** Options of {@link RetrydClient}. */
export interface ClientOptions {
  /**
   * How awaitRetry (and so recover) re-attaches after a stream breaks: it
   * waits a jittered delay that starts at reattachInitialMs and doubles up
   * to reattachMaxMs, and starts again at reattachInitialMs once a
   * re-attached stream delivers the retry's state.
   */
  reattachInitialMs?: number;
  /** See reattachInitialMs. */
  reattachMaxMs?: number;
  /**
   * Bounds the CancelRetries call recover makes, with a fresh signal, when
   * the caller's signal aborts while it waits for a retry to start.
   */
  cancelTimeoutMs?: number;
  /**
   * Plaintext HTTP/2 (h2c) instead of TLS. A "host:port" target is reached
   * over TLS unless this is set, and an "http://" target is refused
   * without it: plaintext only where the hop cannot be read (loopback, a
   * sidecar or mesh that encrypts it, tests).
   */
  insecure?: boolean;
  /** TLS settings of the connection (a private CA, a client certificate). */
  tls?: SecureClientSessionOptions;
  /**
   * Retries of the idempotent calls (FailedStep, GetChains, CancelRetries,
   * StepSucceeded) on UNAVAILABLE and on RESOURCE_EXHAUSTED with RetryInfo
   * ({@link retryInterceptor}); false turns them off. Only for a target
   * address: add retryInterceptor to a Transport of your own.
   */
  retry?: RetryOptions | false;
  /**
   * Degraded mode (default on): decide locally when no replica answers;
   * false, or `{ failClosed: true }`, rejects instead.
   */
  degraded?: DegradedOptions | false;
  /** Where recover's spans go (default: the global tracer provider). */
  tracerProvider?: TracerProvider;
  /** Where the decision counter goes (default: the global meter provider). */
  meterProvider?: MeterProvider;
  /**
   * A tenant's bearer token, sent with every call as
   * `authorization: Bearer <token>` to a retryd started with
   * --auth-credentials; only over TLS, so the target must be an
   * `https://` URL (the constructor throws otherwise). See
   * {@link bearerTokenInterceptor} for the token's form.
   */
  bearerToken?: string;
  /**
   * bearerToken without the need for TLS: also sent over a plaintext
   * target, where anyone on the path can read it. Only for a retryd on
   * loopback, behind a sidecar or service mesh that encrypts the hop, or
   * in tests. At most one of bearerToken and insecureBearerToken.
   */
  insecureBearerToken?: string;
}

/** Call options of the wrappers: an AbortSignal ends the call. */
export type RetrydCallOptions = Omit<CallOptions, "timeoutMs">;

/** A FailedStep request as an object literal (turn and step are bigint). */
export type FailedStepInit = MessageInitShape<typeof FailedStepRequestSchema>;
/** A StepSucceeded request as an object literal. */
export type StepSucceededInit = MessageInitShape<typeof StepSucceededRequestSchema>;
/** A WatchEvents request as an object literal. */
export type WatchEventsInit = MessageInitShape<typeof WatchEventsRequestSchema>;

/** The interval of keepalive pings on a connection without traffic (a target given as an address). */
export const KEEPALIVE_TIME_MS = 20_000;
/** How long a keepalive ping may go unanswered before the connection closes. */
export const KEEPALIVE_TIMEOUT_MS = 10_000;

/** What {@link RetrydClient.recover} decided for one failed model request. */
export type Outcome =
  | {
      /** Start the retry attempt now. */
      kind: "retry";
      /** retryd's schedule decision. */
      schedule: Schedule;
      /** The retry's single start confirmation. */
      started: RetryStarted;
      /** The scheduled event record, for the agent's own history. */
      event: Event;
      /** The client decided the retry itself: no replica answered (degraded mode). */
      local: boolean;
      /**
       * The server scheduled the retry but its await could not re-attach
       * past the due time: the client confirmed the start itself.
       */
      localStart: boolean;
    }
  | {
      /** Hand the failure to the next recovery policy. */
      kind: "delegate";
      /** Why retryd did not schedule a retry (delegate.reason). */
      delegate: Delegate;
      /** The delegated event record, for the agent's own history. */
      event: Event;
      /** The client decided itself: no replica answered (degraded mode). */
      local: boolean;
    }
  | {
      /**
       * The scheduled retry was cancelled instead of started (by a
       * CancelRetries call, as abandoned, at server shutdown, on expiry):
       * stop or delegate.
       */
      kind: "cancelled";
      /** retryd's schedule decision. */
      schedule: Schedule;
      /** Why the retry will not start. */
      cancelled: RetryCancelled;
      /** The scheduled event record. */
      event: Event;
      /** The client decided the retry itself (and the caller cancelled it). */
      local: boolean;
    };

/**
 * The decision an outcome came from, as retryd's spans and metrics name it
 * (retryd.decision): a retry that was later cancelled was still scheduled.
 */
function decisionName(out: Outcome): "schedule" | "delegate" {
  return out.kind === "delegate" ? "delegate" : "schedule";
}

/**
 * RecoverAbortedError is what recover rejects with when its signal aborts
 * while it waits for a scheduled retry: recover has cancelled the retry on
 * the server, and `cancelled` (or `started`, if the retry won the race) is
 * the server's answer. `cause` is the signal's reason. When the cancel call
 * failed too, `cancelError` holds its error, and the server cancels the
 * retry as abandoned after its grace.
 */
export class RecoverAbortedError extends Error {
  override name = "RecoverAbortedError";
  /** retryd's schedule decision. */
  readonly schedule: Schedule;
  /** The scheduled event record. */
  readonly event: Event;
  /** The retry's state after the cancel: cancelled ... */
  readonly cancelled: RetryCancelled | undefined;
  /** ... or started, when the retry started before the cancel arrived. */
  readonly started: RetryStarted | undefined;
  /** The error of the cancel call, when it failed. */
  readonly cancelError: unknown;

  constructor(
    cause: unknown,
    detail: {
      schedule: Schedule;
      event: Event;
      cancelled?: RetryCancelled | undefined;
      started?: RetryStarted | undefined;
      cancelError?: unknown;
    },
  ) {
    super(`retryd: recover aborted while waiting for retry ${detail.schedule.retryId}`, { cause });
    this.schedule = detail.schedule;
    this.event = detail.event;
    this.cancelled = detail.cancelled;
    this.started = detail.started;
    this.cancelError = detail.cancelError;
  }
}

/**
 * RetrydClient calls one retryd server. It is safe to share between many
 * agent loops of one process; create one and close it at exit.
 */
export class RetrydClient {
  /** The generated RetryService client the wrappers use. */
  readonly service: Client<typeof RetryService>;
  readonly #sessions: Http2SessionManager | undefined;
  readonly #reattachInitialMs: number;
  readonly #reattachMaxMs: number;
  readonly #cancelTimeoutMs: number;
  readonly #decider: LocalDecider | undefined;
  readonly #failClosed: boolean;
  readonly #answerTimeoutMs: number;
  readonly #awaitGraceMs: number;
  // Server retry ids this client started locally, newest last (bounded).
  readonly #startedLocally = new Set<string>();
  // Sessions decided locally since the server last answered them, newest
  // last (bounded): a RETRY_PENDING for a retry the client never saw (a
  // lost answer) belongs to the agent's own local retry.
  readonly #localSessions = new Set<string>();
  readonly #tracer: Tracer;
  readonly #decisions: Counter;
  readonly #stats: ClientStats = { serverDecisions: 0, localDecisions: 0, localStarts: 0, localSuccesses: 0, pendingResolved: 0 };

  /**
   * Creates a client for the retryd server at target, reached with gRPC
   * over HTTP/2 on one connection that close() closes: "host:port" or
   * "https://host:port" over TLS (trusting Node's CAs unless `tls` says
   * otherwise), or, only with `insecure: true`, "host:port" or
   * "http://host:port" over plaintext. Idempotent calls are retried on
   * UNAVAILABLE and on RESOURCE_EXHAUSTED with RetryInfo (`retry`).
   * Pass a Transport instead to choose everything yourself; the caller
   * owns that one and close() leaves it, and a bearer token goes into its
   * interceptors ({@link bearerTokenInterceptor}) rather than the options.
   * The constructor throws a TypeError for a plaintext target without
   * `insecure`, a malformed token, bearerToken with a plaintext target,
   * both token options, or a token option with a Transport.
   */
  constructor(target: string | Transport, options: ClientOptions = {}) {
    const token = tokenOption(options);
    let transport: Transport;
    if (typeof target === "string") {
      const baseUrl = baseUrlOf(target, options.insecure === true);
      const interceptors: Interceptor[] = [];
      if (options.retry !== false) {
        interceptors.push(retryInterceptor(options.retry ?? {}));
      }
      if (token !== undefined) {
        if (!token.insecure && !isTLS(baseUrl)) {
          throw new TypeError(
            "retryd: bearerToken is sent only over TLS: use an https:// target, or insecureBearerToken " +
              "where plaintext is safe (loopback, a sidecar that encrypts the hop, tests)",
          );
        }
        interceptors.push(bearerTokenInterceptor(token.token, { insecure: token.insecure }));
      }
      // A replica whose path went silent answers no ping within 10 s: the
      // session closes and calls and await streams end and re-attach
      // through another replica, instead of waiting for their deadline.
      // 20 s stays above the server's default --keepalive-min-time (10 s).
      this.#sessions = new Http2SessionManager(
        baseUrl,
        { pingIntervalMs: KEEPALIVE_TIME_MS, pingTimeoutMs: KEEPALIVE_TIMEOUT_MS, pingIdleConnection: true },
        options.tls,
      );
      transport = createGrpcTransport({ baseUrl, sessionManager: this.#sessions, interceptors });
    } else {
      if (token !== undefined) {
        throw new TypeError(
          "retryd: bearerToken and insecureBearerToken apply to a target address; " +
            "add bearerTokenInterceptor(token) to the interceptors of your own Transport",
        );
      }
      transport = target;
    }
    this.service = createClient(RetryService, transport);
    this.#reattachInitialMs = positive(options.reattachInitialMs, DEFAULT_REATTACH_INITIAL_MS);
    this.#reattachMaxMs = Math.max(this.#reattachInitialMs, positive(options.reattachMaxMs, DEFAULT_REATTACH_MAX_MS));
    this.#cancelTimeoutMs = positive(options.cancelTimeoutMs, DEFAULT_CANCEL_TIMEOUT_MS);
    const degraded = options.degraded === false ? { failClosed: true } : (options.degraded ?? {});
    this.#failClosed = degraded.failClosed === true;
    this.#decider = this.#failClosed ? undefined : new LocalDecider(degraded);
    this.#answerTimeoutMs = positive(degraded.answerTimeoutMs, DEFAULT_ANSWER_TIMEOUT_MS);
    this.#awaitGraceMs = positive(degraded.awaitGraceMs, DEFAULT_AWAIT_GRACE_MS);
    this.#tracer = (options.tracerProvider ?? trace.getTracerProvider()).getTracer("@retryd/client");
    this.#decisions = (options.meterProvider ?? metrics.getMeterProvider())
      .getMeter("@retryd/client")
      .createCounter("retryd.client.decisions", {
        description: "Failed steps recover decided, by where (server or local) and outcome",
      });
  }

  /**
   * How many decisions came from the server and how many the client made
   * itself while no replica answered (a copy). The same counts go to the
   * OpenTelemetry counter retryd.client.decisions (attributes
   * retryd.decision.local, and retryd.decision: schedule or delegate, the
   * names retryd's own decision spans use).
   */
  stats(): ClientStats {
    return { ...this.#stats };
  }

  /** Closes the connection the constructor opened (and every call on it). */
  close(): void {
    this.#sessions?.abort();
  }

  /**
   * Reports one failed model request and returns retryd's decision
   * (schedule or delegate) with its event record. Idempotent per (session,
   * turn, step, downstream phase), so it is safe to repeat after a
   * transport error. Errors are ConnectErrors as the server sent them; see
   * errorReason, retryPendingId and fieldViolations.
   */
  failedStep(req: FailedStepInit, options?: RetrydCallOptions): Promise<FailedStepResponse> {
    return this.service.failedStep(req, options);
  }

  /**
   * Waits until the retry starts or is cancelled and returns that terminal
   * message: `message.case` is "started" when the agent may start the retry
   * attempt now, "cancelled" when the retry will not start.
   *
   * While it waits the server counts it as an awaiter, which is what lets a
   * due retry start. If the stream breaks (UNAVAILABLE, INTERNAL, or
   * CANCELED or ABORTED while the signal has not aborted, which is how
   * connect-node reports a dropped connection; or a stream that ends
   * without a terminal message) it re-attaches after a
   * jittered backoff, for as long as the signal allows; the retry starts at
   * most once however often it re-attaches. Any other error (NOT_FOUND for
   * an unknown or forgotten retry, INVALID_ARGUMENT) is thrown as is. When
   * the signal aborts it rejects with the signal's reason; it does not
   * cancel the retry (recover does).
   */
  async awaitRetry(retryId: string, options: RetrydCallOptions = {}): Promise<AwaitRetryResponse> {
    const term = await this.#await(retryId, options, undefined);
    if (term === undefined) {
      throw new Error(`retryd: AwaitRetry ${retryId} gave up`); // unreachable without a give-up time
    }
    return term;
  }

  // #await is awaitRetry's loop. With giveUpAtMs, it returns undefined
  // once that time has passed and the latest attempt could not attach.
  async #await(retryId: string, options: RetrydCallOptions, giveUpAtMs: number | undefined): Promise<AwaitRetryResponse | undefined> {
    const signal = options.signal;
    let wait = this.#reattachInitialMs;
    for (;;) {
      let attached = false;
      try {
        for await (const msg of this.service.awaitRetry({ retryId }, options)) {
          switch (msg.message.case) {
            case "state":
              attached = true;
              break;
            case "started":
            case "cancelled":
              return msg;
          }
        }
      } catch (err) {
        if (signal?.aborted) {
          throw signal.reason;
        }
        if (!reattachable(err)) {
          throw err;
        }
      }
      // The stream broke, or ended without a terminal message: re-attach.
      if (attached) {
        wait = this.#reattachInitialMs;
      } else if (giveUpAtMs !== undefined && Date.now() >= giveUpAtMs) {
        return undefined;
      }
      let pause = jittered(wait);
      if (!attached && giveUpAtMs !== undefined) {
        pause = Math.min(pause, Math.max(0, giveUpAtMs - Date.now()) + 1);
      }
      await sleep(pause, signal);
      wait = Math.min(2 * wait, this.#reattachMaxMs);
    }
  }

  /**
   * Cancels one pending retry. Idempotent: a retry that already started or
   * was cancelled is reported in its terminal state and nothing changes.
   * Cancelling a retry closes its chain: the next failure is retry 1.
   */
  cancelRetry(retryId: string, options?: RetrydCallOptions): Promise<CancelRetriesResponse> {
    return this.service.cancelRetries({ target: { case: "retryId", value: retryId } }, options);
  }

  /**
   * Cancels the session's pending retry and open always-mode delegation,
   * and closes its open chains (for an agent whose session ends). NOT_FOUND
   * for a session retryd does not know.
   */
  cancelSession(sessionId: string, options?: RetrydCallOptions): Promise<CancelRetriesResponse> {
    return this.service.cancelRetries({ target: { case: "sessionId", value: sessionId } }, options);
  }

  /**
   * Reports a successful model request: the session's open chains close,
   * so its next failure starts again at retry 1.
   */
  async stepSucceeded(req: StepSucceededInit, options: RetrydCallOptions = {}): Promise<StepSucceededResponse> {
    const msg = create(StepSucceededRequestSchema, req);
    try {
      const resp = await this.service.stepSucceeded(msg, { ...options, timeoutMs: this.#answerTimeoutMs });
      this.#decider?.stepSucceeded(msg.sessionId);
      this.#stats.serverDecisions++;
      return resp;
    } catch (err) {
      if (this.#decider === undefined || !unreachable(err, options.signal)) {
        throw err;
      }
      // Degraded mode: close the session's local chains; the server's stay
      // open until its next success (so its count runs on, conservatively).
      this.#stats.localSuccesses++;
      return create(StepSucceededResponseSchema, { closed: this.#decider.stepSucceeded(msg.sessionId) });
    }
  }

  /** Reads a session's retry chains and its latest turn and step. */
  getChains(sessionId: string, options?: RetrydCallOptions): Promise<GetChainsResponse> {
    return this.service.getChains({ sessionId }, options);
  }

  /**
   * Reads the fleet protection of one provider for the caller's tenant
   * (GetProviderState): its retry budget, failure rate, circuit and
   * pacing. `protected` is false, and every other field zero, when the
   * server's policy file gives the provider no fleet protection. An empty
   * provider is INVALID_ARGUMENT; with authentication, a provider the
   * tenant may not use is PERMISSION_DENIED (reason PROVIDER_NOT_ALLOWED).
   */
  getProviderState(provider: string, options?: RetrydCallOptions): Promise<GetProviderStateResponse> {
    return this.service.getProviderState({ provider }, options);
  }

  /**
   * Streams the event log. With req.stopAtEnd the iteration ends once every
   * event recorded so far was yielded; otherwise it follows new events until
   * the signal aborts (it then rejects with the signal's reason) or the
   * stream fails (UNAVAILABLE when the server shuts down). It does not
   * resume: watch again with afterSequence set to the last event's sequence.
   */
  async *watchEvents(req: WatchEventsInit, options: RetrydCallOptions = {}): AsyncGenerator<Event, void, undefined> {
    try {
      for await (const resp of this.service.watchEvents(req, options)) {
        if (resp.event !== undefined) {
          yield resp.event;
        }
      }
    } catch (err) {
      if (options.signal?.aborted) {
        throw options.signal.reason;
      }
      throw err;
    }
  }

  /**
   * The agent loop's one call for a failed model request. It reports the
   * failure (FailedStep), and then:
   *
   * - on a delegate decision, returns `{ kind: "delegate" }` with the reason;
   * - on a schedule decision, waits with awaitRetry (re-attaching if the
   *   stream breaks) and returns `{ kind: "retry" }` when the retry started,
   *   or `{ kind: "cancelled" }` when it was cancelled instead.
   *
   * If the signal aborts while it waits, it cancels the retry on the server
   * (CancelRetries by id, bounded by cancelTimeoutMs) and rejects with a
   * {@link RecoverAbortedError}. Server errors are ConnectErrors thrown as
   * is: a report for a session that still has a pending retry fails with
   * FAILED_PRECONDITION, and retryPendingId(err) names that retry.
   *
   * Degraded mode: when no replica answers FailedStep within
   * answerTimeoutMs (connection refused, UNAVAILABLE after the transport's
   * retries, no answer at all), it decides locally with the server's
   * policy engine (`local: true`), waits the delay itself and returns the
   * outcome with local records; when a server-scheduled retry's await
   * cannot re-attach by awaitGraceMs past its due time, it starts the
   * retry itself (`localStart: true`). With failClosed it rejects with
   * {@link RetrydUnreachableError} instead.
   */
  async recover(req: FailedStepInit, options: RetrydCallOptions = {}): Promise<Outcome> {
    const msg = create(FailedStepRequestSchema, req);
    return this.#tracer.startActiveSpan(
      "retryd.recover",
      {
        attributes: {
          "retryd.session.id": msg.sessionId,
          "retryd.turn": Number(msg.turn),
          "retryd.step": Number(msg.step),
          "gen_ai.provider.name": msg.provider,
          "retryd.failure.code": msg.failure?.code ?? "",
        },
      },
      async (span) => {
        try {
          const out = await this.#recover(msg, options, span);
          span.setAttribute("retryd.decision", decisionName(out));
          span.setAttribute("retryd.decision.local", out.local);
          if (out.kind === "retry") {
            span.setAttribute("retryd.retry.id", out.schedule.retryId);
            span.setAttribute("retryd.retry.number", out.schedule.retryNumber);
            span.setAttribute("retryd.delay_ms", Number(out.schedule.delayMs));
            span.setAttribute("retryd.retry.local_start", out.localStart);
          } else if (out.kind === "delegate") {
            span.setAttribute("retryd.delegate.reason", DelegateReason[out.delegate.reason] ?? String(out.delegate.reason));
          }
          this.#decisions.add(1, { "retryd.decision.local": out.local, "retryd.decision": decisionName(out) });
          return out;
        } catch (err) {
          if (err instanceof RecoverAbortedError) {
            span.setAttribute("retryd.decision.local", isLocal(err.schedule.retryId));
          }
          span.recordException(err instanceof Error ? err : String(err));
          span.setStatus({ code: SpanStatusCode.ERROR, message: err instanceof Error ? err.message : String(err) });
          throw err;
        } finally {
          span.end();
        }
      },
    );
  }

  async #recover(msg: FailedStepRequest, options: RetrydCallOptions, span: Span): Promise<Outcome> {
    let resp: FailedStepResponse;
    try {
      resp = await this.#report(msg, options);
    } catch (err) {
      if (!unreachable(err, options.signal)) {
        throw err;
      }
      if (this.#decider === undefined) {
        throw new RetrydUnreachableError(err);
      }
      span.addEvent("retryd unreachable: deciding locally", { "exception.message": err instanceof Error ? err.message : String(err) });
      return this.#recoverLocally(this.#decider, msg, options);
    }
    this.#stats.serverDecisions++;
    this.#localSessions.delete(msg.sessionId);
    const event = resp.event;
    const decision = resp.decision?.outcome;
    if (event === undefined || decision === undefined || decision.case === undefined) {
      throw new Error("retryd: FailedStep answered neither schedule nor delegate");
    }
    if (decision.case === "delegate") {
      if (decision.value.reason === DelegateReason.BUDGET_EXHAUSTED && event.kind.case === "delegated") {
        this.#decider?.observe(msg.sessionId, msg.provider, event.kind.value.policyKey, event.kind.value.mode, 0, false);
      }
      return { kind: "delegate", delegate: decision.value, event, local: false };
    }
    const schedule = decision.value;
    // The local chain follows the server's, so an outage continues its count.
    this.#decider?.observe(msg.sessionId, msg.provider, schedule.policyKey, schedule.mode, schedule.retryNumber, true);
    let term: AwaitRetryResponse | undefined;
    try {
      const giveUpAt = this.#decider === undefined ? undefined : msOf(schedule.dueAt) + this.#awaitGraceMs;
      term = await this.#await(schedule.retryId, options, giveUpAt);
    } catch (err) {
      if (options.signal?.aborted) {
        return this.#cancelWaiting(schedule, event, options, options.signal.reason);
      }
      throw err;
    }
    if (term === undefined) {
      // No replica answered the await past the due time: start it here. If
      // the server still holds it when it answers again, the next report's
      // RETRY_PENDING is resolved by #report.
      this.#rememberLocalStart(schedule.retryId);
      this.#stats.localStarts++;
      span.addEvent("retryd unreachable: starting the scheduled retry locally");
      const started = create(RetryStartedSchema, {
        retryId: schedule.retryId,
        turn: msg.turn,
        step: msg.step,
        retryNumber: schedule.retryNumber,
        startedAt: timestampFromMs(Date.now()),
      });
      return { kind: "retry", schedule, started, event, local: false, localStart: true };
    }
    switch (term.message.case) {
      case "started":
        return { kind: "retry", schedule, started: term.message.value, event, local: false, localStart: false };
      case "cancelled":
        return { kind: "cancelled", schedule, cancelled: term.message.value, event, local: false };
    }
    throw new Error(`retryd: AwaitRetry ${schedule.retryId} returned no terminal message`);
  }

  // #report sends FailedStep bounded by answerTimeoutMs. A RETRY_PENDING
  // answer naming a retry this client started locally (its await could not
  // re-attach while no replica answered) is resolved by awaiting that
  // retry, which is past due so the server starts it at once and the chain
  // counts it, and then sending the report again.
  async #report(msg: FailedStepRequest, options: RetrydCallOptions): Promise<FailedStepResponse> {
    const call = { ...options, timeoutMs: this.#answerTimeoutMs };
    for (let resolved = 0; ; resolved++) {
      try {
        return await this.service.failedStep(msg, call);
      } catch (err) {
        const pending = retryPendingId(err);
        const ours = pending !== undefined && (this.#startedLocally.has(pending) || this.#localSessions.has(msg.sessionId));
        if (pending === undefined || !ours || resolved >= 2) {
          throw err;
        }
        const awaitSignal = AbortSignal.timeout(this.#answerTimeoutMs);
        await this.awaitRetry(pending, {
          signal: options.signal === undefined ? awaitSignal : AbortSignal.any([options.signal, awaitSignal]),
        });
        this.#startedLocally.delete(pending);
        this.#stats.pendingResolved++;
      }
    }
  }

  async #recoverLocally(decider: LocalDecider, msg: FailedStepRequest, options: RetrydCallOptions): Promise<Outcome> {
    const resp = decider.failedStep(msg);
    this.#stats.localDecisions++;
    this.#localSessions.delete(msg.sessionId);
    this.#localSessions.add(msg.sessionId);
    if (this.#localSessions.size > 10_000) {
      this.#localSessions.delete(this.#localSessions.values().next().value as string);
    }
    const event = resp.event;
    const decision = resp.decision?.outcome;
    if (event === undefined || decision === undefined || decision.case === undefined) {
      throw new Error("retryd: the local decider answered neither schedule nor delegate");
    }
    if (decision.case === "delegate") {
      return { kind: "delegate", delegate: decision.value, event, local: true };
    }
    const schedule = decision.value;
    try {
      await sleep(Number(schedule.delayMs), options.signal);
    } catch (cause) {
      decider.cancel(schedule.retryId);
      const cancelled = create(RetryCancelledSchema, {
        retryId: schedule.retryId,
        reason: CancelReason.REQUESTED,
        turn: msg.turn,
        step: msg.step,
        retryNumber: schedule.retryNumber,
      });
      throw new RecoverAbortedError(cause, { schedule, event, cancelled });
    }
    const started = decider.start(schedule.retryId, true);
    if (started === undefined) {
      throw new Error(`retryd: local retry ${schedule.retryId} did not start`);
    }
    return { kind: "retry", schedule, started, event, local: true, localStart: false };
  }

  #rememberLocalStart(retryId: string): void {
    this.#startedLocally.add(retryId);
    if (this.#startedLocally.size > 10_000) {
      const oldest = this.#startedLocally.values().next().value as string;
      this.#startedLocally.delete(oldest);
    }
  }

  // #cancelWaiting cancels the retry recover was waiting for after the
  // caller's signal aborted, and rejects with RecoverAbortedError.
  async #cancelWaiting(schedule: Schedule, event: Event, options: RetrydCallOptions, cause: unknown): Promise<never> {
    let resp: CancelRetriesResponse;
    try {
      const callOptions: RetrydCallOptions = { signal: AbortSignal.timeout(this.#cancelTimeoutMs) };
      if (options.headers !== undefined) {
        callOptions.headers = options.headers;
      }
      resp = await this.cancelRetry(schedule.retryId, callOptions);
    } catch (cancelError) {
      throw new RecoverAbortedError(cause, { schedule, event, cancelError });
    }
    const state = resp.retries.find((r) => r.retryId === schedule.retryId);
    throw new RecoverAbortedError(cause, { schedule, event, cancelled: state?.cancelled, started: state?.started });
  }
}

// tokenOption is the one bearer token option given, if any.
function tokenOption(options: ClientOptions): { token: string; insecure: boolean } | undefined {
  if (options.bearerToken !== undefined && options.insecureBearerToken !== undefined) {
    throw new TypeError("retryd: give bearerToken or insecureBearerToken, not both");
  }
  if (options.bearerToken !== undefined) {
    return { token: options.bearerToken, insecure: false };
  }
  if (options.insecureBearerToken !== undefined) {
    return { token: options.insecureBearerToken, insecure: true };
  }
  return undefined;
}

// unreachable reports whether a call's error means no replica answered
// (the caller's signal had not aborted): UNAVAILABLE (connection refused,
// after the transport's retries), DEADLINE_EXCEEDED (answerTimeoutMs with
// no answer), or CANCELED and ABORTED, which is how connect-node reports a
// connection that died under the call. retryd itself answers none of them.
function unreachable(err: unknown, signal: AbortSignal | undefined): boolean {
  if (signal?.aborted || !(err instanceof ConnectError)) {
    return false;
  }
  switch (err.code) {
    case Code.Unavailable:
    case Code.DeadlineExceeded:
    case Code.Canceled:
    case Code.Aborted:
      return true;
    default:
      return false;
  }
}

function msOf(ts: Timestamp | undefined): number {
  return ts === undefined ? Date.now() : timestampMs(ts);
}

function positive(v: number | undefined, fallback: number): number {
  return v !== undefined && Number.isFinite(v) && v > 0 ? v : fallback;
}

// reattachable reports whether an AwaitRetry error means the stream broke
// (try again) rather than that the server refused the request. It is only
// asked while the caller's signal has not aborted. Where grpc-go reports a
// connection that died under an open stream as UNAVAILABLE, connect-node
// reports CANCELED (RST_STREAM CANCEL) or ABORTED (ECONNRESET, a destroyed
// stream), and retryd itself answers neither.
function reattachable(err: unknown): boolean {
  if (!(err instanceof ConnectError)) {
    return false;
  }
  switch (err.code) {
    case Code.Unavailable:
    case Code.Internal:
    case Code.Canceled:
    case Code.Aborted:
      return true;
    default:
      return false;
  }
}

// jittered spreads the re-attach attempts of many agents over [d/2, d].
function jittered(d: number): number {
  return d / 2 + Math.random() * (d / 2);
}

function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
