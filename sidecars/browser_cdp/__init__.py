"""The ``browser`` sidecar: drive an already-running Chrome/Chromium over the DevTools Protocol.

Run it with ``python -m sidecars.browser_cdp``. It speaks CDP itself (trio-websocket + msgspec,
:mod:`sidecars.browser_cdp.cdp`) to ``config.endpoint`` (default ``http://127.0.0.1:9222``); it
never starts or downloads a browser. Every tool is ``async def`` on the SDK's Trio loop, which
keeps the browser connection and the tabs across calls (:mod:`sidecars.browser_cdp.browser`).

Tools (``targetId`` omitted means the tab this sidecar opened last):
``browser.open {url}`` -> ``{targetId, url, title}``;
``browser.navigate {targetId?, url, waitUntil?}`` -> ``{targetId, url, title}``;
``browser.snapshot {targetId?}`` -> ``{targetId, title, url, text, elements: [{ref, role, name}]}``;
``browser.screenshot {targetId?, path?, fullPage?}`` -> ``{path, width, height, bytes}``;
``browser.click {targetId?, ref | selector}``; ``browser.type {targetId?, ref | selector, text,
submit?}``; ``browser.evaluate {targetId?, expression}`` -> ``{type, value}``.
See ``docs/sidecars/browser.md``.
"""

from __future__ import annotations

import time
from typing import Any, Literal

import msgspec
import trio

from sidecars.browser_cdp.browser import (
    START_HINT,
    Browser,
    call_deadline,
    cdp_errors,
    check_url,
    endpoint_of,
    png_size,
)
from sidecars.sdk import Context, Reply, Sidecar, ToolError
from sidecars.sdk.paths import atomic_output, confine, project_relative
from supervisor.contracts import wire

app = Sidecar("browser", version="1.0.0", concurrency=4)
BROWSER = Browser()
MAX_TEXT = 20000
PROBE_TIMEOUT_S = 0.5


class OpenInput(msgspec.Struct, forbid_unknown_fields=True):
    """Open a new tab."""

    url: str


class NavigateInput(msgspec.Struct, forbid_unknown_fields=True):
    """Load a URL in a tab."""

    url: str
    targetId: str | None = None
    waitUntil: Literal["load", "domcontentloaded"] = "load"


class TargetInput(msgspec.Struct, forbid_unknown_fields=True):
    """Address a tab (default: the one opened last)."""

    targetId: str | None = None


class ScreenshotInput(msgspec.Struct, forbid_unknown_fields=True):
    """Where to write the PNG, and how much of the page."""

    targetId: str | None = None
    path: str | None = None
    fullPage: bool = False


class ClickInput(msgspec.Struct, forbid_unknown_fields=True):
    """An element by snapshot ref (``e12``) or CSS selector."""

    targetId: str | None = None
    ref: str | None = None
    selector: str | None = None


class TypeInput(msgspec.Struct, forbid_unknown_fields=True):
    """Text to type into an element; ``submit`` presses Enter afterwards."""

    text: str
    targetId: str | None = None
    ref: str | None = None
    selector: str | None = None
    submit: bool = False


class EvaluateInput(msgspec.Struct, forbid_unknown_fields=True):
    """A JavaScript expression (promises are awaited)."""

    expression: str
    targetId: str | None = None


async def _title(conn: Any, sid: str, deadline: float) -> tuple[str, str]:
    page = await BROWSER.evaluate(
        conn, sid, "({title: document.title, url: location.href})", deadline
    )
    value = page["value"] or {}
    return str(value.get("title", "")), str(value.get("url", ""))


@app.tool(
    "browser.open",
    description=(
        "Open a new browser tab on a URL (http, https, about, or a file under the project) and"
        " wait for it to load. Returns its targetId, final url and title."
    ),
    permission="network",
    timeout_ms=30000,
)
async def open_tab(args: OpenInput, ctx: Context) -> Reply:
    url = check_url(args.url, ctx.project_dir)
    deadline = call_deadline(ctx)
    endpoint = endpoint_of(ctx.config)
    with cdp_errors(endpoint):
        tid, sid = await BROWSER.open(ctx, url, deadline)
        title, final = await _title(BROWSER.conn, sid, deadline)
    return Reply(data={"targetId": tid, "url": final, "title": title}, content=f"{title} ({final})")


@app.tool(
    "browser.navigate",
    description=(
        "Load a URL in a tab (default: the tab opened last) and wait for the load event, or"
        " for DOMContentLoaded with waitUntil=domcontentloaded."
    ),
    permission="network",
    timeout_ms=30000,
)
async def navigate(args: NavigateInput, ctx: Context) -> Reply:
    url = check_url(args.url, ctx.project_dir)
    deadline = call_deadline(ctx)
    with cdp_errors(endpoint_of(ctx.config)):
        conn, tid, sid = await BROWSER.tab(ctx, args.targetId, deadline)
        await BROWSER.navigate(conn, sid, url, args.waitUntil, deadline)
        title, final = await _title(conn, sid, deadline)
    return Reply(data={"targetId": tid, "url": final, "title": title}, content=f"{title} ({final})")


