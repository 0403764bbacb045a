// @leasehold/client: a Client for JobService and a Worker for WorkerService.
export { Client } from "./client.js";
export type {
  BatchEnqueueItem,
  ClientOptions,
  EnqueueOptions,
  Enqueued,
  ListOptions,
  RetryPolicy,
  WatchOptions,
} from "./client.js";
export type { FeedItem, SubscribeOptions } from "./feed.js";
export { Worker, WorkerRefusedError } from "./worker.js";
export type { Handler, Logger, WorkerOptions } from "./worker.js";
export type { ClaimedJobInfo, JobContext } from "./attempt.js";
export type { ConnectionOptions, TlsOptions } from "./connection.js";
export type { Job, JobEvent, JobStatus, JsonObject, JsonValue, ParentFailurePolicy } from "./convert.js";
export { errorInfo, JobAbortedError, NonRetryableError, RetryLaterError } from "./errors.js";
export type { AbortCause, ErrorInfo } from "./errors.js";
export { Code, ConnectError } from "@connectrpc/connect";
