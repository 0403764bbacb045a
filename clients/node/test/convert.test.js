// Between the generated messages and what users see, with no server: a job's
// dependencies, the Enqueue fields that make them, and the parents' results a
// claimed job carries. Messages go through the wire format first, as they do
// between a real server and the client.
import assert from "node:assert/strict";
import { test } from "node:test";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { Attempt } from "../dist/attempt.js";
import { batchItemRequest, enqueueRequest } from "../dist/client.js";
import { jobFromMessage } from "../dist/convert.js";
import {
  EnqueueRequestSchema,
  JobSchema,
  ParentFailurePolicy,
  WaitReason,
} from "../dist/gen/leasehold/v1/jobs_pb.js";
import { ClaimedJobSchema } from "../dist/gen/leasehold/v1/worker_pb.js";

function overTheWire(schema, init) {
  return fromBinary(schema, toBinary(schema, create(schema, init)));
}

test("a job waiting for its parents: dependsOn, pendingDependencies, onParentFailure, waitReason", () => {
  const job = jobFromMessage(
    overTheWire(JobSchema, {
      id: "job_child",
      kind: "ts.child",
      dependsOn: ["job_b", "job_a"],
      pendingDependencies: 2,
      onParentFailure: ParentFailurePolicy.RUN,
      waitReason: WaitReason.DEPENDENCIES,
    }),
  );
  assert.deepEqual(job.dependsOn, ["job_b", "job_a"]); // in the order given
  assert.equal(job.pendingDependencies, 2);
  assert.equal(job.onParentFailure, "run");
  assert.equal(job.waitReason, "dependencies");
  const cancelling = jobFromMessage(
    overTheWire(JobSchema, { id: "j", dependsOn: ["job_a"], onParentFailure: ParentFailurePolicy.CANCEL }),
  );
  assert.equal(cancelling.onParentFailure, "cancel");
});

test("a job without parents: no dependsOn, nothing pending, no policy", () => {
  const job = jobFromMessage(overTheWire(JobSchema, { id: "job_alone", kind: "ts.alone" }));
  assert.deepEqual(job.dependsOn, []);
  assert.equal(job.pendingDependencies, 0);
  assert.equal(job.onParentFailure, undefined);
  assert.equal(job.waitReason, "unspecified");
});

test("enqueue's dependsOn and onParentFailure go out as the request's fields", () => {
  const request = overTheWire(
    EnqueueRequestSchema,
    enqueueRequest({ kind: "ts.child", dependsOn: ["job_a", "job_b"], onParentFailure: "run" }),
  );
  assert.deepEqual(request.dependsOn, ["job_a", "job_b"]);
  assert.equal(request.onParentFailure, ParentFailurePolicy.RUN);
  assert.equal(
    overTheWire(EnqueueRequestSchema, enqueueRequest({ kind: "k", onParentFailure: "cancel" }))
      .onParentFailure,
    ParentFailurePolicy.CANCEL,
  );
  // Not given: unset, which the server takes as "cancel".
  const plain = overTheWire(EnqueueRequestSchema, enqueueRequest({ kind: "ts.alone" }));
  assert.deepEqual(plain.dependsOn, []);
  assert.equal(plain.onParentFailure, ParentFailurePolicy.UNSPECIFIED);
  assert.equal(plain.ref, "");
});

test("an unknown onParentFailure is refused before anything is sent", () => {
  for (const policy of ["skip", "CANCEL", "toString", ""]) {
    assert.throws(
      () => enqueueRequest({ kind: "k", dependsOn: ["job_a"], onParentFailure: policy }),
      (error) =>
        error instanceof TypeError && /onParentFailure must be "cancel" or "run"/.test(error.message),
    );
  }
});

test("a batch item's ref and dependsOnRefs go out with the item; items carry no request id", () => {
  const request = overTheWire(
    EnqueueRequestSchema,
    batchItemRequest({
      kind: "ts.merge",
      ref: "merge",
      dependsOnRefs: ["fetch-data", "load.config"],
      dependsOn: ["job_outside"],
      onParentFailure: "run",
      requestId: "ignored-in-a-batch",
    }),
  );
  assert.equal(request.ref, "merge");
  assert.deepEqual(request.dependsOnRefs, ["fetch-data", "load.config"]);
  assert.deepEqual(request.dependsOn, ["job_outside"]);
  assert.equal(request.onParentFailure, ParentFailurePolicy.RUN);
  assert.equal(request.requestId, "");
});

test("a claimed job's parent results are plain objects by job id, like its payload", () => {
  const result = { rows: 3, nested: { list: [1, "two", null, { three: true }] }, nothing: null, ok: false };
  const attempt = new Attempt(
    overTheWire(ClaimedJobSchema, {
      job: { id: "job_child", kind: "ts.child", dependsOn: ["job_a", "job_b"] },
      leaseToken: "token",
      heartbeatIntervalSeconds: 2,
      payload: { n: 1 },
      // job_b succeeded without a result (or did not fit): absent.
      parentResults: { job_a: result },
    }),
    10_000,
  );
  assert.deepEqual(attempt.job.dependsOn, ["job_a", "job_b"]);
  assert.deepEqual(attempt.parentResults, { job_a: result });
  assert.equal(Object.getPrototypeOf(attempt.parentResults.job_a), Object.prototype);
  assert.deepEqual(Object.keys(attempt.parentResults), ["job_a"]);
  assert.ok(Object.isFrozen(attempt.parentResults));
});

test("a claimed job without parents has empty parent results", () => {
  const attempt = new Attempt(
    overTheWire(ClaimedJobSchema, { job: { id: "job_alone", kind: "ts.alone" }, leaseToken: "t" }),
    10_000,
  );
  assert.deepEqual(attempt.parentResults, {});
  assert.deepEqual(attempt.job.dependsOn, []);
});
