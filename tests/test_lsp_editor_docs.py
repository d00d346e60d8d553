"""The editor set-ups in docs/editors.md, run where the editor exists here.

Each snippet follows a ``<!-- snippet: NAME -->`` line. Debian's Neovim
(0.7) runs the 0.7 snippet for real against sol-lsp and a real daemon (tiny
model); the 0.11/0.12 snippet needs APIs 0.7 lacks, so it is only compiled.
Debian's Emacs 28.2 runs the eglot snippet (eglot 1.9) and the lsp-mode one
(lsp-mode 8.0.0) for real the same way, in batch mode; the inline-completion
addition needs lsp-mode 9, so its Lisp is only checked for balance. Helix
cannot be installed here: its TOML is parsed and must name the server.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.fixtures.daemon import Daemon, spawn
from tests.fixtures.lsp_harness import REPO, lsp_env
from tests.fixtures.require import require

DOC = REPO / "docs" / "editors.md"
PREFIX = "def add(a, b):\n    return "

# Runs after the snippet (appended to the same init.lua): opens nothing itself
# (the file is on the command line), waits for the snippet's client and the
# daemon, asks for a completion at the end of line 2, writes the answer.
DRIVER = r"""
local out_path = vim.env.SOL_DOC_OUT
local function finish(payload)
  local f = assert(io.open(out_path, "w"))
  f:write(vim.json.encode(payload))
  f:close()
  vim.cmd("qall!")
