// TLS: the server's certificate checked against a CA file (`tls: { caFile }`),
// for the Client and the Worker alike; a client that does not trust it fails.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { Client, Worker } from "../dist/index.js";
import { OWNER, Server, WORKER_TOKEN } from "./server.js";

let server;
let caFile;
let opensslMissing = false;

before(async () => {
  server = new Server();
  const key = join(server.dir, "server.key");
  caFile = join(server.dir, "server.pem");
  try {
    // A self-signed certificate for 127.0.0.1: its own CA.
    execFileSync(
      "openssl",
      [
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        key,
        "-out",
        caFile,
        "-days",
        "1",
        "-subj",
        "/CN=127.0.0.1",
        "-addext",
        "subjectAltName=IP:127.0.0.1",
      ],
      { stdio: "pipe" },
    );
  } catch (error) {
    if (error.code !== "ENOENT") throw error;
    opensslMissing = true;
    return;
  }
  server.extraArgs = ["--tls-cert", caFile, "--tls-key", key];
  await server.start();
});

after(async () => {
  await server?.close();
});

// CI (LEASEHOLD_TESTS_STRICT=1) fails rather than skips, as the Python suite does.
function notRun(t) {
  const why = "NOT RUN: openssl is needed to make a test certificate";
  if (process.env.LEASEHOLD_TESTS_STRICT === "1") assert.fail(why);
  return t.skip(why);
}

test("Client and Worker over TLS with a CA file", async (t) => {
  if (opensslMissing) return notRun(t);
  const tls = { caFile };
  const client = new Client({ server: server.address, ownerId: OWNER, tls });
  const worker = new Worker({ server: server.address, token: WORKER_TOKEN, tls, handleSignals: false });
  worker.handle("ts.tls", async (job) => ({ got: job.payload }));
  const running = worker.run();
  t.after(() => worker.stop());
  const { job } = await client.enqueue({ kind: "ts.tls", payload: { secret_ish: "over tls" } });
  for await (const event of client.watch(job.id)) void event;
  assert.deepEqual((await client.get(job.id)).result, { got: { secret_ish: "over tls" } });
  await worker.stop();
  await running;
});

test("a client that does not trust the server's certificate fails", async (t) => {
  if (opensslMissing) return notRun(t);
  const client = new Client({ server: server.address, ownerId: OWNER, tls: true, deadlineMs: 1_000 });
  await assert.rejects(client.get("job_00000000000000000000000000000000"));
});
