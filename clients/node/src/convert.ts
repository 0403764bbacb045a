// Between the generated messages and the plain objects users see.
import type { JsonObject, JsonValue } from "@bufbuild/protobuf";
import { timestampDate, type Timestamp } from "@bufbuild/protobuf/wkt";
import {
  JobStatus as JobStatusEnum,
  ParentFailurePolicy as ParentFailurePolicyEnum,
  WaitReason,
  type Job as JobMessage,
  type JobEvent as JobEventMessage,
} from "./gen/leasehold/v1/jobs_pb.js";

export type { JsonObject, JsonValue };

export type JobStatus = "queued" | "running" | "succeeded" | "failed" | "cancelled";

/** What a parent that ends failed or cancelled does to a job that depends on
 * it: `"cancel"` (the default) ends the child cancelled with `errorType`
 * `"DependencyFailed"`, and its own children with it; `"run"` runs the child
 * once every parent has ended, whatever the outcome. */
export type ParentFailurePolicy = "cancel" | "run";

/** A job as the server reports it (never its payload or lease). */
export interface Job {
  id: string;
  kind: string;
  resourceType: string;
  resourceId: string;
  status: JobStatus | "unspecified";
  attempt: number;
  maxAttempts: number;
  timeoutSeconds: number;
  priority: number;
  ownerId: string;
  retryOfJobId: string;
  errorMessage: string;
  errorType: string;
  /** What the job produced; set once it succeeded with a result. */
  result?: JsonObject;
  /** Why a queued job is not running yet, lower case: `"scheduled"`,
   * `"backoff"`, `"kind_limit"`, `"owner_limit"`, `"rate_limit"`, `"paused"`,
   * `"no_worker"`, `"ready"`, `"dependencies"` (some parents have not ended:
   * see `pendingDependencies`), or `"unspecified"`. */
  waitReason: string;
  /** The jobs it waits for, in the order given (empty for a job without parents). */
  dependsOn: string[];
  /** How many of `dependsOn` have not yet ended the way it waits for; while
   * above 0 the job stays queued (`waitReason` `"dependencies"`) and is never
   * claimed. */
  pendingDependencies: number;
  /** Set only on a job with parents. */
  onParentFailure?: ParentFailurePolicy;
  availableAt?: Date;
  cancelRequestedAt?: Date;
  createdAt?: Date;
  updatedAt?: Date;
  startedAt?: Date;
  completedAt?: Date;
  runAt?: Date;
}

export interface JobEvent {
  jobId: string;
  sequence: number;
  type: string;
  payload: JsonObject;
  createdAt?: Date;
}

const STATUS_NAMES: Record<number, Job["status"]> = {
  [JobStatusEnum.UNSPECIFIED]: "unspecified",
  [JobStatusEnum.QUEUED]: "queued",
  [JobStatusEnum.RUNNING]: "running",
  [JobStatusEnum.SUCCEEDED]: "succeeded",
  [JobStatusEnum.FAILED]: "failed",
  [JobStatusEnum.CANCELLED]: "cancelled",
};

export function statusNumber(status: JobStatus): JobStatusEnum {
  const found = Object.entries(STATUS_NAMES).find(([, name]) => name === status);
  if (found === undefined) throw new TypeError(`unknown job status ${JSON.stringify(status)}`);
  return Number(found[0]) as JobStatusEnum;
}

const POLICY_NUMBERS: Record<ParentFailurePolicy, ParentFailurePolicyEnum> = {
  cancel: ParentFailurePolicyEnum.CANCEL,
  run: ParentFailurePolicyEnum.RUN,
};

export function parentFailurePolicyNumber(policy: ParentFailurePolicy): ParentFailurePolicyEnum {
  // An own-property check: a name like "toString" is not a policy either.
  if (!Object.hasOwn(POLICY_NUMBERS, policy)) {
    throw new TypeError(`onParentFailure must be "cancel" or "run", not ${JSON.stringify(policy)}`);
  }
  return POLICY_NUMBERS[policy];
}

function parentFailurePolicyName(policy: ParentFailurePolicyEnum): ParentFailurePolicy | undefined {
  if (policy === ParentFailurePolicyEnum.CANCEL) return "cancel";
  if (policy === ParentFailurePolicyEnum.RUN) return "run";
  return undefined;
}

function date(timestamp: Timestamp | undefined): Date | undefined {
  return timestamp === undefined ? undefined : timestampDate(timestamp);
}

export function jobFromMessage(job: JobMessage | undefined): Job {
  if (job === undefined) throw new Error("the server answered without a job");
  return {
    id: job.id,
    kind: job.kind,
    resourceType: job.resourceType,
    resourceId: job.resourceId,
    status: STATUS_NAMES[job.status] ?? "unspecified",
    attempt: job.attempt,
    maxAttempts: job.maxAttempts,
    timeoutSeconds: job.timeoutSeconds,
    priority: job.priority,
    ownerId: job.ownerId,
    retryOfJobId: job.retryOfJobId,
    errorMessage: job.errorMessage,
    errorType: job.errorType,
    result: job.result,
    waitReason: (WaitReason[job.waitReason] ?? "UNSPECIFIED").toLowerCase(),
    dependsOn: [...job.dependsOn],
    pendingDependencies: job.pendingDependencies,
    onParentFailure: parentFailurePolicyName(job.onParentFailure),
    availableAt: date(job.availableAt),
    cancelRequestedAt: date(job.cancelRequestedAt),
    createdAt: date(job.createdAt),
    updatedAt: date(job.updatedAt),
    startedAt: date(job.startedAt),
    completedAt: date(job.completedAt),
    runAt: date(job.runAt),
  };
}

export function eventFromMessage(event: JobEventMessage | undefined): JobEvent {
  if (event === undefined) throw new Error("the server sent an empty event");
  return {
    jobId: event.jobId,
    sequence: Number(event.sequence),
    type: event.type,
    payload: event.payload ?? {},
    createdAt: date(event.createdAt),
  };
}

/** A plain object as JSON would carry it (a Date becomes its ISO string, an
 * undefined member is dropped), so that every value has a Struct kind: the
 * server rejects, rather than stores as null, a Value with none. */
export function toStruct(value: unknown, what: string): JsonObject | undefined {
  if (value === undefined || value === null) return undefined;
  if (typeof value !== "object" || Array.isArray(value)) {
    throw new TypeError(`${what} must be a plain object (a JSON object), not ${describe(value)}`);
  }
  return JSON.parse(JSON.stringify(value)) as JsonObject;
}

function describe(value: unknown): string {
  return Array.isArray(value) ? "an array" : typeof value;
}
