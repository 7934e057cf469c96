// The client's transport: gRPC over HTTP/2 with TLS unless plaintext is
// asked for by name, and a connect interceptor that sends an idempotent
// call again when no replica answered (UNAVAILABLE) or when retryd asked
// for a pause (RESOURCE_EXHAUSTED with google.rpc.RetryInfo).

import { Code, ConnectError } from "@connectrpc/connect";
import type { Interceptor } from "@connectrpc/connect";
import { retryDelayMs } from "./errors.js";

/**
 * The RetryService methods that are safe to send again: FailedStep is
 * idempotent per (session, turn, step, downstream phase), CancelRetries
 * and StepSucceeded change nothing the second time, GetChains reads.
 * AwaitRetry re-attaches on its own (RetrydClient.awaitRetry); WatchEvents
 * resumes from a sequence the caller holds.
 */
export const IDEMPOTENT_METHODS: ReadonlySet<string> = new Set(["FailedStep", "GetChains", "CancelRetries", "StepSucceeded"]);

/** Options of {@link retryInterceptor}. */
export interface RetryOptions {
  /** Attempts in all, the first included (default 4; 1 turns retries off). */
  maxAttempts?: number;
  /** The first wait after UNAVAILABLE, jittered over [d/2, d] (default 50 ms), doubling ... */
  initialBackoffMs?: number;
  /** ... up to this (default 1000 ms). */
  maxBackoffMs?: number;
  /**
   * The longest RetryInfo delay honoured on RESOURCE_EXHAUSTED (default
   * 5000 ms); a longer one, or none, returns the error as is.
   */
  maxRetryInfoDelayMs?: number;
}

export const DEFAULT_RETRY_MAX_ATTEMPTS = 4;
export const DEFAULT_RETRY_INITIAL_BACKOFF_MS = 50;
export const DEFAULT_RETRY_MAX_BACKOFF_MS = 1000;
export const DEFAULT_RETRY_MAX_RETRY_INFO_DELAY_MS = 5000;

/**
 * Returns a connect interceptor that sends an idempotent unary call
 * ({@link IDEMPOTENT_METHODS}) again when it fails with UNAVAILABLE (after
 * a jittered exponential backoff) or with RESOURCE_EXHAUSTED carrying a
 * RetryInfo delay (after that delay), up to maxAttempts, for as long as
 * the call's signal allows. Streams and other methods pass through.
 */
export function retryInterceptor(options: RetryOptions = {}): Interceptor {
  const maxAttempts = Math.max(1, Math.trunc(options.maxAttempts ?? DEFAULT_RETRY_MAX_ATTEMPTS));
  const initial = Math.max(1, options.initialBackoffMs ?? DEFAULT_RETRY_INITIAL_BACKOFF_MS);
  const cap = Math.max(initial, options.maxBackoffMs ?? DEFAULT_RETRY_MAX_BACKOFF_MS);
  const maxInfo = options.maxRetryInfoDelayMs ?? DEFAULT_RETRY_MAX_RETRY_INFO_DELAY_MS;
  return (next) => async (req) => {
    if (req.stream || !IDEMPOTENT_METHODS.has(req.method.name)) {
      return next(req);
    }
    let backoff = initial;
    for (let attempt = 1; ; attempt++) {
      try {
        return await next(req);
      } catch (err) {
        if (attempt >= maxAttempts || req.signal.aborted || !(err instanceof ConnectError)) {
          throw err;
        }
        let wait: number;
        if (err.code === Code.Unavailable) {
          wait = backoff / 2 + Math.random() * (backoff / 2);
          backoff = Math.min(2 * backoff, cap);
        } else if (err.code === Code.ResourceExhausted) {
          const d = retryDelayMs(err);
          if (d === undefined || d > maxInfo) throw err;
          wait = d;
        } else {
          throw err;
        }
        await abortableSleep(wait, req.signal, err);
      }
    }
  };
}

// abortableSleep waits ms, or rejects with the call's last error when the
// call's signal aborts first (its deadline or the caller's abort).
function abortableSleep(ms: number, signal: AbortSignal, last: unknown): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) {
      reject(last);
      return;
    }
    const onAbort = () => {
      clearTimeout(timer);
      reject(last);
    };
    const timer = setTimeout(() => {
      signal.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal.addEventListener("abort", onAbort, { once: true });
  });
}

/**
 * baseUrlOf turns a client target into the URL of its transport, refusing
 * a plaintext one unless insecure was asked for: "host:port" is
 * https://host:port (TLS), or http://host:port with insecure; an
 * "http://" URL needs insecure; an "https://" URL refuses it.
 */
export function baseUrlOf(target: string, insecure: boolean): string {
  const scheme = /^([a-z][a-z0-9+.-]*):\/\//i.exec(target)?.[1]?.toLowerCase();
  if (scheme === undefined) {
    return `${insecure ? "http" : "https"}://${target}`;
  }
  if (scheme === "https") {
    if (insecure) {
      throw new TypeError(`retryd: ${target} is a TLS target; insecure applies only to plaintext (http://) targets`);
    }
    return target;
  }
  if (scheme === "http") {
    if (!insecure) {
      throw new TypeError(
        `retryd: ${target} is plaintext: set insecure: true where that is safe (loopback, a sidecar that encrypts the hop, tests), or use https://`,
      );
    }
    return target;
  }
  throw new TypeError(`retryd: unsupported target scheme ${scheme}://; use host:port, https:// or (with insecure) http://`);
}
