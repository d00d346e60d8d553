// The inline-completion provider's logic. It does not import `vscode`: the
// editor objects it needs are described by the small interfaces below (the
// real `vscode` types satisfy them), and the objects it creates come from an
// ItemFactory, so unit tests run it in plain Node against a fake `vscode`.
//
// What it does for each request VS Code makes:
//   1. skip when disabled, for a language that is switched off, or while
//      the suggest widget shows a selection;
//   2. serve from the type-through cache when the user typed the start of a
//      suggestion that was already fetched (no debounce, no round trip);
//   3. otherwise wait `debounceMs` (aborted by VS Code's cancellation),
//      then ask the daemon; VS Code's cancellation token is bridged to an
//      AbortSignal, and the client sends `cancel` for it;
//   4. post-process: cap the lines, drop trailing lines that repeat the
//      text after the cursor, and let the suggestion replace the rest of the
//      line when it already contains it (closing brackets, a suffix), so
//      nothing is duplicated;
//   5. return an item whose range starts at the beginning of the line, so
//      the items for successive keystrokes share their start and VS Code
//      keeps the ghost text steady instead of flickering.

import type { CompletionResult } from "./daemonClient";
import type { CompletionRequest } from "./protocol";
import { isSecretUri } from "./sensitive";

/** Where completions come from: the DaemonClient, or a fake in tests.
 * Aborting the signal must cancel the request on the daemon. */
export interface CompletionBackend {
    complete(request: CompletionRequest, options: { signal?: AbortSignal }): Promise<CompletionResult>;
}

// ----------------------------------------------------------------------
// The editor, as the provider sees it
// ----------------------------------------------------------------------

export interface PositionLike {
    readonly line: number;
    readonly character: number;
}

export interface TextDocumentLike {
    readonly uri: { toString(): string };
    readonly version: number;
    readonly languageId: string;
    getText(): string;
    offsetAt(position: PositionLike): number;
    lineAt(line: number): { readonly text: string };
}

export interface CancellationTokenLike {
    readonly isCancellationRequested: boolean;
    onCancellationRequested(listener: () => unknown): { dispose(): unknown };
}

export interface InlineContextLike {
    /** 0: invoked explicitly, 1: automatic (vscode.InlineCompletionTriggerKind). */
    readonly triggerKind: number;
    readonly selectedCompletionInfo?: unknown;
}

/** A range as plain numbers. */
export interface RangeSpec {
    startLine: number;
    startCharacter: number;
    endLine: number;
    endCharacter: number;
}

export interface CommandSpec {
    command: string;
    title: string;
    arguments: unknown[];
}

/** Makes the editor's objects (vscode.InlineCompletionItem). */
export interface ItemFactory<I> {
    item(insertText: string, range: RangeSpec, command?: CommandSpec): I;
}

/** The part of the `vscode` module the factory needs. */
export interface VscodeLike<R, I> {
    Range: new (startLine: number, startCharacter: number, endLine: number, endCharacter: number) => R;
    InlineCompletionItem: new (insertText: string, range?: R, command?: CommandSpec) => I;
}

export function vscodeItemFactory<R, I>(vscode: VscodeLike<R, I>): ItemFactory<I> {
    return {
        item(insertText, r, command) {
            const range = new vscode.Range(r.startLine, r.startCharacter, r.endLine, r.endCharacter);
            return new vscode.InlineCompletionItem(insertText, range, command);
        },
    };
}

// ----------------------------------------------------------------------
// Configuration
// ----------------------------------------------------------------------

export interface ProviderConfig {
    enabled: boolean;
    /** languageId → on/off; "*" is the default for languages not listed. */
    languages: Record<string, boolean>;
    debounceMs: number;
    maxLines: number;
    /** Tokens per suggestion; 0: the daemon's completion.max_tokens. */
    maxTokens: number;
    /** Daemon-side wall-clock budget per request; 0: none. */
    budgetMs: number;
    maxPrefixChars: number;
    maxSuffixChars: number;
}

export const DEFAULT_CONFIG: ProviderConfig = {
    enabled: true,
    languages: { "*": true, plaintext: false, markdown: false, scminput: false },
    debounceMs: 75,
    maxLines: 8,
    maxTokens: 0,
    budgetMs: 0,
    maxPrefixChars: 16_000,
    maxSuffixChars: 4_000,
};

