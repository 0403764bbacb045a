// Graphs of jobs against a real server: a child waits for its parents and its
// handler reads their results as ctx.parentResults; a whole graph goes in one
// enqueueBatch by ref; a failed parent cancels or runs its children as they ask;
// list finds a job's children.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { Client, Code, ConnectError, NonRetryableError, Worker } from "../dist/index.js";
import { OWNER, Server, WORKER_TOKEN } from "./server.js";

let server;
let client;

before(async () => {
  server = await new Server().start();
  client = new Client({ server: server.address, ownerId: OWNER });
});

after(async () => {
  await server?.close();
});

/** A worker in this process running `handlers` (kind → handler), stopped when the test ends. */
function startWorker(t, handlers) {
  const worker = new Worker({
    server: server.address,
    token: WORKER_TOKEN,
    concurrency: 4,
    handleSignals: false,
    claimWaitSeconds: 5,
  });
  for (const [kind, handler] of Object.entries(handlers)) worker.handle(kind, handler);
  worker.run();
  t.after(() => worker.stop());
  return worker;
}

/** The job's event types, once it has ended. */
async function ended(jobId) {
  const types = [];
  for await (const event of client.watch(jobId)) types.push(event.type);
  return types;
}

test("a child waits for its parent, then its handler sees the parent's result in ctx.parentResults", async (t) => {
  const parent = (await client.enqueue({ kind: "ts.dep.parent", payload: { n: 21 } })).job;
  const { job: child } = await client.enqueue({
    kind: "ts.dep.child",
    payload: { child: true },
    dependsOn: [parent.id],
  });
  assert.equal(child.status, "queued");
  assert.deepEqual(child.dependsOn, [parent.id]);
  assert.equal(child.pendingDependencies, 1);
  assert.equal(child.onParentFailure, "cancel"); // the default
  const waiting = await client.get(child.id);
  assert.equal(waiting.waitReason, "dependencies");
  assert.equal(waiting.pendingDependencies, 1);

  const seen = [];
  startWorker(t, {
    "ts.dep.parent": async (job, ctx) => {
      assert.deepEqual(ctx.parentResults, {});
      return { doubled: job.payload.n * 2, nested: { list: [1, null, "x"] } };
    },
    "ts.dep.child": async (job, ctx) => {
      seen.push({ payload: job.payload, parentResults: ctx.parentResults });
      return { sum: ctx.parentResults[parent.id].doubled + 1 };
    },
  });
  const log = await ended(child.id);
  assert.ok(log.includes("job.dependencies_met"), log.join(", "));
  assert.equal(log.at(-1), "job.succeeded");
  assert.deepEqual(seen, [
    {
      payload: { child: true },
      parentResults: { [parent.id]: { doubled: 42, nested: { list: [1, null, "x"] } } },
    },
  ]);
  const done = await client.get(child.id);
  assert.equal(done.status, "succeeded");
  assert.equal(done.pendingDependencies, 0);
  assert.deepEqual(done.result, { sum: 43 });
});

test("a diamond submitted in one enqueueBatch by ref runs in order; the join sees both branches' results", async (t) => {
  // The join comes first: a ref may name a later item of the batch.
  const made = await client.enqueueBatch([
    { kind: "ts.dep.graph", ref: "join", dependsOnRefs: ["left", "right"], payload: { name: "join" } },
    { kind: "ts.dep.graph", ref: "root", payload: { name: "root" } },
    { kind: "ts.dep.graph", ref: "left", dependsOnRefs: ["root"], payload: { name: "left" } },
    { kind: "ts.dep.graph", ref: "right", dependsOnRefs: ["root"], payload: { name: "right" } },
  ]);
  const [join, root, left, right] = made.map((m) => m.job);
  assert.ok(made.every((m) => m.created));
  assert.deepEqual(join.dependsOn, [left.id, right.id]);
  assert.equal(join.pendingDependencies, 2);
  assert.deepEqual(root.dependsOn, []);
  assert.deepEqual(left.dependsOn, [root.id]);

  const children = [];
  for await (const job of client.list({ dependsOn: root.id })) children.push(job.id);
  assert.deepEqual(children.sort(), [left.id, right.id].sort());
  const none = [];
  for await (const job of client.list({ dependsOn: join.id })) none.push(job.id);
  assert.deepEqual(none, []);

  const order = [];
  const parentsSeen = {};
  startWorker(t, {
    "ts.dep.graph": async (job, ctx) => {
      order.push(job.payload.name);
      parentsSeen[job.payload.name] = ctx.parentResults;
      return { from: job.payload.name };
    },
  });
  assert.equal((await ended(join.id)).at(-1), "job.succeeded");
  assert.equal(order.length, 4, order.join(", "));
  assert.equal(order[0], "root");
  assert.equal(order[3], "join");
  assert.deepEqual(parentsSeen.left, { [root.id]: { from: "root" } });
  assert.deepEqual(parentsSeen.join, { [left.id]: { from: "left" }, [right.id]: { from: "right" } });
});

test('a failed parent cancels a "cancel" child and its own child; a "run" child runs without its result', async (t) => {
  const made = await client.enqueueBatch([
    { kind: "ts.dep.failing", ref: "parent", payload: {} },
    { kind: "ts.dep.after", ref: "cancelled", dependsOnRefs: ["parent"], payload: { name: "cancelled" } },
    {
      kind: "ts.dep.after",
      ref: "grandchild",
      dependsOnRefs: ["cancelled"],
      payload: { name: "grandchild" },
    },
    {
      kind: "ts.dep.after",
      ref: "runs",
      dependsOnRefs: ["parent"],
      onParentFailure: "run",
      payload: { name: "runs" },
    },
  ]);
  const [parent, cancelled, grandchild, runs] = made.map((m) => m.job);
  assert.equal(runs.onParentFailure, "run");
  const ran = [];
  startWorker(t, {
    "ts.dep.failing": async () => {
      throw new NonRetryableError("the data could not be fetched");
    },
    "ts.dep.after": async (job, ctx) => {
      ran.push({ name: job.payload.name, parentResults: ctx.parentResults });
      return { ran: true };
    },
  });
  assert.equal((await ended(runs.id)).at(-1), "job.succeeded");
  assert.deepEqual(ran, [{ name: "runs", parentResults: {} }]);
  assert.equal((await client.get(parent.id)).status, "failed");
  for (const job of [cancelled, grandchild]) {
    const log = await ended(job.id);
    assert.ok(log.includes("job.dependency_failed"), log.join(", "));
    const got = await client.get(job.id);
    assert.equal(got.status, "cancelled");
    assert.equal(got.errorType, "DependencyFailed");
  }
  assert.match((await client.get(cancelled.id)).errorMessage, new RegExp(parent.id));
});

test("a parent that is no job of the caller's is INVALID_ARGUMENT, not retried", async () => {
  await assert.rejects(
    client.enqueue({ kind: "ts.dep.child", dependsOn: ["job_00000000000000000000000000000000"] }),
    (error) => ConnectError.from(error).code === Code.InvalidArgument,
  );
});
