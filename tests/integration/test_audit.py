"""The audit log: one JSON line per invocation, approvals recorded, rotation by size."""

import hashlib
import json

from supervisor.calls.call import InvokeRequest
from supervisor.contracts.rpc import Approval
from tests.conftest import echo, raw, running_host, wait_available


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_one_line_per_invocation(app):
    reg = {
        "echo": echo(tools=["echo.say", "echo.fail"], sandbox={"echo.fail": "approval-required"})
    }
    async with running_host(app, reg) as host:
        await wait_available(host, "echo.say")
        payload = {"text": "audited"}
        await host.invoker.invoke(InvokeRequest("echo.say", raw(payload), client="tester"))
        await host.invoker.invoke(InvokeRequest("echo.fail", raw({}), client="tester"))
        await host.invoker.invoke(
            InvokeRequest(
                "echo.fail", raw({}), approval=Approval(granted=True, by="alice"), client="tester"
            )
        )
        await host.invoker.invoke(InvokeRequest("nope.nothing", raw({}), client="tester"))
        host.audit.flush()
        recs = lines(app / ".toolhost" / "audit.jsonl")
    assert [r["tool"] for r in recs] == ["echo.say", "echo.fail", "echo.fail", "nope.nothing"]
    ok, refused, approved, unknown = recs
    assert ok["status"] == "success" and ok["client"] == "tester" and ok["pid"] > 0
    assert (
        ok["inputDigest"]
        == "sha256:"
        + hashlib.sha256(json.dumps(payload, separators=(",", ":")).encode()).hexdigest()
    )
    assert refused["status"] == "unavailable" and refused["errorCode"] == "approval-required"
    assert "approval" not in refused
    assert (
        approved["approval"] == {"granted": True, "by": "alice"}
        and approved["errorCode"] == "failed"
    )
    assert unknown["errorCode"] == "unknown-tool"
    assert all(r["time"].endswith("+00:00") for r in recs)
    assert oct((app / ".toolhost" / "audit.jsonl").stat().st_mode & 0o777) == "0o600"


async def test_rotation_by_size(app):
    reg = {"echo": echo(tools=["echo.say"])}
    async with running_host(app, reg, host={"auditMaxBytes": 2000, "auditKeep": 2}) as host:
        await wait_available(host, "echo.say")
        for i in range(60):
            await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": str(i)})))
            host.audit.flush()
    folder = app / ".toolhost"
    current = folder / "audit.jsonl"
    assert (
        current.exists()
        and (folder / "audit.jsonl.1").exists()
        and (folder / "audit.jsonl.2").exists()
    )
    assert not (folder / "audit.jsonl.3").exists()
    for f in (current, folder / "audit.jsonl.1", folder / "audit.jsonl.2"):
        assert f.stat().st_size <= 2000
        assert all(json.loads(line)["tool"] == "echo.say" for line in f.read_text().splitlines())


async def test_audit_can_be_turned_off(app):
    async with running_host(app, {"echo": echo(tools=["echo.say"])}, host={"auditLog": ""}) as host:
        await wait_available(host, "echo.say")
        await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": "x"})))
        assert host.audit is None
    assert not (app / ".toolhost" / "audit.jsonl").exists()


def _record(log, tool: str) -> None:
    log.record(
        client="test",
        tool=tool,
        input_json=b"{}",
        status="success",
        error_code=None,
        duration_ms=1.0,
        sidecar="echo",
        pid=1,
        attempts=1,
        approval=None,
    )


def _tools(path) -> list[str]:
    return [json.loads(line)["tool"] for line in path.read_text().splitlines()]


def test_a_due_batch_is_written_by_the_next_record_and_the_last_one_by_the_writer(
    tmp_path,
):
    """While calls go on, a record that finds the batch half its window old writes it (once its
    tick's answers are out), before the writer's deadline: the writer is not woken for it. When
    calls stop, the writer writes the rest at the window's end."""
    import trio
    import trio.testing

    from supervisor.calls.audit import FLUSH_DELAY_S, AuditLog
    from supervisor.processes.direct_write import cork, uncork

    clock = trio.testing.MockClock()
    path = tmp_path / "audit.log"

    async def main() -> None:
        log = AuditLog(str(path))
        log.open()
        async with trio.open_nursery() as nursery:
            await nursery.start(log.run)
            _record(log, "a")
            _record(log, "b")
            clock.jump(FLUSH_DELAY_S * 0.25)
            _record(log, "c")  # a quarter of the window: nothing written
            assert path.read_text() == ""
            clock.jump(FLUSH_DELAY_S * 0.5)  # three quarters: the writer's deadline is ahead
            cork()
            _record(log, "d")
            assert path.read_text() == ""  # written once the tick's answers are out...
            uncork()
            assert _tools(path) == ["a", "b", "c", "d"]  # ...by this tick, not the writer
            _record(log, "e")
            _record(log, "f")
            assert _tools(path) == ["a", "b", "c", "d"]  # a new window
            clock.jump(FLUSH_DELAY_S * 2)  # calls stopped: the writer's deadline passes
            await trio.testing.wait_all_tasks_blocked()
            assert _tools(path) == ["a", "b", "c", "d", "e", "f"]
            nursery.cancel_scope.cancel()

    trio.run(main, clock=clock)
