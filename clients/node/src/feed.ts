// The owner's feed (JobService.Subscribe): every event of the caller's jobs, in
// the order they committed, followed live. A break is mended here, out of the
// caller's sight: the feed reopens after the last position it handed out, so
// the caller sees each event once, whichever server answers next.
import { Code, ConnectError } from "@connectrpc/connect";
import type { SubscribeRequest, SubscribeResponse } from "./gen/leasehold/v1/jobs_pb.js";
import { eventFromMessage, type JobEvent } from "./convert.js";
import { errorInfo } from "./errors.js";
import { Backoff, sleep } from "./retry.js";

export interface SubscribeOptions {
  /** The `position` of the last item already processed: the feed starts after
   * it. Default: from the oldest event the server kept. A position older than
   * that rejects with `OUT_OF_RANGE` (reason `FEED_POSITION_EXPIRED`). */
  afterPosition?: string;
  /** Only jobs of these kinds (default: every kind). */
  kinds?: string[];
  /** Only jobs of this resource type (default: every one). */
  resourceType?: string;
  /** Only events of these types, e.g. `"job.succeeded"` (default: every type). */
  eventTypes?: string[];
  /** Start at the end: only events committed from now on. Not with `afterPosition`. */
  tail?: boolean;
  /** Ends the feed: the iteration rejects (`Code.Canceled`) and the call is cancelled. */
  signal?: AbortSignal;
  /** How long to keep reconnecting to a server that went away, in ms (default 60 s). */
  reconnectDeadlineMs?: number;
}

/** One event of the feed, with what a subscriber needs to route it without a Get. */
export interface FeedItem {
  event: JobEvent;
  /** Opaque. Store it once the item is processed, and pass it back as
   * `afterPosition` to resume after this item. Positions of one owner sort as
   * strings in the order their events committed. */
  position: string;
  kind: string;
  resourceType: string;
  resourceId: string;
}

/** Opens one Subscribe stream; `signal` cancels it. */
export type OpenFeed = (
  request: Pick<SubscribeRequest, "afterPosition" | "kinds" | "resourceType" | "eventTypes" | "tail">,
  signal: AbortSignal,
) => AsyncIterable<SubscribeResponse>;

// A reconnected feed with nothing to send sends nothing at all, not even its
// headers (grpcio sends those with the first message), so a quiet stream
// cannot prove it reached a server. One that stayed
// open this long did: its break is a new outage, not more of one that ended long
// before (else a feed quiet for an hour would give up at its next break at once).
const SETTLED_MS = 10_000;

/** One break of the feed, until it flows again: the backoff between its
 * reconnects, and how long they may go on. */
class Outage {
  private since: number | undefined;
  private readonly backoff = new Backoff();

  constructor(private readonly deadlineMs: number) {}

  over(): void {
    this.since = undefined;
    this.backoff.reset();
  }

  /** Waits before the next reconnect; throws `error` once the outage has lasted too long. */
  async wait(error: unknown, signal: AbortSignal | undefined): Promise<void> {
    this.since ??= Date.now();
    const delay = this.backoff.next();
    if (Date.now() + delay - this.since > this.deadlineMs) throw error;
    await sleep(delay, signal);
  }
}

/** Whether the stream broke, rather than was refused: reopening it is then the
 * way on. A draining server or none at all is UNAVAILABLE; a reset HTTP/2
 * stream or a proxy reports INTERNAL or UNKNOWN (what the Python client resumes
 * after too). A server that dies under the stream sends no status at all, and
 * connect-node names the dead connection ABORTED ("read ECONNRESET") or CANCELED
 * ("http/2 stream closed with error code CANCEL"): those two count as breaks only
 * without the ErrorInfo every status of a Leasehold server carries, and only
 * while the caller's own signal has not aborted. */
function isBreak(error: unknown, signal: AbortSignal | undefined): boolean {
  if (signal?.aborted || !(error instanceof ConnectError)) return false;
  const { code } = error;
  if (code === Code.Unavailable || code === Code.Internal || code === Code.Unknown) return true;
  return (code === Code.Aborted || code === Code.Canceled) && errorInfo(error) === undefined;
}

/** The feed `open` serves, reopened after every break. Exported for the
 * package's own tests; users call `Client.subscribe`. */
export async function* follow(open: OpenFeed, options: SubscribeOptions = {}): AsyncGenerator<FeedItem> {
  // "" sorts before every position: with no afterPosition, nothing is skipped.
  let last = options.afterPosition ?? "";
  // Until the first item, a reconnect asks for the end again: what committed
  // while the feed was away, before its first item, is not replayed.
  let tail = options.tail ?? false;
  const outage = new Outage(options.reconnectDeadlineMs ?? 60_000);
  for (;;) {
    const openedAt = Date.now();
    let broke: unknown;
    try {
      for await (const message of stream(open, request(last, tail, options), options.signal)) {
        outage.over();
        if (message.position <= last) continue; // never hand the caller an event twice
        const item = itemFromMessage(message);
        last = message.position;
        tail = false;
        yield item;
      }
      // The server never ends a feed by itself; a stream that ended anyway
      // (a proxy closing it) is mended like a break.
      broke = new ConnectError("the feed's stream ended", Code.Unavailable);
    } catch (error) {
      if (!isBreak(error, options.signal)) throw error;
      broke = error;
    }
    if (Date.now() - openedAt >= SETTLED_MS) outage.over();
    await outage.wait(broke, options.signal);
  }
}

/** One stream, cancelled when the caller's signal aborts and whenever the
 * iteration stops: a `break` in the caller's loop, an error, a reconnect. */
async function* stream(
  open: OpenFeed,
  request: Parameters<OpenFeed>[0],
  signal: AbortSignal | undefined,
): AsyncGenerator<SubscribeResponse> {
  const call = new AbortController();
  const cancel = () => call.abort(signal?.reason);
  if (signal?.aborted) cancel();
  signal?.addEventListener("abort", cancel, { once: true });
  try {
    yield* open(request, call.signal);
  } finally {
    signal?.removeEventListener("abort", cancel);
    call.abort();
  }
}

function request(after: string, tail: boolean, options: SubscribeOptions): Parameters<OpenFeed>[0] {
  return {
    afterPosition: after,
    tail,
    kinds: [...(options.kinds ?? [])],
    resourceType: options.resourceType ?? "",
    eventTypes: [...(options.eventTypes ?? [])],
  };
}

function itemFromMessage(message: SubscribeResponse): FeedItem {
  return {
    event: eventFromMessage(message.event),
    position: message.position,
    kind: message.kind,
    resourceType: message.resourceType,
    resourceId: message.resourceId,
  };
}
