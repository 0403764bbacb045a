// Worker: runs handlers for remote kinds over WorkerService.
//
// Roles, each small: the claim loop asks for work only for free slots (and,
// while it waits, names the leases it holds so a cancel or a lost lease ends
// the wait at once); the heartbeat loop renews every held lease in one batched
// call; each attempt runs its handler and then writes one finishing call,
// chosen from how the handler ended and why its signal aborted.
import { randomUUID } from "node:crypto";
import { hostname } from "node:os";
import { Code, ConnectError, createClient, type Client as RpcClient } from "@connectrpc/connect";
import type { JsonObject } from "@bufbuild/protobuf";
import { timestampMs } from "@bufbuild/protobuf/wkt";
import { WorkerService, type LeaseState } from "./gen/leasehold/v1/worker_pb.js";
import { Attempt, attemptKey, type ClaimedJobInfo, type JobContext } from "./attempt.js";
import { createTransport, type ConnectionOptions } from "./connection.js";
import { toStruct } from "./convert.js";
import { FinishBatcher, type OutcomeInit } from "./finishing.js";
import { NonRetryableError, RetryLaterError } from "./errors.js";
import { Backoff, sleep, withRetry } from "./retry.js";

export type Handler = (job: ClaimedJobInfo, ctx: JobContext) => Promise<object | undefined | null | void>;

export interface Logger {
  info(message: string, fields?: Record<string, unknown>): void;
  warn(message: string, fields?: Record<string, unknown>): void;
  error(message: string, fields?: Record<string, unknown>): void;
}

export interface WorkerOptions extends ConnectionOptions {
  /** The worker token (default: the LEASEHOLD_WORKER_TOKEN environment variable). */
  token?: string;
  /** Names this worker in leases and logs (default: host-pid-random). */
  workerId?: string;
  /** Jobs run at once (default 10): the worker claims only for free slots. */
  concurrency?: number;
  /** How long one Claim waits for work, in seconds (default 30, at most 60). */
  claimWaitSeconds?: number;
  /** On stop, how long running handlers may go on before their signals abort
   * and their jobs are snoozed for another worker, in ms (default 30 s). */
  shutdownGraceMs?: number;
  /** Stop gracefully on SIGTERM and SIGINT while run() runs (default true). */
  handleSignals?: boolean;
  logger?: Logger;
}

/** Protocol 1, and 2's additions where the server has them: a version-1
 * server ignores the fields it does not know (held leases, checkpoints,
 * request ids) and the worker still runs correctly, only less promptly. */
const SPOKEN_PROTOCOLS = [1, 2];
const CLAIM_DEADLINE_MARGIN_MS = 10_000;
const WRITE_DEADLINE_MS = 30_000;
const CALL_TIMEOUT_MS = 10_000;
const MAX_JOBS_PER_CLAIM = 100;
const SHUTDOWN_SNOOZE_SECONDS = 1;
/** Used only if a server does not advise an interval (every server today does). */
const DEFAULT_HEARTBEAT_MS = 10_000;
/** A lease arriving with less than this share of its heartbeat interval left
 * is renewed at once rather than at the next beat. */
const RENEW_NOW_FRACTION = 1;
/** What a server offers when it takes many finishing writes in one Finish call. */
const BATCH_FINISH_FEATURE = "batch_finish";

const quietLogger: Logger = {
  info: () => {},
  warn: (message, fields) => console.warn(`leasehold worker: ${message}`, fields ?? ""),
  error: (message, fields) => console.error(`leasehold worker: ${message}`, fields ?? ""),
};

/** The server refused this worker (its token, its kinds): retrying cannot help. */
export class WorkerRefusedError extends Error {
  override name = "WorkerRefusedError";
}

