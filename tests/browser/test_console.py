"""The web console (docs/console.md) in real headless Chromium, driven over CDP, against a running
toolhost with real sidecar processes: load with the token and no console errors, sidecars and
tools with their states, a SIGKILLed worker shown restarting then back with a new pid without a
reload, an unavailable sidecar's reasons and hints, Restart changing the pid, an operator
approval, a wrong token, a foreign Origin, the phone layout, and the screenshot for the docs."""

from __future__ import annotations

import base64
import functools
import json
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from trio_websocket import HandshakeError, open_websocket_url

from sidecars.browser_cdp.cdp import Connection, browser_socket_url, http_get_json
from supervisor.calls.approvals import token_path
from supervisor.calls.call import InvokeRequest
from supervisor.private_files import read_token
from tests.conftest import REPO, echo, ready_pids, running_host, wait_available, wait_for
from tests.kernel import served

TEST_LIMIT_S = float(os.environ.get("TOOLHOST_CONSOLE_TEST_LIMIT", "120"))
DOCS_SHOT = REPO / "docs" / "images" / "console.png"


class Tab:
    """One page target over a flattened CDP session, with the errors it logged."""

    def __init__(self, conn: Connection, session: str) -> None:
        self.conn = conn
        self.session = session
        self.errors: list[str] = []
        self.requests: list[str] = []

    async def send(self, method: str, params: dict[str, Any] | None = None) -> Any:
        return await self.conn.send(
            method, params, session=self.session, deadline=trio.current_time() + 20
        )

    async def eval(self, expression: str) -> Any:
        r = await self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in r:
            raise AssertionError(f"{expression!r} threw: {r['exceptionDetails']}")
        return r["result"].get("value")

    async def wait(self, expression: str, timeout: float = 15, what: str = "") -> Any:
        """Poll ``expression`` in the page until it is truthy; return its value."""
        try:
            with trio.fail_after(timeout):
                while True:
                    value = await self.eval(expression)
                    if value:
                        return value
                    await trio.sleep(0.05)
        except trio.TooSlowError:
            body = await self.eval("document.body.innerText.slice(0, 3000)")
            raise AssertionError(
                f"timed out waiting for {what or expression}; page:\n{body}"
            ) from None

    async def goto(self, url: str) -> None:
        await self.send("Page.navigate", {"url": url})
        await self.wait(
            f"location.href.startsWith({json.dumps(url)}) && document.readyState === 'complete'"
        )

    async def viewport(self, width: int, height: int) -> None:
        await self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600},
        )

    async def click(self, selector: str) -> None:
        """A real mouse click in the middle of the element (scrolled into view first)."""
        box = await self.wait(
            f"""(() => {{ const e = document.querySelector({json.dumps(selector)});
                if (!e) return null; e.scrollIntoView({{block: 'center'}});
                const r = e.getBoundingClientRect();
                return r.width ? [r.x + r.width / 2, r.y + r.height / 2] : null; }})()""",
            what=selector,
        )
        for kind in ("mousePressed", "mouseReleased"):
            await self.send(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": box[0], "y": box[1], "button": "left", "clickCount": 1},
            )

    async def type_into(self, selector: str, text: str) -> None:
        await self.eval(f"document.querySelector({json.dumps(selector)}).focus()")
        await self.send("Input.insertText", {"text": text})


async def _collect(tab: Tab, conn: Connection) -> None:
    with conn.subscribe(
        tab.session,
        "Runtime.exceptionThrown",
        "Runtime.consoleAPICalled",
        "Log.entryAdded",
        "Network.requestWillBeSent",
        "Network.webSocketCreated",
        size=4096,
    ) as events:
        async for msg in events:
            method, p = msg["method"], msg.get("params", {})
            if method == "Runtime.exceptionThrown":
                tab.errors.append(json.dumps(p.get("exceptionDetails"))[:500])
            elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                tab.errors.append(json.dumps(p.get("args"))[:500])
            elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                tab.errors.append(p["entry"].get("text", "")[:500])
            elif method == "Network.requestWillBeSent":
                tab.requests.append(p["request"]["url"])
            elif method == "Network.webSocketCreated":
                tab.requests.append(p["url"])


@asynccontextmanager
async def open_tab(endpoint: str) -> AsyncIterator[Tab]:
    async with trio.open_nursery() as nursery:
        version = await http_get_json(endpoint, "/json/version", within=10)
        conn = await Connection.open(nursery, browser_socket_url(endpoint, version), within=10)
        target = await conn.send("Target.createTarget", {"url": "about:blank"})
        attached = await conn.send(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
        )
        tab = Tab(conn, attached["sessionId"])
        nursery.start_soon(_collect, tab, conn)
        for domain in ("Page", "Runtime", "Log", "Network"):
            await tab.send(f"{domain}.enable")
        await tab.viewport(1280, 800)
        try:
            yield tab
        finally:
            with trio.move_on_after(5):
                await tab.send("Page.navigate", {"url": "about:blank"})  # closes the page's sockets
                await conn.send("Target.closeTarget", {"targetId": target["targetId"]})
            await conn.aclose()
            nursery.cancel_scope.cancel()