@app.tool(
    "browser.snapshot",
    description=(
        "The page as text for a model: title, url, visible text, and every interactive element"
        " (button, link, textbox...) with a ref that browser.click and browser.type accept."
    ),
    read_only=True,
    permission="read",
)
async def snapshot(args: TargetInput, ctx: Context) -> Reply:
    deadline = call_deadline(ctx)
    with cdp_errors(endpoint_of(ctx.config)):
        conn, tid, sid = await BROWSER.tab(ctx, args.targetId, deadline)
        page, elements = await BROWSER.snapshot(conn, tid, sid, deadline)
    text = str(page.get("text", ""))
    truncated = len(text) > MAX_TEXT
    text = text[:MAX_TEXT]
    lines = [f"# {page.get('title', '')}", str(page.get("url", "")), "", text]
    if truncated:
        lines.append(f"[... text cut at {MAX_TEXT} characters]")
    lines += ["", "Interactive elements:"]
    lines += [f"[{e['ref']}] {e['role']} {e['name']!r}" for e in elements] or ["(none)"]
    data = {
        "targetId": tid,
        "title": page.get("title", ""),
        "url": page.get("url", ""),
        "text": text,
        "truncated": truncated,
        "elements": elements,
    }
    return Reply(data=data, content="\n".join(lines))


@app.tool(
    "browser.screenshot",
    description=(
        "Capture a tab as PNG, written atomically under the project (default"
        " screenshots/<time>.png); fullPage captures beyond the viewport."
    ),
    permission="write",
    timeout_ms=30000,
)
async def screenshot(args: ScreenshotInput, ctx: Context) -> dict[str, Any]:
    rel = (
        args.path
        or f"screenshots/screenshot-{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 10**9}.png"
    )
    target = confine(ctx.project_dir, rel, must_exist=False, kind="file", label="path")
    deadline = call_deadline(ctx)
    with cdp_errors(endpoint_of(ctx.config)):
        conn, tid, sid = await BROWSER.tab(ctx, args.targetId, deadline)
        png = await BROWSER.screenshot(conn, sid, args.fullPage, deadline)
    width, height = png_size(png)

    def write() -> None:
        with atomic_output(target) as tmp:
            tmp.write_bytes(png)

    await trio.to_thread.run_sync(write)
    return {
        "targetId": tid,
        "path": project_relative(ctx.project_dir, target),
        "width": width,
        "height": height,
        "bytes": len(png),
    }


@app.tool(
    "browser.click",
    description="Click an element (by snapshot ref such as e12, or by CSS selector) in a tab.",
    permission="network",
)
async def click(args: ClickInput, ctx: Context) -> dict[str, Any]:
    deadline = call_deadline(ctx)
    with cdp_errors(endpoint_of(ctx.config)):
        conn, tid, sid = await BROWSER.tab(ctx, args.targetId, deadline)
        node = await BROWSER.element(conn, tid, sid, args.ref, args.selector, deadline)
        x, y = await BROWSER.center(conn, sid, node, deadline)
        await BROWSER.click(conn, sid, x, y, deadline)
    return {"targetId": tid, "ref": f"e{node}", "x": round(x, 1), "y": round(y, 1)}


@app.tool(
    "browser.type",
    description=(
        "Type text into an element (by snapshot ref or CSS selector); submit=true presses Enter"
        " afterwards (submits a form)."
    ),
    permission="network",
)
async def type_text(args: TypeInput, ctx: Context) -> dict[str, Any]:
    deadline = call_deadline(ctx)
    with cdp_errors(endpoint_of(ctx.config)):
        conn, tid, sid = await BROWSER.tab(ctx, args.targetId, deadline)
        node = await BROWSER.element(conn, tid, sid, args.ref, args.selector, deadline)
        await BROWSER.type_text(conn, sid, node, args.text, args.submit, deadline)
    return {"targetId": tid, "ref": f"e{node}", "typed": len(args.text), "submitted": args.submit}


@app.tool(
    "browser.evaluate",
    description=(
        "Evaluate a JavaScript expression in a tab and return its JSON value (promises are"
        " awaited); a thrown exception fails the call with the exception text."
    ),
    permission="execute",
    sandbox="approval-required",
)
async def evaluate(args: EvaluateInput, ctx: Context) -> dict[str, Any]:
    deadline = call_deadline(ctx)
    with cdp_errors(endpoint_of(ctx.config)):
        conn, tid, sid = await BROWSER.tab(ctx, args.targetId, deadline)
        out = await BROWSER.evaluate(conn, sid, args.expression, deadline)
    return {"targetId": tid, **out}


@app.health
async def health(app: Sidecar) -> dict[str, wire.ToolHealth]:
    """Every tool ``unavailable`` while the DevTools endpoint does not answer."""
    try:
        endpoint = endpoint_of(app.config)
    except ToolError as exc:
        reason: str | None = exc.message
    else:
        reason = await BROWSER.probe(endpoint, PROBE_TIMEOUT_S)
    if reason is None:
        return {}
    return {
        name: wire.ToolHealth(status="unavailable", reason=reason, hint=START_HINT)
        for name in app.tools
    }
