// The SDK middleware driving the REAL SDK packages (ai with
// @ai-sdk/openai-compatible, and openai), pinned in package.json, against a
// scripted OpenAI-compatible provider on loopback and a real retryd: the
// provider attempts, the delays retryd decided (from its event log), the
// delegations, and `retryd verify` over the whole log.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { generateText, streamText, wrapLanguageModel } from "ai";
import OpenAI from "openai";
import { DelaySource, DelegateReason, type Event, type RetryStarted } from "../src/gen/retryd/v1/events_pb.js";
import { RetrydClient } from "../src/client.js";
import { retrydMiddleware } from "../src/ai-sdk.js";
import { backoffLink, delegatedInfo, type MiddlewareOptions } from "../src/middleware.js";
import { withRetryd } from "../src/openai.js";
import { FakeProvider, SCRIPTS } from "./fakeprovider.js";
import { startRetryd, type RetrydServer } from "./server.js";

let server: RetrydServer;
let client: RetrydClient;
let fake: FakeProvider;
let baseURL: string;

before(async () => {
  server = await startRetryd();
  client = new RetrydClient(server.addr, { insecure: true });
  fake = new FakeProvider();
  baseURL = await fake.listen();
});

after(async () => {
  client.close();
  await fake.close();
  await server.stop();
});

// 50, 100, 200, 400 ms: exact (jitter 0), so the test states them.
const policy = { maxRetries: 6, backoff: { initialDelayMs: 50n, maxDelayMs: 10_000n, jitterRatio: 0 } };

function options(sessionId: string): MiddlewareOptions {
  return { client, provider: "openai", policy, sessionId };
}

// decisions lists what retryd decided for a session, from its event log.
async function decisions(sessionId: string): Promise<string[]> {
  const out: string[] = [];
  for await (const ev of client.watchEvents({ sessionId, stopAtEnd: true })) {
    out.push(describe(ev));
  }
  return out.filter((d) => d !== "");
}

function describe(ev: Event): string {
  switch (ev.kind.case) {
    case "scheduled":
      return `${ev.kind.value.failure?.code} → retry ${ev.kind.value.retryNumber} after ${ev.kind.value.delayMs} ms (${DelaySource[ev.kind.value.delaySource]})`;
    case "delegated":
      return `${ev.kind.value.failure?.code} → delegate ${DelegateReason[ev.kind.value.reason]}`;
    case "closed":
      return `closed after ${ev.kind.value.retries}`;
    default:
      return "";
  }
}

// gaps are the waits between consecutive provider requests since index from.
function gaps(from: number): number[] {
  const r = fake.received.slice(from);
  return r.slice(1).map((x, i) => x.at - r[i]!.at);
}

// What retryd's log says of the script unavailable, rateLimited,
// overloaded, empty, a completion, then quota: four retries (the
// provider's Retry-After honoured), the completion closing the chain, and
// the delegation the quota error asks for.
const RETRIED_THEN_OUT_OF_QUOTA = [
  "SERVER → retry 1 after 50 ms (BACKOFF)",
  "RATE_LIMIT → retry 2 after 1500 ms (PROVIDER_RETRY_AFTER)",
  "SERVER → retry 3 after 200 ms (BACKOFF)",
  "EMPTY_RESPONSE → retry 4 after 400 ms (BACKOFF)",
  "closed after 4",
  "QUOTA → delegate CODE_NOT_RETRYABLE",
];

function assertWaited(got: number[], decided: number[]): void {
  assert.equal(got.length, decided.length, `gaps ${JSON.stringify(got)}`);
  got.forEach((g, i) => assert.ok(g >= decided[i]!, `request ${i + 2} came ${g} ms after the previous one; retryd decided ${decided[i]} ms`));
}

