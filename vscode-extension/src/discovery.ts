// Finding the daemon: which URL, which token file. No `vscode` import.
//
// Order (first that applies):
//   1. the `soldaemon.endpoint` setting, when set;
//   2. the running daemon's record, `<state dir>/daemon.json`
//      ({pid, url, token_file}, written by `soldaemon serve` once it is
//      ready and removed when it exits), when its pid is alive;
//   3. the daemon's default address, ws://127.0.0.1:8765.
// The token file is the `soldaemon.tokenFile` setting, else the record's,
// else `<state dir>/token`. The state dir follows the daemon's rules
// (soldaemon/paths.py): $SOLDAEMON_STATE_DIR, else
// $XDG_STATE_HOME/soldaemon, else ~/.local/state/soldaemon.
//
// Trust follows the daemon's rules (soldaemon/statefiles.py, auth.py): a
// state dir or daemon.json that another user owns or could write is refused
// (someone could have planted a record naming their port and one of our
// private files as the "token"); a record's URL must be loopback; the token
// file must be a regular file (no symlink) of ours, mode 0600, holding one
// URL-safe token line.

import * as fs from "fs";
import * as os from "os";
import * as path from "path";
import { DaemonError } from "./daemonClient";

export const DEFAULT_URL = "ws://127.0.0.1:8765";

export interface Environment {
    env: NodeJS.ProcessEnv;
    home: string;
}

export function currentEnvironment(): Environment {
    return { env: process.env, home: os.homedir() };
}

export function stateDir(e: Environment = currentEnvironment()): string {
    const override = e.env.SOLDAEMON_STATE_DIR;
    if (override) {
        return override;
    }
    const xdg = e.env.XDG_STATE_HOME;
    return path.join(xdg ? xdg : path.join(e.home, ".local", "state"), "soldaemon");
}

export function defaultTokenFile(e: Environment = currentEnvironment()): string {
    return path.join(stateDir(e), "token");
}

export function daemonRecordFile(e: Environment = currentEnvironment()): string {
    return path.join(stateDir(e), "daemon.json");
}

/** `~` and `${env:VAR}`/`$VAR` are expanded in path settings. */
export function expandPath(p: string, e: Environment = currentEnvironment()): string {
    let out = p.trim();
    if (out === "~" || out.startsWith("~/")) {
        out = path.join(e.home, out.slice(1));
    }
    out = out.replace(/\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)/g,
        (_m, a: string | undefined, b: string | undefined) => e.env[(a ?? b) as string] ?? "");
    return out;
}

export interface DaemonRecord {
    pid: number;
    url: string;
    token_file: string;
}

export function pidAlive(pid: number): boolean {
    if (!Number.isInteger(pid) || pid <= 0) {
        return false;
    }
    try {
        process.kill(pid, 0);
        return true;
    } catch (e) {
        return (e as NodeJS.ErrnoException).code === "EPERM";
    }
}

const TOKEN = /^[A-Za-z0-9_-]{32,512}$/;

function myUid(): number | undefined {
    return typeof process.getuid === "function" ? process.getuid() : undefined;
}

/** Why `st` (of `file`) could have been written by someone else, or undefined. */
function notOurs(file: string, st: fs.Stats, what: string): DaemonError | undefined {
    const uid = myUid();
    if (uid !== undefined && st.uid !== uid) {
        return new DaemonError("unsafe_state", `${what} ${file} belongs to another user (uid ${st.uid})`, false,
            "remove it (as its owner or root), or set SOLDAEMON_STATE_DIR to a private directory");
    }
    if (st.mode & 0o022) {
        return new DaemonError("unsafe_state",
            `${what} ${file} is writable by other users (mode ${(st.mode & 0o777).toString(8)})`, false,
            `run: chmod go-w ${file}`);
    }
    return undefined;
}

/** True for ws://127.x.x.x, ws://localhost, ws://[::1] (any port). */
export function isLoopbackUrl(url: string): boolean {
    let host: string;
    try {
        host = new URL(url).hostname.toLowerCase();
    } catch {
        return false;
    }
    return host === "localhost" || host.endsWith(".localhost") || host === "[::1]"
        || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host);
}

/** The running daemon's record, or undefined when there is none, it is
 * unreadable, or its process is gone. Throws a DaemonError (code
 * `unsafe_state`, with the command that fixes it) when the state dir or the
 * record could have been written by another user, or its URL is not
 * loopback. */
