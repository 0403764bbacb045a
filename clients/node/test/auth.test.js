// Credentials under `serve --auth token`: the Client's owner token and the
// Worker's own token as `authorization: Bearer`, and a refused worker that
// stops at once instead of retrying.
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { Client, Code, ConnectError, Worker, WorkerRefusedError } from "../dist/index.js";
import { Server } from "./server.js";

const newToken = () => `lh_${randomBytes(32).toString("base64url")}`;
const line = (token, role) => `sha256:${createHash("sha256").update(token).digest("hex")} ${role}`;
const ownerToken = newToken();
const workerToken = newToken();
let server;

before(async () => {
  server = new Server();
  const tokenFile = join(server.dir, "tokens");
  writeFileSync(tokenFile, `${line(ownerToken, "owner:carol")}\n${line(workerToken, "worker:ts.*")}\n`);
  server.extraArgs = ["--auth", "token", "--token-file", tokenFile];
  await server.start();
});

after(async () => {
  await server?.close();
});

test("an owner token and a worker token run a job end to end", async (t) => {
  const client = new Client({ server: server.address, token: ownerToken });
  const worker = new Worker({ server: server.address, token: workerToken, handleSignals: false });
  worker.handle("ts.authed", async (job) => ({ owner: job.ownerId }));
  const running = worker.run();
  t.after(() => worker.stop());
  const { job } = await client.enqueue({ kind: "ts.authed", payload: {} });
  for await (const event of client.watch(job.id)) void event;
  const done = await client.get(job.id);
  assert.equal(done.status, "succeeded");
  assert.deepEqual(done.result, { owner: "carol" });
  await worker.stop();
  await running;
});

test("a call without credentials is UNAUTHENTICATED at once, not retried", async () => {
  const client = new Client({ server: server.address });
  const began = Date.now();
  await assert.rejects(client.get("job_00000000000000000000000000000000"), (error) => {
    assert.equal(ConnectError.from(error).code, Code.Unauthenticated);
    return true;
  });
  assert.ok(Date.now() - began < 2_000);
});

test("a worker with a wrong token is refused: run() rejects", async () => {
  const worker = new Worker({ server: server.address, token: newToken(), handleSignals: false });
  worker.handle("ts.authed", async () => ({}));
  await assert.rejects(worker.run(), WorkerRefusedError);
});
