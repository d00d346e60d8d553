// A small fake of the `vscode` module: enough for the provider and the
// extension's activation to run in plain Node. Importing this file makes
// `require("vscode")` return it.

/* eslint-disable @typescript-eslint/no-explicit-any */
import Module = require("module");

export class Position {
    constructor(public readonly line: number, public readonly character: number) {}
}

export class Range {
    readonly start: Position;
    readonly end: Position;
    constructor(startLine: number, startCharacter: number, endLine: number, endCharacter: number) {
        this.start = new Position(startLine, startCharacter);
        this.end = new Position(endLine, endCharacter);
    }
}

export class InlineCompletionItem {
    constructor(public insertText: string, public range?: Range, public command?: { command: string; title: string; arguments: unknown[] }) {}
}

export class ThemeColor {
    constructor(public readonly id: string) {}
}

export enum StatusBarAlignment { Left = 1, Right = 2 }
export enum ConfigurationTarget { Global = 1, Workspace = 2, WorkspaceFolder = 3 }
export enum InlineCompletionTriggerKind { Invoke = 0, Automatic = 1 }

export class Uri {
    constructor(private readonly value: string) {}
    toString(): string {
        return this.value;
    }
    static parse(value: string): Uri {
        return new Uri(value);
    }
}

/** A text document over a string. */
export class TextDocument {
    version = 1;
    constructor(public text: string, public languageId = "python", public uri: Uri = Uri.parse("file:///project/a.py")) {}
    getText(): string {
        return this.text;
    }
    offsetAt(p: { line: number; character: number }): number {
        const lines = this.text.split("\n");
        let off = 0;
        for (let i = 0; i < p.line && i < lines.length; i++) off += lines[i].length + 1;
        return off + Math.min(p.character, (lines[p.line] ?? "").length);
    }
    positionAt(offset: number): Position {
        const before = this.text.slice(0, offset).split("\n");
        return new Position(before.length - 1, before[before.length - 1].length);
    }
    lineAt(line: number): { text: string } {
        return { text: this.text.split("\n")[line] ?? "" };
    }
    /** Replace the whole text (a keystroke). */
    set(text: string): void {
        this.text = text;
        this.version++;
    }
}

/** A document and cursor from text with a `|` marking the cursor. */
export function docAt(marked: string, languageId = "python", uri = "file:///project/a.py"): { doc: TextDocument; pos: Position } {
    const i = marked.indexOf("|");
    if (i < 0) throw new Error("no cursor mark");
    const doc = new TextDocument(marked.slice(0, i) + marked.slice(i + 1), languageId, Uri.parse(uri));
    return { doc, pos: doc.positionAt(i) };
}

export interface FakeToken {
    readonly isCancellationRequested: boolean;
    onCancellationRequested(listener: () => unknown): { dispose(): void };
}

export class CancellationTokenSource {
    private listeners: Array<() => unknown> = [];
    private cancelled = false;
    readonly token: FakeToken;
    constructor() {
        const listeners = (): Array<() => unknown> => this.listeners;
        const isCancelled = (): boolean => this.cancelled;
        this.token = {
            get isCancellationRequested(): boolean {
                return isCancelled();
            },
            onCancellationRequested: (l: () => unknown) => {
                listeners().push(l);
                return { dispose: () => { this.listeners = this.listeners.filter((x) => x !== l); } };
            },
        };
    }
    cancel(): void {
        if (this.cancelled) return;
        this.cancelled = true;
        for (const l of [...this.listeners]) l();
    }
}

export function newToken(): CancellationTokenSource {
    return new CancellationTokenSource();
}

// ----------------------------------------------------------------------
// window / workspace / commands / languages, recording what happens
// ----------------------------------------------------------------------

export interface Recorded {
    commands: Map<string, (...args: any[]) => unknown>;
    providers: Array<{ selector: unknown; provider: any }>;
    messages: Array<{ level: "info" | "warning" | "error"; text: string; items: string[] }>;
    output: string[];
    statusItems: any[];
    settings: Record<string, unknown>;
    configListeners: Array<(e: { affectsConfiguration(s: string): boolean }) => void>;
    /** Answer for the next message box (undefined: dismissed). */
    answer?: string;
}

