// Frames of the soldaemon websocket protocol, version 1 (docs/protocol.md).
// Only what the extension sends or reads; unknown fields are ignored.

export const PROTOCOL_VERSION = 1;

export type Multiline = "auto" | "single" | "multi";
export type FinishReason = "stop" | "length" | "budget" | "cancelled" | "superseded" | string;
export type DaemonState = "loading" | "ready" | "draining";

/** The fields of a `complete` message that the caller chooses (`id` and
 * `type` are the client's). */
export interface CompletionRequest {
    uri: string;
    prefix: string;
    suffix?: string;
    version?: number;
    language?: string;
    max_tokens?: number;
    budget_ms?: number;
    multiline?: Multiline;
    priority?: "normal" | "high";
    context?: { uri: string; text: string }[];
}

export interface Timings {
    queue_ms?: number;
    prompt_ms?: number;
    prefill_ms?: number;
    ttft_ms?: number;
    decode_ms?: number;
    total_ms?: number;
    prompt_tokens?: number;
    cached_tokens?: number;
    generated_tokens?: number;
    [key: string]: number | undefined;
}

export interface DeltaFrame {
    type: "delta";
    id: string;
    text: string;
}

export interface DoneFrame {
    type: "done";
    id: string;
    items: string[];
    finish_reason: FinishReason;
    timings?: Timings;
}

export interface ErrorFrame {
    type: "error";
    id: string | null;
    code: string;
    message: string;
    retryable?: boolean;
    hint?: string;
}

export interface StatusFrame {
    type: "status";
    kind: "hello" | "state" | "health" | "debug" | string;
    id?: string;
    state?: DaemonState;
    protocol?: number;
    daemon?: string;
    model?: string;
    [key: string]: unknown;
}

export type ServerFrame = DeltaFrame | DoneFrame | ErrorFrame | StatusFrame;

/** Parse one daemon frame; undefined for anything that is not a known,
 * well-formed frame (the protocol says: ignore what you do not know). */
export function parseServerFrame(data: string): ServerFrame | undefined {
    let value: unknown;
    try {
        value = JSON.parse(data);
    } catch {
        return undefined;
    }
    if (typeof value !== "object" || value === null || Array.isArray(value)) {
        return undefined;
    }
    const frame = value as Record<string, unknown>;
    switch (frame.type) {
        case "delta":
            return typeof frame.id === "string" && typeof frame.text === "string"
                ? (frame as unknown as DeltaFrame) : undefined;
        case "done":
            return typeof frame.id === "string" && Array.isArray(frame.items)
                && frame.items.every((x) => typeof x === "string")
                ? (frame as unknown as DoneFrame) : undefined;
        case "error":
            return (typeof frame.id === "string" || frame.id === null || frame.id === undefined)
                && typeof frame.code === "string"
                ? ({ ...frame, id: frame.id ?? null, message: String(frame.message ?? "") } as unknown as ErrorFrame)
                : undefined;
        case "status":
            return typeof frame.kind === "string" ? (frame as unknown as StatusFrame) : undefined;
        default:
            return undefined;
    }
}