async def sign_in(tab: Tab, base: str, token: str) -> None:
    await tab.goto(base + "/")
    await tab.wait("!document.getElementById('login').hidden", what="the login form")
    await tab.type_into("#token", token)
    await tab.click("#connect")


def broken_entry() -> dict[str, Any]:
    """A sidecar whose command does not exist: its tool stays listed, unavailable, with hints."""
    return {"command": "./bin/not-installed", "tools": ["ghost.run"]}


SIDE_STATE = "document.querySelector('.sidecar[data-sidecar=\"echo\"]')"


def worker_pids(sidecar: str) -> str:
    return (
        f'Array.from(document.querySelectorAll(\'tr[data-sidecar="{sidecar}"][data-state="ready"]\'))'
        ".map(r => Number(r.dataset.pid))"
    )


def limited(test: Any) -> Any:
    """A hard limit on the whole test (the browser and the host included)."""

    @functools.wraps(test)
    async def run(*args: Any, **kwargs: Any) -> None:
        with trio.fail_after(TEST_LIMIT_S):
            await test(*args, **kwargs)

    return run


@limited
async def test_console_shows_the_host_live_and_acts(app, chromium):
    reg = {
        "echo": echo(tools=["echo.say", "echo.sleep"], sandbox={"echo.sleep": "approval-required"}),
        "ghost": broken_entry(),
    }
    async with (
        running_host(app, reg, host={"approvalSource": "operator"}) as host,
        served(host, app) as srv,
        open_tab(chromium.endpoint) as tab,
    ):
        await wait_available(host, "echo.say")
        base = f"http://127.0.0.1:{srv.ws_port}"
        await sign_in(tab, base, srv.token)
        await tab.wait("!document.getElementById('app').hidden", what="the console")
        assert await tab.eval("sessionStorage.getItem('toolhost.token')") == srv.token
        assert srv.token not in await tab.eval("location.href + document.cookie")

        # Sidecars with their workers, tools with their states.
        (pid,) = ready_pids(host, "echo")
        assert await tab.wait(f"{worker_pids('echo')}.includes({pid})", what="echo's worker")
        await tab.wait("!!document.querySelector('tr[data-tool=\"echo.say\"]')")
        states = await tab.eval(
            "Object.fromEntries(Array.from(document.querySelectorAll('tr[data-tool]'))"
            ".map(r => [r.dataset.tool, r.dataset.effective]))"
        )
        assert states == {
            "echo.say": "available",
            "echo.sleep": "available",
            "ghost.run": "unavailable",
        }
        assert await tab.eval("document.getElementById('health-status').textContent") in (
            "ok",
            "degraded",
        )

        # The unavailable sidecar's tool says why and what to do, in words.
        reasons = await tab.eval(
            "document.querySelector('tr[data-tool=\"ghost.run\"] .reasons').innerText"
        )
        ghost = host.catalog.get("ghost.run").stability.reasons
        assert ghost and ghost[0].message in reasons and "What to do: " + ghost[0].hint in reasons

        # The filter box.
        await tab.type_into("#filter", "ghost")
        await tab.wait("document.querySelectorAll('tr[data-tool]').length === 1")
        await tab.eval(
            "const f = document.getElementById('filter'); f.value = '';"
            "f.dispatchEvent(new Event('input'))"
        )

        # Calls show in the latency chart (from call.ended events).
        for i in range(3):
            env = await host.invoker.invoke(InvokeRequest("echo.say", _raw({"text": f"hi {i}"})))
            assert env.status == "success"
        await tab.wait(
            "(document.querySelector('tr[data-tool=\"echo.say\"] svg') || {}).getAttribute"
            "&& document.querySelector('tr[data-tool=\"echo.say\"] svg')"
            ".getAttribute('aria-label').includes('3 calls')",
            what="the chart of echo.say",
        )

        # SIGKILL the worker: shown restarting, then back with a new pid, without a reload.
        await tab.eval(
            "window.seen = [];"
            f"new MutationObserver(() => {{ const s = {SIDE_STATE};"
            " if (s) window.seen.push(s.dataset.state); })"
            ".observe(document.getElementById('sidecars'),"
            " {subtree: true, childList: true, attributes: true})"
        )
        killed_at = trio.current_time()
        os.kill(pid, signal.SIGKILL)
        await tab.wait(f"{worker_pids('echo')}.some(p => p && p !== {pid})", timeout=15)
        back_after = trio.current_time() - killed_at
        assert back_after < 5, back_after  # the issue asks 2 s; a loaded CI gets some slack
        assert "restarting" in await tab.eval("window.seen")
        assert await tab.eval(f"!{worker_pids('echo')}.includes({pid})")
        activity = await tab.eval("document.getElementById('activity').innerText")
        assert activity.count(f"worker {pid} of echo exited") == 1, activity
        assert await tab.eval("window.seen !== undefined")  # same document: no reload happened

        # Restart: confirmed in a dialog, answered, and the pid changes.
        (pid2,) = await wait_for(host, lambda: ready_pids(host, "echo") or None)
        await tab.wait(f"{worker_pids('echo')}.includes({pid2})")
        await tab.click('button[data-restart="echo"]')
        await tab.wait("document.getElementById('confirm').open", what="the confirm dialog")
        assert "Restart echo?" in await tab.eval(
            "document.getElementById('confirm-text').textContent"
        )
        await tab.click("#confirm-ok")
        await tab.wait(
            f"document.getElementById('notice').textContent.includes('replaced worker pid {pid2}')",
            what="the restart answer",
        )
        await tab.wait(f"{worker_pids('echo')}.some(p => p && p !== {pid2})", timeout=15)

        # A call waiting for an operator: listed, approved in the page, then it finishes.
        operator = read_token(token_path(str(srv.sock)))
        answer: dict[str, Any] = {}

        async def call() -> None:
            answer["env"] = await host.invoker.invoke(
                InvokeRequest("echo.sleep", _raw({"seconds": 0.01}), timeout_ms=60000)
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            call_id = await tab.wait(
                "(document.querySelector('[data-approval]') || {dataset: {}}).dataset.approval",
                what="the waiting call",
            )
            assert "echo.sleep" in await tab.eval("document.getElementById('approvals').innerText")
            await tab.type_into("#op-token", operator)
            await tab.click(f'button[data-approve="{call_id}"]')
            await tab.wait("document.getElementById('confirm').open")
            await tab.click("#confirm-ok")
            await tab.wait(
                "document.getElementById('notice').textContent.startsWith('Approved echo.sleep')"
            )
        assert answer["env"].status == "success", answer["env"]
        await tab.wait("!document.querySelector('[data-approval]')", what="the approval gone")

        # Phone width: no horizontal scroll.
        await tab.viewport(390, 844)
        await tab.wait("window.innerWidth === 390")
        width = await tab.eval("[document.documentElement.scrollWidth, window.innerWidth]")
        assert width[0] <= width[1], width

        # The screenshot for docs/console.md (at 1280x800).
        await tab.viewport(1280, 800)
        await tab.eval("window.scrollTo(0, 0)")
        shot = await tab.send("Page.captureScreenshot", {"format": "png"})
        png = base64.b64decode(shot["data"])
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
        if os.environ.get("TOOLHOST_CONSOLE_SCREENSHOT"):
            DOCS_SHOT.parent.mkdir(parents=True, exist_ok=True)
            DOCS_SHOT.write_bytes(png)

        # No console errors, and no request to anywhere but the gateway.
        assert tab.errors == [], tab.errors
        origins = {u.split("/")[2] for u in tab.requests if not u.startswith(("data:", "about:"))}
        assert origins == {f"127.0.0.1:{srv.ws_port}"}, tab.requests


@limited
async def test_a_wrong_token_is_refused_and_shows_nothing(app, chromium):
    async with (
        running_host(app, {"echo": echo(tools=["echo.say"])}) as host,
        served(host, app) as srv,
        open_tab(chromium.endpoint) as tab,
    ):
        await wait_available(host, "echo.say")
        await sign_in(tab, f"http://127.0.0.1:{srv.ws_port}", "not-the-token")
        message = await tab.wait(
            "document.getElementById('login-error').textContent", what="the refusal"
        )
        assert "refused this token" in message
        assert await tab.eval("document.getElementById('app').hidden")
        text = await tab.eval("document.body.innerText")
        assert "echo.say" not in text and "Sidecars" not in text
        assert await tab.eval("sessionStorage.getItem('toolhost.token')") is None


@limited
async def test_a_foreign_origin_is_refused(app, chromium, pages):
    async with (
        running_host(app, {"echo": echo(tools=["echo.say"])}) as host,
        served(host, app) as srv,
        open_tab(chromium.endpoint) as tab,
    ):
        await wait_available(host, "echo.say")
        gateway = f"ws://127.0.0.1:{srv.ws_port}/ws"
        probe = (
            "new Promise(r => { const ws = new WebSocket("
            f"{json.dumps(gateway)},"
            f" ['toolhost.v1', 'toolhost.bearer.' + {json.dumps(srv.token)}]);"
            "ws.onopen = () => { ws.close(); r('open'); }; ws.onerror = () => r('refused'); })"
        )
        # From another origin (a page served elsewhere), even with the right token: refused.
        await tab.goto(pages.url("/"))
        assert await tab.eval(probe) == "refused"
        # From the console's own origin the same handshake is accepted.
        await tab.goto(f"http://127.0.0.1:{srv.ws_port}/")
        assert await tab.eval(probe) == "open"
        # And without a browser: a foreign Origin header is refused with 403.
        with pytest.raises(HandshakeError) as refused:
            async with open_websocket_url(
                gateway,
                extra_headers=[
                    (b"Authorization", f"Bearer {srv.token}".encode()),
                    (b"Origin", b"http://evil.example"),
                ],
            ):
                pass
        assert getattr(refused.value, "status_code", None) == 403


def _raw(obj: Any) -> Any:
    import msgspec

    return msgspec.Raw(msgspec.json.encode(obj))