export function languageEnabled(languages: Record<string, boolean>, languageId: string): boolean {
    if (Object.prototype.hasOwnProperty.call(languages, languageId)) {
        return Boolean(languages[languageId]);
    }
    return languages["*"] !== false;
}

// ----------------------------------------------------------------------
// Snapshots and text logic (pure)
// ----------------------------------------------------------------------

/** What the provider knows about the cursor. */
export interface Snapshot {
    uri: string;
    version: number;
    language: string;
    line: number;
    character: number;
    /** Document offset of the cursor. */
    offset: number;
    /** Text before the cursor (windowed to maxPrefixChars). */
    prefix: string;
    /** Text after the cursor (windowed to maxSuffixChars). */
    suffix: string;
    /** The cursor line up to the cursor. */
    linePrefix: string;
    /** The cursor line after the cursor. */
    restOfLine: string;
}

export function snapshot(doc: TextDocumentLike, pos: PositionLike, cfg: ProviderConfig): Snapshot {
    const text = doc.getText();
    const offset = doc.offsetAt(pos);
    let start = Math.max(0, offset - cfg.maxPrefixChars);
    if (start > 0) {
        // Start on a whole line when the window cuts one (unless that loses too much).
        const nl = text.indexOf("\n", start);
        if (nl >= 0 && nl < offset && nl - start < 1000) {
            start = nl + 1;
        }
    }
    let end = Math.min(text.length, offset + cfg.maxSuffixChars);
    if (end < text.length) {
        const nl = text.lastIndexOf("\n", end);
        if (nl > offset) {
            end = nl;
        }
    }
    const lineText = doc.lineAt(pos.line).text;
    return {
        uri: doc.uri.toString(),
        version: doc.version,
        language: doc.languageId,
        line: pos.line,
        character: pos.character,
        offset,
        prefix: text.slice(start, offset),
        suffix: text.slice(offset, end),
        linePrefix: lineText.slice(0, pos.character),
        restOfLine: lineText.slice(pos.character),
    };
}

/** Keep at most `maxLines` lines (the cursor's line counts as the first). */
export function capLines(text: string, maxLines: number): string {
    if (maxLines < 1) {
        return text;
    }
    const lines = text.split("\n");
    return lines.length > maxLines ? lines.slice(0, maxLines).join("\n") : text;
}

/** Trailing whitespace and blank lines at the end of a suggestion are noise. */
export function trimEnd(text: string, restOfLine: string): string {
    if (restOfLine.trim() === "") {
        return text.replace(/\s+$/, "");
    }
    // Text continues after the cursor on this line: keep trailing spaces
    // (they may separate the suggestion from it), drop trailing blank lines.
    return text.replace(/\n[ \t]*$/, "").replace(/\n\s*$/, "");
}

function nonBlankLines(text: string): string[] {
    return text.split("\n").map((l) => l.trim()).filter((l) => l.length > 0);
}

/** Drop the suggestion's last lines when the document already has them
 * right after the cursor's line (e.g. a closing `}` the model repeated).
 * Only when nothing follows the cursor on its own line. */
export function dropRepeatedTail(text: string, snap: Pick<Snapshot, "suffix" | "restOfLine">): string {
    if (snap.restOfLine.trim() !== "" || !text.includes("\n")) {
        return text;
    }
    const after = snap.suffix.slice(snap.restOfLine.length);
    const following = nonBlankLines(after).slice(0, 20);
    if (following.length === 0) {
        return text;
    }
    const lines = text.split("\n");
    // The largest k such that the last k non-blank lines of the suggestion
    // equal the first k non-blank lines after the cursor's line. The
    // suggestion keeps its first line (the cursor's line) in any case.
    for (let k = Math.min(lines.length - 1, following.length); k >= 1; k--) {
        const tail = lines.slice(lines.length - k);
        const tailNonBlank = tail.map((l) => l.trim());
        if (tailNonBlank.some((l) => l === "")) {
            continue;
        }
        if (tailNonBlank.every((l, i) => l === following[i])) {
            return lines.slice(0, lines.length - k).join("\n").replace(/\s+$/, "");
        }
    }
    return text;
}

const CLOSERS_ONLY = /^[\s)\]}>"'`;,]*$/;

function isSubsequence(needle: string, hay: string): boolean {
    let i = 0;
    for (const ch of hay) {
        if (i < needle.length && ch === needle[i]) {
            i++;
        }
    }
    return i === needle.length;
}

