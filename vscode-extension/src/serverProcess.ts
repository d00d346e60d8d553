// Finding and spawning sol-lsp, the language server that holds the whole
// completion logic (context, warm, type-through, cancel, daemon start). No
// `vscode` import: the tests spawn it with this very code.

import { ChildProcess, spawn } from "child_process";
import * as fs from "fs";
import * as os from "os";
import * as path from "path";
import { Settings, launchFlags } from "./settings";

export interface ServerCommand {
    command: string;
    args: string[];
    /** The workspace folder `command` lies in (a repository's `.venv`): it
     * runs only once the user has confirmed it for this workspace. */
    inWorkspace?: string;
}

const EXE = process.platform === "win32" ? "sol-lsp.exe" : "sol-lsp";

/** The `sol-lsp` beside an interpreter or executable, when it exists. */
function besides(file: string): string | undefined {
    if (!file || !file.includes(path.sep)) return undefined;
    const sibling = path.join(path.dirname(file), EXE);
    return fs.existsSync(sibling) ? sibling : undefined;
}

/** The workspace folder (of `folders`) that holds `file`, by its path or
 * its real path (links resolved), else undefined. */
export function folderHolding(file: string, folders: readonly string[]): string | undefined {
    const paths = [path.resolve(file)];
    try {
        paths.push(fs.realpathSync(file));
    } catch {
        // not there: its path alone
    }
    return folders.find((folder) => {
        const roots = [path.resolve(folder)];
        try {
            roots.push(fs.realpathSync(folder));
        } catch {
            // not there
        }
        return roots.some((root) => paths.some((p) => {
            const rel = path.relative(root, p);
            return rel === "" || (!rel.startsWith("..") && !path.isAbsolute(rel));
        }));
    });
}

/** sol-lsp's argv, the first that applies:
 * 1. `soldaemon.serverCommand` (+ `serverArgs`);
 * 2. `soldaemon.python`: that interpreter, `-I -m lsp.server` (isolated:
 *    no current directory, script directory or PYTHON* variables on its
 *    path, so no folder's own `lsp/` package is imported);
 * 3. the `sol-lsp` next to `soldaemon.command` when that is a path;
 * 4. the `sol-lsp` of the interpreter the Python extension has selected
 *    (`activePython`, from its API), when it has one; a workspace chooses
 *    that interpreter (`python.defaultInterpreterPath`, an auto-selected
 *    `.venv`), so one inside a workspace folder (`folders`) is marked
 *    `inWorkspace` and runs only when the user confirms it;
 * 5. `sol-lsp` on PATH.
 * The launch settings are machine-scoped (package.json): a workspace's
 * own settings never name what runs. The launch flags follow. */
export function serverCommand(s: Settings, activePython?: string, folders: readonly string[] = []): ServerCommand {
    const flags = launchFlags(s);
    if (s.serverCommand) return { command: s.serverCommand, args: [...s.serverArgs, ...flags] };
    if (s.python) return { command: s.python, args: ["-I", "-m", "lsp.server", ...flags] };
    const named = besides(s.command);
    if (named) return { command: named, args: flags };
    const selected = besides(activePython ?? "");
    if (selected) {
        const inWorkspace = folderHolding(selected, folders) ?? folderHolding(activePython ?? "", folders);
        return inWorkspace ? { command: selected, args: flags, inWorkspace } : { command: selected, args: flags };
    }
    return { command: "sol-lsp", args: flags };
}

/** The directory sol-lsp runs in: the user's home, never a workspace
 * folder (nothing of the project is on its path or read relative to it). */
export function serverCwd(): string {
    return os.homedir();
}

/** `env` with PATH's relative entries (`.`, empty) dropped: a program
 * found on PATH is never one of the directory it runs in. */
export function serverEnv(env: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
    const key = Object.keys(env).find((k) => k.toUpperCase() === "PATH") ?? "PATH";
    const entries = (env[key] ?? "").split(path.delimiter).filter((p) => p && path.isAbsolute(p));
    return { ...env, [key]: entries.join(path.delimiter) };
}

/** The interpreter to install soldaemon into: `soldaemon.python`, else the
 * Python extension's, else `python3`. */
export function installPython(s: Settings, activePython?: string): string {
    return s.python || activePython || (process.platform === "win32" ? "python" : "python3");
}

/** The command that installs soldaemon (and so sol-lsp) into `python`
 * from a soldaemon source checkout: soldaemon is not on PyPI. */
export function installCommand(python: string, checkout: string): string {
    const q = (w: string) => (/^[\w@%+=:,./-]+$/.test(w) ? w : `"${w.replace(/(["\\$`])/g, "\\$1")}"`);
    return `${q(python)} -m pip install -e ${q(checkout)}`;
}

/** Spawn sol-lsp on stdio, in `serverCwd()` with PATH's relative
 * entries dropped. Resolves once the process runs; rejects (with
 * a message naming the setting to fix) when it cannot be started. Its
 * stderr (sol-lsp's log) is piped to the output channel by the language
 * client. */
export function spawnServer(cmd: ServerCommand, env?: NodeJS.ProcessEnv): Promise<ChildProcess> {
    return new Promise((resolve, reject) => {
        const child = spawn(cmd.command, cmd.args, {
            cwd: serverCwd(), env: serverEnv(env ?? process.env), stdio: ["pipe", "pipe", "pipe"], windowsHide: true,
        });
        child.once("spawn", () => resolve(child));
        child.once("error", (e: NodeJS.ErrnoException) => {
            reject(new Error(e.code === "ENOENT"
                ? `cannot run '${cmd.command}': not found — install soldaemon (it ships sol-lsp) into your Python, or set soldaemon.python`
                : `cannot run '${cmd.command}': ${e.message}`));
        });
    });
}
