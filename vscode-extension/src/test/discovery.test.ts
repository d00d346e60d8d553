// Finding the daemon and starting it (with stand-in executables).

import { strict as assert } from "node:assert";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { after, describe, it } from "node:test";
import { DaemonError } from "../daemonClient";
import { parseReadyLine, startDaemon, summarizeFailure } from "../daemonProcess";
import { DEFAULT_URL, expandPath, locate, normalizeUrl, readDaemonRecord, readToken, stateDir } from "../discovery";
import { readSettings } from "../settings";

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "sol-ext-discovery-"));
after(() => fs.rmSync(tmp, { recursive: true, force: true }));

function env(vars: Record<string, string>) {
    return { env: vars as NodeJS.ProcessEnv, home: "/home/me" };
}

/** A stand-in for the soldaemon executable: a node script. */
function fakeExecutable(name: string, body: string): string {
    const file = path.join(tmp, name);
    fs.writeFileSync(file, `#!${process.execPath}\n${body}\n`, { mode: 0o755 });
    return file;
}

describe("discovery", () => {
    it("finds the state dir like the daemon does", () => {
        assert.equal(stateDir(env({ SOLDAEMON_STATE_DIR: "/s" })), "/s");
        assert.equal(stateDir(env({ XDG_STATE_HOME: "/x" })), "/x/soldaemon");
        assert.equal(stateDir(env({})), "/home/me/.local/state/soldaemon");
    });

    it("prefers the setting, then the running daemon's record, then the default", () => {
        const dir = path.join(tmp, "state1");
        fs.mkdirSync(dir);
        const e = env({ SOLDAEMON_STATE_DIR: dir });
        assert.deepEqual(locate({ endpoint: "", tokenFile: "" }, e), { url: DEFAULT_URL, tokenFile: path.join(dir, "token"), source: "default" });
        fs.writeFileSync(path.join(dir, "daemon.json"), JSON.stringify({ pid: 4242, url: "ws://127.0.0.1:9999", token_file: "/t/token" }));
        const alive = (pid: number) => pid === 4242;
        assert.deepEqual(locate({ endpoint: "", tokenFile: "" }, e, alive),
            { url: "ws://127.0.0.1:9999", tokenFile: "/t/token", source: "daemon.json", pid: 4242 });
        // A record of a dead process is ignored.
        assert.equal(readDaemonRecord(e, () => false), undefined);
        assert.equal(locate({ endpoint: "", tokenFile: "" }, e, () => false).source, "default");
        // The settings win.
        assert.deepEqual(locate({ endpoint: "127.0.0.1:1234", tokenFile: "~/tok" }, e, alive),
            { url: "ws://127.0.0.1:1234", tokenFile: "/home/me/tok", source: "setting" });
        assert.equal(locate({ endpoint: "", tokenFile: "$HOME/t" }, { env: { HOME: "/h" }, home: "/h" }).tokenFile, "/h/t");
    });

    it("normalizes URLs and expands paths", () => {
        assert.equal(normalizeUrl("http://localhost:1"), "ws://localhost:1");
        assert.equal(normalizeUrl("ws://x:1/v1"), "ws://x:1/v1");
        assert.equal(expandPath("${env:A}/b", env({ A: "/a" })), "/a/b");
    });

    it("reads the token, and says what to do when there is none", async () => {
        const file = path.join(tmp, "token");
        await assert.rejects(readToken(file), (e: unknown) =>
            e instanceof DaemonError && e.code === "no_token" && /soldaemon serve/.test(e.hint ?? ""));
        fs.writeFileSync(file, "short\n", { mode: 0o600 });
        await assert.rejects(readToken(file), /no valid token/);
        fs.writeFileSync(file, `${"k".repeat(43)}\n`);
        assert.equal(await readToken(file), "k".repeat(43));
    });

    it("reads the token only from a private regular file holding one token", async () => {
        const dir = fs.mkdtempSync(path.join(tmp, "tok-"));
        const file = path.join(dir, "token");
        fs.writeFileSync(file, `${"k".repeat(43)}\n`, { mode: 0o644 });
        await assert.rejects(readToken(file), (e: unknown) =>
            e instanceof DaemonError && e.code === "unsafe_token" && /chmod 600/.test(e.hint ?? ""));
        fs.chmodSync(file, 0o600);
        const link = path.join(dir, "link");
        fs.symlinkSync(file, link);
        await assert.rejects(readToken(link), (e: unknown) => e instanceof DaemonError && e.code === "unsafe_token");
        const key = path.join(dir, "id_ed25519");   // a private file named as the token file is not sent
        fs.writeFileSync(key, "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n", { mode: 0o600 });
        await assert.rejects(readToken(key), /no valid token/);
    });

    it("refuses a daemon.json another user could have planted, or one naming a remote URL", () => {
        const dir = fs.mkdtempSync(path.join(tmp, "state-"));
        const e = env({ SOLDAEMON_STATE_DIR: dir });
        const record = path.join(dir, "daemon.json");
        const alive = () => true;
        fs.writeFileSync(record, JSON.stringify({ pid: 1, url: "ws://127.0.0.1:9", token_file: "/home/me/.ssh/id_rsa" }));
        fs.chmodSync(dir, 0o777);
        assert.throws(() => readDaemonRecord(e, alive), (err: unknown) =>
            err instanceof DaemonError && err.code === "unsafe_state" && err.hint === `run: chmod go-w ${dir}`);
        fs.chmodSync(dir, 0o700);
        fs.chmodSync(record, 0o666);
        assert.throws(() => readDaemonRecord(e, alive), /writable by other users/);
        fs.chmodSync(record, 0o600);
        assert.equal(readDaemonRecord(e, alive)?.url, "ws://127.0.0.1:9");
        fs.writeFileSync(record, JSON.stringify({ pid: 1, url: "ws://203.0.113.7:8765", token_file: "/t" }));
        assert.throws(() => readDaemonRecord(e, alive), /not a loopback address/);
    });

    it("declares the settings that choose a host, a token or a command machine-scoped", () => {
        // A workspace's .vscode/settings.json must not point the extension at
        // another host and token file, or make it run another command.
        const pkg = JSON.parse(fs.readFileSync(path.join(__dirname, "..", "..", "package.json"), "utf8"));
        const props = pkg.contributes.configuration.properties;
        for (const key of ["soldaemon.endpoint", "soldaemon.tokenFile", "soldaemon.command", "soldaemon.serveArgs",
            "soldaemon.autoStart"]) {
            assert.ok(["machine", "application"].includes(props[key].scope), `${key}: scope ${props[key].scope}`);
        }
    });

    it("reads settings with defaults and clamps", () => {
        const s = readSettings((k) => ({ maxLines: 0, debounceMs: 20, languages: { go: false, bad: "x" }, serveArgs: ["--port", 1] } as Record<string, unknown>)[k]);
        assert.equal(s.provider.maxLines, 1);
        assert.equal(s.provider.debounceMs, 20);
        assert.equal(s.provider.languages.go, false);
        assert.equal(s.provider.languages["*"], true);
        assert.equal("bad" in s.provider.languages, false);
        assert.deepEqual(s.serveArgs, ["--port"]);
        assert.equal(s.command, "soldaemon");
        assert.equal(s.autoStart, true);
    });
});