/** Whether the suggestion already contains the rest of the cursor's line,
 * so that it should replace it rather than be inserted before it:
 * - its first line ends with the rest of the line (the model repeated the
 *   suffix: `foo(a, b)` with `)` after the cursor), or
 * - the rest of the line is only closing brackets, quotes and punctuation,
 *   and they appear in order in the suggestion's first line
 *   (`a, b); x = 1` with `)` after the cursor). */
export function consumesRestOfLine(text: string, restOfLine: string): boolean {
    const rest = restOfLine.trimEnd();
    if (rest === "") {
        return false;
    }
    const firstLine = text.split("\n", 1)[0];
    if (firstLine.trimEnd().endsWith(rest.trimStart()) && firstLine.trim().length >= rest.trim().length) {
        return true;
    }
    return CLOSERS_ONLY.test(rest) && isSubsequence(rest.replace(/\s+/g, ""), firstLine);
}

/** Cap, trim, and drop repeated trailing lines. The result is what the
 * cache stores: the rest-of-line handling happens at placement, since the
 * rest of the line can change while the user types (auto-closed brackets). */
export function postprocess(raw: string, snap: Snapshot, cfg: Pick<ProviderConfig, "maxLines">): string {
    let text = raw.replace(/\r\n/g, "\n");
    text = capLines(text, cfg.maxLines);
    text = trimEnd(text, snap.restOfLine);
    text = dropRepeatedTail(text, snap);
    return text;
}

/** Lines longer than this get a range that starts at the cursor instead. */
const MAX_LINE_START_PREFIX = 1000;

/** Where the item goes and what it inserts. */
export function placement(text: string, snap: Snapshot): { insertText: string; range: RangeSpec } {
    const endCharacter = consumesRestOfLine(text, snap.restOfLine)
        ? snap.character + snap.restOfLine.length
        : snap.character;
    if (snap.linePrefix.length <= MAX_LINE_START_PREFIX) {
        return {
            insertText: snap.linePrefix + text,
            range: { startLine: snap.line, startCharacter: 0, endLine: snap.line, endCharacter },
        };
    }
    return {
        insertText: text,
        range: { startLine: snap.line, startCharacter: snap.character, endLine: snap.line, endCharacter },
    };
}

// ----------------------------------------------------------------------
// Type-through cache
// ----------------------------------------------------------------------

interface CacheEntry {
    uri: string;
    offset: number;
    /** The last characters before the cursor when it was fetched. */
    before: string;
    restOfLine: string;
    text: string;
    id: string;
}

const BEFORE_CHARS = 256;

/** Suggestions already fetched, found again while the user types them. A
 * hit needs: same document; the cursor moved forward by t characters and
 * those characters are the first t of the suggestion; the text before the
 * original position is unchanged (last 256 characters); and the rest of the
 * line is the same, or grew only by auto-closed brackets/quotes. */
export class CompletionCache {
    private entries: CacheEntry[] = [];

    constructor(private readonly capacity = 32) {}

    get size(): number {
        return this.entries.length;
    }

    clear(): void {
        this.entries = [];
    }

    add(snap: Snapshot, text: string, id: string): void {
        if (!text) {
            return;
        }
        this.entries = this.entries.filter((e) => !(e.uri === snap.uri && e.offset === snap.offset));
        this.entries.unshift({
            uri: snap.uri, offset: snap.offset, before: snap.prefix.slice(-BEFORE_CHARS),
            restOfLine: snap.restOfLine, text, id,
        });
        if (this.entries.length > this.capacity) {
            this.entries.length = this.capacity;
        }
    }

    /** The rest of a cached suggestion for this cursor, or undefined. */
    lookup(snap: Snapshot): { text: string; id: string } | undefined {
        for (const e of this.entries) {
            if (e.uri !== snap.uri) continue;
            const t = snap.offset - e.offset;
            if (t < 0 || t >= e.text.length || t > snap.prefix.length) continue;
            const typed = snap.prefix.slice(snap.prefix.length - t);
            if (typed !== e.text.slice(0, t)) continue;
            const beforeNow = snap.prefix.slice(0, snap.prefix.length - t);
            if (!beforeNow.endsWith(e.before) && !(beforeNow.length < e.before.length && e.before.endsWith(beforeNow))) continue;
            if (!restCompatible(e.restOfLine, snap.restOfLine)) continue;
            // Move the entry to the front (most recently used).
            this.entries = [e, ...this.entries.filter((x) => x !== e)];
            return { text: e.text.slice(t), id: e.id };
        }
        return undefined;
    }
}

