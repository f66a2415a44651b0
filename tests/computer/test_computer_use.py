"""computer.use against Xvfb and the real Tk window, through a running toolhost: every step is a
host call of an atomic tool (audited with ``via``), an approval on the facade covers its steps,
a refused step names its tool, and the facade disappears when a required tool does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from supervisor.calls.call import InvokeRequest
from supervisor.cli.init import XDO_KEYBOARD, XDO_MOUSE
from supervisor.contracts.rpc import Approval
from tests.computer.conftest import Display, pixel
from tests.computer.test_computer_native import COLOUR, TOOLS
from tests.conftest import REPO, raw, running_host, wait_available, wait_for, write_registry
from tests.kernel import served

APPROVED = Approval(granted=True, by="alice")
MANIFESTS = [str(REPO / "manifests")]
AUDIT = ".toolhost/audit.jsonl"


def registry(display: str, keyboard: bool = True, **use: Any) -> dict[str, Any]:
    config: dict[str, Any] = {"mouseCommand": XDO_MOUSE}
    if keyboard:
        config["keyboardCommand"] = XDO_KEYBOARD
    return {
        "computer.native": {
            "command": "python",
            "args": ["-m", "sidecars.computer"],
            "tools": TOOLS,
            "env": {"DISPLAY": display},
            "pool": {"min": 1, "max": 1},
            "probe": {"intervalMs": 200},
            "config": config,
        },
        "computer.use": {
            "command": "python",
            "args": ["-m", "sidecars.computer_use"],
            "tools": ["computer.use"],
            "pool": {"min": 1, "max": 1},
            **use,
        },
    }


def audit_lines(app: Path, host: Any) -> list[dict[str, Any]]:
    host.audit.flush()
    return [json.loads(x) for x in (app / AUDIT).read_text().splitlines()]


async def test_a_sequence_through_the_kernel_socket(app: Path, xdisplay: Display) -> None:
    win = xdisplay.window
    cx, cy = win.centre
    sequence = {
        "actions": [
            {"action": "screenshot"},
            {"action": "left_click", "coordinate": [cx, cy]},
            {"action": "type", "text": "ok"},
            {"action": "key", "text": "Return"},
            {"action": "cursor_position"},
        ]
    }
    async with running_host(
        app, registry(xdisplay.name), manifest_dirs=MANIFESTS, host={"auditLog": AUDIT}
    ) as host:
        await wait_available(host, "computer.use", *TOOLS)
        async with served(host, app) as srv, srv.peer("unix-json") as peer:
            params = {
                "tool": "computer.use",
                "input": sequence,
                "approval": {"granted": True, "by": "alice"},
                "timeoutMs": 30000,
            }
            env = (await peer.request(1, "tools.invoke", params))["result"]
        assert env["status"] == "success", env
        steps = env["data"]["steps"]
        assert [s["action"] for s in steps] == [a["action"] for a in sequence["actions"]]
        shot = steps[0]
        assert shot["tool"] == "screen.screenshot" and (shot["width"], shot["height"]) == (
            1024,
            768,
        )
        assert pixel(app / "workspace" / shot["path"], cx, cy) == COLOUR
        assert steps[4]["coordinate"] == [cx, cy]
        assert win.wait_event("key Return")
        assert win.events()[0] == f"click {cx} {cy} 1"
        assert [e.split()[1] for e in win.events() if e.startswith("key")] == ["o", "k", "Return"]

        lines = audit_lines(app, host)
        parent = next(x for x in lines if x["tool"] == "computer.use")
        children = [x for x in lines if x.get("via") == f"computer.use#{parent['callId']}"]
        assert [c["tool"] for c in children] == [
            "screen.screenshot",
            "computer.mouse",
            "computer.keyboard",
            "computer.keyboard",
            "computer.mouse",
        ]
        # The approval of the facade call covered its control steps.
        assert all(
            c["approval"]["by"] == "alice" for c in children if c["tool"] != "screen.screenshot"
        )
        assert parent["approval"]["by"] == "alice"


async def test_without_approval_the_first_control_step_refuses(
    app: Path, xdisplay: Display
) -> None:
    reg = registry(xdisplay.name, sandbox={"computer.use": "allowed"})
    async with running_host(app, reg, manifest_dirs=MANIFESTS, host={"auditLog": AUDIT}) as host:
        await wait_available(host, "computer.use", *TOOLS)
        cx, cy = xdisplay.window.centre
        seq = {
            "actions": [
                {"action": "screenshot"},
                {"action": "left_click", "coordinate": [cx, cy]},
                {"action": "type", "text": "never"},
            ]
        }
        env = await host.invoker.invoke(InvokeRequest("computer.use", raw(seq)))
        # The facade answers with the blocking atomic tool's status and code, naming both.
        assert env.status == "unavailable" and env.error.code == "approval-required", env
        assert env.error.details["tool"] == "computer.mouse" and env.error.details["step"] == 1
        assert env.error.details["action"] == "left_click"
        blocked = env.error.details["blockedBy"]
        assert blocked["tool"] == "computer.mouse" and blocked["step"] == 1
        assert blocked["status"] == "unavailable" and blocked["code"] == "approval-required"
        assert "computer.mouse" in env.content and "approval-required" in env.content
        steps = msgspec.json.decode(env.data)["steps"]
        assert steps[0]["status"] == "success" and steps[1]["tool"] == "computer.mouse"
        assert len(steps) == 2  # the sequence ended at the refusal
        assert xdisplay.window.events() == []
        tools = [x["tool"] for x in audit_lines(app, host) if x.get("via")]
        assert tools == ["screen.screenshot", "computer.mouse"]

        # The facade itself defaults to approval-required.
        write_registry(app, registry(xdisplay.name), host={"auditLog": AUDIT})
        await host.reload()
        await wait_available(host, "computer.use", *TOOLS)
        env = await host.invoker.invoke(
            InvokeRequest("computer.use", raw({"action": "screenshot"}))
        )
        assert env.status == "unavailable" and env.error.code == "approval-required"


async def test_a_click_where_the_pointer_is_does_not_wait_for_the_delegate_timeout(
    app: Path, xdisplay: Display
) -> None:
    """A coordinate-less left_click clicks where the pointer already is: the delegate's
    `mousemove --sync` to that same point never returned, so the step ran into its deadline.
    The same for a drag that ends where it starts."""
    win = xdisplay.window
    cx, cy = win.centre
    async with running_host(app, registry(xdisplay.name), manifest_dirs=MANIFESTS) as host:
        await wait_available(host, "computer.use", *TOOLS)
        here = [cx, cy]
        seq = {
            "actions": [
                {"action": "mouse_move", "coordinate": here},
                {"action": "left_click"},
                {"action": "left_click_drag", "start_coordinate": here, "coordinate": here},
            ]
        }
        # A small deadline: before the fix the click step failed with it (delegate-timeout).
        env = await host.invoker.invoke(
            InvokeRequest("computer.use", raw(seq), timeout_ms=4000, approval=APPROVED)
        )
        assert env.status == "success", env
        steps = msgspec.json.decode(env.data)["steps"]
        assert steps[1]["coordinate"] == here and steps[2]["from"] == here
        assert win.wait_event("click", count=2) == [f"click {cx} {cy} 1"] * 2


async def test_a_quota_limited_step_gives_the_facade_its_code(app: Path, xdisplay: Display) -> None:
    reg = registry(xdisplay.name, sandbox={"computer.use": "allowed"})
    reg["computer.native"]["quota"] = {"tools": {"screen.screenshot": {"callsPerMinute": 1}}}
    async with running_host(app, reg, manifest_dirs=MANIFESTS) as host:
        await wait_available(host, "computer.use", *TOOLS)
        seq = {"actions": [{"action": "screenshot"}, {"action": "screenshot"}]}
        env = await host.invoker.invoke(InvokeRequest("computer.use", raw(seq)))
        assert env.status == "unavailable" and env.error.code == "quota-limited", env
        details = env.error.details
        assert details["tool"] == "screen.screenshot" and details["step"] == 1
        assert details["retryAfterMs"] > 0
        assert details["blockedBy"]["details"]["retryAfterMs"] == details["retryAfterMs"]
        steps = msgspec.json.decode(env.data)["steps"]
        assert [s["status"] for s in steps] == ["success", "unavailable"]


async def test_bad_input_gets_structured_errors(app: Path, xdisplay: Display) -> None:
    async with running_host(app, registry(xdisplay.name), manifest_dirs=MANIFESTS) as host:
        await wait_available(host, "computer.use")
        cases = [
            ({}, "action-or-actions"),
            ({"action": "type"}, "missing-field"),
            ({"actions": [{"action": "wait", "duration": 0}] * 17}, "too-many-actions"),
        ]
        for payload, reason in cases:
            env = await host.invoker.invoke(
                InvokeRequest("computer.use", raw(payload), approval=APPROVED)
            )
            assert env.status == "failed" and env.error.code == "invalid-input", env
            assert env.error.details["reason"] == reason
        env = await host.invoker.invoke(
            InvokeRequest("computer.use", raw({"action": "fly"}), approval=APPROVED)
        )
        assert env.status == "failed" and env.error.code == "invalid-input"
        env = await host.invoker.invoke(
            InvokeRequest(
                "computer.use", raw({"action": "wait", "duration": 0.05}), approval=APPROVED
            )
        )
        assert env.status == "success"


async def test_removing_a_delegate_hides_the_facade(app: Path, xdisplay: Display) -> None:
    async with running_host(app, registry(xdisplay.name), manifest_dirs=MANIFESTS) as host:
        await wait_available(host, "computer.use", *TOOLS)
        write_registry(app, registry(xdisplay.name, keyboard=False))
        await host.reload()

        def hidden() -> Any:
            d = host.catalog.get("computer.use")
            return d is not None and d.stability.effective == "unavailable" and d

        d = await wait_for(host, hidden)
        [reason] = [r for r in d.stability.reasons if r.code == "dependency-unavailable"]
        assert "computer.keyboard" in reason.message
        env = await host.invoker.invoke(
            InvokeRequest("computer.use", raw({"action": "screenshot"}), approval=APPROVED)
        )
        assert env.status == "unavailable"
