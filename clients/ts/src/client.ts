// The retryd client for Node.js agent loops: typed calls over
// @connectrpc/connect-node's gRPC transport, and recover(), the agent
// loop's one call for a failed model request.

import type { MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import type { CallOptions, Client, Interceptor, Transport } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import type { Event, RetryCancelled, RetryStarted } from "./gen/retryd/v1/events_pb.js";
import { RetryService } from "./gen/retryd/v1/retry_service_pb.js";
import { bearerTokenInterceptor, isTLS } from "./token.js";
import type {
  AwaitRetryResponse,
  CancelRetriesResponse,
  Delegate,
  FailedStepRequestSchema,
  FailedStepResponse,
  GetChainsResponse,
  GetProviderStateResponse,
  Schedule,
  StepSucceededRequestSchema,
  StepSucceededResponse,
  WatchEventsRequestSchema,
} from "./gen/retryd/v1/retry_service_pb.js";

/** The first wait before awaitRetry re-attaches to a broken stream. */
export const DEFAULT_REATTACH_INITIAL_MS = 50;
/** The cap of the wait between re-attach attempts. */
export const DEFAULT_REATTACH_MAX_MS = 2000;
/** The bound of the CancelRetries call recover makes when its signal aborts. */
export const DEFAULT_CANCEL_TIMEOUT_MS = 5000;

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
    }
  | {
      /** Hand the failure to the next recovery policy. */
      kind: "delegate";
      /** Why retryd did not schedule a retry (delegate.reason). */
      delegate: Delegate;
      /** The delegated event record, for the agent's own history. */
      event: Event;
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
    };

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

  /**
   * Creates a client for the retryd server at target: "host:port" or a
   * base URL ("http://127.0.0.1:7700"), reached with gRPC over plaintext
   * HTTP/2 (a loopback or sidecar server), or "https://host:port" for TLS
   * (trusting Node's CAs), on one HTTP/2 connection that close() closes.
   * Pass a Transport instead to choose TLS settings, interceptors or
   * another transport; the caller owns that one and close() leaves it, and
   * a bearer token goes into its interceptors ({@link bearerTokenInterceptor})
   * rather than the options. The constructor throws a TypeError for a
   * malformed token, bearerToken with a plaintext target, both token
   * options, or a token option with a Transport.
   */
  constructor(target: string | Transport, options: ClientOptions = {}) {
    const token = tokenOption(options);
    let transport: Transport;
    if (typeof target === "string") {
      const baseUrl = /^[a-z][a-z0-9+.-]*:\/\//i.test(target) ? target : `http://${target}`;
      const interceptors: Interceptor[] = [];
      if (token !== undefined) {
        if (!token.insecure && !isTLS(baseUrl)) {
          throw new TypeError(
            "retryd: bearerToken is sent only over TLS: use an https:// target, or insecureBearerToken " +
              "where plaintext is safe (loopback, a sidecar that encrypts the hop, tests)",
          );
        }
        interceptors.push(bearerTokenInterceptor(token.token, { insecure: token.insecure }));
      }
      this.#sessions = new Http2SessionManager(baseUrl);
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
      }
      await sleep(jittered(wait), signal);
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
  stepSucceeded(req: StepSucceededInit, options?: RetrydCallOptions): Promise<StepSucceededResponse> {
    return this.service.stepSucceeded(req, options);
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
   */
  async recover(req: FailedStepInit, options: RetrydCallOptions = {}): Promise<Outcome> {
    const resp = await this.failedStep(req, options);
    const event = resp.event;
    const decision = resp.decision?.outcome;
    if (event === undefined || decision === undefined || decision.case === undefined) {
      throw new Error("retryd: FailedStep answered neither schedule nor delegate");
    }
    if (decision.case === "delegate") {
      return { kind: "delegate", delegate: decision.value, event };
    }
    const schedule = decision.value;
    let term: AwaitRetryResponse;
    try {
      term = await this.awaitRetry(schedule.retryId, options);
    } catch (err) {
      if (options.signal?.aborted) {
        return this.#cancelWaiting(schedule, event, options, options.signal.reason);
      }
      throw err;
    }
    switch (term.message.case) {
      case "started":
        return { kind: "retry", schedule, started: term.message.value, event };
      case "cancelled":
        return { kind: "cancelled", schedule, cancelled: term.message.value, event };
    }
    throw new Error(`retryd: AwaitRetry ${schedule.retryId} returned no terminal message`);
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
