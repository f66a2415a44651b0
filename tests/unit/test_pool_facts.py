"""Pool state -> runtime, probe, reasons and details (PROTOCOL 4), as a table."""

import pytest

from supervisor.contracts.facts import ToolProbe
from supervisor.contracts.snapshot import Reason
from supervisor.contracts.wire import ToolInfo
from supervisor.policy.pool_facts import PoolState, runtime_of, sidecar_facts

CRASH = {"exit_reason": "crashed", "exit_message": "worker exited (status 3)", "exit_code": 3}
NO_START = {
    "start_failed": True,
    "exit_reason": "start-failed",
    "exit_message": "exited before ready (status 5)",
    "exit_code": 5,
    "next_restart_ms": 120.0,
}
START_FAILED = ("failed", "start-failed", False)


@pytest.mark.parametrize(
    ("state", "runtime", "code", "restarting"),
    [
        (PoolState(sidecar="s"), "starting", "starting", False),
        (PoolState(sidecar="s", serving=True, ever_ready=True), "ready", None, False),
        (
            PoolState(sidecar="s", serving=True, replacing=True, ever_ready=True),
            "ready",
            None,
            False,
        ),
        # the restart window: a crash inside the intensity keeps the sidecar ready
        (PoolState(sidecar="s", ever_ready=True, replacing=True, **CRASH), "ready", None, True),
        # past the intensity
        (
            PoolState(sidecar="s", ever_ready=True, replacing=True, gave_up=True, **CRASH),
            "failed",
            "gave-up",
            False,
        ),
        # a policy that does not restart
        (
            PoolState(sidecar="s", ever_ready=True, gave_up=True, **CRASH),
            "failed",
            "gave-up",
            False,
        ),
        # PROTOCOL 4: the window covers starting a replacement, not a sidecar that cannot start
        (PoolState(sidecar="s", ever_ready=True, replacing=True, **NO_START), *START_FAILED),
        (  # the next attempt is starting: still failed until it is ready
            PoolState(
                sidecar="s",
                ever_ready=True,
                replacing=True,
                **{**NO_START, "next_restart_ms": None},
            ),
            *START_FAILED,
        ),
        (  # ready did not come in time
            PoolState(
                sidecar="s",
                ever_ready=True,
                replacing=True,
                start_failed=True,
                exit_reason="start-timeout",
                exit_message="no ready within 100 ms",
            ),
            *START_FAILED,
        ),
        (  # a scale-up worker failed to start while another serves
            PoolState(sidecar="s", serving=True, ever_ready=True, **NO_START),
            "ready",
            None,
            False,
        ),
        (
            PoolState(sidecar="s", ever_ready=True, replacing=True, gave_up=True, **NO_START),
            "failed",
            "gave-up",
            False,
        ),
        (
            PoolState(sidecar="s", stopped=True, ever_ready=True, **NO_START),
            "failed",
            "stopped",
            False,
        ),
        # never ready: the first start failed
        (PoolState(sidecar="s", replacing=True, **CRASH), "failed", "restarting", False),
        (
            PoolState(sidecar="s", exit_reason="start-timeout", exit_message="no ready"),
            "timed-out",
            "start-timeout",
            False,
        ),
        (
            PoolState(sidecar="s", exit_reason="protocol-error", exit_message="bad line"),
            "schema-error",
            "protocol-error",
            False,
        ),
        (
            PoolState(sidecar="s", stopped=True, ever_ready=True, **CRASH),
            "failed",
            "stopped",
            False,
        ),
        (PoolState(sidecar="s", stopped=True, serving=True), "ready", None, False),
        # pool.min 0: nothing runs until a call, and that is fine
        (PoolState(sidecar="s", idle_ok=True, ever_ready=True), "ready", None, False),
    ],
)
def test_runtime_table(state, runtime, code, restarting):
    got_runtime, reason, got_restarting = runtime_of(state)
    assert got_runtime == runtime
    assert (reason.code if reason else None) == code
    assert got_restarting == restarting
    facts = sidecar_facts(state)
    assert facts.runtime == runtime and facts.details.restarting == restarting


def test_a_failed_replacement_start_names_the_cause_and_the_next_attempt():
    facts = sidecar_facts(PoolState(sidecar="s", ever_ready=True, replacing=True, **NO_START))
    assert facts.runtime == "failed" and facts.details.nextRestartMs == 120.0
    assert not facts.details.restarting and facts.details.lastExitReason == "start-failed"
    reason = facts.runtime_reason
    assert reason is not None and reason.code == "start-failed"
    assert "exited before ready (status 5)" in reason.message
    assert "retrying in 120 ms" in reason.message and "toolhost logs s" in reason.hint


def test_probe_is_reported_only_while_ready():
    bad = Reason(field="probe", code="probe-degraded", message="slow", hint="h")
    tools = {"a": ToolProbe(state="unavailable")}
    ready = PoolState(
        sidecar="s", serving=True, probe="degraded", probe_reason=bad, tool_probe=tools
    )
    facts = sidecar_facts(ready)
    assert facts.probe == "degraded" and facts.probe_reason == bad and facts.tool_probe == tools
    down = sidecar_facts(PoolState(sidecar="s", probe="degraded", tool_probe=tools, **CRASH))
    assert down.probe == "skipped" and down.probe_reason is None and down.tool_probe == {}
    assert sidecar_facts(PoolState(sidecar="s", serving=True, probed=False)).probe == "skipped"


def test_details_and_unserved_tools():
    state = PoolState(
        sidecar="s",
        serving=True,
        restarts=2,
        next_restart_ms=12.5,
        stderr_tail="boom",
        announced={"a": ToolInfo(name="a")},
        declared_tools=("a", "b"),
        **CRASH,
    )
    facts = sidecar_facts(state)
    d = facts.details
    assert (d.restarts, d.lastExitCode, d.lastExitReason, d.stderrTail, d.nextRestartMs) == (
        2,
        3,
        "crashed",
        "boom",
        12.5,
    )
    assert list(facts.tool_runtime) == ["b"]
    assert facts.tool_runtime["b"].state == "schema-error"
    assert facts.tool_runtime["b"].reason.code == "tool-not-served"
