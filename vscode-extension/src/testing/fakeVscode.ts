// A small fake of the `vscode` module: enough for the extension and
// vscode-languageclient to run in plain Node against a real sol-lsp.
// Importing this file makes `require("vscode")` return it. A member the
// fake lacks is reported on stderr once (and reads as undefined), so a
// new need of the language client shows up by name.

/* eslint-disable @typescript-eslint/no-explicit-any */
import Module = require("module");

export class Position {
    constructor(public readonly line: number, public readonly character: number) {}
    isEqual(o: Position): boolean {
        return o.line === this.line && o.character === this.character;
    }
}

export class Range {
    readonly start: Position;
    readonly end: Position;
    constructor(a: number | Position, b: number | Position, c?: number, d?: number) {
        this.start = typeof a === "number" ? new Position(a, b as number) : a;
        this.end = typeof a === "number" ? new Position(c as number, d as number) : b as Position;
    }
}

export class Selection extends Range {
    get active(): Position {
        return this.end;
    }
}

export class SnippetString {
    constructor(public value = "") {}
}

export class InlineCompletionItem {
    filterText?: string;
    constructor(public insertText: string | SnippetString, public range?: Range,
        public command?: { command: string; title: string; arguments?: unknown[] }) {}
}

export class InlineCompletionList {
    constructor(public items: InlineCompletionItem[]) {}
}

export class ThemeColor {
    constructor(public readonly id: string) {}
}

export class Disposable {
    constructor(private readonly f: () => unknown = () => undefined) {}
    static from(...items: Array<{ dispose(): unknown }>): Disposable {
        return new Disposable(() => items.forEach((i) => i.dispose()));
    }
    dispose(): void {
        this.f();
    }
}

export class EventEmitter<T> {
    private listeners: Array<(e: T) => unknown> = [];
    readonly event = (l: (e: T) => unknown, thisArg?: unknown): Disposable => {
        const bound = thisArg ? l.bind(thisArg) : l;
        this.listeners.push(bound);
        return new Disposable(() => { this.listeners = this.listeners.filter((x) => x !== bound); });
    };
    fire(e: T): void {
        for (const l of [...this.listeners]) l(e);
    }
    dispose(): void {
        this.listeners = [];
    }
}

export class CancellationError extends Error {}
/** Base classes the language client extends when it loads; never used here. */
export class CallHierarchyItem {}
export class CodeLens {}
export class CompletionItem {}
export class DocumentLink {}
export class InlayHint {}
export class SymbolInformation {}
export class TypeHierarchyItem {}
export class CodeAction {}
export class Diagnostic {}
export class TabInputText {}
export class TabInputTextDiff {}
export class TabInputNotebook {}
export class TabInputCustom {}
export class RelativePattern {
    constructor(public base: unknown, public pattern: string) {}
}

export const CodeActionKind = { Empty: "", QuickFix: "quickfix", Refactor: "refactor", RefactorExtract: "refactor.extract",
    RefactorInline: "refactor.inline", RefactorRewrite: "refactor.rewrite", Source: "source", SourceOrganizeImports: "source.organizeImports" };

export enum StatusBarAlignment { Left = 1, Right = 2 }
export enum ConfigurationTarget { Global = 1, Workspace = 2, WorkspaceFolder = 3 }
export enum InlineCompletionTriggerKind { Invoke = 0, Automatic = 1 }
export enum LogLevel { Off = 0, Trace = 1, Debug = 2, Info = 3, Warning = 4, Error = 5 }
export enum ProgressLocation { SourceControl = 1, Window = 10, Notification = 15 }
export enum TextDocumentChangeReason { Undo = 1, Redo = 2 }

export class Uri {
    private constructor(readonly scheme: string, readonly path: string, private readonly value: string) {}
    get fsPath(): string {
        return this.path;
    }
    toString(): string {
        return this.value;
    }
    toJSON(): string {
        return this.value;
    }
    static parse(value: string): Uri {
        const m = /^([a-z][\w+.-]*):(?:\/\/[^/]*)?(.*)$/i.exec(value);
        return new Uri(m ? m[1] : "file", m ? decodeURIComponent(m[2]) : value, value);
    }
    static file(p: string): Uri {
        return new Uri("file", p, `file://${encodeURI(p)}`);
    }
}

