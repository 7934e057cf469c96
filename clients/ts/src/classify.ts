// Classifying provider errors: what a model request's failure looked like
// (an HTTP status, headers, an error body, a client error, a dropped
// stream, an empty completion) turned into retryd's Failure and Replay, by
// the rules every retryd client shares (docs/clients.md, "Classifying
// provider errors"; vectors in testdata/classify, run by
// test/classify.test.ts).

import { create } from "@bufbuild/protobuf";
import { FailureSchema, Replay, type Failure } from "./gen/retryd/v1/events_pb.js";
import type { FailedStepInit } from "./client.js";

/** Replaces the code of a failure whose response carried `x-should-retry: false`. */
export const CODE_PROVIDER_NO_RETRY = "PROVIDER_NO_RETRY";
/** A request the provider rejected as malformed (400, 404, 413, 422). */
export const CODE_INVALID_REQUEST = "INVALID_REQUEST";
/** A prompt over the model's context window: compaction, not a retry, recovers it. */
export const CODE_CONTEXT_WINDOW_EXCEEDED = "CONTEXT_WINDOW_EXCEEDED";

/** What went wrong when a request raised an error instead of, or while reading, a response. */
export type ErrorKind =
  | "connection_refused"
  | "connection_reset"
  | "dns"
  | "tls"
  | "timeout"
  | "stream_truncated"
  | "aborted";

/** What an agent saw when one model request failed; set what applies. */
export interface ProviderFailure {
  /** The response's HTTP status; 0 or absent when no response arrived (a stream's error keeps 200). */
  httpStatus?: number;
  /** The response's headers (retry-after-ms, retry-after, x-should-retry are read). */
  headers?: Headers | Record<string, string | string[] | undefined>;
  /** The error body as it arrived, or a stream error event's data; an object stands for its JSON. */
  body?: string | object;
  /** The client error the request raised; when absent and `error` is set, {@link errorKindOf} decides. */
  errorKind?: ErrorKind;
  /** The error the HTTP client or SDK threw, if any. */
  error?: unknown;
  /** Streamed output of this attempt was already shown to the user (a replay would show a second answer). */
  outputShown?: boolean;
  /** The response completed with nothing in it: a stop with no content and no tool calls. */
  emptyCompletion?: boolean;
}

/** The report {@link classify} derived. */
export interface Classification {
  /** FailedStepRequest.failure. */
  failure: Failure;
  /** FailedStepRequest.replay. */
  replay: Replay;
}

