// Bearer tokens for a retryd started with --auth-credentials: every call
// carries the metadata "authorization: Bearer <token>", which the server
// maps to the caller's tenant.

import { Code, ConnectError } from "@connectrpc/connect";
import type { Interceptor } from "@connectrpc/connect";

/** Options of {@link bearerTokenInterceptor}. */
export interface BearerTokenOptions {
  /**
   * Send the token over plaintext `http://` too, where anyone on the path
   * can read it. Only where the connection does not leave a trusted host
   * or network: a retryd on loopback, a sidecar or service mesh that
   * encrypts the hop (mTLS), or tests. Default false: only over TLS
   * (`https://`).
   */
  insecure?: boolean;
}

/**
 * Returns a connect interceptor that sets `authorization: Bearer <token>`
 * on every call, for a Transport of your own (TLS with a private CA, say):
 *
 * ```ts
 * createGrpcTransport({ baseUrl: "https://retryd.agents.svc:7700", nodeOptions: { ca },
 *   interceptors: [bearerTokenInterceptor(token)] });
 * ```
 *
 * Unless `insecure` is set, a call to a URL that is not `https://` is
 * refused with UNAUTHENTICATED before anything is sent, so the token never
 * crosses a plaintext connection. A token is one line of visible ASCII
 * (what `retryd hash-token` hashes): an empty one, or one with a space, a
 * control character (such as the trailing newline of a file read as is) or
 * a non-ASCII character, throws a TypeError here that names the offset,
 * never the token.
 */
export function bearerTokenInterceptor(token: string, options: BearerTokenOptions = {}): Interceptor {
  checkToken(token);
  const value = `Bearer ${token}`;
  const insecure = options.insecure === true;
  return (next) => async (req) => {
    if (!insecure && !isTLS(req.url)) {
      throw new ConnectError(
        `retryd: the bearer token is sent only over TLS (https://), not to ${origin(req.url)}; ` +
          "use an https:// target, or the insecure option where plaintext is safe (loopback, a sidecar that encrypts the hop, tests)",
        Code.Unauthenticated,
      );
    }
    req.header.set("authorization", value);
    return next(req);
  };
}

/** Throws a TypeError for a token retryd could never match. */
export function checkToken(token: string): void {
  if (token === "") {
    throw new TypeError("retryd: the bearer token is empty");
  }
  for (let i = 0; i < token.length; i++) {
    const c = token.charCodeAt(i);
    if (c <= 0x20 || c > 0x7e) {
      throw new TypeError(
        `retryd: the bearer token has a space, control or non-ASCII character at offset ${i} of ${token.length} ` +
          "(a trailing newline from a file?): a token is one line of visible ASCII",
      );
    }
  }
}

/** Whether url is https: (connect-node's gRPC transport then speaks TLS). */
export function isTLS(url: string): boolean {
  return /^https:\/\//i.test(url);
}

// origin is scheme://host:port of url, for messages (never the path).
function origin(url: string): string {
  try {
    return new URL(url).origin;
  } catch {
    return "a non-URL target";
  }
}
