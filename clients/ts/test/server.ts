// Starts the real retryd binary for the TypeScript tests: builds cmd/retryd
// from the repository root (found by walking up to go.mod), runs
// `retryd serve` on a free loopback port, reads the address from its JSON
// "serving" log line, and stops it by PID.

import { execFile, spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const execFileAsync = promisify(execFile);

/** The directory holding the module's go.mod and cmd/retryd. */
export function repoRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    if (existsSync(join(dir, "go.mod")) && existsSync(join(dir, "cmd", "retryd"))) {
      return dir;
    }
    const parent = dirname(dir);
    if (parent === dir) {
      throw new Error("repository root (go.mod with cmd/retryd) not found above " + fileURLToPath(import.meta.url));
    }
    dir = parent;
  }
}

let built: Promise<{ bin: string; dir: string }> | undefined;

// buildRetryd builds cmd/retryd once per test process.
function buildRetryd(): Promise<{ bin: string; dir: string }> {
  built ??= (async () => {
    const dir = mkdtempSync(join(tmpdir(), "retryd-ts-"));
    const bin = join(dir, "retryd");
    try {
      await execFileAsync("go", ["build", "-o", bin, "./cmd/retryd"], { cwd: repoRoot(), maxBuffer: 16 << 20 });
    } catch (err) {
      rmSync(dir, { recursive: true, force: true });
      throw new Error(`go build ./cmd/retryd: ${String(err)}`);
    }
    process.once("exit", () => rmSync(dir, { recursive: true, force: true }));
    return { bin, dir };
  })();
  return built;
}

/**
 * Runs `retryd verify --file -` over an event log given as proto-JSON
 * lines (toJsonString of each Event), for a server `retryd verify
 * --server` cannot read (one with authentication); throws on a violation.
 */
export async function verifyEventLines(lines: string[]): Promise<string> {
  const { bin } = await buildRetryd();
  const child = spawn(bin, ["verify", "--file", "-"], { stdio: ["pipe", "pipe", "pipe"] });
  let out = "";
  child.stdout.on("data", (b: Buffer) => (out += b.toString()));
  child.stderr.on("data", (b: Buffer) => (out += b.toString()));
  const exited = new Promise<number | null>((resolve) => child.once("close", (code) => resolve(code)));
  child.stdin.end(lines.map((l) => l + "\n").join(""));
  const code = await exited;
  if (code !== 0 || !/ 0 violations$/m.test(out)) {
    throw new Error(`retryd verify --file - (exit ${code}):\n${out}`);
  }
  return out.trim();
}

/** A running retryd process. */
export interface RetrydServer {
  /** The gRPC address it serves on, host:port. */
  addr: string;
  /** What it logged so far. */
  logs(): string;
  /** Runs `retryd verify --server` over its event log; throws on a violation. */
  verify(): Promise<string>;
  /** Stops it (SIGTERM, SIGKILL after 15 s) by PID and waits for the exit. */
  stop(): Promise<void>;
  /** Kills it at once (SIGKILL, no graceful stop) by PID and waits for the exit. */
  kill(): Promise<void>;
}

/**
 * Starts `retryd serve --listen 127.0.0.1:0 --log-format json` with extra
 * args (a later `--listen ADDR` among them wins, to restart on an address).
 */
export async function startRetryd(...args: string[]): Promise<RetrydServer> {
  const { bin } = await buildRetryd();
  const child = spawn(bin, ["serve", "--listen", "127.0.0.1:0", "--log-format", "json", ...args], {
    stdio: ["ignore", "ignore", "pipe"],
  });
  const pid = child.pid;
  if (pid === undefined) {
    throw new Error("retryd did not start");
  }
  let logs = "";
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  const addr = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`retryd did not serve within 30s\n${logs}`)), 30_000);
    const lines = createInterface({ input: child.stderr });
    lines.on("line", (line) => {
      logs += line + "\n";
      try {
        const rec = JSON.parse(line) as { msg?: string; addr?: string };
        if (rec.msg === "serving" && typeof rec.addr === "string") {
          clearTimeout(timer);
          resolve(rec.addr);
        }
      } catch {
        // not a JSON line
      }
    });
    void exited.then(() => {
      clearTimeout(timer);
      reject(new Error(`retryd exited before serving\n${logs}`));
    });
  });
  let stopped: Promise<void> | undefined;
  return {
    addr,
    logs: () => logs,
    async verify() {
      const { stdout } = await execFileAsync(bin, ["verify", "--server", addr]).catch((err: { stdout?: string; stderr?: string }) => {
        throw new Error(`retryd verify --server ${addr} failed:\n${err.stdout ?? ""}${err.stderr ?? ""}`);
      });
      if (!/ 0 violations$/m.test(stdout)) {
        throw new Error(`retryd verify: ${stdout}`);
      }
      return stdout.trim();
    },
    kill() {
      stopped ??= (async () => {
        if (child.exitCode !== null || child.signalCode !== null) {
          return;
        }
        process.kill(pid, "SIGKILL");
        await exited;
      })();
      return stopped;
    },
    stop() {
      stopped ??= (async () => {
        if (child.exitCode !== null || child.signalCode !== null) {
          return;
        }
        process.kill(pid, "SIGTERM");
        const killer = setTimeout(() => process.kill(pid, "SIGKILL"), 15_000);
        await exited;
        clearTimeout(killer);
      })();
      return stopped;
    },
  };
}
