// Worker against a real server: results and progress as plain objects, a
// cancel that reaches the handler at once, failures, a graceful SIGTERM, and
// attempts kept apart by job id and lease token, and a handler stopped before
// a lease no renewal reaches could expire.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { after, before, test } from "node:test";
import { timestampMs } from "@bufbuild/protobuf/wkt";
import { Client, NonRetryableError, RetryLaterError, Worker } from "../dist/index.js";
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

/** A worker in this process, stopped when the test ends. */
function startWorker(t, kind, handler, options = {}) {
  const worker = new Worker({
    server: server.address,
    token: WORKER_TOKEN,
    concurrency: 2,
    handleSignals: false,
    claimWaitSeconds: 5,
    ...options,
  });
  worker.handle(kind, handler);
  const running = worker.run();
  t.after(() => worker.stop());
  return { worker, running };
}

async function events(jobId) {
  const all = [];
  for await (const event of client.watch(jobId)) all.push(event);
  return all;
}

const PAYLOAD = {
  snake_case_key: "kept",
  camelKey: 1.5,
  nested: { deeper: { list: [1, "two", null, { three: true }] }, empty: {} },
  nothing: null,
  flag: false,
};

test("a handler's payload, progress and result are plain objects both ways", async (t) => {
  const seen = [];
  startWorker(t, "ts.echo", async (job, ctx) => {
    seen.push(job.payload);
    await ctx.progress({ step_done: 1, of: { total: 2 } });
    await ctx.appendEvent("note", { said: null });
    return { echoed: job.payload, attempt: job.attempt };
  });
  const { job } = await client.enqueue({ kind: "ts.echo", payload: PAYLOAD });
  const log = await events(job.id);
  assert.deepEqual(seen, [PAYLOAD]);
  assert.deepEqual(
    log.map((e) => e.type),
    ["job.queued", "job.started", "progress", "note", "job.succeeded"],
  );
  assert.deepEqual(log[2].payload, { step_done: 1, of: { total: 2 } });
  assert.deepEqual(log[3].payload, { said: null });
  const done = await client.get(job.id);
  assert.equal(done.status, "succeeded");
  assert.deepEqual(done.result, { echoed: PAYLOAD, attempt: 1 });
});

test("the jobs of one Claim, which share its lease token, all run", async (t) => {
  // Queued before the worker starts, so its first Claim takes them all at once.
  const queued = await client.enqueueBatch(
    Array.from({ length: 6 }, (_, n) => ({ kind: "ts.together", payload: { n } })),
  );
  const started = new Set();
  let allStarted;
  const together = new Promise((resolve) => (allStarted = resolve));
  startWorker(
    t,
    "ts.together",
    async (job) => {
      started.add(job.id);
      if (started.size === queued.length) allStarted();
      await together; // each holds its slot until all six run at once
      return { n: job.payload.n };
    },
    { concurrency: 6 },
  );
  const ids = queued.map((q) => q.job.id);
  for (const id of ids) {
    const events = [];
    for await (const event of client.watch(id)) events.push(event.type);
    assert.equal(events.at(-1), "job.succeeded", `${id}: ${events}`);
    const job = await client.get(id);
    assert.equal(job.attempt, 1);
  }
  assert.deepEqual([...started].sort(), [...ids].sort());
});

test("a cancel aborts ctx.signal within moments (held leases), and the job ends cancelled", async (t) => {
  let startedAt;
  let abortedAt;
  let reason;
  const started = new Promise((resolve) => {
    startWorker(t, "ts.cancel", async (job, ctx) => {
      startedAt = Date.now();
      resolve();
      await new Promise((_, reject) =>
        ctx.signal.addEventListener("abort", () => {
          abortedAt = Date.now();
          reason = ctx.signal.reason;
          reject(ctx.signal.reason);
        }),
      );
    });
  });
  const { job } = await client.enqueue({ kind: "ts.cancel", payload: {} });
  await started;
  const cancelAt = Date.now();
  await client.cancel(job.id);
  const log = await events(job.id);
  assert.ok(abortedAt !== undefined && startedAt !== undefined);
  // The heartbeat interval is 2 s (a third of the 6 s lease): the news came
  // through the waiting Claim, not a heartbeat.
  assert.ok(abortedAt - cancelAt < 1_000, `aborted ${abortedAt - cancelAt} ms after the cancel`);
  assert.equal(reason.abortCause, "cancelled");
  assert.equal(log.at(-1).type, "job.cancelled");
  assert.equal((await client.get(job.id)).status, "cancelled");
});

