// DaemonClient against a scripted fake daemon (fast); the real daemon is in
// integration.test.ts.

import { strict as assert } from "node:assert";
import { after, describe, it } from "node:test";
import { DaemonClient, DaemonError } from "../daemonClient";
import { FakeDaemon } from "../testing/fakeDaemon";

const TOKEN = "t".repeat(43);

const cleanups: Array<() => Promise<void> | void> = [];
after(async () => {
    for (const c of cleanups.reverse()) await c();
});

async function daemon(opts: Partial<ConstructorParameters<typeof FakeDaemon>[0]> = {}): Promise<FakeDaemon> {
    const d = await new FakeDaemon({ token: TOKEN, ...opts }).start();
    cleanups.push(() => d.stop());
    return d;
}

function client(url: () => string, token = TOKEN): DaemonClient {
    const c = new DaemonClient({ resolve: async () => ({ url: url(), token }), backoff: { initialMs: 20, maxMs: 100 } });
    cleanups.push(() => c.stop());
    return c;
}

function until(cond: () => boolean, ms = 3000): Promise<void> {
    const deadline = Date.now() + ms;
    return new Promise((resolve, reject) => {
        const tick = (): void => {
            if (cond()) resolve();
            else if (Date.now() > deadline) reject(new Error("timed out waiting"));
            else setTimeout(tick, 5);
        };
        tick();
    });
}

