// @retryd/client: the TypeScript client of retryd, the retry-decision
// service for fleets of LLM agent loops.
//
// RetrydClient wraps the RetryService over @connectrpc/connect-node's gRPC
// transport, with recover() for the agent loop; bearerTokenInterceptor
// sends a tenant's token on a transport of the caller's own; the error
// helpers read retryd's google.rpc details; renderRetryLine is the pure UI-line
// function (also importable alone from "@retryd/client/render"); the
// generated messages, enums and schemas are re-exported as they are.

export * from "./client.js";
export * from "./classify.js";
export * from "./errors.js";
export * from "./local.js";
export * from "./policy.js";
export * from "./render.js";
export * from "./token.js";
export * from "./gen/retryd/v1/events_pb.js";
export * from "./gen/retryd/v1/policy_pb.js";
export * from "./gen/retryd/v1/retry_service_pb.js";
