import { strict as assert } from "node:assert";
import { describe, it } from "node:test";
import { CompletionEvents, DID_SHOW, ItemLike, SOL_DID_REJECT, SOL_DID_SHOW } from "../events";

function item(id: string, text = "    return a + b", index = 0): ItemLike {
    return { insertText: text, range: { start: { line: 1, character: 0 }, end: { line: 1, character: 11 } },
        command: { command: "sol.accepted", title: "soldaemon: accepted", arguments: [id, index] } };
}

function setup(handled: string[] = []) {
    const sent: Array<[string, any]> = [];
    const events = new CompletionEvents((m, p) => sent.push([m, p]), (m) => handled.includes(m));
    return { sent, events, methods: () => sent.map(([m]) => m) };
}

describe("completion events", () => {
    it("shown once per item, under both names while the server lacks Copilot's", () => {
        const { events, sent, methods } = setup();
        events.answered([item("r1")]);
        events.answered([item("r1")]); // typed through: the same item
        assert.deepEqual(methods(), [DID_SHOW, SOL_DID_SHOW]);
        assert.deepEqual(sent[0][1].item.command.arguments, ["r1", 0]);
        assert.deepEqual(sent[0][1].item.range, { start: { line: 1, character: 0 }, end: { line: 1, character: 11 } });
    });

    it("only Copilot's name once the server advertises it", () => {
        const { events, methods } = setup([DID_SHOW]);
        events.answered([item("r1")]);
        assert.deepEqual(methods(), [DID_SHOW]);
    });

    it("rejects: replaced by another answer; never after an accept", () => {
        const { events, sent } = setup([DID_SHOW]);
        events.answered([item("r1")]);
        events.answered([item("r2")]);
        events.accepted(["r2", 0]);
        events.answered([item("r3")]);
        const rejects = sent.filter(([m]) => m === SOL_DID_REJECT).map(([, p]) => [p.item.command.arguments[0], p.reason]);
        assert.deepEqual(rejects, [["r1", "replaced"]]);
    });

    it("items that are not sol-lsp's are ignored", () => {
        const { events, sent } = setup();
        events.answered([{ insertText: "x" }]);
        assert.equal(sent.length, 0);
    });
});
