// @retryd/client/ai-sdk: retryd as a Vercel AI SDK language-model
// middleware (the `ai` package's wrapLanguageModel). Every failed model
// call is reported to retryd, which decides: the middleware waits for the
// retry's Started and calls the model again, or throws the provider's
// error with retryd's delegate decision attached (delegatedInfo(err)).
//
//   const model = wrapLanguageModel({ model: provider("gpt-4o"),
//     middleware: retrydMiddleware({ client, provider: "openai" }) });
//   await generateText({ model, prompt, maxRetries: 0 }); // retryd decides
//
// `ai` is an optional peer dependency: importing @retryd/client alone never
// loads it, and this module only imports its types.

import type { LanguageModelMiddleware } from "ai";
import { classify, type Classification, type ProviderFailure } from "./classify.js";
import { Attempts, WrapperState, type MiddlewareOptions } from "./middleware.js";

export { delegatedInfo, type AttemptContext, type DelegatedInfo, type MiddlewareOptions, type Position } from "./middleware.js";

/**
 * classifyAISDKError reads an error the AI SDK threw or streamed: an
 * APICallError's status, headers and body, a stream's error part (its
 * provider error object, status 200), or a network error.
 */
export function classifyAISDKError(err: unknown, extra: Pick<ProviderFailure, "outputShown" | "httpStatus"> = {}): Classification {
  const e = err as { statusCode?: unknown; responseHeaders?: unknown; responseBody?: unknown; name?: unknown; cause?: unknown };
  if (err !== null && typeof err === "object" && typeof e.statusCode === "number") {
    return classify({
      httpStatus: e.statusCode,
      headers: (e.responseHeaders ?? {}) as Record<string, string>,
      ...(typeof e.responseBody === "string" ? { body: e.responseBody } : {}),
      ...extra,
    });
  }
  if (err !== null && typeof err === "object" && !(err instanceof Error)) {
    // A stream's error part carries the provider's error object itself.
    return classify({ httpStatus: extra.httpStatus ?? 200, body: { error: err }, ...extra });
  }
  if (typeof err === "string") {
    return classify({ httpStatus: extra.httpStatus ?? 200, body: { error: { message: err } }, ...extra });
  }
  if (err instanceof Error && (e.name === "AI_APICallError" || e.name === "AI_InvalidResponseDataError" || e.name === "AI_TypeValidationError")) {
    return classify({ httpStatus: extra.httpStatus ?? 200, body: "", ...extra }); // MALFORMED_RESPONSE
  }
  return classify({ error: err, ...extra });
}

// The stream part type of the middleware's spec version.
type LanguageModelV3StreamPart =
  Awaited<ReturnType<NonNullable<LanguageModelMiddleware["wrapStream"]>>>["stream"] extends ReadableStream<infer P> ? P : never;

// Stream parts that show output to the user: after one of them a failure
// cannot be replayed unseen.
const OUTPUT_PARTS = new Set(["text-delta", "reasoning-delta", "tool-input-delta", "tool-call", "file", "source"]);

function isEmptyGenerate(content: readonly { type: string; text?: string }[], finish: unknown): boolean {
  const unified = typeof finish === "string" ? finish : (finish as { unified?: string } | undefined)?.unified;
  return unified === "stop" && content.every((c) => (c.type === "text" || c.type === "reasoning") && (c.text ?? "") === "");
}

/**
 * The middleware. Its own retries are retryd's: pass `maxRetries: 0` to
 * generateText/streamText so the SDK does not retry what retryd delegated.
 *
 * - A thrown error (an HTTP error status, a network error) is classified
 *   ({@link classifyAISDKError}) and reported.
 * - generate: a completion that stopped with no content is reported as
 *   EMPTY_RESPONSE; if retryd delegates, the empty result is returned.
 * - stream: parts are held back until the first output part (text, a tool
 *   call); an error part or an empty finish before it is reported and the
 *   model called again unseen. After output was shown, an error part is
 *   reported with replay unsafe (retryd delegates: the caller reconciles)
 *   and passed on with the decision attached.
 * - On success, StepSucceeded closes the session's chains.
 */