export class Worker {
  readonly workerId: string;
  private readonly rpc: RpcClient<typeof WorkerService>;
  /** Set once the server is known to offer Finish ("batch_finish"). */
  private finisher: FinishBatcher | undefined;
  private readonly handlers = new Map<string, Handler>();
  private readonly concurrency: number;
  private readonly claimWaitSeconds: number;
  private readonly shutdownGraceMs: number;
  private readonly handleSignals: boolean;
  private readonly log: Logger;
  /** Held attempts by lease token. */
  private readonly attempts = new Map<string, Attempt>();
  /** Attempts whose handler is still running: what the slots count. A slot is
   * free once its handler settles, before the outcome is answered, so the next
   * claim travels while the outcome is written. */
  private busySlots = 0;
  /** Attempts whose handler has settled and whose outcome is on its way: still
   * renewed, no longer named in a Claim (the write says what became of them). */
  private readonly finishing = new Set<string>();
  private readonly running = new Set<Promise<void>>();
  private stopping = false;
  private readonly stopController = new AbortController();
  private slotFreed: (() => void) | undefined;
  private heartbeatTimer: NodeJS.Timeout | undefined;
  private heartbeatDueAt = Infinity;
  private beating: Promise<void> | undefined;
  private beatAgain = false;
  private runPromise: Promise<void> | undefined;

  constructor(options: WorkerOptions) {
    const token = options.token ?? process.env.LEASEHOLD_WORKER_TOKEN;
    if (!token) throw new TypeError("a worker token is required (options.token or LEASEHOLD_WORKER_TOKEN)");
    this.rpc = createClient(WorkerService, createTransport(options, { authorization: `Bearer ${token}` }));
    this.workerId = options.workerId ?? `${hostname()}-${process.pid}-${randomUUID().slice(0, 8)}`;
    this.concurrency = options.concurrency ?? 10;
    this.claimWaitSeconds = Math.min(options.claimWaitSeconds ?? 30, 60);
    this.shutdownGraceMs = options.shutdownGraceMs ?? 30_000;
    this.handleSignals = options.handleSignals ?? true;
    this.log = options.logger ?? quietLogger;
  }

  /** Runs `handler` for jobs of `kind` (a kind the server serves with --remote-kinds). */
  handle(kind: string, handler: Handler): this {
    this.handlers.set(kind, handler);
    return this;
  }

  /** Claims and runs jobs until stop() (or SIGTERM); resolves once every
   * running job has been finished or handed back. */
  run(): Promise<void> {
    this.runPromise ??= this.runUntilStopped();
    return this.runPromise;
  }

  /** Stops claiming, lets running handlers finish within the grace, then
   * aborts the rest and snoozes their jobs. Resolves when run() has ended. */
  async stop(): Promise<void> {
    if (!this.stopping) {
      this.stopping = true;
      this.log.info("stopping", { running: this.attempts.size });
      this.stopController.abort();
      this.slotFreed?.();
    }
    await this.runPromise;
  }

  /** Jobs running now. */
  get activeJobs(): number {
    return this.attempts.size;
  }

  private async runUntilStopped(): Promise<void> {
    if (this.handlers.size === 0) throw new TypeError("no handlers: call worker.handle(kind, fn) first");
    // The first signal stops gracefully; a second one ends the grace at once.
    const onSignal = () => {
      if (this.stopping) this.endGrace();
      void this.stop();
    };
    if (this.handleSignals) {
      process.on("SIGTERM", onSignal);
      process.on("SIGINT", onSignal);
    }
    try {
      if (await this.checkServer()) await this.claimLoop();
    } finally {
      this.stopping = true;
      await this.drain();
      clearTimeout(this.heartbeatTimer);
      if (this.handleSignals) {
        process.off("SIGTERM", onSignal);
        process.off("SIGINT", onSignal);
      }
      this.log.info("stopped");
    }
  }

  // ----- talking to the server -------------------------------------------------------

