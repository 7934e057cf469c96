// A scripted OpenAI-compatible provider on loopback for the middleware
// tests: POST /v1/chat/completions answers the next scripted response
// (an error status with its body and headers, a completion, an empty
// completion, or a stream that ends in an error event), JSON or SSE as the
// request asks, and records when each request arrived.

import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

/** One scripted answer. */
export type Scripted =
  | { kind: "error"; status: number; headers?: Record<string, string>; body: unknown }
  | { kind: "complete"; text: string }
  | { kind: "empty" }
  | { kind: "stream-error"; tokens: string[]; error: unknown };

/** A request the provider received. */
export interface Received {
  at: number;
  stream: boolean;
  answered: Scripted["kind"] | "unscripted";
}

export const SCRIPTS = {
  unavailable: { kind: "error", status: 503, body: { error: { message: "The server is temporarily unavailable.", type: "server_error", code: null } } },
  rateLimited: {
    kind: "error",
    status: 429,
    headers: { "retry-after-ms": "1500", "retry-after": "2" },
    body: { error: { message: "Rate limit reached for requests", type: "requests", code: "rate_limit_exceeded" } },
  },
  quota: {
    kind: "error",
    status: 429,
    body: { error: { message: "You exceeded your current quota, please check your plan and billing details.", type: "insufficient_quota", code: "insufficient_quota" } },
  },
  overloaded: { kind: "error", status: 529, body: { type: "error", error: { type: "overloaded_error", message: "Overloaded" } } },
  empty: { kind: "empty" },
  streamError: {
    kind: "stream-error",
    tokens: ["Hel", "lo"],
    error: { message: "Overloaded", type: "overloaded_error", code: "overloaded_error" },
  },
} as const satisfies Record<string, Scripted>;

export class FakeProvider {
  readonly received: Received[] = [];
  #script: Scripted[] = [];
  readonly #server: Server;
  /** Answers a request when no scripted answer is left, by the request's model. */
  responder: ((model: string) => Scripted) | undefined;

  constructor() {
    this.#server = createServer((req, res) => void this.#answer(req, res));
  }

  /** Starts listening; returns the base URL (…/v1). */
  async listen(): Promise<string> {
    await new Promise<void>((resolve) => this.#server.listen(0, "127.0.0.1", resolve));
    return `http://127.0.0.1:${(this.#server.address() as AddressInfo).port}/v1`;
  }

  /** Queues answers, in order. */
  script(...answers: Scripted[]): void {
    this.#script.push(...answers);
  }

  /** The answers not yet given. */
  get left(): number {
    return this.#script.length;
  }

  close(): Promise<void> {
    this.#server.closeAllConnections();
    return new Promise((resolve) => this.#server.close(() => resolve()));
  }

  async #answer(req: IncomingMessage, res: ServerResponse): Promise<void> {
    let raw = "";
    for await (const chunk of req) raw += String(chunk);
    const body = JSON.parse(raw || "{}") as { stream?: boolean; model?: string };
    const stream = body.stream === true;
    const next = this.#script.shift() ?? this.responder?.(body.model ?? "");
    this.received.push({ at: Date.now(), stream, answered: next?.kind ?? "unscripted" });
    const model = body.model ?? "fake-model";
    if (next === undefined) {
      res.writeHead(500, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: { message: "no scripted answer left", type: "server_error" } }));
      return;
    }
    switch (next.kind) {
      case "error":
        res.writeHead(next.status, { "content-type": "application/json", ...next.headers });
        res.end(JSON.stringify(next.body));
        return;
      case "complete":
      case "empty": {
        const text = next.kind === "complete" ? next.text : "";
        if (!stream) {
          res.writeHead(200, { "content-type": "application/json" });
          res.end(JSON.stringify(completion(model, text)));
          return;
        }
        sse(res, [
          chunk(model, { role: "assistant", content: "" }, null),
          ...(text === "" ? [] : [chunk(model, { content: text }, null)]),
          chunk(model, {}, "stop"),
          "[DONE]",
        ]);
        return;
      }
      case "stream-error":
        sse(res, [
          chunk(model, { role: "assistant", content: "" }, null),
          ...next.tokens.map((t) => chunk(model, { content: t }, null)),
          { error: next.error },
        ]);
        return;
    }
  }
}

function completion(model: string, content: string): object {
  return {
    id: "chatcmpl-fake",
    object: "chat.completion",
    created: Math.floor(Date.now() / 1000),
    model,
    choices: [{ index: 0, message: { role: "assistant", content }, finish_reason: "stop", logprobs: null }],
    usage: { prompt_tokens: 3, completion_tokens: content === "" ? 0 : 1, total_tokens: content === "" ? 3 : 4 },
  };
}

function chunk(model: string, delta: object, finish: string | null): object {
  return {
    id: "chatcmpl-fake",
    object: "chat.completion.chunk",
    created: Math.floor(Date.now() / 1000),
    model,
    choices: [{ index: 0, delta, finish_reason: finish, logprobs: null }],
  };
}

function sse(res: ServerResponse, events: (object | string)[]): void {
  res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
  for (const e of events) {
    res.write(`data: ${typeof e === "string" ? e : JSON.stringify(e)}\n\n`);
  }
  res.end();
}