/** A text document over a string; edits fire onDidChangeTextDocument. */
export class TextDocument {
    version = 1;
    isClosed = false;
    isDirty = false;
    isUntitled = false;
    eol = 1;
    constructor(public text: string, public languageId = "python", public uri: Uri = Uri.parse("file:///project/a.py")) {}
    get fileName(): string {
        return this.uri.fsPath;
    }
    get lineCount(): number {
        return this.text.split("\n").length;
    }
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
    /** Insert `text` at `offset`, as a keystroke or an accepted suggestion. */
    insert(offset: number, text: string): void {
        const at = this.positionAt(offset);
        this.text = this.text.slice(0, offset) + text + this.text.slice(offset);
        this.version++;
        docChanged.fire({ document: this, reason: undefined,
            contentChanges: [{ range: new Range(at, at), rangeOffset: offset, rangeLength: 0, text }] });
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
    dispose(): void {
        this.listeners = [];
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
};

const configChanged = new EventEmitter<{ affectsConfiguration(s: string): boolean }>();
const docOpened = new EventEmitter<TextDocument>();
const docClosed = new EventEmitter<TextDocument>();
const docChanged = new EventEmitter<unknown>();
const never = new EventEmitter<unknown>().event;
const textDocuments: TextDocument[] = [];

export function resetRecorded(settings: Record<string, unknown> = {}): void {
    recorded.commands.clear();
    recorded.providers.length = 0;
    recorded.messages.length = 0;
    recorded.output.length = 0;
    recorded.statusItems.length = 0;
    recorded.settings = { ...settings };
    recorded.answer = undefined;
    textDocuments.length = 0;
    window.activeTextEditor = undefined;
}

/** Open `doc` (didOpen reaches the language server) and make it the
 * active editor with the cursor at `cursor`. */
export function openEditor(doc: TextDocument, cursor: Position): { document: TextDocument; selection: Selection } {
    textDocuments.push(doc);
    docOpened.fire(doc);
    const editor = { document: doc, selection: new Selection(cursor, cursor) };
    window.activeTextEditor = editor;
    return editor;
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

/** A namespace object that names the members it lacks. */
function strict<T extends object>(name: string, o: T): T {
    const told = new Set<PropertyKey>();
    return new Proxy(o, {
        get(target, key, receiver) {
            if (!(key in target) && typeof key === "string" && key !== "then" && !told.has(key)) {
                told.add(key);
                process.stderr.write(`fakeVscode: ${name}.${key} is not faked\n`);
            }
            return Reflect.get(target, key, receiver);
        },
    });
}

export const window = strict("window", {
    activeTextEditor: undefined as undefined | { document: TextDocument; selection: Selection },
    visibleTextEditors: [] as unknown[],
    tabGroups: { all: [] as unknown[], onDidChangeTabs: never },
    createOutputChannel: (_name: string, _opts?: unknown) => ({
        name: _name,
        logLevel: LogLevel.Info,
        onDidChangeLogLevel: never,
        appendLine: (l: string) => { recorded.output.push(l); },
        append: (l: string) => { recorded.output.push(l); },
        replace: (l: string) => { recorded.output.push(l); },
        clear: () => undefined,
        info: logLine("info"), warn: logLine("warn"), error: logLine("error"), debug: logLine("debug"), trace: logLine("trace"),
        show: () => undefined,
        hide: () => undefined,
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
    withProgress: (_o: unknown, task: (p: unknown, t: unknown) => Promise<unknown>) => task({ report: () => undefined }, newToken().token),
    onDidChangeActiveTextEditor: never,
    onDidChangeVisibleTextEditors: never,
});

export function setSetting(key: string, value: unknown): void {
    recorded.settings[key] = value;
    configChanged.fire({ affectsConfiguration: (s: string) => key === s || key.startsWith(`${s}.`) });
}

export const workspace = strict("workspace", {
    textDocuments,
    notebookDocuments: [] as unknown[],
    workspaceFolders: undefined as unknown,
    getConfiguration: (section?: string) => ({
        get: (key: string, dflt?: unknown) => recorded.settings[section ? `${section}.${key}` : key] ?? dflt,
        has: (key: string) => (section ? `${section}.${key}` : key) in recorded.settings,
        update: (key: string, value: unknown) => {
            setSetting(section ? `${section}.${key}` : key, value);
            return Promise.resolve();
        },
    }),
    getWorkspaceFolder: () => undefined,
    onDidChangeConfiguration: configChanged.event,
    onDidOpenTextDocument: docOpened.event,
    onDidCloseTextDocument: docClosed.event,
    onDidChangeTextDocument: docChanged.event,
    onDidSaveTextDocument: never,
    onWillSaveTextDocument: never,
    onDidChangeWorkspaceFolders: never,
    onDidOpenNotebookDocument: never,
    onDidCloseNotebookDocument: never,
    onDidChangeNotebookDocument: never,
    onDidSaveNotebookDocument: never,
    onDidCreateFiles: never,
    onDidRenameFiles: never,
    onDidDeleteFiles: never,
    onWillCreateFiles: never,
    onWillRenameFiles: never,
    onWillDeleteFiles: never,
    createFileSystemWatcher: () => ({ onDidCreate: never, onDidChange: never, onDidDelete: never, dispose: () => undefined }),
});

export const commands = strict("commands", {
    registerCommand: (id: string, f: (...args: any[]) => unknown) => {
        if (recorded.commands.has(id)) throw new Error(`command ${id} registered twice`);
        recorded.commands.set(id, f);
        return new Disposable(() => recorded.commands.delete(id));
    },
    executeCommand: (id: string, ...args: unknown[]) => Promise.resolve(recorded.commands.get(id)?.(...args)),
});

interface Filter { scheme?: string; language?: string; pattern?: string }

export const languages = strict("languages", {
    registerInlineCompletionItemProvider: (selector: unknown, provider: unknown) => {
        const entry = { selector, provider };
        recorded.providers.push(entry);
        return new Disposable(() => {
            const i = recorded.providers.indexOf(entry);
            if (i >= 0) recorded.providers.splice(i, 1);
        });
    },
    /** 10 when a filter of `selector` takes the document, else 0 (patterns
     * are not matched: the extension selects by scheme). */
    match: (selector: string | Filter | Array<string | Filter>, doc: TextDocument): number => {
        const all = Array.isArray(selector) ? selector : [selector];
        return all.some((f) => typeof f === "string" ? f === "*" || f === doc.languageId
            : (!f.scheme || f.scheme === "*" || f.scheme === doc.uri.scheme) && (!f.language || f.language === doc.languageId)) ? 10 : 0;
    },
    registerCompletionItemProvider: () => new Disposable(),
    createDiagnosticCollection: () => ({ set: () => undefined, delete: () => undefined, clear: () => undefined, dispose: () => undefined }),
});

export const env = strict("env", {
    appName: "Visual Studio Code (fake)",
    language: "en",
    machineId: "fake",
    openExternal: () => Promise.resolve(true),
});

/** Extensions: none installed unless a test adds one (the Python extension's API). */
export const installedExtensions = new Map<string, { isActive: boolean; exports: unknown; activate: () => Promise<unknown> }>();
export const extensions = strict("extensions", {
    getExtension: (id: string) => installedExtensions.get(id),
});

export const version = "1.91.0-fake";

/** Make `require("vscode")` resolve to this module. */
const M = Module as unknown as { _resolveFilename: (request: string, ...rest: unknown[]) => string };
const original = M._resolveFilename;
M._resolveFilename = function (request: string, ...rest: unknown[]): string {
    if (request === "vscode") {
        return __filename;
    }
    return original.call(this, request, ...rest);
};

// Last: every other member the language client reads is named on stderr.
module.exports = strict("vscode", module.exports as object);
