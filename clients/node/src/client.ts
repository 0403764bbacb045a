// Client: the owner's side of JobService, with retries that cannot act twice.
import { randomUUID } from "node:crypto";
import { createClient, type Client as RpcClient } from "@connectrpc/connect";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { JobService, type EnqueueRequest } from "./gen/leasehold/v1/jobs_pb.js";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { EnqueueRequestSchema } from "./gen/leasehold/v1/jobs_pb.js";
import { createTransport, type ConnectionOptions } from "./connection.js";
import {
  eventFromMessage,
  jobFromMessage,
  parentFailurePolicyNumber,
  statusNumber,
  toStruct,
  type Job,
  type JobEvent,
  type JobStatus,
  type ParentFailurePolicy,
} from "./convert.js";
import { follow, type FeedItem, type SubscribeOptions } from "./feed.js";
import { Backoff, isTransient, sleep, withRetry } from "./retry.js";

export interface ClientOptions extends ConnectionOptions {
  /** Owner credential for `--auth token` / `jwt`: sent as `authorization: Bearer`. */
  token?: string;
  /** Owner id for the default header mode: sent as `x-owner-id`. */
  ownerId?: string;
  /** How long one call may keep retrying after UNAVAILABLE, in ms (default 30 s). */
  deadlineMs?: number;
  /** Each try's timeout, in ms (default 10 s). */
  callTimeoutMs?: number;
}

export interface RetryPolicy {
  initialIntervalSeconds?: number;
  backoffCoefficient?: number;
  maxIntervalSeconds?: number;
  nonRetryableErrorTypes?: string[];
}

export interface EnqueueOptions {
  kind: string;
  resourceType?: string;
  resourceId?: string;
  /** Handed to the handler as `job.payload`: a plain object. */
  payload?: object;
  maxAttempts?: number;
  timeoutSeconds?: number;
  runAt?: Date;
  priority?: number;
  retryPolicy?: RetryPolicy;
  /** Makes a repeated Enqueue answer with the first one's job. Generated when
   * not given, so that the client's own retries never enqueue twice. */
  requestId?: string;
  /** Ids of the caller's own jobs this one waits for (at most 100): it stays
   * queued, never claimed, until they have ended, and its handler reads their
   * results as `ctx.parentResults`. An id that names no job of the caller's is
   * INVALID_ARGUMENT. */
  dependsOn?: string[];
  /** What a parent that ends failed or cancelled does to this job (default
   * `"cancel"`). */
  onParentFailure?: ParentFailurePolicy;
}

/** One job of `enqueueBatch`: a whole graph goes in one call, all or none. */
export interface BatchEnqueueItem extends EnqueueOptions {
  /** This item's name within the batch (1-128 characters of [A-Za-z0-9._-],
   * unique in it), for other items' `dependsOnRefs`. */
  ref?: string;
  /** Refs of earlier or later items of the same batch this one waits for,
   * like `dependsOn` (the two together at most 100). A cycle is
   * INVALID_ARGUMENT. */
  dependsOnRefs?: string[];
}

export interface Enqueued {
  job: Job;
  /** False when an earlier Enqueue (same request id or resource) made the job. */
  created: boolean;
}

export interface ListOptions {
  statuses?: JobStatus[];
  kind?: string;
  resourceType?: string;
  resourceId?: string;
  /** Only the jobs that depend on this job id (its children). */
  dependsOn?: string;
  pageSize?: number;
  signal?: AbortSignal;
}

export interface WatchOptions {
  /** Only events after this sequence (default 0: the whole log). */
  afterSequence?: number;
  signal?: AbortSignal;
  /** How long to keep reconnecting to a server that went away, in ms (default 60 s). */
  reconnectDeadlineMs?: number;
}

export class Client {
  private readonly rpc: RpcClient<typeof JobService>;
  private readonly deadlineMs: number;
  private readonly callTimeoutMs: number;

  constructor(options: ClientOptions) {
    const headers: Record<string, string> = {};
    if (options.token !== undefined) headers.authorization = `Bearer ${options.token}`;
    if (options.ownerId !== undefined) headers["x-owner-id"] = options.ownerId;
    this.rpc = createClient(JobService, createTransport(options, headers));
    this.deadlineMs = options.deadlineMs ?? 30_000;
    this.callTimeoutMs = options.callTimeoutMs ?? 10_000;
  }

  private retrying<T>(
    call: (o: { signal?: AbortSignal; timeoutMs?: number }) => Promise<T>,
    signal?: AbortSignal,
  ): Promise<T> {
    return withRetry(call, { deadlineMs: this.deadlineMs, callTimeoutMs: this.callTimeoutMs, signal });
  }

  /** Creates a queued job (or answers with the one an identical earlier request made). */
  async enqueue(options: EnqueueOptions): Promise<Enqueued> {
    const request = enqueueRequest(options);
    const response = await this.retrying((o) => this.rpc.enqueue(request, o));
    return { job: jobFromMessage(response.job), created: response.created };
  }

