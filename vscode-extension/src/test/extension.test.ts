// The extension's activation against the fake `vscode`: commands, provider,
// status bar, diagnosis, and finding/starting the daemon (a scripted fake
// daemon here; the real one is in integration.test.ts).

import { strict as assert } from "node:assert";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { after, afterEach, describe, it } from "node:test";
import * as vscode from "../testing/fakeVscode";
import { FakeDaemon } from "../testing/fakeDaemon";
import type * as Ext from "../extension";

// Loaded after the fake is installed (importing ./fakeVscode did that).
// eslint-disable-next-line @typescript-eslint/no-require-imports
const ext = require("../extension") as typeof Ext;

const TOKEN = "e".repeat(43);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "sol-ext-activation-"));
const savedStateDir = process.env.SOLDAEMON_STATE_DIR;
let controller: Ext.Controller | undefined;
const daemons: FakeDaemon[] = [];

afterEach(async () => {
    controller?.dispose();
    await controller?.shutdown();
    controller = undefined;
    for (const d of daemons.splice(0)) await d.stop();
    if (savedStateDir === undefined) delete process.env.SOLDAEMON_STATE_DIR;
    else process.env.SOLDAEMON_STATE_DIR = savedStateDir;
});
after(() => fs.rmSync(tmp, { recursive: true, force: true }));

function activate(settings: Record<string, unknown>): Ext.Controller {
    vscode.resetRecorded(settings);
    const context = { subscriptions: [] as Array<{ dispose(): unknown }>, extension: { packageJSON: { version: "0.1.0" } } };
    controller = ext.activate(context as unknown as Parameters<typeof ext.activate>[0]);
    return controller;
}

function until(cond: () => boolean, ms = 5000, what = "condition"): Promise<void> {
    const deadline = Date.now() + ms;
    return new Promise((resolve, reject) => {
        const tick = (): void => {
            if (cond()) resolve();
            else if (Date.now() > deadline) reject(new Error(`timed out waiting for ${what}`));
            else setTimeout(tick, 10);
        };
        tick();
    });
}

function statusText(): string {
    return vscode.recorded.statusItems[0]?.text ?? "";
}

async function provide(marked: string) {
    const { doc, pos } = vscode.docAt(marked);
    const provider = vscode.recorded.providers[0].provider;
    return provider.provideInlineCompletionItems(doc, pos, { triggerKind: 1 }, vscode.newToken().token) as Promise<vscode.InlineCompletionItem[] | undefined>;
}