export function retrydMiddleware(options: MiddlewareOptions): LanguageModelMiddleware {
  const state = new WrapperState(options.sessionId);
  return {
    specificationVersion: "v3",
    async wrapGenerate({ doGenerate, params }) {
      const a = Attempts.begin(options, state);
      for (;;) {
        a.next();
        let result;
        try {
          result = await doGenerate();
        } catch (err) {
          if (params.abortSignal?.aborted) throw err;
          await a.failed(err, classifyAISDKError(err), params.abortSignal);
          continue;
        }
        if (isEmptyGenerate(result.content as { type: string; text?: string }[], result.finishReason)) {
          const c = classify({ httpStatus: 200, emptyCompletion: true });
          try {
            await a.failed(new Error("empty completion"), c, params.abortSignal);
          } catch {
            return result; // delegated: the caller gets what the provider gave
          }
          continue;
        }
        await a.succeeded();
        return result;
      }
    },

    async wrapStream({ doStream, params }) {
      const a = Attempts.begin(options, state);
      const signal = params.abortSignal;
      // open calls the model until a stream shows output (or retryd
      // delegates); held are the parts before the first output part.
      const open = async (): Promise<{ result: Awaited<ReturnType<typeof doStream>>; reader: ReadableStreamDefaultReader<LanguageModelV3StreamPart>; held: LanguageModelV3StreamPart[]; done: boolean }> => {
        for (;;) {
          a.next();
          let result;
          try {
            result = await doStream();
          } catch (err) {
            if (signal?.aborted) throw err;
            await a.failed(err, classifyAISDKError(err), signal);
            continue;
          }
          const reader = result.stream.getReader();
          const held: LanguageModelV3StreamPart[] = [];
          let failure: { err: unknown; c: Classification } | undefined;
          for (;;) {
            const { value, done } = await reader.read();
            if (done) {
              return { result, reader, held, done: true };
            }
            if (value.type === "error") {
              failure = { err: value.error, c: classifyAISDKError(value.error, { httpStatus: 200 }) };
              break;
            }
            held.push(value);
            if (value.type === "finish") {
              if (isEmptyGenerate([], value.finishReason)) {
                failure = { err: new Error("empty completion"), c: classify({ httpStatus: 200, emptyCompletion: true }) };
                break;
              }
              return { result, reader, held, done: false };
            }
            if (OUTPUT_PARTS.has(value.type)) {
              return { result, reader, held, done: false };
            }
          }
          void reader.cancel().catch(() => undefined);
          if (failure.c.failure.code === "EMPTY_RESPONSE") {
            try {
              await a.failed(failure.err, failure.c, signal);
            } catch {
              // delegated: pass the empty stream on as the provider sent it
              return { result, reader: emptyReader(), held, done: true };
            }
            continue;
          }
          await a.failed(failure.err, failure.c, signal);
        }
      };
      const first = await open();
      let { reader } = first;
      const { held } = first;
      let finished = first.done;
      let sawError = false;
      const stream = new ReadableStream<LanguageModelV3StreamPart>({
        async pull(controller) {
          const part = held.shift();
          if (part !== undefined) {
            controller.enqueue(part);
            return;
          }
          if (finished) {
            if (!sawError) await a.succeeded();
            controller.close();
            return;
          }
          const { value, done } = await reader.read();
          if (done) {
            finished = true;
            if (!sawError) await a.succeeded();
            controller.close();
            return;
          }
          if (value.type === "error") {
            // Output was shown: a replay would show a second answer.
            sawError = true;
            const c = classifyAISDKError(value.error, { httpStatus: 200, outputShown: true });
            let error: unknown = value.error;
            try {
              await a.failed(value.error, c, signal);
            } catch (attached) {
              error = attached;
            }
            controller.enqueue({ type: "error", error });
            return;
          }
          controller.enqueue(value);
        },
        cancel(reason) {
          return reader.cancel(reason);
        },
      });
      reader = first.reader;
      return { ...first.result, stream };
    },
  };
}

function emptyReader(): ReadableStreamDefaultReader<LanguageModelV3StreamPart> {
  return new ReadableStream<LanguageModelV3StreamPart>({
    start(c) {
      c.close();
    },
  }).getReader();
}