describe("starting the daemon", () => {
    it("parses the ready line", () => {
        assert.deepEqual(
            parseReadyLine("soldaemon ready on ws://127.0.0.1:41235 model=tiny device=cpu token file: /tmp/s/token"),
            { url: "ws://127.0.0.1:41235", tokenFile: "/tmp/s/token" });
        assert.deepEqual(
            parseReadyLine("soldaemon ready on ws://[::1]:8765 model=a b device=cuda:0 token file: /home/me/my state/token"),
            { url: "ws://[::1]:8765", tokenFile: "/home/me/my state/token" });
        assert.equal(parseReadyLine("INFO soldaemon.server: listening on ws://127.0.0.1:1"), undefined);
    });

    it("waits for the ready line, passing the arguments", async () => {
        const exe = fakeExecutable("ok-daemon", `
process.stderr.write("loading\\r50%\\rdone\\n");
setTimeout(() => console.log("soldaemon ready on ws://127.0.0.1:5555 model=m device=cpu token file: /t/tok " + process.argv.slice(2).join(",")), 50);
process.on("SIGTERM", () => process.exit(0));
setInterval(() => {}, 1000);`);
        const logs: string[] = [];
        const d = await startDaemon({ command: exe, args: ["--port", "0"], timeoutMs: 10_000, onLog: (l) => logs.push(l) });
        assert.equal(d.url, "ws://127.0.0.1:5555");
        assert.equal(d.tokenFile, "/t/tok serve,--port,0");
        assert.ok(logs.includes("loading") && logs.includes("50%"));
        const exit = await d.stop();
        assert.equal(exit.code, 0);
    });

    it("reports the daemon's own error when it exits before it is ready", async () => {
        const exe = fakeExecutable("bad-daemon", `
console.error("2026 INFO something");
console.error("soldaemon: error [address_in_use]: port 8765 on 127.0.0.1 is already in use");
console.error("  hint: another soldaemon may be running");
process.exit(3);`);
        await assert.rejects(startDaemon({ command: exe, timeoutMs: 10_000 }), (e: unknown) =>
            e instanceof DaemonError && e.code === "start_failed"
            && /code 3/.test(e.message) && /already in use/.test(e.message) && /another soldaemon/.test(e.message)
            && !/INFO something/.test(e.message));
    });

    it("says so when the executable is missing", async () => {
        await assert.rejects(startDaemon({ command: path.join(tmp, "no-such-soldaemon"), timeoutMs: 5000 }), (e: unknown) =>
            e instanceof DaemonError && e.code === "not_installed" && /soldaemon.command/.test(e.hint ?? ""));
    });

    it("gives up after the timeout and kills the process", async () => {
        const exe = fakeExecutable("slow-daemon", "setInterval(() => {}, 1000);");
        await assert.rejects(startDaemon({ command: exe, timeoutMs: 300 }), (e: unknown) =>
            e instanceof DaemonError && e.code === "start_timeout");
    });

    it("summarizes failures from the tail of stderr", () => {
        assert.equal(summarizeFailure(["a", "b", "c", "d", "e"]), "b\nc\nd\ne");
        assert.equal(summarizeFailure(["x", "soldaemon: error [model]: no model", "  hint: h"]), "soldaemon: error [model]: no model\n  hint: h");
    });
});