  private async checkServer(): Promise<boolean> {
    const backoff = new Backoff();
    while (!this.stopping) {
      try {
        const info = await this.rpc.getServerInfo(
          { protocolVersion: Math.max(...SPOKEN_PROTOCOLS) },
          { timeoutMs: CALL_TIMEOUT_MS, signal: this.stopController.signal },
        );
        if (!SPOKEN_PROTOCOLS.includes(info.protocolVersion)) {
          throw new WorkerRefusedError(
            `the server speaks WorkerService protocol ${info.protocolVersion}; this worker speaks ${SPOKEN_PROTOCOLS.join(" and ")}`,
          );
        }
        this.log.info("connected", { protocol: info.protocolVersion, features: info.features });
        if (info.features.includes(BATCH_FINISH_FEATURE)) {
          this.finisher = new FinishBatcher((request, o) => this.rpc.finish(request, o), CALL_TIMEOUT_MS);
        }
        return true;
      } catch (error) {
        if (error instanceof WorkerRefusedError) throw error;
        this.raiseIfRefused(error);
        this.log.warn("server unavailable", { code: Code[ConnectError.from(error).code] });
        await sleep(backoff.next(), this.stopController.signal);
      }
    }
    return false;
  }

  private raiseIfRefused(error: unknown): void {
    if (this.stopping) return;
    const code = ConnectError.from(error).code;
    if (code === Code.Unauthenticated || code === Code.PermissionDenied || code === Code.InvalidArgument) {
      throw new WorkerRefusedError(`the server refused this worker: ${ConnectError.from(error).message}`);
    }
  }

  private async claimLoop(): Promise<void> {
    const backoff = new Backoff();
    const kinds = [...this.handlers.keys()].sort();
    while (!this.stopping) {
      await this.freeSlot();
      if (this.stopping) return;
      const free = Math.min(this.concurrency - this.busySlots, MAX_JOBS_PER_CLAIM);
      // Only leases still worth hearing about: one whose news already came
      // (its signal aborted) would end every later wait at once, a busy loop.
      const held = [...this.attempts.values()].filter(
        (a) => !a.controller.signal.aborted && !this.finishing.has(a.key),
      );
      let response;
      const askedAt = Date.now();
      try {
        response = await this.rpc.claim(
          {
            workerId: this.workerId,
            kinds,
            maxJobs: free,
            waitSeconds: this.claimWaitSeconds,
            // So that a cancel or a lost lease of a running job ends this wait at once.
            heldLeases: held.map((a) => ({ jobId: a.job.id, leaseToken: a.token })),
          },
          {
            signal: this.stopController.signal,
            timeoutMs: this.claimWaitSeconds * 1000 + CLAIM_DEADLINE_MARGIN_MS,
          },
        );
      } catch (error) {
        if (this.stopping) return;
        this.raiseIfRefused(error);
        this.log.warn("claim failed", { code: Code[ConnectError.from(error).code] });
        await sleep(backoff.next(), this.stopController.signal);
        continue;
      }
      this.learnHeld(response.held, held);
      if (
        response.jobs.length === 0 &&
        response.held.length === 0 &&
        Date.now() - askedAt < Math.max(this.claimWaitSeconds * 500, 100)
      ) {
        // Empty long before the wait was up: a draining server answers so.
        // Do not ask again in a tight loop.
        await sleep(backoff.next(), this.stopController.signal);
        continue;
      }
      backoff.reset();
      for (const claimed of response.jobs) {
        if (this.attempts.has(attemptKey(claimed.job?.id ?? "", claimed.leaseToken))) continue;
        this.start(new Attempt(claimed, DEFAULT_HEARTBEAT_MS));
      }
    }
  }

  /** News from a Claim about leases it named. LeaseState names only the job:
   * when this worker holds two attempts of one job (a stale one and its
   * successor), a heartbeat, which answers per lease, sorts out which. */
  private learnHeld(states: LeaseState[], held: Attempt[]): void {
    for (const state of states) {
      const mine = held.filter((a) => a.job.id === state.jobId);
      if (mine.length !== 1) {
        this.beatSoon();
        continue;
      }
      if (state.lost) mine[0]!.abort("lease_lost");
      else if (state.cancelRequested) mine[0]!.abort("cancelled");
    }
  }

