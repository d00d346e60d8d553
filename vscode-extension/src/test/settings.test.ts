import { strict as assert } from "node:assert";
import { describe, it } from "node:test";
import { serverCommand } from "../serverProcess";
import { languageEnabled, launchChanged, launchFlags, readSettings, serverOptions } from "../settings";

const settings = (values: Record<string, unknown>) => readSettings((k) => values[k]);

describe("settings → sol-lsp", () => {
    it("defaults: sol-lsp on PATH, starting a daemon when none answers", () => {
        const s = settings({});
        assert.deepEqual(serverCommand(s), { command: "sol-lsp", args: ["--stdio", "--log-level", "warning", "--start-daemon"] });
        assert.deepEqual(serverOptions(s), { startTimeoutS: 180, debounceMs: 75, maxLines: 8, slowMs: 500, budgetMs: null });
    });

    it("an endpoint is never started; the daemon command is quoted for sol-lsp's split", () => {
        assert.deepEqual(launchFlags(settings({ endpoint: "ws://127.0.0.1:9000", tokenFile: "/t/token" })),
            ["--stdio", "--log-level", "warning", "--url", "ws://127.0.0.1:9000", "--token-file", "/t/token", "--no-start-daemon"]);
        const flags = launchFlags(settings({ command: "/my venv/bin/soldaemon", serveArgs: ["--model", "/m/it's"] }));
        assert.equal(flags.at(-1), `'/my venv/bin/soldaemon' serve --model '/m/it'"'"'s'`);
        assert.equal(flags.at(-2), "--daemon-command");
    });

    it("serverCommand and serverArgs come before the flags", () => {
        const c = serverCommand(settings({ serverCommand: "/usr/bin/python3", serverArgs: ["-m", "lsp.server"], autoStart: false }));
        assert.deepEqual(c, { command: "/usr/bin/python3", args: ["-m", "lsp.server", "--stdio", "--log-level", "warning", "--no-start-daemon"] });
    });

    it("options: 0 means the server's default; values are clamped", () => {
        const o = serverOptions(settings({ maxTokens: 32, budgetMs: 800, debounceMs: 9000, maxLines: 0 }));
        assert.deepEqual(o, { startTimeoutS: 180, debounceMs: 2000, maxLines: 1, slowMs: 500, budgetMs: 800, maxTokens: 32 });
    });

    it("only launch settings need a new server", () => {
        assert.equal(launchChanged(settings({}), settings({ maxLines: 3 })), false);
        assert.equal(launchChanged(settings({}), settings({ endpoint: "ws://127.0.0.1:1" })), true);
        assert.equal(launchChanged(settings({}), settings({ serverLogLevel: "debug" })), true);
    });

    it("languages: the listed, else '*'", () => {
        const s = settings({ languages: { "*": false, python: true } });
        assert.equal(languageEnabled(s.languages, "python"), true);
        assert.equal(languageEnabled(s.languages, "go"), false);
        assert.equal(languageEnabled(settings({}).languages, "markdown"), false);
    });
});
