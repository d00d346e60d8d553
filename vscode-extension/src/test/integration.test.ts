// The extension end to end: activation spawns the real sol-lsp, which the
// language client (vscode-languageclient, on the fake `vscode`) drives
// against a real `soldaemon serve` with a tiny random-weight model.
//
// Python (first that can import soldaemon and lsp): $SOLDAEMON_PYTHON,
// ../.venv/bin/python next to this extension, `python3` on PATH. With none
// the test is skipped, unless SOLDAEMON_REQUIRE_INTEGRATION=1. Both
// processes run this checkout's Python code (PYTHONPATH = the repository).
// The tiny model goes to $SOLDAEMON_TINY_MODEL, else .test-tmp/tiny-model
// (reused between runs). State, cache and config go to temp dirs, so the
// user's daemon and token are never touched.

import { strict as assert } from "node:assert";
import { ChildProcess, execFileSync, spawn, spawnSync } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { after, before, describe, it } from "node:test";
import * as vscode from "../testing/fakeVscode";
import type * as Ext from "../extension";
import { DID_SHOW } from "../events";

// Loaded after the fake is installed (importing ./fakeVscode did that).
// eslint-disable-next-line @typescript-eslint/no-require-imports
const ext = require("../extension") as typeof Ext;

const EXT_DIR = path.resolve(__dirname, "..", "..");
const REPO = path.resolve(EXT_DIR, "..");
const PYTHONPATH = [REPO, process.env.PYTHONPATH].filter(Boolean).join(path.delimiter);
const RUN_CLI = "import sys; from soldaemon.cli import main; sys.exit(main())";
const RUN_LSP = "import sys; from lsp.server import main; sys.exit(main())";

function findPython(): string | undefined {
    const env = { ...process.env, PYTHONPATH };
    const canImport = (py: string): boolean =>
        spawnSync(py, ["-c", "import soldaemon.cli, soldaemon_bench.tiny, lsp.server"], { stdio: "ignore", timeout: 60_000, env }).status === 0;
    const candidates = [process.env.SOLDAEMON_PYTHON, path.join(REPO, ".venv", "bin", "python"), "python3"];
    return candidates.find((py): py is string => !!py && (py.includes(path.sep) ? fs.existsSync(py) : true) && canImport(py));
}

const py = findPython();
const required = process.env.SOLDAEMON_REQUIRE_INTEGRATION === "1";
const skip = py ? false : "no python with soldaemon installed (set SOLDAEMON_PYTHON)";
if (!py && required) {
    throw new Error("SOLDAEMON_REQUIRE_INTEGRATION=1 but no python with soldaemon was found (set SOLDAEMON_PYTHON)");
}

function until(cond: () => boolean, ms: number, what: string): Promise<void> {
    const deadline = Date.now() + ms;
    return new Promise((resolve, reject) => {
        const tick = (): void => {
            if (cond()) resolve();
            else if (Date.now() > deadline) reject(new Error(`timed out waiting for ${what}`));
            else setTimeout(tick, 20);
        };
        tick();
    });
}

/** `soldaemon serve` on `port`, resolved at its ready line. */
function serve(modelDir: string, port: number, env: NodeJS.ProcessEnv, logs: string[]): Promise<ChildProcess> {
    const child = spawn(py!, ["-c", RUN_CLI, "serve", "--port", String(port), "--model", modelDir, "--log-level", "warning"],
        { env, stdio: ["ignore", "pipe", "pipe"] });
    child.stderr.on("data", (b: Buffer) => logs.push(b.toString()));
    return new Promise((resolve, reject) => {
        let out = "";
        child.stdout.on("data", (b: Buffer) => {
            out += b.toString();
            if (/^soldaemon ready on /m.test(out)) resolve(child);
        });
        child.on("exit", (code) => reject(new Error(`soldaemon serve exited (${code}): ${logs.join("").slice(-2000)}`)));
    });
}

type Items = vscode.InlineCompletionItem[] | vscode.InlineCompletionList | null | undefined;

function itemsOf(r: Items): vscode.InlineCompletionItem[] {
    return !r ? [] : Array.isArray(r) ? r : r.items;
}

function text(item: vscode.InlineCompletionItem): string {
    return typeof item.insertText === "string" ? item.insertText : item.insertText.value;
}

