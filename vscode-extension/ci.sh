#!/usr/bin/env bash
# Build, test and package the VS Code extension. Exits non-zero on any
# failure. Run from anywhere; CI calls it from .ci/run.
#
# The integration test needs a python that can import soldaemon: it uses
# $SOLDAEMON_PYTHON, else <repo>/.venv/bin/python, else soldaemon on PATH,
# and is skipped when none is found — set SOLDAEMON_REQUIRE_INTEGRATION=1 to
# make that a failure instead.
set -euo pipefail
cd "$(dirname "$0")"

npm ci --no-audit --no-fund
npm run compile
# With dependencies: `ws` is a runtime dependency and must be in the .vsix.
npx vsce package --allow-missing-repository --skip-license -o sol.vsix
# The package must contain the compiled extension and ws.
listing=$(python3 -m zipfile -l sol.vsix 2>/dev/null || unzip -l sol.vsix)
for f in extension/package.json extension/out/extension.js extension/node_modules/ws/index.js; do
  grep -q "$f" <<<"$listing" || { echo "ci.sh: $f is missing from sol.vsix" >&2; exit 1; }
done
# The packaged extension loads (against the fake vscode) with its own ws.
rm -rf .test-tmp/vsix && mkdir -p .test-tmp/vsix
python3 -m zipfile -e sol.vsix .test-tmp/vsix 2>/dev/null || unzip -q sol.vsix -d .test-tmp/vsix
node -e '
const fake = require("./out/testing/fakeVscode.js");
fake.resetRecorded({ "soldaemon.autoStart": false, "soldaemon.endpoint": "ws://127.0.0.1:9" });
const root = require("path").resolve(".test-tmp/vsix/extension");
const ext = require(root + "/out/extension.js");
const c = ext.activate({ subscriptions: [], extension: { packageJSON: require(root + "/package.json") } });
const ws = require.resolve("ws", { paths: [root + "/out"] });
if (!ws.startsWith(root)) { console.error("ws does not come from the package: " + ws); process.exit(1); }
if (fake.recorded.commands.size < 4 || fake.recorded.providers.length !== 1) { console.error("activation incomplete"); process.exit(1); }
c.dispose();
console.log("ci.sh: the packaged extension activates, ws from " + ws);
process.exit(0);
'
echo "ci.sh: built $(pwd)/sol.vsix"
# Last, so that the output ends with node's test runner summary.
npm test
