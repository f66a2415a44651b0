"""The browser sidecar against real headless Chromium, through the kernel socket of a running
toolhost: open, snapshot refs, click, type + submit, screenshot pixels, evaluate, two tabs, URL
policy, cancellation, and a browser killed mid-call then restarted."""

from __future__ import annotations

import io
import json
import socket
import urllib.request

import trio
from PIL import Image

from tests.browser.conftest import browser_host, wait_effective
from tests.conftest import wait_for

APPROVED = {"granted": True, "by": "test"}


async def evaluate(client, expression, **params):
    return await client.invoke(
        "browser.evaluate", {"expression": expression, **params}, approval=APPROVED
    )


async def test_open_snapshot_click_type_and_submit(app, chromium, pages):
    async with browser_host(app, chromium.endpoint) as client:
        await wait_effective(client, "browser.open", "available")
        env = await client.invoke("browser.open", {"url": pages.url("/")})
        assert env.status == "success", env
        assert env.data["title"] == "Toolhost Test Page" and env.data["url"] == pages.url("/")
        tab = env.data["targetId"]

        env = await client.invoke("browser.snapshot", {})
        assert env.status == "success", env
        snap = env.data
        assert snap["targetId"] == tab and snap["title"] == "Toolhost Test Page"
        assert "not clicked" in snap["text"]
        by_role = {(e["role"], e["name"]): e["ref"] for e in snap["elements"]}
        button = by_role[("button", "Press me")]
        field = by_role[("textbox", "Search words")]
        assert button.startswith("e") and field.startswith("e") and button != field
        assert f"[{button}] button 'Press me'" in env.content

        env = await client.invoke("browser.click", {"ref": button})
        assert env.status == "success", env
        env = await evaluate(client, "document.getElementById('out').textContent")
        assert env.status == "success" and env.data["value"] == "clicked 1"
        # The ref is stable: a second snapshot gives the same one and a second click works.
        again = await client.invoke("browser.snapshot", {"targetId": tab})
        assert button in {e["ref"] for e in again.data["elements"]}
        assert "clicked 1" in again.data["text"]
        env = await client.invoke("browser.click", {"selector": "#go"})
        assert env.status == "success" and env.data["ref"] == button
        env = await evaluate(client, "document.getElementById('out').textContent")
        assert env.data["value"] == "clicked 2"

        env = await client.invoke(
            "browser.type", {"ref": field, "text": "hello toolhost", "submit": True}
        )
        assert env.status == "success", env
        with trio.fail_after(10):
            while "hello toolhost" not in pages.received:
                await trio.sleep(0.02)
        with trio.fail_after(10):
            while (await evaluate(client, "document.title")).data["value"] != "Thanks":
                await trio.sleep(0.02)

        # A ref belongs to the document of the tab's last snapshot: after the form's
        # navigation it is refused until a new snapshot.
        stale = await client.invoke("browser.click", {"ref": button})
        assert stale.status == "failed" and stale.error.code == "invalid-input"
        assert stale.error.details["reason"] == "stale-ref"
        bad = await client.invoke("browser.click", {"selector": "#nothing-here"})
        assert bad.status == "failed" and bad.error.details["reason"] == "no-match"
        both = await client.invoke("browser.click", {})
        assert both.status == "failed" and both.error.code == "invalid-input"


async def test_screenshot_is_a_png_with_the_page_colours(app, chromium, pages):
    async with browser_host(app, chromium.endpoint) as client:
        await wait_effective(client, "browser.open", "available")
        assert (await client.invoke("browser.open", {"url": pages.url("/")})).status == "success"
        env = await client.invoke("browser.screenshot", {"path": "shots/page.png"})
        assert env.status == "success", env
        assert env.data["path"] == "shots/page.png"
        data = (app / "workspace" / "shots" / "page.png").read_bytes()
        assert env.data["bytes"] == len(data)
        image = Image.open(io.BytesIO(data))
        image.load()
        assert image.format == "PNG"
        assert image.size == (env.data["width"], env.data["height"])
        rgb = image.convert("RGB")
        assert rgb.getpixel((50, 50)) == (255, 0, 0)
        assert rgb.getpixel((250, 50)) == (0, 0, 255)
        assert rgb.getpixel((150, 50)) == (255, 255, 255)
        assert not list(app.glob("shots/.page.png.*"))  # no temporary file left behind

        env = await client.invoke("browser.screenshot", {"path": "full.png", "fullPage": True})
        assert env.status == "success", env
        full = Image.open(app / "workspace" / "full.png").convert("RGB")
        assert full.size[1] >= 1550 and full.getpixel((25, 1525)) == (0, 255, 0)

        env = await client.invoke("browser.screenshot", {"path": "../escape.png"})
        assert env.status == "failed" and env.error.code == "invalid-input"
        assert env.error.details["reason"] == "parent-traversal"
        env = await client.invoke("browser.screenshot", {})
        assert env.status == "success" and env.data["path"].startswith("screenshots/")
        assert (app / "workspace" / env.data["path"]).is_file()


