// Provider logic against a fake `vscode` and a fake backend.

import { strict as assert } from "node:assert";
import * as fs from "node:fs";
import * as path from "node:path";
import { describe, it } from "node:test";
import { SECRET_PATTERNS } from "../sensitive";
import * as vscode from "../testing/fakeVscode";
import {
    CompletionBackend, CompletionCache, DEFAULT_CONFIG, InlineProvider, ProviderConfig, ProviderEvents,
    capLines, consumesRestOfLine, dropRepeatedTail, languageEnabled, placement, postprocess, snapshot,
    vscodeItemFactory,
} from "../provider";
import type { CompletionResult } from "../daemonClient";
import type { CompletionRequest } from "../protocol";

const AUTO = { triggerKind: 1 };
const INVOKE = { triggerKind: 0 };

interface Call {
    request: CompletionRequest;
    signal?: AbortSignal;
    aborted: boolean;
}

/** A backend that answers from a queue, or waits until told. */
class FakeBackend implements CompletionBackend {
    calls: Call[] = [];
    answers: Array<Partial<CompletionResult> | Error> = [];
    /** When set, complete() waits for release() or the abort. */
    hold = false;
    /** The done wins the race against the cancel: abort is noted, not obeyed. */
    doneWinsRace = false;
    private releases: Array<() => void> = [];

    complete(request: CompletionRequest, options: { signal?: AbortSignal }): Promise<CompletionResult> {
        const call: Call = { request, signal: options.signal, aborted: false };
        this.calls.push(call);
        const id = `r${this.calls.length}`;
        const answer = this.answers.shift() ?? { items: [""] };
        const finish = (): Promise<CompletionResult> => {
            if (answer instanceof Error) return Promise.reject(answer);
            return Promise.resolve({
                id, items: [], finishReason: "stop", timings: { ttft_ms: 12 }, clientTotalMs: 20, cancelled: false, ...answer,
            });
        };
        if (!this.hold) return finish();
        return new Promise<CompletionResult>((resolve, reject) => {
            options.signal?.addEventListener("abort", () => {
                call.aborted = true;
                if (this.doneWinsRace) return;
                // The daemon answers a cancel with done/cancelled.
                resolve({ id, items: [], finishReason: "cancelled", timings: {}, clientTotalMs: 1, cancelled: true });
            });
            this.releases.push(() => finish().then(resolve, reject));
        });
    }

    release(): void {
        for (const r of this.releases.splice(0)) r();
    }
}

function setup(cfg: Partial<ProviderConfig> = {}, events: ProviderEvents = {}) {
    const backend = new FakeBackend();
    const config: ProviderConfig = { ...DEFAULT_CONFIG, debounceMs: 0, ...cfg };
    const sleeps: number[] = [];
    const provider = new InlineProvider<vscode.InlineCompletionItem>(
        backend, vscodeItemFactory(vscode), () => config, events,
        async (ms, token) => {
            sleeps.push(ms);
            // Yield so a test can cancel "during" the debounce.
            await new Promise((r) => setImmediate(r));
            void token;
        });
    return { backend, provider, config, sleeps };
}

async function ask(p: InlineProvider<vscode.InlineCompletionItem>, marked: string | { doc: vscode.TextDocument; pos: vscode.Position },
    token = vscode.newToken().token, context: { triggerKind: number; selectedCompletionInfo?: unknown } = AUTO) {
    const { doc, pos } = typeof marked === "string" ? vscode.docAt(marked) : marked;
    return p.provideInlineCompletionItems(doc, pos, context, token);
}

