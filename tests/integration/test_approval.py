"""Sandbox and approval policy over the kernel socket, the audit lines it leaves, the defaults
by tool name, and the confirmation an operator must give to restart a busy sidecar."""

import json

import trio

from supervisor.calls.call import InvokeRequest
from tests.conftest import FIXTURES, echo, running_host, script, wait_available, wait_for
from tests.kernel import served


def anytool(tools, **extra):
    return script("anytool", tools, args=[str(FIXTURES / "anytool.py"), *tools], **extra)


def audit_lines(host, app):
    host.audit.flush()
    path = app / ".toolhost" / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_approval_flow_over_the_socket_and_its_audit_lines(app):
    reg = {"echo": echo(tools=["echo.say"], sandbox={"echo.say": "approval-required"})}
    async with running_host(app, reg) as host:
        await wait_available(host, "echo.say")
        worker = host.pools["echo"].workers[0]
        async with served(host, app) as srv, srv.peer("unix-json") as peer:
            # Visible (approval-required does not hide a tool), but nothing runs without approval.
            listed = (await peer.request(1, "tools.list"))["result"]["tools"]
            assert [t["name"] for t in listed] == ["echo.say"]
            params = {"tool": "echo.say", "input": {"text": "hello"}}
            for rid, approval in (
                (2, None),
                (3, {"granted": False, "by": "bob"}),
                (4, {"granted": True}),
            ):
                p = dict(params) if approval is None else {**params, "approval": approval}
                env = (await peer.request(rid, "tools.invoke", p))["result"]
                assert env["status"] == "unavailable", env
                assert env["error"]["code"] == "approval-required"
            assert "approval.by must name who approved" in env["content"]
            assert worker.calls_issued == 0 and host.pools["echo"].dispatch.starts == 0
            granted = {**params, "approval": {"granted": True, "by": "alice"}}
            env = (await peer.request(5, "tools.invoke", granted))["result"]
            assert env["status"] == "success" and env["data"]["text"] == "hello"
            assert worker.calls_issued == 1
        lines = audit_lines(host, app)
        assert [(x["status"], x.get("errorCode")) for x in lines] == [
            ("unavailable", "approval-required"),
            ("unavailable", "approval-required"),
            ("unavailable", "approval-required"),
            ("success", None),
        ]
        assert "approval" not in lines[0]
        assert lines[1]["approval"] == {"granted": False, "by": "bob"}
        assert lines[3]["approval"] == {"granted": True, "by": "alice"}
        assert lines[3]["client"].startswith("test@") and lines[3]["pid"] == worker.pid
        assert all(x["tool"] == "echo.say" for x in lines)


async def test_sandbox_defaults_by_tool_name(app):
    tools = ["computer.mouse", "browser.evaluate", "task.background", "browser.navigate"]
    reg = {
        "kit": anytool(tools),
        "kit2": anytool(["computer.keyboard"], sandbox="allowed"),  # the registry wins
    }
    async with running_host(app, reg) as host:
        await wait_available(host, *tools, "computer.keyboard")
        for tool in tools[:3]:
            assert host.catalog.get(tool).stability.sandbox == "approval-required"
            env = await host.invoker.invoke(InvokeRequest(tool))
            assert env.status == "unavailable" and env.error.code == "approval-required"
        assert host.catalog.get("browser.navigate").stability.sandbox == "allowed"
        assert host.catalog.get("computer.keyboard").stability.sandbox == "allowed"
        assert (await host.invoker.invoke(InvokeRequest("browser.navigate"))).status == "success"


async def test_denied_tool_is_hidden_and_never_sent(app):
    reg = {"kit": anytool(["computer.mouse", "t.ok"], sandbox={"computer.mouse": "denied"})}
    async with running_host(app, reg) as host:
        await wait_available(host, "t.ok")
        d = host.catalog.get("computer.mouse")
        assert d.stability.sandbox == "denied" and not d.visible
        assert d.stability.effective == "unavailable"
        async with served(host, app) as srv, srv.peer("unix-json") as peer:
            names = [t["name"] for t in (await peer.request(1, "tools.list"))["result"]["tools"]]
            assert names == ["t.ok"]
            invoke = {"tool": "computer.mouse", "approval": {"granted": True, "by": "alice"}}
            env = (await peer.request(2, "tools.invoke", invoke))["result"]
            assert env["status"] == "unavailable" and env["error"]["code"] == "sandbox-denied"
        assert host.pools["kit"].workers[0].calls_issued == 0


async def test_restart_with_calls_in_flight_needs_force(app):
    async with running_host(app, {"echo": echo(tools=["echo.say", "echo.sleep"])}) as host:
        await wait_available(host, "echo.sleep")
        first = host.pools["echo"].workers[0].pid
        async with served(host, app) as srv, srv.peer("unix-json") as peer:
            busy = {"tool": "echo.sleep", "input": {"seconds": 20, "steps": 200}, "stream": True}
            await peer.send({"id": 1, "method": "tools.invoke", "params": busy})
            assert (await peer.recv())["event"] == "tool.start"
            assert (await peer.recv())["event"] == "tool.progress"  # it is running
            msg = await peer.request(2, "sidecar.restart", {"sidecar": "echo"})
            assert msg["error"]["code"] == "invalid-params"
            assert "force: true" in msg["error"]["message"]
            assert msg["error"]["data"] == {"inflight": 1}
            assert host.pools["echo"].workers[0].pid == first  # nothing was restarted
            await peer.send(
                {"id": 3, "method": "sidecar.restart", "params": {"sidecar": "echo", "force": True}}
            )
            got = {}
            with trio.fail_after(20):
                while len(got) < 2:
                    m = await peer.recv()
                    if "event" not in m:
                        got[m["id"]] = m
            assert got[3]["result"]["restarted"] is True and got[3]["result"]["replaced"]
            assert got[1]["result"]["status"] == "failed"
            # The worker is told to shut down: the SDK ends what runs as cancelled.
            assert got[1]["result"]["error"]["code"] in ("cancelled", "worker-crashed")
        await wait_for(host, lambda: any(w.pid != first for w in host.pools["echo"].workers))
        await wait_available(host, "echo.sleep")
        # Idle: no confirmation needed.
        async with served(host, app) as srv, srv.peer("unix-json") as peer:
            msg = await peer.request(4, "sidecar.restart", {"sidecar": "echo"})
            assert msg["result"]["restarted"] is True
