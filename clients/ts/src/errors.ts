// Reading retryd's google.rpc error details from a ConnectError.
//
// retryd attaches google.rpc.ErrorInfo (domain "retryd.dev") to its
// FAILED_PRECONDITION errors and google.rpc.BadRequest to its
// INVALID_ARGUMENT errors. Both messages are tiny and stable, so they are
// decoded here with the protobuf runtime's wire reader instead of
// generating all of google/rpc.

import { BinaryReader, BinaryWriter, WireType } from "@bufbuild/protobuf/wire";
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

/**
 * The ErrorInfo reasons of retryd's refusals outside FAILED_PRECONDITION:
 * PERMISSION_DENIED by a tenant's allow-lists, RESOURCE_EXHAUSTED by
 * admission control.
 */
export const AccessReason = {
  /** The tenant may not use the provider; metadata provider names it. */
  ProviderNotAllowed: "PROVIDER_NOT_ALLOWED",
  /** The tenant may not select the named policy; metadata policy_name names it. */
  PolicyNotAllowed: "POLICY_NOT_ALLOWED",
  /** An admission bound is full; metadata bound and limit name it. */
  LimitReached: "LIMIT_REACHED",
} as const;

/**
 * When err is retryd's admission refusal (RESOURCE_EXHAUSTED, reason
 * LIMIT_REACHED), returns the bound that is full (for example
 * "pending_retries_per_tenant"); otherwise undefined. Send the request again
 * after {@link retryDelayMs}, or hand the failure to the next recovery
 * policy.
 */
export function limitReached(err: unknown): string | undefined {
  if (!(err instanceof ConnectError) || err.code !== Code.ResourceExhausted) {
    return undefined;
  }
  const info = errorInfo(err);
  if (info?.reason !== AccessReason.LimitReached) {
    return undefined;
  }
  return info.metadata["bound"] ?? "";
}

/**
 * Returns the google.rpc.RetryInfo delay of err in milliseconds — how long
 * the server asks the caller to wait before sending the request again — or
 * undefined when err carries none (or a negative one).
 */
export function retryDelayMs(err: unknown): number | undefined {
  for (const bytes of incomingDetails(err, "google.rpc.RetryInfo")) {
    const r = new BinaryReader(bytes);
    while (r.pos < r.len) {
      const [no, wt] = r.tag();
      if (no !== 1 || wt !== WireType.LengthDelimited) {
        r.skip(wt);
        continue;
      }
      // google.protobuf.Duration: seconds = 1, nanos = 2.
      let seconds = 0n;
      let nanos = 0;
      const d = new BinaryReader(r.bytes());
      while (d.pos < d.len) {
        const [dno, dwt] = d.tag();
        if (dno === 1 && dwt === WireType.Varint) {
          seconds = BigInt(d.int64());
        } else if (dno === 2 && dwt === WireType.Varint) {
          nanos = d.int32();
        } else {
          d.skip(dwt);
        }
      }
      const ms = Number(seconds) * 1000 + Math.floor(nanos / 1e6);
      return ms >= 0 ? ms : undefined;
    }
  }
  return undefined;
}

/**
 * A google.rpc.BadRequest detail with these field violations, in the form
 * a ConnectError from the wire carries, so {@link fieldViolations} reads
 * the client's own refusals (degraded mode) as it reads the server's.
 */
export function badRequestDetail(violations: { field: string; description: string }[]): { type: string; value: Uint8Array } {
  const w = new BinaryWriter();
  for (const v of violations) {
    w.tag(1, WireType.LengthDelimited).fork();
    w.tag(1, WireType.LengthDelimited).string(v.field);
    w.tag(2, WireType.LengthDelimited).string(v.description);
    w.join();
  }
  return { type: "google.rpc.BadRequest", value: w.finish() };
}
