// A Leasehold worker in Node.js: runs jobs of one kind over WorkerService.
//
//   LEASEHOLD_WORKER_TOKEN=... node worker.js [--kind KIND] [--concurrency N]
//
// The work is steered by the payload: {"steps": N, "step_ms": M} appends N
// `progress` events {"step": i}, M ms apart, then completes with the result
// {"processed": N}. It shows every rule a worker in any language must follow:
//   - one long-poll Claim for as many jobs as it has free slots;
//   - one Heartbeat for every lease it holds, every heartbeat_interval_seconds;
//   - a `cancel_requested` heartbeat state means: stop, then ConfirmCancel;
//   - `lost`, or ABORTED from any write, means: stop at once, write nothing more;
//   - on SIGINT/SIGTERM: stop claiming, let running jobs finish for a grace
//     period, then Snooze what is left so nothing waits out its lease.
// LEASEHOLD_SERVER (default 127.0.0.1:50051) says where the server is;
// LEASEHOLD_TLS_CA (a CA's PEM file) connects over TLS instead of plaintext.
"use strict";

const os = require("node:os");
const { grpc, channelCredentials, loadLeasehold, toStruct, fromStruct } = require("../node-common/leasehold.js");

const PROTOCOL_VERSION = 1;
const CLAIM_WAIT_SECONDS = 20;
const STOP_GRACE_MS = 5_000;
const RECONNECT_MS = 500;

