// The VS Code side: wires the daemon client, the daemon launcher and the
// inline-completion provider to the editor, and keeps the status bar honest.

import * as vscode from "vscode";
import { ConnectionInfo, DaemonClient, DaemonError, Endpoint, errText } from "./daemonClient";
import { StartedDaemon, startDaemon } from "./daemonProcess";
import { Location, locate, pidAlive, readDaemonRecord, readToken } from "./discovery";
import { ACCEPT_COMMAND, InlineProvider, languageEnabled, vscodeItemFactory } from "./provider";
import { Settings, readSettings } from "./settings";
import { computeStatus, formatMs } from "./status";
import type { CompletionResult } from "./daemonClient";

const SECTION = "soldaemon";
/** Connection problems: shown by the status bar, not as request errors. */
const CONNECTION_CODES = new Set(["not_connected", "disconnected", "unreachable", "timeout", "closed", "no_token",
    "unauthorized", "forbidden", "not_found", "handshake", "bad_endpoint"]);
/** Connection failures worth a notification (the user must act). */
const NOTIFY_CODES = new Set(["unauthorized", "forbidden", "not_found", "bad_endpoint"]);
const AUTO_STARTS = 3;

interface Stats {
    requests: number;
    shown: number;
    cacheHits: number;
    errors: number;
    lastTtftMs?: number;
    lastClientTtftMs?: number;
    lastTotalMs?: number;
    lastFinish?: string;
    lastError?: DaemonError;
}

export class Controller implements vscode.Disposable {
    readonly output: vscode.LogOutputChannel;
    readonly statusItem: vscode.StatusBarItem;
    readonly client: DaemonClient;
    readonly provider: InlineProvider<vscode.InlineCompletionItem>;
    private settings: Settings;
    private managed?: StartedDaemon;
    private starting = false;
    private startError?: DaemonError;
    /** A start failed because the port is taken: maybe by another window's
     * daemon that we can use; reported only if connecting fails too. */
    private portBusy?: DaemonError;
    private requestError?: DaemonError;
    private autoStartsLeft = AUTO_STARTS;
    private location?: Location;
    private readonly notified = new Set<string>();
    private readonly stats: Stats = { requests: 0, shown: 0, cacheHits: 0, errors: 0 };
    private readonly disposables: vscode.Disposable[] = [];
    private disposed = false;

