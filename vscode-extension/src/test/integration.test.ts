// The extension's client code against a real `soldaemon serve` with a tiny
// random-weight model: find it, complete, cancel, survive a daemon crash.
//
// The daemon is found (first that exists):
//   $SOLDAEMON_PYTHON (a python that can import soldaemon),
//   ../.venv/bin/python next to this extension (the repository's venv),
//   `soldaemon` on PATH (its python: `python3` on PATH).
// With none, the test is skipped, unless SOLDAEMON_REQUIRE_INTEGRATION=1.
// The tiny model goes to $SOLDAEMON_TINY_MODEL, else .test-tmp/tiny-model
// (reused between runs). State, cache and config go to temp dirs, so the
// user's daemon and token are never touched.

import { strict as assert } from "node:assert";
import { execFileSync, spawnSync } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { after, before, describe, it } from "node:test";
import { DaemonClient, DaemonError } from "../daemonClient";
import { StartedDaemon, startDaemon } from "../daemonProcess";
import { locate, readToken } from "../discovery";
import { DEFAULT_CONFIG, InlineProvider, vscodeItemFactory } from "../provider";
import * as vscode from "../testing/fakeVscode";

const EXT_DIR = path.resolve(__dirname, "..", "..");
const REPO = path.resolve(EXT_DIR, "..");
const RUN_CLI = "import sys; from soldaemon.cli import main; sys.exit(main())";

interface Python {
    python: string;
    /** How to run the CLI: command and leading args. */
    command: string;
    prefixArgs: string[];
}

function findPython(): Python | undefined {
    const canImport = (py: string): boolean =>
        spawnSync(py, ["-c", "import soldaemon.cli, soldaemon.testing.tiny"], { stdio: "ignore", timeout: 60_000 }).status === 0;
    const candidates: string[] = [];
    if (process.env.SOLDAEMON_PYTHON) candidates.push(process.env.SOLDAEMON_PYTHON);
    candidates.push(path.join(REPO, ".venv", "bin", "python"));
    const onPath = spawnSync("sh", ["-c", "command -v soldaemon"], { encoding: "utf8" }).stdout?.trim();
    if (onPath) {
        // The interpreter of the soldaemon script (its shebang), else python3.
        const first = fs.readFileSync(onPath, "utf8").split("\n", 1)[0];
        if (first.startsWith("#!")) candidates.push(first.slice(2).trim().split(" ")[0]);
        candidates.push("python3");
    }
    for (const py of candidates) {
        if ((py.includes(path.sep) ? fs.existsSync(py) : true) && canImport(py)) {
            return { python: py, command: py, prefixArgs: ["-c", RUN_CLI] };
        }
    }
    return undefined;
}

const py = findPython();
const required = process.env.SOLDAEMON_REQUIRE_INTEGRATION === "1";
const skip = py ? false : "no python with soldaemon installed (set SOLDAEMON_PYTHON)";
if (!py && required) {
    throw new Error("SOLDAEMON_REQUIRE_INTEGRATION=1 but no python with soldaemon was found (set SOLDAEMON_PYTHON)");
}