describe("extension", () => {
    it("registers commands and the provider, connects, completes, reports acceptance", async () => {
        const d = await new FakeDaemon({ token: TOKEN, reply: () => ({ deltas: ["a + b"], items: ["a + b"] }) }).start();
        daemons.push(d);
        const tokenFile = path.join(tmp, "token1");
        fs.writeFileSync(tokenFile, TOKEN, { mode: 0o600 });
        activate({ "soldaemon.endpoint": d.url, "soldaemon.tokenFile": tokenFile, "soldaemon.debounceMs": 0 });
        for (const id of ["soldaemon.toggle", "soldaemon.showDiagnosis", "soldaemon.restartDaemon", "soldaemon.openLogs", "soldaemon.accepted"]) {
            assert.ok(vscode.recorded.commands.has(id), id);
        }
        assert.equal(vscode.recorded.providers.length, 1);
        assert.equal(vscode.recorded.statusItems[0].visible, true);
        assert.equal(vscode.recorded.statusItems[0].command, "soldaemon.showDiagnosis");
        await until(() => statusText().startsWith("$(check)"), 5000, "ready");

        const items = await provide("def add(a, b):\n    return |\n");
        assert.ok(items);
        assert.equal(items[0].insertText, "    return a + b");
        assert.equal(statusText(), "$(check) sol 3 ms");

        const cmd = items[0].command!;
        await vscode.commands.executeCommand(cmd.command, ...cmd.arguments);
        await until(() => d.received.some((m) => m.type === "event" && m.kind === "accepted"), 2000, "event");

        await vscode.commands.executeCommand("soldaemon.showDiagnosis");
        const diag = vscode.recorded.output.join("\n");
        assert.match(diag, /soldaemon diagnosis/);
        assert.match(diag, /endpoint: +ws:\/\/127\.0\.0\.1:\d+ \(from soldaemon\.endpoint\)/);
        assert.match(diag, /model: +fake-model on cpu/);
        assert.match(diag, /requests: +1 sent, 1 shown/);
    });

    it("VS Code's cancellation reaches the daemon as a cancel frame", async () => {
        const d = await new FakeDaemon({ token: TOKEN, reply: () => ({ deltas: ["slow"], items: ["slow"], delayMs: 2000 }) }).start();
        daemons.push(d);
        const tokenFile = path.join(tmp, "token-cancel");
        fs.writeFileSync(tokenFile, TOKEN, { mode: 0o600 });
        activate({ "soldaemon.endpoint": d.url, "soldaemon.tokenFile": tokenFile, "soldaemon.debounceMs": 0 });
        await until(() => statusText().startsWith("$(check)"), 5000, "ready");
        const { doc, pos } = vscode.docAt("x = |");
        const src = vscode.newToken();
        const pending = vscode.recorded.providers[0].provider.provideInlineCompletionItems(doc, pos, { triggerKind: 1 }, src.token);
        await until(() => d.received.some((m) => m.type === "complete"), 2000, "the request");
        const id = d.received.find((m) => m.type === "complete")!.id;
        src.cancel();
        assert.equal(await pending, undefined);
        assert.ok(d.received.some((m) => m.type === "cancel" && m.id === id), "cancel sent for the same id");
    });

    it("toggle turns completions off and on", async () => {
        const d = await new FakeDaemon({ token: TOKEN }).start();
        daemons.push(d);
        const tokenFile = path.join(tmp, "token2");
        fs.writeFileSync(tokenFile, TOKEN, { mode: 0o600 });
        activate({ "soldaemon.endpoint": d.url, "soldaemon.tokenFile": tokenFile, "soldaemon.debounceMs": 0 });
        await vscode.commands.executeCommand("soldaemon.toggle");
        assert.equal(vscode.recorded.settings["soldaemon.enable"], false);
        assert.equal(statusText(), "$(circle-slash) sol");
        assert.equal(await provide("x = |"), undefined);
        assert.equal(d.received.filter((m) => m.type === "complete").length, 0);
        await vscode.commands.executeCommand("soldaemon.toggle");
        assert.equal(vscode.recorded.settings["soldaemon.enable"], true);
    });

    it("says clearly when the daemon cannot be started", async () => {
        process.env.SOLDAEMON_STATE_DIR = path.join(tmp, "empty-state");
        activate({ "soldaemon.command": path.join(tmp, "no-such-soldaemon") });
        await until(() => vscode.recorded.messages.some((m) => m.level === "error"), 5000, "an error message");
        const msg = vscode.recorded.messages.find((m) => m.level === "error")!;
        assert.match(msg.text, /could not be started/);
        assert.match(msg.text, /soldaemon\.command/);
        assert.deepEqual(msg.items, ["Open Logs", "Show Diagnosis", "Restart Daemon", "Settings"]);
        await until(() => statusText() === "$(error) sol", 2000, "error status");
        assert.match(String(vscode.recorded.statusItems[0].tooltip), /could not be started/);
    });

    it("a start that finds the port taken uses the daemon holding it, without an error", async () => {
        const state = path.join(tmp, "busy-state");
        fs.mkdirSync(state, { recursive: true });
        process.env.SOLDAEMON_STATE_DIR = state;
        const d = await new FakeDaemon({ token: TOKEN, reply: () => ({ deltas: ["7"], items: ["7"] }) }).start();
        daemons.push(d);
        // Another window's daemon got there first: it wrote its record and
        // token just as ours failed to bind.
        const exe = path.join(tmp, "busy-soldaemon");
        fs.writeFileSync(exe, `#!${process.execPath}
const fs = require("fs");
const dir = process.env.SOLDAEMON_STATE_DIR;
fs.writeFileSync(dir + "/token", ${JSON.stringify(TOKEN)}, { mode: 0o600 });
fs.writeFileSync(dir + "/daemon.json", JSON.stringify({ pid: ${process.pid}, url: ${JSON.stringify(d.url)}, token_file: dir + "/token" }));
console.error("soldaemon: error [address_in_use]: port 8765 on 127.0.0.1 is already in use");
process.exit(4);
`, { mode: 0o755 });
        activate({ "soldaemon.command": exe, "soldaemon.debounceMs": 0 });
        await until(() => statusText().startsWith("$(check)"), 10_000, "ready");
        assert.deepEqual(vscode.recorded.messages.filter((m) => m.level === "error"), []);
        const items = await provide("n = |");
        assert.equal(items?.[0].insertText, "n = 7");
    });

    it("a taken port with nothing usable behind it is reported", async () => {
        const state = path.join(tmp, "busy-state2");
        fs.mkdirSync(state, { recursive: true });
        process.env.SOLDAEMON_STATE_DIR = state;
        const exe = path.join(tmp, "busy-soldaemon2");
        fs.writeFileSync(exe, `#!${process.execPath}
console.error("soldaemon: error [address_in_use]: port 8765 on 127.0.0.1 is already in use");
console.error("  hint: another soldaemon may be running");
process.exit(4);
`, { mode: 0o755 });
        activate({ "soldaemon.command": exe });
        await until(() => vscode.recorded.messages.some((m) => m.level === "error"), 10_000, "an error message");
        assert.match(vscode.recorded.messages[0].text, /already in use/);
        await until(() => statusText() === "$(error) sol", 2000, "error status");
    });

    it("starts the daemon when none runs, connects to it, and stops it on shutdown", async () => {
        const state = path.join(tmp, "auto-state");
        fs.mkdirSync(state, { recursive: true });
        process.env.SOLDAEMON_STATE_DIR = state;
        const pidFile = path.join(tmp, "auto.pid");
        const fakeDaemonJs = path.join(__dirname, "..", "testing", "fakeDaemon.js");
        const exe = path.join(tmp, "fake-soldaemon");
        fs.writeFileSync(exe, `#!${process.execPath}
const fs = require("fs");
const { FakeDaemon } = require(${JSON.stringify(fakeDaemonJs)});
if (process.argv[2] !== "serve") { console.error("soldaemon: error [usage]: expected serve"); process.exit(2); }
const tokenFile = process.env.SOLDAEMON_STATE_DIR + "/token";
fs.writeFileSync(tokenFile, ${JSON.stringify(TOKEN)}, { mode: 0o600 });
fs.writeFileSync(${JSON.stringify(pidFile)}, String(process.pid));
new FakeDaemon({ token: ${JSON.stringify(TOKEN)}, reply: () => ({ deltas: ["42"], items: ["42"] }) }).start().then((d) => {
  console.error("INFO loading the model");
  console.log("soldaemon ready on " + d.url + " model=fake device=cpu token file: " + tokenFile);
});
process.on("SIGTERM", () => process.exit(0));
`, { mode: 0o755 });
        const c = activate({ "soldaemon.command": exe, "soldaemon.debounceMs": 0 });
        await until(() => statusText().startsWith("$(check)"), 10_000, "ready after auto-start");
        assert.ok(vscode.recorded.output.some((l) => l.includes("[daemon] INFO loading the model")), "daemon log in the output");
        const items = await provide("answer = |");
        assert.equal(items?.[0].insertText, "answer = 42");
        const diag = await c.diagnosis();
        assert.match(diag, /started by the extension, pid \d+/);
        const pid = Number(fs.readFileSync(pidFile, "utf8"));
        await c.shutdown();
        await until(() => {
            try {
                process.kill(pid, 0);
                return false;
            } catch {
                return true;
            }
        }, 5000, "the daemon to exit");
    });
});
