// The interpreter the user works with, from the Python extension's API
// (`ms-python.python` → environments.getActiveEnvironmentPath), on the fake
// `vscode`; and the missing-sol-lsp notification with its actions.

import { strict as assert } from "node:assert";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { describe, it } from "node:test";
import * as vscode from "../testing/fakeVscode";
import type * as Ext from "../extension";

// eslint-disable-next-line @typescript-eslint/no-require-imports
const ext = require("../extension") as typeof Ext;

describe("the Python extension's interpreter", () => {
    it("is asked for the active environment; its sol-lsp is the one run", async () => {
        const dir = fs.mkdtempSync(path.join(os.tmpdir(), "sol-py-"));
        const python = path.join(dir, "python");
        fs.writeFileSync(path.join(dir, "sol-lsp"), "");
        vscode.resetRecorded({});
        let asked = 0;
        vscode.installedExtensions.set("ms-python.python", {
            isActive: false, exports: undefined,
            activate: async () => ({ environments: { getActiveEnvironmentPath: () => { asked++; return { id: "venv", path: python }; } } }),
        });
        const c = new ext.Controller({ subscriptions: [] } as any);
        try {
            assert.equal(await c.pythonFromExtension(), python);
            assert.equal(asked, 1);
            c.activePython = python;
            assert.match(c.diagnosis(), new RegExp(`sol-lsp: +${path.join(dir, "sol-lsp").replace(/[.*+?^${}()|[\]\\]/g, "\\$&")} `));
        } finally {
            vscode.installedExtensions.clear();
            c.dispose();
            fs.rmSync(dir, { recursive: true, force: true });
        }
    });

    it("without the Python extension: none, and no error", async () => {
        vscode.resetRecorded({});
        const c = new ext.Controller({ subscriptions: [] } as any);
        try {
            assert.equal(await c.pythonFromExtension(), undefined);
        } finally {
            c.dispose();
        }
    });

    it("a missing sol-lsp is said once, with the install command and the actions", async () => {
        vscode.resetRecorded({ "soldaemon.python": "/opt/venv/bin/python" });
        let opened: unknown[] = [];
        vscode.recorded.commands.set("workbench.action.openSettings", (...args: unknown[]) => { opened = args; });
        vscode.recorded.answer = "Choose Python…";
        const c = new ext.Controller({ subscriptions: [] } as any);
        try {
            await c.offerInstall();
            await c.offerInstall();                 // once, not a stream
            const shown = vscode.recorded.messages.filter((m) => m.level === "error");
            assert.equal(shown.length, 1);
            assert.match(shown[0].text, /not on PyPI/);
            assert.match(shown[0].text, /\/opt\/venv\/bin\/python -m pip install -e \/path\/to\/soldaemon/);
            assert.deepEqual(shown[0].items, ["Install soldaemon…", "Choose Python…"]);
            assert.deepEqual(opened, ["soldaemon.python"]);
        } finally {
            vscode.recorded.answer = undefined;
            c.dispose();
        }
    });
});