test("AI SDK generateText: retryd decides every retry, then delegates out-of-quota", async (t) => {
  const provider = createOpenAICompatible({ name: "fake", baseURL, apiKey: "test" });
  const model = wrapLanguageModel({ model: provider.chatModel("fake-model"), middleware: retrydMiddleware(options("ts-mw-ai-generate")) });
  const from = fake.received.length;
  fake.script(SCRIPTS.unavailable, SCRIPTS.rateLimited, SCRIPTS.overloaded, SCRIPTS.empty, { kind: "complete", text: "Hello" });
  const result = await generateText({ model, prompt: "hi", maxRetries: 0 });
  assert.equal(result.text, "Hello");
  assert.equal(fake.received.length - from, 5, "provider attempts");
  assertWaited(gaps(from), [50, 1500, 200, 400]);

  fake.script(SCRIPTS.quota);
  const err = await generateText({ model, prompt: "again", maxRetries: 0 }).then(
    () => assert.fail("out of quota succeeded"),
    (e: unknown) => e,
  );
  assert.equal((err as { statusCode?: number }).statusCode, 429, `the provider's error: ${String(err)}`);
  assert.equal(delegatedInfo(err)?.delegate?.reason, DelegateReason.CODE_NOT_RETRYABLE);
  assert.equal(fake.received.length - from, 6);

  const log = await decisions("ts-mw-ai-generate");
  t.diagnostic(log.join("; "));
  assert.deepEqual(log, RETRIED_THEN_OUT_OF_QUOTA);
});

test("AI SDK streamText: failures before output retried unseen; an error after output is delegated", async (t) => {
  const provider = createOpenAICompatible({ name: "fake", baseURL, apiKey: "test" });
  const model = wrapLanguageModel({ model: provider.chatModel("fake-model"), middleware: retrydMiddleware(options("ts-mw-ai-stream")) });
  const from = fake.received.length;
  fake.script(SCRIPTS.unavailable, { kind: "stream-error", tokens: [], error: SCRIPTS.streamError.error }, SCRIPTS.empty, { kind: "complete", text: "Hi" });
  const ok = streamText({ model, prompt: "hi", maxRetries: 0 });
  assert.equal(await ok.text, "Hi");
  assert.equal(fake.received.length - from, 4, "provider attempts");
  assertWaited(gaps(from), [50, 100, 200]);

  fake.script(SCRIPTS.streamError);
  const shown = streamText({ model, prompt: "again", maxRetries: 0, onError: () => undefined });
  let text = "";
  let streamed: unknown;
  for await (const part of shown.fullStream) {
    if (part.type === "text-delta") text += part.text;
    if (part.type === "error") streamed = part.error;
  }
  assert.equal(text, "Hello", "the tokens before the error were shown");
  assert.ok(streamed !== undefined, "the error part was passed on");
  assert.equal(delegatedInfo(streamed)?.delegate?.reason, DelegateReason.REPLAY_UNSAFE);
  assert.equal(fake.received.length - from, 5, "no replay after output was shown");

  const log = await decisions("ts-mw-ai-stream");
  t.diagnostic(log.join("; "));
  assert.deepEqual(log, [
    "SERVER → retry 1 after 50 ms (BACKOFF)",
    "SERVER → retry 2 after 100 ms (BACKOFF)",
    "EMPTY_RESPONSE → retry 3 after 200 ms (BACKOFF)",
    "closed after 3",
    "SERVER → delegate REPLAY_UNSAFE",
  ]);
});

