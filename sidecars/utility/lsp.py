"""``lsp.symbols`` and ``lsp.diagnostics``: a language server kept as the sidecar's child.

# Strategy: one :class:`LanguageServer` per worker, started lazily by the first call from
# ``config.lspCommand`` (an argument list, e.g. ``["pylsp"]``) with cwd = projectDir. It speaks
# JSON-RPC 2.0 with ``Content-Length`` framing over the child's stdin/stdout. A reader thread
# parses frames, completes pending requests by id, keeps the last ``publishDiagnostics`` per
# document (with a counter so a call can wait for a publish *after* its own change) and answers
# the server's own requests (``workspace/configuration``...) with nulls. A call finds the server
# dead (exit, broken pipe) -> starts a new one (``restarts`` counts them). The child stays in the
# worker's process group and reads the worker's pipe, so it dies with the worker (stdin EOF, and
# the host's group kill); at interpreter exit it is asked to ``shutdown``/``exit`` and then killed.
"""

from __future__ import annotations

import atexit
import contextlib
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import msgspec
from msgspec import Meta

from sidecars.sdk import Context, Sidecar, ToolError
from sidecars.sdk.commands import Missing, require, resolve
from sidecars.sdk.paths import confine

HINT = 'pip install python-lsp-server, then set "lspCommand": ["pylsp"]'
MAX_FILE_BYTES = 4 << 20
"""Files larger than this are refused (``too-large``)."""
DEFAULT_SETTLE_MS = 300
"""After the first diagnostics publish for a change, wait this long for more (config
``lspSettleMs``)."""
INIT_TIMEOUT_S = 20.0
"""Longest wait for ``initialize`` when the call's deadline is longer."""

SYMBOL_KINDS = [
    "file",
    "module",
    "namespace",
    "package",
    "class",
    "method",
    "property",
    "field",
    "constructor",
    "enum",
    "interface",
    "function",
    "variable",
    "constant",
    "string",
    "number",
    "boolean",
    "array",
    "object",
    "key",
    "null",
    "enummember",
    "struct",
    "event",
    "operator",
    "typeparameter",
]
SEVERITIES = {1: "error", 2: "warning", 3: "information", 4: "hint"}

T = TypeVar("T")
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.decode


class ServerGone(Exception):
    """The language server exited or its pipe broke."""


