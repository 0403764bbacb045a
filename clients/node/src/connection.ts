// How both Client and Worker reach a server: one gRPC (HTTP/2) transport per
// object, the credentials added to every call by one interceptor, and TLS when
// asked for.
import { readFileSync } from "node:fs";
import type { Interceptor, Transport } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";

export interface TlsOptions {
  /** PEM file of the CA that signed the server's certificate. */
  caFile?: string;
  /** The same, as PEM text or bytes. Neither: the system's trusted CAs. */
  ca?: string | Uint8Array;
  /** A client certificate and key (PEM files), for servers that ask for one. */
  certFile?: string;
  keyFile?: string;
}

export interface ConnectionOptions {
  /** "host:port" (or a full http:// / https:// URL). */
  server: string;
  /** TLS: `true` for the system's CAs, or where the CA and client cert are. */
  tls?: boolean | TlsOptions;
}

export function createTransport(options: ConnectionOptions, headers: Record<string, string>): Transport {
  const secure = options.tls !== undefined && options.tls !== false;
  const baseUrl = /^https?:\/\//.test(options.server)
    ? options.server
    : `${secure ? "https" : "http"}://${options.server}`;
  const addHeaders: Interceptor = (next) => (req) => {
    for (const [name, value] of Object.entries(headers)) req.header.set(name, value);
    return next(req);
  };
  const tls = typeof options.tls === "object" ? options.tls : {};
  const nodeOptions: Record<string, unknown> = {};
  if (tls.ca !== undefined) nodeOptions.ca = tls.ca;
  if (tls.caFile !== undefined) nodeOptions.ca = readFileSync(tls.caFile);
  if (tls.certFile !== undefined) nodeOptions.cert = readFileSync(tls.certFile);
  if (tls.keyFile !== undefined) nodeOptions.key = readFileSync(tls.keyFile);
  return createGrpcTransport({
    baseUrl,
    interceptors: [addHeaders],
    // Notice a dead connection (a restarted server) instead of waiting on it.
    pingIntervalMs: 15_000,
    pingTimeoutMs: 10_000,
    ...(secure ? { nodeOptions } : {}),
  });
}