describe("the extension through sol-lsp against a real soldaemon (tiny model)", { skip, timeout: 300_000 }, () => {
    const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "sol-ext-integration-"));
    const savedEnv = { ...process.env };
    const env: NodeJS.ProcessEnv = {
        ...process.env,
        PYTHONPATH,
        SOLDAEMON_STATE_DIR: path.join(tmp, "state"),
        SOLDAEMON_CACHE_DIR: path.join(tmp, "cache"),
        XDG_CONFIG_HOME: path.join(tmp, "config"), // no user sol_config.yaml
        PYTHONUNBUFFERED: "1",
    };
    const modelDir = process.env.SOLDAEMON_TINY_MODEL ?? path.join(EXT_DIR, ".test-tmp", "tiny-model");
    const logs: string[] = [];
    let daemon: ChildProcess;
    let port = 0;
    let c: Ext.Controller;
    const sent: Array<{ method: string; params: any }> = [];

    function status(): string {
        return vscode.recorded.statusItems[0]?.text ?? "";
    }

    function provide(doc: vscode.TextDocument, pos: vscode.Position, invoke = false, token = vscode.newToken().token): Promise<Items> {
        const provider = vscode.recorded.providers[0].provider;
        return provider.provideInlineCompletionItems(doc, pos, { triggerKind: invoke ? 0 : 1 }, token);
    }

    /** A document whose (deterministic) tiny-model completion has text. */
    async function openWithSuggestion(name: string): Promise<{ doc: vscode.TextDocument; editor: { selection: vscode.Selection }; item: vscode.InlineCompletionItem }> {
        for (const start of ["def add(a, b):\n    return ", "import os\n\nclass Foo:\n    def ", "x = [1, 2, 3]\nfor i in ", "print("]) {
            const { doc, pos } = vscode.docAt(`${start}|`, "python", `file:///project/${name}-${start.length}.py`);
            const editor = vscode.openEditor(doc, pos);
            const items = itemsOf(await provide(doc, pos, true));
            const item = items.find((i) => text(i).length > doc.lineAt(pos.line).text.length + 1);
            if (item) return { doc, editor, item };
        }
        throw new Error("the tiny model completed none of the prompts");
    }

    before(async () => {
        if (!fs.existsSync(path.join(modelDir, "tiny.json"))) {
            fs.mkdirSync(path.dirname(modelDir), { recursive: true });
            execFileSync(py!, ["-m", "soldaemon_bench.tiny", modelDir], { env, stdio: ["ignore", "ignore", "pipe"], timeout: 120_000 });
        }
        daemon = await serve(modelDir, 0, env, logs);
        const record = JSON.parse(fs.readFileSync(path.join(env.SOLDAEMON_STATE_DIR!, "daemon.json"), "utf8")) as { url: string };
        port = Number(new URL(record.url).port);
        Object.assign(process.env, env); // sol-lsp inherits it: it finds the daemon from daemon.json
        vscode.resetRecorded({
            "soldaemon.serverCommand": py, "soldaemon.serverArgs": ["-c", RUN_LSP],
            "soldaemon.autoStart": false, "soldaemon.debounceMs": 0, "soldaemon.maxTokens": 8,
            "soldaemon.slowTtftMs": 60_000, // two shared cores: "slow" is not what is tested
        });
        const context = { subscriptions: [] as Array<{ dispose(): unknown }>, extension: { packageJSON: { version: "0.1.0" } } };
        c = ext.activate(context as unknown as Parameters<typeof ext.activate>[0]);
        const send = c.client.sendNotification.bind(c.client) as (m: string, p?: unknown) => Promise<void>;
        (c.client as unknown as { sendNotification: unknown }).sendNotification = (m: string, p?: unknown) => {
            sent.push({ method: m, params: p });
            return send(m, p);
        };
    });

    after(async () => {
        if (process.env.SOLDAEMON_TEST_LOG) fs.writeFileSync(process.env.SOLDAEMON_TEST_LOG, vscode.recorded.output.join("\n") + logs.join(""));
        await c?.shutdown();
        c?.dispose();
        daemon?.kill("SIGKILL");
        for (const k of Object.keys(process.env)) if (!(k in savedEnv)) delete process.env[k];
        Object.assign(process.env, savedEnv);
        fs.rmSync(tmp, { recursive: true, force: true });
    });

    it("activation starts sol-lsp; its capability registers the inline provider; sol/status drives the status bar", async () => {
        for (const id of ["soldaemon.toggle", "soldaemon.showDiagnosis", "soldaemon.restartServer", "soldaemon.openLogs",
            "soldaemon.selectPython"]) {
            assert.ok(vscode.recorded.commands.has(id), id);
        }
        await until(() => vscode.recorded.providers.length === 1, 60_000, "the inline provider");
        assert.ok(c.process?.pid, "sol-lsp runs");
        assert.ok(vscode.recorded.commands.has("sol.accepted"), "the server's command is registered by the client");
        await until(() => status().startsWith("$(check)"), 60_000, `ready (status ${status()})`);
        assert.match(c.diagnosis(), /daemon: +ready at ws:\/\/127\.0\.0\.1:/);
    });

    it("an inline completion returns the daemon's items, replacing the whole line", async () => {
        const { doc, item } = await openWithSuggestion("items");
        const line = doc.lineAt(doc.lineCount - 1).text;
        assert.ok(text(item).startsWith(line), text(item));
        assert.equal(item.range?.start.character, 0);
        assert.equal(item.range?.end.character, line.length);
        assert.equal(item.command?.command, "sol.accepted");
        assert.equal(typeof item.command?.arguments?.[0], "string");
        const shown = sent.filter((s) => s.method === DID_SHOW);
        assert.ok(shown.length >= 1, "didShowCompletion was sent");
        assert.deepEqual(shown.at(-1)!.params.item.command.arguments, item.command?.arguments);
    });

    it("an invoked request says so to the server (it may answer alternatives); all items are shown", async () => {
        const { doc, pos } = vscode.docAt("def alt(a, b):\n    return |", "python", "file:///project/alt.py");
        const params = c.client.code2ProtocolConverter.asInlineCompletionParams(doc as any, pos as any, { triggerKind: 0, selectedCompletionInfo: undefined } as any);
        assert.equal(params.context.triggerKind, 1, "LSP InlineCompletionTriggerKind.Invoked");
        vscode.openEditor(doc, pos);
        const items = itemsOf(await provide(doc, pos, true));
        const keys = new Set(items.map((i) => JSON.stringify(i.command?.arguments)));
        assert.equal(keys.size, items.length, "every item the server returned, each its own");
    });

    it("toggling completions off answers nothing, and sol-lsp is told (it sends nothing to the daemon)", async () => {
        const mark = sent.length;
        await vscode.commands.executeCommand("soldaemon.toggle");
        assert.equal(vscode.recorded.settings["soldaemon.enable"], false);
        const told = () => sent.slice(mark).find((s) => s.method === "workspace/didChangeConfiguration");
        await until(() => told() !== undefined, 5000, "didChangeConfiguration");
        assert.equal(told()!.params.settings.soldaemon.enable, false);
        assert.equal(told()!.params.settings.soldaemon.languages.markdown, false);
        assert.equal(status(), "$(circle-slash) sol");
        const { doc, pos } = vscode.docAt("def off():\n    |", "python", "file:///project/off.py");
        assert.equal(await provide(doc, pos, true), null);
        await vscode.commands.executeCommand("soldaemon.toggle");
        assert.notEqual(status(), "$(circle-slash) sol");
    });

    it("typing through the suggestion is answered by the server from the same request", async () => {
        const { doc, editor, item } = await openWithSuggestion("through");
        const offset = doc.getText().length;
        const typed = text(item).slice(doc.lineAt(doc.lineCount - 1).text.length)[0];
        doc.insert(offset, typed);
        const pos = doc.positionAt(offset + 1);
        editor.selection = new vscode.Selection(pos, pos);
        const again = itemsOf(await provide(doc, pos));
        assert.equal(again.length >= 1, true);
        assert.equal(text(again[0]), text(item));
        // the same daemon request and item (the third argument, characters before the cursor, grew by the one typed)
        assert.deepEqual(again[0].command?.arguments?.slice(0, 2), item.command?.arguments?.slice(0, 2), "the same daemon request: typed through, not asked again");
        assert.equal(again[0].command?.arguments?.[2], (item.command?.arguments?.[2] as number) + 1);
    });

    it("a cancelled request answers nothing, and the next one works", async () => {
        const { doc, pos } = vscode.docAt("def cancelled():\n    |", "python", "file:///project/cancel.py");
        vscode.openEditor(doc, pos);
        const source = vscode.newToken();
        const p = provide(doc, pos, false, source.token);
        source.cancel();
        assert.equal(itemsOf(await p).length, 0);
        await openWithSuggestion("after-cancel");
    });

    it("a setting change reaches the running server (didChangeConfiguration); a launch setting restarts it", async () => {
        const pid = c.process?.pid;
        const mark = sent.length;
        vscode.setSetting("soldaemon.maxLines", 3);
        const changed = () => sent.slice(mark).find((s) => s.method === "workspace/didChangeConfiguration");
        await until(() => changed() !== undefined, 5000, "didChangeConfiguration");
        const change = changed()!;
        assert.equal(change.params.settings.soldaemon.maxLines, 3);
        assert.equal(c.process?.pid, pid, "not restarted for an option");
        await openWithSuggestion("after-setting");

        vscode.setSetting("soldaemon.serverLogLevel", "info");
        await until(() => c.process !== undefined && c.process.pid !== pid && status().startsWith("$(check)"), 60_000, "a restarted sol-lsp");
        assert.ok(c.process!.spawnargs.includes("info"));
    });

    it("the status bar follows the daemon going away and coming back", async () => {
        daemon.kill("SIGKILL");
        await until(() => !status().startsWith("$(check)"), 30_000, `not ready (status ${status()})`);
        daemon = await serve(modelDir, port, env, logs);
        await until(() => status().startsWith("$(check)"), 60_000, `ready again (status ${status()})`);
    });

    it("a crashed sol-lsp is shown and restarted", async () => {
        const pid = c.process!.pid!;
        process.kill(pid, "SIGKILL");
        await until(() => vscode.recorded.messages.some((m) => /sol-lsp exited/.test(m.text)), 10_000, "the crash message");
        await until(() => c.process !== undefined && c.process.pid !== pid && status().startsWith("$(check)"), 60_000, `restarted (status ${status()})`);
        await openWithSuggestion("after-crash");
    });
});
