// A websocket client for soldaemon (docs/protocol.md). No `vscode` import:
// it runs in plain Node, so the integration test drives this very code
// against a real `soldaemon serve`.
//
// - connects with the token in the `Authorization: Bearer` header and no
//   `Origin` header (the daemon refuses browser origins);
// - reconnects by itself with exponential back-off (re-resolving the
//   endpoint each time, so a daemon restarted on another port is found);
// - multiplexes requests by id, streams `delta` frames, settles on
//   `done`/`error`, and sends `cancel` when the caller's AbortSignal fires;
// - answers `health` and sends `event` frames.

import WebSocket from "ws";
import {
    CompletionRequest, DaemonState, DoneFrame, ErrorFrame, FinishReason, PROTOCOL_VERSION,
    StatusFrame, Timings, parseServerFrame,
} from "./protocol";

/** Where the daemon is and the token to present. */
export interface Endpoint {
    url: string;
    token: string;
    /** Where the token came from, for messages. */
    tokenFile?: string;
}

export type EndpointResolver = () => Promise<Endpoint>;

/** Every failure the client reports. `code` is a protocol error code
 * (`busy`, `unavailable`, …) or one of the client's own: `no_token`,
 * `unauthorized`, `forbidden`, `not_found`, `unreachable`, `timeout`,
 * `disconnected`, `not_connected`, `handshake`, `closed`. */
export class DaemonError extends Error {
    constructor(
        public readonly code: string,
        message: string,
        public readonly retryable: boolean = false,
        public readonly hint?: string,
    ) {
        super(message);
        this.name = "DaemonError";
    }
}

export type ConnectionState = "idle" | "connecting" | "open" | "waiting" | "stopped";

export interface ConnectionInfo {
    state: ConnectionState;
    url?: string;
    /** The daemon's own state from `hello`/`state` frames, while open. */
    daemonState?: DaemonState;
    hello?: StatusFrame;
    /** Why the last connection attempt failed or the last connection ended. */
    lastError?: DaemonError;
    /** Failed attempts since the last successful connection. */
    failures: number;
    /** When the next attempt is due (epoch ms), while waiting. */
    nextAttemptAt?: number;
}

export interface BackoffOptions {
    initialMs: number;
    maxMs: number;
    factor: number;
}

export interface ClientOptions {
    resolve: EndpointResolver;
    backoff?: Partial<BackoffOptions>;
    /** Handshake timeout. */
    connectTimeoutMs?: number;
    /** How long a cancelled request may wait for its `done` before it is
     * settled locally. */
    cancelGraceMs?: number;
    log?: (line: string) => void;
}

export interface CompleteOptions {
    /** Aborting sends `cancel`; the promise then settles with the daemon's
     * `done` (`finish_reason: "cancelled"`) or, after a grace period, locally. */
    signal?: AbortSignal;
    onDelta?: (text: string, id: string) => void;
    /** Wait this long for a connection if there is none yet (default 0:
     * fail at once with `not_connected`). */
    waitForConnectionMs?: number;
    /** Overall limit; on expiry the request is cancelled and rejected with
     * `timeout`. */
    timeoutMs?: number;
    /** Called with the id as soon as the request is sent. */
    onSent?: (id: string) => void;
}

export interface CompletionResult {
    id: string;
    items: string[];
    finishReason: FinishReason;
    timings: Timings;
    /** Client-side: send → first delta (undefined when none came). */
    clientTtftMs?: number;
    /** Client-side: send → done. */
    clientTotalMs: number;
    /** Whether the request was cancelled by the caller. */
    cancelled: boolean;
}

interface Pending {
    id: string;
    sentAt: number;
    firstDeltaAt?: number;
    cancelled: boolean;
    onDelta?: (text: string, id: string) => void;
    resolve: (r: CompletionResult) => void;
    reject: (e: DaemonError) => void;
    /** Clears timers and listeners; called once, when the request settles. */
    cleanup: () => void;
    /** Called when the request is cancelled (starts the grace timer). */
    onCancel: () => void;
}

interface PendingHealth {
    resolve: (body: StatusFrame) => void;
    reject: (e: DaemonError) => void;
    timer: NodeJS.Timeout;
}

type Listener = (info: ConnectionInfo) => void;

const DEFAULT_BACKOFF: BackoffOptions = { initialMs: 250, maxMs: 10_000, factor: 2 };

