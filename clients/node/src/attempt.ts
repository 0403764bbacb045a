// One attempt a worker holds, keyed by its job id and lease token together: a
// frozen worker may be handed attempt 2 of a job while it still holds attempt 1,
// and each must keep its own signal, checkpoint and writes; and the jobs of one
// Claim share its token, so the token alone names no single attempt.
import type { JsonObject } from "@bufbuild/protobuf";
import { timestampMs } from "@bufbuild/protobuf/wkt";
import type { ClaimedJob } from "./gen/leasehold/v1/worker_pb.js";
import { JobAbortedError, type AbortCause } from "./errors.js";

/** What a handler receives as `job`. */
export interface ClaimedJobInfo {
  id: string;
  kind: string;
  resourceType: string;
  resourceId: string;
  ownerId: string;
  /** 1 for the first attempt. */
  attempt: number;
  maxAttempts: number;
  /** The Enqueue's payload, a plain object. */
  payload: JsonObject;
  traceparent: string;
  /** The jobs this one waited for, in the order given at Enqueue (refs of a
   * batch resolved to ids); the keys `ctx.parentResults` may have. */
  dependsOn: string[];
}

/** What a handler receives as `ctx`. */
export interface JobContext {
  /** Aborts when the owner cancels the job, the lease is lost, or the worker's
   * stop grace runs out; `signal.reason` is a JobAbortedError saying which. */
  readonly signal: AbortSignal;
  readonly leaseToken: string;
  /** The checkpoint the last attempt (or this one) saved; undefined if none. */
  readonly lastCheckpoint: JsonObject | undefined;
  /** The results of the jobs this one depends on (`dependsOn` at Enqueue), by
   * job id, each a plain object like `job.payload`. Only a parent that
   * succeeded with a result is here, and only while their total stays within
   * 4 MiB serialized (taken in `dependsOn` order): a parent that produced
   * none, did not succeed (a `"run"` child of a failed parent) or does not
   * fit is absent, and `client.get(id).result` reads it. Empty for a job
   * without parents. */
  readonly parentResults: Readonly<Record<string, JsonObject>>;
  /** Adds a `progress` event to the job's log (what watchers see). */
  progress(payload: object): Promise<number>;
  /** Adds an event of your own type (not starting "job.") to the job's log. */
  appendEvent(type: string, payload?: object): Promise<number>;
  /** Saves where the attempt has got to, sent with the next (immediate)
   * heartbeat; a retried attempt reads it as `ctx.lastCheckpoint`. Resolves
   * once the server has it. */
  checkpoint(state: object): Promise<void>;
}

interface Waiter {
  resolve: () => void;
  reject: (error: unknown) => void;
}

/** The key of an attempt: neither the job id (two attempts of one job) nor the
 * lease token (shared by the jobs of one Claim) is enough alone. */
export function attemptKey(jobId: string, leaseToken: string): string {
  return `${jobId}\u0000${leaseToken}`;
}

export class Attempt {
  readonly token: string;
  readonly key: string;
  readonly job: ClaimedJobInfo;
  readonly intervalMs: number;
  expiresAtMs: number;
  readonly controller = new AbortController();
  lastCheckpoint: JsonObject | undefined;
  readonly parentResults: Readonly<Record<string, JsonObject>>;
  /** A checkpoint not yet carried by a heartbeat, and who awaits it. */
  pendingCheckpoint: JsonObject | undefined;
  checkpointWaiters: Waiter[] = [];

  constructor(claimed: ClaimedJob, defaultIntervalMs: number) {
    const job = claimed.job;
    if (job === undefined) throw new Error("the server claimed a job without its record");
    this.token = claimed.leaseToken;
    this.key = attemptKey(job.id, claimed.leaseToken);
    this.job = {
      id: job.id,
      kind: job.kind,
      resourceType: job.resourceType,
      resourceId: job.resourceId,
      ownerId: claimed.ownerId,
      attempt: job.attempt,
      maxAttempts: job.maxAttempts,
      payload: claimed.payload ?? {},
      traceparent: claimed.traceparent,
      dependsOn: [...job.dependsOn],
    };
    this.intervalMs =
      claimed.heartbeatIntervalSeconds > 0 ? claimed.heartbeatIntervalSeconds * 1000 : defaultIntervalMs;
    this.expiresAtMs =
      claimed.leaseExpiresAt !== undefined
        ? timestampMs(claimed.leaseExpiresAt)
        : Date.now() + 3 * this.intervalMs;
    this.lastCheckpoint = claimed.checkpoint;
    // protobuf-es already gives each Struct as a plain object, as it does the
    // payload; copied into an object of our own so the message is not shared.
    this.parentResults = Object.freeze({ ...claimed.parentResults });
  }

  get cause(): AbortCause | undefined {
    const reason: unknown = this.controller.signal.reason;
    return reason instanceof JobAbortedError ? reason.abortCause : undefined;
  }

  /** The lease is gone (another attempt may run): write nothing more for it. */
  lost = false;

  abort(cause: AbortCause): void {
    if (cause === "lease_lost" && !this.lost) {
      this.lost = true;
      this.failCheckpoints(new JobAbortedError(cause));
    }
    // The first cause is the one the handler sees; a later lost lease still
    // stops every write through `lost`.
    if (!this.controller.signal.aborted) this.controller.abort(new JobAbortedError(cause));
  }

  private leaseTimer: NodeJS.Timeout | undefined;

  /** The lease now runs to `expiresAtMs`. Unless a renewal moves it again, the
   * attempt is stopped as a lost lease (`onUnrenewed`) while a sixth of what is
   * left remains (at most a sixth of a whole lease, three heartbeat intervals as
   * the server advises them): once the lease expires the job may be recovered
   * and run by another worker, so this one must have stopped by then. The
   * margin covers the claim's own latency and the handler's moment to stop. */
  holdUntil(expiresAtMs: number, onUnrenewed: () => void): void {
    this.expiresAtMs = expiresAtMs;
    clearTimeout(this.leaseTimer);
    const left = expiresAtMs - Date.now();
    const heldMs = left - Math.min(Math.max(left, 0), 3 * this.intervalMs) / 6;
    this.leaseTimer = setTimeout(onUnrenewed, Math.max(heldMs, 0));
    // The handler keeps the process alive while it runs; this timer need not.
    this.leaseTimer.unref();
  }

  /** The attempt is over: nothing is left to stop. */
  released(): void {
    clearTimeout(this.leaseTimer);
  }

  takeCheckpoint(): { checkpoint?: JsonObject; waiters: Waiter[] } {
    const taken = { checkpoint: this.pendingCheckpoint, waiters: this.checkpointWaiters };
    this.pendingCheckpoint = undefined;
    this.checkpointWaiters = [];
    return taken;
  }

  /** A heartbeat that carried a checkpoint failed: send it again next time,
   * unless a newer one replaced it meanwhile. */
  restoreCheckpoint(taken: { checkpoint?: JsonObject; waiters: Waiter[] }): void {
    if (taken.checkpoint === undefined) return;
    this.pendingCheckpoint ??= taken.checkpoint;
    this.checkpointWaiters.unshift(...taken.waiters);
  }

  failCheckpoints(error: unknown): void {
    for (const waiter of this.takeCheckpoint().waiters) waiter.reject(error);
  }
}