test("openai SDK: its retries off, retryd decides; quota and a broken stream are delegated", async (t) => {
  const openai = withRetryd(new OpenAI({ baseURL, apiKey: "test" }), options("ts-mw-openai"));
  const from = fake.received.length;
  fake.script(SCRIPTS.unavailable, SCRIPTS.rateLimited, SCRIPTS.overloaded, SCRIPTS.empty, { kind: "complete", text: "Hello" });
  const completion = await openai.chat.completions.create({ model: "fake-model", messages: [{ role: "user", content: "hi" }] });
  assert.equal(completion.choices[0]?.message.content, "Hello");
  assert.equal(fake.received.length - from, 5, "provider attempts (the SDK retried nothing itself)");
  assertWaited(gaps(from), [50, 1500, 200, 400]);

  fake.script(SCRIPTS.quota);
  const err = await openai.chat.completions.create({ model: "fake-model", messages: [{ role: "user", content: "again" }] }).then(
    () => assert.fail("out of quota succeeded"),
    (e: unknown) => e,
  );
  assert.ok(err instanceof OpenAI.RateLimitError, `the SDK's own error: ${String(err)}`);
  assert.equal(delegatedInfo(err)?.delegate?.reason, DelegateReason.CODE_NOT_RETRYABLE);

  fake.script(SCRIPTS.unavailable, SCRIPTS.streamError);
  const stream = await openai.chat.completions.create({ model: "fake-model", messages: [{ role: "user", content: "stream" }], stream: true });
  let text = "";
  const thrown = await (async () => {
    for await (const c of stream) text += c.choices[0]?.delta.content ?? "";
  })().then(
    () => undefined,
    (e: unknown) => e,
  );
  assert.equal(text, "Hello");
  assert.ok(thrown instanceof OpenAI.APIError, `the SDK's stream error: ${String(thrown)}`);
  assert.equal(delegatedInfo(thrown)?.delegate?.reason, DelegateReason.REPLAY_UNSAFE);
  assert.equal(fake.received.length - from, 8);

  const log = await decisions("ts-mw-openai");
  t.diagnostic(log.join("; "));
  assert.deepEqual(log, [
    ...RETRIED_THEN_OUT_OF_QUOTA,
    "SERVER → retry 1 after 50 ms (BACKOFF)",
    "SERVER → delegate REPLAY_UNSAFE",
  ]);
});

test("the position hook numbers the attempts as the harness does", async () => {
  const provider = createOpenAICompatible({ name: "fake", baseURL, apiKey: "test" });
  const seen: string[] = [];
  const model = wrapLanguageModel({
    model: provider.chatModel("fake-model"),
    middleware: retrydMiddleware({
      client,
      provider: "openai",
      policy,
      position: ({ call, attempt }) => {
        seen.push(`${call}.${attempt}`);
        return { sessionId: "ts-mw-hook", turn: 7n, step: BigInt(100 + attempt), logicalTurnId: "lt-7" };
      },
    }),
  });
  fake.script(SCRIPTS.unavailable, { kind: "complete", text: "ok" });
  assert.equal((await generateText({ model, prompt: "hi", maxRetries: 0 })).text, "ok");
  assert.deepEqual(seen, ["1.1", "1.2"]);
  const events: Event[] = [];
  for await (const ev of client.watchEvents({ sessionId: "ts-mw-hook", stopAtEnd: true })) events.push(ev);
  const scheduled = events.find((e) => e.kind.case === "scheduled");
  assert.ok(scheduled?.kind.case === "scheduled");
  assert.deepEqual([scheduled.kind.value.turn, scheduled.kind.value.step, scheduled.kind.value.logicalTurnId], [7n, 101n, "lt-7"]);
});

test("backoffLink links an attempt to retryd's backoff span", () => {
  const started = { traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" } as RetryStarted;
  assert.deepEqual(backoffLink(started), [
    {
      context: { traceId: "0af7651916cd43dd8448eb211c80319c", spanId: "b7ad6b7169203331", traceFlags: 1, isRemote: true },
      attributes: { "retryd.link": "backoff" },
    },
  ]);
  assert.deepEqual(backoffLink({ traceparent: "" } as RetryStarted), []);
  assert.deepEqual(backoffLink({ traceparent: "00-00000000000000000000000000000000-b7ad6b7169203331-01" } as RetryStarted), []);
  assert.deepEqual(backoffLink(undefined), []);
});

test("retryd verify: the server's log of the middleware runs is clean", async (t) => {
  t.diagnostic(await server.verify());
  assert.equal(fake.left, 0, "every scripted answer was used");
});