end
vim.api.nvim_create_autocmd("VimEnter", { callback = function() vim.schedule(function()
  local ok, err = pcall(function()
    if vim.bo.filetype ~= "python" then vim.bo.filetype = "python" end
    assert(vim.wait(60000, function()
      local clients = vim.lsp.buf_get_clients(0)
      return next(clients) ~= nil and vim.g.sol_status == "ready"
    end, 20), "no sol-lsp client became ready; status " .. tostring(vim.g.sol_status))
    local params = {
      textDocument = { uri = vim.uri_from_bufnr(0) },
      position = { line = 1, character = 11 },
      context = { triggerKind = 1 },
    }
    local answers = vim.lsp.buf_request_sync(0, "textDocument/completion", params, 60000)
    local count = 0
    for _ in pairs(vim.lsp.buf_get_clients(0)) do count = count + 1 end
    local result
    for _, answer in pairs(answers or {}) do result = answer.result or answer.err end
    finish({ result = result, clients = count, omnifunc = vim.bo.omnifunc })
  end)
  if not ok then finish({ error = tostring(err) }) end
end) end })
"""

# Emacs: Debian's elpa packages (eglot, lsp-mode and their dependencies) are
# loaded with package.el from the system directory; the snippet follows, then
# one of the drivers below. Each opens the file, connects the snippet's client
# to sol-lsp over stdio, asks completion-at-point at the end of line 2 (until
# the daemon answers, as a user retrying would) and writes the candidates.
EMACS_PRELUDE = r"""
(setq native-comp-deferred-compilation nil)   ; no background compiles of the packages
(require 'package)
(setq package-user-dir (expand-file-name "elpa" (getenv "HOME")))
(add-to-list 'package-directory-list "/usr/share/emacs/site-lisp/elpa")
(package-initialize)
(require 'json)
(defun sol-doc-finish (payload)
  (with-temp-file (getenv "SOL_DOC_OUT") (insert (json-encode payload)))
  (kill-emacs 0))
(defun sol-doc-candidates (capf)
  "Ask CAPF (a completion-at-point function) until it has candidates; each
candidate as (text . the LSP item's command name)."
  (let ((deadline (+ (float-time) 90)) found)
    (while (and (not found) (< (float-time) deadline))
      (let* ((answer (funcall capf))
             (cands (and answer (all-completions "" (nth 2 answer)))))
        (setq found (mapcar (lambda (c) (cons c (sol-doc-item-command c))) cands))
        (unless found (accept-process-output nil 0.5))))
    found))
"""

EGLOT_DRIVER = r"""
(defun sol-doc-item-command (c)
  (let ((cmd (plist-get (get-text-property 0 'eglot--lsp-item c) :command)))
    (and cmd (plist-get cmd :command))))
(condition-case err
    (progn
      (unless (require 'eglot nil t) (sol-doc-finish '((missing . "eglot"))))
      (setq eglot-sync-connect t)
      (find-file (getenv "SOL_DOC_FILE"))
      (python-mode)
      (apply #'eglot--connect (eglot--guess-contact))
      (let ((deadline (+ (float-time) 60)))
        (while (and (not (eglot-managed-p)) (< (float-time) deadline))
          (accept-process-output nil 0.2)))
      (goto-char (point-min)) (forward-line 1) (end-of-line)
      (sol-doc-finish
       `((managed . ,(if (eglot-managed-p) t :json-false))
         (command . ,(vconcat (process-command (jsonrpc--process (eglot-current-server)))))
         (capf . ,(if (memq #'eglot-completion-at-point completion-at-point-functions) t :json-false))
         (candidates . ,(vconcat (mapcar (lambda (c) (vector (car c) (cdr c)))
                                         (sol-doc-candidates #'eglot-completion-at-point)))))))
  (error (sol-doc-finish `((error . ,(format "%S" err))))))
"""

LSP_MODE_DRIVER = r"""
(defun sol-doc-item-command (c)
  (let* ((item (get-text-property 0 'lsp-completion-item c))
         (cmd (and item (lsp-get item :command))))
    (and cmd (lsp-get cmd :command))))
(condition-case err
    (progn
      (setq lsp-client-packages nil lsp-enable-file-watchers nil lsp-completion-no-cache t
            lsp-restart 'ignore lsp-enable-suggest-server-download nil)
      (unless (require 'lsp-mode nil t) (sol-doc-finish '((missing . "lsp-mode"))))
      (require 'lsp-completion)
      (find-file (getenv "SOL_DOC_FILE"))
      (python-mode)
      (lsp-workspace-folders-add (file-name-directory (getenv "SOL_DOC_FILE")))
      (lsp)
      (let ((deadline (+ (float-time) 60)))
        (while (and (not (and (lsp-workspaces)
                              (eq (lsp--workspace-status (car (lsp-workspaces))) 'initialized)))
                    (< (float-time) deadline))
          (accept-process-output nil 0.2)))
      (goto-char (point-min)) (forward-line 1) (end-of-line)
      (sol-doc-finish
       `((servers . ,(vconcat (mapcar (lambda (w) (symbol-name (lsp--client-server-id (lsp--workspace-client w))))
                                      (lsp-workspaces))))
         (capf . ,(if (memq #'lsp-completion-at-point completion-at-point-functions) t :json-false))
         (candidates . ,(vconcat (mapcar (lambda (c) (vector (car c) (cdr c)))
                                         (sol-doc-candidates #'lsp-completion-at-point)))))))
  (error (sol-doc-finish `((error . ,(format "%S" err))))))
"""


def snippet(name: str) -> str:
    """The fenced block after ``<!-- snippet: NAME -->`` in docs/editors.md."""
    found = re.search(rf"<!-- snippet: {re.escape(name)} -->\s*```\w*\n(.*?)```", DOC.read_text(), re.S)
    assert found, f"docs/editors.md has no snippet {name!r}"
    return found.group(1)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engine_args: list[str]) -> Iterator[Daemon]:
    started = spawn(tmp_path_factory.mktemp("docs-daemon"), args=[*engine_args, "--port", "0"])
    assert isinstance(started, Daemon)
    yield started
    started.stop()


def _nvim() -> str:
    nvim = shutil.which("nvim")
    require(nvim, "Neovim", "apt-get install -y neovim")
    assert nvim is not None
    return nvim


def test_the_neovim_07_snippet_completes_for_real(daemon: Daemon, tmp_path: Path) -> None:
    nvim = _nvim()
    bin_dir, log = _sol_lsp_wrapper(tmp_path)
    init = tmp_path / "init.lua"
    init.write_text(snippet("nvim-0.7") + DRIVER)
    source = tmp_path / "edit.py"
    source.write_text(PREFIX + "\n")
    out = tmp_path / "result.json"
    env = lsp_env(daemon.state_dir, {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "SOL_DOC_OUT": str(out),
        "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_DATA_HOME": str(tmp_path / "data"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"), "XDG_STATE_HOME": str(tmp_path / "nvim-state")})
    proc = subprocess.run([nvim, "--headless", "-n", "-i", "NONE", "-u", str(init), str(source)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=150)
    server_log = log.read_text() if log.exists() else ""
    assert out.exists(), f"nvim wrote nothing (rc {proc.returncode}): {proc.stderr[-2000:]}\n{server_log[-3000:]}"
    report = json.loads(out.read_text())
    assert not report.get("error"), f"{report}\n{server_log[-3000:]}"
    assert report["clients"] == 1 and report["omnifunc"] == "v:lua.vim.lsp.omnifunc"
    items = report["result"]["items"]
    assert items, f"no completion through the documented set-up: {report}\n{server_log[-3000:]}"
    assert items[0]["command"]["command"] == "sol.accepted"
    assert items[0]["textEdit"]["newText"].strip()


def test_the_neovim_011_snippet_compiles(tmp_path: Path) -> None:
    """Only compiled: Neovim 0.7 has no vim.lsp.config/enable/inline_completion."""
    nvim = _nvim()
    code = tmp_path / "nvim-011.lua"
    code.write_text(snippet("nvim-0.11"))
    check = f"lua local f, e = loadfile({json.dumps(str(code))}); if not f then print(e); vim.cmd('cq') end"
    proc = subprocess.run([nvim, "--headless", "-u", "NONE", "-i", "NONE", "-c", check, "-c", "qa!"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = snippet("nvim-0.11")
    for needed in ("vim.lsp.config(", "vim.lsp.enable(", "root_markers", "vim.lsp.inline_completion.enable(",
                   "vim.lsp.inline_completion.get()", "expr = true"):
        assert needed in text, needed


def test_the_helix_snippet_parses() -> None:
    data = tomllib.loads(snippet("helix"))
    assert data["language-server"]["sol-lsp"]["command"] == "sol-lsp"
    assert isinstance(data["language-server"]["sol-lsp"]["config"], dict)
    python = next(lang for lang in data["language"] if lang["name"] == "python")
    assert "sol-lsp" in python["language-servers"]


def _sol_lsp_wrapper(tmp_path: Path) -> tuple[Path, Path]:
    """A ``sol-lsp`` on PATH for this checkout (the console script, as
    installed) that uses the test's daemon; the bin folder and its log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "sol-lsp.log"
    wrapper = bin_dir / "sol-lsp"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -m lsp.server --no-start-daemon --timeout-ms 60000 "
                       f"--max-tokens 16 --log-level info --log-file {log} \"$@\"\n")
    wrapper.chmod(0o755)
    return bin_dir, log


def _run_emacs(daemon: Daemon, tmp_path: Path, code: str) -> tuple[dict[str, Any], str]:
    emacs = shutil.which("emacs")
    require(emacs, "Emacs", "apt-get install -y emacs-nox elpa-eglot elpa-lsp-mode")
    assert emacs is not None
    bin_dir, log = _sol_lsp_wrapper(tmp_path)
    init = tmp_path / "init.el"
    init.write_text(code)
    source = tmp_path / "edit.py"
    source.write_text(PREFIX + "\n")
    out = tmp_path / "result.json"
    env = lsp_env(daemon.state_dir, {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "SOL_DOC_OUT": str(out),
        "SOL_DOC_FILE": str(source), "HOME": str(tmp_path)})
    proc = subprocess.run([emacs, "--batch", "-Q", "-l", str(init)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    server_log = log.read_text() if log.exists() else ""
    assert out.exists(), f"emacs wrote nothing (rc {proc.returncode}): {proc.stderr[-3000:]}\n{server_log[-3000:]}"
    report = json.loads(out.read_text())
    if report.get("missing"):
        require(None, f"the Emacs package {report['missing']}", f"apt-get install -y elpa-{report['missing']}")
    assert not report.get("error"), f"{report}\n{proc.stderr[-3000:]}\n{server_log[-3000:]}"
    return report, server_log


def test_the_eglot_snippet_completes_for_real(daemon: Daemon, tmp_path: Path) -> None:
    """Emacs 28 + Debian's eglot 1.9: the snippet's server entry starts
    sol-lsp for python-mode; completion-at-point gets the daemon's item."""
    report, server_log = _run_emacs(daemon, tmp_path, EMACS_PRELUDE + snippet("eglot") + EGLOT_DRIVER)
    assert report["managed"] is True and report["capf"] is True, report
    assert Path(report["command"][0]).name == "sol-lsp", report
    candidates = report["candidates"]
    assert candidates, f"no completion through the documented set-up: {report}\n{server_log[-3000:]}"
    text, command = candidates[0]
    assert text.strip() and command == "sol.accepted", report


def test_the_lsp_mode_snippet_completes_for_real(daemon: Daemon, tmp_path: Path) -> None:
    """Emacs 28 + Debian's lsp-mode 8.0.0: the snippet's add-on client starts
    sol-lsp for python-mode; lsp-completion-at-point gets the daemon's item."""
    report, server_log = _run_emacs(daemon, tmp_path, EMACS_PRELUDE + snippet("lsp-mode") + LSP_MODE_DRIVER)
    assert report["servers"] == ["sol-lsp"] and report["capf"] is True, report
    candidates = report["candidates"]
    assert candidates, f"no completion through the documented set-up: {report}\n{server_log[-3000:]}"
    text, command = candidates[0]
    assert text.strip() and command == "sol.accepted", report


def test_the_lsp_mode_inline_snippet_is_balanced() -> None:
    """Form only: lsp-inline-completion-mode arrived in lsp-mode 9.0; Debian's
    8.0.0 (the one here) lacks it."""
    name = "lsp-mode-inline"
    text = snippet(name)
    depth = 0
    in_string = False
    for line in text.splitlines():
        i = 0
        while i < len(line):
            c = line[i]
            if in_string:
                if c == "\\":
                    i += 1
                elif c == '"':
                    in_string = False
            elif c == '"':
                in_string = True
            elif c == ";":
                break                       # a comment to the end of the line
            elif c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
                assert depth >= 0, f"unbalanced ')' in {name}: {line}"
            i += 1
    assert depth == 0 and not in_string, f"{name}: {depth} unclosed '('"
    assert "(add-hook 'lsp-mode-hook #'lsp-inline-completion-mode)" in text