export class DaemonClient {
    private readonly opts: ClientOptions;
    private readonly backoff: BackoffOptions;
    private ws?: WebSocket;
    private info: ConnectionInfo = { state: "idle", failures: 0 };
    private retryTimer?: NodeJS.Timeout;
    private readonly pending = new Map<string, Pending>();
    private readonly healthPending = new Map<string, PendingHealth>();
    private readonly listeners = new Set<Listener>();
    private openWaiters: Array<() => void> = [];
    private counter = 0;
    private readonly session = Math.random().toString(36).slice(2, 8);

    constructor(opts: ClientOptions) {
        this.opts = opts;
        this.backoff = { ...DEFAULT_BACKOFF, ...(opts.backoff ?? {}) };
    }

    // ------------------------------------------------------------------
    // Connection
    // ------------------------------------------------------------------

    get connection(): ConnectionInfo {
        return { ...this.info };
    }

    get isOpen(): boolean {
        return this.info.state === "open" && this.ws?.readyState === WebSocket.OPEN;
    }

    /** Subscribe to connection changes; returns an unsubscribe function. */
    onChange(listener: Listener): () => void {
        this.listeners.add(listener);
        return () => this.listeners.delete(listener);
    }

    /** Start connecting (and keep reconnecting until `stop`). */
    start(): void {
        if (this.info.state === "idle" || this.info.state === "stopped") {
            this.connectSoon(0);
        }
    }

    /** Drop the current connection (if any) and connect again at once,
     * with the back-off reset: after the daemon was (re)started. */
    reconnectNow(): void {
        this.clearRetry();
        this.info.failures = 0;
        const ws = this.ws;
        this.ws = undefined;
        if (ws) {
            this.failAll(new DaemonError("disconnected", "reconnecting", true));
            ws.removeAllListeners();
            ws.on("error", () => undefined);
            ws.terminate();
        }
        this.connectSoon(0);
    }

    /** Close the connection and stop reconnecting. */
    stop(): void {
        this.clearRetry();
        const ws = this.ws;
        this.ws = undefined;
        this.failAll(new DaemonError("closed", "the client was stopped", false));
        if (ws) {
            ws.removeAllListeners();
            ws.on("error", () => undefined);
            if (ws.readyState === WebSocket.OPEN) {
                ws.close(1000);
            } else {
                ws.terminate();
            }
        }
        this.update({ state: "stopped", daemonState: undefined, nextAttemptAt: undefined });
        this.resolveOpenWaiters();
    }

    /** Resolve once connected; reject after `timeoutMs`. */
    waitOpen(timeoutMs: number): Promise<void> {
        if (this.isOpen) {
            return Promise.resolve();
        }
        return new Promise<void>((resolve, reject) => {
            const timer = setTimeout(() => {
                this.openWaiters = this.openWaiters.filter((w) => w !== waiter);
                reject(this.info.lastError ?? new DaemonError("not_connected", "not connected to soldaemon", true));
            }, timeoutMs);
            const waiter = (): void => {
                clearTimeout(timer);
                if (this.isOpen) {
                    resolve();
                } else {
                    reject(this.info.lastError ?? new DaemonError("not_connected", "not connected to soldaemon", true));
                }
            };
            this.openWaiters.push(waiter);
        });
    }

    private resolveOpenWaiters(): void {
        const waiters = this.openWaiters;
        this.openWaiters = [];
        for (const w of waiters) {
            w();
        }
    }

    private update(patch: Partial<ConnectionInfo>): void {
        this.info = { ...this.info, ...patch };
        const snapshot = this.connection;
        for (const l of [...this.listeners]) {
            try {
                l(snapshot);
            } catch (e) {
                this.log(`listener failed: ${String(e)}`);
            }
        }
    }

    private log(line: string): void {
        this.opts.log?.(line);
    }

    private clearRetry(): void {
        if (this.retryTimer) {
            clearTimeout(this.retryTimer);
            this.retryTimer = undefined;
        }
    }

    private connectSoon(delayMs: number): void {
        this.clearRetry();
        if (delayMs <= 0) {
            void this.connect();
            return;
        }
        this.update({ state: "waiting", nextAttemptAt: Date.now() + delayMs });
        this.retryTimer = setTimeout(() => {
            this.retryTimer = undefined;
            void this.connect();
        }, delayMs);
    }

    /** The delay before the next attempt after `failures` failures. */
    backoffDelay(failures: number): number {
        const base = Math.min(this.backoff.maxMs, this.backoff.initialMs * this.backoff.factor ** Math.max(0, failures - 1));
        return Math.round(base * (0.85 + Math.random() * 0.3));
    }

