// The bench's baseline Node worker: what a careful team writes by hand from the protos with
// @grpc/grpc-js and @grpc/proto-loader (examples/node-worker's way, its protos and Struct helpers
// from examples/node-common): one long-poll Claim for as many jobs as there are free slots, one
// unary Complete per job, one batched Heartbeat for every held lease per interval. The handler
// is a no-op.
//
//   LEASEHOLD_WORKER_TOKEN=... node bench/node/unary_worker.js --server HOST:PORT --kind KIND --concurrency N
//
// Logs JSON lines on stderr; `{"event": "worker.started"}` once GetServerInfo has answered and
// the claim loop is about to send its first long poll. SIGINT: stop claiming, let running jobs
// finish, exit.
"use strict";

const os = require("node:os");
const { grpc, channelCredentials, loadLeasehold, toStruct } = require("../../examples/node-common/leasehold.js");

const PROTOCOLS = [1, 2];
const CLAIM_WAIT_SECONDS = 20;
const MAX_JOBS_PER_CLAIM = 100; // ClaimRequest.max_jobs: 1-100
const RECONNECT_MS = 500;

function parseArgs(argv) {
  const args = { server: "127.0.0.1:50051", kind: "bench.remote-noop", concurrency: 64 };
  for (let i = 0; i < argv.length; i += 1) {
    if (argv[i] === "--server") args.server = argv[++i];
    else if (argv[i] === "--kind") args.kind = argv[++i];
    else if (argv[i] === "--concurrency") args.concurrency = Number(argv[++i]);
    else throw new Error(`unknown argument ${argv[i]}`);
  }
  return args;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const log = (event, fields = {}) => console.error(JSON.stringify({ event, ...fields }));

class Worker {
  constructor(client, token, { kind, concurrency }) {
    this.client = client;
    this.kind = kind;
    this.concurrency = concurrency;
    this.workerId = `node-unary-${os.hostname()}-${process.pid}`;
    this.metadata = new grpc.Metadata();
    this.metadata.set("authorization", `Bearer ${token}`);
    this.held = new Map(); // job id -> lease token
    this.running = new Set(); // promises of running jobs
    this.slotFreed = null;
    this.stopping = false;
    this.claimCall = null;
    this.heartbeatMs = 10_000;
    this.heartbeatTimer = null;
  }

  call(method, request, deadlineMs = 10_000) {
    return new Promise((resolve, reject) => {
      const call = this.client[method](request, this.metadata, { deadline: Date.now() + deadlineMs }, (error, response) =>
        error ? reject(error) : resolve(response),
      );
      if (method === "Claim") this.claimCall = call;
    });
  }

  async start() {
    const info = await this.call("GetServerInfo", { protocolVersion: Math.max(...PROTOCOLS) });
    if (!PROTOCOLS.includes(info.protocolVersion)) {
      throw new Error(`server speaks WorkerService protocol ${info.protocolVersion}`);
    }
    log("worker.started", { worker_id: this.workerId, kind: this.kind, protocol: info.protocolVersion });
    this.scheduleHeartbeat();
    while (!this.stopping) {
      const free = this.concurrency - this.running.size;
      if (free <= 0) {
        await new Promise((resolve) => (this.slotFreed = resolve));
        continue;
      }
      let jobs;
      try {
        ({ jobs } = await this.call(
          "Claim",
          {
            workerId: this.workerId,
            kinds: [this.kind],
            maxJobs: Math.min(free, MAX_JOBS_PER_CLAIM),
            waitSeconds: CLAIM_WAIT_SECONDS,
          },
          (CLAIM_WAIT_SECONDS + 10) * 1000,
        ));
      } catch (error) {
        if (this.stopping) break;
        if (error.code === grpc.status.UNAUTHENTICATED || error.code === grpc.status.INVALID_ARGUMENT) throw error;
        log("worker.claim_failed", { code: grpc.status[error.code] || error.code });
        await sleep(RECONNECT_MS);
        continue;
      }
      for (const claimed of jobs) this.launch(claimed);
    }
  }

  launch(claimed) {
    const jobId = claimed.job.id;
    this.held.set(jobId, claimed.leaseToken);
    this.heartbeatMs = Math.max(200, claimed.heartbeatIntervalSeconds * 1000);
    const run = this.runJob(claimed)
      .catch((error) => log("job.error", { job_id: jobId, code: error.code, error: error.details || error.message }))
      .finally(() => {
        this.held.delete(jobId);
        this.running.delete(run);
        const wake = this.slotFreed;
        this.slotFreed = null;
        if (wake) wake();
      });
    this.running.add(run);
  }

  async runJob(claimed) {
    const result = await handler(claimed);
    await this.call("Complete", { jobId: claimed.job.id, leaseToken: claimed.leaseToken, result: toStruct(result) });
  }

  scheduleHeartbeat() {
    this.heartbeatTimer = setTimeout(() => this.heartbeat().finally(() => this.scheduleHeartbeat()), this.heartbeatMs);
  }

  // One call for every lease this process holds.
  async heartbeat() {
    const leases = [...this.held].map(([jobId, leaseToken]) => ({ jobId, leaseToken }));
    if (!leases.length) return;
    try {
      await this.call("Heartbeat", { leases });
    } catch (error) {
      log("worker.heartbeat_failed", { code: grpc.status[error.code] || error.code });
    }
  }

  async stop() {
    if (this.stopping) return;
    this.stopping = true;
    if (this.claimCall) this.claimCall.cancel(); // an abandoned poll takes no job with it
    const wake = this.slotFreed;
    this.slotFreed = null;
    if (wake) wake();
    await Promise.allSettled([...this.running]);
    clearTimeout(this.heartbeatTimer);
  }
}

async function handler() {
  return {};
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const token = process.env.LEASEHOLD_WORKER_TOKEN;
  if (!token) throw new Error("LEASEHOLD_WORKER_TOKEN is not set");
  const leasehold = loadLeasehold();
  const client = new leasehold.WorkerService(args.server, channelCredentials());
  const worker = new Worker(client, token, args);
  for (const signal of ["SIGINT", "SIGTERM"]) {
    process.on(signal, () => worker.stop().then(() => process.exit(0)));
  }
  await worker.start();
  await worker.stop();
  client.close();
  log("worker.stopped");
}

main().catch((error) => {
  console.error(`unary-worker: ${error.details || error.message}`);
  process.exit(2);
});
