// sol/completionReady: sol-lsp showed a block's first lines early and the
// rest is there; the extension asks VS Code to ask again, only for the
// document in front (on the fake `vscode`).

import { strict as assert } from "node:assert";
import { describe, it } from "node:test";
import * as vscode from "../testing/fakeVscode";
import type * as Ext from "../extension";

// eslint-disable-next-line @typescript-eslint/no-require-imports
const ext = require("../extension") as typeof Ext;

describe("the rest of a block shown early", () => {
    it("re-triggers inline suggestions for the active document only", () => {
        vscode.resetRecorded({});
        const c = new ext.Controller({ subscriptions: [] } as any);
        let triggered = 0;
        vscode.recorded.commands.set("editor.action.inlineSuggest.trigger", () => { triggered++; });
        try {
            c.completionReady({ uri: "file:///project/a.py" });      // no editor in front
            assert.equal(triggered, 0);
            const { doc, pos } = vscode.docAt("def f():\n    |\n");
            vscode.openEditor(doc, pos);
            c.completionReady({ uri: "file:///project/other.py" });  // another document
            c.completionReady({ uri: 42 });                          // a malformed notification
            c.completionReady(undefined as any);
            assert.equal(triggered, 0);
            c.completionReady({ uri: doc.uri.toString() });
            assert.equal(triggered, 1);
            assert.equal(ext.COMPLETION_READY, "sol/completionReady");
        } finally {
            c.dispose();
        }
    });
});