async def test_evaluate_needs_approval_returns_values_and_maps_throws(app, chromium, pages):
    async with browser_host(app, chromium.endpoint) as client:
        await wait_effective(client, "browser.evaluate", "available")
        d = client.host.catalog.get("browser.evaluate")
        assert d.stability.sandbox == "approval-required"
        assert (await client.invoke("browser.open", {"url": "about:blank"})).status == "success"
        env = await client.invoke("browser.evaluate", {"expression": "1+1"})
        assert env.status == "unavailable" and env.error.code == "approval-required"
        env = await evaluate(client, "1+1")
        assert env.status == "success" and env.data["value"] == 2 and env.data["type"] == "number"
        env = await evaluate(client, "Promise.resolve({a: [1, 'x']})")
        assert env.data["value"] == {"a": [1, "x"]}
        env = await evaluate(client, "throw new TypeError('nope')")
        assert env.status == "failed" and env.error.code == "failed"
        assert "TypeError: nope" in env.error.message
        assert "TypeError: nope" in env.error.details["exception"]
        env = await evaluate(client, "1/0")
        assert env.data == {
            "targetId": env.data["targetId"],
            "type": "number",
            "value": "Infinity",
            "unserializable": True,
        }


async def test_two_tabs_addressed_by_target_id(app, chromium, pages):
    async with browser_host(app, chromium.endpoint) as client:
        await wait_effective(client, "browser.open", "available")
        first = (await client.invoke("browser.open", {"url": pages.url("/")})).data
        second = (await client.invoke("browser.open", {"url": pages.url("/second")})).data
        assert first["targetId"] != second["targetId"]
        assert second["title"] == "Second Tab"
        env = await evaluate(client, "document.title")  # default: the tab opened last
        assert env.data["value"] == "Second Tab"
        env = await evaluate(client, "document.title", targetId=first["targetId"])
        assert env.data["value"] == "Toolhost Test Page"
        env = await client.invoke(
            "browser.navigate", {"targetId": first["targetId"], "url": pages.url("/second")}
        )
        assert env.status == "success" and env.data["title"] == "Second Tab"
        # Someone closes the first tab behind the sidecar's back (DevTools HTTP /json/close).
        closed = await trio.to_thread.run_sync(
            urllib.request.urlopen, f"{chromium.endpoint}/json/close/{first['targetId']}"
        )
        closed.close()
        with trio.fail_after(10):
            while True:
                env = await client.invoke("browser.snapshot", {"targetId": first["targetId"]})
                if env.status != "success":
                    break
                await trio.sleep(0.05)
        assert env.status == "failed" and env.error.code == "invalid-input", env
        assert env.error.details["reason"] == "unknown-target"
        env = await evaluate(client, "document.title", targetId=second["targetId"])
        assert env.data["value"] == "Second Tab"
        env = await client.invoke("browser.snapshot", {"targetId": "NO-SUCH-TARGET"})
        assert env.status == "failed" and env.error.code == "invalid-input"
        assert env.error.details["reason"] == "unknown-target"


async def test_url_policy(app, project, chromium, pages):
    (project / "local.html").write_text("<html><head><title>Local File</title></head></html>")
    async with browser_host(app, chromium.endpoint) as client:
        await wait_effective(client, "browser.open", "available")
        for url in ["javascript:alert(1)", "chrome://version", "data:text/html,hi", "example.com"]:
            env = await client.invoke("browser.open", {"url": url})
            assert env.status == "failed" and env.error.code == "invalid-input", url
            assert env.error.details["reason"] == "scheme-refused", url
        env = await client.invoke("browser.open", {"url": "file:///etc/passwd"})
        assert env.status == "failed" and env.error.details["reason"] == "file-outside-project"
        env = await client.invoke("browser.open", {"url": (project / "local.html").as_uri()})
        assert env.status == "success" and env.data["title"] == "Local File"
        env = await client.invoke("browser.navigate", {"url": "about:blank"})
        assert env.status == "success" and env.data["url"] == "about:blank"
        closed = socket.socket()
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        closed.close()  # nothing listens there now
        env = await client.invoke("browser.navigate", {"url": f"http://127.0.0.1:{port}/"})
        assert env.status == "failed" and env.error.code == "failed"
        assert "ERR_CONNECTION_REFUSED" in env.error.message


