"""The codes a tool's ``ToolError`` answers with (issue 26, item 4): the worker protocol's five and
the envelope codes of PROTOCOL 5 are kept, so a composite tool can pass a child's code through;
anything else is ``failed`` unless passed through on purpose."""

from __future__ import annotations

from sidecars.sdk import ToolError
from supervisor.contracts.envelope import UNAVAILABLE_CODES
from supervisor.contracts.wire import NULL
from supervisor.policy.results import from_answer


def test_envelope_codes_are_kept_and_typos_are_failed() -> None:
    for code in ("invalid-input", "approval-required", "quota-limited", "timeout", "not-visible"):
        assert ToolError("x", code=code).code == code
    assert ToolError("x", code="aproval-required").code == "failed"


def test_passthrough_keeps_any_code_and_the_host_derives_the_same_status() -> None:
    assert ToolError.passthrough("x", "destination-refused").code == "destination-refused"
    assert ToolError.passthrough("x", None).code == "failed"
    for code, status in (("quota-limited", "unavailable"), ("destination-refused", "failed")):
        err = ToolError.passthrough("x", code)
        env = from_answer(
            "t",
            ok=False,
            data=NULL,
            content=None,
            code=err.code,
            error="x",
            details=None,
            sidecar="s",
            pid=1,
            duration_ms=1.0,
            max_output_bytes=1000,
        )
        assert (env.status, env.error.code) == (status, code)
        assert (code in UNAVAILABLE_CODES) == (status == "unavailable")