describe("text logic", () => {
    it("caps lines, counting the cursor's line", () => {
        assert.equal(capLines("a\nb\nc\nd", 2), "a\nb");
        assert.equal(capLines("a\nb", 5), "a\nb");
        assert.equal(capLines("\n    x\n    y", 2), "\n    x");
    });

    it("drops trailing lines the document already has after the cursor", () => {
        const snap = { restOfLine: "", suffix: "\n}\n\nfunction g() {}" };
        assert.equal(dropRepeatedTail("\n  return 1;\n}", snap), "\n  return 1;");
        // Not repeated: kept.
        assert.equal(dropRepeatedTail("\n  return 1;\n  }", { restOfLine: "", suffix: "\nconst x = 1;" }), "\n  return 1;\n  }");
        // Text after the cursor on its line: left alone.
        assert.equal(dropRepeatedTail("a\n}", { restOfLine: ")", suffix: ")\n}" }), "a\n}");
        // Two repeated lines, blank lines in the document skipped.
        assert.equal(dropRepeatedTail("x = 1\n    }\n}", { restOfLine: "", suffix: "\n\n    }\n}\n" }), "x = 1");
    });

    it("knows when a suggestion already contains the rest of the line", () => {
        assert.equal(consumesRestOfLine("a, b)", ")"), true);
        assert.equal(consumesRestOfLine("a, b", ")"), false);
        assert.equal(consumesRestOfLine("a, b); x = 1", ")"), true);
        assert.equal(consumesRestOfLine("name\"]", "\"]"), true);
        assert.equal(consumesRestOfLine("foo bar baz", "baz"), true);
        assert.equal(consumesRestOfLine("foo", "bar"), false);
        assert.equal(consumesRestOfLine("x", "  "), false);
        // Multi-line: only the first line may consume it.
        assert.equal(consumesRestOfLine("a,\n  b)", ")"), false);
        assert.equal(consumesRestOfLine("a, b)\n  c", ")"), true);
    });

    it("places items from the line start, replacing the rest of the line when consumed", () => {
        const { doc, pos } = vscode.docAt("    print(|)\n");
        const snap = snapshot(doc, pos, DEFAULT_CONFIG);
        assert.deepEqual(placement("x, y)", snap), {
            insertText: "    print(x, y)",
            range: { startLine: 0, startCharacter: 0, endLine: 0, endCharacter: 11 },
        });
        assert.deepEqual(placement("x, y", snap), {
            insertText: "    print(x, y",
            range: { startLine: 0, startCharacter: 0, endLine: 0, endCharacter: 10 },
        });
    });

    it("windows the prefix and suffix on line boundaries", () => {
        const text = "line one\nline two\nline three|\nafter one\nafter two\n";
        const { doc, pos } = vscode.docAt(text);
        const snap = snapshot(doc, pos, { ...DEFAULT_CONFIG, maxPrefixChars: 15, maxSuffixChars: 14 });
        assert.equal(snap.prefix, "line three");
        assert.equal(snap.suffix, "\nafter one");
        assert.equal(snap.linePrefix, "line three");
        assert.equal(snap.restOfLine, "");
    });

    it("post-processes: CRLF, caps, trailing blank lines", () => {
        const { doc, pos } = vscode.docAt("def f():\n    |\n");
        const snap = snapshot(doc, pos, DEFAULT_CONFIG);
        assert.equal(postprocess("return 1\r\n\r\n", snap, { maxLines: 8 }), "return 1");
        assert.equal(postprocess("a\nb\nc", snap, { maxLines: 1 }), "a");
    });

    it("enables languages by map with a '*' default", () => {
        assert.equal(languageEnabled({ "*": true, markdown: false }, "python"), true);
        assert.equal(languageEnabled({ "*": true, markdown: false }, "markdown"), false);
        assert.equal(languageEnabled({ "*": false, python: true }, "go"), false);
        assert.equal(languageEnabled({}, "go"), true);
    });
});

describe("cache", () => {
    it("serves the rest of a suggestion while the user types it", () => {
        const cache = new CompletionCache();
        const a = vscode.docAt("x = |\n");
        cache.add(snapshot(a.doc, a.pos, DEFAULT_CONFIG), "foo(1)", "r1");
        const b = vscode.docAt("x = fo|\n");
        assert.deepEqual(cache.lookup(snapshot(b.doc, b.pos, DEFAULT_CONFIG)), { text: "o(1)", id: "r1" });
        const c = vscode.docAt("x = fa|\n");
        assert.equal(cache.lookup(snapshot(c.doc, c.pos, DEFAULT_CONFIG)), undefined);
        // Typed it all: nothing left to serve.
        const d = vscode.docAt("x = foo(1)|\n");
        assert.equal(cache.lookup(snapshot(d.doc, d.pos, DEFAULT_CONFIG)), undefined);
        // Another document.
        const e = vscode.docAt("x = fo|\n", "python", "file:///other.py");
        assert.equal(cache.lookup(snapshot(e.doc, e.pos, DEFAULT_CONFIG)), undefined);
        // Text before the original position changed.
        const f = vscode.docAt("y = fo|\n");
        assert.equal(cache.lookup(snapshot(f.doc, f.pos, DEFAULT_CONFIG)), undefined);
    });

    it("accepts auto-closed brackets after the cursor, nothing else", () => {
        const cache = new CompletionCache();
        const a = vscode.docAt("x = |\n");
        cache.add(snapshot(a.doc, a.pos, DEFAULT_CONFIG), "foo(1)", "r1");
        const b = vscode.docAt("x = foo(|)\n");
        assert.deepEqual(cache.lookup(snapshot(b.doc, b.pos, DEFAULT_CONFIG)), { text: "1)", id: "r1" });
        const c = vscode.docAt("x = foo(|bar\n");
        assert.equal(cache.lookup(snapshot(c.doc, c.pos, DEFAULT_CONFIG)), undefined);
    });

    it("keeps a bounded number of entries", () => {
        const cache = new CompletionCache(3);
        for (let i = 0; i < 5; i++) {
            const { doc, pos } = vscode.docAt(`v${"x".repeat(i)} = |`);
            cache.add(snapshot(doc, pos, DEFAULT_CONFIG), "1", `r${i}`);
        }
        assert.equal(cache.size, 3);
    });
});