  /** Enqueues many jobs in one call, all or none; items may depend on each
   * other by `ref` (a whole graph at once). The answers are in the items' order. */
  async enqueueBatch(jobs: BatchEnqueueItem[], options: { requestId?: string } = {}): Promise<Enqueued[]> {
    const request = {
      requests: jobs.map(batchItemRequest),
      requestId: options.requestId ?? randomUUID(),
    };
    const response = await this.retrying((o) => this.rpc.batchEnqueue(request, o));
    return response.responses.map((r) => ({ job: jobFromMessage(r.job), created: r.created }));
  }

  async get(jobId: string): Promise<Job> {
    const response = await this.retrying((o) => this.rpc.get({ jobId }, o));
    return jobFromMessage(response.job);
  }

  /** Queued: cancelled now. Running: cancel requested (the worker's ctx.signal aborts). */
  async cancel(jobId: string): Promise<Job> {
    const response = await this.retrying((o) => this.rpc.cancel({ jobId }, o));
    return jobFromMessage(response.job);
  }

  /** A new job copying a failed or cancelled one. */
  async retry(jobId: string, options: { requestId?: string } = {}): Promise<Job> {
    const request = { jobId, requestId: options.requestId ?? randomUUID() };
    const response = await this.retrying((o) => this.rpc.retry(request, o));
    return jobFromMessage(response.job);
  }

  /** The caller's jobs, newest first, fetched a page at a time. */
  async *list(options: ListOptions = {}): AsyncGenerator<Job> {
    let pageToken = "";
    do {
      const request = {
        pageSize: options.pageSize ?? 0,
        pageToken,
        statuses: (options.statuses ?? []).map(statusNumber),
        kind: options.kind ?? "",
        resourceType: options.resourceType ?? "",
        resourceId: options.resourceId ?? "",
        dependsOn: options.dependsOn ?? "",
      };
      const page = await this.retrying((o) => this.rpc.list(request, o), options.signal);
      for (const job of page.jobs) yield jobFromMessage(job);
      pageToken = page.nextPageToken;
    } while (pageToken !== "");
  }

  /** The job's events, replayed and then followed live; ends after its
   * terminal event. A lost connection resumes after the last event seen, so
   * no event is missed or repeated. */
  async *watch(jobId: string, options: WatchOptions = {}): AsyncGenerator<JobEvent> {
    let afterSequence = options.afterSequence ?? 0;
    const reconnectMs = options.reconnectDeadlineMs ?? 60_000;
    const backoff = new Backoff();
    let failingSince: number | undefined;
    for (;;) {
      try {
        const stream = this.rpc.watchEvents(
          { jobId, afterSequence: BigInt(afterSequence) },
          { signal: options.signal },
        );
        for await (const message of stream) {
          const event = eventFromMessage(message.event);
          failingSince = undefined;
          backoff.reset();
          afterSequence = event.sequence;
          yield event;
        }
        return;
      } catch (error) {
        if (!isTransient(error) || options.signal?.aborted) throw error;
        failingSince ??= Date.now();
        const delay = backoff.next();
        if (Date.now() + delay - failingSince > reconnectMs) throw error;
        await sleep(delay, options.signal);
      }
    }
  }

  /** The owner's feed: every event of every job of the caller's that matches
   * the filters, in the order they committed, then new ones live; it never
   * ends by itself (break out of the loop, or abort `signal`). A lost
   * connection resumes after the last item's position, so no event is missed
   * or repeated; store `position` to resume after a restart of your own. */
  subscribe(options: SubscribeOptions = {}): AsyncGenerator<FeedItem> {
    return follow((request, signal) => this.rpc.subscribe(request, { signal }), options);
  }
}

/** Exported for the package's own tests, not from the package. */
export function enqueueRequest(
  options: EnqueueOptions,
  requestId = options.requestId ?? randomUUID(),
): MessageInitShape<typeof EnqueueRequestSchema> {
  const request: Partial<EnqueueRequest> & { kind: string } = {
    kind: options.kind,
    resourceType: options.resourceType ?? "",
    resourceId: options.resourceId ?? "",
    maxAttempts: options.maxAttempts ?? 0,
    timeoutSeconds: options.timeoutSeconds ?? 0,
    priority: options.priority ?? 0,
    requestId,
    dependsOn: [...(options.dependsOn ?? [])],
  };
  const payload = toStruct(options.payload, "payload");
  return {
    ...request,
    ...(payload !== undefined ? { payload } : {}),
    ...(options.runAt !== undefined ? { runAt: timestampFromDate(options.runAt) } : {}),
    ...(options.retryPolicy !== undefined ? { retryPolicy: { ...options.retryPolicy } } : {}),
    ...(options.onParentFailure !== undefined
      ? { onParentFailure: parentFailurePolicyNumber(options.onParentFailure) }
      : {}),
  } as MessageInitShape<typeof EnqueueRequestSchema>;
}

/** One BatchEnqueue item. Exported for the package's own tests, not from the package. */
export function batchItemRequest(item: BatchEnqueueItem): MessageInitShape<typeof EnqueueRequestSchema> {
  // Items carry no request id of their own: the batch's covers them all.
  return {
    ...enqueueRequest(item, ""),
    ref: item.ref ?? "",
    dependsOnRefs: [...(item.dependsOnRefs ?? [])],
  };
}