  private freeSlot(): Promise<void> {
    if (this.busySlots < this.concurrency || this.stopping) return Promise.resolve();
    return new Promise((resolve) => {
      this.slotFreed = () => {
        this.slotFreed = undefined;
        resolve();
      };
    });
  }

  // ----- attempts ------------------------------------------------------------------------

  private start(attempt: Attempt): void {
    this.attempts.set(attempt.key, attempt);
    attempt.holdUntil(attempt.expiresAtMs, () => this.leaseUnrenewed(attempt));
    // A job handed over with little lease left (it waited in a slow network,
    // or this process was frozen) is renewed now, not at the next beat.
    if (attempt.expiresAtMs - Date.now() < RENEW_NOW_FRACTION * attempt.intervalMs) this.beatSoon();
    else this.scheduleBeat(attempt.intervalMs);
    this.busySlots += 1;
    let freed = false;
    const freeSlot = () => {
      if (freed) return;
      freed = true;
      this.busySlots -= 1;
      this.finishing.add(attempt.key);
      this.slotFreed?.();
    };
    const run = this.runAttempt(attempt, freeSlot).finally(() => {
      attempt.released();
      freeSlot();
      this.finishing.delete(attempt.key);
      this.attempts.delete(attempt.key);
      this.running.delete(run);
    });
    this.running.add(run);
  }

  private async runAttempt(attempt: Attempt, handlerSettled: () => void): Promise<void> {
    const handler = this.handlers.get(attempt.job.kind);
    let outcome: { ok: true; value: unknown } | { ok: false; error: unknown };
    try {
      if (handler === undefined) throw new NonRetryableError(`no handler for kind ${attempt.job.kind}`);
      outcome = { ok: true, value: await handler(attempt.job, this.context(attempt)) };
    } catch (error) {
      outcome = { ok: false, error };
    }
    handlerSettled();
    try {
      await this.finish(attempt, outcome);
    } catch (error) {
      if (!attempt.lost)
        this.log.error("could not record the outcome", { jobId: attempt.job.id, error: String(error) });
    }
  }

  private async finish(
    attempt: Attempt,
    outcome: { ok: true; value: unknown } | { ok: false; error: unknown },
  ): Promise<void> {
    if (attempt.lost) {
      this.log.warn("lease lost; outcome dropped", { jobId: attempt.job.id, attempt: attempt.job.attempt });
      return;
    }
    const lease = { jobId: attempt.job.id, leaseToken: attempt.token };
    if (!outcome.ok && attempt.cause === "cancelled") {
      await this.write(
        attempt,
        this.outcome({ case: "confirmCancel", value: lease }, (o) => this.rpc.confirmCancel(lease, o)),
      );
    } else if (!outcome.ok && attempt.cause === "shutdown") {
      const snooze = { ...lease, delaySeconds: SHUTDOWN_SNOOZE_SECONDS };
      await this.write(
        attempt,
        this.outcome({ case: "snooze", value: snooze }, (o) => this.rpc.snooze(snooze, o)),
      );
    } else if (!outcome.ok) {
      await this.writeFailure(attempt, lease, outcome.error);
    } else {
      let result: JsonObject | undefined;
      try {
        result = toStruct(outcome.value, `the ${attempt.job.kind} handler's result`);
      } catch (error) {
        await this.writeFailure(attempt, lease, error);
        return;
      }
      const complete = { ...lease, ...(result ? { result } : {}) };
      await this.write(
        attempt,
        this.outcome({ case: "complete", value: complete }, (o) => this.rpc.complete(complete, o)),
      );
    }
  }

  private async writeFailure(
    attempt: Attempt,
    lease: { jobId: string; leaseToken: string },
    error: unknown,
  ): Promise<void> {
    const fail = { ...lease, ...failure(error) };
    await this.write(
      attempt,
      this.outcome({ case: "fail", value: fail }, (o) => this.rpc.fail(fail, o)),
    );
  }

