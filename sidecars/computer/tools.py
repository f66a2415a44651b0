"""The ``computer.native`` sidecar's tools: screenshot, windows, mouse and keyboard."""

from __future__ import annotations

import re
import time
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from sidecars.computer import control, platform
from sidecars.sdk import Context, Reply, Sidecar, ToolError
from sidecars.sdk.paths import atomic_output, confine, project_relative
from supervisor.contracts import wire

app = Sidecar("computer.native", version="1.0.0", concurrency=2)
"""The sidecar; ``app.run()`` serves it (see ``__main__``)."""

SHOTS_DIR = "screenshots"
"""Default folder of screenshots under projectDir (an ordinary folder: ``.toolhost/`` is the
host's own and host-private when projectDir is the app root)."""
NonNegative = Annotated[int, Meta(ge=0)]
Positive = Annotated[int, Meta(ge=1)]


def _deadline(ctx: Context) -> float:
    budget = ctx.deadline_ms / 1000.0 if ctx.deadline_ms else 10.0
    return ctx.started + max(0.1, budget - min(0.3, budget * 0.1))


# screen.screenshot -------------------------------------------------------------------------


class RegionInput(msgspec.Struct, forbid_unknown_fields=True):
    """A rectangle of the screen in pixels."""

    x: Annotated[NonNegative, Meta(description="Left edge.")]
    y: Annotated[NonNegative, Meta(description="Top edge.")]
    width: Annotated[Positive, Meta(description="Width.")]
    height: Annotated[Positive, Meta(description="Height.")]


