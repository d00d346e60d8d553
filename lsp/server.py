"""``sol-lsp``: the language server bringing soldaemon's completions to any LSP editor. Only
the pygls wiring lives here; the LSP surface is documented in docs/editors.md."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import sys
import threading
from pathlib import Path
from typing import Any, BinaryIO, Generator, Sequence

from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams, JsonRpcInvalidRequest
from pygls.io_ import StdinAsyncReader, StdoutWriter
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol, lsp_method

from soldaemon import __version__

from lsp.completer import Completer, DaemonRequestFailed, Suggestion
from lsp.context import ContextRing
from lsp.daemon_client import DaemonClient
from lsp.events import ACCEPT_COMMAND, NOTIFICATIONS, to_event
from lsp.launcher import DaemonLauncher, daemon_log_path, default_daemon_command, resolve_target, run_doctor
from lsp.documents import DocumentStore, normalize_encoding, units
from lsp.framing import run_strict
from lsp.settings import OPTIONS, Launch, Settings, SettingsError, parse_args
from lsp.status import OPEN_LOG, RUN_DOCTOR, Progress, StatusReporter
from soldaemon.privacy.rules import ContextPolicy, folder_paths

__all__ = ["SolLanguageServer", "build_server", "main"]

log = logging.getLogger("sol.lsp")

MAX_LINE_PREFIX = 1000          # chars: longer lines get cursor-relative items
# How long a plain completion waits for a starting daemon before an empty, incomplete list:
# eglot and lsp-mode ask synchronously and give up after 10 s.
PLAIN_START_WAIT_S = 4.0
CONFIG_SECTION = "soldaemon"    # workspace/didChangeConfiguration: settings.soldaemon
COMPLETION_READY = "sol/completionReady"   # {uri}: the rest of an early inline answer is there


class RequestFailed(JsonRpcException):
    """LSP ``RequestFailed``: the daemon refused the request for good."""

    CODE = types.LSPErrorCodes.RequestFailed.value
    MESSAGE = "Request Failed"


def _own_handler_only(method: str) -> Any:
    """pygls' built-in ``method`` without its copy of the documents: the server's handler alone."""
    @lsp_method(method)
    def handler(self: LanguageServerProtocol, params: Any) -> Generator[Any, Any, None]:
        user_handler = self.fm.features.get(method)
        if user_handler is not None:
            yield user_handler, (params,), None
    return handler


class SolProtocol(LanguageServerProtocol):
    """pygls' protocol: ``initialize`` once per process (a second is refused with
    InvalidRequest), and no copy of the documents (they live in :class:`DocumentStore` alone)."""

    _initialized_once = False

    @lsp_method(types.INITIALIZE)
    def lsp_initialize(self, params: types.InitializeParams) -> Generator[Any, Any, types.InitializeResult]:
        if self._initialized_once:
            log.warning("refused a second initialize request")
            raise JsonRpcInvalidRequest("initialize was already received; a server is initialized once")
        self._initialized_once = True
        result = yield from super().lsp_initialize(params)
        # the event notifications handled: a client sending both names of an event sends one
        result.capabilities.experimental = {"soldaemon": {"notifications": sorted(NOTIFICATIONS)}}
        return result

    lsp_text_document__did_open = _own_handler_only(types.TEXT_DOCUMENT_DID_OPEN)
    lsp_text_document__did_change = _own_handler_only(types.TEXT_DOCUMENT_DID_CHANGE)
    lsp_text_document__did_close = _own_handler_only(types.TEXT_DOCUMENT_DID_CLOSE)


class SolLanguageServer(LanguageServer):
    """The server; :func:`build_server` registers its handlers."""

    def __init__(self, settings: Settings) -> None:
        super().__init__("sol-lsp", __version__, protocol_cls=SolProtocol,
                         text_document_sync_kind=types.TextDocumentSyncKind.Incremental)
        self.settings = settings
        self.documents = DocumentStore()
        self.client_has_inline = False
        self.client_has_markdown = False        # completion item documentation may be Markdown
        self.daemon: DaemonClient | None = None
        self.completer: Completer | None = None
        self.progress_bar = Progress(self)
        self.reporter = StatusReporter(self, self.progress_bar)
        self.client_name = "unknown client"
        self.client_has_progress = False
        self.client_wants_status = False       # capabilities.experimental.soldaemon.status
        self.client_has_show_document = False  # window.showDocument (the error actions use it)
        self.policy = ContextPolicy()  # what may be sent; set from the workspace folders in initialize

    def report_server_error(self, error: Exception, source: Any) -> None:
        """Log only: errors must never become a stream of pop-ups."""
        log.error("server error (%s): %s", getattr(source, "__name__", source), error)

    def start_io(self, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> None:
        """Serve LSP on stdin/stdout with the strict reader (:mod:`lsp.framing`)."""
        self._stop_event = stop = threading.Event()
        self.protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))
        reader = StdinAsyncReader(stdin or sys.stdin.buffer, self.thread_pool)
        try:
            asyncio.run(run_strict(stop, reader, self.protocol, log, self.report_server_error))
        except BrokenPipeError:
            log.error("the client went away")
        except (KeyboardInterrupt, SystemExit):
            pass
        finally:
            self.shutdown()

    def configure(self, params: types.InitializeParams) -> None:
        """Apply ``initialize``'s options and capabilities and start connecting to the daemon;
        raises JsonRpcInvalidParams for a bad option."""
        try:
            settings, unknown = self.settings.with_options(params.initialization_options)
        except SettingsError as exc:
            raise JsonRpcInvalidParams(f"initializationOptions: {exc}") from None
        if unknown:
            log.warning("ignoring initializationOptions: %s", ", ".join(sorted(unknown)))
        self.settings = settings
        folders = [f.uri for f in params.workspace_folders or ()] or \
            ([params.root_uri] if params.root_uri else [])
        self.set_policy(folders if folders or params.workspace_folders is not None else None)
        self.documents.encoding = normalize_encoding(self.workspace.position_encoding)
        text_caps = params.capabilities.text_document
        self.client_has_inline = bool(text_caps and text_caps.inline_completion is not None)
        item_caps = text_caps.completion.completion_item if text_caps and text_caps.completion else None
        formats = item_caps.documentation_format if item_caps else None
        self.client_has_markdown = types.MarkupKind.Markdown in (formats or ())
        window = params.capabilities.window
        self.client_has_progress = bool(window and window.work_done_progress)
        experimental = params.capabilities.experimental
        self.client_wants_status = isinstance(experimental, dict) and isinstance(experimental.get("soldaemon"), dict) \
            and experimental["soldaemon"].get("status") is True
        self.client_has_show_document = bool(window and window.show_document and window.show_document.support)
        self.client_name = client = params.client_info.name if params.client_info else "unknown client"
        log.info("initialize: %s, position encoding %s, inline completion %s", client,
                 self.documents.encoding, "yes" if self.client_has_inline else "no")
        self.apply_shown_settings()
        self.start_daemon_client()

    def reconfigure(self, params: types.DidChangeConfigurationParams) -> None:
        """Apply the ``soldaemon`` section (or a flat object of our keys) now; an invalid value
        is shown and the settings stay."""
        raw = params.settings
        if isinstance(raw, dict) and CONFIG_SECTION in raw:
            section = raw[CONFIG_SECTION]
        elif isinstance(raw, dict) and any(opt.key in raw for opt in OPTIONS):
            section = raw                      # our keys at the top level
        else:
            return                             # other servers' settings, or none
        try:
            settings, ignored = self.settings.with_options(section)
        except SettingsError as exc:
            log.warning("configuration refused: %s", exc)
            self.window_show_message(types.ShowMessageParams(
                type=types.MessageType.Error,
                message=f"soldaemon: invalid setting {exc}; the previous settings stay in effect"))
            return
        if ignored:
            log.warning("ignoring settings: %s", ", ".join(sorted(ignored)))
        if settings.context_exclude != self.settings.context_exclude:   # applies now, not after a restart
            self.policy = dataclasses.replace(self.policy, exclude=settings.context_exclude)
        self.settings = settings
        if self.completer is not None:
            self.completer.ring.set_policy(self.policy)
            self.completer.settings = settings
            self.completer.ring.max_chunks = max(0, min(settings.context_chunks, 32))
        if self.daemon is not None:
            self.daemon.slow_ms = settings.slow_ms
        self.apply_shown_settings()
        log.info("settings changed")

    def apply_shown_settings(self) -> None:
        """``sol/status`` on or off and sol-lsp's log level (``None``: the command line's)."""
        self.reporter.enabled = self.client_wants_status or self.settings.status_notifications
        if self.settings.log_level is not None:
            logging.getLogger("sol").setLevel(self.settings.log_level.upper())

    def set_policy(self, folder_uris: Sequence[str] | None) -> None:
        """Send only files inside ``folder_uris`` (None: anywhere) that the policy allows."""
        s = self.settings
        folders = folder_paths(folder_uris) if folder_uris is not None else None
        self.policy = ContextPolicy(folders, s.context_include, s.context_exclude)
        if self.completer is not None:
            self.completer.ring.set_policy(self.policy)

    def start_daemon_client(self) -> None:
        """Create the daemon client and completer and start connecting (``initialize`` comes once:
        :class:`SolProtocol`)."""
        s = self.settings
        launcher = None
        if s.start_daemon:
            launcher = DaemonLauncher(list(s.daemon_command) or default_daemon_command(s),
                                      timeout_s=s.start_timeout_s, idle_exit_s=s.daemon_idle_exit_s)
        self.daemon = DaemonClient(
            lambda: resolve_target(self.settings), on_status=self.reporter, launcher=launcher,
            on_latency=self.reporter.completed,
            backoff_initial_s=s.backoff_initial_ms / 1000, backoff_max_s=s.backoff_max_ms / 1000,
            connect_timeout_s=s.connect_timeout_ms / 1000, failure_message_after_s=s.failure_message_after_s,
            slow_ms=s.slow_ms)
        ring = ContextRing(max_entries=max(16, 2 * s.context_chunks), max_chunks=s.context_chunks,
                           chunk_lines=s.context_lines, policy=self.policy)
        self.completer = Completer(s, self.documents, ring, self.daemon, on_withheld=self.reporter.withheld)
        # tell the client the rest of an early answer is there
        self.completer.on_rest_ready = lambda uri: self.protocol.notify(COMPLETION_READY, {"uri": uri})
        self.daemon.start()

    async def stop_daemon_client(self) -> None:
        if self.completer is not None:
            await self.completer.aclose()
        if self.daemon is not None:
            await self.daemon.close()

    async def suggest(self, uri: str, position: types.Position, automatic: bool, *,
                      inline: bool = False) -> Suggestion | None:
        """The completer's answer (alternatives: invoked inline requests); a daemon refusal raises
        :class:`RequestFailed`."""
        if self.completer is None:
            return None
        try:
            return await self.completer.suggest(uri, position, automatic=automatic,
                                                alternatives=inline and not automatic,
                                                tag=str(self.protocol.msg_id), early=inline,
                                                start_wait_s=None if inline else PLAIN_START_WAIT_S)
        except DaemonRequestFailed as exc:
            raise RequestFailed(str(exc), data={"code": exc.frame.code, "hint": exc.frame.hint}) from None

    def inline_items(self, s: Suggestion, position: types.Position) -> list[types.InlineCompletionItem]:
        """Items replacing the cursor's whole line (docs/editors.md), or inserted at the cursor
        on a line over MAX_LINE_PREFIX."""
        items = []
        whole_line = len(s.line_prefix) + len(s.line_suffix) <= MAX_LINE_PREFIX
        line_end = types.Position(position.line,
                                  position.character + units(s.line_suffix, self.documents.encoding))
        for i, (text, index) in enumerate(zip(s.items, s.indices)):
            command = types.Command(title="soldaemon: accepted", command=ACCEPT_COMMAND,
                                    arguments=[s.id_of(i), index, len(s.line_prefix) if whole_line else 0])
            if whole_line:
                items.append(types.InlineCompletionItem(
                    insert_text=s.line_prefix + text + s.line_suffix, command=command,
                    range=types.Range(types.Position(position.line, 0), line_end)))
            else:
                items.append(types.InlineCompletionItem(insert_text=text, command=command))
        return items

    def completion_items(self, s: Suggestion, position: types.Position, language: str | None
                         ) -> list[types.CompletionItem]:
        """Plain completion items, each a textEdit from the word's start."""
        word_start = len(s.line_prefix)
        while word_start > 0 and (s.line_prefix[word_start - 1].isalnum() or s.line_prefix[word_start - 1] == "_"):
            word_start -= 1
        word = s.line_prefix[word_start:]
        start = types.Position(position.line, max(0, position.character - units(word, self.documents.encoding)))
        out = []
        for rank, (text, index) in enumerate(zip(s.items, s.indices)):
            new_text = word + text
            first_line = new_text.strip().split("\n", 1)[0]
            label = first_line if len(first_line) <= 60 else first_line[:59] + "…"
            out.append(types.CompletionItem(
                label=label, kind=types.CompletionItemKind.Text,
                detail="soldaemon", sort_text=f"{rank:04d}", filter_text=new_text, preselect=rank == 0,
                documentation=types.MarkupContent(types.MarkupKind.Markdown, f"```{language or ''}\n{new_text}\n```")
                if self.client_has_markdown else new_text,      # the full completion
                insert_text_format=types.InsertTextFormat.PlainText,
                text_edit=types.TextEdit(types.Range(start, position), new_text),
                command=types.Command(title="soldaemon: accepted", command=ACCEPT_COMMAND,
                                      arguments=[s.id_of(rank), index])))
        return out

    def error_action(self, title: str) -> None:
        """Carry out the failure message's action the user chose."""
        if title == OPEN_LOG:
            self.show_file(daemon_log_path())
        elif title == RUN_DOCTOR:
            asyncio.get_running_loop().create_task(self._run_doctor(), name="sol-doctor")

    async def _run_doctor(self) -> None:
        report = daemon_log_path().with_name("doctor.txt")
        try:
            argv, out, status = await run_doctor(self.settings)
            report.write_text(f"$ {' '.join(argv)}\n{out}(exit status {status})\n")
        except (OSError, TimeoutError) as exc:
            self.window_show_message(types.ShowMessageParams(
                type=types.MessageType.Error, message=f"soldaemon: could not run soldaemon doctor: {exc}"))
            return
        self.show_file(report)

    def show_file(self, path: Path) -> None:
        if self.client_has_show_document:
            self.protocol.send_request(types.WINDOW_SHOW_DOCUMENT, types.ShowDocumentParams(
                uri=path.as_uri(), take_focus=True))
        else:
            self.window_show_message(types.ShowMessageParams(type=types.MessageType.Info,
                                                             message=f"soldaemon: see {path}"))

    def forward_event(self, kind: str, params: Any) -> None:
        """Forward an event to the daemon; malformed params are logged and dropped."""
        event = to_event(kind, params)
        if event is None or self.daemon is None:
            log.info("ignoring %s event with params %r", kind, params)
            return
        sent = self.daemon.event(event)
        log.debug("event %s for %s[%d]%s", kind, event.id, event.item, "" if sent else " dropped (not connected)")


