// The VS Code side: a language client of sol-lsp, which holds the whole
// completion logic (context from other files, warm, cancel, type-through,
// post-processing, finding and starting the daemon). What stays here is
// what only VS Code can do: the status bar, commands, settings, finding the
// interpreter (the Python extension's API) and starting the server process,
// offering the install when sol-lsp is missing, and the event adapter
// (src/events.ts) for what the stable API has no hook for. Accepting a word
// or a line, and dismissing, are VS Code's own commands and keys.

import type { ChildProcess } from "child_process";
import * as vscode from "vscode";
import {
    CloseAction, DidChangeConfigurationNotification, ErrorAction, LanguageClient, LanguageClientOptions, State,
} from "vscode-languageclient/node";
import { ACCEPT_COMMAND, CompletionEvents } from "./events";
import { ServerCommand, installCommand, installPython, serverCommand, spawnServer } from "./serverProcess";
import { Settings, languageEnabled, launchChanged, readSettings, serverOptions } from "./settings";
import { ServerPhase, SolStatus, computeStatus, formatMs } from "./status";

const SECTION = "soldaemon";
const SOL_STATUS = "sol/status";
/** sol-lsp showed a block's first lines early (`earlyLines`) and the rest is there. */
export const COMPLETION_READY = "sol/completionReady";
/** Restarts of a crashed sol-lsp allowed within RESTART_WINDOW_MS. */
const MAX_RESTARTS = 4;
const RESTART_WINDOW_MS = 3 * 60_000;
/** The Python extension, whose API names the interpreter the user works with. */
const PYTHON_EXTENSION = "ms-python.python";
const INSTALL = "Install soldaemon…";
const CHOOSE_PYTHON = "Choose Python…";
const RUN_WORKSPACE_SERVER = "Run It";
/** workspaceState: the sol-lsp inside this workspace the user confirmed. */
const CONFIRMED_SERVER = "soldaemon.confirmedWorkspaceServer";

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
    /** The interpreter the Python extension has selected, when it is installed. */
    activePython?: string;
    private missingShown = false;
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
        this.client.onNotification(COMPLETION_READY, (p: { uri?: unknown }) => this.completionReady(p));
        this.disposables.push(
            this.output,
            this.statusItem,
            this.client.onDidChangeState((e) => this.onState(e.newState)),
            vscode.commands.registerCommand("soldaemon.toggle", () => this.toggle()),
            vscode.commands.registerCommand("soldaemon.showDiagnosis", () => this.showDiagnosis()),
            vscode.commands.registerCommand("soldaemon.restartServer", () => this.restartServer()),
            vscode.commands.registerCommand("soldaemon.openLogs", () => this.output.show(true)),
            vscode.commands.registerCommand("soldaemon.selectPython", () => this.choosePython()),
            vscode.workspace.onDidChangeConfiguration((e) => {
                if (e.affectsConfiguration(SECTION)) void this.onSettingsChanged();
            }),
            vscode.window.onDidChangeActiveTextEditor(() => this.render()),
        );
    }

    /** The rest of a block shown early is there: ask VS Code to ask again
     * (sol-lsp answers at once from it) when that document is in front;
     * otherwise it shows when the user comes back and types. */
    completionReady(p: { uri?: unknown }): void {
        const editor = vscode.window.activeTextEditor;
        if (!editor || typeof p?.uri !== "string" || editor.document.uri.toString() !== p.uri) return;
        void vscode.commands.executeCommand("editor.action.inlineSuggest.trigger");
    }

    async start(): Promise<void> {
        this.render();
        this.statusItem.show();
        this.activePython = await this.pythonFromExtension();
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
            // Only schemes whose path sol-lsp judges by the secret rule (soldaemon/privacy/rules.py:
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

    /** The interpreter of the Python extension's selected environment (its
     * API: `environments.getActiveEnvironmentPath`), or undefined when the
     * extension is not installed or has none. Never throws. */
    async pythonFromExtension(): Promise<string | undefined> {
        try {
            const ext = vscode.extensions?.getExtension(PYTHON_EXTENSION);
            if (!ext) return undefined;
            const api = (ext.isActive ? ext.exports : await ext.activate()) as
                { environments?: { getActiveEnvironmentPath?: (r?: unknown) => { path?: string } } } | undefined;
            const found = api?.environments?.getActiveEnvironmentPath?.(vscode.workspace.workspaceFolders?.[0]?.uri)?.path;
            if (found) this.output.info(`the Python extension's interpreter: ${found}`);
            return found || undefined;
        } catch (e) {
            this.output.debug(`the Python extension's API did not answer: ${e instanceof Error ? e.message : String(e)}`);
            return undefined;
        }
    }

    /** sol-lsp is missing: say so once, with the way out (install it into
     * the interpreter in use, or choose another interpreter). */
    async offerInstall(): Promise<void> {
        if (this.missingShown || this.disposed) return;
        this.missingShown = true;
        const python = installPython(this.settings, this.activePython);
        const choice = await vscode.window.showErrorMessage(
            `soldaemon: sol-lsp was not found (${this.serverError ?? "not installed"}). soldaemon is not on PyPI: `
            + `install it from a soldaemon source checkout into ${python} (\`${installCommand(python, "/path/to/soldaemon")}\`), `
            + "or choose the Python it is installed in.", INSTALL, CHOOSE_PYTHON);
        if (choice === INSTALL) await this.install(python);
        else if (choice === CHOOSE_PYTHON) await this.choosePython();
    }

    /** Ask for the soldaemon checkout, then run the install command in a terminal. */
    async install(python: string): Promise<void> {
        const picked = await vscode.window.showOpenDialog({
            canSelectFolders: true, canSelectFiles: false, canSelectMany: false,
            openLabel: "Install soldaemon from this checkout",
        });
        const folder = picked?.[0]?.fsPath;
        if (!folder) return;
        const terminal = vscode.window.createTerminal({ name: "soldaemon install" });
        terminal.show();
        terminal.sendText(installCommand(python, folder));
        this.missingShown = false;      // after the install, Restart Server; a new failure is said again
    }

    async choosePython(): Promise<void> {
        await vscode.commands.executeCommand("workbench.action.openSettings", "soldaemon.python");
    }

    private folders(): string[] {
        const folders = (vscode.workspace.workspaceFolders ?? []) as ReadonlyArray<{ uri: { scheme?: string; fsPath: string } }>;
        return folders.filter((f) => (f.uri.scheme ?? "file") === "file").map((f) => f.uri.fsPath);
    }

    /** The sol-lsp to run (`serverCommand`). One inside a workspace folder
     * (the selected interpreter's, in a repository's `.venv`) is a program
     * the project chose: it runs only when the user confirms it, once per
     * workspace and path; otherwise `sol-lsp` on PATH runs. */
    async launchCommand(): Promise<ServerCommand> {
        const cmd = serverCommand(this.settings, this.activePython, this.folders());
        if (!cmd.inWorkspace) return cmd;
        const state = this.context.workspaceState;
        if (state?.get<string>(CONFIRMED_SERVER) === cmd.command) return cmd;
        const choice = await vscode.window.showWarningMessage(
            `soldaemon: the selected Python environment's sol-lsp is inside this workspace (${cmd.command}). `
            + "A repository can put any program there. Run it for this workspace?",
            { modal: true }, RUN_WORKSPACE_SERVER);
        if (choice === RUN_WORKSPACE_SERVER) {
            await state?.update(CONFIRMED_SERVER, cmd.command);
            return cmd;
        }
        this.output.warn(`not running ${cmd.command} (inside the workspace, not confirmed); sol-lsp from PATH instead`);
        return serverCommand(this.settings, undefined, []);
    }

    private async spawn(): Promise<ChildProcess> {
        const cmd = await this.launchCommand();
        this.output.info(`starting sol-lsp: ${cmd.command} ${cmd.args.join(" ")}`);
        try {
            const child = await spawnServer(cmd);
            if (this.disposed) {
                terminate(child);
                throw new Error("the extension was deactivated while sol-lsp started");
            }
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
        if (/not found/.test(this.serverError)) void this.offerInstall();
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
        const cmd = serverCommand(s, this.activePython, this.folders());
        const editor = vscode.window.activeTextEditor;
        const lang = editor?.document.languageId;
        const version = (this.context.extension?.packageJSON as { version?: string } | undefined)?.version ?? "?";
        return [
            `soldaemon diagnosis (extension ${version}, VS Code ${vscode.version})`,
            `  completions:  ${s.enabled ? "on" : "off (soldaemon.enable)"}`
            + (lang ? `; ${lang} is ${languageEnabled(s.languages, lang) ? "on" : "off (soldaemon.languages)"}` : ""),
            `  status:       ${this.statusKind}`,
            `  sol-lsp:      ${cmd.command} ${cmd.args.join(" ")}`
            + (cmd.inWorkspace ? ` (inside the workspace: runs only when confirmed)` : ""),
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

    /** Stops sol-lsp (the daemon it found or started lives on: it is
     * shared). A sol-lsp that does not stop through the protocol (still
     * starting, or not answering) is terminated: none outlives the extension. */
    async shutdown(): Promise<void> {
        this.disposed = true;
        try {
            if (this.client.needsStop()) await this.client.stop(3000);
        } catch {
            // already gone
        }
        if (this.process) terminate(this.process);
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

/** SIGTERM, then SIGKILL when the process is still there after 2 s. */
function terminate(child: ChildProcess): void {
    const running = (): boolean => child.exitCode === null && child.signalCode === null;
    if (!running()) return;
    child.kill("SIGTERM");
    const timer = setTimeout(() => { if (running()) child.kill("SIGKILL"); }, 2000);
    child.once("exit", () => clearTimeout(timer));
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
