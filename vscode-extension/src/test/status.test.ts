import { strict as assert } from "node:assert";
import { describe, it } from "node:test";
import { ConnectionInfo, DaemonError } from "../daemonClient";
import { computeStatus, formatMs, StatusInput } from "../status";

const open: ConnectionInfo = { state: "open", failures: 0, url: "ws://127.0.0.1:8765", daemonState: "ready", hello: { type: "status", kind: "hello", model: "qwen" } };

function status(patch: Partial<StatusInput>) {
    return computeStatus({ enabled: true, connection: open, starting: false, slowTtftMs: 500, ...patch });
}

describe("status bar", () => {
    it("ready shows the last TTFT", () => {
        const s = status({ lastTtftMs: 42.4 });
        assert.equal(s.kind, "ready");
        assert.equal(s.text, "$(check) sol 42 ms");
        assert.match(s.tooltip, /ws:\/\/127\.0\.0\.1:8765 \(qwen\) is ready/);
    });

    it("slow above the threshold", () => {
        const s = status({ lastTtftMs: 1234 });
        assert.equal(s.kind, "slow");
        assert.equal(s.text, "$(watch) sol 1.2 s");
    });

    it("error with the reason and what to do", () => {
        const err = new DaemonError("unreachable", "no daemon listening at ws://127.0.0.1:8765", true, "start it with: soldaemon serve");
        const s = status({ connection: { state: "waiting", failures: 2, lastError: err } });
        assert.equal(s.kind, "error");
        assert.match(s.tooltip, /no daemon listening/);
        assert.match(s.tooltip, /soldaemon serve/);
        const start = status({ connection: { state: "waiting", failures: 1, lastError: err }, startError: new DaemonError("not_installed", "cannot run 'soldaemon'", false, "pip install soldaemon") });
        assert.equal(start.kind, "error");
        assert.match(start.tooltip, /could not be started[\s\S]*pip install/);
    });

    it("starting, connecting, loading, disabled", () => {
        assert.equal(status({ starting: true, connection: { state: "waiting", failures: 1 } }).kind, "starting");
        assert.equal(status({ connection: { state: "connecting", failures: 0 } }).kind, "connecting");
        assert.equal(status({ connection: { ...open, daemonState: "loading" } }).kind, "loading");
        assert.equal(status({ enabled: false }).kind, "disabled");
    });

    it("a non-retryable daemon error is shown; a retryable one is not", () => {
        assert.equal(status({ requestError: new DaemonError("bad_request", "prompt empty") }).kind, "error");
        assert.equal(status({ requestError: new DaemonError("busy", "busy", true) }).kind, "ready");
    });

    it("mentions a language that is switched off", () => {
        assert.match(status({ languageOn: false }).tooltip, /Off for this file's language/);
    });

    it("formats durations", () => {
        assert.equal(formatMs(undefined), "–");
        assert.equal(formatMs(999.6), "1000 ms");
        assert.equal(formatMs(12_500), "13 s");
    });
});
