// Finding and spawning sol-lsp, the language server that holds the whole
// completion logic (context, warm, type-through, cancel, daemon start). No
// `vscode` import: the tests spawn it with this very code.

import { ChildProcess, spawn } from "child_process";
import * as fs from "fs";
import * as path from "path";
import { Settings, launchFlags } from "./settings";

export interface ServerCommand {
    command: string;
    args: string[];
}

const EXE = process.platform === "win32" ? "sol-lsp.exe" : "sol-lsp";

/** The `sol-lsp` beside an interpreter or executable, when it exists. */
function besides(file: string): string | undefined {
    if (!file || !file.includes(path.sep)) return undefined;
    const sibling = path.join(path.dirname(file), EXE);
    return fs.existsSync(sibling) ? sibling : undefined;
}

/** sol-lsp's argv, the first that applies:
 * 1. `soldaemon.serverCommand` (+ `serverArgs`);
 * 2. `soldaemon.python`: that interpreter, `-m lsp.server`;
 * 3. the `sol-lsp` next to `soldaemon.command` when that is a path;
 * 4. the `sol-lsp` of the interpreter the Python extension has selected
 *    (`activePython`, from its API), when it has one;
 * 5. `sol-lsp` on PATH.
 * The launch flags follow. */
export function serverCommand(s: Settings, activePython?: string): ServerCommand {
    let command = s.serverCommand;
    let args = [...s.serverArgs];
    if (!command && s.python) {
        command = s.python;
        args = ["-m", "lsp.server"];
    } else if (!command) {
        command = besides(s.command) ?? besides(activePython ?? "") ?? "sol-lsp";
        args = [];
    }
    return { command, args: [...args, ...launchFlags(s)] };
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

/** Spawn sol-lsp on stdio. Resolves once the process runs; rejects (with
 * a message naming the setting to fix) when it cannot be started. Its
 * stderr (sol-lsp's log) is piped to the output channel by the language
 * client. */
export function spawnServer(cmd: ServerCommand, env?: NodeJS.ProcessEnv): Promise<ChildProcess> {
    return new Promise((resolve, reject) => {
        const child = spawn(cmd.command, cmd.args, { env: env ?? process.env, stdio: ["pipe", "pipe", "pipe"], windowsHide: true });
        child.once("spawn", () => resolve(child));
        child.once("error", (e: NodeJS.ErrnoException) => {
            reject(new Error(e.code === "ENOENT"
                ? `cannot run '${cmd.command}': not found — install soldaemon (it ships sol-lsp) into your Python, or set soldaemon.python`
                : `cannot run '${cmd.command}': ${e.message}`));
        });
    });
}