    constructor(private readonly context: vscode.ExtensionContext) {
        this.settings = this.readSettings();
        this.output = vscode.window.createOutputChannel("soldaemon", { log: true });
        this.statusItem = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Right, 100);
        this.statusItem.name = "soldaemon";
        this.statusItem.command = "soldaemon.showDiagnosis";
        this.client = new DaemonClient({
            resolve: () => this.resolveEndpoint(),
            log: (line) => this.output.info(line),
        });
        this.provider = new InlineProvider<vscode.InlineCompletionItem>(
            this.client,
            vscodeItemFactory<vscode.Range, vscode.InlineCompletionItem>(vscode),
            () => this.settings.provider,
            {
                onRequest: () => { this.stats.requests++; },
                onCacheHit: () => { this.stats.cacheHits++; },
                onResult: (r, shown) => this.onResult(r, shown),
                onError: (e) => this.onRequestError(e),
            },
        );
        this.disposables.push(
            this.output,
            this.statusItem,
            vscode.languages.registerInlineCompletionItemProvider(
                [{ scheme: "file" }, { scheme: "untitled" }, { scheme: "vscode-notebook-cell" }, { scheme: "vscode-remote" }],
                this.provider),
            vscode.commands.registerCommand("soldaemon.toggle", () => this.toggle()),
            vscode.commands.registerCommand("soldaemon.showDiagnosis", () => this.showDiagnosis()),
            vscode.commands.registerCommand("soldaemon.restartDaemon", () => this.restartDaemon()),
            vscode.commands.registerCommand("soldaemon.openLogs", () => this.output.show(true)),
            vscode.commands.registerCommand(ACCEPT_COMMAND, (id: unknown) => {
                if (typeof id === "string" && id) this.client.event(id, "accepted");
            }),
            vscode.workspace.onDidChangeConfiguration((e) => {
                if (e.affectsConfiguration(SECTION)) this.onSettingsChanged();
            }),
            vscode.window.onDidChangeActiveTextEditor(() => this.render()),
        );
        const unsubscribe = this.client.onChange((info) => this.onConnection(info));
        this.disposables.push({ dispose: unsubscribe });
    }

    start(): void {
        this.render();
        this.statusItem.show();
        this.client.start();
    }

    private readSettings(): Settings {
        const cfg = vscode.workspace.getConfiguration(SECTION);
        return readSettings((key) => cfg.get(key));
    }

    private onSettingsChanged(): void {
        const before = this.settings;
        this.settings = this.readSettings();
        if (before.endpoint !== this.settings.endpoint || before.tokenFile !== this.settings.tokenFile) {
            this.output.info("endpoint settings changed; reconnecting");
            this.notified.clear();
            this.startError = undefined;
            this.client.reconnectNow();
        }
        this.render();
    }

    // ------------------------------------------------------------------
    // Finding and starting the daemon
    // ------------------------------------------------------------------

    private async resolveEndpoint(): Promise<Endpoint> {
        if (this.managed && !this.settings.endpoint) {
            const m = this.managed;
            this.location = { url: m.url, tokenFile: m.tokenFile, source: "started", pid: m.pid };
            return { url: m.url, token: await readToken(m.tokenFile), tokenFile: m.tokenFile };
        }
        const loc = locate({ endpoint: this.settings.endpoint, tokenFile: this.settings.tokenFile });
        this.location = loc;
        return { url: loc.url, token: await readToken(loc.tokenFile), tokenFile: loc.tokenFile };
    }

    private onConnection(info: ConnectionInfo): void {
        if (info.state === "open") {
            this.portBusy = undefined;
        }
        this.render();
        if (this.disposed || info.state !== "waiting" || !info.lastError) {
            return;
        }
        if (this.portBusy) {
            const err = this.portBusy;
            this.portBusy = undefined;
            this.startError = err;
            this.render();
            this.notifyOnce(`start-${err.code}`, err, "soldaemon could not be started");
            return;
        }
        const code = info.lastError.code;
        const canStart = this.settings.autoStart && !this.settings.endpoint && !this.managed && !this.starting;
        if ((code === "unreachable" || code === "no_token") && canStart && this.autoStartsLeft > 0) {
            this.autoStartsLeft--;
            void this.startManaged("no daemon was running");
            return;
        }
        if (NOTIFY_CODES.has(code)) {
            this.notifyOnce(code, info.lastError);
        } else if ((code === "unreachable" || code === "no_token") && !this.managed && !this.starting && info.failures >= 2) {
            const why = this.settings.endpoint
                ? new DaemonError(code, `${info.lastError.message} (soldaemon.endpoint is set, so the extension does not start a daemon)`, true,
                    "start it yourself (soldaemon serve), or clear soldaemon.endpoint to let the extension start one")
                : !this.settings.autoStart
                    ? new DaemonError(code, info.lastError.message, true, "start it with soldaemon serve, or turn on soldaemon.autoStart")
                    : undefined;
            if (why) this.notifyOnce(`down-${code}`, why);
        }
    }

    private async startManaged(reason: string): Promise<void> {
        if (this.starting || this.disposed) return;
        this.starting = true;
        this.startError = undefined;
        this.render();
        const s = this.settings;
        const args = ["serve", ...s.serveArgs];
        this.output.info(`starting the daemon (${reason}): ${s.command} ${args.join(" ")}`);
        try {
            const d = await startDaemon({
                command: s.command,
                args,
                timeoutMs: s.startTimeoutMs,
                onLog: (line, stream) => this.output.appendLine(`[daemon${stream === "stderr" ? "" : " stdout"}] ${line}`),
            });
            if (this.disposed) {
                await d.stop();
                return;
            }
            this.managed = d;
            this.output.info(`the daemon is ready (pid ${d.pid}) at ${d.url}`);
            void d.exited.then((e) => {
                if (this.managed !== d) return;
                this.managed = undefined;
                this.output.warn(`the daemon (pid ${d.pid}) exited (${e.code !== null ? `code ${e.code}` : `signal ${e.signal}`})`);
                if (!this.disposed) this.client.reconnectNow();
            });
            this.client.reconnectNow();
        } catch (e) {
            const err = e instanceof DaemonError ? e : new DaemonError("start_failed", errText(e));
            if (/address_in_use/.test(err.message)) {
                // Another daemon (another VS Code window's?) holds the port
                // since we last looked: try to use it before complaining.
                this.output.info("the port is taken; trying to connect to the daemon that holds it");
                this.portBusy = err;
                this.client.reconnectNow();
                return;
            }
            this.startError = err;
            this.output.error(`could not start the daemon: ${err.message}${err.hint ? ` (${err.hint})` : ""}`);
            this.notifyOnce(`start-${err.code}`, err, "soldaemon could not be started");
        } finally {
            this.starting = false;
            this.render();
        }
    }

    async restartDaemon(): Promise<void> {
        this.autoStartsLeft = AUTO_STARTS;
        this.startError = undefined;
        this.notified.clear();
        if (this.settings.endpoint) {
            void vscode.window.showInformationMessage(
                `soldaemon.endpoint is set (${this.settings.endpoint}): that daemon is not managed by the extension. Reconnecting to it.`);
            this.client.reconnectNow();
            return;
        }
        if (this.managed) {
            const d = this.managed;
            this.managed = undefined;
            this.output.info(`stopping the daemon (pid ${d.pid})`);
            await d.stop();
        } else {
            const rec = readDaemonRecord();
            if (rec) {
                const choice = await vscode.window.showWarningMessage(
                    `Stop the running soldaemon (pid ${rec.pid}, ${rec.url}) and start a new one?`, { modal: true }, "Restart");
                if (choice !== "Restart") return;
                this.output.info(`stopping the daemon (pid ${rec.pid})`);
                try {
                    process.kill(rec.pid, "SIGTERM");
                } catch (e) {
                    this.output.warn(`could not stop pid ${rec.pid}: ${errText(e)}`);
                }
                const deadline = Date.now() + 10_000;
                while (pidAlive(rec.pid) && Date.now() < deadline) {
                    await new Promise((r) => setTimeout(r, 200));
                }
            }
        }
        await this.startManaged("restart requested");
    }

    // ------------------------------------------------------------------
    // Requests, status, commands
    // ------------------------------------------------------------------

    private onResult(r: CompletionResult, shown: string | undefined): void {
        if (shown !== undefined) this.stats.shown++;
        if (!r.cancelled && r.finishReason !== "cancelled" && r.finishReason !== "superseded") {
            const ttft = r.timings.ttft_ms;
            if (typeof ttft === "number" && ttft > 0) {
                this.stats.lastTtftMs = ttft;
            } else if (r.clientTtftMs !== undefined) {
                this.stats.lastTtftMs = r.clientTtftMs;
            }
            this.stats.lastClientTtftMs = r.clientTtftMs;
            this.stats.lastTotalMs = r.clientTotalMs;
            this.stats.lastFinish = r.finishReason;
            this.requestError = undefined;
        }
        this.render();
    }

    private onRequestError(e: unknown): void {
        const err = e instanceof DaemonError ? e : new DaemonError("internal", errText(e));
        this.stats.errors++;
        this.stats.lastError = err;
        if (CONNECTION_CODES.has(err.code)) {
            return; // the status bar shows the connection state
        }
        if (this.requestError?.code !== err.code) {
            this.output.warn(`completion failed: ${err.code}: ${err.message}`);
        }
        this.requestError = err;
        this.render();
    }

    private notifyOnce(key: string, err: DaemonError, title?: string): void {
        if (this.notified.has(key) || this.disposed) return;
        this.notified.add(key);
        const text = `${title ? `${title}: ` : "soldaemon: "}${err.message}${err.hint ? ` — ${err.hint}` : ""}`;
        void vscode.window.showErrorMessage(text, "Open Logs", "Show Diagnosis", "Restart Daemon", "Settings").then((choice) => {
            if (choice === "Open Logs") this.output.show(true);
            else if (choice === "Show Diagnosis") void this.showDiagnosis();
            else if (choice === "Restart Daemon") void this.restartDaemon();
            else if (choice === "Settings") void vscode.commands.executeCommand("workbench.action.openSettings", SECTION);
        });
    }

    render(): void {
        if (this.disposed) return;
        const editor = vscode.window.activeTextEditor;
        const view = computeStatus({
            enabled: this.settings.provider.enabled,
            languageOn: editor ? languageEnabled(this.settings.provider.languages, editor.document.languageId) : undefined,
            connection: this.client.connection,
            starting: this.starting,
            startError: this.startError,
            requestError: this.requestError,
            lastTtftMs: this.stats.lastTtftMs,
            slowTtftMs: this.settings.slowTtftMs,
        });
        this.statusItem.text = view.text;
        this.statusItem.tooltip = view.tooltip;
        this.statusItem.backgroundColor = view.kind === "error"
            ? new vscode.ThemeColor("statusBarItem.errorBackground")
            : view.kind === "slow" ? new vscode.ThemeColor("statusBarItem.warningBackground") : undefined;
    }

    get statusKind(): string {
        return computeStatus({
            enabled: this.settings.provider.enabled, connection: this.client.connection, starting: this.starting,
            startError: this.startError, requestError: this.requestError, lastTtftMs: this.stats.lastTtftMs,
            slowTtftMs: this.settings.slowTtftMs,
        }).kind;
    }

    async toggle(): Promise<void> {
        const cfg = vscode.workspace.getConfiguration(SECTION);
        const next = !this.settings.provider.enabled;
        await cfg.update("enable", next, vscode.ConfigurationTarget.Global);
        this.settings = this.readSettings();
        this.render();
        void vscode.window.showInformationMessage(`soldaemon completions ${next ? "on" : "off"}.`);
    }

    /** Collect everything that says whether and why completions work. */
    async diagnosis(): Promise<string> {
        const c = this.client.connection;
        const s = this.settings;
        const editor = vscode.window.activeTextEditor;
        const lang = editor?.document.languageId;
        const version = String((this.context.extension?.packageJSON as { version?: string } | undefined)?.version ?? "?");
        const loc = this.location;
        const lines: string[] = [
            `soldaemon diagnosis, ${new Date().toISOString()}`,
            `  extension:    ${version} on VS Code ${vscode.version}`,
            `  completions:  ${s.provider.enabled ? "on" : "off (soldaemon.enable)"}`
            + (lang ? `; ${lang} is ${languageEnabled(s.provider.languages, lang) ? "on" : "off (soldaemon.languages)"}` : ""),
            `  status:       ${this.statusKind}`,
            `  endpoint:     ${loc ? `${loc.url} (${describeSource(loc)})` : "not resolved yet"}`,
            `  token file:   ${loc?.tokenFile ?? "?"}`,
            `  daemon:       ${this.managed ? `started by the extension, pid ${this.managed.pid}`
                : this.starting ? "being started by the extension" : "not started by the extension"}`
            + (this.startError ? `; start failed: ${this.startError.message}${this.startError.hint ? ` (${this.startError.hint})` : ""}` : ""),
            `  connection:   ${c.state}${c.daemonState ? `, daemon ${c.daemonState}` : ""}`
            + (c.failures ? `, ${c.failures} failed attempt(s)` : "")
            + (c.nextAttemptAt ? `, next in ${formatMs(Math.max(0, c.nextAttemptAt - Date.now()))}` : ""),
        ];
        if (c.lastError && c.state !== "open") {
            lines.push(`  last error:   ${c.lastError.code}: ${c.lastError.message}${c.lastError.hint ? `\n                → ${c.lastError.hint}` : ""}`);
        }
        if (this.client.isOpen) {
            try {
                const h = await this.client.health(3000);
                const diag = h.sol_diagnosis as Record<string, unknown> | null | undefined;
                const load = (h.load ?? {}) as Record<string, unknown>;
                lines.push(
                    `  model:        ${String(h.model ?? "?")} on ${String(h.device ?? "?")} (protocol ${String(h.protocol ?? "?")}, up ${Math.round(Number(h.uptime_s ?? 0))} s)`,
                    `  sol:          ${diag ? Object.entries(diag).map(([k, v]) => `${k}=${String(v)}`).join(", ") : "(loading)"}`,
                    `  load:         ${String(load.connections ?? "?")} connection(s), ${String(load.in_flight ?? "?")} in flight, queue ${String(load.queue_depth ?? "?")}`,
                );
            } catch (e) {
                lines.push(`  health:       no answer (${errText(e)})`);
            }
        }
        const st = this.stats;
        lines.push(
            `  requests:     ${st.requests} sent, ${st.shown} shown, ${st.cacheHits} served from cache, ${st.errors} failed`,
            `  last:         TTFT ${formatMs(st.lastTtftMs)} (client ${formatMs(st.lastClientTtftMs)}), total ${formatMs(st.lastTotalMs)}, finish ${st.lastFinish ?? "–"}`,
        );
        if (st.lastError) {
            lines.push(`  last failure: ${st.lastError.code}: ${st.lastError.message}`);
        }
        lines.push(`  settings:     debounce ${s.provider.debounceMs} ms, max lines ${s.provider.maxLines}, max tokens ${s.provider.maxTokens || "daemon default"}, `
            + `auto-start ${s.autoStart ? "on" : "off"}, command ${s.command}`);
        return lines.join("\n");
    }

    async showDiagnosis(): Promise<void> {
        const text = await this.diagnosis();
        this.output.appendLine(text);
        this.output.show(true);
        const first = text.split("\n").find((l) => l.trimStart().startsWith("status:"))?.trim() ?? "";
        void vscode.window.showInformationMessage(`soldaemon ${first} — the full diagnosis is in the soldaemon output.`, "Restart Daemon")
            .then((choice) => {
                if (choice === "Restart Daemon") void this.restartDaemon();
            });
    }

    async shutdown(): Promise<void> {
        this.disposed = true;
        this.client.stop();
        const d = this.managed;
        this.managed = undefined;
        if (d) await d.stop(3000);
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

function describeSource(loc: Location): string {
    switch (loc.source) {
        case "setting": return "from soldaemon.endpoint";
        case "daemon.json": return `the running daemon, pid ${loc.pid}`;
        case "started": return `started by the extension, pid ${loc.pid}`;
        default: return "the default address";
    }
}

let controller: Controller | undefined;

export function activate(context: vscode.ExtensionContext): Controller {
    controller = new Controller(context);
    context.subscriptions.push(controller);
    controller.start();
    return controller;
}

export async function deactivate(): Promise<void> {
    const c = controller;
    controller = undefined;
    await c?.shutdown();
}
