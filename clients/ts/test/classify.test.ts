// Runs every shared classification vector (testdata/classify/*.json, format
// in its README.md) through classify, and checks that the built-in default
// policy decides each classified failure as the vector documents, with the
// client's policy port. clients/go/classify_test.go runs the same files.

import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { toJson } from "@bufbuild/protobuf";
import { DelegateReason, FailureSchema, Replay } from "../src/gen/retryd/v1/events_pb.js";
import { classify, errorKindOf, type ErrorKind, type ProviderFailure } from "../src/classify.js";
import { decide, providerRetryAfter, resolvePolicy } from "../src/policy.js";
import { repoRoot } from "./server.js";

interface ClassifyVector {
  name: string;
  comment?: string;
  input: {
    httpStatus?: number;
    headers?: Record<string, string>;
    body?: string | object;
    errorKind?: ErrorKind;
    outputShown?: boolean;
    emptyCompletion?: boolean;
  };
  expect: { failure: Record<string, unknown>; replay: string; defaultDecision?: string };
}

const fileKeys = new Set(["description", "vectors"]);
const vectorKeys = new Set(["name", "comment", "input", "expect"]);
const inputKeys = new Set(["httpStatus", "headers", "body", "errorKind", "outputShown", "emptyCompletion"]);
const expectKeys = new Set(["failure", "replay", "defaultDecision"]);
const failureKeys = new Set(["code", "httpStatus", "providerRetryAfterMs", "retryAfter"]);

function known(where: string, obj: object, keys: Set<string>): void {
  for (const k of Object.keys(obj)) assert.ok(keys.has(k), `${where}: unknown key ${JSON.stringify(k)}`);
}

function loadClassifyVectors(): ClassifyVector[] {
  const dir = join(repoRoot(), "testdata", "classify");
  const out: ClassifyVector[] = [];
  for (const f of readdirSync(dir).filter((n) => n.endsWith(".json")).sort()) {
    const doc = JSON.parse(readFileSync(join(dir, f), "utf8")) as { vectors: ClassifyVector[] };
    known(f, doc, fileKeys);
    for (const v of doc.vectors) {
      known(`${f} ${v.name}`, v, vectorKeys);
      known(`${f} ${v.name} input`, v.input, inputKeys);
      known(`${f} ${v.name} expect`, v.expect, expectKeys);
      known(`${f} ${v.name} expect.failure`, v.expect.failure, failureKeys);
      out.push(v);
    }
  }
  return out;
}

const vectors = loadClassifyVectors();

test("classification vectors", async (t) => {
  assert.ok(vectors.length >= 30, `only ${vectors.length} vectors`);
  assert.equal(new Set(vectors.map((v) => v.name)).size, vectors.length, "vector names are unique");
  const defaultPolicy = resolvePolicy(undefined);
  for (const v of vectors) {
    await t.test(v.name, () => {
      const c = classify(v.input as ProviderFailure);
      const got = toJson(FailureSchema, c.failure) as Record<string, unknown>;
      delete got["message"];
      const want = { ...v.expect.failure };
      if (want["httpStatus"] === 0) delete want["httpStatus"];
      if (want["providerRetryAfterMs"] !== undefined) want["providerRetryAfterMs"] = String(want["providerRetryAfterMs"]);
      assert.deepEqual(got, want, `${v.name}: failure`);
      assert.equal(Replay[c.replay], v.expect.replay.replace(/^REPLAY_/, ""), `${v.name}: replay`);
      assert.ok(Buffer.byteLength(c.failure.message) <= 4096, `${v.name}: message over 4 KiB`);
      if (v.expect.defaultDecision !== undefined) {
        const now = Date.now();
        const d = decide(
          defaultPolicy,
          {
            retries: 0,
            code: c.failure.code,
            replay: c.replay,
            retryAfter: providerRetryAfter(c.failure.providerRetryAfterMs, c.failure.retryAfter, now),
          },
          now,
          () => 0,
        );
        const name = d.schedule ? "SCHEDULE" : `DELEGATE_REASON_${DelegateReason[d.reason]}`;
        assert.equal(name, v.expect.defaultDecision, `${v.name}: the default policy's decision`);
      }
    });
  }
});

test("errorKindOf reads Node's and the SDKs' errors", () => {
  const withCause = (cause: object) => Object.assign(new TypeError("fetch failed"), { cause });
  const cases: [unknown, ErrorKind | undefined][] = [
    [undefined, undefined],
    [withCause(Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:1"), { code: "ECONNREFUSED" })), "connection_refused"],
    [withCause(Object.assign(new Error("other side closed"), { code: "UND_ERR_SOCKET" })), "connection_reset"],
    [withCause(Object.assign(new Error("getaddrinfo ENOTFOUND x"), { code: "ENOTFOUND" })), "dns"],
    [withCause(Object.assign(new Error("self-signed"), { code: "DEPTH_ZERO_SELF_SIGNED_CERT" })), "tls"],
    [new DOMException("aborted", "AbortError"), "aborted"],
    [new DOMException("timed out", "TimeoutError"), "timeout"],
    [Object.assign(new Error("Request timed out."), { name: "APIConnectionTimeoutError" }), "timeout"],
    [Object.assign(new Error("Premature close"), { code: "ERR_STREAM_PREMATURE_CLOSE" }), "stream_truncated"],
    [new Error("something else"), "connection_reset"],
  ];
  for (const [err, want] of cases) assert.equal(errorKindOf(err), want, String(err));
});
