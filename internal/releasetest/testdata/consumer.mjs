// An agent's program that installed @retryd/client from the release's
// tarball: one failed model request reported to the retryd at argv[2].
import { RetrydClient } from "@retryd/client";

const client = new RetrydClient(process.argv[2], { insecure: true });
try {
  const resp = await client.failedStep({
    sessionId: "release-npm", turn: 1n, step: 1n, provider: "deepseek",
    failure: { code: "RATE_LIMIT", httpStatus: 429 },
  });
  const outcome = resp.decision?.outcome;
  if (outcome?.case !== "schedule") {
    throw new Error(`FailedStep answered ${outcome?.case}, want a scheduled retry`);
  }
  console.log(`scheduled retry ${outcome.value.retryNumber} of ${outcome.value.maxRetries}`);
} finally {
  client.close();
}