function restCompatible(then: string, now: string): boolean {
    if (then === now) return true;
    // Auto-closing inserted brackets or quotes in front of the old rest.
    return now.endsWith(then) && /^[)\]}>"'`]+$/.test(now.slice(0, now.length - then.length));
}

// ----------------------------------------------------------------------
// The provider
// ----------------------------------------------------------------------

export interface ProviderEvents {
    /** A request went to the daemon. */
    onRequest?(snap: Snapshot): void;
    /** The daemon answered (also for answers that were not shown). */
    onResult?(result: CompletionResult, shownText: string | undefined): void;
    /** The request failed (connection, daemon error). */
    onError?(error: unknown): void;
    /** Served from the type-through cache. */
    onCacheHit?(snap: Snapshot): void;
}

/** The command run when the user accepts an item (reports `accepted`). */
export const ACCEPT_COMMAND = "soldaemon.accepted";

export class InlineProvider<I> {
    readonly cache = new CompletionCache();

    constructor(
        private readonly backend: CompletionBackend,
        private readonly factory: ItemFactory<I>,
        private readonly config: () => ProviderConfig,
        private readonly events: ProviderEvents = {},
        private readonly sleep: (ms: number, token: CancellationTokenLike) => Promise<void> = cancellableSleep,
    ) {}

    async provideInlineCompletionItems(
        doc: TextDocumentLike, position: PositionLike, context: InlineContextLike, token: CancellationTokenLike,
    ): Promise<I[] | undefined> {
        const cfg = this.config();
        if (!cfg.enabled || !languageEnabled(cfg.languages, doc.languageId) || isSecretUri(doc.uri.toString())) {
            return undefined; // off, or a secret file (.env, keys, ~/.ssh): its text is never sent
        }
        if (context.selectedCompletionInfo) {
            return undefined; // the suggest widget is open; do not compete with it
        }
        const snap = snapshot(doc, position, cfg);

        const hit = this.cache.lookup(snap);
        if (hit) {
            this.events.onCacheHit?.(snap);
            return this.items(hit.text, snap, hit.id);
        }

        if (context.triggerKind !== 0 && cfg.debounceMs > 0) {
            await this.sleep(cfg.debounceMs, token);
        }
        if (token.isCancellationRequested) {
            return undefined;
        }

        const request: CompletionRequest = {
            uri: snap.uri,
            version: snap.version,
            language: snap.language,
            prefix: snap.prefix,
            suffix: snap.suffix,
            multiline: cfg.maxLines <= 1 ? "single" : "auto",
        };
        if (cfg.maxTokens > 0) {
            request.max_tokens = cfg.maxTokens;
        }
        if (cfg.budgetMs > 0) {
            request.budget_ms = cfg.budgetMs;
        }
        const abort = new AbortController();
        const sub = token.onCancellationRequested(() => abort.abort());
        let result: CompletionResult;
        try {
            this.events.onRequest?.(snap);
            result = await this.backend.complete(request, { signal: abort.signal });
        } catch (e) {
            this.events.onError?.(e);
            return undefined;
        } finally {
            sub.dispose();
        }
        const finished = !result.cancelled && result.finishReason !== "cancelled" && result.finishReason !== "superseded";
        const text = finished && result.items.length ? postprocess(result.items[0], snap, cfg) : "";
        if (text) {
            // Cached even when VS Code cancelled meanwhile: the user may be
            // typing exactly this text.
            this.cache.add(snap, text, result.id);
        }
        const shown = !token.isCancellationRequested && text ? text : undefined;
        this.events.onResult?.(result, shown);
        if (!shown) {
            return undefined;
        }
        return this.items(shown, snap, result.id);
    }

    private items(text: string, snap: Snapshot, id: string): I[] {
        if (!text) {
            return [];
        }
        const { insertText, range } = placement(text, snap);
        return [this.factory.item(insertText, range, { command: ACCEPT_COMMAND, title: "Accepted", arguments: [id] })];
    }
}

/** Resolve after `ms`, or at once when the token is cancelled. */
export function cancellableSleep(ms: number, token: CancellationTokenLike): Promise<void> {
    return new Promise<void>((resolve) => {
        if (token.isCancellationRequested) {
            resolve();
            return;
        }
        const sub = token.onCancellationRequested(() => {
            clearTimeout(timer);
            sub.dispose();
            resolve();
        });
        const timer = setTimeout(() => {
            sub.dispose();
            resolve();
        }, ms);
    });
}
