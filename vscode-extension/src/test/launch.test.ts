// The project chooses nothing that runs (issue 57, finding 7): a
// repository's `.venv/bin/sol-lsp`, reached through the interpreter the
// Python extension selects for the workspace, is not started unless the
// user confirms it once for the workspace; `soldaemon.python` runs
// `python -I -m lsp.server` in a fixed directory, so a folder's own `lsp/`
// package is never imported.

import { strict as assert } from "node:assert";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { describe, it } from "node:test";
import * as vscode from "../testing/fakeVscode";
import type * as Ext from "../extension";
import { serverCommand, spawnServer } from "../serverProcess";
import { readSettings } from "../settings";

// eslint-disable-next-line @typescript-eslint/no-require-imports
const ext = require("../extension") as typeof Ext;

function until(cond: () => boolean, ms: number): Promise<boolean> {
    const deadline = Date.now() + ms;
    return new Promise((resolve) => {
        const tick = (): void => {
            if (cond()) resolve(true);
            else if (Date.now() > deadline) resolve(false);
            else setTimeout(tick, 20);
        };
        tick();
    });
}

/** A repository with `.venv/bin/python` and a `.venv/bin/sol-lsp` that
 * leaves a marker when it runs. */
function hostileRepo(): { root: string; python: string; solLsp: string; marker: string } {
    const root = fs.mkdtempSync(path.join(os.tmpdir(), "sol-hostile-"));
    const bin = path.join(root, ".venv", "bin");
    fs.mkdirSync(bin, { recursive: true });
    const marker = path.join(root, "ran");
    const python = path.join(bin, "python");
    fs.writeFileSync(python, "");
    const solLsp = path.join(bin, "sol-lsp");
    fs.writeFileSync(solLsp, `#!/bin/sh\necho ran > '${marker}'\n`, { mode: 0o755 });
    return { root, python, solLsp, marker };
}

function memento(): { get<T>(k: string): T | undefined; update(k: string, v: unknown): Promise<void> } {
    const values = new Map<string, unknown>();
    return { get: <T>(k: string) => values.get(k) as T | undefined, update: async (k, v) => { values.set(k, v); } };
}

function selectInterpreter(python: string): void {
    vscode.installedExtensions.set("ms-python.python", {
        isActive: true, activate: async () => undefined,
        exports: { environments: { getActiveEnvironmentPath: () => ({ id: "venv", path: python }) } },
    });
}

