// @retryd/client: the TypeScript client of retryd, the retry-decision
// service for fleets of LLM agent loops.
//
// RetrydClient wraps the RetryService over @connectrpc/connect-node's gRPC
// transport (TLS unless insecure is asked for; retryInterceptor sends
// idempotent calls again), with recover() for the agent loop, which decides
// locally with the policy port (policy.ts, local.ts) while no replica
// answers; classify turns a provider failure into retryd's Failure;
// bearerTokenInterceptor sends a tenant's token on a transport of the
// caller's own; the error helpers read retryd's google.rpc details;
// renderRetryLine is the pure UI-line function (also importable alone from
// "@retryd/client/render"); the SDK middleware lives in the subpaths
// "@retryd/client/ai-sdk" and "@retryd/client/openai", so this entry never
// loads an SDK; the generated messages, enums and schemas are re-exported
// as they are.

export * from "./client.js";
export * from "./classify.js";
export * from "./errors.js";
export * from "./local.js";
export {
  backoffLink,
  delegatedInfo,
  type AttemptContext,
  type DelegatedInfo,
  type MiddlewareOptions,
  type Position,
} from "./middleware.js";
export * from "./policy.js";
export * from "./render.js";
export * from "./token.js";
export * from "./transport.js";
export * from "./gen/retryd/v1/events_pb.js";
export * from "./gen/retryd/v1/policy_pb.js";
export * from "./gen/retryd/v1/retry_service_pb.js";
