// A scripted stand-in for soldaemon's websocket server (docs/protocol.md),
// for fast client tests. The real daemon is exercised by the integration
// test.

import * as http from "http";
import { AddressInfo } from "net";
import { WebSocket, WebSocketServer } from "ws";

export interface FakeDaemonOptions {
    token: string;
    port?: number;
    /** Answer for a complete: the deltas, then done with items. */
    reply?: (msg: Record<string, unknown>) => { deltas: string[]; items: string[]; delayMs?: number } | { error: string; retryable?: boolean };
    state?: "loading" | "ready";
}

export class FakeDaemon {
    readonly received: Array<Record<string, unknown>> = [];
    readonly handshakes: http.IncomingHttpHeaders[] = [];
    private server?: http.Server;
    private wss?: WebSocketServer;
    private readonly sockets = new Set<WebSocket>();
    private readonly timers = new Set<NodeJS.Timeout>();
    port = 0;

    constructor(private readonly opts: FakeDaemonOptions) {}

    get url(): string {
        return `ws://127.0.0.1:${this.port}`;
    }

    async start(): Promise<this> {
        const server = http.createServer((_req, res) => { res.writeHead(404); res.end(); });
        const wss = new WebSocketServer({ noServer: true });
        server.on("upgrade", (req, socket, head) => {
            this.handshakes.push(req.headers);
            if (req.headers.authorization !== `Bearer ${this.opts.token}`) {
                socket.end("HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                return;
            }
            if (req.headers.origin !== undefined) {
                socket.end("HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                return;
            }
            wss.handleUpgrade(req, socket, head, (ws) => this.onConnection(ws));
        });
        await new Promise<void>((resolve, reject) => {
            server.once("error", reject);
            server.listen(this.opts.port ?? 0, "127.0.0.1", () => resolve());
        });
        this.server = server;
        this.wss = wss;
        this.port = (server.address() as AddressInfo).port;
        return this;
    }

    private onConnection(ws: WebSocket): void {
        this.sockets.add(ws);
        ws.on("close", () => this.sockets.delete(ws));
        const send = (m: Record<string, unknown>): void => {
            if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(m));
        };
        send({ type: "status", kind: "hello", protocol: 1, state: this.opts.state ?? "ready", daemon: "fake", model: "fake-model" });
        const running = new Map<string, NodeJS.Timeout[]>();
        ws.on("message", (data) => {
            const msg = JSON.parse(data.toString()) as Record<string, unknown>;
            this.received.push(msg);
            const id = msg.id as string;
            if (msg.type === "complete") {
                const r = this.opts.reply?.(msg) ?? { deltas: ["hello"], items: ["hello"] };
                if ("error" in r) {
                    send({ type: "error", id, code: r.error, message: `fake ${r.error}`, retryable: r.retryable ?? false });
                    return;
                }
                const step = r.delayMs ?? 5;
                const timers: NodeJS.Timeout[] = [];
                r.deltas.forEach((text, i) => {
                    timers.push(this.later(() => send({ type: "delta", id, text }), step * (i + 1)));
                });
                timers.push(this.later(() => {
                    running.delete(id);
                    send({ type: "done", id, items: r.items, finish_reason: "stop", timings: { ttft_ms: 3, total_ms: 9 } });
                }, step * (r.deltas.length + 1)));
                running.set(id, timers);
            } else if (msg.type === "cancel") {
                const timers = running.get(id);
                if (!timers) {
                    send({ type: "error", id, code: "unknown_id", message: "no such request", retryable: false });
                    return;
                }
                running.delete(id);
                timers.forEach((t) => clearTimeout(t));
                send({ type: "done", id, items: [], finish_reason: "cancelled", timings: {} });
            } else if (msg.type === "health") {
                send({ type: "status", kind: "health", id, state: "ready", model: "fake-model", device: "cpu", sol_diagnosis: { active: true } });
            }
        });
    }

    private later(f: () => void, ms: number): NodeJS.Timeout {
        const t = setTimeout(() => { this.timers.delete(t); f(); }, ms);
        this.timers.add(t);
        return t;
    }

    /** Close every connection with `code` (1001: shutting down). */
    dropConnections(code = 1001): void {
        for (const ws of this.sockets) ws.close(code);
    }

    async stop(): Promise<void> {
        for (const t of this.timers) clearTimeout(t);
        this.timers.clear();
        for (const ws of this.sockets) ws.terminate();
        this.wss?.close();
        const server = this.server;
        this.server = undefined;
        if (server) {
            server.closeAllConnections?.();
            await new Promise<void>((r) => server.close(() => r()));
        }
    }
}