describe("DaemonClient", () => {
    it("connects with the bearer token and no Origin, and reads hello", async () => {
        const d = await daemon();
        const c = client(() => d.url);
        c.start();
        await c.waitOpen(3000);
        assert.equal(d.handshakes[0].authorization, `Bearer ${TOKEN}`);
        assert.equal(d.handshakes[0].origin, undefined);
        await until(() => c.connection.daemonState === "ready");
        assert.equal(c.connection.hello?.model, "fake-model");
    });

    it("streams deltas and resolves with done", async () => {
        const d = await daemon({ reply: () => ({ deltas: ["a +", " b"], items: ["a + b"] }) });
        const c = client(() => d.url);
        c.start();
        await c.waitOpen(3000);
        const deltas: string[] = [];
        const r = await c.complete({ uri: "file:///a.py", prefix: "return ", suffix: "\n", max_tokens: 8 },
            { onDelta: (t) => deltas.push(t) });
        assert.deepEqual(deltas, ["a +", " b"]);
        assert.deepEqual(r.items, ["a + b"]);
        assert.equal(r.finishReason, "stop");
        assert.equal(r.timings.ttft_ms, 3);
        assert.ok(r.clientTtftMs !== undefined && r.clientTtftMs >= 0);
        const sent = d.received.find((m) => m.type === "complete")!;
        assert.equal(sent.v, 1);
        assert.equal(sent.prefix, "return ");
        assert.equal(sent.max_tokens, 8);
        assert.equal(typeof sent.id, "string");
    });

    it("sends cancel when the signal aborts and settles with cancelled", async () => {
        const d = await daemon({ reply: () => ({ deltas: ["x", "y", "z"], items: ["xyz"], delayMs: 200 }) });
        const c = client(() => d.url);
        c.start();
        await c.waitOpen(3000);
        const abort = new AbortController();
        let sentId = "";
        const p = c.complete({ uri: "u", prefix: "p" }, { signal: abort.signal, onSent: (id) => { sentId = id; } });
        await until(() => d.received.some((m) => m.type === "complete"));
        abort.abort();
        const r = await p;
        assert.equal(r.finishReason, "cancelled");
        assert.equal(r.cancelled, true);
        assert.ok(d.received.some((m) => m.type === "cancel" && m.id === sentId));
        assert.equal(c.inFlight, 0);
        // A cancel that races the done gets unknown_id: ignored.
        c.cancel(sentId);
        const again = await c.complete({ uri: "u", prefix: "q" }, { signal: new AbortController().signal });
        assert.deepEqual(again.items, ["xyz"]);
    });

    it("rejects on an error frame with its code", async () => {
        const d = await daemon({ reply: () => ({ error: "busy", retryable: true }) });
        const c = client(() => d.url);
        c.start();
        await c.waitOpen(3000);
        await assert.rejects(c.complete({ uri: "u", prefix: "p" }), (e: unknown) =>
            e instanceof DaemonError && e.code === "busy" && e.retryable);
    });

    it("answers health", async () => {
        const d = await daemon();
        const c = client(() => d.url);
        c.start();
        await c.waitOpen(3000);
        const h = await c.health(2000);
        assert.equal(h.kind, "health");
        assert.equal(h.model, "fake-model");
    });

    it("reports a refused token, and keeps retrying", async () => {
        const d = await daemon();
        const c = client(() => d.url, "wrong".repeat(10));
        c.start();
        await until(() => c.connection.failures >= 2);
        assert.equal(c.connection.lastError?.code, "unauthorized");
        assert.match(c.connection.lastError?.hint ?? "", /tokenFile/);
        assert.notEqual(c.connection.state, "open");
    });

    it("fails fast when not connected; says no daemon is listening", async () => {
        const d = await daemon();
        const port = d.port;
        await d.stop();
        const c = client(() => `ws://127.0.0.1:${port}`);
        c.start();
        await until(() => c.connection.failures >= 1);
        assert.equal(c.connection.lastError?.code, "unreachable");
        await assert.rejects(c.complete({ uri: "u", prefix: "p" }), (e: unknown) => e instanceof DaemonError && e.code === "unreachable");
    });

    it("rejects requests in flight when the connection drops, then reconnects to a daemon on the same port", async () => {
        const d1 = await daemon({ reply: () => ({ deltas: ["a"], items: ["a"], delayMs: 500 }) });
        const port = d1.port;
        const c = client(() => `ws://127.0.0.1:${port}`);
        c.start();
        await c.waitOpen(3000);
        const p = c.complete({ uri: "u", prefix: "p" });
        await until(() => d1.received.length > 0);
        await d1.stop();
        await assert.rejects(p, (e: unknown) => e instanceof DaemonError && e.code === "disconnected" && e.retryable);
        await until(() => c.connection.failures >= 1);
        const d2 = await daemon({ port, reply: () => ({ deltas: ["b"], items: ["b"] }) });
        await c.waitOpen(3000);
        const r = await c.complete({ uri: "u", prefix: "p" });
        assert.deepEqual(r.items, ["b"]);
        assert.ok(d2.handshakes.length >= 1);
    });

    it("times a request out, cancelling it", async () => {
        const d = await daemon({ reply: () => ({ deltas: [], items: ["late"], delayMs: 1000 }) });
        const c = client(() => d.url);
        c.start();
        await c.waitOpen(3000);
        await assert.rejects(c.complete({ uri: "u", prefix: "p" }, { timeoutMs: 50 }), (e: unknown) => e instanceof DaemonError && e.code === "timeout");
        await until(() => d.received.some((m) => m.type === "cancel"));
    });

    it("backs off exponentially up to the cap", () => {
        const c = new DaemonClient({ resolve: async () => ({ url: "ws://127.0.0.1:1", token: TOKEN }), backoff: { initialMs: 100, maxMs: 1000 } });
        const d1 = c.backoffDelay(1);
        const d3 = c.backoffDelay(3);
        const d9 = c.backoffDelay(9);
        assert.ok(d1 >= 85 && d1 <= 115, `${d1}`);
        assert.ok(d3 >= 340 && d3 <= 460, `${d3}`);
        assert.ok(d9 >= 850 && d9 <= 1150, `${d9}`);
    });

    it("stop() rejects what is pending and stops reconnecting", async () => {
        const d = await daemon({ reply: () => ({ deltas: [], items: ["x"], delayMs: 1000 }) });
        const c = client(() => d.url);
        c.start();
        await c.waitOpen(3000);
        const p = c.complete({ uri: "u", prefix: "p" });
        c.stop();
        await assert.rejects(p, (e: unknown) => e instanceof DaemonError && e.code === "closed");
        assert.equal(c.connection.state, "stopped");
        const n = d.handshakes.length;
        await new Promise((r) => setTimeout(r, 100));
        assert.equal(d.handshakes.length, n);
    });
});