class LanguageServer:
    """One running language server process and the client state that goes with it."""

    def __init__(self, argv: list[str], root: str) -> None:
        self.argv = argv
        self.root = root
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,  # the worker's stderr: the host drains it into the stderr tail
            cwd=root,
            close_fds=True,
        )
        self._send_lock = threading.Lock()
        self._cond = threading.Condition()
        self._next_id = 0
        self._pending: dict[int, Any] = {}
        self._diagnostics: dict[str, tuple[int, list[Any]]] = {}
        self._publishes = 0
        self.documents: dict[str, tuple[int, str]] = {}  # uri -> (version, text)
        self._doc_lock = threading.Lock()
        self.alive = True
        self._reader = threading.Thread(target=self._read_loop, name="lsp-reader", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    # framing -----------------------------------------------------------------------------

    def _write(self, message: dict[str, Any]) -> None:
        body = _encode({"jsonrpc": "2.0", **message})
        stdin = self.proc.stdin
        assert stdin is not None
        with self._send_lock:
            try:
                stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
                stdin.flush()
            except (BrokenPipeError, OSError, ValueError) as exc:
                self._mark_dead()
                raise ServerGone(f"cannot write to the language server: {exc}") from None

    def _read_loop(self) -> None:
        stdout = self.proc.stdout
        assert stdout is not None
        try:
            while True:
                length = -1
                while True:
                    line = stdout.readline()
                    if not line:
                        return
                    line = line.strip()
                    if not line:
                        break
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip())
                if length < 0:
                    continue
                body = stdout.read(length)
                if len(body) < length:
                    return
                try:
                    msg = _decode(body)
                except msgspec.DecodeError:
                    continue
                if isinstance(msg, dict):
                    self._dispatch(msg)
        except (OSError, ValueError):
            return
        finally:
            self._mark_dead()

    def _dispatch(self, msg: dict[str, Any]) -> None:
        method = msg.get("method")
        if method is None:
            with self._cond:
                if msg.get("id") in self._pending:
                    self._pending[msg["id"]] = msg
                    self._cond.notify_all()
            return
        if "id" in msg:  # a request from the server: answer so it never waits on us
            result: Any = None
            if method == "workspace/configuration":
                items = (msg.get("params") or {}).get("items") or []
                result = [None] * len(items)
            with contextlib.suppress(ServerGone):
                self._write({"id": msg["id"], "result": result})
            return
        if method == "textDocument/publishDiagnostics":
            params = msg.get("params") or {}
            with self._cond:
                self._publishes += 1
                self._diagnostics[str(params.get("uri"))] = (
                    self._publishes,
                    list(params.get("diagnostics") or []),
                )
                self._cond.notify_all()

    def _mark_dead(self) -> None:
        with self._cond:
            self.alive = False
            self._cond.notify_all()

    # requests ----------------------------------------------------------------------------

    def request(self, method: str, params: Any, deadline: float) -> Any:
        """Send a request and wait for its response until ``deadline`` (monotonic)."""
        with self._cond:
            self._next_id += 1
            rid = self._next_id
            self._pending[rid] = None
        try:
            self._write({"id": rid, "method": method, "params": params})
            with self._cond:
                while self._pending[rid] is None:
                    if not self.alive:
                        raise ServerGone("the language server exited")
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise ToolError(
                            f"the language server did not answer {method} in time",
                            code="failed",
                            details={"reason": "lsp-timeout", "method": method},
                        )
                    self._cond.wait(left)
                msg = self._pending[rid]
        finally:
            with self._cond:
                self._pending.pop(rid, None)
        if "error" in msg:
            err = msg["error"] or {}
            raise ToolError(
                f"the language server refused {method}: {err.get('message')}",
                code="failed",
                details={"reason": "lsp-error", "method": method, "lspCode": err.get("code")},
            )
        return msg.get("result")

    def notify(self, method: str, params: Any) -> None:
        self._write({"method": method, "params": params})

    def initialize(self, deadline: float) -> None:
        root_uri = Path(self.root).as_uri()
        self.request(
            "initialize",
            {
                "processId": None,
                "rootUri": root_uri,
                "rootPath": self.root,
                "workspaceFolders": [{"uri": root_uri, "name": Path(self.root).name}],
                "capabilities": {
                    "textDocument": {
                        "documentSymbol": {"hierarchicalDocumentSymbolSupport": True},
                        "publishDiagnostics": {"versionSupport": True},
                        "synchronization": {"didSave": True},
                    },
                    "workspace": {"configuration": True, "workspaceFolders": True},
                },
                "clientInfo": {"name": "toolhost-utility"},
            },
            deadline,
        )
        self.notify("initialized", {})

    def sync(self, uri: str, text: str) -> bool:
        """Open or update the document; True when the server was told something new."""
        with self._doc_lock:
            return self._sync(uri, text)

    def _sync(self, uri: str, text: str) -> bool:
        known = self.documents.get(uri)
        if known is None:
            self.documents[uri] = (1, text)
            self.notify(
                "textDocument/didOpen",
                {
                    "textDocument": {
                        "uri": uri,
                        "languageId": _language(uri),
                        "version": 1,
                        "text": text,
                    }
                },
            )
            return True
        version, old = known
        if old == text:
            return False
        self.documents[uri] = (version + 1, text)
        self.notify(
            "textDocument/didChange",
            {
                "textDocument": {"uri": uri, "version": version + 1},
                "contentChanges": [{"text": text}],
            },
        )
        return True

    def publishes(self) -> int:
        with self._cond:
            return self._publishes

    def wait_diagnostics(
        self, uri: str, after: int, settle_s: float, deadline: float
    ) -> tuple[list[Any], bool]:
        """Diagnostics for ``uri`` published after counter ``after``, settled for ``settle_s``.

        Returns the list and whether it settled (False: the deadline came first and the list is
        the latest published, or empty when none was).
        """
        with self._cond:
            while True:
                got = self._diagnostics.get(uri)
                if got is not None and got[0] > after:
                    break
                if not self.alive:
                    raise ServerGone("the language server exited")
                left = deadline - time.monotonic()
                if left <= 0:
                    return (got[1] if got else []), False
                self._cond.wait(left)
            # Quiet period: a server may publish again (one linter after another).
            while True:
                seen = self._diagnostics[uri][0]
                quiet_until = min(time.monotonic() + settle_s, deadline)
                while self._diagnostics[uri][0] == seen and self.alive:
                    left = quiet_until - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                if self._diagnostics[uri][0] == seen or time.monotonic() >= deadline:
                    return self._diagnostics[uri][1], self._diagnostics[uri][0] == seen

    def stop(self, grace_s: float = 1.0) -> None:
        """Ask the server to shut down and exit; kill it after ``grace_s``."""
        if self.proc.poll() is None and self.alive:
            with contextlib.suppress(ServerGone, ToolError):
                self.request("shutdown", None, time.monotonic() + grace_s)
            with contextlib.suppress(ServerGone):
                self.notify("exit", None)
        with contextlib.suppress(OSError, ValueError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _language(uri: str) -> str:
    suffix = uri.rsplit(".", 1)[-1].lower() if "." in uri else ""
    return {
        "py": "python",
        "pyi": "python",
        "js": "javascript",
        "ts": "typescript",
        "rs": "rust",
        "go": "go",
        "c": "c",
        "h": "c",
        "cpp": "cpp",
        "md": "markdown",
    }.get(suffix, suffix or "plaintext")


class Manager:
    """The worker's one language server: started lazily, restarted when it died."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.server: LanguageServer | None = None
        self.starts = 0
        self.argv: list[str] | None = None
        atexit.register(self.close)

    def get(self, argv: list[str], root: str, deadline: float) -> LanguageServer:
        with self.lock:
            server = self.server
            if (
                server is not None
                and server.alive
                and server.proc.poll() is None
                and server.argv == argv
                and server.root == root
            ):
                return server
            if server is not None:
                server.stop(grace_s=0.5)
            try:
                server = LanguageServer(argv, root)
            except OSError as exc:
                raise ToolError(
                    f"cannot start the language server {argv[0]!r}: {exc.strerror or exc}",
                    code="unavailable",
                    details={"reason": "start-failed", "command": argv},
                ) from None
            self.server = server
            self.starts += 1
            try:
                server.initialize(min(deadline, time.monotonic() + INIT_TIMEOUT_S))
            except ServerGone:
                code = server.proc.poll()
                raise ToolError(
                    f"the language server exited during initialize (exit code {code})",
                    code="failed",
                    details={"reason": "server-exited", "exitCode": code},
                ) from None
            return server

    def close(self) -> None:
        with self.lock:
            if self.server is not None:
                self.server.stop(grace_s=1.0)
                self.server = None


MANAGER = Manager()


class LspInput(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    """Which file to ask the language server about."""

    path: Annotated[str, Meta(description="File path relative to the project directory.")]


class Position(msgspec.Struct):
    line: Annotated[int, Meta(description="Zero-based line.")]
    character: Annotated[int, Meta(description="Zero-based UTF-16 column.")]


class Symbol(msgspec.Struct, omit_defaults=True):
    """One symbol of the document (nested symbols are listed after their container)."""

    name: str
    kind: Annotated[str, Meta(description="LSP symbol kind in lower case: function, class...")]
    start: Position
    end: Position
    container: Annotated[str | None, Meta(description="Enclosing symbol's name.")] = None
    detail: str | None = None


class ServerInfo(msgspec.Struct):
    pid: Annotated[int, Meta(description="The language server's process id.")]
    starts: Annotated[int, Meta(description="How many servers this worker has started.")]


class SymbolsOutput(msgspec.Struct):
    path: str
    symbols: list[Symbol]
    server: ServerInfo


class Diagnostic(msgspec.Struct, omit_defaults=True):
    message: str
    severity: Annotated[str, Meta(description="error, warning, information or hint.")]
    start: Position
    end: Position
    source: str | None = None
    code: str | None = None


class DiagnosticsOutput(msgspec.Struct):
    path: str
    diagnostics: list[Diagnostic]
    settled: Annotated[
        bool,
        Meta(description="False when the deadline came before the server published (or settled)."),
    ]
    server: ServerInfo


def _position(raw: Any) -> Position:
    raw = raw or {}
    return Position(line=int(raw.get("line", 0)), character=int(raw.get("character", 0)))


def _flatten(items: list[Any], container: str | None, out: list[Symbol]) -> None:
    for item in items or []:
        if not isinstance(item, dict):
            continue
        rng = item.get("range") or (item.get("location") or {}).get("range") or {}
        kind_no = item.get("kind", 0)
        kind = SYMBOL_KINDS[kind_no - 1] if 1 <= kind_no <= len(SYMBOL_KINDS) else str(kind_no)
        out.append(
            Symbol(
                name=str(item.get("name", "")),
                kind=kind,
                start=_position(rng.get("start")),
                end=_position(rng.get("end")),
                container=item.get("containerName") or container,
                detail=item.get("detail") or None,
            )
        )
        _flatten(item.get("children") or [], str(item.get("name", "")), out)


def _prepare(tool: str, args: LspInput, ctx: Context) -> tuple[LanguageServer, str, int]:
    """Start (or reuse) the server and sync the file.

    Returns the server, the document URI and the publish counter to wait past: the count before
    the file was sent when it changed (a publish describing an older text does not count), 0
    when the server already has this exact text.
    """
    argv = require(ctx.config, "lspCommand", ctx.project_dir, hint=HINT, tool=tool)
    path = confine(ctx.project_dir, args.path, must_exist=True, kind="file")
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ToolError(
                f"{args.path!r} is {size} bytes; the limit is {MAX_FILE_BYTES}",
                code="invalid-input",
                details={"path": args.path, "reason": "too-large", "limit": MAX_FILE_BYTES},
            )
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ToolError(
            f"{args.path!r} is not UTF-8 text",
            code="invalid-input",
            details={"path": args.path, "reason": "not-utf8"},
        ) from None
    except OSError as exc:
        raise ToolError(
            f"cannot read {args.path!r}: {exc.strerror or exc}",
            code="failed",
            details={"path": args.path, "reason": "read-error"},
        ) from None
    deadline = _deadline(ctx)
    server = MANAGER.get(argv, str(Path(ctx.project_dir).resolve()), deadline)
    uri = path.as_uri()
    before = server.publishes()
    changed = server.sync(uri, text)
    return server, uri, before if changed else 0


def _deadline(ctx: Context) -> float:
    budget = ctx.deadline_ms / 1000.0 if ctx.deadline_ms else 30.0
    # Keep a little of the budget to answer before the host's own deadline fires.
    return ctx.started + max(0.2, budget - min(0.5, budget * 0.1))


def _gone(tool: str, server: LanguageServer | None) -> ToolError:
    code = server.proc.poll() if server is not None else None
    return ToolError(
        f"{tool}: the language server exited mid-call (exit code {code}); "
        "the next call starts a new one",
        code="failed",
        details={"reason": "server-exited", "exitCode": code},
    )


def _with_server(
    tool: str, args: LspInput, ctx: Context, ask: Callable[..., T]
) -> tuple[LanguageServer, T]:
    """Run ``ask(server, uri, after)`` on the worker's server, restarting it once if it died.

    A server killed since the last call can still look alive for a moment (a multi-threaded
    process is reaped only after all its threads exited), so a call that finds it gone while
    talking to it starts a fresh one and asks again; a fresh server that dies is ``failed``.
    """
    for attempt in range(2):
        server: LanguageServer | None = None
        try:
            server, uri, after = _prepare(tool, args, ctx)
            return server, ask(server, uri, after)
        except ServerGone:
            server = server or MANAGER.server
            if attempt == 1 or server is None or time.monotonic() >= _deadline(ctx):
                raise _gone(tool, server) from None
    raise AssertionError("unreachable")


def lsp_symbols(args: LspInput, ctx: Context) -> SymbolsOutput:
    """The document symbols of one file, flattened in document order."""

    def ask(server: LanguageServer, uri: str, _after: int) -> Any:
        params = {"textDocument": {"uri": uri}}
        return server.request("textDocument/documentSymbol", params, _deadline(ctx))

    server, result = _with_server("lsp.symbols", args, ctx, ask)
    symbols: list[Symbol] = []
    _flatten(result if isinstance(result, list) else [], None, symbols)
    return SymbolsOutput(
        path=args.path, symbols=symbols, server=ServerInfo(pid=server.pid, starts=MANAGER.starts)
    )


def lsp_diagnostics(args: LspInput, ctx: Context) -> DiagnosticsOutput:
    """The diagnostics the server publishes for one file, after it settles."""
    settle_ms = ctx.config.get("lspSettleMs", DEFAULT_SETTLE_MS)
    if not isinstance(settle_ms, int) or isinstance(settle_ms, bool) or settle_ms < 0:
        raise ToolError(
            "config.lspSettleMs must be an integer >= 0",
            code="failed",
            details={"reason": "bad-config", "key": "lspSettleMs"},
        )

    def ask(server: LanguageServer, uri: str, after: int) -> tuple[list[Any], bool]:
        return server.wait_diagnostics(uri, after, settle_ms / 1000.0, _deadline(ctx))

    server, (raw, settled) = _with_server("lsp.diagnostics", args, ctx, ask)
    out = [
        Diagnostic(
            message=str(d.get("message", "")),
            severity=SEVERITIES.get(d.get("severity", 1), "error"),
            start=_position((d.get("range") or {}).get("start")),
            end=_position((d.get("range") or {}).get("end")),
            source=d.get("source"),
            code=None if d.get("code") is None else str(d.get("code")),
        )
        for d in raw
        if isinstance(d, dict)
    ]
    return DiagnosticsOutput(
        path=args.path,
        diagnostics=out,
        settled=settled,
        server=ServerInfo(pid=server.pid, starts=MANAGER.starts),
    )


def health(config: dict[str, Any], cwd: str) -> str | None:
    """Why the lsp tools are unavailable now, or None when the command resolves."""
    got = resolve(config, "lspCommand", cwd, hint=HINT)
    return got.message if isinstance(got, Missing) else None


def register(app: Sidecar) -> None:
    """Register ``lsp.symbols`` and ``lsp.diagnostics`` on ``app``.

    Args:
        app: The utility sidecar.
    """
    app.tool(
        "lsp.symbols",
        description=(
            "List the symbols (functions, classes, methods, variables) a language server finds "
            "in one file under the project, with their line ranges. Needs config.lspCommand."
        ),
        read_only=True,
        concurrency_safe=True,
        permission="read",
    )(lsp_symbols)
    app.tool(
        "lsp.diagnostics",
        description=(
            "Report the errors and warnings a language server publishes for one file under the "
            "project (undefined names, syntax errors, lint). Needs config.lspCommand."
        ),
        read_only=True,
        concurrency_safe=True,
        permission="read",
    )(lsp_diagnostics)
