// Starting `soldaemon serve` and waiting for its ready line. No `vscode`
// import (the integration test starts the real daemon with this code).
//
// The daemon prints exactly one line on stdout once it serves:
//   soldaemon ready on ws://127.0.0.1:8765 model=… device=… token file: /path/token
// Logs go to stderr. A start-up failure ends the process with a message
//   soldaemon: error [code]: what is wrong
//     hint: what to do
// on stderr, which is what we report.

import { ChildProcess, spawn } from "child_process";
import { DaemonError } from "./daemonClient";

export interface ReadyInfo {
    url: string;
    tokenFile: string;
}

const READY_RE = /^soldaemon ready on (\S+)\s.*?token file: (.+?)\s*$/;

export function parseReadyLine(line: string): ReadyInfo | undefined {
    const m = READY_RE.exec(line);
    return m ? { url: m[1], tokenFile: m[2] } : undefined;
}

export interface StartOptions {
    /** The executable: `soldaemon`, or a path. */
    command: string;
    /** Arguments after the command; `serve` is added when missing. */
    args?: string[];
    env?: NodeJS.ProcessEnv;
    cwd?: string;
    /** How long to wait for the ready line (model loading can be slow). */
    timeoutMs: number;
    /** Every line the daemon writes (stdout and stderr). */
    onLog?: (line: string, stream: "stdout" | "stderr") => void;
}

export interface ExitInfo {
    code: number | null;
    signal: NodeJS.Signals | null;
}

export interface StartedDaemon extends ReadyInfo {
    process: ChildProcess;
    pid: number;
    readyLine: string;
    /** Settles when the process ends. */
    exited: Promise<ExitInfo>;
    /** SIGTERM (the daemon drains), then SIGKILL after `graceMs`. */
    stop(graceMs?: number): Promise<ExitInfo>;
}

/** Split a stream into lines, calling `onLine` for each. */
function lines(stream: NodeJS.ReadableStream | null, onLine: (line: string) => void): void {
    if (!stream) {
        return;
    }
    let buf = "";
    stream.setEncoding?.("utf8");
    stream.on("data", (chunk: string | Buffer) => {
        buf += chunk.toString();
        // Progress bars use \r: treat it as a line end too.
        const parts = buf.split(/\r?\n|\r/);
        buf = parts.pop() ?? "";
        for (const p of parts) {
            if (p.length) onLine(p);
        }
    });
    stream.on("end", () => {
        if (buf.length) onLine(buf);
        buf = "";
    });
}

/** The lines worth showing from a failed start: the CLI's error and hint if
 * it printed one, else the last few stderr lines. */
export function summarizeFailure(stderrTail: string[]): string {
    const i = stderrTail.findIndex((l) => l.startsWith("soldaemon: error"));
    const chosen = i >= 0 ? stderrTail.slice(i, i + 4) : stderrTail.slice(-4);
    return chosen.join("\n").trim();
}

export function startDaemon(opts: StartOptions): Promise<StartedDaemon> {
    const args = [...(opts.args ?? [])];
    if (!args.includes("serve")) {
        args.unshift("serve");
    }
    return new Promise<StartedDaemon>((resolve, reject) => {
        let child: ChildProcess;
        try {
            child = spawn(opts.command, args, {
                cwd: opts.cwd,
                env: opts.env ?? process.env,
                stdio: ["ignore", "pipe", "pipe"],
                windowsHide: true,
            });
        } catch (e) {
            reject(notInstalled(opts.command, e));
            return;
        }
        const stderrTail: string[] = [];
        let settled = false;
        let exitInfo: ExitInfo | undefined;
        const exited = new Promise<ExitInfo>((res) => {
            child.on("exit", (code, signal) => {
                exitInfo = { code, signal };
                res(exitInfo);
            });
        });
        const stop = async (graceMs = 6000): Promise<ExitInfo> => {
            if (exitInfo) return exitInfo;
            child.kill("SIGTERM");
            const timer = setTimeout(() => child.kill("SIGKILL"), graceMs);
            const info = await exited;
            clearTimeout(timer);
            return info;
        };
        const timer = setTimeout(() => {
            if (settled) return;
            settled = true;
            void stop(2000);
            reject(new DaemonError("start_timeout",
                `soldaemon did not become ready within ${Math.round(opts.timeoutMs / 1000)} s`, true,
                "loading a model for the first time can take long; see the log (soldaemon: Open Logs), "
                + "or raise soldaemon.startTimeoutSeconds"));
        }, opts.timeoutMs);
        child.on("error", (e: NodeJS.ErrnoException) => {
            if (settled) return;
            settled = true;
            clearTimeout(timer);
            reject(e.code === "ENOENT" ? notInstalled(opts.command, e)
                : new DaemonError("start_failed", `cannot run ${opts.command}: ${e.message}`, false));
        });
        lines(child.stderr, (line) => {
            stderrTail.push(line);
            if (stderrTail.length > 40) stderrTail.shift();
            opts.onLog?.(line, "stderr");
        });
        lines(child.stdout, (line) => {
            opts.onLog?.(line, "stdout");
            const ready = parseReadyLine(line);
            if (ready && !settled) {
                settled = true;
                clearTimeout(timer);
                resolve({ ...ready, process: child, pid: child.pid ?? -1, readyLine: line, exited, stop });
            }
        });
        void exited.then((info) => {
            if (settled) return;
            settled = true;
            clearTimeout(timer);
            // Give the stderr pipe a moment to deliver its last lines.
            setTimeout(() => {
                const why = summarizeFailure(stderrTail);
                const how = info.code !== null ? `code ${info.code}` : `signal ${info.signal}`;
                reject(new DaemonError("start_failed",
                    `soldaemon serve exited (${how}) before it was ready${why ? `:\n${why}` : ""}`, false,
                    "run `soldaemon doctor` in a terminal to see what is missing"));
            }, 50);
        });
    });
}

function notInstalled(command: string, e: unknown): DaemonError {
    return new DaemonError("not_installed", `cannot run '${command}': ${e instanceof Error ? e.message : String(e)}`, false,
        "install soldaemon (pip install soldaemon) or set soldaemon.command to the full path of the soldaemon executable");
}
