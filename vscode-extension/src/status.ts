// What the status bar item says. Pure: the extension feeds it sol-lsp's
// process state and its last `sol/status` notification.

export type StatusKind = "disabled" | "starting" | "connecting" | "ready" | "slow" | "error";

/** Params of sol-lsp's `sol/status` notification (lsp/status.py):
 * `lastMs` is the round trip of the last completion, `medianMs` the median
 * of the last 50 (absent before the first). */
export interface SolStatus {
    state: "connecting" | "ready" | "slow" | "error" | string;
    message?: string;
    url?: string | null;
    lastMs?: number | null;
    medianMs?: number | null;
}

/** The language server process, as the extension sees it. */
export type ServerPhase = "starting" | "running" | "restarting" | "stopped";

export interface StatusInput {
    enabled: boolean;
    /** Completions on for the active editor's language (undefined: no editor). */
    languageOn?: boolean;
    phase: ServerPhase;
    /** Why sol-lsp is not running (spawn failure, crash). */
    serverError?: string;
    sol?: SolStatus;
}

export interface StatusView {
    kind: StatusKind;
    text: string;
    tooltip: string;
}

export function formatMs(ms: number | undefined): string {
    if (ms === undefined || !Number.isFinite(ms)) return "–";
    return ms >= 10_000 ? `${(ms / 1000).toFixed(0)} s` : ms >= 1000 ? `${(ms / 1000).toFixed(1)} s` : `${Math.round(ms)} ms`;
}

export function computeStatus(s: StatusInput): StatusView {
    const click = "\n\nClick for the diagnosis.";
    if (!s.enabled) {
        return { kind: "disabled", text: "$(circle-slash) sol", tooltip: `soldaemon completions are off (soldaemon: Toggle Completions turns them on).${click}` };
    }
    if (s.phase === "stopped" || (s.phase === "restarting" && s.serverError)) {
        const again = s.phase === "restarting" ? "\nRestarting it…" : "";
        return { kind: "error", text: "$(error) sol", tooltip: `sol-lsp is not running: ${s.serverError ?? "stopped"}${again}${click}` };
    }
    if (s.phase !== "running" || !s.sol) {
        return { kind: "starting", text: "$(sync~spin) sol", tooltip: `Starting sol-lsp…${click}` };
    }
    const where = s.sol.url ? ` at ${s.sol.url}` : "";
    const why = s.sol.message ? `:\n${s.sol.message}` : "";
    const off = s.languageOn === false ? "\nOff for this file's language (soldaemon.languages)." : "";
    const lastMs = s.sol.lastMs ?? undefined;
    const medianMs = s.sol.medianMs ?? undefined;
    const last = lastMs !== undefined ? ` ${formatMs(lastMs)}` : "";
    const lastLine = lastMs !== undefined
        ? `\nLast completion: ${formatMs(lastMs)}` + (medianMs !== undefined ? ` (median of the last 50: ${formatMs(medianMs)})` : "")
        : "";
    switch (s.sol.state) {
        case "ready":
            return { kind: "ready", text: `$(check) sol${last}`, tooltip: `soldaemon${where} is ready.${lastLine}${off}${click}` };
        case "slow":
            return { kind: "slow", text: `$(watch) sol${last}`, tooltip: `soldaemon${where} is slow${why}${lastLine}${off}${click}` };
        case "error":
            return { kind: "error", text: "$(error) sol", tooltip: `soldaemon${where} is not working${why}${click}` };
        default:
            return { kind: "connecting", text: "$(sync~spin) sol", tooltip: `Connecting to soldaemon${where}${why}${click}` };
    }
}
