import { strict as assert } from "node:assert";
import { describe, it } from "node:test";
import { serverCommand } from "../serverProcess";
import * as fs from "node:fs";
import * as path from "node:path";
import { installCommand, installPython } from "../serverProcess";
import { DEFAULT_DEBOUNCE_MS, languageEnabled, launchChanged, launchFlags, readSettings, serverOptions } from "../settings";

const PKG = JSON.parse(fs.readFileSync(path.resolve(__dirname, "..", "..", "package.json"), "utf8"));
const BASE = { enable: true, languages: { "*": true, plaintext: false, markdown: false, scminput: false }, statusNotifications: true, earlyLines: true };

const settings = (values: Record<string, unknown>) => readSettings((k) => values[k]);

describe("settings → sol-lsp", () => {
    it("defaults: sol-lsp on PATH, starting a daemon when none answers", () => {
        const s = settings({});
        assert.deepEqual(serverCommand(s), { command: "sol-lsp", args: ["--stdio", "--log-level", "warning", "--start-daemon"] });
        assert.deepEqual(serverOptions(s), { ...BASE, startTimeoutS: 180, debounceMs: 25, maxLines: 8, slowMs: 500, budgetMs: null });
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
        assert.deepEqual(o, { ...BASE, startTimeoutS: 180, debounceMs: 2000, maxLines: 1, slowMs: 500, budgetMs: 800, maxTokens: 32 });
    });

    it("every number setting is clamped to the range package.json declares (which sol-lsp accepts)", () => {
        const props: Record<string, { type: string; minimum?: number; maximum?: number }> =
            PKG.contributes.configuration.properties;
        const numbers = Object.entries(props).filter(([, p]) => p.type === "integer" || p.type === "number");
        assert.ok(numbers.length >= 6);
        for (const [key, p] of numbers) {
            const name = key.replace(/^soldaemon\./, "") as keyof ReturnType<typeof readSettings>;
            assert.ok(p.minimum !== undefined && p.maximum !== undefined, `${key} declares its range`);
            assert.equal(settings({ [name]: 1e12 })[name], p.maximum, key);
            assert.equal(settings({ [name]: -1e12 })[name], p.minimum, key);
        }
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

    it("enable and languages go to sol-lsp, which keeps disabled documents from the daemon", () => {
        const o = serverOptions(settings({ enable: false, languages: { go: false } }));
        assert.equal(o.enable, false);
        assert.deepEqual(o.languages, { ...BASE.languages, go: false });
    });

    it("the interpreter: soldaemon.python runs `python -m lsp.server`; else the Python extension's env's sol-lsp if present", () => {
        assert.deepEqual(serverCommand(settings({ python: "/venv/bin/python", autoStart: false })).args.slice(0, 3), ["-I", "-m", "lsp.server"]);
        assert.equal(serverCommand(settings({}), "/nonexistent/env/bin/python").command, "sol-lsp");
        assert.equal(installPython(settings({}), "/env/bin/python"), "/env/bin/python");
        assert.equal(installPython(settings({ python: "/v/bin/python" }), "/env/bin/python"), "/v/bin/python");
        assert.equal(installCommand("/my env/bin/python", "/src/soldaemon"), `"/my env/bin/python" -m pip install -e /src/soldaemon`);
    });

    it("package.json: the debounce default is sol-lsp's; VS Code's own accept keys, Shift+Tab guarded", () => {
        assert.equal(PKG.contributes.configuration.properties["soldaemon.debounceMs"].default, DEFAULT_DEBOUNCE_MS);
        const keys = PKG.contributes.keybindings as Array<{ command: string; key: string; when: string }>;
        assert.deepEqual(keys.map((k) => k.key), ["shift+tab"]);
        assert.equal(keys[0].command, "editor.action.inlineSuggest.acceptNextLine");
        assert.match(keys[0].when, /!inSnippetMode/);
        assert.equal(PKG.capabilities.untrustedWorkspaces.supported, false);
        for (const f of [PKG.icon, "LICENSE", "CHANGELOG.md"]) assert.ok(fs.existsSync(path.resolve(__dirname, "..", "..", f)), f);
    });
});
