// The bearer-token options and getProviderState against a live retryd
// started with --auth-credentials (token hashes of two tenants) and a
// policy file that protects the provider deepseek.

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { toJsonString } from "@bufbuild/protobuf";
import { Code, ConnectError, type Interceptor, type UnaryRequest } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { EventSchema } from "../src/gen/retryd/v1/events_pb.js";
import { CircuitState } from "../src/gen/retryd/v1/retry_service_pb.js";
import { RetrydClient, type ClientOptions, type FailedStepInit } from "../src/client.js";
import { errorInfo, errorReason, fieldViolations } from "../src/errors.js";
import { bearerTokenInterceptor } from "../src/token.js";
import { startRetryd, verifyEventLines, type RetrydServer } from "./server.js";

// Bearer tokens of the tests (256 random-looking bits in hex, as
// `openssl rand -hex 32` makes them).
const TOKEN_A = "2b7e151628aed2a6abf7158809cf4f3c762e7160f38b4da56a784d9045190cfe";
const TOKEN_B = "f0e1d2c3b4a5968778695a4b3c2d1e0ff0e1d2c3b4a5968778695a4b3c2d1e0f";

// sha256 is what the credentials file stores for a token (retryd hash-token).
function sha256(token: string): string {
  return createHash("sha256").update(token).digest("hex");
}

let dir: string;
let server: RetrydServer;
const clients: RetrydClient[] = [];

// client makes a client of the test server, closed after the tests.
function client(options: ClientOptions = {}): RetrydClient {
  const c = new RetrydClient(server.addr, { insecure: true, ...options });
  clients.push(c);
  return c;
}

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "retryd-ts-auth-"));
  const credentials = join(dir, "credentials.yaml");
  writeFileSync(
    credentials,
    `tenants:
  - id: team-a
    tokens:
      - sha256: "${sha256(TOKEN_A)}"
    providers: [deepseek, openai]
  - id: team-b
    tokens:
      - sha256: "${sha256(TOKEN_B)}"
`,
  );
  const config = join(dir, "config.yaml");
  writeFileSync(config, "providers:\n  deepseek:\n    fleet: {capacity: 20, refillPerSecond: 0.0001, successCredit: 0.1}\n");
  server = await startRetryd("--auth-credentials", credentials, "--config", config);
});

