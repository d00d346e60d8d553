// What the status bar item says. Pure: the extension feeds it the state.

import type { ConnectionInfo, DaemonError } from "./daemonClient";

export type StatusKind = "disabled" | "starting" | "connecting" | "loading" | "ready" | "slow" | "error";

export interface StatusInput {
    enabled: boolean;
    /** Whether completions are on for the active editor's language
     * (undefined: no editor). */
    languageOn?: boolean;
    connection: ConnectionInfo;
    /** The extension is starting the daemon. */
    starting: boolean;
    /** Why starting the daemon failed (cleared by the next success). */
    startError?: DaemonError;
    /** Last request error that was not a connection problem. */
    requestError?: DaemonError;
    lastTtftMs?: number;
    slowTtftMs: number;
}

export interface StatusView {
    kind: StatusKind;
    text: string;
    tooltip: string;
}

function describe(e: DaemonError): string {
    return e.hint ? `${e.message}\n→ ${e.hint}` : e.message;
}

export function formatMs(ms: number | undefined): string {
    if (ms === undefined || !Number.isFinite(ms)) return "–";
    return ms >= 10_000 ? `${(ms / 1000).toFixed(0)} s` : ms >= 1000 ? `${(ms / 1000).toFixed(1)} s` : `${Math.round(ms)} ms`;
}

export function computeStatus(s: StatusInput): StatusView {
    const where = s.connection.url ? ` at ${s.connection.url}` : "";
    const click = "\n\nClick for the diagnosis.";
    if (!s.enabled) {
        return { kind: "disabled", text: "$(circle-slash) sol", tooltip: `soldaemon completions are off (soldaemon: Toggle Completions turns them on).${click}` };
    }
    if (s.startError && s.connection.state !== "open") {
        return { kind: "error", text: "$(error) sol", tooltip: `soldaemon could not be started:\n${describe(s.startError)}${click}` };
    }
    if (s.starting && s.connection.state !== "open") {
        return { kind: "starting", text: "$(sync~spin) sol", tooltip: `Starting soldaemon (loading the model)…${click}` };
    }
    if (s.connection.state !== "open") {
        const err = s.connection.lastError;
        if (err && s.connection.failures > 0) {
            return { kind: "error", text: "$(error) sol", tooltip: `Not connected to soldaemon${where}:\n${describe(err)}\nRetrying…${click}` };
        }
        return { kind: "connecting", text: "$(sync~spin) sol", tooltip: `Connecting to soldaemon${where}…${click}` };
    }
    if (s.connection.daemonState === "loading") {
        return { kind: "loading", text: "$(sync~spin) sol", tooltip: `soldaemon${where} is loading its model…${click}` };
    }
    if (s.connection.daemonState === "draining") {
        return { kind: "connecting", text: "$(sync~spin) sol", tooltip: `soldaemon${where} is shutting down…${click}` };
    }
    const off = s.languageOn === false ? "\nOff for this file's language (soldaemon.languages)." : "";
    const model = typeof s.connection.hello?.model === "string" ? ` (${s.connection.hello.model})` : "";
    if (s.requestError && !s.requestError.retryable) {
        return { kind: "error", text: "$(warning) sol", tooltip: `soldaemon${where}${model} answered with an error:\n${describe(s.requestError)}${off}${click}` };
    }
    const ttft = s.lastTtftMs !== undefined ? ` ${formatMs(s.lastTtftMs)}` : "";
    const ttftLine = s.lastTtftMs !== undefined ? `\nLast time to first token: ${formatMs(s.lastTtftMs)}` : "";
    if (s.lastTtftMs !== undefined && s.lastTtftMs > s.slowTtftMs) {
        return {
            kind: "slow", text: `$(watch) sol${ttft}`,
            tooltip: `soldaemon${where}${model} is slow (over ${formatMs(s.slowTtftMs)} to the first token).${ttftLine}${off}${click}`,
        };
    }
    return { kind: "ready", text: `$(check) sol${ttft}`, tooltip: `soldaemon${where}${model} is ready.${ttftLine}${off}${click}` };
}