test("a handler's error fails the attempt; NonRetryableError fails the job at once", async (t) => {
  class QuotaExceeded extends Error {}
  startWorker(t, "ts.fail", async (job) => {
    if (job.payload.permanent) throw new NonRetryableError("bad input: no such file");
    throw new QuotaExceeded("quota exceeded");
  });
  const permanent = await client.enqueue({ kind: "ts.fail", payload: { permanent: true }, maxAttempts: 3 });
  await events(permanent.job.id);
  const failed = await client.get(permanent.job.id);
  assert.equal(failed.status, "failed");
  assert.equal(failed.attempt, 1);
  assert.equal(failed.errorMessage, "bad input: no such file");
  assert.equal(failed.errorType, "NonRetryableError");

  const once = await client.enqueue({ kind: "ts.fail", payload: {}, maxAttempts: 1 });
  await events(once.job.id);
  const retryable = await client.get(once.job.id);
  assert.equal(retryable.status, "failed");
  assert.equal(retryable.errorMessage, "quota exceeded");
  assert.equal(retryable.errorType, "QuotaExceeded");
});

test("a handler returning something other than an object fails the attempt, clearly", async (t) => {
  startWorker(t, "ts.array", async () => [1, 2]);
  const { job } = await client.enqueue({ kind: "ts.array", payload: {}, maxAttempts: 1 });
  await events(job.id);
  const failed = await client.get(job.id);
  assert.equal(failed.status, "failed");
  assert.match(failed.errorMessage, /must be a plain object/);
});

function workerProcess(mode) {
  const child = spawn(
    process.execPath,
    [fileURLToPath(new URL("./fixtures/worker-process.js", import.meta.url)), server.address, mode],
    {
      env: { ...process.env, LEASEHOLD_WORKER_TOKEN: WORKER_TOKEN },
      stdio: ["ignore", "pipe", "inherit"],
    },
  );
  const lines = [];
  const waiters = [];
  createInterface({ input: child.stdout }).on("line", (line) => {
    const record = JSON.parse(line);
    lines.push(record);
    for (const waiter of [...waiters]) {
      if (waiter.match(record)) {
        waiters.splice(waiters.indexOf(waiter), 1);
        waiter.resolve(record);
      }
    }
  });
  const exited = new Promise((resolve) => child.once("exit", (code, signal) => resolve({ code, signal })));
  const waitFor = (match) => {
    const found = lines.find(match);
    return found ? Promise.resolve(found) : new Promise((resolve) => waiters.push({ match, resolve }));
  };
  return { child, lines, exited, waitFor };
}

test("SIGTERM stops claiming and lets the running job finish", async (t) => {
  const worker = workerProcess("slow");
  t.after(() => worker.child.kill("SIGKILL"));
  const { job } = await client.enqueue({ kind: "ts.slow", payload: {} });
  await worker.waitFor((r) => r.started === job.id);
  worker.child.kill("SIGTERM");
  const { code } = await worker.exited;
  assert.equal(code, 0);
  assert.ok(worker.lines.some((r) => r.finished === job.id));
  assert.ok(worker.lines.some((r) => r.stopped));
  const done = await client.get(job.id);
  assert.equal(done.status, "succeeded");
  assert.deepEqual(done.result, { slept: true });
  // Stopped means stopped: a job enqueued now waits for another worker.
  const later = await client.enqueue({ kind: "ts.slow", payload: { later: true } });
  assert.equal((await client.get(later.job.id)).status, "queued");
  await client.cancel(later.job.id);
});

test("attempts are kept by lease token: a frozen worker's lost attempt 1 writes nothing, attempt 2 finishes", async (t) => {
  const worker = workerProcess("frozen");
  t.after(() => worker.child.kill("SIGKILL"));
  const { job } = await client.enqueue({ kind: "ts.frozen", payload: {}, maxAttempts: 3 });
  const first = await worker.waitFor((r) => r.started === job.id && r.attempt === 1);
  // Freeze the process past its lease (6 s): the server recovers the job.
  worker.child.kill("SIGSTOP");
  await new Promise((resolve) => setTimeout(resolve, 9_000));
  worker.child.kill("SIGCONT");
  const aborted = await worker.waitFor((r) => r.aborted === job.id);
  assert.equal(aborted.cause, "lease_lost");
  const second = await worker.waitFor((r) => r.started === job.id && r.attempt === 2);
  assert.notEqual(second.token, first.token);
  const log = await events(job.id);
  assert.ok(log.some((e) => e.type === "job.lease_expired"));
  const done = await client.get(job.id);
  assert.equal(done.status, "succeeded");
  assert.deepEqual(done.result, { from: 2 });
});