after(async () => {
  try {
    // `retryd verify --server` holds no token: read each tenant's log with
    // its token and check it with `retryd verify --file -`.
    for (const token of [TOKEN_A, TOKEN_B]) {
      const lines: string[] = [];
      for await (const ev of client({ insecureBearerToken: token }).watchEvents({ stopAtEnd: true })) {
        lines.push(toJsonString(EventSchema, ev));
      }
      await verifyEventLines(lines);
    }
  } finally {
    for (const c of clients) {
      c.close();
    }
    await server.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});

function failure(sessionId: string, provider: string): FailedStepInit {
  return {
    sessionId,
    turn: 1n,
    step: 1n,
    provider,
    failure: { code: "RATE_LIMIT", httpStatus: 429 },
    policySource: { case: "policy", value: { maxRetries: 2, backoff: { initialDelayMs: 10_000n, jitterRatio: 0 } } },
  };
}

// rejection is the error a promise rejects with; it fails when it resolves.
async function rejection(p: Promise<unknown>): Promise<unknown> {
  return p.then(
    (v) => assert.fail(`resolved with ${String(v)}`),
    (err: unknown) => err,
  );
}

function assertCode(err: unknown, code: Code, message?: RegExp): void {
  assert.ok(err instanceof ConnectError, `not a ConnectError: ${String(err)}`);
  assert.equal(err.code, code, `${Code[err.code]}: ${err.message}`);
  if (message !== undefined) {
    assert.match(err.message, message);
  }
}

test("insecureBearerToken is sent with every call, and the token names the tenant", async () => {
  const session = "ts-auth-tenant";
  const a = client({ insecureBearerToken: TOKEN_A });
  const resp = await a.failedStep(failure(session, "deepseek"));
  assert.equal(resp.decision?.outcome.case, "schedule");
  assert.equal((await a.getChains(session)).chains.length, 1);

  // Team B's token reaches a tenant of its own: team A's session does not
  // exist there.
  const b = client({ insecureBearerToken: TOKEN_B });
  assertCode(await rejection(b.getChains(session)), Code.NotFound);

  // Streams carry it too.
  const kinds: string[] = [];
  for await (const ev of a.watchEvents({ sessionId: session, stopAtEnd: true })) {
    kinds.push(ev.kind.case ?? "none");
  }
  assert.deepEqual(kinds, ["scheduled"]);
  await a.cancelSession(session);
});

test("without a token, or with a wrong one, the RetryService answers UNAUTHENTICATED", async () => {
  for (const c of [client(), client({ insecureBearerToken: "0".repeat(64) })]) {
    assertCode(await rejection(c.getChains("ts-auth-anonymous")), Code.Unauthenticated);
    assertCode(await rejection(c.getProviderState("deepseek")), Code.Unauthenticated);
    const stream = (async () => {
      for await (const _ of c.watchEvents({ stopAtEnd: true })) {
        // no event may arrive
      }
    })();
    assertCode(await rejection(stream), Code.Unauthenticated);
  }
});

test("bearerToken is sent only over TLS: the constructor refuses a plaintext target", () => {
  for (const target of [server.addr, `http://${server.addr}`]) {
    assert.throws(() => new RetrydClient(target, { bearerToken: TOKEN_A, insecure: true }), (err: unknown) => {
      assert.ok(err instanceof TypeError);
      assert.match(err.message, /only over TLS/);
      return true;
    });
  }
  // An https:// target, or host:port (TLS by default), is accepted (it connects on the first call).
  new RetrydClient(`https://${server.addr}`, { bearerToken: TOKEN_A }).close();
  new RetrydClient(server.addr, { bearerToken: TOKEN_A }).close();
  assert.throws(() => new RetrydClient(server.addr, { bearerToken: TOKEN_A, insecureBearerToken: TOKEN_A }), /not both/);
  const transport = createGrpcTransport({ baseUrl: `http://${server.addr}` });
  assert.throws(() => new RetrydClient(transport, { insecureBearerToken: TOKEN_A }), /bearerTokenInterceptor/);
});

test("a malformed token is refused, naming the offset and not the token", () => {
  for (const [token, offset] of [
    ["", undefined],
    [`${TOKEN_A}\n`, 64],
    ["secret token", 6],
    ["sécret", 1],
  ] as const) {
    for (const options of [{ insecureBearerToken: token }, { bearerToken: token }]) {
      assert.throws(
        () => new RetrydClient(`https://${server.addr}`, options),
        (err: unknown) => {
          assert.ok(err instanceof TypeError);
          assert.match(err.message, offset === undefined ? /empty/ : new RegExp(`offset ${offset} `));
          assert.ok(token === "" || !err.message.includes(token.trim()), `the message quotes the token: ${err.message}`);
          return true;
        },
      );
    }
    assert.throws(() => bearerTokenInterceptor(token), TypeError);
  }
});

test("bearerTokenInterceptor on a transport of one's own: refused over plaintext unless insecure", async () => {
  const plain = new RetrydClient(createGrpcTransport({ baseUrl: `http://${server.addr}`, interceptors: [bearerTokenInterceptor(TOKEN_A)] }));
  assertCode(await rejection(plain.getChains("ts-auth-own")), Code.Unauthenticated, /only over TLS/);
  const insecure = new RetrydClient(
    createGrpcTransport({ baseUrl: `http://${server.addr}`, interceptors: [bearerTokenInterceptor(TOKEN_A, { insecure: true })] }),
  );
  assertCode(await rejection(insecure.getChains("ts-auth-own")), Code.NotFound); // authenticated; unknown session
});

test("bearerTokenInterceptor sets the authorization header on an https:// call", async () => {
  const seen: (string | null)[] = [];
  const next: Parameters<Interceptor>[0] = (req) => {
    seen.push(req.header.get("authorization"));
    return Promise.resolve({} as Awaited<ReturnType<Parameters<Interceptor>[0]>>);
  };
  const req = { url: "https://retryd.agents.svc:7700/retryd.v1.RetryService/GetChains", header: new Headers() };
  await bearerTokenInterceptor(TOKEN_A)(next)(req as unknown as UnaryRequest);
  assert.deepEqual(seen, [`Bearer ${TOKEN_A}`]);
});

test("getProviderState reads a provider's fleet protection", async () => {
  const a = client({ insecureBearerToken: TOKEN_A });
  const before = await a.getProviderState("deepseek");
  assert.equal(before.provider, "deepseek");
  assert.equal(before.protected, true);
  assert.equal(before.budgetCapacity, 20);
  assert.equal(before.circuit, CircuitState.CLOSED);

  // A retry scheduled against the provider takes a token and queues (the
  // refill is too slow to give it back within the test).
  const session = "ts-auth-provider-state";
  const resp = await a.failedStep(failure(session, "deepseek"));
  assert.equal(resp.decision?.outcome.case, "schedule");
  const after = await a.getProviderState("deepseek");
  assert.ok(after.budgetTokens < before.budgetTokens && after.budgetTokens >= before.budgetTokens - 1.5, `tokens ${before.budgetTokens} → ${after.budgetTokens}`);
  assert.equal(after.queuedRetries, before.queuedRetries + 1);
  await a.cancelSession(session);

  const openai = await a.getProviderState("openai");
  assert.equal(openai.protected, false);
  assert.equal(openai.budgetCapacity, 0);
  assert.equal(openai.circuit, CircuitState.UNSPECIFIED);

  const empty = await rejection(a.getProviderState(""));
  assertCode(empty, Code.InvalidArgument);
  assert.ok(fieldViolations(empty)?.["provider"], JSON.stringify(fieldViolations(empty)));
});

test("a provider outside the tenant's list is PERMISSION_DENIED, reason PROVIDER_NOT_ALLOWED", async () => {
  const a = client({ insecureBearerToken: TOKEN_A });
  for (const call of [() => a.failedStep(failure("ts-auth-denied", "anthropic")), () => a.getProviderState("anthropic")]) {
    const err = await rejection(call());
    assertCode(err, Code.PermissionDenied);
    assert.equal(errorReason(err), "PROVIDER_NOT_ALLOWED");
    assert.deepEqual(errorInfo(err)?.metadata, { tenant: "team-a", provider: "anthropic" });
  }
  assertCode(await rejection(a.getChains("ts-auth-denied")), Code.NotFound); // nothing recorded
});
