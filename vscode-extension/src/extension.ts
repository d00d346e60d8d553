// The VS Code side: a language client of sol-lsp, which holds the whole
// completion logic (context from other files, warm, cancel, type-through,
// post-processing, finding and starting the daemon). What stays here is
// what only VS Code can do: the status bar, commands, settings, key
// bindings, starting the server process, and the event adapter
// (src/events.ts) for what the stable API has no hook for.

import type { ChildProcess } from "child_process";
import * as vscode from "vscode";
import {
    CloseAction, DidChangeConfigurationNotification, ErrorAction, LanguageClient, LanguageClientOptions, State,
} from "vscode-languageclient/node";
import { ACCEPT_COMMAND, CompletionEvents } from "./events";
import { serverCommand, spawnServer } from "./serverProcess";
import { Settings, languageEnabled, launchChanged, readSettings, serverOptions } from "./settings";
import { ServerPhase, SolStatus, computeStatus, formatMs } from "./status";

const SECTION = "soldaemon";
const SOL_STATUS = "sol/status";
/** Restarts of a crashed sol-lsp allowed within RESTART_WINDOW_MS. */
const MAX_RESTARTS = 4;
const RESTART_WINDOW_MS = 3 * 60_000;
/** The editor's own inline-suggestion commands that the wrappers call. */
export const BUILTIN = {
    acceptNextWord: "editor.action.inlineSuggest.acceptNextWord",
    acceptNextLine: "editor.action.inlineSuggest.acceptNextLine",
    hide: "editor.action.inlineSuggest.hide",
};

export class Controller implements vscode.Disposable {
    readonly output: vscode.LogOutputChannel;
    readonly statusItem: vscode.StatusBarItem;
    readonly client: LanguageClient;
    readonly events: CompletionEvents;
    private settings: Settings;
    private phase: ServerPhase = "starting";
    private serverError?: string;
    private sol?: SolStatus;
    /** The running sol-lsp process (its pid is in the diagnosis). */
    process?: ChildProcess;
    private readonly restarts: number[] = [];
    private readonly disposables: vscode.Disposable[] = [];
    private disposed = false;