  /** How one finishing write goes out: with others in a Finish when the
   * server offers it, else as its own call. */
  private outcome(
    outcome: OutcomeInit["outcome"],
    single: (o: { signal?: AbortSignal; timeoutMs?: number }) => Promise<unknown>,
  ): (o: { signal?: AbortSignal; timeoutMs?: number }) => Promise<unknown> {
    const finisher = this.finisher;
    return finisher === undefined ? single : () => finisher.finish({ outcome });
  }

  /** A write fenced by the attempt's lease token: retried after UNAVAILABLE
   * (protocol 2 answers a repeated finishing write as the first), and
   * ABORTED means the lease is gone. */
  private async write<T>(
    attempt: Attempt,
    call: (o: { signal?: AbortSignal; timeoutMs?: number }) => Promise<T>,
  ): Promise<T> {
    try {
      return await withRetry(call, { deadlineMs: WRITE_DEADLINE_MS, callTimeoutMs: CALL_TIMEOUT_MS });
    } catch (error) {
      if (ConnectError.from(error).code === Code.Aborted) attempt.abort("lease_lost");
      throw error;
    }
  }

  private context(attempt: Attempt): JobContext {
    const appendEvent = async (type: string, payload?: object): Promise<number> => {
      if (attempt.lost) throw attempt.controller.signal.reason;
      const request = {
        jobId: attempt.job.id,
        leaseToken: attempt.token,
        type,
        payload: toStruct(payload ?? {}, "an event's payload"),
        // One id per append: a retry after UNAVAILABLE adds no second event.
        requestId: randomUUID(),
      };
      const response = await this.write(attempt, (o) => this.rpc.appendEvent(request, o));
      if (response.cancelRequested) attempt.abort("cancelled");
      return Number(response.sequence);
    };
    return {
      signal: attempt.controller.signal,
      leaseToken: attempt.token,
      get lastCheckpoint() {
        return attempt.lastCheckpoint;
      },
      parentResults: attempt.parentResults,
      progress: (payload) => appendEvent("progress", payload),
      appendEvent,
      checkpoint: (state) => {
        if (attempt.lost) return Promise.reject(attempt.controller.signal.reason);
        const checkpoint = toStruct(state, "a checkpoint");
        attempt.lastCheckpoint = checkpoint;
        attempt.pendingCheckpoint = checkpoint;
        const saved = new Promise<void>((resolve, reject) =>
          attempt.checkpointWaiters.push({ resolve, reject }),
        );
        // A handler need not await it: a checkpoint lost with its lease must
        // not crash the process as an unhandled rejection.
        saved.catch(() => {});
        this.beatSoon();
        return saved;
      },
    };
  }

  // ----- heartbeats ----------------------------------------------------------------------

  private scheduleBeat(delayMs: number): void {
    const due = Date.now() + delayMs;
    if (due >= this.heartbeatDueAt) return;
    clearTimeout(this.heartbeatTimer);
    this.heartbeatDueAt = due;
    this.heartbeatTimer = setTimeout(() => {
      this.heartbeatDueAt = Infinity;
      void this.beat();
    }, delayMs);
  }

  private beatSoon(): void {
    this.scheduleBeat(0);
  }

  /** One batched Heartbeat at a time; a request for another while one is in
   * flight makes one more right after it. */
  private async beat(): Promise<void> {
    if (this.beating !== undefined) {
      this.beatAgain = true;
      return;
    }
    this.beating = (async () => {
      let nextMs = Infinity;
      do {
        this.beatAgain = false;
        nextMs = await this.beatOnce();
      } while (this.beatAgain);
      if (this.attempts.size > 0) this.scheduleBeat(nextMs);
    })().finally(() => {
      this.beating = undefined;
    });
    await this.beating;
  }