    private scheduleRetry(error: DaemonError): void {
        if (this.info.state === "stopped") {
            return;
        }
        const failures = this.info.failures + 1;
        const delay = this.backoffDelay(failures);
        this.info.failures = failures;
        this.info.lastError = error;
        this.info.daemonState = undefined;
        this.log(`not connected (${error.code}: ${error.message}); retrying in ${delay} ms`);
        this.connectSoon(delay);
        this.resolveOpenWaiters();
    }

    private async connect(): Promise<void> {
        this.update({ state: "connecting", nextAttemptAt: undefined });
        let endpoint: Endpoint;
        try {
            endpoint = await this.opts.resolve();
        } catch (e) {
            if (this.info.state !== "connecting") {
                return; // stopped meanwhile
            }
            this.scheduleRetry(asDaemonError(e, "no_token"));
            return;
        }
        if (this.info.state !== "connecting") {
            return;
        }
        this.update({ url: endpoint.url });
        let ws: WebSocket;
        try {
            ws = new WebSocket(endpoint.url, {
                headers: { Authorization: `Bearer ${endpoint.token}` },
                perMessageDeflate: false,
                handshakeTimeout: this.opts.connectTimeoutMs ?? 5000,
                maxPayload: 64 * 1024 * 1024,
                followRedirects: false,
            });
        } catch (e) {
            this.scheduleRetry(new DaemonError("bad_endpoint", `invalid daemon URL ${endpoint.url}: ${errText(e)}`, false,
                "check the soldaemon.endpoint setting (e.g. ws://127.0.0.1:8765)"));
            return;
        }
        this.ws = ws;
        let failed = false;
        const fail = (err: DaemonError): void => {
            if (failed || this.ws !== ws) {
                return;
            }
            failed = true;
            this.ws = undefined;
            ws.removeAllListeners();
            ws.on("error", () => undefined);
            ws.terminate();
            this.failAll(new DaemonError("disconnected", `connection to soldaemon lost: ${err.message}`, true));
            this.scheduleRetry(err);
        };
        ws.on("unexpected-response", (_req, res) => {
            fail(handshakeError(res.statusCode ?? 0, endpoint));
        });
        ws.on("error", (e: NodeJS.ErrnoException) => {
            fail(socketError(e, endpoint.url));
        });
        ws.on("open", () => {
            if (this.ws !== ws) {
                return;
            }
            this.log(`connected to ${endpoint.url}`);
            this.update({ state: "open", failures: 0, lastError: undefined, url: endpoint.url });
            this.resolveOpenWaiters();
        });
        ws.on("message", (data: WebSocket.RawData) => {
            if (this.ws === ws) {
                this.onMessage(rawToString(data));
            }
        });
        ws.on("close", (code: number, reason: Buffer) => {
            const why = code === 1001 ? "the daemon is shutting down"
                : code === 1009 ? "a message was too large"
                    : code === 1011 ? "the daemon had an internal error"
                        : `closed with code ${code}${reason.length ? ` (${reason.toString()})` : ""}`;
            fail(new DaemonError("disconnected", why, true));
        });
    }

    // ------------------------------------------------------------------
    // Frames
    // ------------------------------------------------------------------

    private send(msg: Record<string, unknown>): boolean {
        const ws = this.ws;
        if (!ws || ws.readyState !== WebSocket.OPEN) {
            return false;
        }
        ws.send(JSON.stringify({ v: PROTOCOL_VERSION, ...msg }));
        return true;
    }

    private onMessage(data: string): void {
        const frame = parseServerFrame(data);
        if (!frame) {
            return;
        }
        switch (frame.type) {
            case "delta": {
                const p = this.pending.get(frame.id);
                if (p && !p.cancelled) {
                    p.firstDeltaAt ??= Date.now();
                    try {
                        p.onDelta?.(frame.text, frame.id);
                    } catch (e) {
                        this.log(`delta listener failed: ${errText(e)}`);
                    }
                }
                return;
            }
            case "done":
                this.settleDone(frame);
                return;
            case "error":
                this.settleError(frame);
                return;
            case "status":
                this.onStatus(frame);
                return;
        }
    }

    private onStatus(frame: StatusFrame): void {
        if (frame.kind === "hello") {
            this.update({ hello: frame, daemonState: frame.state });
        } else if (frame.kind === "state") {
            this.update({ daemonState: frame.state });
        } else if (frame.kind === "health" && frame.id !== undefined) {
            const h = this.healthPending.get(frame.id);
            if (h) {
                this.healthPending.delete(frame.id);
                clearTimeout(h.timer);
                if (frame.state) {
                    this.update({ daemonState: frame.state });
                }
                h.resolve(frame);
            }
        }
    }

