"""The browser state one sidecar process keeps across calls, and the CDP steps of each tool.

# Strategy: one :class:`Browser` per process holds the DevTools connection (opened lazily in
# the SDK loop's long-lived nursery), the flattened session of every tab it has touched and the
# tab it opened last. A closed connection (the browser died) is noticed by the reader task and
# replaced on the next call, so a restarted browser is used again without restarting the
# worker. Every CDP request waits at most until the call's deadline; protocol errors, a closed
# socket and timeouts become :class:`~sidecars.sdk.ToolError` ``failed`` with the CDP error in
# ``details``, an unreachable endpoint becomes ``unavailable`` with a hint.
"""

from __future__ import annotations

import base64
import math
import os
import re
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import unquote, urlsplit

import trio

from sidecars.browser_cdp.cdp import (
    GONE_SESSION,
    BrowserGone,
    CDPError,
    CDPTimeout,
    Connection,
    EndpointDown,
    browser_socket_url,
    http_get_json,
    is_gone_session,
)
from sidecars.sdk import Context, ToolError
from sidecars.sdk.paths import host_private

DEFAULT_ENDPOINT = "http://127.0.0.1:9222"
START_HINT = (
    "start Chromium with a DevTools port, e.g. `chromium --headless --remote-debugging-port=9222"
    " --user-data-dir=/tmp/toolhost-chromium`, or point sidecars.<id>.config.endpoint at a"
    " running one"
)
ALLOWED_SCHEMES = ("http", "https", "about", "file")
REF_RE = re.compile(r"^e([0-9]+)$")
INTERACTIVE_ROLES = frozenset(
    {
        "button",
        "link",
        "textbox",
        "searchbox",
        "checkbox",
        "radio",
        "combobox",
        "listbox",
        "option",
        "menuitem",
        "menuitemcheckbox",
        "menuitemradio",
        "tab",
        "switch",
        "slider",
        "spinbutton",
        "textarea",
    }
)
DEFAULT_BUDGET_S = 30.0
SAFETY_S = 0.25  # answer before the host's deadline, so the result is ours, not a timeout


def endpoint_of(config: dict[str, Any]) -> str:
    """``config.endpoint`` (default ``http://127.0.0.1:9222``) without a trailing slash."""
    value = config.get("endpoint", DEFAULT_ENDPOINT)
    if not isinstance(value, str) or not value.strip():
        raise ToolError(
            "config.endpoint must be a URL such as http://127.0.0.1:9222",
            code="unavailable",
            details={"endpoint": value, "hint": START_HINT},
        )
    return value.strip().rstrip("/")


def call_deadline(ctx: Context) -> float:
    """The Trio time by which every CDP request of this call must be answered."""
    left = ctx.time_left()
    budget = DEFAULT_BUDGET_S if left is None else max(0.05, left - SAFETY_S)
    return trio.current_time() + budget


def check_url(url: str, project_dir: str) -> str:
    """Refuse URLs other than http/https/about and file URLs under ``project_dir``.

    Raises:
        ToolError: ``invalid-input`` with ``details.reason`` ``scheme-refused`` or
            ``file-outside-project``.
    """
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if scheme not in ALLOWED_SCHEMES:
        shown = scheme or "none"
        raise ToolError(
            f"URL scheme {shown!r} is refused: use http, https, about, or file under the project",
            code="invalid-input",
            details={"url": url, "reason": "scheme-refused", "scheme": scheme},
        )
    if scheme in ("http", "https") and not parts.netloc:
        raise ToolError(
            f"URL {url!r} has no host",
            code="invalid-input",
            details={"url": url, "reason": "no-host"},
        )
    if scheme == "file":
        path = unquote(parts.path)
        root = os.path.realpath(project_dir)
        real = os.path.realpath(path) if path.startswith("/") else ""
        if (
            parts.netloc not in ("", "localhost")
            or not real
            or (real != root and not real.startswith(root + os.sep))
        ):
            raise ToolError(
                f"file URL {url!r} is outside the project directory",
                code="invalid-input",
                details={"url": url, "reason": "file-outside-project"},
            )
        if host_private(real) or host_private(path):
            raise ToolError(
                f"file URL {url!r} names one of the host's own files; no tool may read it",
                code="invalid-input",
                details={"url": url, "reason": "host-private"},
            )
    return url.strip()


