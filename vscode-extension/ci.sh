#!/usr/bin/env bash
# Build, test and package the VS Code extension. Exits non-zero on any
# failure. Run from anywhere; CI calls it from .ci/run.
#
# The integration test needs a python that can import soldaemon and lsp
# (it runs sol-lsp and a daemon from this checkout): it uses
# $SOLDAEMON_PYTHON, else <repo>/.venv/bin/python, else python3 on PATH,
# and is skipped when none is found — set SOLDAEMON_REQUIRE_INTEGRATION=1 to
# make that a failure instead.
set -euo pipefail
cd "$(dirname "$0")"

npm ci --no-audit --no-fund
npm run compile
# With dependencies: vscode-languageclient is a runtime dependency and must be in the .vsix.
npx vsce package --allow-missing-repository -o sol.vsix
# The package must contain the compiled extension and the language client.
listing=$(python3 -m zipfile -l sol.vsix 2>/dev/null || unzip -l sol.vsix)
for f in extension/package.json extension/out/extension.js extension/node_modules/vscode-languageclient/lib/node/main.js \
         extension/node_modules/vscode-languageserver-protocol/package.json; do
  grep -q "$f" <<<"$listing" || { echo "ci.sh: $f is missing from sol.vsix" >&2; exit 1; }
done
# The packaged extension activates (against the fake vscode) with its own
# vscode-languageclient; sol-lsp is not found here, which it must report.
rm -rf .test-tmp/vsix && mkdir -p .test-tmp/vsix
python3 -m zipfile -e sol.vsix .test-tmp/vsix 2>/dev/null || unzip -q sol.vsix -d .test-tmp/vsix
node -e '
const fake = require("./out/testing/fakeVscode.js");
fake.resetRecorded({ "soldaemon.serverCommand": "/nonexistent/sol-lsp" });
const root = require("path").resolve(".test-tmp/vsix/extension");
const ext = require(root + "/out/extension.js");
const c = ext.activate({ subscriptions: [], extension: { packageJSON: require(root + "/package.json") } });
const lc = require.resolve("vscode-languageclient/node", { paths: [root + "/out"] });
if (!lc.startsWith(root)) { console.error("vscode-languageclient does not come from the package: " + lc); process.exit(1); }
if (fake.recorded.commands.size < 5) { console.error("activation incomplete"); process.exit(1); }
setTimeout(() => {
  const text = fake.recorded.statusItems[0].tooltip;
  if (!/not found/.test(text)) { console.error("a missing sol-lsp is not reported: " + text); process.exit(1); }
  c.dispose();
  console.log("ci.sh: the packaged extension activates, vscode-languageclient from " + lc);
  process.exit(0);
}, 1000);
'
echo "ci.sh: built $(pwd)/sol.vsix"
# Last, so that the output ends with node's test runner summary.
npm test
