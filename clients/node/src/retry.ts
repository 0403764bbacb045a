// Retrying only what cannot act twice. Callers decide what is safe to repeat
// (a read, a Cancel, a write carrying a request_id or a lease token the server
// deduplicates); this module only decides when and how long.
import { Code, ConnectError } from "@connectrpc/connect";

export interface RetryOptions {
  /** Give up retrying after this long, in ms (the last error is thrown). */
  deadlineMs?: number;
  /** Each try's own timeout, in ms. */
  callTimeoutMs?: number;
  /** Stops waiting and retrying at once. */
  signal?: AbortSignal;
}

const FIRST_DELAY_MS = 100;
const MAX_DELAY_MS = 5_000;

/** Capped exponential backoff with full jitter, so that many clients that lost
 * the same server do not come back in step. */
export class Backoff {
  private tries = 0;
  next(): number {
    const ceiling = Math.min(MAX_DELAY_MS, FIRST_DELAY_MS * 2 ** this.tries);
    this.tries += 1;
    return ceiling / 2 + (Math.random() * ceiling) / 2;
  }
  reset(): void {
    this.tries = 0;
  }
}

/** The server (or the way to it) was not there: the call did not take effect,
 * or it did and a retry with the same request_id/lease token answers the same. */
export function isTransient(error: unknown): boolean {
  const code = ConnectError.from(error).code;
  return code === Code.Unavailable;
}

export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
  });
}

export async function withRetry<T>(
  call: (callOptions: { signal?: AbortSignal; timeoutMs?: number }) => Promise<T>,
  options: RetryOptions,
): Promise<T> {
  const deadline = Date.now() + (options.deadlineMs ?? 30_000);
  const backoff = new Backoff();
  for (;;) {
    try {
      return await call({ signal: options.signal, timeoutMs: options.callTimeoutMs });
    } catch (error) {
      const delay = backoff.next();
      if (!isTransient(error) || options.signal?.aborted || Date.now() + delay > deadline) {
        throw error;
      }
      await sleep(delay, options.signal);
    }
  }
}