describe("a workspace's own sol-lsp", () => {
    it("is not started at activation without the user's consent; PATH's runs instead and is stopped with the extension", async () => {
        const repo = hostileRepo();
        // PATH's sol-lsp: one that never answers (a sol-lsp still starting)
        const bin = fs.mkdtempSync(path.join(os.tmpdir(), "sol-path-"));
        fs.writeFileSync(path.join(bin, "sol-lsp"), "#!/bin/sh\nexec sleep 600\n", { mode: 0o755 });
        const savedPath = process.env.PATH;
        process.env.PATH = [bin, savedPath].join(path.delimiter);
        vscode.resetRecorded({});
        selectInterpreter(repo.python);
        (vscode.workspace as any).workspaceFolders = [{ uri: { scheme: "file", fsPath: repo.root }, name: "repo", index: 0 }];
        const c = ext.activate({ subscriptions: [], workspaceState: memento(), extension: { packageJSON: {} } } as any);
        try {
            await until(() => fs.existsSync(repo.marker) || vscode.recorded.messages.length > 0, 3000);
            assert.ok(await until(() => c.process !== undefined, 5000), "PATH's sol-lsp was not started");
            assert.equal(fs.existsSync(repo.marker), false, "the workspace's sol-lsp ran");
            const child = c.process!;
            assert.equal(child.spawnargs[0], "sol-lsp");
            c.dispose();
            assert.ok(await until(() => child.exitCode !== null || child.signalCode !== null, 10_000),
                "sol-lsp outlived the extension");
        } finally {
            process.env.PATH = savedPath;
            c.dispose();
            fs.rmSync(bin, { recursive: true, force: true });
            vscode.installedExtensions.clear();
            (vscode.workspace as any).workspaceFolders = undefined;
            fs.rmSync(repo.root, { recursive: true, force: true });
        }
    });

    it("runs once the user confirms it, for that workspace only", async () => {
        const repo = hostileRepo();
        vscode.resetRecorded({});
        selectInterpreter(repo.python);
        (vscode.workspace as any).workspaceFolders = [{ uri: { scheme: "file", fsPath: repo.root }, name: "repo", index: 0 }];
        const state = memento();
        const c = new ext.Controller({ subscriptions: [], workspaceState: state } as any);
        try {
            c.activePython = await c.pythonFromExtension();
            assert.equal((await c.launchCommand()).command, "sol-lsp");            // dismissed: PATH's
            assert.match(vscode.recorded.messages[0].text, /inside this workspace/);
            vscode.recorded.answer = "Run It";
            assert.equal((await c.launchCommand()).command, repo.solLsp);
            vscode.recorded.answer = undefined;
            assert.equal((await c.launchCommand()).command, repo.solLsp);          // remembered, not asked again
            assert.equal(vscode.recorded.messages.length, 2);
            c.dispose();
            const other = new ext.Controller({ subscriptions: [], workspaceState: memento() } as any);
            other.activePython = repo.python;
            assert.equal((await other.launchCommand()).command, "sol-lsp");         // another workspace asks again
            other.dispose();
        } finally {
            c.dispose();
            vscode.installedExtensions.clear();
            (vscode.workspace as any).workspaceFolders = undefined;
            fs.rmSync(repo.root, { recursive: true, force: true });
        }
    });

    it("an interpreter outside every workspace folder runs its sol-lsp as before", () => {
        const repo = hostileRepo();
        const other = fs.mkdtempSync(path.join(os.tmpdir(), "sol-ws-"));
        try {
            const cmd = serverCommand(readSettings(() => undefined), repo.python, [other]);
            assert.equal(cmd.command, repo.solLsp);
            assert.equal(cmd.inWorkspace, undefined);
            assert.equal(serverCommand(readSettings(() => undefined), repo.python, [repo.root]).inWorkspace, repo.root);
        } finally {
            fs.rmSync(repo.root, { recursive: true, force: true });
            fs.rmSync(other, { recursive: true, force: true });
        }
    });
});

describe("soldaemon.python", () => {
    it("never imports the folder's own lsp package, whatever the current directory", async (t) => {
        const python = ["python3", "python"].find((p) => {
            try {
                return require("node:child_process").spawnSync(p, ["-c", "pass"]).status === 0;
            } catch {
                return false;
            }
        });
        if (!python) {
            t.skip("no python on PATH");
            return;
        }
        const project = fs.mkdtempSync(path.join(os.tmpdir(), "sol-proj-"));
        const marker = path.join(project, "imported");
        fs.mkdirSync(path.join(project, "lsp"));
        fs.writeFileSync(path.join(project, "lsp", "__init__.py"), "");
        fs.writeFileSync(path.join(project, "lsp", "server.py"), `open(${JSON.stringify(marker)}, "w").write("x")\n`);
        const cwd = process.cwd();
        process.chdir(project);          // VS Code started from the project (`code .`)
        try {
            const cmd = serverCommand(readSettings((k) => (k === "python" ? python : undefined)));
            const child = await spawnServer(cmd, { ...process.env, PYTHONPATH: "" });
            child.stdin?.end();
            await new Promise((r) => child.once("exit", r));
            assert.equal(fs.existsSync(marker), false, "the folder's lsp/ was imported");
        } finally {
            process.chdir(cwd);
            fs.rmSync(project, { recursive: true, force: true });
        }
    });
});