class ScreenshotInput(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    """Where to write the screenshot and what to capture."""

    path: Annotated[
        str | None,
        Meta(description="PNG path under the project; default screenshots/<time>.png."),
    ] = None
    region: Annotated[
        RegionInput | None,
        Meta(description="Capture only this rectangle (whole screen if omitted)."),
    ] = None


class ScreenshotOutput(msgspec.Struct):
    """The PNG written."""

    path: Annotated[str, Meta(description="Project-relative path of the PNG.")]
    width: int
    height: int
    bytes: int
    command: Annotated[str, Meta(description="The platform command that captured it.")]


def screenshot(args: ScreenshotInput, ctx: Context) -> ScreenshotOutput:
    """Capture the screen (or a region) to a PNG under the project."""
    problem = _screenshot_problem(ctx.config)
    if problem is not None:
        raise ToolError(
            f"screen.screenshot is unavailable: {problem}",
            code="unavailable",
            details={"reason": "no-platform-command"},
        )
    command = platform.find(platform.SCREENSHOT_COMMANDS, ctx.config)
    assert command is not None
    region = None
    if args.region is not None:
        r = args.region
        region = platform.Region(r.x, r.y, r.width, r.height)
        if command not in platform.REGION_CAPABLE:
            raise ToolError(
                f"{command} cannot capture a region; install ImageMagick (import) or scrot",
                code="unsupported",
                details={"reason": "region-unsupported", "command": command},
            )
    rel = args.path or f"{SHOTS_DIR}/{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 10**9}.png"
    if not rel.lower().endswith(".png"):
        raise ToolError(
            f"path {rel!r} must end in .png",
            code="invalid-input",
            details={"path": rel, "reason": "not-png"},
        )
    target = confine(ctx.project_dir, rel, must_exist=False, kind="file", label="path")
    with atomic_output(target, suffix=".png") as tmp:
        platform.run(
            platform.screenshot_argv(command, tmp, region),
            ctx.config,
            _deadline(ctx) - time.monotonic(),
            "screen.screenshot",
        )
        width, height = platform.png_size(tmp)
        size = tmp.stat().st_size
    return ScreenshotOutput(
        path=project_relative(ctx.project_dir, target),
        width=width,
        height=height,
        bytes=size,
        command=command,
    )


# computer.window ---------------------------------------------------------------------------


class WindowInput(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    """A window action."""

    action: Annotated[
        Literal["list", "focus", "geometry"],
        Meta(description="list visible windows, or focus / geometry of one."),
    ]
    window: Annotated[
        NonNegative | str | None,
        Meta(
            description="focus/geometry: a window id as list returns it (a number), the same id "
            "as text (decimal or 0x hex), or a title substring."
        ),
    ] = None


def _pick(command: str, selector: int | str | None, ctx: Context, deadline: float) -> int:
    if isinstance(selector, int):
        return selector  # an id exactly as `list` answers it
    if not selector:
        raise ToolError(
            "this action needs `window` (an id or a title substring)",
            code="invalid-input",
            details={"reason": "no-window"},
        )
    wid = platform.window_id(selector)
    if wid is not None:
        return wid
    matches = [
        w for w in platform.list_windows(command, ctx.config, deadline) if selector in w["name"]
    ]
    exact = [w for w in matches if w["name"] == selector]
    if len(exact) == 1 or len(matches) == 1:
        return int((exact or matches)[0]["id"])
    if not matches:
        raise ToolError(
            f"no visible window titled like {selector!r}",
            code="failed",
            details={"reason": "unknown-window", "window": selector},
        )
    raise ToolError(
        f"{len(matches)} windows match {selector!r}; give an id",
        code="invalid-input",
        details={"reason": "ambiguous-window", "ids": [w["id"] for w in matches]},
    )


def window(args: WindowInput, ctx: Context) -> Reply:
    """List windows, or focus / describe one."""
    problem = platform.display_problem(ctx.config)
    command = platform.find(platform.WINDOW_COMMANDS, ctx.config)
    if problem is None and command is None:
        problem = f"no window command found: {platform.WINDOW_HINT}"
    if problem is not None:
        raise ToolError(
            f"computer.window is unavailable: {problem}",
            code="unavailable",
            details={"reason": "no-platform-command"},
        )
    assert command is not None
    deadline = _deadline(ctx)
    if args.action == "list":
        windows = platform.list_windows(command, ctx.config, deadline)
        names = ", ".join(repr(w["name"]) for w in windows[:20])
        return Reply(
            data={"windows": windows, "command": command},
            content=f"{len(windows)} window(s): {names}",
        )
    wid = _pick(command, args.window, ctx, deadline)
    if args.action == "focus":
        platform.focus(command, wid, ctx.config, deadline)
    facts = platform.geometry(command, wid, ctx.config, deadline)
    return Reply(
        data={**facts, "command": command, "focused": args.action == "focus"},
        content=f"window {wid:#x} {facts['name']!r} at {facts['x']},{facts['y']} "
        f"{facts['width']}x{facts['height']}",
    )


# computer.mouse / computer.keyboard ---------------------------------------------------------


class MouseInput(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    """A pointer action at screen coordinates."""

    action: Annotated[
        Literal["move", "click", "double_click", "down", "up", "scroll", "drag", "position"],
        Meta(description="What to do at (x, y); position reads the pointer (no x, y)."),
    ]
    x: Annotated[NonNegative | None, Meta(description="Screen x in pixels.")] = None
    y: Annotated[NonNegative | None, Meta(description="Screen y in pixels.")] = None
    button: Annotated[
        Literal["left", "middle", "right"] | None, Meta(description="Button (left).")
    ] = None
    to_x: Annotated[NonNegative | None, Meta(description="drag: end x.")] = None
    to_y: Annotated[NonNegative | None, Meta(description="drag: end y.")] = None
    direction: Annotated[
        Literal["up", "down", "left", "right"] | None, Meta(description="scroll direction (down).")
    ] = None
    amount: Annotated[
        Annotated[int, Meta(ge=1, le=100)] | None, Meta(description="scroll clicks (1).")
    ] = None


def mouse(args: MouseInput, ctx: Context) -> Reply:
    """Run one pointer action through ``config.mouseCommand``."""
    if args.action != "position" and (args.x is None or args.y is None):
        raise ToolError(
            f"{args.action} needs x and y", code="invalid-input", details={"reason": "needs-xy"}
        )
    x, y = args.x or 0, args.y or 0
    if args.action == "drag" and (args.to_x is None or args.to_y is None):
        raise ToolError(
            "drag needs toX and toY", code="invalid-input", details={"reason": "drag-needs-end"}
        )
    values = {
        "action": args.action,
        "x": str(x),
        "y": str(y),
        "button": args.button or "left",
        "toX": str(args.to_x if args.to_x is not None else x),
        "toY": str(args.to_y if args.to_y is not None else y),
        "direction": args.direction or "down",
        "amount": str(args.amount or 1),
    }
    facts = control.run_delegate(
        "computer.mouse",
        "mouseCommand",
        control.MOUSE_FIELDS,
        values,
        ctx.config,
        ctx.project_dir,
        _deadline(ctx),
    )
    if args.action == "position":
        stdout = facts.pop("stdout")
        numbers = [int(n) for n in re.findall(r"-?\d+", stdout)[:2]]
        if len(numbers) != 2:
            raise ToolError(
                f"computer.mouse: the delegate answered no position: {stdout.strip()[:200]!r}",
                code="failed",
                details={"reason": "delegate-output", "stdout": stdout[-2000:]},
            )
        x, y = numbers
    facts.pop("stdout", None)
    data = {**values, "x": x, "y": y, **facts}
    return Reply(data=data, content=f"mouse {args.action} at {x},{y}")


class KeyboardInput(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    """Text to type or keys to press."""

    action: Annotated[Literal["type", "key"], Meta(description="type text, or press keys.")]
    text: Annotated[str | None, Meta(description="type: the text.")] = None
    keys: Annotated[
        str | None,
        Meta(description='key: key names, space separated; chords with "+" ("ctrl+s Return").'),
    ] = None


def keyboard(args: KeyboardInput, ctx: Context) -> Reply:
    """Type text or press keys through ``config.keyboardCommand``."""
    if args.action == "type" and not args.text:
        raise ToolError("type needs text", code="invalid-input", details={"reason": "no-text"})
    if args.action == "key" and not (args.keys or "").strip():
        raise ToolError("key needs keys", code="invalid-input", details={"reason": "no-keys"})
    if "\x00" in (args.text or "") + (args.keys or ""):
        raise ToolError(
            "text contains a NUL byte", code="invalid-input", details={"reason": "nul-byte"}
        )
    values = {"action": args.action, "text": args.text or "", "keys": args.keys or ""}
    facts = control.run_delegate(
        "computer.keyboard",
        "keyboardCommand",
        control.KEYBOARD_FIELDS,
        values,
        ctx.config,
        ctx.project_dir,
        _deadline(ctx),
    )
    facts.pop("stdout", None)
    shown = f"{len(args.text or '')} character(s)" if args.action == "type" else args.keys
    return Reply(data={**values, **facts}, content=f"keyboard {args.action}: {shown}")


# health ------------------------------------------------------------------------------------


def _screenshot_problem(config: dict[str, Any]) -> str | None:
    problem = platform.display_problem(config)
    if problem is None and platform.find(platform.SCREENSHOT_COMMANDS, config) is None:
        problem = f"no screenshot command found: {platform.SCREENSHOT_HINT}"
    return problem


@app.health
def _health(sidecar: Sidecar) -> dict[str, wire.ToolHealth]:
    """``pong``: each tool's platform command or delegate, or why it is unavailable."""
    config, cwd = sidecar.config, sidecar.project_dir
    out: dict[str, wire.ToolHealth] = {}
    problem = _screenshot_problem(config)
    shot = platform.find(platform.SCREENSHOT_COMMANDS, config)
    out["screen.screenshot"] = (
        wire.ToolHealth(status="unavailable", reason=problem)
        if problem
        else wire.ToolHealth(status="healthy", reason=f"uses {shot}")
    )
    win = platform.find(platform.WINDOW_COMMANDS, config)
    problem = platform.display_problem(config) or (
        None if win else f"no window command found: {platform.WINDOW_HINT}"
    )
    out["computer.window"] = (
        wire.ToolHealth(status="unavailable", reason=problem)
        if problem
        else wire.ToolHealth(status="healthy", reason=f"uses {win}")
    )
    for tool, key, fields in (
        ("computer.mouse", "mouseCommand", control.MOUSE_FIELDS),
        ("computer.keyboard", "keyboardCommand", control.KEYBOARD_FIELDS),
    ):
        problem = control.template_problem(config, key, fields, cwd)
        out[tool] = (
            wire.ToolHealth(status="unavailable", reason=problem)
            if problem
            else wire.ToolHealth(status="healthy", reason=f"uses config.{key}")
        )
    return out


app.tool(
    "screen.screenshot",
    description=(
        "Capture the screen (or a region) to a PNG under the project with the platform's "
        "screenshot command; returns its path, width, height and size."
    ),
    permission="computer",
)(screenshot)
app.tool(
    "computer.window",
    description=(
        "List the visible windows with their ids, titles and geometry, or focus one / get its "
        "geometry by id or title."
    ),
    permission="computer",
)(window)
app.tool(
    "computer.mouse",
    description=(
        "Move, click, double-click, press, release, scroll or drag the mouse at screen "
        "coordinates, through the configured delegate (config.mouseCommand)."
    ),
    permission="computer",
    sandbox="approval-required",
)(mouse)
app.tool(
    "computer.keyboard",
    description=(
        "Type text or press keys (xdotool key names, chords with '+') in the focused window, "
        "through the configured delegate (config.keyboardCommand)."
    ),
    permission="computer",
    sandbox="approval-required",
)(keyboard)