  /** Renews every held lease; returns when the next beat is due, in ms. */
  private async beatOnce(): Promise<number> {
    // An attempt no renewal reached in time was stopped by its own lease timer.
    const live = [...this.attempts.values()].filter((a) => !a.lost);
    if (live.length === 0) return Infinity;
    const interval = Math.min(...live.map((a) => a.intervalMs));
    const taken = live.map((a) => a.takeCheckpoint());
    try {
      const response = await this.rpc.heartbeat(
        {
          leases: live.map((a, i) => ({
            jobId: a.job.id,
            leaseToken: a.token,
            ...(taken[i]!.checkpoint !== undefined ? { checkpoint: taken[i]!.checkpoint } : {}),
          })),
        },
        { timeoutMs: Math.min(CALL_TIMEOUT_MS, interval) },
      );
      response.states.forEach((state, i) => this.learnState(live[i]!, state, taken[i]!));
      return interval;
    } catch (error) {
      live.forEach((a, i) => a.restoreCheckpoint(taken[i]!));
      this.log.warn("heartbeat failed", { code: Code[ConnectError.from(error).code] });
      return Math.min(interval, 1_000);
    }
  }

  private learnState(
    attempt: Attempt,
    state: LeaseState,
    taken: ReturnType<Attempt["takeCheckpoint"]>,
  ): void {
    if (state.lost) {
      for (const waiter of taken.waiters)
        waiter.reject(new Error("the lease was lost before the checkpoint was saved"));
      attempt.abort("lease_lost");
      return;
    }
    if (state.leaseExpiresAt !== undefined) {
      attempt.holdUntil(timestampMs(state.leaseExpiresAt), () => this.leaseUnrenewed(attempt));
    }
    for (const waiter of taken.waiters) waiter.resolve();
    if (state.cancelRequested) attempt.abort("cancelled");
  }

  /** No renewal reached the server while the lease could still be held: the
   * server may be out of reach, or unable to reach its database. A handler that
   * has already settled is left to its outcome's write, which the server fences. */
  private leaseUnrenewed(attempt: Attempt): void {
    if (attempt.lost || this.finishing.has(attempt.key)) return;
    this.log.warn("lease unrenewed; stopping the attempt", {
      jobId: attempt.job.id,
      attempt: attempt.job.attempt,
    });
    attempt.abort("lease_lost");
  }

  // ----- stopping --------------------------------------------------------------------------

  private graceEnded: (() => void) | undefined;

  private endGrace(): void {
    this.graceEnded?.();
  }

  private async drain(): Promise<void> {
    if (this.running.size === 0) return;
    const graceTimer = new AbortController();
    this.graceEnded = () => graceTimer.abort();
    const graceOver = sleep(this.shutdownGraceMs, graceTimer.signal).then(() => "grace over" as const);
    const allDone = Promise.allSettled([...this.running]).then(() => "done" as const);
    const first = await Promise.race([allDone, graceOver]);
    graceTimer.abort();
    if (first === "grace over" && this.running.size > 0) {
      this.log.warn("grace over; handing running jobs back", { running: this.attempts.size });
      for (const attempt of this.attempts.values()) attempt.abort("shutdown");
    }
    // Keep renewing while handlers finish, however long that takes.
    while (this.running.size > 0) await Promise.allSettled([...this.running]);
  }
}

function failure(error: unknown): {
  errorMessage: string;
  errorType: string;
  nonRetryable: boolean;
  retryAfterSeconds: number;
} {
  const err = error instanceof Error ? error : new Error(String(error));
  return {
    errorMessage: err.message.slice(0, 1000) || err.name,
    errorType: (err.constructor?.name && err.constructor.name !== "Object"
      ? err.constructor.name
      : err.name
    ).slice(0, 128),
    nonRetryable: err instanceof NonRetryableError,
    retryAfterSeconds: err instanceof RetryLaterError ? err.retryAfterSeconds : 0,
  };
}
