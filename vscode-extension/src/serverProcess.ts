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

/** sol-lsp's argv: `soldaemon.serverCommand` (+ `serverArgs`) when set;
 * else the `sol-lsp` next to `soldaemon.command` when that is a path (the
 * same virtualenv's bin/); else `sol-lsp` on PATH. The launch flags follow. */
export function serverCommand(s: Settings): ServerCommand {
    let command = s.serverCommand;
    let args = [...s.serverArgs];
    if (!command) {
        const sibling = path.join(path.dirname(s.command), process.platform === "win32" ? "sol-lsp.exe" : "sol-lsp");
        command = s.command.includes(path.sep) && fs.existsSync(sibling) ? sibling : "sol-lsp";
        args = [];
    }
    return { command, args: [...args, ...launchFlags(s)] };
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
                ? `cannot run '${cmd.command}': not found — install soldaemon (it ships sol-lsp) or set soldaemon.serverCommand`
                : `cannot run '${cmd.command}': ${e.message}`));
        });
    });
}
