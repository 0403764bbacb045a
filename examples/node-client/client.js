// Enqueue a job and watch its events, resuming after a deliberate disconnect.
//
//   node client.js KIND [PAYLOAD_JSON] [--disconnect-after N]
//
// Prints one JSON line per event ({"sequence", "type", "payload"}), a
// {"disconnected": ...} line where it hangs up and resumes, and finally
// {"status", "result"}. Exits 0 when the job succeeded.
// LEASEHOLD_SERVER (default 127.0.0.1:50051) and LEASEHOLD_OWNER (the x-owner-id
// header, default "node-example") say where and who; LEASEHOLD_TOKEN (a token or
// JWT, for serve --auth token|jwt) replaces the header, and LEASEHOLD_TLS_CA (a
// CA's PEM file) connects over TLS instead of plaintext.
"use strict";

const { grpc, channelCredentials, loadLeasehold, toStruct, fromStruct } = require("../node-common/leasehold.js");

const TERMINAL = new Set(["job.succeeded", "job.failed", "job.cancelled"]);

function parseArgs(argv) {
  const args = { kind: undefined, payload: {}, disconnectAfter: 2 };
  const rest = [...argv];
  while (rest.length) {
    const arg = rest.shift();
    if (arg === "--disconnect-after") args.disconnectAfter = Number(rest.shift());
    else if (args.kind === undefined) args.kind = arg;
    else args.payload = JSON.parse(arg);
  }
  if (!args.kind) throw new Error("usage: node client.js KIND [PAYLOAD_JSON] [--disconnect-after N]");
  return args;
}

function unary(client, method, request, metadata) {
  return new Promise((resolve, reject) => {
    client[method](request, metadata, { deadline: Date.now() + 10_000 }, (error, response) =>
      error ? reject(error) : resolve(response),
    );
  });
}

// Follow the job's events after `afterSequence`. Resolves with the last sequence
// seen and whether the log ended (the terminal event arrived, the server closed
// the stream) or this side hung up after `hangUpAfter` events.
function watch(client, metadata, jobId, afterSequence, hangUpAfter) {
  return new Promise((resolve, reject) => {
    const call = client.WatchEvents({ jobId, afterSequence: String(afterSequence) }, metadata);
    let last = afterSequence;
    let received = 0;
    let hungUp = false;
    call.on("data", ({ event }) => {
      const sequence = Number(event.sequence);
      if (sequence !== last + 1) {
        reject(new Error(`gap or duplicate: got ${sequence} after ${last}`));
        call.cancel();
        return;
      }
      last = sequence;
      received += 1;
      console.log(JSON.stringify({ sequence, type: event.type, payload: fromStruct(event.payload) }));
      if (!TERMINAL.has(event.type) && received === hangUpAfter) {
        hungUp = true;
        call.cancel(); // a deliberate disconnect, as a network failure would be
      }
    });
    call.on("error", (error) => {
      if (hungUp && error.code === grpc.status.CANCELLED) resolve({ last, ended: false });
      else reject(error);
    });
    call.on("end", () => {
      if (!hungUp) resolve({ last, ended: true });
    });
  });
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const leasehold = loadLeasehold();
  const server = process.env.LEASEHOLD_SERVER || "127.0.0.1:50051";
  const client = new leasehold.JobService(server, channelCredentials());
  const metadata = new grpc.Metadata();
  if (process.env.LEASEHOLD_TOKEN) {
    metadata.set("authorization", `Bearer ${process.env.LEASEHOLD_TOKEN}`);
  } else {
    metadata.set("x-owner-id", process.env.LEASEHOLD_OWNER || "node-example");
  }

  const { job } = await unary(
    client,
    "Enqueue",
    { kind: args.kind, payload: toStruct(args.payload) },
    metadata,
  );
  let position = { last: 0, ended: false };
  let hangUpAfter = args.disconnectAfter;
  while (!position.ended) {
    position = await watch(client, metadata, job.id, position.last, hangUpAfter);
    if (!position.ended) {
      // Resume exactly where we left off: the server replays what we missed.
      console.log(JSON.stringify({ disconnected: true, resume_after_sequence: position.last }));
      hangUpAfter = 0; // no more disconnects
    }
  }
  const { job: done } = await unary(client, "Get", { jobId: job.id }, metadata);
  console.log(JSON.stringify({ status: done.status, result: done.result ? fromStruct(done.result) : null }));
  client.close();
  process.exitCode = done.status === "JOB_STATUS_SUCCEEDED" ? 0 : 1;
}

main().catch((error) => {
  console.error(`node-client: ${error.message}`);
  process.exitCode = 2;
});