test("a handler whose lease no renewal reaches is stopped before the lease could expire", async (t) => {
  let stopped;
  const stoppedOnce = new Promise((resolve) => (stopped = resolve));
  const { worker } = startWorker(t, "ts.unrenewed", async (job, ctx) => {
    if (job.attempt > 1) return { from: job.attempt };
    await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
    stopped({ at: Date.now(), cause: ctx.signal.reason.abortCause });
    throw ctx.signal.reason;
  });
  // The lease's expiry as the server last gave it, by Claim or by Heartbeat.
  let expiresAtMs = 0;
  const saw = (at) => (expiresAtMs = Math.max(expiresAtMs, timestampMs(at)));
  const claim = worker.rpc.claim.bind(worker.rpc);
  worker.rpc.claim = async (...args) => {
    const answer = await claim(...args);
    for (const claimed of answer.jobs) if (claimed.leaseExpiresAt) saw(claimed.leaseExpiresAt);
    return answer;
  };
  const heartbeat = worker.rpc.heartbeat.bind(worker.rpc);
  worker.rpc.heartbeat = async (...args) => {
    const answer = await heartbeat(...args);
    for (const state of answer.states) if (state.leaseExpiresAt) saw(state.leaseExpiresAt);
    return answer;
  };
  const { job } = await client.enqueue({ kind: "ts.unrenewed", payload: {}, maxAttempts: 2 });
  while ((await client.get(job.id)).status !== "running") await new Promise((r) => setTimeout(r, 20));
  // The server freezes: no renewal is answered, nor refused.
  server.process.kill("SIGSTOP");
  t.after(() => server.process.kill("SIGCONT"));
  const stop = await stoppedOnce;
  server.process.kill("SIGCONT");
  assert.equal(stop.cause, "lease_lost");
  assert.ok(stop.at < expiresAtMs, `stopped ${stop.at - expiresAtMs} ms after its lease expired`);
  // The server recovers the job once it runs again, and the next attempt finishes it.
  const log = await events(job.id);
  assert.ok(log.some((e) => e.type === "job.lease_expired"));
  const done = await client.get(job.id);
  assert.equal(done.status, "succeeded");
  assert.deepEqual(done.result, { from: 2 });
});

test("a checkpoint saved by one attempt is the next attempt's lastCheckpoint", async (t) => {
  const lastSeen = [];
  startWorker(t, "ts.checkpoint", async (job, ctx) => {
    lastSeen.push(ctx.lastCheckpoint);
    if (job.attempt === 1) {
      await ctx.checkpoint({ done_items: 2, seen: ["a", "b"], cursor: null });
      throw new RetryLaterError("crashed midway", 1);
    }
    return { resumed_from: ctx.lastCheckpoint };
  });
  const { job } = await client.enqueue({ kind: "ts.checkpoint", payload: {}, maxAttempts: 2 });
  await events(job.id);
  const saved = { done_items: 2, seen: ["a", "b"], cursor: null };
  assert.deepEqual(lastSeen, [undefined, saved]);
  assert.deepEqual((await client.get(job.id)).result, { resumed_from: saved });
});

test("a handler still cleaning up after a cancel does not make the claim loop spin", async (t) => {
  let claims = 0;
  let aborted;
  const abortedOnce = new Promise((resolve) => (aborted = resolve));
  const { worker } = startWorker(t, "ts.cleanup", async (job, ctx) => {
    await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
    aborted();
    await new Promise((resolve) => setTimeout(resolve, 1_500)); // cleaning up
    throw ctx.signal.reason;
  });
  // Count the Claims sent (the generated client is a private field).
  const claim = worker.rpc.claim.bind(worker.rpc);
  worker.rpc.claim = (...args) => ((claims += 1), claim(...args));
  const { job } = await client.enqueue({ kind: "ts.cleanup", payload: {} });
  while ((await client.get(job.id)).status !== "running") await new Promise((r) => setTimeout(r, 20));
  await client.cancel(job.id);
  await abortedOnce;
  const before = claims;
  await events(job.id);
  assert.ok(claims - before <= 2, `${claims - before} claims while one handler cleaned up`);
  assert.equal((await client.get(job.id)).status, "cancelled");
});

test("a job running while the server crashes and comes back finishes under its lease", async (t) => {
  let started;
  const running = new Promise((resolve) => (started = resolve));
  startWorker(t, "ts.crash", async (job, ctx) => {
    started();
    await new Promise((resolve) => setTimeout(resolve, 3_000));
    await ctx.progress({ after: "restart" }); // retried until the server is back
    return { survived: true };
  });
  const { job } = await client.enqueue({ kind: "ts.crash", payload: {} });
  await running;
  await server.stop("SIGKILL");
  await server.start(); // same port, same database
  const log = await events(job.id);
  assert.deepEqual(
    log.map((e) => e.type),
    ["job.queued", "job.started", "progress", "job.succeeded"],
  );
  const done = await client.get(job.id);
  assert.equal(done.attempt, 1);
  assert.deepEqual(done.result, { survived: true });
  // And it claims again afterwards.
  const next = await client.enqueue({ kind: "ts.crash", payload: {} });
  assert.equal((await events(next.job.id)).at(-1).type, "job.succeeded");
});
