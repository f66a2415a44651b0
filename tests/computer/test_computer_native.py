"""computer.native through a running host against a real X server (Xvfb) and a real Tk window:
screenshot pixels, window list and focus, mouse clicks and typed keys through the xdotool
delegate, approval, and the unavailable reasons before any call."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from supervisor.calls.call import InvokeRequest
from supervisor.cli.init import XDO_KEYBOARD, XDO_MOUSE
from supervisor.contracts.rpc import Approval
from tests.computer.conftest import Display, pixel
from tests.conftest import REPO, raw, running_host, wait_available, wait_for

APPROVED = Approval(granted=True, by="test")
MANIFESTS = [str(REPO / "manifests")]
TOOLS = ["screen.screenshot", "computer.window", "computer.mouse", "computer.keyboard"]
COLOUR = (0x33, 0x66, 0xCC)


def computer(display: str, delegates: bool = True) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "command": "python",
        "args": ["-m", "sidecars.computer"],
        "tools": TOOLS,
        "env": {"DISPLAY": display},
        "pool": {"min": 1, "max": 1},
        "probe": {"intervalMs": 200},
    }
    if delegates:
        entry["config"] = {"mouseCommand": XDO_MOUSE, "keyboardCommand": XDO_KEYBOARD}
    return entry


def data(env: Any) -> Any:
    assert env.status == "success", (env.status, env.content, env.error)
    return msgspec.json.decode(env.data)


async def test_screenshot_pixels_show_the_window(app: Path, xdisplay: Display) -> None:
    win = xdisplay.window
    reg = {"computer.native": computer(xdisplay.name)}
    async with running_host(app, reg, manifest_dirs=MANIFESTS) as host:
        await wait_available(host, "screen.screenshot")
        shot = data(
            await host.invoker.invoke(
                InvokeRequest("screen.screenshot", raw({"path": "shots/full.png"}))
            )
        )
        assert shot["path"] == "shots/full.png" and shot["command"] == "import"
        assert (shot["width"], shot["height"]) == (1024, 768)
        gate = host.confiner.gate  # the X server's socket, reached through the Unix socket gate
        assert gate is not None and gate.answered >= 1 and gate.refused == 0  # (abstract: quiet)
        png = app / "workspace" / "shots" / "full.png"
        assert shot["bytes"] == png.stat().st_size
        assert pixel(png, *win.centre) == COLOUR
        assert pixel(png, win.x + 2, win.y + 2) == COLOUR
        assert pixel(png, win.x + win.width + 20, win.y + win.height + 20) != COLOUR
        assert not [
            p for p in (app / "workspace" / "shots").iterdir() if p.name != "full.png"
        ]  # no temp left

        region = {"x": win.x, "y": win.y, "width": win.width, "height": win.height}
        shot = data(
            await host.invoker.invoke(InvokeRequest("screen.screenshot", raw({"region": region})))
        )
        assert (shot["width"], shot["height"]) == (win.width, win.height)
        assert shot["path"].startswith("screenshots/")
        assert pixel(app / "workspace" / shot["path"], 5, 5) == COLOUR

        env = await host.invoker.invoke(
            InvokeRequest("screen.screenshot", raw({"path": "../out.png"}))
        )
        assert env.status == "failed" and env.error.details["reason"] == "parent-traversal"


async def test_window_list_geometry_and_focus(app: Path, xdisplay: Display) -> None:
    win = xdisplay.window
    reg = {"computer.native": computer(xdisplay.name)}
    async with running_host(app, reg, manifest_dirs=MANIFESTS) as host:
        await wait_available(host, "computer.window")
        listed = data(
            await host.invoker.invoke(InvokeRequest("computer.window", raw({"action": "list"})))
        )
        [mine] = [w for w in listed["windows"] if w["name"] == "toolhost-test-window"]
        assert mine["id"] == win.id and listed["command"] == "xdotool"
        assert (mine["x"], mine["y"], mine["width"], mine["height"]) == (
            win.x,
            win.y,
            win.width,
            win.height,
        )
        focused = data(
            await host.invoker.invoke(
                InvokeRequest(
                    "computer.window", raw({"action": "focus", "window": "toolhost-test"})
                )
            )
        )
        assert focused["id"] == win.id and focused["focused"] is True
        focus = int(xdisplay.xdotool("getwindowfocus"))
        assert focus in {win.id, win.frame}, (focus, win)
        geo = data(
            await host.invoker.invoke(
                InvokeRequest("computer.window", raw({"action": "geometry", "window": hex(win.id)}))
            )
        )
        assert geo["name"] == "toolhost-test-window" and geo["width"] == win.width
        # What list answers, focus and geometry accept as it came (a number).
        assert isinstance(mine["id"], int)
        for action in ("focus", "geometry"):
            got = data(
                await host.invoker.invoke(
                    InvokeRequest("computer.window", raw({"action": action, "window": mine["id"]}))
                )
            )
            assert got["id"] == mine["id"] and got["name"] == "toolhost-test-window"
        env = await host.invoker.invoke(
            InvokeRequest("computer.window", raw({"action": "focus", "window": "nope"}))
        )
        assert env.status == "failed" and env.error.details["reason"] == "unknown-window"


async def test_mouse_and_keyboard_reach_the_window(app: Path, xdisplay: Display) -> None:
    win = xdisplay.window
    cx, cy = win.centre
    reg = {"computer.native": computer(xdisplay.name)}
    async with running_host(app, reg, manifest_dirs=MANIFESTS) as host:
        await wait_available(host, *TOOLS)
        click = {"action": "click", "x": cx, "y": cy}
        # Control tools default to approval-required: without it nothing happens.
        env = await host.invoker.invoke(InvokeRequest("computer.mouse", raw(click)))
        assert env.status == "unavailable" and env.error.code == "approval-required"
        assert win.events() == []

        got = data(
            await host.invoker.invoke(
                InvokeRequest("computer.mouse", raw(click), approval=APPROVED)
            )
        )
        assert got["delegate"].startswith("python")
        assert win.wait_event("click") == [f"click {cx} {cy} 1"]
        loc = xdisplay.xdotool("getmouselocation", "--shell")
        assert f"X={cx}\n" in loc and f"Y={cy}\n" in loc

        data(
            await host.invoker.invoke(
                InvokeRequest(
                    "computer.mouse", raw({"action": "move", "x": 10, "y": 20}), approval=APPROVED
                )
            )
        )
        loc = xdisplay.xdotool("getmouselocation", "--shell")
        assert "X=10\n" in loc and "Y=20\n" in loc

        data(
            await host.invoker.invoke(
                InvokeRequest("computer.window", raw({"action": "focus", "window": str(win.id)}))
            )
        )
        typed = {"action": "type", "text": "hi -x"}
        data(
            await host.invoker.invoke(
                InvokeRequest("computer.keyboard", raw(typed), approval=APPROVED)
            )
        )
        data(
            await host.invoker.invoke(
                InvokeRequest(
                    "computer.keyboard", raw({"action": "key", "keys": "Return"}), approval=APPROVED
                )
            )
        )
        assert win.wait_event("key Return")
        keys = [e.split()[1] for e in win.events() if e.startswith("key")]
        assert keys == ["h", "i", "space", "minus", "x", "Return"]


async def test_control_tools_unavailable_without_delegates(app: Path, xdisplay: Display) -> None:
    reg = {"computer.native": computer(xdisplay.name, delegates=False)}
    async with running_host(app, reg, manifest_dirs=MANIFESTS) as host:
        await wait_available(host, "screen.screenshot", "computer.window")

        def probed() -> bool:
            return all(
                host.catalog.get(t).stability.probe == "unavailable"
                for t in ("computer.mouse", "computer.keyboard")
            )

        await wait_for(host, probed)
        reasons = host.catalog.get("computer.mouse").stability.reasons
        assert any("config.mouseCommand is not set" in r.message for r in reasons), reasons
        assert any("init --add computer" in r.message for r in reasons), reasons
        env = await host.invoker.invoke(
            InvokeRequest(
                "computer.mouse", raw({"action": "click", "x": 1, "y": 1}), approval=APPROVED
            )
        )
        assert env.status == "unavailable"
        assert xdisplay.window.events() == []


async def test_no_display_makes_screen_tools_unavailable(app: Path) -> None:
    entry = computer("", delegates=False)
    entry.pop("env")
    async with running_host(app, {"computer.native": entry}, manifest_dirs=MANIFESTS) as host:

        def probed() -> bool:
            d = host.catalog.get("screen.screenshot")
            return d is not None and d.stability.probe == "unavailable"

        await wait_for(host, probed)
        reasons = host.catalog.get("screen.screenshot").stability.reasons
        assert any("no display" in r.message for r in reasons), reasons


async def test_window_list_on_an_empty_desktop_is_empty(app: Path, empty_display: str) -> None:
    reg = {"computer.native": computer(empty_display)}
    async with running_host(app, reg, manifest_dirs=MANIFESTS) as host:
        await wait_available(host, "computer.window")
        listed = data(
            await host.invoker.invoke(InvokeRequest("computer.window", raw({"action": "list"})))
        )
        assert listed == {"windows": [], "command": "xdotool"}
        env = await host.invoker.invoke(
            InvokeRequest("computer.window", raw({"action": "focus", "window": "any"}))
        )
        assert env.status == "failed" and env.error.details["reason"] == "unknown-window", env


async def test_default_screenshot_path_works_when_project_dir_is_the_app_root(
    app: Path, xdisplay: Display
) -> None:
    """The default path is an ordinary folder, not the host-private ``.toolhost/`` (issue 30);
    confined, the host makes ``screenshots/`` at load (nothing new can be made at the top of a
    project that is the app root: ``confine.folders``)."""
    reg = {"computer.native": computer(xdisplay.name)}
    host_cfg = {"projectDir": ".", "confinement": "best-effort"}
    async with running_host(app, reg, manifest_dirs=MANIFESTS, host=host_cfg) as host:
        await wait_available(host, "screen.screenshot")
        shot = data(await host.invoker.invoke(InvokeRequest("screen.screenshot", raw({}))))
        assert (app / shot["path"]).is_file()