export const recorded: Recorded = {
    commands: new Map(),
    providers: [],
    messages: [],
    output: [],
    statusItems: [],
    settings: {},
    configListeners: [],
};

export function resetRecorded(settings: Record<string, unknown> = {}): void {
    recorded.commands.clear();
    recorded.providers.length = 0;
    recorded.messages.length = 0;
    recorded.output.length = 0;
    recorded.statusItems.length = 0;
    recorded.settings = { ...settings };
    recorded.configListeners.length = 0;
    recorded.answer = undefined;
}

function disposable(f: () => void = () => undefined): { dispose(): void } {
    return { dispose: f };
}

function message(level: "info" | "warning" | "error") {
    return (text: string, ...rest: unknown[]): Promise<string | undefined> => {
        const items = rest.filter((x): x is string => typeof x === "string");
        recorded.messages.push({ level, text, items });
        return Promise.resolve(recorded.answer);
    };
}

function logLine(level: string) {
    return (line: string) => { recorded.output.push(`${level} ${line}`); };
}

export const window = {
    activeTextEditor: undefined as undefined | { document: TextDocument },
    createOutputChannel: (_name: string, _opts?: unknown) => ({
        appendLine: (l: string) => { recorded.output.push(l); },
        append: (l: string) => { recorded.output.push(l); },
        info: logLine("info"), warn: logLine("warn"), error: logLine("error"), debug: logLine("debug"), trace: logLine("trace"),
        show: () => undefined,
        dispose: () => undefined,
    }),
    createStatusBarItem: () => {
        const item = { text: "", tooltip: "", command: "", name: "", backgroundColor: undefined as unknown, visible: false,
            show() { item.visible = true; }, hide() { item.visible = false; }, dispose() { item.visible = false; } };
        recorded.statusItems.push(item);
        return item;
    },
    showInformationMessage: message("info"),
    showWarningMessage: message("warning"),
    showErrorMessage: message("error"),
    onDidChangeActiveTextEditor: () => disposable(),
};

function fireConfig(): void {
    for (const l of [...recorded.configListeners]) l({ affectsConfiguration: (s: string) => s === "soldaemon" || s.startsWith("soldaemon.") });
}

export function setSetting(key: string, value: unknown): void {
    recorded.settings[key] = value;
    fireConfig();
}

export const workspace = {
    getConfiguration: (section: string) => ({
        get: (key: string) => recorded.settings[`${section}.${key}`],
        update: (key: string, value: unknown) => {
            recorded.settings[`${section}.${key}`] = value;
            fireConfig();
            return Promise.resolve();
        },
    }),
    onDidChangeConfiguration: (l: (e: { affectsConfiguration(s: string): boolean }) => void) => {
        recorded.configListeners.push(l);
        return disposable(() => {
            const i = recorded.configListeners.indexOf(l);
            if (i >= 0) recorded.configListeners.splice(i, 1);
        });
    },
};

export const commands = {
    registerCommand: (id: string, f: (...args: any[]) => unknown) => {
        if (recorded.commands.has(id)) throw new Error(`command ${id} registered twice`);
        recorded.commands.set(id, f);
        return disposable(() => recorded.commands.delete(id));
    },
    executeCommand: (id: string, ...args: unknown[]) => Promise.resolve(recorded.commands.get(id)?.(...args)),
};

export const languages = {
    registerInlineCompletionItemProvider: (selector: unknown, provider: unknown) => {
        const entry = { selector, provider };
        recorded.providers.push(entry);
        return disposable(() => {
            const i = recorded.providers.indexOf(entry);
            if (i >= 0) recorded.providers.splice(i, 1);
        });
    },
};

export const version = "1.85.0-fake";

/** Make `require("vscode")` resolve to this module. */
const M = Module as unknown as { _resolveFilename: (request: string, ...rest: unknown[]) => string };
const original = M._resolveFilename;
M._resolveFilename = function (request: string, ...rest: unknown[]): string {
    if (request === "vscode") {
        return __filename;
    }
    return original.call(this, request, ...rest);
};
