"""The ``computer.use`` facade: Anthropic-style computer actions run through the host.

# Strategy: every step is a child call of the host (``ctx.invoke``, PROTOCOL 3.5) to one of the
# atomic tools of ``computer.native`` - never a private channel - so each step passes the same
# visibility, sandbox, approval, quota and audit gates as a kernel's call and is logged with
# ``via: computer.use#<call>``. The manifest ``requires`` the atomic tools, so the facade is
# visible only while they are, and an approval given to the ``computer.use`` call covers exactly
# those child calls. The first step that is refused or fails ends the sequence; the facade's
# answer carries that step's code as it came (so its status too), the step and the tool.
# See docs/sidecars/computer.md.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from sidecars.sdk import Context, Reply, Sidecar, ToolError

app = Sidecar("computer.use", version="1.0.0", concurrency=2)
"""The sidecar; ``app.run()`` serves it (see ``__main__``)."""

REQUIRES = ["screen.screenshot", "computer.mouse", "computer.keyboard"]
DEFAULT_MAX_ACTIONS = 16
MAX_WAIT_S = 60.0

Action = Literal[
    "screenshot",
    "cursor_position",
    "mouse_move",
    "left_click",
    "right_click",
    "middle_click",
    "double_click",
    "left_click_drag",
    "scroll",
    "type",
    "key",
    "wait",
]
Coordinate = Annotated[list[Annotated[int, Meta(ge=0)]], Meta(min_length=2, max_length=2)]


class Step(msgspec.Struct, forbid_unknown_fields=True):
    """One action in the schema computer-use models emit (Anthropic's computer tool)."""

    action: Annotated[Action, Meta(description="What to do.")]
    coordinate: Annotated[
        Coordinate | None, Meta(description="[x, y] in screen pixels (where to act).")
    ] = None
    start_coordinate: Annotated[
        Coordinate | None, Meta(description="left_click_drag: [x, y] to start from (cursor).")
    ] = None
    text: Annotated[
        str | None, Meta(description="type: the text; key: xdotool key names ('ctrl+s').")
    ] = None
    scroll_direction: Annotated[
        Literal["up", "down", "left", "right"] | None, Meta(description="scroll: direction.")
    ] = None
    scroll_amount: Annotated[
        Annotated[int, Meta(ge=1, le=100)] | None, Meta(description="scroll: clicks (1).")
    ] = None
    duration: Annotated[
        Annotated[float, Meta(ge=0, le=MAX_WAIT_S)] | None, Meta(description="wait: seconds.")
    ] = None


class UseInput(Step, forbid_unknown_fields=True):
    """One action, or ``{"actions": [...]}`` for a short sequence (then no ``action``)."""

    action: Annotated[Action | None, Meta(description="What to do (omit when giving actions).")] = (
        None  # type: ignore[assignment]
    )
    actions: Annotated[
        list[Step] | None, Meta(description="A sequence, run in order; stops at the first refusal.")
    ] = None


class Blocked(Exception):
    """A step that was refused or failed: ends the sequence."""

    def __init__(self, tool: str, env: Any) -> None:
        super().__init__(env.content)
        self.tool = tool
        self.env = env


def _xy(step: Step, field: str = "coordinate") -> tuple[int, int] | None:
    value = getattr(step, field)
    return (value[0], value[1]) if value is not None else None


def _need(step: Step, what: str, ok: bool) -> None:
    if not ok:
        raise ToolError(
            f"{step.action} needs {what}",
            code="invalid-input",
            details={"reason": "missing-field", "action": step.action, "field": what},
        )


class Runner:
    """Runs steps through the host and keeps what each child call answered."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.calls: list[dict[str, Any]] = []

    def call(self, tool: str, payload: dict[str, Any]) -> Any:
        env = self.ctx.invoke(tool, payload)
        self.calls.append({"tool": tool, "status": env.status})
        if not env.ok:
            raise Blocked(tool, env)
        return env.data

    def position(self) -> tuple[int, int]:
        data = self.call("computer.mouse", {"action": "position"})
        return int(data["x"]), int(data["y"])

    def at(self, step: Step) -> tuple[int, int]:
        """The step's coordinate, or the pointer's position when it has none."""
        return _xy(step) or self.position()

    def run(self, step: Step) -> dict[str, Any]:
        """Run one step; its result (``tool`` names the last atomic tool used)."""
        action = step.action
        if action == "screenshot":
            shot = self.call("screen.screenshot", {})
            return {"tool": "screen.screenshot", **shot}
        if action == "cursor_position":
            x, y = self.position()
            return {"tool": "computer.mouse", "coordinate": [x, y]}
        if action == "mouse_move":
            _need(step, "coordinate", step.coordinate is not None)
            x, y = self.at(step)
            self.call("computer.mouse", {"action": "move", "x": x, "y": y})
            return {"tool": "computer.mouse", "coordinate": [x, y]}
        if action in ("left_click", "right_click", "middle_click", "double_click"):
            if step.text:
                raise ToolError(
                    "holding modifier keys during a click is not supported",
                    code="unsupported",
                    details={"reason": "click-modifiers", "action": action},
                )
            x, y = self.at(step)
            button = {"right_click": "right", "middle_click": "middle"}.get(action, "left")
            mouse_action = "double_click" if action == "double_click" else "click"
            self.call("computer.mouse", {"action": mouse_action, "x": x, "y": y, "button": button})
            return {"tool": "computer.mouse", "coordinate": [x, y]}
        if action == "left_click_drag":
            _need(step, "coordinate", step.coordinate is not None)
            sx, sy = _xy(step, "start_coordinate") or self.position()
            tx, ty = self.at(step)
            self.call("computer.mouse", {"action": "drag", "x": sx, "y": sy, "toX": tx, "toY": ty})
            return {"tool": "computer.mouse", "from": [sx, sy], "coordinate": [tx, ty]}
        if action == "scroll":
            x, y = self.at(step)
            payload = {
                "action": "scroll",
                "x": x,
                "y": y,
                "direction": step.scroll_direction or "down",
                "amount": step.scroll_amount or 1,
            }
            self.call("computer.mouse", payload)
            return {"tool": "computer.mouse", "coordinate": [x, y]}
        if action == "type":
            _need(step, "text", bool(step.text))
            self.call("computer.keyboard", {"action": "type", "text": step.text})
            return {"tool": "computer.keyboard", "characters": len(step.text or "")}
        if action == "key":
            _need(step, "text", bool((step.text or "").strip()))
            self.call("computer.keyboard", {"action": "key", "keys": step.text})
            return {"tool": "computer.keyboard", "keys": step.text}
        # wait: no atomic tool; bounded by the call's deadline.
        seconds = min(step.duration if step.duration is not None else 1.0, MAX_WAIT_S)
        left = self.ctx.deadline_ms / 1000.0 - (time.monotonic() - self.ctx.started) - 0.2
        end = time.monotonic() + max(0.0, min(seconds, left))
        while time.monotonic() < end:
            self.ctx.check_cancelled()
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))
        return {"tool": None, "waitedMs": round(min(seconds, max(0.0, left)) * 1000)}


def _blocked_error(
    index: int,
    step: Step,
    blocked: Blocked,
    results: list[dict[str, Any]],
    calls: list[dict[str, Any]],
) -> ToolError:
    """The facade's answer when step ``index`` was refused or failed: the atomic tool's own
    ``error.code`` (so the envelope's status is the atomic one too), the step and the tool named
    in ``details`` (``blockedBy`` keeps the atomic error's details, ``retryAfterMs`` of a
    ``quota-limited`` refusal is repeated at the top as PROTOCOL 5 asks)."""
    env = blocked.env
    error = env.error
    code = error.code if error is not None else env.status
    child_details = (error.details if error is not None else None) or {}
    summary = {
        "step": index,
        "action": step.action,
        "tool": blocked.tool,
        "status": env.status,
        "code": code,
        "message": env.content,
        **({"details": child_details} if child_details else {}),
    }
    results.append({"action": step.action, **summary})
    details: dict[str, Any] = {
        "reason": "step-refused",
        "step": index,
        "action": step.action,
        "tool": blocked.tool,
        "blockedBy": summary,
        "calls": calls,
    }
    if "retryAfterMs" in child_details:
        details["retryAfterMs"] = child_details["retryAfterMs"]
    return ToolError.passthrough(
        f"step {index} ({step.action}): {blocked.tool} answered {env.status} "
        f"({code}): {env.content}",
        code,
        details=details,
        data={"steps": results},
    )


def computer_use(args: UseInput, ctx: Context) -> Reply:
    """Run one action or a sequence of them, each step through the host's gates."""
    if (args.action is None) == (args.actions is None):
        raise ToolError(
            "give either action or actions",
            code="invalid-input",
            details={"reason": "action-or-actions"},
        )
    limit = ctx.config.get("maxActions", DEFAULT_MAX_ACTIONS)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ToolError(
            "config.maxActions must be an integer >= 1",
            code="failed",
            details={"reason": "bad-config", "key": "maxActions"},
        )
    if args.actions is not None:
        steps = args.actions
    else:
        single = {f: getattr(args, f) for f in Step.__struct_fields__}
        steps = [Step(**single)]
    if not steps or len(steps) > limit:
        raise ToolError(
            f"actions must hold 1 to {limit} steps (config.maxActions), got {len(steps)}",
            code="invalid-input",
            details={"reason": "too-many-actions", "limit": limit},
        )
    runner = Runner(ctx)
    results: list[dict[str, Any]] = []
    for index, step in enumerate(steps):
        ctx.check_cancelled()
        try:
            result = runner.run(step)
        except Blocked as blocked:
            raise _blocked_error(index, step, blocked, results, runner.calls) from None
        results.append({"action": step.action, "status": "success", **result})
    shots = [r for r in results if r["action"] == "screenshot"]
    content = f"{len(results)} step(s) done: " + ", ".join(r["action"] for r in results)
    if shots:
        last = shots[-1]
        content += f"; screenshot {last['path']} ({last['width']}x{last['height']})"
    return Reply(data={"steps": results, "calls": runner.calls}, content=content)


app.tool(
    "computer.use",
    description=(
        "Operate the computer with the actions computer-use models emit (screenshot, "
        "cursor_position, mouse_move, left/right/middle/double click, left_click_drag, scroll, "
        "type, key, wait), one or a short sequence; every step runs through the host as a call "
        "of screen.screenshot, computer.mouse or computer.keyboard."
    ),
    permission="computer",
    sandbox="approval-required",
    requires=REQUIRES,
)(computer_use)
