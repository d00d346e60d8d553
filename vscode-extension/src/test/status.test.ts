import { strict as assert } from "node:assert";
import { describe, it } from "node:test";
import { computeStatus, formatMs, StatusInput } from "../status";

function status(patch: Partial<StatusInput>) {
    return computeStatus({ enabled: true, phase: "running", sol: { state: "ready", url: "ws://127.0.0.1:8765" }, ...patch });
}

describe("status bar", () => {
    it("ready, with the last TTFT when sol/status carries it", () => {
        assert.equal(status({}).text, "$(check) sol");
        const s = status({ sol: { state: "ready", url: "ws://127.0.0.1:8765", lastMs: 42.4, medianMs: 40 } });
        assert.equal(s.kind, "ready");
        assert.equal(s.text, "$(check) sol 42 ms");
        assert.match(s.tooltip, /ws:\/\/127\.0\.0\.1:8765 is ready/);
    });

    it("follows sol/status: slow, error, connecting", () => {
        assert.equal(status({ sol: { state: "slow", message: "2 s to answer" } }).kind, "slow");
        const e = status({ sol: { state: "error", message: "token refused" } });
        assert.equal(e.kind, "error");
        assert.match(e.tooltip, /token refused/);
        assert.equal(status({ sol: { state: "connecting" } }).kind, "connecting");
    });

    it("the server process: starting, restarting after a crash, stopped", () => {
        assert.equal(status({ phase: "starting", sol: undefined }).kind, "starting");
        const r = status({ phase: "restarting", serverError: "sol-lsp exited (SIGKILL)" });
        assert.equal(r.kind, "error");
        assert.match(r.tooltip, /exited \(SIGKILL\)\nRestarting/);
        assert.match(status({ phase: "stopped", serverError: "cannot run 'sol-lsp': not found" }).tooltip, /not found/);
    });

    it("disabled wins; a language switched off is said", () => {
        assert.equal(status({ enabled: false, phase: "stopped" }).kind, "disabled");
        assert.match(status({ languageOn: false }).tooltip, /Off for this file's language/);
    });

    it("formats milliseconds", () => {
        assert.equal(formatMs(undefined), "–");
        assert.equal(formatMs(999.6), "1000 ms");
        assert.equal(formatMs(1234), "1.2 s");
        assert.equal(formatMs(12_345), "12 s");
    });
});