describe("provider", () => {
    it("asks the daemon and returns a line-start item with an accept command", async () => {
        const { backend, provider } = setup();
        backend.answers.push({ items: ["a + b"] });
        const items = await ask(provider, "def add(a, b):\n    return |\n");
        assert.equal(backend.calls.length, 1);
        const req = backend.calls[0].request;
        assert.equal(req.prefix, "def add(a, b):\n    return ");
        assert.equal(req.suffix, "\n");
        assert.equal(req.uri, "file:///project/a.py");
        assert.equal(req.language, "python");
        assert.equal(req.max_tokens, undefined, "the daemon's default unless set");
        assert.ok(items && items.length === 1);
        assert.equal(items[0].insertText, "    return a + b");
        assert.deepEqual(items[0].range, new vscode.Range(1, 0, 1, 11));
        assert.deepEqual(items[0].command, { command: "soldaemon.accepted", title: "Accepted", arguments: ["r1"] });
    });

    it("does nothing when disabled, for a switched-off language, or with the suggest widget open", async () => {
        const off = setup({ enabled: false });
        assert.equal(await ask(off.provider, "x = |"), undefined);
        assert.equal(off.backend.calls.length, 0);

        const md = setup();
        const { doc, pos } = vscode.docAt("# title |", "markdown");
        assert.equal(await md.provider.provideInlineCompletionItems(doc, pos, AUTO, vscode.newToken().token), undefined);
        assert.equal(md.backend.calls.length, 0);

        const widget = setup();
        assert.equal(await ask(widget.provider, "x = |", vscode.newToken().token, { triggerKind: 1, selectedCompletionInfo: {} }), undefined);
        assert.equal(widget.backend.calls.length, 0);
    });

    it("never sends the text of a secret file (.env, keys, ~/.ssh)", async () => {
        for (const uri of ["file:///project/.env", "file:///project/.env.local", "file:///home/me/.ssh/config",
            "file:///project/deploy/tls.key", "file:///project/.git/COMMIT_EDITMSG"]) {
            const s = setup();
            const { doc, pos } = vscode.docAt("API_KEY=|", "dotenv", uri);
            assert.equal(await s.provider.provideInlineCompletionItems(doc, pos, INVOKE, vscode.newToken().token), undefined);
            assert.equal(s.backend.calls.length, 0, uri);
        }
        const ok = setup();
        const { doc, pos } = vscode.docAt("x = |", "python", "file:///project/id_utils.py");
        await ok.provider.provideInlineCompletionItems(doc, pos, INVOKE, vscode.newToken().token);
        assert.equal(ok.backend.calls.length, 1);
    });

    it("uses the daemon's secret patterns", () => {
        const src = fs.readFileSync(path.join(__dirname, "..", "..", "..", "soldaemon", "sensitive.py"), "utf8");
        const block = /SECRET_PATTERNS: tuple\[str, \.\.\.\] = \(([\s\S]*?)\n\)/.exec(src);
        assert.ok(block, "SECRET_PATTERNS not found in soldaemon/sensitive.py");
        const python = [...block[1].matchAll(/"([^"]*)"/g)].map((m) => m[1]);
        assert.deepEqual([...SECRET_PATTERNS], python);
    });

    it("does not duplicate a closing bracket after the cursor", async () => {
        const { backend, provider } = setup();
        backend.answers.push({ items: ["a, b)"] }, { items: ["a, b"] });
        const [first] = (await ask(provider, "print(|)\n"))!;
        assert.equal(first.insertText, "print(a, b)");
        assert.deepEqual(first.range, new vscode.Range(0, 0, 0, 7)); // replaces the ")"
        const [second] = (await ask(provider, "len(|)\n"))!;
        assert.equal(second.insertText, "len(a, b");
        assert.deepEqual(second.range, new vscode.Range(0, 0, 0, 4)); // the ")" stays
    });

    it("drops lines the document already has after the cursor and caps lines", async () => {
        const { backend, provider } = setup({ maxLines: 3 });
        backend.answers.push({ items: ["\n    return 1\n}"] }, { items: ["\n  a\n  b\n  c\n  d"] });
        const [item] = (await ask(provider, "function f() {|\n}\n"))!;
        assert.equal(item.insertText, "function f() {\n    return 1");
        const [capped] = (await ask(provider, "list = [|\n"))!;
        assert.equal(capped.insertText, "list = [\n  a\n  b");
    });

    it("serves type-through from the cache with the same item, without asking again", async () => {
        const { backend, provider, sleeps } = setup({ debounceMs: 50 });
        backend.answers.push({ items: ["return a + b"] });
        const { doc, pos } = vscode.docAt("def add(a, b):\n    |\n");
        const [first] = (await ask(provider, { doc, pos }))!;
        assert.equal(first.insertText, "    return a + b");
        assert.equal(sleeps.length, 1);
        // The user types "ret".
        doc.set("def add(a, b):\n    ret\n");
        const [again] = (await ask(provider, { doc, pos: new vscode.Position(1, 7) }))!;
        assert.equal(backend.calls.length, 1, "no new request");
        assert.equal(sleeps.length, 1, "no debounce for a cache hit");
        assert.equal(again.insertText, first.insertText, "same text: no flicker");
        assert.deepEqual(again.range, new vscode.Range(1, 0, 1, 7));
        // A different character: a new request.
        doc.set("def add(a, b):\n    rex\n");
        await ask(provider, { doc, pos: new vscode.Position(1, 7) });
        assert.equal(backend.calls.length, 2);
    });

    it("cancelled during the debounce: nothing is sent", async () => {
        const { backend, provider } = setup({ debounceMs: 50 });
        const src = vscode.newToken();
        const pending = ask(provider, "x = |", src.token);
        src.cancel();
        assert.equal(await pending, undefined);
        assert.equal(backend.calls.length, 0);
    });

    it("cancelled while the daemon works: the request is aborted (the client sends cancel)", async () => {
        const events: string[] = [];
        const { backend, provider } = setup({}, { onResult: (r) => events.push(r.finishReason) });
        backend.hold = true;
        backend.answers.push({ items: ["never shown"] });
        const src = vscode.newToken();
        const pending = ask(provider, "x = |", src.token);
        await new Promise((r) => setImmediate(r));
        assert.equal(backend.calls.length, 1);
        src.cancel();
        assert.equal(await pending, undefined);
        assert.equal(backend.calls[0].aborted, true);
        assert.deepEqual(events, ["cancelled"]);
        // Nothing cached from a cancelled request.
        assert.equal(provider.cache.size, 0);
    });

    it("an answer that arrives after VS Code moved on is cached, not shown", async () => {
        const { backend, provider } = setup();
        backend.hold = true;
        backend.doneWinsRace = true;
        backend.answers.push({ items: ["foo(1)"] });
        const src = vscode.newToken();
        const { doc, pos } = vscode.docAt("x = |\n");
        const pending = provider.provideInlineCompletionItems(doc, pos, AUTO, src.token);
        await new Promise((r) => setImmediate(r));
        src.cancel(); // VS Code moved on; the cancel is sent...
        backend.release(); // ...but the daemon's done was already on its way
        assert.equal(await pending, undefined);
        assert.equal(backend.calls[0].aborted, true);
        assert.equal(provider.cache.size, 1);
        doc.set("x = f\n");
        const [item] = (await ask(provider, { doc, pos: new vscode.Position(0, 5) }))!;
        assert.equal(item.insertText, "x = foo(1)");
        assert.equal(backend.calls.length, 1);
    });

    it("superseded and failed requests show nothing and report errors", async () => {
        const errors: unknown[] = [];
        const { backend, provider } = setup({}, { onError: (e) => errors.push(e) });
        backend.answers.push({ items: ["partial"], finishReason: "superseded" }, new Error("boom"), { items: [""] });
        assert.equal(await ask(provider, "a = |"), undefined);
        assert.equal(await ask(provider, "b = |"), undefined);
        assert.equal(errors.length, 1);
        assert.equal(await ask(provider, "c = |"), undefined, "empty suggestion: nothing");
        assert.equal(provider.cache.size, 0);
    });

    it("an explicit trigger skips the debounce; settings are read per request", async () => {
        const { backend, provider, sleeps, config } = setup({ debounceMs: 40 });
        backend.answers.push({ items: ["1"] }, { items: ["2"] });
        await ask(provider, "a = |", vscode.newToken().token, INVOKE);
        assert.equal(sleeps.length, 0);
        config.maxTokens = 7;
        config.maxLines = 1;
        await ask(provider, "b = |");
        assert.deepEqual(sleeps, [40]);
        assert.equal(backend.calls[1].request.max_tokens, 7);
        assert.equal(backend.calls[1].request.multiline, "single");
    });
});
