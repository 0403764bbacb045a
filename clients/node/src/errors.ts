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
