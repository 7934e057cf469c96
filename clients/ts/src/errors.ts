// Reading retryd's google.rpc error details from a ConnectError.
//
// retryd attaches google.rpc.ErrorInfo (domain "retryd.dev") to its
// FAILED_PRECONDITION errors and google.rpc.BadRequest to its
// INVALID_ARGUMENT errors. Both messages are tiny and stable, so they are
// decoded here with the protobuf runtime's wire reader instead of
// generating all of google/rpc.

import { BinaryReader, WireType } from "@bufbuild/protobuf/wire";
import { Code, ConnectError } from "@connectrpc/connect";

/** The google.rpc.ErrorInfo domain of retryd's errors. */
export const ERROR_DOMAIN = "retryd.dev";

/** The google.rpc.ErrorInfo reasons of retryd's FAILED_PRECONDITION errors. */
export const Reason = {
  /** The session has a scheduled retry that has not started; metadata retry_id names it. */
  RetryPending: "RETRY_PENDING",
  /** The report names a turn and step older than the session's latest. */
  StaleStep: "STALE_STEP",
  /** The same step was already reported with different content. */
  StepRecordConflict: "STEP_RECORD_CONFLICT",
  /** The step's open always-mode delegation was cancelled. */
  DelegationCancelled: "DELEGATION_CANCELLED",
} as const;

/** A google.rpc.ErrorInfo. */
export interface ErrorInfo {
  reason: string;
  domain: string;
  metadata: Record<string, string>;
}

function incomingDetails(err: unknown, typeName: string): Uint8Array[] {
  if (!(err instanceof ConnectError)) {
    return [];
  }
  const out: Uint8Array[] = [];
  for (const d of err.details) {
    if ("type" in d && d.type === typeName) {
      out.push(d.value);
    }
  }
  return out;
}

function decodeErrorInfo(bytes: Uint8Array): ErrorInfo {
  const info: ErrorInfo = { reason: "", domain: "", metadata: {} };
  const r = new BinaryReader(bytes);
  while (r.pos < r.len) {
    const [no, wt] = r.tag();
    if (no === 1 && wt === WireType.LengthDelimited) {
      info.reason = r.string();
    } else if (no === 2 && wt === WireType.LengthDelimited) {
      info.domain = r.string();
    } else if (no === 3 && wt === WireType.LengthDelimited) {
      const [key, value] = decodeStringPair(r.bytes());
      info.metadata[key] = value;
    } else {
      r.skip(wt);
    }
  }
  return info;
}

// decodeStringPair reads a map<string, string> entry, or a message whose
// fields 1 and 2 are strings (BadRequest.FieldViolation).
function decodeStringPair(bytes: Uint8Array): [string, string] {
  let first = "";
  let second = "";
  const r = new BinaryReader(bytes);
  while (r.pos < r.len) {
    const [no, wt] = r.tag();
    if (no === 1 && wt === WireType.LengthDelimited) {
      first = r.string();
    } else if (no === 2 && wt === WireType.LengthDelimited) {
      second = r.string();
    } else {
      r.skip(wt);
    }
  }
  return [first, second];
}

/** Returns the retryd google.rpc.ErrorInfo of err, or undefined. */
export function errorInfo(err: unknown): ErrorInfo | undefined {
  for (const bytes of incomingDetails(err, "google.rpc.ErrorInfo")) {
    const info = decodeErrorInfo(bytes);
    if (info.domain === ERROR_DOMAIN) {
      return info;
    }
  }
  return undefined;
}

/**
 * Returns the google.rpc.ErrorInfo reason of a retryd error (one of
 * {@link Reason}), or undefined when err carries none.
 */
export function errorReason(err: unknown): string | undefined {
  return errorInfo(err)?.reason;
}

/**
 * When err is retryd's refusal of a report because the session already has
 * a pending retry (FAILED_PRECONDITION, reason RETRY_PENDING), returns that
 * retry's id, which the agent can await or cancel; otherwise undefined.
 */
export function retryPendingId(err: unknown): string | undefined {
  if (!(err instanceof ConnectError) || err.code !== Code.FailedPrecondition) {
    return undefined;
  }
  const info = errorInfo(err);
  if (info?.reason !== Reason.RetryPending) {
    return undefined;
  }
  return info.metadata["retry_id"] ?? "";
}

/**
 * Returns the google.rpc.BadRequest details of a retryd INVALID_ARGUMENT
 * error as a map from field path (for example "failure.code" or
 * "policy.backoff.initial_delay_ms") to its description, or undefined when
 * err carries none. Two violations of one field are joined with "; ".
 */
export function fieldViolations(err: unknown): Record<string, string> | undefined {
  let out: Record<string, string> | undefined;
  for (const bytes of incomingDetails(err, "google.rpc.BadRequest")) {
    const r = new BinaryReader(bytes);
    while (r.pos < r.len) {
      const [no, wt] = r.tag();
      if (no !== 1 || wt !== WireType.LengthDelimited) {
        r.skip(wt);
        continue;
      }
      const [field, description] = decodeStringPair(r.bytes());
      out ??= {};
      const prev = out[field];
      out[field] = prev === undefined ? description : `${prev}; ${description}`;
    }
  }
  return out;
}