export function readDaemonRecord(e: Environment = currentEnvironment(),
    alive: (pid: number) => boolean = pidAlive): DaemonRecord | undefined {
    const file = daemonRecordFile(e);
    let raw: string;
    try {
        const dirProblem = notOurs(path.dirname(file), fs.statSync(path.dirname(file)), "the state directory");
        const st = fs.lstatSync(file);
        if (dirProblem) throw dirProblem;
        if (!st.isFile()) {
            throw new DaemonError("unsafe_state", `${file} is not a regular file`, false, `run: rm ${file}`);
        }
        const fileProblem = notOurs(file, st, "the daemon record");
        if (fileProblem) throw fileProblem;
        raw = fs.readFileSync(file, "utf8");
    } catch (err) {
        if (err instanceof DaemonError) throw err;
        return undefined;
    }
    try {
        const rec = JSON.parse(raw) as Partial<DaemonRecord>;
        if (typeof rec.pid === "number" && typeof rec.url === "string" && typeof rec.token_file === "string"
            && alive(rec.pid)) {
            if (!isLoopbackUrl(rec.url)) {
                throw new DaemonError("unsafe_state", `${file} names a daemon at ${rec.url}, not a loopback address`,
                    false, `run: rm ${file}  (set soldaemon.endpoint to reach a remote daemon on purpose)`);
            }
            return { pid: rec.pid, url: rec.url, token_file: rec.token_file };
        }
    } catch (err) {
        if (err instanceof DaemonError) throw err;
        // a half-written or foreign file: ignore it
    }
    return undefined;
}

export interface EndpointSettings {
    /** ws:// URL; empty: find it. */
    endpoint: string;
    /** Token file path; empty: the daemon's default. */
    tokenFile: string;
}

export type EndpointSource = "setting" | "daemon.json" | "default" | "started";

export interface Location {
    url: string;
    tokenFile: string;
    source: EndpointSource;
    pid?: number;
}

export function locate(settings: EndpointSettings, e: Environment = currentEnvironment(),
    alive: (pid: number) => boolean = pidAlive): Location {
    const tokenSetting = settings.tokenFile.trim() ? expandPath(settings.tokenFile, e) : undefined;
    if (settings.endpoint.trim()) {
        return { url: normalizeUrl(settings.endpoint.trim()), tokenFile: tokenSetting ?? defaultTokenFile(e), source: "setting" };
    }
    const rec = readDaemonRecord(e, alive);
    if (rec) {
        return { url: rec.url, tokenFile: tokenSetting ?? rec.token_file, source: "daemon.json", pid: rec.pid };
    }
    return { url: DEFAULT_URL, tokenFile: tokenSetting ?? defaultTokenFile(e), source: "default" };
}

/** Accept `127.0.0.1:8765`, `http://…` and `ws://…`. */
export function normalizeUrl(url: string): string {
    if (/^https?:\/\//i.test(url)) {
        return url.replace(/^http/i, "ws");
    }
    if (!/^wss?:\/\//i.test(url)) {
        return `ws://${url}`;
    }
    return url;
}

/** Read the token; a DaemonError that says what to do when it is missing
 * or empty. */
export async function readToken(file: string): Promise<string> {
    let text: string;
    try {
        const st = await fs.promises.lstat(file);
        if (!st.isFile()) {
            throw new DaemonError("unsafe_token", `the token file ${file} is not a regular file (a link?)`, false,
                "point soldaemon.tokenFile at the file itself, or delete it; the daemon writes a new one");
        }
        const uid = myUid();
        if (uid !== undefined && st.uid !== uid) {
            throw new DaemonError("unsafe_token", `the token file ${file} belongs to another user`, false,
                "delete it; the daemon writes a new one at its next start");
        }
        if (st.mode & 0o077) {
            throw new DaemonError("unsafe_token",
                `the token file ${file} is readable by other users (mode ${(st.mode & 0o777).toString(8)})`, false,
                `delete it (a new token is made at the next start) or run: chmod 600 ${file}`);
        }
        text = await fs.promises.readFile(file, "utf8");
    } catch (e) {
        if (e instanceof DaemonError) throw e;
        const code = (e as NodeJS.ErrnoException).code;
        if (code === "ENOENT") {
            throw new DaemonError("no_token", `no token file at ${file}`, true,
                "the daemon creates it when it first starts: run soldaemon serve, or set soldaemon.tokenFile");
        }
        throw new DaemonError("no_token", `cannot read the token file ${file}: ${code ?? String(e)}`, false,
            "check its permissions (it must be readable by you: chmod 600)");
    }
    const token = text.trim();
    if (!TOKEN.test(token)) {
        throw new DaemonError("no_token", `the token file ${file} holds no valid token`, false,
            "delete it; the daemon writes a new one at its next start");
    }
    return token;
}
