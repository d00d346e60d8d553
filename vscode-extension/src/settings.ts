// The extension's settings (package.json `contributes.configuration`), read
// through a getter so that tests need no `vscode`, and their translation
// into what sol-lsp understands: command-line flags for what only the
// user's own machine may decide (where the daemon is, how to start it), and
// `initializationOptions` for the rest (lsp/settings.py has both tables).

export interface Settings {
    enabled: boolean;
    /** Completions per language id; "*" is the default. */
    languages: Record<string, boolean>;
    // Launch: sol-lsp's command line; a change restarts sol-lsp.
    endpoint: string;
    tokenFile: string;
    autoStart: boolean;
    command: string;
    serveArgs: string[];
    serverCommand: string;
    serverArgs: string[];
    /** A Python with soldaemon installed: sol-lsp runs as `python -m lsp.server`. */
    python: string;
    logLevel: string;
    // Options: initializationOptions and workspace/didChangeConfiguration.
    startTimeoutSeconds: number;
    debounceMs: number;
    maxLines: number;
    maxTokens: number;          // 0: sol-lsp's default
    budgetMs: number;           // 0: none
    slowTtftMs: number;
}

/** `get(key)` returns the setting under `soldaemon.` or undefined. */
export type Getter = (key: string) => unknown;

/** sol-lsp's own default (lsp/settings.py `debounce_ms`; a test checks they agree). */
export const DEFAULT_DEBOUNCE_MS = 25;

const DEFAULT_LANGUAGES: Record<string, boolean> = { "*": true, plaintext: false, markdown: false, scminput: false };

function num(v: unknown, dflt: number, lo: number, hi: number): number {
    const n = typeof v === "number" && Number.isFinite(v) ? v : dflt;
    return Math.min(hi, Math.max(lo, n));
}

function str(v: unknown, dflt: string): string {
    return typeof v === "string" ? v.trim() : dflt;
}

function bool(v: unknown, dflt: boolean): boolean {
    return typeof v === "boolean" ? v : dflt;
}

function strings(v: unknown): string[] {
    return Array.isArray(v) ? v.filter((a): a is string => typeof a === "string") : [];
}

export function readSettings(get: Getter): Settings {
    const langs = get("languages");
    const languages: Record<string, boolean> = { ...DEFAULT_LANGUAGES };
    if (langs && typeof langs === "object" && !Array.isArray(langs)) {
        for (const [k, v] of Object.entries(langs as Record<string, unknown>)) {
            if (typeof v === "boolean") languages[k] = v;
        }
    }
    const level = str(get("serverLogLevel"), "warning");
    return {
        enabled: bool(get("enable"), true),
        languages,
        endpoint: str(get("endpoint"), ""),
        tokenFile: str(get("tokenFile"), ""),
        autoStart: bool(get("autoStart"), true),
        command: str(get("command"), "soldaemon") || "soldaemon",
        serveArgs: strings(get("serveArgs")),
        serverCommand: str(get("serverCommand"), ""),
        serverArgs: strings(get("serverArgs")),
        python: str(get("python"), ""),
        logLevel: ["debug", "info", "warning", "error"].includes(level) ? level : "warning",
        startTimeoutSeconds: num(get("startTimeoutSeconds"), 180, 5, 3600),
        debounceMs: num(get("debounceMs"), DEFAULT_DEBOUNCE_MS, 0, 2000),
        maxLines: Math.round(num(get("maxLines"), 8, 1, 200)),
        maxTokens: Math.round(num(get("maxTokens"), 0, 0, 2048)),
        budgetMs: num(get("budgetMs"), 0, 0, 120_000),
        slowTtftMs: num(get("slowTtftMs"), 500, 1, 600_000),
    };
}

export function languageEnabled(languages: Record<string, boolean>, languageId: string): boolean {
    return languages[languageId] ?? languages["*"] ?? true;
}

/** Quote one word for sol-lsp's shell-style split of `--daemon-command`
 * (shlex; no shell ever runs it). */
function shellWord(w: string): string {
    return /^[\w@%+=:,./-]+$/.test(w) ? w : `'${w.replace(/'/g, "'\"'\"'")}'`;
}

/** sol-lsp's flags for the launch settings. With an endpoint set, sol-lsp
 * never starts a daemon (as before: a fixed endpoint is someone else's). */
export function launchFlags(s: Settings): string[] {
    const flags = ["--stdio", "--log-level", s.logLevel];
    if (s.endpoint) flags.push("--url", s.endpoint);
    if (s.tokenFile) flags.push("--token-file", s.tokenFile);
    const start = s.autoStart && !s.endpoint;
    flags.push(start ? "--start-daemon" : "--no-start-daemon");
    if (start && (s.command !== "soldaemon" || s.serveArgs.length)) {
        flags.push("--daemon-command", [s.command, "serve", ...s.serveArgs].map(shellWord).join(" "));
    }
    return flags;
}

/** The `initializationOptions` (and didChangeConfiguration settings) keys
 * of lsp/settings.py; "0 = default" settings are left out. */
export function serverOptions(s: Settings): Record<string, unknown> {
    const o: Record<string, unknown> = {
        // sol-lsp itself keeps disabled documents away from the daemon (no
        // warm, no completion, no daemon start), not only this extension.
        enable: s.enabled,
        languages: { ...s.languages },
        // This client handles sol/status; sol-lsp sends it only to clients that say so.
        statusNotifications: true,
        // This client asks again on sol/completionReady: a block's first lines may show early.
        earlyLines: true,
        startTimeoutS: s.startTimeoutSeconds,
        debounceMs: s.debounceMs,
        maxLines: s.maxLines,
        slowMs: s.slowTtftMs,
        budgetMs: s.budgetMs > 0 ? s.budgetMs : null,
    };
    if (s.maxTokens > 0) o.maxTokens = s.maxTokens;
    return o;
}

/** Whether going from `a` to `b` needs a new sol-lsp process. */
export function launchChanged(a: Settings, b: Settings): boolean {
    return JSON.stringify([launchFlags(a), a.serverCommand, a.serverArgs, a.command, a.python])
        !== JSON.stringify([launchFlags(b), b.serverCommand, b.serverArgs, b.command, b.python]);
}
