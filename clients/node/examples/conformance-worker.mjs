// The conformance handler (docs/protocol.md, Conformance) on the TypeScript
// SDK, for `leasehold worker-conformance -- node clients/node/examples/conformance-worker.mjs`.
// It reads LEASEHOLD_SERVER, LEASEHOLD_WORKER_TOKEN and LEASEHOLD_KIND, which
// the tool sets; build the package first (npm run build).
import { setTimeout as sleep } from "node:timers/promises";
import { Worker } from "../dist/index.js";

const worker = new Worker({ server: process.env.LEASEHOLD_SERVER ?? "127.0.0.1:50051" });

worker.handle(process.env.LEASEHOLD_KIND ?? "conformance.run", async (job, ctx) => {
  // Read before saving: the result says where this attempt began.
  const resumedFrom = ctx.lastCheckpoint ?? null;
  const { sleep_ms: sleepMs = 0, echo = null, checkpoint } = job.payload;
  if (checkpoint !== undefined) await ctx.checkpoint(checkpoint);
  // Rejects when the signal aborts (a cancel or a lost lease): the worker then
  // sends ConfirmCancel for a cancel and nothing for a lost lease.
  await sleep(sleepMs, undefined, { signal: ctx.signal });
  return { echo, resumed_from: resumedFrom };
});

await worker.run(); // until SIGTERM: stops claiming, lets the running job finish