@contextmanager
def cdp_errors(endpoint: str) -> Iterator[None]:
    """Turn CDP-level exceptions into ``ToolError``s that an audit can read."""
    try:
        yield
    except CDPError as exc:
        if is_gone_session(exc):
            raise ToolError(
                "the tab is gone (closed or crashed); use a targetId from browser.open",
                code="invalid-input",
                details={"reason": "unknown-target", "cdpError": {"message": exc.message}},
            ) from None
        raise ToolError(
            str(exc),
            code="failed",
            details={
                "cdpError": {"method": exc.method, "code": exc.code, "message": exc.message},
                "endpoint": endpoint,
            },
        ) from None
    except BrowserGone as exc:
        raise ToolError(
            f"the browser went away: {exc}",
            code="failed",
            details={
                "cdpError": {"message": str(exc)},
                "reason": "browser-gone",
                "endpoint": endpoint,
            },
        ) from None
    except CDPTimeout as exc:
        raise ToolError(
            str(exc),
            code="failed",
            details={"cdpError": {"method": exc.method}, "reason": "timeout", "endpoint": endpoint},
        ) from None


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk."""
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise ToolError("the browser returned something that is not a PNG", code="failed")
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


class Browser:
    """The DevTools connection and the tabs this sidecar knows, kept across calls."""

    def __init__(self) -> None:
        self.conn: Connection | None = None
        self.sessions: dict[str, str] = {}  # targetId -> flattened sessionId
        self.opened: list[str] = []  # targetIds this sidecar opened, oldest first
        # targetId -> loaderId of the document the last snapshot saw: refs are backend node
        # ids, which a new document may reuse, so a ref is only honoured on that document.
        self.snapshot_doc: dict[str, str] = {}
        self._lock: trio.Lock | None = None

    # connection ---------------------------------------------------------------------------

    async def probe(self, endpoint: str, within: float) -> str | None:
        """``None`` when the browser is reachable, else why not (for the worker's ``pong``)."""
        if self.conn is not None and self.conn.alive:
            return None
        try:
            await http_get_json(endpoint, "/json/version", within=within)
        except EndpointDown as exc:
            return f"DevTools endpoint unreachable: {exc}"
        return None

    async def connection(self, ctx: Context, endpoint: str, deadline: float) -> Connection:
        """The live browser connection, opened (again) if needed.

        Raises:
            ToolError: ``unavailable`` when the endpoint does not answer.
        """
        if self.conn is not None and self.conn.alive:
            return self.conn  # the common case, without a checkpoint
        if self._lock is None:
            self._lock = trio.Lock()
        async with self._lock:
            if self.conn is not None and self.conn.alive:
                return self.conn
            self.conn = None
            self.sessions.clear()
            self.opened.clear()
            self.snapshot_doc.clear()
            timeout = max(0.05, min(5.0, deadline - trio.current_time()))
            try:
                version = await http_get_json(endpoint, "/json/version", within=timeout)
                url = browser_socket_url(endpoint, version)
                nursery = ctx.nursery
                assert nursery is not None, "browser tools are async"
                self.conn = await Connection.open(nursery, url, within=timeout)
            except (EndpointDown, BrowserGone) as exc:
                raise ToolError(
                    f"no browser at {endpoint}: {exc}",
                    code="unavailable",
                    details={"endpoint": endpoint, "hint": START_HINT},
                ) from None
            return self.conn

    # tabs ---------------------------------------------------------------------------------

    async def attach(self, conn: Connection, target_id: str, deadline: float) -> str:
        """The flattened session of ``target_id`` (attached and Page-enabled on first use)."""
        sid = self.sessions.get(target_id)
        if sid is not None and sid not in conn.detached:
            return sid
        self.sessions.pop(target_id, None)  # the tab was closed (or never attached)
        try:
            res = await conn.send(
                "Target.attachToTarget", {"targetId": target_id, "flatten": True}, deadline=deadline
            )
        except CDPError as exc:
            raise ToolError(
                f"no tab with targetId {target_id!r}: {exc.message}",
                code="invalid-input",
                details={"targetId": target_id, "reason": "unknown-target"},
            ) from None
        sid = str(res["sessionId"])
        await conn.send("Page.enable", session=sid, deadline=deadline)
        self.sessions[target_id] = sid
        return sid

    async def tab(
        self, ctx: Context, target_id: str | None, deadline: float
    ) -> tuple[Connection, str, str]:
        """Connection, targetId and sessionId of the addressed tab (default: last opened)."""
        conn = await self.connection(ctx, endpoint_of(ctx.config), deadline)
        tid = target_id or (self.opened[-1] if self.opened else None)
        if tid is None:
            raise ToolError(
                "no tab yet: call browser.open first, or pass the targetId of an existing tab",
                code="invalid-input",
                details={"reason": "no-tab"},
            )
        return conn, tid, await self.attach(conn, tid, deadline)

    async def open(self, ctx: Context, url: str, deadline: float) -> tuple[str, str]:
        """Create a tab, attach, load ``url``; returns (targetId, sessionId).

        If anything fails (or the call is cancelled) the new tab is closed again.
        """
        conn = await self.connection(ctx, endpoint_of(ctx.config), deadline)
        res = await conn.send("Target.createTarget", {"url": "about:blank"}, deadline=deadline)
        tid = str(res["targetId"])
        try:
            sid = await self.attach(conn, tid, deadline)
            await self.navigate(conn, sid, url, "load", deadline)
        except BaseException:
            self.sessions.pop(tid, None)
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                try:
                    await conn.send("Target.closeTarget", {"targetId": tid})
                except (CDPError, BrowserGone, CDPTimeout):
                    pass
            raise
        self.opened.append(tid)
        return tid, sid

    async def navigate(
        self, conn: Connection, sid: str, url: str, wait_until: str, deadline: float
    ) -> None:
        """``Page.navigate`` and wait for ``load`` / ``DOMContentLoaded`` of the new document.

        A cancelled or timed-out navigation is stopped (``Page.stopLoading``) before returning.
        """
        event = "Page.loadEventFired" if wait_until == "load" else "Page.domContentEventFired"
        try:
            with conn.subscribe(sid, event) as events:
                res = await conn.send("Page.navigate", {"url": url}, session=sid, deadline=deadline)
                error = res.get("errorText")
                if error:
                    raise ToolError(
                        f"navigation to {url} failed: {error}",
                        code="failed",
                        details={
                            "cdpError": {"method": "Page.navigate", "message": error},
                            "url": url,
                        },
                    )
                if not res.get("loaderId"):
                    return  # same-document navigation (a fragment): nothing loads
                with trio.move_on_at(deadline) as scope:
                    async for _ in events:
                        return
                if scope.cancelled_caught:
                    raise CDPTimeout(f"Page.navigate (waiting for {wait_until})")
                if conn.alive:  # the stream ended because the tab went away
                    raise CDPError("Page.navigate", -32001, GONE_SESSION)
                raise BrowserGone(f"Page.navigate: {conn.close_reason}")
        except BaseException as exc:
            if conn.alive and not isinstance(exc, ToolError):
                with trio.CancelScope(shield=True), trio.move_on_after(1):
                    try:
                        await conn.send("Page.stopLoading", session=sid)
                    except (CDPError, BrowserGone, CDPTimeout):
                        pass
            raise

    async def evaluate(
        self, conn: Connection, sid: str, expression: str, deadline: float
    ) -> dict[str, Any]:
        """``Runtime.evaluate`` by value; a thrown exception is a ``failed`` ToolError."""
        res = await conn.send(
            "Runtime.evaluate",
            {
                "expression": expression,
                "returnByValue": True,
                "awaitPromise": True,
                "userGesture": True,
            },
            session=sid,
            deadline=deadline,
        )
        details = res.get("exceptionDetails")
        if details:
            exc = details.get("exception") or {}
            text = exc.get("description") or details.get("text") or "exception"
            raise ToolError(
                f"the expression threw: {text}",
                code="failed",
                details={
                    "exception": text,
                    "line": details.get("lineNumber"),
                    "column": details.get("columnNumber"),
                },
            )
        result = res.get("result") or {}
        out: dict[str, Any] = {
            "type": result.get("type", "undefined"),
            "value": result.get("value"),
        }
        if "unserializableValue" in result:
            out["value"] = result["unserializableValue"]
            out["unserializable"] = True
        return out

    # elements -----------------------------------------------------------------------------

    async def document_id(self, conn: Connection, sid: str, deadline: float) -> str:
        """The main frame's ``loaderId``: it changes with every new document."""
        tree = await conn.send("Page.getFrameTree", session=sid, deadline=deadline)
        return str(tree["frameTree"]["frame"].get("loaderId", ""))

    async def element(
        self,
        conn: Connection,
        tid: str,
        sid: str,
        ref: str | None,
        selector: str | None,
        deadline: float,
    ) -> int:
        """The backend node id named by a snapshot ``ref`` or a CSS ``selector``."""
        if (ref is None) == (selector is None):
            raise ToolError(
                "give exactly one of ref (from browser.snapshot) or selector",
                code="invalid-input",
                details={"reason": "ref-or-selector"},
            )
        if ref is not None:
            match = REF_RE.match(ref)
            if not match:
                raise ToolError(
                    f"ref {ref!r} is not a snapshot ref (like 'e12')",
                    code="invalid-input",
                    details={"ref": ref, "reason": "bad-ref"},
                )
            node_id = int(match.group(1))
            stale = ToolError(
                f"ref {ref!r} is not on the page any more; take a new browser.snapshot",
                code="invalid-input",
                details={"ref": ref, "reason": "stale-ref"},
            )
            if self.snapshot_doc.get(tid) != await self.document_id(conn, sid, deadline):
                raise stale
            try:
                await conn.send(
                    "DOM.describeNode", {"backendNodeId": node_id}, session=sid, deadline=deadline
                )
            except CDPError:
                raise stale from None
            return node_id
        assert selector is not None
        res = await conn.send(
            "Runtime.evaluate",
            {"expression": f"document.querySelector({_js_string(selector)})"},
            session=sid,
            deadline=deadline,
        )
        obj = res.get("result") or {}
        if res.get("exceptionDetails") or not obj.get("objectId"):
            why = (
                "is not a valid CSS selector" if res.get("exceptionDetails") else "matches nothing"
            )
            raise ToolError(
                f"selector {selector!r} {why}",
                code="invalid-input",
                details={"selector": selector, "reason": "no-match"},
            )
        node = await conn.send(
            "DOM.describeNode", {"objectId": obj["objectId"]}, session=sid, deadline=deadline
        )
        return int(node["node"]["backendNodeId"])

    async def center(
        self, conn: Connection, sid: str, node_id: int, deadline: float
    ) -> tuple[float, float]:
        """Scroll the element into view and return the centre of its first content quad."""
        await conn.send(
            "DOM.scrollIntoViewIfNeeded", {"backendNodeId": node_id}, session=sid, deadline=deadline
        )
        res = await conn.send(
            "DOM.getContentQuads", {"backendNodeId": node_id}, session=sid, deadline=deadline
        )
        quads = res.get("quads") or []
        if not quads:
            raise ToolError(
                "the element has no visible box to click",
                code="failed",
                details={"reason": "not-visible", "backendNodeId": node_id},
            )
        quad = quads[0]
        xs, ys = quad[0::2], quad[1::2]
        return sum(xs) / len(xs), sum(ys) / len(ys)

    async def click(self, conn: Connection, sid: str, x: float, y: float, deadline: float) -> None:
        """A left click at (x, y): move, press, release."""
        for kind, button in (
            ("mouseMoved", "none"),
            ("mousePressed", "left"),
            ("mouseReleased", "left"),
        ):
            await conn.send(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": x, "y": y, "button": button, "clickCount": 1},
                session=sid,
                deadline=deadline,
            )

    async def type_text(
        self, conn: Connection, sid: str, node_id: int, text: str, submit: bool, deadline: float
    ) -> None:
        """Focus the element, insert ``text``, then press Enter when ``submit``."""
        await conn.send("DOM.focus", {"backendNodeId": node_id}, session=sid, deadline=deadline)
        if text:
            await conn.send("Input.insertText", {"text": text}, session=sid, deadline=deadline)
        if submit:
            enter = {"key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13}
            await conn.send(
                "Input.dispatchKeyEvent",
                {"type": "keyDown", "text": "\r", **enter},
                session=sid,
                deadline=deadline,
            )
            await conn.send(
                "Input.dispatchKeyEvent", {"type": "keyUp", **enter}, session=sid, deadline=deadline
            )

    # page content -------------------------------------------------------------------------

    async def snapshot(
        self, conn: Connection, tid: str, sid: str, deadline: float
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Title, url and visible text, plus the interactive elements with their refs."""
        self.snapshot_doc[tid] = await self.document_id(conn, sid, deadline)
        page = await self.evaluate(
            conn,
            sid,
            "({title: document.title, url: location.href,"
            " text: document.body ? document.body.innerText : ''})",
            deadline,
        )
        tree = await conn.send("Accessibility.getFullAXTree", session=sid, deadline=deadline)
        elements: list[dict[str, Any]] = []
        for node in tree.get("nodes", []):
            if node.get("ignored"):
                continue
            role = (node.get("role") or {}).get("value")
            backend = node.get("backendDOMNodeId")
            if role not in INTERACTIVE_ROLES or backend is None:
                continue
            element: dict[str, Any] = {
                "ref": f"e{backend}",
                "role": role,
                "name": str((node.get("name") or {}).get("value", "")),
            }
            value = (node.get("value") or {}).get("value")
            if value not in (None, ""):
                element["value"] = value
            elements.append(element)
        return page["value"] or {}, elements

    async def screenshot(
        self, conn: Connection, sid: str, full_page: bool, deadline: float
    ) -> bytes:
        """``Page.captureScreenshot`` as PNG bytes (the whole page when ``full_page``)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            metrics = await conn.send("Page.getLayoutMetrics", session=sid, deadline=deadline)
            size = metrics.get("cssContentSize") or metrics.get("contentSize") or {}
            width = math.ceil(float(size.get("width", 0))) or 1
            height = math.ceil(float(size.get("height", 0))) or 1
            params["clip"] = {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}
            params["captureBeyondViewport"] = True
        res = await conn.send("Page.captureScreenshot", params, session=sid, deadline=deadline)
        return base64.b64decode(res["data"])


def _js_string(text: str) -> str:
    """``text`` as a JavaScript string literal (JSON is a subset)."""
    import json

    return json.dumps(text)
