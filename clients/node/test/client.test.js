// Client against a real server: every JobService call, list pages, and a
// watch that resumes by itself across a server restart.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { Client, Code, ConnectError } from "../dist/index.js";
import { OWNER, Server } from "./server.js";

let server;
let client;

before(async () => {
  server = await new Server().start();
  client = new Client({ server: server.address, ownerId: OWNER });
});

after(async () => {
  await server?.close();
});

test("enqueue and get: the job as the server keeps it; a repeated request id enqueues once", async () => {
  const request = {
    kind: "ts.client",
    resourceType: "doc",
    resourceId: "d1",
    payload: { snake_case: 1 },
    maxAttempts: 2,
    requestId: "req-enqueue-1",
  };
  const first = await client.enqueue(request);
  assert.equal(first.created, true);
  assert.equal(first.job.status, "queued");
  assert.equal(first.job.kind, "ts.client");
  assert.equal(first.job.maxAttempts, 2);
  assert.ok(first.job.createdAt instanceof Date);
  const again = await client.enqueue(request);
  assert.equal(again.job.id, first.job.id);
  // Another request for the same resource while the job is queued: the same job.
  const same = await client.enqueue({ ...request, requestId: undefined });
  assert.equal(same.created, false);
  assert.equal(same.job.id, first.job.id);
  const got = await client.get(first.job.id);
  assert.equal(got.id, first.job.id);
  assert.equal(got.resourceId, "d1");
});

test("a job of nobody's is PERMISSION_DENIED, not retried", async () => {
  await assert.rejects(client.get("job_00000000000000000000000000000000"), (error) => {
    assert.equal(ConnectError.from(error).code, Code.PermissionDenied);
    return true;
  });
});

test("enqueueBatch creates every job in one call", async () => {
  const made = await client.enqueueBatch([
    { kind: "ts.batch", payload: { n: 1 } },
    { kind: "ts.batch", payload: { n: 2 } },
    { kind: "ts.batch", payload: { n: 3 } },
  ]);
  assert.equal(made.length, 3);
  assert.ok(made.every((m) => m.created && m.job.status === "queued"));
  assert.equal(new Set(made.map((m) => m.job.id)).size, 3);
});

test("list is an async iterator over every page, newest first, filtered", async () => {
  const ids = [];
  for (let i = 0; i < 5; i++) ids.push((await client.enqueue({ kind: "ts.listed", payload: { i } })).job.id);
  const seen = [];
  for await (const job of client.list({ kind: "ts.listed", pageSize: 2 })) seen.push(job.id);
  assert.deepEqual(seen, [...ids].reverse());
  const queued = [];
  for await (const job of client.list({ kind: "ts.listed", statuses: ["queued"], pageSize: 100 }))
    queued.push(job);
  assert.equal(queued.length, 5);
});

test("cancel ends a queued job; retry makes a new job linked to it", async () => {
  const { job } = await client.enqueue({ kind: "ts.cancelled", payload: {} });
  const cancelled = await client.cancel(job.id);
  assert.equal(cancelled.status, "cancelled");
  const retried = await client.retry(job.id);
  assert.notEqual(retried.id, job.id);
  assert.equal(retried.retryOfJobId, job.id);
  assert.equal(retried.status, "queued");
  await assert.rejects(
    client.retry(retried.id),
    (error) => ConnectError.from(error).code === Code.FailedPrecondition,
  );
});

test("watch replays after a sequence and ends after the terminal event", async () => {
  const { job } = await client.enqueue({ kind: "ts.watched", payload: {} });
  await client.cancel(job.id);
  const all = [];
  for await (const event of client.watch(job.id)) all.push(event);
  assert.deepEqual(
    all.map((e) => [e.sequence, e.type]),
    [
      [1, "job.queued"],
      [2, "job.cancelled"],
    ],
  );
  const later = [];
  for await (const event of client.watch(job.id, { afterSequence: 1 })) later.push(event.type);
  assert.deepEqual(later, ["job.cancelled"]);
});

test("watch resumes by itself after the server restarts: no gap, no repeat", async () => {
  const { job } = await client.enqueue({ kind: "ts.restarted", payload: {} });
  const events = [];
  const watching = (async () => {
    for await (const event of client.watch(job.id)) events.push(event);
  })();
  while (events.length === 0) await new Promise((r) => setTimeout(r, 20));
  await server.stop("SIGTERM");
  await server.start(); // same port, same database
  // The client's own retry carries the Cancel through the restart, too.
  await client.cancel(job.id);
  await watching;
  assert.deepEqual(
    events.map((e) => [e.sequence, e.type]),
    [
      [1, "job.queued"],
      [2, "job.cancelled"],
    ],
  );
});