const MAX_FAILURE_MESSAGE = 4096;
const MAX_RETRY_AFTER = 256;
const RETRY_AFTER_MS_OVER = 2 ** 31;
const RETRY_AFTER_MS_SYNTAX = /^[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?$/;
const DEFAULT_RETRIED = new Set(["EMPTY_RESPONSE", "RATE_LIMIT", "SERVER", "TIMEOUT", "TRANSPORT"]);
const ERROR_TYPE_CODES: Record<string, string> = {
  insufficient_quota: "QUOTA",
  billing_error: "QUOTA",
  rate_limit_error: "RATE_LIMIT",
  rate_limit_exceeded: "RATE_LIMIT",
  overloaded_error: "SERVER",
  api_error: "SERVER",
  server_error: "SERVER",
  timeout_error: "TIMEOUT",
  authentication_error: "AUTH",
  permission_error: "AUTH",
  invalid_api_key: "AUTH",
  context_length_exceeded: CODE_CONTEXT_WINDOW_EXCEEDED,
  invalid_request_error: CODE_INVALID_REQUEST,
  not_found_error: CODE_INVALID_REQUEST,
  request_too_large: CODE_INVALID_REQUEST,
};

const TLS_CODES = /^(ERR_TLS_|ERR_SSL_|CERT_|UNABLE_TO_|DEPTH_ZERO_SELF_SIGNED_CERT$|SELF_SIGNED_CERT_IN_CHAIN$|ERR_OSSL_|HOSTNAME_MISMATCH$)/;

/**
 * The kind of an error a Node HTTP client (fetch/undici, node:http) or a
 * provider SDK threw, following `cause`: ECONNREFUSED; ECONNRESET, EPIPE,
 * ECONNABORTED and undici's socket errors; ENOTFOUND and EAI_AGAIN (DNS);
 * TLS and certificate errors; an AbortError (aborted); a TimeoutError,
 * ETIMEDOUT or an SDK's timeout error; a body that ended early
 * (stream_truncated). Any other error counts as connection_reset, a
 * transport failure; undefined for no error.
 */
export function errorKindOf(err: unknown): ErrorKind | undefined {
  if (err === undefined || err === null) return undefined;
  let timeoutSeen = false;
  for (let e: unknown = err, depth = 0; e !== undefined && e !== null && depth < 8; depth++) {
    const o = e as { name?: unknown; code?: unknown; message?: unknown; cause?: unknown };
    const name = typeof o.name === "string" ? o.name : "";
    const code = typeof o.code === "string" ? o.code : "";
    if (name === "AbortError" || name === "APIUserAbortError") return "aborted";
    if (name === "TimeoutError" || name === "APIConnectionTimeoutError" || code === "ETIMEDOUT" || /^UND_ERR_.*TIMEOUT$/.test(code)) {
      timeoutSeen = true;
    }
    switch (code) {
      case "ECONNREFUSED":
        return "connection_refused";
      case "ECONNRESET":
      case "EPIPE":
      case "ECONNABORTED":
      case "UND_ERR_SOCKET":
      case "UND_ERR_CLOSED":
        return "connection_reset";
      case "ENOTFOUND":
      case "EAI_AGAIN":
      case "EAI_NONAME":
        return "dns";
      case "UND_ERR_RES_CONTENT_LENGTH_MISMATCH":
      case "ERR_STREAM_PREMATURE_CLOSE":
        return "stream_truncated";
    }
    if (TLS_CODES.test(code)) return "tls";
    if (timeoutSeen) return "timeout";
    e = o.cause;
  }
  return "connection_reset";
}

interface ProviderError {
  errType: string;
  errCode: string;
  message: string;
}

function parseProviderError(body: string | object | undefined): ProviderError | undefined {
  let doc: unknown = body;
  if (typeof body === "string") {
    try {
      doc = JSON.parse(body);
    } catch {
      return undefined;
    }
  }
  if (doc === null || typeof doc !== "object" || Array.isArray(doc)) return undefined;
  const e = (doc as { error?: unknown }).error;
  if (e === null || typeof e !== "object" || Array.isArray(e)) return undefined;
  const str = (k: string): string => {
    const v = (e as Record<string, unknown>)[k];
    return typeof v === "string" ? v : "";
  };
  return { errType: str("type"), errCode: str("code"), message: str("message") };
}

function header(h: ProviderFailure["headers"], name: string): string {
  if (h === undefined) return "";
  if (typeof (h as Headers).get === "function") return (h as Headers).get(name) ?? "";
  for (const [k, v] of Object.entries(h)) {
    if (k.toLowerCase() === name) return Array.isArray(v) ? (v[0] ?? "") : (v ?? "");
  }
  return "";
}

function statusCode(status: number, perr: ProviderError | undefined): string {
  switch (status) {
    case 400:
    case 404:
    case 413:
    case 422:
      return CODE_INVALID_REQUEST;
    case 401:
    case 403:
      return "AUTH";
    case 402:
      return "QUOTA";
    case 408:
      return "TIMEOUT";
    case 429:
      return perr?.errCode === "insufficient_quota" || perr?.errType === "insufficient_quota" ? "QUOTA" : "RATE_LIMIT";
  }
  if (status >= 500 && status <= 599) return "SERVER";
  return `HTTP_${status}`;
}

function errorTypeCode(perr: ProviderError): string {
  return (Object.hasOwn(ERROR_TYPE_CODES, perr.errCode) ? ERROR_TYPE_CODES[perr.errCode] : undefined) ??
    (Object.hasOwn(ERROR_TYPE_CODES, perr.errType) ? ERROR_TYPE_CODES[perr.errType] : undefined) ??
    "SERVER";
}

function contextOverflow(perr: ProviderError | undefined): boolean {
  if (perr === undefined) return false;
  if (perr.errCode === "context_length_exceeded") return true;
  const msg = perr.message.toLowerCase();
  return msg.includes("maximum context length") || msg.includes("prompt is too long");
}

// failureMessage bounds Failure.message to the server's 4 KiB of UTF-8.
function failureMessage(label: string, detail: string): string {
  let msg = detail === "" ? label : `${label}: ${detail}`;
  const bytes = Buffer.from(msg, "utf8"); // a lone surrogate becomes U+FFFD
  if (bytes.length <= MAX_FAILURE_MESSAGE) return bytes.toString("utf8");
  let cut = MAX_FAILURE_MESSAGE;
  while (cut > 0 && (bytes[cut]! & 0xc0) === 0x80) cut--;
  return bytes.subarray(0, cut).toString("utf8");
}

function errorText(err: unknown): string {
  if (err instanceof Error) return err.message;
  return err === undefined ? "" : String(err);
}

/**
 * Turns a provider failure into retryd's Failure and Replay by the shared
 * rules: the HTTP status first (429 → RATE_LIMIT, but insufficient_quota →
 * QUOTA; 5xx and 529 → SERVER; 408 → TIMEOUT; 401/403 → AUTH; 400, 404,
 * 413, 422 → INVALID_REQUEST or CONTEXT_WINDOW_EXCEEDED), then the error of
 * an accepted stream, an empty completion; `x-should-retry` overrides;
 * `retry-after-ms` becomes provider_retry_after_ms and `retry-after` is
 * passed raw; output already shown makes the replay unsafe.
 */
export function classify(f: ProviderFailure): Classification {
  const replay = f.outputShown === true ? Replay.UNSAFE : Replay.SAFE;
  const status = Math.min(Math.max(Math.trunc(f.httpStatus ?? 0), 0), 999);
  const failure = create(FailureSchema, { httpStatus: status });
  const kind = f.errorKind ?? errorKindOf(f.error);
  if (kind !== undefined) {
    failure.code = kind === "aborted" ? "ABORTED" : kind === "timeout" ? "TIMEOUT" : "TRANSPORT";
    failure.message = failureMessage(kind, errorText(f.error));
    return { failure, replay };
  }
  const perr = parseProviderError(f.body);
  if (status !== 0 && (status < 200 || status > 299)) {
    failure.code = statusCode(status, perr);
  } else if (perr !== undefined) {
    failure.code = errorTypeCode(perr);
  } else if (f.emptyCompletion === true) {
    failure.code = "EMPTY_RESPONSE";
  } else {
    failure.code = "MALFORMED_RESPONSE";
  }
  if (failure.code === CODE_INVALID_REQUEST && contextOverflow(perr)) {
    failure.code = CODE_CONTEXT_WINDOW_EXCEEDED;
  }
  const original = failure.code;
  const shouldRetry = header(f.headers, "x-should-retry");
  if (shouldRetry === "false") {
    failure.code = CODE_PROVIDER_NO_RETRY;
  } else if (shouldRetry === "true" && !DEFAULT_RETRIED.has(failure.code)) {
    failure.code = status === 429 ? "RATE_LIMIT" : "SERVER";
  }
  const ms = header(f.headers, "retry-after-ms");
  if (RETRY_AFTER_MS_SYNTAX.test(ms)) {
    const v = Number.parseFloat(ms);
    if (Number.isFinite(v)) { // Go's ParseFloat refuses an overflow (1e999)
      failure.providerRetryAfterMs = BigInt(Math.min(Math.ceil(v), RETRY_AFTER_MS_OVER));
    }
  }
  const ra = header(f.headers, "retry-after");
  if (ra !== "" && Buffer.byteLength(ra, "utf8") <= MAX_RETRY_AFTER) {
    failure.retryAfter = ra;
  }
  let detail = perr?.message ?? "";
  if (perr === undefined && status >= 300) detail = STATUS_TEXT[status] ?? "";
  let label = original;
  if (original !== failure.code) label = `${original} (x-should-retry: ${shouldRetry})`;
  if (status !== 0) label = `HTTP ${status} ${label}`;
  failure.message = failureMessage(label, detail);
  return { failure, replay };
}

/**
 * classify's result set on a FailedStep request (its failure and replay),
 * for recover: `client.recover(withClassification({ sessionId, … }, classify(f)))`.
 */
export function withClassification(req: FailedStepInit, c: Classification): FailedStepInit {
  return { ...req, failure: c.failure, replay: c.replay };
}

// The reason phrases of the statuses a provider answers without a body.
const STATUS_TEXT: Record<number, string> = {
  400: "Bad Request",
  401: "Unauthorized",
  402: "Payment Required",
  403: "Forbidden",
  404: "Not Found",
  408: "Request Timeout",
  409: "Conflict",
  413: "Request Entity Too Large",
  418: "I'm a teapot",
  422: "Unprocessable Entity",
  429: "Too Many Requests",
  500: "Internal Server Error",
  502: "Bad Gateway",
  503: "Service Unavailable",
  504: "Gateway Timeout",
};
