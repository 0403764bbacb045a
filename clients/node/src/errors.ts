import { ConnectError } from "@connectrpc/connect";
import { BinaryReader, WireType } from "@bufbuild/protobuf/wire";

/** Thrown by a handler: the attempt fails and no further attempt is made,
 * whatever max_attempts allows. */
export class NonRetryableError extends Error {
  override name = "NonRetryableError";
}

/** Thrown by a handler: the attempt fails and the next one starts after
 * `retryAfterSeconds` (1-86400) instead of the job's backoff. */
export class RetryLaterError extends Error {
  override name = "RetryLaterError";
  constructor(
    message: string,
    readonly retryAfterSeconds: number,
  ) {
    super(message);
  }
}

/** Why a handler's `ctx.signal` aborted: the owner cancelled the job, the
 * worker lost the lease (another attempt may run: write nothing more), or the
 * worker is stopping and its grace ran out (the job is snoozed for another). */
export type AbortCause = "cancelled" | "lease_lost" | "shutdown";

/** `ctx.signal.reason`. A handler that throws after its signal aborted — this
 * error or any other — ends the attempt as the cause says, not as a failure. */
export class JobAbortedError extends Error {
  override name = "AbortError";
  constructor(readonly abortCause: AbortCause) {
    super(
      abortCause === "cancelled"
        ? "the job was cancelled"
        : abortCause === "lease_lost"
          ? "the worker lost the job's lease"
          : "the worker is stopping",
    );
  }
}

/** The `google.rpc.ErrorInfo` a Leasehold server sends with every error. */
export interface ErrorInfo {
  /** What went wrong, UPPER_SNAKE: `"FEED_POSITION_EXPIRED"`, `"JOB_NOT_ACCESSIBLE"`... */
  reason: string;
  /** `"leasehold"`. */
  domain: string;
  /** What the reason names, e.g. `oldest_position` for `FEED_POSITION_EXPIRED`. */
  metadata: Record<string, string>;
}

const ERROR_INFO_TYPE = "google.rpc.ErrorInfo";

/** The ErrorInfo of an error a call rejected with, or `undefined` when the
 * error carries none (it did not come from the server: a refused connection, a
 * cancelled call). */
export function errorInfo(error: unknown): ErrorInfo | undefined {
  for (const detail of ConnectError.from(error).details) {
    if ("type" in detail && detail.type === ERROR_INFO_TYPE) {
      try {
        return decodeErrorInfo(detail.value);
      } catch {
        return undefined; // not what the type says: as good as none
      }
    }
  }
  return undefined;
}

// ErrorInfo { string reason = 1; string domain = 2; map<string, string> metadata = 3; },
// read by hand: three fields do not need google/rpc's generated code in the package.
function decodeErrorInfo(bytes: Uint8Array): ErrorInfo {
  const info: ErrorInfo = { reason: "", domain: "", metadata: {} };
  const metadata: [string, string][] = [];
  const reader = new BinaryReader(bytes);
  while (reader.pos < reader.len) {
    const [field, wireType] = reader.tag();
    if (wireType !== WireType.LengthDelimited) reader.skip(wireType, field);
    else if (field === 1) info.reason = reader.string();
    else if (field === 2) info.domain = reader.string();
    else if (field === 3) metadata.push(decodeMapEntry(reader.bytes()));
    else reader.skip(wireType, field);
  }
  // Own properties whatever the keys are called ("__proto__" included).
  info.metadata = Object.fromEntries(metadata);
  return info;
}

function decodeMapEntry(bytes: Uint8Array): [string, string] {
  let key = "";
  let value = "";
  const reader = new BinaryReader(bytes);
  while (reader.pos < reader.len) {
    const [field, wireType] = reader.tag();
    if (wireType === WireType.LengthDelimited && field === 1) key = reader.string();
    else if (wireType === WireType.LengthDelimited && field === 2) value = reader.string();
    else reader.skip(wireType, field);
  }
  return [key, value];
}