def build_server(settings: Settings) -> SolLanguageServer:
    server = SolLanguageServer(settings)

    @server.feature(types.INITIALIZE)
    def initialize(ls: SolLanguageServer, params: types.InitializeParams) -> None:
        ls.configure(params)

    @server.feature(types.INITIALIZED)
    def initialized(ls: SolLanguageServer, params: types.InitializedParams) -> None:
        ls.progress_bar.enabled = ls.client_has_progress     # a start under way shows at once
        if ls.reporter.last.busy:
            ls.progress_bar.show(ls.reporter.last.message)

    @server.feature(types.SHUTDOWN)
    async def shutdown(ls: SolLanguageServer, params: Any) -> None:
        await ls.stop_daemon_client()

    @server.feature(types.WORKSPACE_DID_CHANGE_WORKSPACE_FOLDERS)
    def folders_changed(ls: SolLanguageServer, params: types.DidChangeWorkspaceFoldersParams) -> None:
        ls.set_policy([f.uri for f in ls.workspace.folders.values()])

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: SolLanguageServer, params: types.DidOpenTextDocumentParams) -> None:
        doc = ls.documents.open(params.text_document)
        if ls.completer is not None:
            ls.completer.ring.opened(doc.uri, ls.documents)
            if ls.daemon is not None and ls.completer.enabled(doc) and ls.completer.may_send(doc.uri):
                ls.daemon.poke()        # the first pause gets a suggestion: start the daemon now

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: SolLanguageServer, params: types.DidChangeTextDocumentParams) -> None:
        changed = ls.documents.change(params)
        if changed is None:
            log.warning("didChange for %s, which is not open", params.text_document.uri)
            return
        if ls.completer is not None:
            ls.completer.edited(*changed)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: SolLanguageServer, params: types.DidCloseTextDocumentParams) -> None:
        if ls.completer is not None:
            ls.completer.closing(params.text_document.uri)
        ls.documents.close(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
    async def inline_completion(ls: SolLanguageServer, params: types.InlineCompletionParams
                                ) -> types.InlineCompletionList:
        if not ls.client_has_inline:     # from now on serve inline items only, never plain ones too
            log.info("%s asks for inline completions although its capabilities did not say so; "
                     "serving inline items only from now on", ls.client_name)
            ls.client_has_inline = True
        automatic = params.context.trigger_kind == types.InlineCompletionTriggerKind.Automatic
        found = await ls.suggest(params.text_document.uri, params.position, automatic, inline=True)
        return types.InlineCompletionList(items=ls.inline_items(found, params.position) if found else [])

    @server.feature(types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions(resolve_provider=False))
    async def completion(ls: SolLanguageServer, params: types.CompletionParams) -> types.CompletionList:
        mode = ls.settings.completion_items
        if mode == "never" or (mode == "auto" and ls.client_has_inline):
            return types.CompletionList(is_incomplete=False, items=[])
        automatic = params.context is not None and \
            params.context.trigger_kind != types.CompletionTriggerKind.Invoked
        found = await ls.suggest(params.text_document.uri, params.position, automatic)
        doc = ls.documents.get(params.text_document.uri)
        items = ls.completion_items(found, params.position, doc.language if doc else None) if found else []
        return types.CompletionList(is_incomplete=True, items=items)

    @server.command(ACCEPT_COMMAND)
    def accepted(ls: SolLanguageServer, *args: Any) -> None:
        ls.forward_event("accepted", {"id": args[0] if args else None, "index": args[1] if len(args) > 1 else 0})

    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    def configuration_changed(ls: SolLanguageServer, params: types.DidChangeConfigurationParams) -> None:
        ls.reconfigure(params)

    for method, kind in NOTIFICATIONS.items():
        server.feature(method)(functools.partial(server.forward_event, kind))

    return server


def _setup_logging(launch: Launch) -> None:
    handler: logging.Handler = (logging.FileHandler(launch.log_file) if launch.log_file
                                else logging.StreamHandler(sys.stderr))
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    level = launch.log_level.upper()
    logging.getLogger("sol").setLevel(level)
    logging.getLogger("pygls").setLevel(logging.WARNING if level != "DEBUG" else logging.INFO)


def main(argv: Sequence[str] | None = None) -> int:
    """``sol-lsp [--stdio] [options]``; see ``--help``."""
    launch = parse_args(argv)
    _setup_logging(launch)
    server = build_server(launch.settings)
    log.info("sol-lsp %s starting (stdio)", __version__)
    server.start_io()
    return 0


if __name__ == "__main__":
    sys.exit(main())
