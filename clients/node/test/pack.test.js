// The tarball `npm pack` makes is the package users get: install it into an
// empty project and use it from there, against a real server.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { after, test } from "node:test";
import { OWNER, Server, WORKER_TOKEN } from "./server.js";

const packageDir = fileURLToPath(new URL("..", import.meta.url));
const npm = process.platform === "win32" ? "npm.cmd" : "npm";
const dirs = [];
let server;

after(async () => {
  await server?.close();
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

test("the packed tarball installs into an empty project and runs a job there", async () => {
  const packDir = mkdtempSync(join(tmpdir(), "leasehold-pack-"));
  const appDir = mkdtempSync(join(tmpdir(), "leasehold-app-"));
  dirs.push(packDir, appDir);
  // dist/ is built by `npm run build` before `npm test`.
  execFileSync(npm, ["pack", "--ignore-scripts", "--pack-destination", packDir], { cwd: packageDir, stdio: "pipe" });
  const [tarball] = readdirSync(packDir).filter((name) => name.endsWith(".tgz"));
  assert.ok(tarball, "npm pack made no tarball");
  const size = statSync(join(packDir, tarball)).size;
  assert.ok(size < 200_000, `the tarball is ${size} bytes`);
  writeFileSync(join(appDir, "package.json"), JSON.stringify({ name: "app", private: true, type: "module" }));
  execFileSync(npm, ["install", "--no-audit", "--no-fund", "--prefer-offline", join(packDir, tarball)], {
    cwd: appDir,
    stdio: "pipe",
  });
  server = await new Server().start();
  writeFileSync(
    join(appDir, "main.js"),
    `import { Client, Worker } from "@leasehold/client";
const client = new Client({ server: process.argv[2], ownerId: "${OWNER}" });
const worker = new Worker({ server: process.argv[2], token: "${WORKER_TOKEN}", handleSignals: false });
worker.handle("ts.packed", async (job) => ({ doubled: job.payload.n * 2 }));
const running = worker.run();
const { job } = await client.enqueue({ kind: "ts.packed", payload: { n: 21 } });
for await (const event of client.watch(job.id)) void event;
console.log(JSON.stringify((await client.get(job.id)).result));
await worker.stop();
await running;
`,
  );
  const out = execFileSync(process.execPath, ["main.js", server.address], { cwd: appDir, encoding: "utf8" });
  assert.deepEqual(JSON.parse(out.trim()), { doubled: 42 });
});