    private settleDone(frame: DoneFrame): void {
        const p = this.pending.get(frame.id);
        if (!p) {
            return;
        }
        this.pending.delete(frame.id);
        p.cleanup();
        const now = Date.now();
        p.resolve({
            id: frame.id,
            items: frame.items,
            finishReason: frame.finish_reason,
            timings: frame.timings ?? {},
            clientTtftMs: p.firstDeltaAt !== undefined ? p.firstDeltaAt - p.sentAt : undefined,
            clientTotalMs: now - p.sentAt,
            cancelled: p.cancelled,
        });
    }

    private settleError(frame: ErrorFrame): void {
        if (frame.code === "unknown_id") {
            return; // a cancel that raced the done; harmless
        }
        const err = new DaemonError(frame.code, frame.message, frame.retryable ?? false, frame.hint);
        if (frame.id === null) {
            this.log(`daemon error: ${frame.code}: ${frame.message}`);
            return;
        }
        const p = this.pending.get(frame.id);
        if (p) {
            this.pending.delete(frame.id);
            p.cleanup();
            if (frame.code === "unavailable") {
                this.update({ daemonState: this.info.daemonState === "draining" ? "draining" : "loading" });
            }
            p.reject(err);
            return;
        }
        const h = this.healthPending.get(frame.id);
        if (h) {
            this.healthPending.delete(frame.id);
            clearTimeout(h.timer);
            h.reject(err);
        }
    }

    private failAll(err: DaemonError): void {
        const pending = [...this.pending.values()];
        this.pending.clear();
        for (const p of pending) {
            p.cleanup();
            if (p.cancelled) {
                p.resolve(cancelledResult(p.id, p.sentAt));
            } else {
                p.reject(err);
            }
        }
        const health = [...this.healthPending.values()];
        this.healthPending.clear();
        for (const h of health) {
            clearTimeout(h.timer);
            h.reject(err);
        }
    }

    // ------------------------------------------------------------------
    // Requests
    // ------------------------------------------------------------------

    /** A fresh request id, unique for this client. */
    nextId(prefix = "c"): string {
        this.counter += 1;
        return `${prefix}${this.session}-${this.counter}`;
    }

    /** Send a `complete` and resolve with its `done`. Rejects with a
     * DaemonError for an `error` frame, a lost connection, or a timeout. */
    async complete(req: CompletionRequest, options: CompleteOptions = {}): Promise<CompletionResult> {
        const signal = options.signal;
        if (signal?.aborted) {
            return cancelledResult("", Date.now());
        }
        if (!this.isOpen && (options.waitForConnectionMs ?? 0) > 0) {
            await this.waitOpen(options.waitForConnectionMs ?? 0);
        }
        if (signal?.aborted) {
            return cancelledResult("", Date.now());
        }
        if (!this.isOpen) {
            throw this.info.lastError ?? new DaemonError("not_connected", "not connected to soldaemon", true);
        }
        const id = this.nextId();
        return new Promise<CompletionResult>((resolve, reject) => {
            let timeout: NodeJS.Timeout | undefined;
            let grace: NodeJS.Timeout | undefined;
            const onAbort = (): void => this.cancel(id);
            const p: Pending = {
                id,
                sentAt: Date.now(),
                cancelled: false,
                onDelta: options.onDelta,
                resolve,
                reject,
                cleanup: () => {
                    if (timeout) clearTimeout(timeout);
                    if (grace) clearTimeout(grace);
                    signal?.removeEventListener("abort", onAbort);
                },
                onCancel: () => {
                    // Wait a little for the daemon's done, then settle locally.
                    grace = setTimeout(() => {
                        if (this.pending.get(id) === p) {
                            this.pending.delete(id);
                            p.cleanup();
                            resolve(cancelledResult(id, p.sentAt));
                        }
                    }, this.opts.cancelGraceMs ?? 3000);
                },
            };
            if (options.timeoutMs !== undefined) {
                timeout = setTimeout(() => {
                    if (this.pending.get(id) === p) {
                        this.pending.delete(id);
                        p.cleanup();
                        this.send({ type: "cancel", id });
                        reject(new DaemonError("timeout", `no answer from soldaemon within ${options.timeoutMs} ms`, true));
                    }
                }, options.timeoutMs);
            }
            this.pending.set(id, p);
            if (!this.send({ ...req, type: "complete", id })) {
                this.pending.delete(id);
                p.cleanup();
                reject(new DaemonError("not_connected", "not connected to soldaemon", true));
                return;
            }
            signal?.addEventListener("abort", onAbort, { once: true });
            options.onSent?.(id);
        });
    }

