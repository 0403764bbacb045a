// The bench's TypeScript worker: the built @leasehold/client package (clients/node/dist), as a
// user writes it (README, "A worker"), running a no-op handler. Options left at their defaults
// but the server, the kind and the concurrency.
//
//   LEASEHOLD_WORKER_TOKEN=... node bench/node/sdk_worker.mjs --server HOST:PORT --kind KIND --concurrency N
//
// Logs JSON lines on stderr; `{"event": "worker.started"}` once GetServerInfo has answered and
// the claim loop is about to send its first long poll (the bench waits for it). SIGINT stops it
// gracefully (the SDK's own signal handling).
import { Worker } from "../../clients/node/dist/index.js";

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

const log = (event, fields = {}) => console.error(JSON.stringify({ event, ...fields }));

const args = parseArgs(process.argv.slice(2));
const worker = new Worker({
  server: args.server,
  concurrency: args.concurrency,
  logger: {
    // "connected" comes once, right before the first Claim.
    info: (message, fields) => log(message === "connected" ? "worker.started" : `sdk.${message}`, fields),
    warn: (message, fields) => log(`sdk.warn.${message}`, fields),
    error: (message, fields) => log(`sdk.error.${message}`, fields),
  },
});
worker.handle(args.kind, async () => ({}));
await worker.run();
log("worker.stopped");
process.exit(0); // the transport's HTTP/2 session would keep the process alive