async def test_cancelled_navigate_leaves_the_sidecar_usable(app, chromium, pages):
    pages.slow_started.clear()
    async with browser_host(app, chromium.endpoint) as client:
        await wait_effective(client, "browser.open", "available")
        assert (await client.invoke("browser.open", {"url": pages.url("/")})).status == "success"
        out = {}

        async def navigate():
            out["env"] = await client.invoke(
                "browser.navigate", {"url": pages.url("/slow")}, request_id="nav"
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(navigate)
            with trio.fail_after(10):
                while not pages.slow_started.is_set():
                    await trio.sleep(0.01)
            assert await client.cancel("nav") is True
        assert out["env"].status == "failed" and out["env"].error.code == "cancelled"
        env = await evaluate(client, "1+1")
        assert env.status == "success" and env.data["value"] == 2
        env = await client.invoke("browser.navigate", {"url": pages.url("/second")})
        assert env.status == "success" and env.data["title"] == "Second Tab"

        # A cancelled open closes the tab it had created.
        before = await page_ids(chromium)
        pages.slow_started.clear()
        async with trio.open_nursery() as nursery:

            async def open_slow():
                out["open"] = await client.invoke(
                    "browser.open", {"url": pages.url("/slow")}, request_id="open"
                )

            nursery.start_soon(open_slow)
            with trio.fail_after(10):
                while not pages.slow_started.is_set():
                    await trio.sleep(0.01)
            assert len(await page_ids(chromium)) == len(before) + 1
            assert await client.cancel("open") is True
        assert out["open"].error.code == "cancelled"
        with trio.fail_after(10):
            while await page_ids(chromium) != before:
                await trio.sleep(0.02)
        env = await evaluate(client, "document.title")  # the last tab that did open
        assert env.data["value"] == "Second Tab"


async def page_ids(chromium):
    """The ids of Chromium's page targets, from its own DevTools HTTP endpoint."""

    def fetch():
        with urllib.request.urlopen(f"{chromium.endpoint}/json/list") as answer:
            return json.load(answer)

    return {t["id"] for t in await trio.to_thread.run_sync(fetch) if t["type"] == "page"}


async def test_browser_killed_mid_call_then_restarted(app, own_chromium, pages):
    pages.slow_started.clear()
    probe = {"intervalMs": 100, "timeoutMs": 1000, "failureThreshold": 1}
    async with browser_host(app, own_chromium.endpoint, probe=probe) as client:
        await wait_effective(client, "browser.open", "available")
        pid = client.host.pools["browser"].workers[0].pid
        assert (await client.invoke("browser.open", {"url": pages.url("/")})).status == "success"
        out = {}

        async def navigate():
            out["t0"] = trio.current_time()
            out["env"] = await client.invoke(
                "browser.navigate", {"url": pages.url("/slow")}, timeout_ms=20000
            )
            out["t1"] = trio.current_time()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(navigate)
            with trio.fail_after(10):
                while not pages.slow_started.is_set():
                    await trio.sleep(0.01)
            own_chromium.kill()
        env = out["env"]
        assert env.status == "failed" and env.error.code == "failed", env
        assert env.error.details["reason"] == "browser-gone"
        assert "cdpError" in env.error.details
        assert out["t1"] - out["t0"] < 5  # at once, far inside the 20 s deadline

        await wait_effective(client, "browser.open", "unavailable")
        d = client.host.catalog.get("browser.evaluate")
        assert d.stability.probe == "unavailable"
        reason = next(r for r in d.stability.reasons if r.field == "probe")
        assert "DevTools endpoint unreachable" in reason.message
        assert "--remote-debugging-port" in (reason.hint or "")

        await own_chromium.astart()
        await wait_effective(client, "browser.open", "available")
        env = await client.invoke("browser.open", {"url": pages.url("/second")})
        assert env.status == "success" and env.data["title"] == "Second Tab"
        env = await evaluate(client, "6*7")
        assert env.status == "success" and env.data["value"] == 42
        # Neither toolhost nor the worker was restarted.
        assert client.host.pools["browser"].workers[0].pid == pid


async def test_endpoint_down_from_the_start(app):
    probe = {"intervalMs": 100, "timeoutMs": 1000, "failureThreshold": 1}
    async with browser_host(app, "http://127.0.0.1:9", probe=probe) as client:
        host = client.host
        await wait_for(
            host, lambda: host.catalog.get("browser.snapshot").stability.probe == "unavailable"
        )
        d = host.catalog.get("browser.snapshot")
        assert d.stability.runtime == "ready" and d.stability.effective == "unavailable"
        reason = next(r for r in d.stability.reasons if r.field == "probe")
        assert "http://127.0.0.1:9" in reason.message
        env = await client.invoke("browser.snapshot", {})
        assert env.status == "unavailable"