    constructor(private readonly context: vscode.ExtensionContext) {
        this.settings = this.readSettings();
        this.output = vscode.window.createOutputChannel("soldaemon", { log: true });
        this.statusItem = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Right, 100);
        this.statusItem.name = "soldaemon";
        this.statusItem.command = "soldaemon.showDiagnosis";
        this.client = new LanguageClient("soldaemon", "soldaemon (sol-lsp)", () => this.spawn(), this.clientOptions());
        this.events = new CompletionEvents(
            (method, params) => { void this.notify(method, params); },
            (method) => this.serverHandles(method));
        this.client.onNotification(SOL_STATUS, (p: SolStatus) => {
            this.sol = p;
            this.render();
        });
        this.disposables.push(
            this.output,
            this.statusItem,
            this.client.onDidChangeState((e) => this.onState(e.newState)),
            vscode.commands.registerCommand("soldaemon.toggle", () => this.toggle()),
            vscode.commands.registerCommand("soldaemon.showDiagnosis", () => this.showDiagnosis()),
            vscode.commands.registerCommand("soldaemon.restartServer", () => this.restartServer()),
            vscode.commands.registerCommand("soldaemon.openLogs", () => this.output.show(true)),
            vscode.commands.registerCommand("soldaemon.acceptNextWord", () => this.acceptPart(BUILTIN.acceptNextWord)),
            vscode.commands.registerCommand("soldaemon.acceptNextLine", () => this.acceptPart(BUILTIN.acceptNextLine)),
            vscode.commands.registerCommand("soldaemon.dismiss", () => this.dismiss()),
            vscode.workspace.onDidChangeConfiguration((e) => {
                if (e.affectsConfiguration(SECTION)) void this.onSettingsChanged();
            }),
            vscode.window.onDidChangeActiveTextEditor(() => this.render()),
        );
    }

    async start(): Promise<void> {
        this.render();
        this.statusItem.show();
        try {
            await this.client.start();
        } catch (e) {
            this.failed(e);
        }
    }

    private readSettings(): Settings {
        const cfg = vscode.workspace.getConfiguration(SECTION);
        return readSettings((key) => cfg.get(key));
    }

    private clientOptions(): LanguageClientOptions {
        return {
            // Only schemes whose path sol-lsp judges by the secret rule (soldaemon/sensitive.py:
            // PATH_SCHEMES, real paths, content redaction); any other scheme is refused there too.
            documentSelector: [{ scheme: "file" }, { scheme: "untitled" }, { scheme: "vscode-notebook-cell" }, { scheme: "vscode-remote" }],
            outputChannel: this.output,
            // A function: a restarted server gets the settings of now.
            initializationOptions: () => serverOptions(this.settings),
            middleware: {
                // sol-lsp's plain completion items are for editors without
                // inline completion; VS Code shows ghost text only.
                provideCompletionItem: () => null,
                provideInlineCompletionItems: async (document, position, context, token, next) => {
                    if (!this.settings.enabled || !languageEnabled(this.settings.languages, document.languageId)) return null;
                    // As before: no ghost text over the suggest widget's selection.
                    if (context.selectedCompletionInfo) return null;
                    const result = await next(document, position, context, token);
                    if (result && !token.isCancellationRequested) {
                        this.events.answered(Array.isArray(result) ? result : result.items);
                    }
                    return result;
                },
                executeCommand: (command, args, next) => {
                    if (command === ACCEPT_COMMAND) this.events.accepted(args);
                    return next(command, args);
                },
            },
            errorHandler: {
                error: () => ({ action: ErrorAction.Continue, handled: true }),
                closed: () => this.onServerClosed(),
            },
        };
    }

    private async spawn(): Promise<ChildProcess> {
        const cmd = serverCommand(this.settings);
        this.output.info(`starting sol-lsp: ${cmd.command} ${cmd.args.join(" ")}`);
        try {
            const child = await spawnServer(cmd);
            this.process = child;
            this.output.info(`sol-lsp runs (pid ${child.pid})`);
            return child;
        } catch (e) {
            this.failed(e);
            throw e;
        }
    }

    private failed(e: unknown): void {
        this.serverError = e instanceof Error ? e.message : String(e);
        this.phase = "stopped";
        this.output.error(this.serverError);
        this.render();
    }

    /** The connection to sol-lsp closed without our asking: restart it, at
     * most MAX_RESTARTS times in RESTART_WINDOW_MS, and say so. */
    private async onServerClosed(): Promise<{ action: CloseAction; message: string; handled: boolean }> {
        const child = this.process;
        this.process = undefined;
        // The pipe closes before the process is reaped: wait a moment for its status.
        if (child && child.exitCode === null && child.signalCode === null) {
            await new Promise((r) => { const t = setTimeout(r, 1000); child.once("exit", () => { clearTimeout(t); r(undefined); }); });
        }
        const code = child?.exitCode ?? child?.signalCode ?? "still running";
        const now = Date.now();
        this.restarts.push(now);
        while (this.restarts.length && this.restarts[0] < now - RESTART_WINDOW_MS) this.restarts.shift();
        const again = this.restarts.length <= MAX_RESTARTS && !this.disposed;
        this.serverError = `sol-lsp exited (${code})`;
        this.phase = again ? "restarting" : "stopped";
        this.sol = undefined;
        this.render();
        const message = again ? `${this.serverError}; restarting it`
            : `${this.serverError} ${this.restarts.length} times in 3 minutes; not restarted (soldaemon: Restart Server)`;
        if (!this.disposed) {
            void vscode.window.showWarningMessage(`soldaemon: ${message}.`, "Open Logs").then((choice) => {
                if (choice === "Open Logs") this.output.show(true);
            });
        }
        return { action: again ? CloseAction.Restart : CloseAction.DoNotRestart, message, handled: true };
    }

    private onState(state: State): void {
        if (state === State.Running) {
            this.phase = "running";
            this.serverError = undefined;
        } else if (state === State.Starting) {
            this.phase = this.phase === "restarting" ? "restarting" : "starting";
        } else if (this.phase !== "restarting") {
            this.phase = "stopped";
        }
        this.render();
    }

    /** Launch settings need a new sol-lsp; the rest go to the running one. */
    private async onSettingsChanged(): Promise<void> {
        const before = this.settings;
        this.settings = this.readSettings();
        this.render();
        if (launchChanged(before, this.settings)) {
            this.output.info("launch settings changed; restarting sol-lsp");
            await this.restartServer();
        } else if (this.client.isRunning()) {
            await this.notify(DidChangeConfigurationNotification.method, { settings: { [SECTION]: serverOptions(this.settings) } });
        }
    }

    /** What sol-lsp advertises in `experimental.soldaemon.notifications`. */
    serverHandles(method: string): boolean {
        const exp = this.client.initializeResult?.capabilities.experimental as { soldaemon?: { notifications?: unknown } } | undefined;
        const names = exp?.soldaemon?.notifications;
        return Array.isArray(names) && names.includes(method);
    }

    async notify(method: string, params: unknown): Promise<void> {
        if (!this.client.isRunning()) return;
        try {
            await this.client.sendNotification(method, params);
        } catch (e) {
            this.output.debug(`could not send ${method}: ${e instanceof Error ? e.message : String(e)}`);
        }
    }

    // ------------------------------------------------------------------
    // Commands
    // ------------------------------------------------------------------

    /** Accept the next word or line of the suggestion with the editor's own
     * command, then report how many characters went in. */
    async acceptPart(builtin: string): Promise<void> {
        const editor = vscode.window.activeTextEditor;
        const shown = this.events.snapshot();
        const before = editor?.document.getText().length;
        await vscode.commands.executeCommand(builtin);
        if (editor && before !== undefined) this.events.partiallyAccepted(shown, editor.document.getText().length - before);
    }

    async dismiss(): Promise<void> {
        this.events.reject("dismissed");
        await vscode.commands.executeCommand(BUILTIN.hide);
    }

    async toggle(): Promise<void> {
        await vscode.workspace.getConfiguration(SECTION).update("enable", !this.settings.enabled, vscode.ConfigurationTarget.Global);
    }

    async restartServer(): Promise<void> {
        this.restarts.length = 0;
        this.serverError = undefined;
        this.sol = undefined;
        this.phase = "starting";
        this.render();
        try {
            if (this.client.needsStop()) await this.client.stop();
            await this.client.start();
        } catch (e) {
            this.failed(e);
        }
    }

    render(): void {
        if (this.disposed) return;
        const editor = vscode.window.activeTextEditor;
        const view = computeStatus({
            enabled: this.settings.enabled,
            languageOn: editor ? languageEnabled(this.settings.languages, editor.document.languageId) : undefined,
            phase: this.phase,
            serverError: this.serverError,
            sol: this.sol,
        });
        this.statusItem.text = view.text;
        this.statusItem.tooltip = view.tooltip;
        this.statusItem.backgroundColor = view.kind === "error" ? new vscode.ThemeColor("statusBarItem.errorBackground")
            : view.kind === "slow" ? new vscode.ThemeColor("statusBarItem.warningBackground") : undefined;
    }

    get statusKind(): string {
        return computeStatus({ enabled: this.settings.enabled, phase: this.phase, serverError: this.serverError, sol: this.sol }).kind;
    }

    diagnosis(): string {
        const s = this.settings;
        const cmd = serverCommand(s);
        const editor = vscode.window.activeTextEditor;
        const lang = editor?.document.languageId;
        const version = (this.context.extension?.packageJSON as { version?: string } | undefined)?.version ?? "?";
        return [
            `soldaemon diagnosis (extension ${version}, VS Code ${vscode.version})`,
            `  completions:  ${s.enabled ? "on" : "off (soldaemon.enable)"}`
            + (lang ? `; ${lang} is ${languageEnabled(s.languages, lang) ? "on" : "off (soldaemon.languages)"}` : ""),
            `  status:       ${this.statusKind}`,
            `  sol-lsp:      ${cmd.command} ${cmd.args.join(" ")}`,
            `  process:      ${this.process ? `pid ${this.process.pid}` : "none"}, ${this.phase}`
            + (this.serverError ? `; ${this.serverError}` : ""),
            `  daemon:       ${this.sol ? `${this.sol.state}${this.sol.url ? ` at ${this.sol.url}` : ""}${this.sol.message ? `: ${this.sol.message}` : ""}` : "no status yet"}`,
            `  latency:      last ${formatMs(this.sol?.lastMs ?? undefined)}, median ${formatMs(this.sol?.medianMs ?? undefined)}`,
            `  settings:     debounce ${s.debounceMs} ms, max lines ${s.maxLines}, max tokens ${s.maxTokens || "sol-lsp default"}, `
            + `auto-start ${s.autoStart && !s.endpoint ? "on" : "off"}, daemon command ${s.command}`,
        ].join("\n");
    }

    async showDiagnosis(): Promise<void> {
        const text = this.diagnosis();
        this.output.appendLine(text);
        this.output.show(true);
        const first = text.split("\n").find((l) => l.trimStart().startsWith("status:"))?.trim() ?? "";
        const choice = await vscode.window.showInformationMessage(`soldaemon ${first} — the full diagnosis is in the soldaemon output.`, "Restart Server");
        if (choice === "Restart Server") await this.restartServer();
    }

    /** Stops sol-lsp (the daemon it found or started lives on: it is shared). */
    async shutdown(): Promise<void> {
        this.disposed = true;
        try {
            if (this.client.needsStop()) await this.client.stop(3000);
        } catch {
            // already gone
        }
    }

    dispose(): void {
        void this.shutdown();
        for (const d of this.disposables.splice(0)) {
            try {
                d.dispose();
            } catch {
                // ignore
            }
        }
    }
}

let controller: Controller | undefined;

export function activate(context: vscode.ExtensionContext): Controller {
    controller = new Controller(context);
    context.subscriptions.push(controller);
    void controller.start();
    return controller;
}

export async function deactivate(): Promise<void> {
    const c = controller;
    controller = undefined;
    await c?.shutdown();
}
