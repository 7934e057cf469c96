// The client's overhead per decision, not a timed test: a local decision
// (the policy port and the local chain, as degraded mode makes it, without
// the wait) and a FailedStep decided by a real retryd over loopback. Run
// with `npm run bench`; it prints ns and heap bytes per decision.
//
// Heap bytes are the growth of the V8 heap across the loop with a young
// generation large enough that no collection runs in it (node is started
// with --max-semi-space-size=256 and --expose-gc), divided by the count.

import { create } from "@bufbuild/protobuf";
import { FailedStepRequestSchema, type FailedStepRequest } from "../src/gen/retryd/v1/retry_service_pb.js";
import { RetrydClient } from "../src/client.js";
import { LocalDecider } from "../src/local.js";
import { decide, resolvePolicy } from "../src/policy.js";
import { startRetryd } from "./server.js";

const gc = (globalThis as { gc?: () => void }).gc;

function request(i: number): FailedStepRequest {
  return create(FailedStepRequestSchema, {
    sessionId: `bench-${i}`,
    turn: 1n,
    step: 1n,
    provider: "openai",
    failure: { code: "RATE_LIMIT", httpStatus: 429, providerRetryAfterMs: 1500n },
    policySource: { case: "policy", value: { maxRetries: 5, backoff: { initialDelayMs: 500n, maxDelayMs: 10_000n } } },
  });
}

async function measure(name: string, n: number, op: (i: number) => unknown): Promise<void> {
  const reqs = Array.from({ length: n }, (_, i) => i);
  for (let i = 0; i < Math.min(200, n); i++) await op(-1 - i); // warm up
  gc?.();
  const heap0 = process.memoryUsage().heapUsed;
  const t0 = process.hrtime.bigint();
  for (const i of reqs) await op(i);
  const ns = Number(process.hrtime.bigint() - t0) / n;
  const bytes = (process.memoryUsage().heapUsed - heap0) / n;
  console.log(`${name.padEnd(44)} ${String(n).padStart(6)} ops  ${ns.toFixed(0).padStart(9)} ns/op  ${bytes.toFixed(0).padStart(7)} heap B/op`);
}

const n = Number(process.env["BENCH_N"] ?? 5000);
console.log(`node ${process.version}; ${gc ? "" : "no --expose-gc: heap figures include collections; "}n=${n}`);

const policy = resolvePolicy(request(0).policySource.value as never);
await measure("policy decide (port)", n * 10, () => decide(policy, { retries: 1, code: "RATE_LIMIT" }, Date.now(), Math.random));

const decider = new LocalDecider();
const reqs = Array.from({ length: n }, (_, i) => request(i));
const warm = Array.from({ length: 200 }, (_, i) => request(1_000_000 + i));
await measure("local decision (LocalDecider.failedStep)", n, (i) => decider.failedStep(i < 0 ? warm[-1 - i]! : reqs[i]!));

const server = await startRetryd();
const client = new RetrydClient(server.addr, { insecure: true });
try {
  const sreqs = Array.from({ length: n }, (_, i) => request(2_000_000 + i));
  const swarm = Array.from({ length: 200 }, (_, i) => request(3_000_000 + i));
  await measure("server decision (failedStep over loopback)", n, (i) => client.failedStep(i < 0 ? swarm[-1 - i]! : sreqs[i]!));
} finally {
  client.close();
  await server.stop();
}
