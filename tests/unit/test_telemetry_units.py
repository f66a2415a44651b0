"""Telemetry's pure parts: trace context on the wire (process-json ``call``, MCP ``_meta``), the
registry keys, JSON log records and the per-sidecar rate limit of forwarded stderr lines, and
what happens when OpenTelemetry is off or not installed (a subprocess that cannot import it)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import msgspec
import pytest

from supervisor.protocols.mcp_server import CallTool
from supervisor.protocols.process_json import ProcessJsonConnection
from supervisor.registry.load import load_registry
from supervisor.telemetry import disabled_by_env, start
from supervisor.telemetry.logs import JsonFormatter, StderrLines
from supervisor.telemetry.sampling import Sampling, parse_traceparent, unsampled_traceparent
from tests.unit.test_mcp_protocol import ready as mcp_ready
from tests.unit.test_mcp_server_protocol import line as mcp_line
from tests.unit.test_mcp_server_protocol import ready as mcp_server_ready

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def ready_process_json() -> ProcessJsonConnection:
    conn = ProcessJsonConnection()
    ready = {"type": "ready", "protocol": 1, "name": "x", "version": "1", "tools": []}
    conn.feed(json.dumps(ready).encode() + b"\n")
    assert conn.state == "ready"
    return conn


def test_call_line_is_unchanged_without_a_trace_and_carries_it_with_one():
    conn = ready_process_json()
    _, plain = conn.call("t.x", msgspec.Raw(b"{}"), 500)
    assert json.loads(plain) == {
        "type": "call",
        "id": 1,
        "tool": "t.x",
        "input": {},
        "deadlineMs": 500,
    }
    _, traced = conn.call("t.x", msgspec.Raw(b"{}"), 500, TP, "k=v")
    msg = json.loads(traced)
    assert msg["traceparent"] == TP and msg["tracestate"] == "k=v"


def test_mcp_tools_call_puts_traceparent_in_meta():
    c = mcp_ready()
    _, data = c.call_tool("a", msgspec.Raw(b"{}"))
    assert "_meta" not in json.loads(data)["params"]
    _, data = c.call_tool("a", msgspec.Raw(b"{}"), traceparent=TP)
    assert json.loads(data)["params"]["_meta"] == {"traceparent": TP}
    rid, data = c.call_tool("a", msgspec.Raw(b"{}"), progress=True, traceparent=TP)
    assert json.loads(data)["params"]["_meta"] == {"progressToken": rid, "traceparent": TP}


def test_mcp_server_reads_meta_traceparent():
    conn = mcp_server_ready()
    params = {"name": "a", "arguments": {}, "_meta": {"traceparent": TP, "tracestate": "k=v"}}
    [ev] = conn.feed(
        mcp_line({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": params})
    )
    assert isinstance(ev, CallTool)
    assert ev.traceparent == TP and ev.tracestate == "k=v" and ev.progress_token is None


def write(tmp_path, host):
    path = tmp_path / "tools" / "external.tools.jsonc"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schemaVersion": 2, "host": host, "sidecars": {}}))


def test_registry_accepts_log_format_and_telemetry(tmp_path):
    write(tmp_path, {"logFormat": "json", "telemetry": {"enabled": True, "captureContent": True}})
    reg = load_registry(str(tmp_path), use_global=False)
    assert reg.errors == []
    assert reg.host.log_format == "json"
    assert reg.host.telemetry.enabled and reg.host.telemetry.capture_content
    write(tmp_path, {})
    reg = load_registry(str(tmp_path), use_global=False)
    assert reg.host.log_format == "text" and not reg.host.telemetry.enabled


@pytest.mark.parametrize(
    ("host", "path"),
    [
        ({"logFormat": "xml"}, "host.logFormat"),
        ({"telemetry": {"enabled": "yes"}}, "host.telemetry.enabled"),
        ({"telemetry": {"enabeld": True}}, "host.telemetry.enabeld"),
    ],
)
def test_bad_telemetry_settings_name_the_path(tmp_path, host, path):
    write(tmp_path, host)
    reg = load_registry(str(tmp_path), use_global=False)
    assert any(e.startswith(path) for e in reg.errors), reg.errors
    assert reg.host.log_format == "text" and not reg.host.telemetry.enabled


def test_json_formatter_fields_and_redaction():
    fmt = JsonFormatter(lambda s: s.replace("hunter2", "***"))
    rec = logging.LogRecord(
        "toolhost.host", logging.WARNING, __file__, 1, "key %s", ("hunter2",), None
    )
    rec.sidecar, rec.pid, rec.callId = "web", 42, 7
    out = json.loads(fmt.format(rec))
    assert out["level"] == "warning" and out["logger"] == "toolhost.host"
    assert out["message"] == "key ***"
    assert out["sidecar"] == "web" and out["pid"] == 42 and out["callId"] == 7
    assert out["time"].endswith("+00:00") and "tool" not in out


def test_stderr_lines_are_split_rate_limited_and_dropped_ones_counted(caplog):
    lines = StderrLines(rate=0.0, burst=3)
    feed = lines.tap("noisy", lambda: {"pid": 99})
    with caplog.at_level(logging.INFO, logger="toolhost.sidecar"):
        feed(b"one\ntw")
        feed(b"o\n\nthree\nfour\nfive\n")
    got = [(r.getMessage(), r.__dict__.get("pid")) for r in caplog.records]
    assert got == [("one", 99), ("two", 99), ("three", 99)]  # burst of 3, blank line skipped
    assert lines._buckets["noisy"].dropped == 2
    # Once a line may pass again, the count comes first.
    lines.rate = 1e9
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="toolhost.sidecar"):
        feed(b"six\n")
    first, second = caplog.records
    assert first.levelno == logging.WARNING and first.__dict__["dropped"] == 2
    assert second.getMessage() == "six" and second.__dict__["sidecar"] == "noisy"


def test_a_very_long_line_is_cut():
    lines = StderrLines()
    seen: list[tuple[int, bool]] = []
    lines.line = lambda sidecar, fields, data, truncated=False: seen.append((len(data), truncated))  # type: ignore[method-assign]
    feed = lines.tap("x", dict)
    feed(b"a" * 20000)
    feed(b"b" * 10 + b"\n")
    assert seen[0] == (8192, True) and seen[-1][1] is False


def test_off_means_none(monkeypatch):
    assert start(False) is None
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert disabled_by_env() and start(True) is None


BLOCK_OTEL = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError("blocked for the test: " + name)
sys.meta_path.insert(0, Block())
"""


