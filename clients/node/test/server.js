// Starts a real `leasehold serve` for the tests: the command is
// LEASEHOLD_SERVE_COMMAND (split on spaces) or `leasehold` from PATH; it
// listens on a free loopback port, on a fresh SQLite file, and serves the
// `ts.*` and `media.*` (the README's) kinds to remote workers with the test's worker token.
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";

export const WORKER_TOKEN = "ts-sdk-test-worker-token-0123456789";
export const OWNER = "ts-owner";

export class Server {
  constructor(extraArgs = []) {
    this.dir = mkdtempSync(join(tmpdir(), "leasehold-ts-"));
    this.extraArgs = extraArgs;
    this.port = 0;
    this.output = [];
  }

  get address() {
    return `127.0.0.1:${this.port}`;
  }

  /** Starts (or restarts, on the same port and database) the server. */
  async start() {
    const [command, ...prefix] = (process.env.LEASEHOLD_SERVE_COMMAND ?? "leasehold").split(" ");
    const args = [
      ...prefix,
      "serve",
      "--database-url",
      `sqlite+aiosqlite:///${join(this.dir, "leasehold.db")}`,
      "--listen",
      `127.0.0.1:${this.port}`,
      "--remote-kinds",
      "ts.*",
      "media.*",
      "--lease-seconds",
      "6",
      "--cancel-grace-seconds",
      "30",
      ...this.extraArgs,
    ];
    this.process = spawn(command, args, {
      env: { ...process.env, LEASEHOLD_WORKER_TOKEN: WORKER_TOKEN },
      stdio: ["ignore", "pipe", "pipe"],
    });
    const exited = new Promise((resolve) => this.process.once("exit", resolve));
    this.exited = exited;
    const started = new Promise((resolve, reject) => {
      // The server logs JSON lines (to stderr or stdout): read both.
      const onLine = (line) => {
        this.output.push(line);
        try {
          const record = JSON.parse(line);
          if (record.event === "server.started") resolve(Number(record.port));
        } catch {
          // not a log record
        }
      };
      createInterface({ input: this.process.stdout }).on("line", onLine);
      createInterface({ input: this.process.stderr }).on("line", onLine);
      exited.then((code) =>
        reject(new Error(`leasehold serve exited (${code}):\n${this.output.slice(-30).join("\n")}`)),
      );
    });
    const timeout = new Promise((_, reject) =>
      setTimeout(() => reject(new Error("leasehold serve did not start in 30 s")), 30_000).unref(),
    );
    this.port = await Promise.race([started, timeout]);
    return this;
  }

  async stop(signal = "SIGTERM") {
    if (this.process && this.process.exitCode === null && this.process.signalCode === null) {
      this.process.kill(signal);
      await this.exited;
    }
  }

  async close() {
    await this.stop("SIGKILL");
    rmSync(this.dir, { recursive: true, force: true });
  }
}