describe("integration with a real soldaemon (tiny model)", { skip, timeout: 240_000 }, () => {
    const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "sol-ext-integration-"));
    const stateDir = path.join(tmp, "state");
    const env: NodeJS.ProcessEnv = {
        ...process.env,
        SOLDAEMON_STATE_DIR: stateDir,
        SOLDAEMON_CACHE_DIR: path.join(tmp, "cache"),
        XDG_CONFIG_HOME: path.join(tmp, "config"), // no user sol_config.yaml
        PYTHONUNBUFFERED: "1",
    };
    const modelDir = process.env.SOLDAEMON_TINY_MODEL ?? path.join(EXT_DIR, ".test-tmp", "tiny-model");
    const logs: string[] = [];
    const daemons: StartedDaemon[] = [];
    let first: StartedDaemon;
    let client: DaemonClient;

    function serve(port: number): Promise<StartedDaemon> {
        return startDaemon({
            command: py!.command,
            args: [...py!.prefixArgs, "serve", "--port", String(port), "--model", modelDir, "--log-level", "warning"],
            env,
            timeoutMs: 120_000,
            onLog: (line) => logs.push(line),
        }).then((d) => {
            daemons.push(d);
            return d;
        });
    }

    before(async () => {
        if (!fs.existsSync(path.join(modelDir, "tiny.json"))) {
            fs.mkdirSync(path.dirname(modelDir), { recursive: true });
            execFileSync(py!.python, ["-m", "soldaemon.testing.tiny", modelDir], { env, stdio: ["ignore", "ignore", "pipe"], timeout: 120_000 });
        }
        first = await serve(0);
        const url = first.url;
        // As the extension does with soldaemon.endpoint set: a fixed URL, the
        // token re-read at every attempt.
        client = new DaemonClient({
            resolve: async () => ({ url, token: await readToken(first.tokenFile), tokenFile: first.tokenFile }),
            backoff: { initialMs: 200, maxMs: 1000 },
            cancelGraceMs: 30_000, // so a "cancelled" result can only be the daemon's
        });
        client.start();
        await client.waitOpen(10_000);
        // The hello frame follows the handshake.
        const deadline = Date.now() + 10_000;
        while (client.connection.daemonState !== "ready" && Date.now() < deadline) {
            await new Promise((r) => setTimeout(r, 20));
        }
    });

    after(async () => {
        client?.stop();
        await Promise.all(daemons.map((d) => d.stop(5000)));
        fs.rmSync(tmp, { recursive: true, force: true });
    });

    it("finds the running daemon from its record in the state dir", () => {
        assert.match(first.url, /^ws:\/\/127\.0\.0\.1:\d+$/);
        assert.equal(first.tokenFile, path.join(stateDir, "token"));
        const loc = locate({ endpoint: "", tokenFile: "" }, { env, home: os.homedir() });
        assert.deepEqual({ url: loc.url, tokenFile: loc.tokenFile, source: loc.source, pid: loc.pid },
            { url: first.url, tokenFile: first.tokenFile, source: "daemon.json", pid: first.pid });
        assert.equal(client.connection.daemonState, "ready");
    });

    it("gets a streamed completion, also through the provider", async () => {
        const deltas: string[] = [];
        const r = await client.complete(
            { uri: "file:///project/add.py", language: "python", prefix: "def add(a, b):\n    return ", suffix: "\n", max_tokens: 4 },
            { onDelta: (t) => deltas.push(t) });
        assert.ok(["stop", "length"].includes(r.finishReason), r.finishReason);
        assert.equal(r.items.length, 1);
        assert.equal(typeof r.items[0], "string");
        assert.ok((r.timings.ttft_ms ?? 0) > 0, "the daemon reports a TTFT");
        // Deltas preview item 0 (the done item is authoritative); they come
        // whenever it has visible text (the daemon holds back trailing
        // blanks/closers, and a tiny-model answer may be nothing but those).
        if (/[A-Za-z0-9_]/.test(r.items[0])) {
            assert.ok(deltas.length > 0, "deltas were streamed");
        }

        // The same through the inline provider (fake editor, real daemon).
        const results: string[] = [];
        const provider = new InlineProvider<vscode.InlineCompletionItem>(client, vscodeItemFactory(vscode),
            () => ({ ...DEFAULT_CONFIG, debounceMs: 0, maxTokens: 4 }), { onResult: (res) => results.push(res.finishReason) });
        const { doc, pos } = vscode.docAt("def mul(a, b):\n    return |\n");
        const items = await provider.provideInlineCompletionItems(doc, pos, { triggerKind: 1 }, vscode.newToken().token);
        assert.equal(results.length, 1);
        assert.ok(["stop", "length"].includes(results[0]), results[0]);
        for (const item of items ?? []) {
            assert.ok(item.insertText.startsWith("    return "), item.insertText);
            assert.deepEqual(item.range?.start, new vscode.Position(1, 0));
        }
    });

    it("cancels: the daemon stops the request and answers done/cancelled quickly", async () => {
        const abort = new AbortController();
        let abortedAt = 0;
        const p = client.complete(
            { uri: "file:///project/long.py", prefix: "import os\n\ndef main():\n    ", suffix: "", max_tokens: 1024 },
            {
                signal: abort.signal,
                onDelta: () => {
                    if (!abortedAt) {
                        abortedAt = Date.now();
                        abort.abort();
                    }
                },
            });
        const r = await p;
        const took = Date.now() - abortedAt;
        assert.ok(abortedAt > 0, "a delta arrived before the cancel");
        assert.equal(r.finishReason, "cancelled");
        assert.equal(r.cancelled, true);
        assert.ok(r.timings.total_ms !== undefined, "the done came from the daemon (it has timings)");
        assert.ok(took < 5000, `cancel took ${took} ms`);
        assert.ok((r.timings.generated_tokens ?? 0) < 1024);
        assert.equal(client.inFlight, 0);
    });

    it("reconnects after the daemon dies and a new one starts on the same port", async () => {
        const port = Number(new URL(first.url).port);
        const pending = client.complete({ uri: "file:///project/crash.py", prefix: "class A:\n    ", max_tokens: 1024 });
        // Kill while the request is surely in flight: a short completion from
        // the tiny model can finish within a few hundred ms on a fast machine.
        await new Promise((r) => setTimeout(r, 20));
        first.process.kill("SIGKILL"); // a crash, not a drain
        await assert.rejects(pending, (e: unknown) => e instanceof DaemonError && e.code === "disconnected" && e.retryable);
        await first.exited;
        const deadline = Date.now() + 10_000;
        while (client.isOpen && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
        assert.equal(client.isOpen, false);

        const second = await serve(port);
        assert.equal(second.url, first.url);
        await client.waitOpen(15_000);
        const r = await client.complete({ uri: "file:///project/add.py", prefix: "def add(a, b):\n    return ", suffix: "\n", max_tokens: 4 });
        assert.ok(["stop", "length"].includes(r.finishReason), r.finishReason);
        assert.equal(r.items.length, 1);
    });
});