def test_not_installed_means_none_and_the_sdk_still_serves():
    code = (
        BLOCK_OTEL
        + f"""
import json, threading, logging
logging.basicConfig(level=logging.WARNING)
from supervisor.telemetry import start, installed
assert not installed()
assert start(True) is None
from msgspec import Struct
from sidecars.sdk import Context, Sidecar
from sidecars.sdk import tracing
app = Sidecar("t")
class Empty(Struct):
    pass
@app.tool("t.x", description="x")
def x(args: Empty, ctx: Context) -> dict:
    with ctx.span("inner", k=1) as span:
        span.add_event("e")
    return {{"recording": span.is_recording()}}
ctx = Context(app, 1, 0, threading.Event())
res = tracing.run("t", "t.x", 1, {TP!r}, None, ctx, lambda: app.execute("t.x", b"{{}}", ctx))
print(json.dumps({{"ok": res.ok, "data": json.loads(bytes(res.data))}}))
"""
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(out.stdout) == {"ok": True, "data": {"recording": False}}
    assert "OpenTelemetry is not installed" in out.stderr


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (TP, (0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, True)),
        (TP[:-2] + "00", (0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, False)),
        ("00-" + "0" * 32 + "-b7ad6b7169203331-01", None),  # all-zero trace id
        ("00-0af7651916cd43dd8448eb211c80319c-" + "0" * 16 + "-01", None),
        ("ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", None),
        ("00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01", None),  # uppercase
        ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x", None),
        ("garbage", None),
        ("", None),
    ],
)
def test_parse_traceparent(value, expected):
    assert parse_traceparent(value) == expected


def test_sampling_rules_match_the_sdk_samplers():
    if os.environ.get("CI") != "true":  # CI installs the otel extra: never skip there
        pytest.importorskip("opentelemetry.sdk", reason="the toolhost[otel] extra is not installed")
    from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

    on = Sampling({})
    assert on.fast and on.parent_based and on.decide(1, None)
    assert on.decide(1, False) is False and on.decide(1, True) is True
    ratio = Sampling(
        {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01"}
    )
    assert ratio.bound == TraceIdRatioBased(0.01).bound
    assert ratio.decide(ratio.bound - 1, None) and not ratio.decide(ratio.bound, None)
    assert ratio.decide(ratio.bound, True)  # parent-based: the parent wins
    off = Sampling({"OTEL_TRACES_SAMPLER": "always_off"})
    assert not off.parent_based and not off.decide(1, True)
    other = Sampling({"OTEL_TRACES_SAMPLER": "jaeger_remote"})
    assert not other.fast  # left to the SDK
    assert (
        Sampling({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "x"}).ratio
        == 1.0
    )
    tp = unsampled_traceparent(0xABC)
    parsed = parse_traceparent(tp)
    assert parsed is not None and parsed[0] == 0xABC and parsed[2] is False