    /** Tell the daemon to stop request `id`. Its promise settles with the
     * daemon's `done` (finish reason `cancelled`) — or the result it had
     * already produced, if the cancel raced the done. */
    cancel(id: string): void {
        const p = this.pending.get(id);
        if (!p || p.cancelled) {
            return;
        }
        p.cancelled = true;
        p.onCancel();
        if (!this.send({ type: "cancel", id })) {
            // No connection: nothing runs on the daemon for us any more.
            this.pending.delete(id);
            p.cleanup();
            p.resolve(cancelledResult(id, p.sentAt));
        }
    }

    /** Ask for the daemon's `health` status frame. */
    health(timeoutMs = 5000): Promise<StatusFrame> {
        if (!this.isOpen) {
            return Promise.reject(this.info.lastError ?? new DaemonError("not_connected", "not connected to soldaemon", true));
        }
        const id = this.nextId("h");
        return new Promise<StatusFrame>((resolve, reject) => {
            const timer = setTimeout(() => {
                this.healthPending.delete(id);
                reject(new DaemonError("timeout", `no health answer within ${timeoutMs} ms`, true));
            }, timeoutMs);
            this.healthPending.set(id, { resolve, reject, timer });
            if (!this.send({ type: "health", id })) {
                this.healthPending.delete(id);
                clearTimeout(timer);
                reject(new DaemonError("not_connected", "not connected to soldaemon", true));
            }
        });
    }

    /** Report what the editor did with a completion (no reply). */
    event(id: string, kind: "shown" | "accepted" | "partial" | "rejected", item = 0, acceptedChars?: number): void {
        const msg: Record<string, unknown> = { type: "event", id, kind, item };
        if (acceptedChars !== undefined) {
            msg.accepted_chars = acceptedChars;
        }
        this.send(msg);
    }

    /** Requests still waiting for their answer (for tests and diagnosis). */
    get inFlight(): number {
        return this.pending.size;
    }
}

// ----------------------------------------------------------------------
// Helpers
// ----------------------------------------------------------------------

function cancelledResult(id: string, sentAt: number): CompletionResult {
    return { id, items: [], finishReason: "cancelled", timings: {}, clientTotalMs: Date.now() - sentAt, cancelled: true };
}

function rawToString(data: WebSocket.RawData): string {
    if (Array.isArray(data)) {
        return Buffer.concat(data).toString("utf8");
    }
    if (data instanceof ArrayBuffer) {
        return Buffer.from(data).toString("utf8");
    }
    return data.toString("utf8");
}

export function errText(e: unknown): string {
    return e instanceof Error ? e.message : String(e);
}

function asDaemonError(e: unknown, code: string): DaemonError {
    if (e instanceof DaemonError) {
        return e;
    }
    return new DaemonError(code, errText(e), true);
}

function handshakeError(status: number, endpoint: Endpoint): DaemonError {
    const where = endpoint.tokenFile ? ` (token from ${endpoint.tokenFile})` : "";
    switch (status) {
        case 401:
            return new DaemonError("unauthorized", `the daemon at ${endpoint.url} refused the token${where}`, true,
                "the token file does not belong to this daemon: set soldaemon.tokenFile to the daemon's token file (its ready line names it)");
        case 403:
            return new DaemonError("forbidden", `the daemon at ${endpoint.url} refused the connection (Origin/Host check)`, false,
                "connect to a loopback address (127.0.0.1 or localhost)");
        case 404:
            return new DaemonError("not_found", `${endpoint.url} is not a soldaemon websocket endpoint (HTTP 404)`, false,
                "check soldaemon.endpoint; the path must be / or /v1");
        default:
            return new DaemonError("handshake", `the websocket handshake with ${endpoint.url} failed (HTTP ${status})`, true);
    }
}

function socketError(e: NodeJS.ErrnoException, url: string): DaemonError {
    if (e.code === "ECONNREFUSED") {
        return new DaemonError("unreachable", `no daemon listening at ${url}`, true, "start it with: soldaemon serve");
    }
    if (e.message?.includes("Opening handshake has timed out")) {
        return new DaemonError("timeout", `the daemon at ${url} did not answer the handshake in time`, true);
    }
    return new DaemonError("unreachable", `cannot connect to ${url}: ${e.code ?? e.message}`, true);
}
