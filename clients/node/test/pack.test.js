// The tarball `npm pack` makes is the package users get: install it into an
// empty project and use it from there, against a real server.
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from "node:fs";
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

/** The README's ```ts block whose first line is `firstLine`. */
function readmeBlock(readme, firstLine) {
  const blocks = [...readFileSync(readme, "utf8").matchAll(/```ts\n([\s\S]*?)```/g)]
    .map((m) => m[1])
    .filter((block) => block.startsWith(`${firstLine}\n`));
  assert.equal(blocks.length, 1, `${readme}: one block starting ${firstLine}`);
  return blocks[0];
}

let appDir;

test("the packed tarball installs into an empty project and runs a job there", async () => {
  const packDir = mkdtempSync(join(tmpdir(), "leasehold-pack-"));
  appDir = mkdtempSync(join(tmpdir(), "leasehold-app-"));
  dirs.push(packDir, appDir);
  // dist/ is built by `npm run build` before `npm test`.
  execFileSync(npm, ["pack", "--ignore-scripts", "--pack-destination", packDir], {
    cwd: packageDir,
    stdio: "pipe",
  });
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

test("the README's worker, client, graph and feed, compiled against the installed package, run a job", async () => {
  assert.ok(appDir, "needs the project the tarball was installed into");
  const worker = readmeBlock(join(packageDir, "README.md"), "// worker.ts");
  const readmeWorker = readmeBlock(join(packageDir, "..", "..", "README.md"), "// worker.ts");
  assert.equal(readmeWorker, worker, "the repository README shows the same worker");
  assert.ok(worker.trimEnd().split("\n").length <= 20, "the worker example is 20 lines at most");
  writeFileSync(join(appDir, "worker.ts"), worker);
  writeFileSync(join(appDir, "client.ts"), readmeBlock(join(packageDir, "README.md"), "// client.ts"));
  // Compiled only: they show the types of a graph's enqueue and its handler, and of a feed.
  writeFileSync(join(appDir, "graph.ts"), readmeBlock(join(packageDir, "README.md"), "// graph.ts"));
  writeFileSync(join(appDir, "feed.ts"), readmeBlock(join(packageDir, "README.md"), "// feed.ts"));
  writeFileSync(
    join(appDir, "db.ts"),
    `interface Tx {
  setThumbnailStatus(resourceId: string, type: string, payload: object): Promise<void>;
  setFeedPosition(position: string): Promise<void>;
}
export const db = {
  async feedPosition(): Promise<string | undefined> {
    return undefined;
  },
  async transaction(body: (tx: Tx) => Promise<void>): Promise<void> {
    await body({ async setThumbnailStatus() {}, async setFeedPosition() {} });
  },
};
`,
  );
  writeFileSync(
    join(appDir, "thumbnails.ts"),
    `export async function makeThumbnail(url: string, width: number, signal: AbortSignal): Promise<string> {
  signal.throwIfAborted();
  return \`\${url}?w=\${width}\`;
}
`,
  );
  writeFileSync(
    join(appDir, "tsconfig.json"),
    JSON.stringify({
      compilerOptions: {
        target: "ES2022",
        module: "NodeNext",
        moduleResolution: "NodeNext",
        strict: true,
        // A Node.js app has @types/node; borrow ours.
        typeRoots: [join(packageDir, "node_modules", "@types")],
        types: ["node"],
      },
      files: ["worker.ts", "client.ts", "graph.ts", "feed.ts", "db.ts", "thumbnails.ts"],
    }),
  );
  try {
    execFileSync(
      process.execPath,
      [join(packageDir, "node_modules", "typescript", "bin", "tsc"), "-p", appDir],
      {
        cwd: appDir,
        encoding: "utf8",
      },
    );
  } catch (error) {
    assert.fail(`the README's examples do not compile:\n${error.stdout}`);
  }
  const env = { ...process.env, LEASEHOLD_SERVER: server.address, LEASEHOLD_WORKER_TOKEN: WORKER_TOKEN };
  const workerProcess = spawn(process.execPath, ["worker.js"], { cwd: appDir, env, stdio: "inherit" });
  const exited = new Promise((resolve) => workerProcess.once("exit", (code) => resolve(code)));
  try {
    const out = execFileSync(process.execPath, ["client.js"], { cwd: appDir, env, encoding: "utf8" });
    // Struct members come back in no particular order: look for each one.
    const lines = out.trimEnd().split("\n");
    assert.deepEqual(
      lines.slice(0, 5).map((line) => line.split(" ").slice(0, 2).join(" ")),
      ["1 job.queued", "2 job.started", "3 progress", "4 progress", "5 job.succeeded"],
    );
    assert.ok(
      lines[2].includes("width: 64") && lines[2].includes("thumbnail: 'https://example.com/cat.png?w=64'"),
    );
    assert.ok(lines[3].includes("width: 128"));
    assert.ok(lines[5].startsWith("succeeded {") && lines[5].includes("widths: [ 64, 128 ]"), lines[5]);
  } finally {
    workerProcess.kill("SIGTERM");
  }
  assert.equal(await exited, 0);
});