function parseArgs(argv) {
  const args = { kind: "node.steps", concurrency: 4 };
  for (let i = 0; i < argv.length; i += 1) {
    if (argv[i] === "--kind") args.kind = argv[++i];
    else if (argv[i] === "--concurrency") args.concurrency = Number(argv[++i]);
    else throw new Error(`unknown argument ${argv[i]}`);
  }
  return args;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

class Aborted extends Error {}

class Worker {
  constructor(client, token, { kind, concurrency }) {
    this.client = client;
    this.kind = kind;
    this.concurrency = concurrency;
    this.workerId = `node-${os.hostname()}-${process.pid}`;
    this.metadata = new grpc.Metadata();
    this.metadata.set("authorization", `Bearer ${token}`);
    this.held = new Map(); // job id -> { token, cancelRequested, lost }
    this.running = new Set(); // promises of running jobs
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

  // A write for a job this worker holds; ABORTED means the lease is gone.
  async write(method, jobId, fields = {}) {
    const lease = this.held.get(jobId);
    if (!lease || lease.lost) throw new Aborted(jobId);
    try {
      return await this.call(method, { jobId, leaseToken: lease.token, ...fields });
    } catch (error) {
      if (error.code === grpc.status.ABORTED) {
        lease.lost = true;
        throw new Aborted(jobId);
      }
      throw error;
    }
  }

  async start() {
    const info = await this.call("GetServerInfo", {});
    if (info.protocolVersion !== PROTOCOL_VERSION) {
      throw new Error(`server speaks WorkerService protocol ${info.protocolVersion}, this worker ${PROTOCOL_VERSION}`);
    }
    log("worker.started", { worker_id: this.workerId, kind: this.kind, server_version: info.serverVersion });
    this.scheduleHeartbeat();
    while (!this.stopping) {
      const free = this.concurrency - this.running.size;
      if (free <= 0) {
        await Promise.race(this.running);
        continue;
      }
      let jobs;
      try {
        ({ jobs } = await this.call(
          "Claim",
          { workerId: this.workerId, kinds: [this.kind], maxJobs: free, waitSeconds: CLAIM_WAIT_SECONDS },
          (CLAIM_WAIT_SECONDS + 10) * 1000,
        ));
      } catch (error) {
        if (this.stopping) break;
        if (error.code === grpc.status.UNAUTHENTICATED || error.code === grpc.status.INVALID_ARGUMENT) throw error;
        log("worker.claim_failed", { code: grpc.status[error.code] || error.code });
        await sleep(RECONNECT_MS); // the server may be restarting
        continue;
      }
      for (const claimed of jobs) this.launch(claimed);
    }
  }

  launch(claimed) {
    const jobId = claimed.job.id;
    this.held.set(jobId, { token: claimed.leaseToken, cancelRequested: false, lost: false });
    this.heartbeatMs = Math.max(200, claimed.heartbeatIntervalSeconds * 1000);
    const run = this.runJob(claimed)
      .catch((error) => {
        if (error instanceof Aborted) log("job.lease_lost", { job_id: jobId });
        else log("job.error", { job_id: jobId, error: error.message });
      })
      .finally(() => {
        this.held.delete(jobId);
        this.running.delete(run);
      });
    this.running.add(run);
  }

  async runJob(claimed) {
    const jobId = claimed.job.id;
    const lease = this.held.get(jobId);
    const payload = fromStruct(claimed.payload);
    const steps = Number(payload.steps ?? 3);
    const stepMs = Number(payload.step_ms ?? 100);
    log("job.started", { job_id: jobId, attempt: claimed.job.attempt });
    for (let step = 1; step <= steps; step += 1) {
      if (lease.lost) throw new Aborted(jobId);
      if (lease.cancelRequested || claimed.job.cancelRequestedAt) {
        await this.write("ConfirmCancel", jobId);
        log("job.cancelled", { job_id: jobId, at_step: step });
        return;
      }
      if (this.stopping && lease.snoozeNow) {
        await this.write("Snooze", jobId, { delaySeconds: 1 });
        log("job.snoozed", { job_id: jobId });
        return;
      }
      await this.write("AppendEvent", jobId, { type: "progress", payload: toStruct({ step }) });
      await sleep(stepMs);
    }
    const { job } = await this.write("Complete", jobId, { result: toStruct({ processed: steps }) });
    log("job.completed", { job_id: jobId, status: job.status });
  }

  scheduleHeartbeat() {
    this.heartbeatTimer = setTimeout(() => this.heartbeat().finally(() => this.scheduleHeartbeat()), this.heartbeatMs);
  }

  // One call for every lease this process holds.
  async heartbeat() {
    const leases = [...this.held].map(([jobId, lease]) => ({ jobId, leaseToken: lease.token }));
    if (!leases.length) return;
    try {
      const { states } = await this.call("Heartbeat", { leases });
      for (const state of states) {
        const lease = this.held.get(state.jobId);
        if (!lease) continue;
        lease.cancelRequested = state.cancelRequested;
        if (state.lost) lease.lost = true;
      }
    } catch (error) {
      log("worker.heartbeat_failed", { code: grpc.status[error.code] || error.code });
    }
  }

  async stop() {
    if (this.stopping) return;
    this.stopping = true;
    log("worker.stopping", { running: this.running.size });
    if (this.claimCall) this.claimCall.cancel(); // an abandoned poll takes no job with it
    const finished = Promise.allSettled([...this.running]);
    const graceOver = sleep(STOP_GRACE_MS).then(() => "grace over");
    if ((await Promise.race([finished, graceOver])) === "grace over") {
      for (const lease of this.held.values()) lease.snoozeNow = true;
      await finished;
    }
    clearTimeout(this.heartbeatTimer);
  }
}

function log(event, fields = {}) {
  console.error(JSON.stringify({ event, ...fields }));
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const token = process.env.LEASEHOLD_WORKER_TOKEN;
  if (!token) throw new Error("LEASEHOLD_WORKER_TOKEN is not set");
  const leasehold = loadLeasehold();
  const server = process.env.LEASEHOLD_SERVER || "127.0.0.1:50051";
  const client = new leasehold.WorkerService(server, channelCredentials());
  const worker = new Worker(client, token, args);
  for (const signal of ["SIGINT", "SIGTERM"]) {
    process.on(signal, () => worker.stop().then(() => process.exit(0)));
  }
  await worker.start();
  await worker.stop();
  client.close();
}

main().catch((error) => {
  console.error(`node-worker: ${error.details || error.message}`);
  process.exit(2);
});
