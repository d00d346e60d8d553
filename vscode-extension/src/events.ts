// The inline-completion events a user's accept rate is computed from:
// shown, accepted, rejected. VS Code's stable API (1.91) has a hook for
// "accepted" only (the item's command); its show and partial-accept hooks
// (`handleDidShowCompletionItem`, `handleDidPartiallyAcceptCompletionItem`)
// are proposed API, and the keys that accept a word or a line are VS Code's
// own commands, never wrapped here: a wrapper that measured document growth
// also counted other providers' suggestions. So: "shown" is inferred from
// the answers, "rejected" when a new answer replaces a shown one; partial
// accepts are not reported from VS Code (docs/vscode.md).
// No `vscode` import: the items are described by the interface below.

/** Copilot's language-server name, which sol-lsp accepts too. */
export const DID_SHOW = "textDocument/didShowCompletion";
/** sol-lsp's own names. */
export const SOL_DID_SHOW = "sol/didShowCompletion";
export const SOL_DID_REJECT = "sol/didRejectCompletion";
/** The command sol-lsp puts on every item: arguments [request id, index]. */
export const ACCEPT_COMMAND = "sol.accepted";

interface PositionLike { readonly line: number; readonly character: number }

/** A vscode.InlineCompletionItem as far as events need it. */
export interface ItemLike {
    readonly insertText: string | { readonly value: string };
    readonly range?: { readonly start: PositionLike; readonly end: PositionLike };
    readonly command?: { readonly command: string; readonly title: string; readonly arguments?: unknown[] };
}

/** The LSP form of an item, as sent back in event params. */
export interface LspItem {
    insertText: string;
    range?: { start: PositionLike; end: PositionLike };
    command?: { title: string; command: string; arguments?: unknown[] };
}

export type RejectReason = "replaced";

export type Notify = (method: string, params: unknown) => void;

/** The suggestion VS Code shows now. */
interface Shown {
    key: string;
    item: LspItem;
    /** Accepted or rejected: no more events. */
    done: boolean;
}

function toLsp(item: ItemLike): LspItem {
    const text = typeof item.insertText === "string" ? item.insertText : item.insertText.value;
    const out: LspItem = { insertText: text };
    if (item.range) {
        const { start, end } = item.range;
        out.range = { start: { line: start.line, character: start.character }, end: { line: end.line, character: end.character } };
    }
    if (item.command) out.command = { title: item.command.title, command: item.command.command, arguments: item.command.arguments };
    return out;
}

/** "request id:index" of an item sol-lsp made; undefined for others. */
export function itemKey(item: ItemLike): string | undefined {
    const args = item.command?.command === ACCEPT_COMMAND ? item.command.arguments : undefined;
    return args && typeof args[0] === "string" ? `${args[0]}:${String(args[1] ?? 0)}` : undefined;
}

export class CompletionEvents {
    private current?: Shown;

    /** `handles(method)`: whether sol-lsp said it handles that name
     * (experimental.soldaemon.notifications); when not, the sol/ name is
     * sent too, so that nothing is lost while the server catches up. */
    constructor(private readonly notify: Notify, private readonly handles: (method: string) => boolean) {}

    /** A non-cancelled answer reached VS Code: its first item is what VS
     * Code shows (Alt+] may show another; the stable API does not say).
     * The same item again (typing through it) is not shown twice; a new
     * one replaces, and so rejects, the one shown before. */
    answered(items: readonly ItemLike[]): void {
        const first = items[0];
        const key = first ? itemKey(first) : undefined;
        if (key !== undefined && key === this.current?.key) return;
        this.reject("replaced");
        if (!first || key === undefined) {
            this.current = undefined;
            return;
        }
        this.current = { key, item: toLsp(first), done: false };
        this.send(DID_SHOW, SOL_DID_SHOW, { item: this.current.item });
    }

    /** The item's command ran: VS Code accepted it whole. */
    accepted(args: readonly unknown[]): void {
        if (this.current && `${String(args[0])}:${String(args[1] ?? 0)}` === this.current.key) this.current.done = true;
    }

    /** The shown suggestion went away unaccepted (replaced by another answer). */
    reject(reason: RejectReason): void {
        const s = this.current;
        if (!s || s.done) return;
        s.done = true;
        this.notify(SOL_DID_REJECT, { item: s.item, reason });
    }

    private send(method: string, solMethod: string, params: unknown): void {
        this.notify(method, params);
        if (!this.handles(method)) this.notify(solMethod, params);
    }
}
