// The extension's settings (package.json `contributes.configuration`), read
// through a getter so that tests need no `vscode`.

import { DEFAULT_CONFIG, ProviderConfig } from "./provider";

export interface Settings {
    provider: ProviderConfig;
    endpoint: string;
    tokenFile: string;
    autoStart: boolean;
    command: string;
    serveArgs: string[];
    startTimeoutMs: number;
    slowTtftMs: number;
}

/** `get(key)` returns the setting under `soldaemon.` or undefined. */
export type Getter = (key: string) => unknown;

function num(v: unknown, dflt: number, lo: number, hi: number): number {
    const n = typeof v === "number" && Number.isFinite(v) ? v : dflt;
    return Math.min(hi, Math.max(lo, n));
}

function str(v: unknown, dflt: string): string {
    return typeof v === "string" ? v : dflt;
}

function bool(v: unknown, dflt: boolean): boolean {
    return typeof v === "boolean" ? v : dflt;
}

export function readSettings(get: Getter): Settings {
    const langs = get("languages");
    const languages: Record<string, boolean> = { ...DEFAULT_CONFIG.languages };
    if (langs && typeof langs === "object" && !Array.isArray(langs)) {
        for (const [k, v] of Object.entries(langs as Record<string, unknown>)) {
            if (typeof v === "boolean") languages[k] = v;
        }
    }
    const args = get("serveArgs");
    return {
        provider: {
            enabled: bool(get("enable"), true),
            languages,
            debounceMs: num(get("debounceMs"), DEFAULT_CONFIG.debounceMs, 0, 5000),
            maxLines: Math.round(num(get("maxLines"), DEFAULT_CONFIG.maxLines, 1, 200)),
            maxTokens: Math.round(num(get("maxTokens"), DEFAULT_CONFIG.maxTokens, 0, 2048)),
            budgetMs: num(get("budgetMs"), DEFAULT_CONFIG.budgetMs, 0, 120_000),
            maxPrefixChars: DEFAULT_CONFIG.maxPrefixChars,
            maxSuffixChars: DEFAULT_CONFIG.maxSuffixChars,
        },
        endpoint: str(get("endpoint"), "").trim(),
        tokenFile: str(get("tokenFile"), "").trim(),
        autoStart: bool(get("autoStart"), true),
        command: str(get("command"), "soldaemon").trim() || "soldaemon",
        serveArgs: Array.isArray(args) ? args.filter((a): a is string => typeof a === "string") : [],
        startTimeoutMs: num(get("startTimeoutSeconds"), 180, 5, 3600) * 1000,
        slowTtftMs: num(get("slowTtftMs"), 500, 1, 60_000),
    };
}
