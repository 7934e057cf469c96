// @retryd/client/openai: retryd around the official `openai` SDK's chat
// completions. The SDK's own retries are turned off (maxRetries 0) and
// retryd decides: a failed call is reported, the wrapper waits for the
// retry's Started and calls again, or throws the SDK's error with retryd's
// delegate decision attached (delegatedInfo(err)).
//
//   const openai = withRetryd(new OpenAI({ baseURL, apiKey }), { client, provider: "openai" });
//   const completion = await openai.chat.completions.create({ model, messages });
//
// `openai` is an optional peer dependency: importing @retryd/client alone
// never loads it.

import type OpenAI from "openai";
import { Stream } from "openai/streaming";
import type { ChatCompletion, ChatCompletionChunk, ChatCompletionCreateParams } from "openai/resources/chat/completions";
import { classify, type Classification, type ProviderFailure } from "./classify.js";
import { Attempts, WrapperState, type MiddlewareOptions } from "./middleware.js";

export { delegatedInfo, type AttemptContext, type DelegatedInfo, type MiddlewareOptions, type Position } from "./middleware.js";

/**
 * classifyOpenAIError reads an error the openai SDK threw: an APIError's
 * status, headers and error object (a stream's error event has no status:
 * the stream's 200), or a connection error (timeouts, aborts, refused).
 */
export function classifyOpenAIError(err: unknown, extra: Pick<ProviderFailure, "outputShown"> = {}): Classification {
  const e = err as { status?: unknown; headers?: unknown; error?: unknown; name?: unknown };
  const name = typeof e?.name === "string" ? e.name : "";
  if (name === "APIConnectionError" || name === "APIConnectionTimeoutError" || name === "APIUserAbortError") {
    const cause = (err as { cause?: unknown }).cause;
    return classify({ error: name === "APIConnectionError" && cause !== undefined ? cause : err, ...extra });
  }
  if (err !== null && typeof err === "object" && "error" in err && ("status" in err || "headers" in err)) {
    return classify({
      httpStatus: typeof e.status === "number" ? e.status : 200,
      headers: (e.headers ?? {}) as Headers,
      body: e.error !== undefined && e.error !== null ? { error: e.error } : "",
      ...extra,
    });
  }
  return classify({ error: err, ...extra });
}

type Create = OpenAI["chat"]["completions"]["create"];
type RequestOptions = Parameters<Create>[1];

function isEmpty(c: ChatCompletion): boolean {
  const choice = c.choices[0];
  return (
    choice !== undefined &&
    choice.finish_reason === "stop" &&
    (choice.message.content ?? "") === "" &&
    (choice.message.tool_calls?.length ?? 0) === 0
  );
}

function showsOutput(chunk: ChatCompletionChunk): boolean {
  return chunk.choices.some((c) => (c.delta.content ?? "") !== "" || (c.delta.tool_calls?.length ?? 0) > 0 || (c.delta.refusal ?? "") !== "");
}

function finishedEmpty(chunks: ChatCompletionChunk[]): boolean {
  return chunks.some((c) => c.choices.some((ch) => ch.finish_reason === "stop")) && !chunks.some(showsOutput);
}

/**
 * Returns the openai client with its retries off and
 * `chat.completions.create` run under retryd (every other call unchanged):
 *
 * - an APIError (an HTTP error status) or a connection error is classified
 *   ({@link classifyOpenAIError}) and reported;
 * - a completion that stopped with no content and no tool calls is
 *   reported as EMPTY_RESPONSE (if retryd delegates, it is returned);
 * - a stream holds chunks back until the first one with output; an error
 *   event or an empty stop before it is reported and the request sent again
 *   unseen; after output was shown, an error event is reported with replay
 *   unsafe and thrown (with the decision attached) to the iterating caller;
 * - on success, StepSucceeded closes the session's chains.
 */
export function withRetryd<T extends OpenAI>(openai: T, options: MiddlewareOptions): T {
  const base = openai.withOptions({ maxRetries: 0 }) as T;
  const state = new WrapperState(options.sessionId);
  const create = async (body: ChatCompletionCreateParams, requestOptions?: RequestOptions): Promise<unknown> => {
    const ro = { ...requestOptions, maxRetries: 0 };
    const signal = requestOptions?.signal ?? undefined;
    const a = Attempts.begin(options, state);
    if (body.stream === true) {
      return openStream(base, body, ro, a, signal);
    }
    for (;;) {
      a.next();
      let completion: ChatCompletion;
      try {
        completion = (await base.chat.completions.create(body, ro)) as ChatCompletion;
      } catch (err) {
        if (signal?.aborted) throw err;
        await a.failed(err, classifyOpenAIError(err), signal);
        continue;
      }
      if (isEmpty(completion)) {
        try {
          await a.failed(new Error("empty completion"), classify({ httpStatus: 200, emptyCompletion: true }), signal);
        } catch {
          return completion;
        }
        continue;
      }
      await a.succeeded();
      return completion;
    }
  };
  const completions = new Proxy(base.chat.completions, {
    get(target, prop, receiver) {
      return prop === "create" ? create : Reflect.get(target, prop, receiver);
    },
  });
  const chat = new Proxy(base.chat, {
    get(target, prop, receiver) {
      return prop === "completions" ? completions : Reflect.get(target, prop, receiver);
    },
  });
  return new Proxy(base, {
    get(target, prop, receiver) {
      return prop === "chat" ? chat : Reflect.get(target, prop, receiver);
    },
  });
}

async function openStream(
  base: OpenAI,
  body: ChatCompletionCreateParams,
  ro: RequestOptions,
  a: Attempts,
  signal: AbortSignal | undefined,
): Promise<Stream<ChatCompletionChunk>> {
  // Open until a stream shows output, holding its first chunks back.
  let inner: Stream<ChatCompletionChunk>;
  let iter: AsyncIterator<ChatCompletionChunk>;
  let held: ChatCompletionChunk[];
  for (;;) {
    a.next();
    let failure: { err: unknown; c: Classification } | undefined;
    held = [];
    try {
      inner = (await base.chat.completions.create(body, ro)) as unknown as Stream<ChatCompletionChunk>;
      iter = inner[Symbol.asyncIterator]();
      for (;;) {
        const { value, done } = await iter.next();
        if (done) {
          if (finishedEmpty(held)) {
            failure = { err: new Error("empty completion"), c: classify({ httpStatus: 200, emptyCompletion: true }) };
          }
          break;
        }
        held.push(value);
        if (showsOutput(value)) break;
      }
    } catch (err) {
      if (signal?.aborted) throw err;
      failure = { err, c: classifyOpenAIError(err) };
    }
    if (failure === undefined) break;
    if (failure.c.failure.code === "EMPTY_RESPONSE") {
      try {
        await a.failed(failure.err, failure.c, signal);
      } catch {
        break; // delegated: the empty stream as the provider sent it
      }
      continue;
    }
    await a.failed(failure.err, failure.c, signal);
  }
  const controller = new AbortController();
  controller.signal.addEventListener("abort", () => inner.controller.abort(), { once: true });
  async function* relay(): AsyncGenerator<ChatCompletionChunk> {
    yield* held;
    for (;;) {
      let r: IteratorResult<ChatCompletionChunk>;
      try {
        r = await iter.next();
      } catch (err) {
        if (signal?.aborted || controller.signal.aborted) throw err;
        // Output was shown: a replay would show a second answer.
        await a.failed(err, classifyOpenAIError(err, { outputShown: true }), signal);
        throw err;
      }
      if (r.done) {
        await a.succeeded();
        return;
      }
      yield r.value;
    }
  }
  return new Stream(() => relay(), controller);
}
