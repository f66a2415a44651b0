"""OpenTelemetry end to end: a running host exports over OTLP/HTTP to a loopback collector of the
test (tests/otlp_receiver.py decodes the protobuf with opentelemetry-proto).

A kernel call with ``trace.traceparent`` makes an ``execute_tool`` span in that trace, under the
request's SERVER span; a failed call carries ``error.type`` and status ERROR; the SDK sidecar's
span is the call span's child; a composite tool's child calls are children of its span; oneshot
workers get ``TRACEPARENT``; MCP servers get a CLIENT span; a collector that is down or hangs
loses no call and adds no latency; with telemetry off no exporter thread exists and no span is
made.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import threading

import msgspec
import pytest
import trio

from supervisor.calls.call import InvokeRequest
from supervisor.host.vault import Vault, vault_path
from tests.conftest import echo, raw, running_host, script, wait_available, write_registry
from tests.e2e.conftest import serve
from tests.kernel import served

try:
    import opentelemetry.proto
    import opentelemetry.sdk  # noqa: F401
except ImportError:
    if os.environ.get("CI") == "true":  # CI installs the extra: never skip there
        raise
    pytest.skip("the toolhost[otel] extra is not installed", allow_module_level=True)

from tests.otlp_receiver import Receiver, start_receiver

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
ON = {"telemetry": {"enabled": True}}


@pytest.fixture
def collector(monkeypatch):
    rec, server = start_receiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rec.endpoint)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
    try:
        yield rec
    finally:
        rec.release()
        server.shutdown()
        server.server_close()


def sidecars():
    return {
        "echo": echo(tools=["echo.say", "echo.fail", "echo.sleep"]),
        "traced": script("traced", ["traced.composite", "traced.async", "traced.fail"]),
    }


async def wait_spans(rec: Receiver, pred, what: str, timeout: float = 30):
    return await trio.to_thread.run_sync(lambda: rec.wait(pred, timeout, what))


def otel_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("Otel")}


async def test_kernel_call_joins_the_callers_trace_down_to_the_sidecar(app, collector):
    async with running_host(app, sidecars(), host=ON) as host:
        await wait_available(host, "echo.say", "traced.composite")
        async with served(host, app) as srv, srv.peer("unix-json") as peer:
            resp = await peer.request(
                7,
                "tools.invoke",
                {
                    "tool": "echo.say",
                    "input": {"text": "hi"},
                    "trace": {"traceparent": TRACEPARENT},
                },
            )
            assert resp["result"]["status"] == "success"
            pid = resp["result"]["meta"]["pid"]

            def found(r):
                call = [s for s in r.named("execute_tool echo.say") if s.trace_id == TRACE_ID]
                sdk = [s for s in r.named("tool echo.say") if s.trace_id == TRACE_ID]
                return (call[0], sdk[0]) if call and sdk else None

            call, sdk = await wait_spans(collector, found, "the call's and the sidecar's spans")
            (server,) = [s for s in collector.named("tools.invoke") if s.trace_id == TRACE_ID]
            assert server.kind == 2 and server.parent_id == PARENT_ID  # SERVER, under the caller
            assert server.attributes["jsonrpc.request.id"] == "7"
            assert call.kind == 1 and call.parent_id == server.span_id  # INTERNAL
            a = call.attributes
            assert a["gen_ai.operation.name"] == "execute_tool"
            assert a["gen_ai.tool.name"] == "echo.say"
            assert a["gen_ai.tool.type"] == "extension"
            assert a["gen_ai.tool.call.id"]
            assert a["toolhost.sidecar"] == "echo"
            assert a["toolhost.worker.pid"] == pid
            assert a["toolhost.attempts"] == 1
            assert a["toolhost.queue_ms"] >= 0
            assert "sent to worker" in call.events
            assert "error.type" not in a and not call.is_error
            # Inputs and outputs are not attributes unless the operator opts in.
            assert "gen_ai.tool.call.arguments" not in a
            assert "gen_ai.tool.call.result" not in a
            # The SDK's span: the call span's child, exported by the sidecar under its own name.
            assert sdk.parent_id == call.span_id
            assert sdk.service == "echo"
            assert call.service == "toolhost"

            # A failed call: error.type is our code, the status ERROR.
            resp = await peer.request(
                8,
                "tools.invoke",
                {"tool": "echo.fail", "input": {"code": "unsupported"}},
            )
            assert resp["result"]["error"]["code"] == "unsupported"

            def failed(r):
                return r.named("execute_tool echo.fail")

            (bad,) = await wait_spans(collector, failed, "the failed call's span")
            assert bad.attributes["error.type"] == "unsupported" and bad.is_error
            assert bad.trace_id != TRACE_ID  # no trace given: a trace of its own
        # Metrics go out too (the periodic reader on its own thread).
        names = {"toolhost.call.duration", "toolhost.calls.in_flight", "toolhost.worker.starts"}
        await wait_spans(collector, lambda r: names <= r.metrics, "the metrics")


async def test_composite_tool_children_and_sdk_spans_nest(app, collector):
    async with running_host(app, sidecars(), host=ON) as host:
        await wait_available(host, "echo.say", "traced.composite", "traced.async")
        env = await host.invoker.invoke(InvokeRequest("traced.composite", raw({})))
        assert env.status == "success", env
        env = await host.invoker.invoke(InvokeRequest("traced.async", raw({})))
        assert env.status == "success", env

        def found(r):
            parent = r.named("execute_tool traced.composite")
            if not parent:
                return None
            tid = parent[0].trace_id
            kids = [s for s in r.named("execute_tool echo.say") if s.trace_id == tid]
            tool = [s for s in r.named("tool traced.composite") if s.trace_id == tid]
            own = [s for s in r.named("traced.prepare") if s.trace_id == tid]
            leaf = [s for s in r.named("tool echo.say") if s.trace_id == tid]
            inner = r.named("traced.async.inner")
            if len(kids) == 2 and tool and own and len(leaf) == 2 and inner:
                return parent[0], kids, tool[0], own[0], leaf, inner[0]
            return None

        parent, kids, tool, own, leaf, inner = await wait_spans(
            collector, found, "the composite call's tree"
        )
        # The child calls (tools.invoke from the worker) are children of the parent call span,
        # and each child's worker span is under its own call span.
        assert {k.parent_id for k in kids} == {parent.span_id}
        assert all(k.attributes["toolhost.parent.call.id"] for k in kids)
        assert {s.parent_id for s in leaf} == {k.span_id for k in kids}
        # The SDK wrapped the tool in a span under the call span; ctx.span nests under that.
        assert tool.parent_id == parent.span_id
        assert own.parent_id == tool.span_id and own.attributes["step"] == 1
        (async_tool,) = [s for s in collector.named("tool traced.async")]
        assert inner.parent_id == async_tool.span_id


async def test_oneshot_workers_get_traceparent_and_mcp_servers_a_client_span(app, collector):
    from tests.integration.test_mcp import fixture_server

    regs = {
        "one": script("echo", ["echo.say"], mode="oneshot"),
        "fx": fixture_server(),
    }
    async with running_host(app, regs, host=ON) as host:
        await wait_available(host, "echo.say", "whoami")
        env = await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": "x"})))
        assert env.status == "success", env
        env = await host.invoker.invoke(InvokeRequest("whoami", raw({})))
        assert env.status == "success", env

        def found(r):
            call = r.named("execute_tool echo.say")
            sdk = r.named("tool echo.say")
            mcp_call = r.named("execute_tool whoami")
            client = r.named("tools/call whoami")
            if call and sdk and mcp_call and client:
                return call[0], sdk[0], mcp_call[0], client[0]
            return None

        call, sdk, mcp_call, client = await wait_spans(collector, found, "oneshot and MCP spans")
        # The oneshot SDK process read TRACEPARENT from its environment.
        assert sdk.parent_id == call.span_id and sdk.trace_id == call.trace_id
        # The MCP client span (semantic conventions for MCP) is under the call span.
        assert client.kind == 3 and client.parent_id == mcp_call.span_id
        assert client.attributes["mcp.method.name"] == "tools/call"
        assert client.attributes["network.transport"] == "pipe"
        assert client.attributes["gen_ai.tool.name"] == "whoami"


async def test_a_collector_that_is_down_or_hangs_costs_no_call(app, collector, monkeypatch):
    """Export runs on the SDK's own thread: calls complete while the collector hangs, and none
    is lost; then with a collector refusing connections."""
    async with running_host(app, {"echo": echo(tools=["echo.say"])}, host=ON) as host:
        await wait_available(host, "echo.say")
        collector.hang()
        envs = []
        for i in range(20):
            envs.append(await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": str(i)}))))
        # The exporter is stuck in a request the collector holds open ...
        await wait_spans(collector, lambda r: r.requests >= 1, "an export request")
        # ... on a thread of its own, while every call above completed.
        assert any(t.name.startswith("OtelBatchSpan") for t in otel_threads())
        more = []
        async with trio.open_nursery() as nursery:

            async def one(i: int) -> None:
                more.append(
                    await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": str(i)})))
                )

            for i in range(40):
                nursery.start_soon(one, i)
        assert [e.status for e in envs + more] == ["success"] * 60
        collector.release()

    # Connection refused: a port nobody listens on.
    with trio.socket.socket() as s:
        await s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{dead}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2")
    async with running_host(app, {"echo": echo(tools=["echo.say"])}, host=ON) as host:
        await wait_available(host, "echo.say")
        assert host.telemetry is not None
        t0 = trio.current_time()
        async with trio.open_nursery() as nursery:
            results = []

            async def call(i: int) -> None:
                results.append(
                    await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": str(i)})))
                )

            for i in range(64):
                nursery.start_soon(call, i)
        assert [e.status for e in results] == ["success"] * 64
        # Generous: 64 echo calls take well under a second; an exporter blocking the loop on
        # its connect retries would take many seconds.
        assert trio.current_time() - t0 < 20


async def test_telemetry_off_makes_no_thread_and_no_span(app, collector):
    before = otel_threads()
    async with running_host(app, {"echo": echo(tools=["echo.say", "echo.env"])}) as host:
        await wait_available(host, "echo.say")
        assert host.telemetry is None and host.invoker.telemetry is None
        calls = []
        real_start = host.invoker.engine.begin

        def spy(call):
            calls.append(call)
            real_start(call)

        host.invoker.engine.begin = spy
        env = await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": "quiet"})))
        assert env.status == "success"
        assert calls and all(c.trace is None for c in calls)
        assert otel_threads() - before == set()
        # The worker got no telemetry settings from the host.
        env = await host.invoker.invoke(InvokeRequest("echo.env", raw({})))
        seen = msgspec.json.decode(bytes(env.data))
        assert "TOOLHOST_TELEMETRY" not in str(seen) and "TRACEPARENT" not in str(seen)
    assert collector.requests == 0 and collector.spans == []


async def test_otel_sdk_disabled_wins_over_the_registry(app, collector, monkeypatch):
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    before = otel_threads()
    async with running_host(app, {"echo": echo(tools=["echo.say"])}, host=ON) as host:
        await wait_available(host, "echo.say")
        assert host.telemetry is None
        env = await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": "quiet"})))
        assert env.status == "success"
        assert otel_threads() - before == set()
    assert collector.spans == []


async def test_capture_content_opt_in_records_input_and_output(app, collector):
    on = {"telemetry": {"enabled": True, "captureContent": True}}
    async with running_host(app, {"echo": echo(tools=["echo.say"])}, host=on) as host:
        await wait_available(host, "echo.say")
        env = await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": "visible"})))
        assert env.status == "success"
        (span,) = await wait_spans(
            collector, lambda r: r.named("execute_tool echo.say"), "the call span"
        )
        assert msgspec.json.decode(span.attributes["gen_ai.tool.call.arguments"]) == {
            "text": "visible"
        }
        assert span.attributes["gen_ai.tool.call.result"] == "visible"


@pytest.mark.parametrize("mode", ["embedded", "adopted"])
def test_mcp_face_call_with_meta_traceparent_joins_that_trace(app, collector, mode):
    """``toolhost mcp --embedded`` over stdio, and a stdio session a running ``toolhost serve``
    adopted: ``_meta.traceparent`` on ``tools/call`` makes the MCP SERVER span its child, and the
    host's spans follow under it."""
    write_registry(app, {"echo": echo(tools=["echo.say"])}, host=ON)
    with contextlib.ExitStack() as stack:
        if mode == "adopted":
            stack.enter_context(serve(app))
        _traced_mcp_call(app, collector, "--embedded" if mode == "embedded" else "--no-global")


def _traced_mcp_call(app, collector, flag: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "supervisor", "mcp", flag, "--app-root", str(app)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "XDG_CONFIG_HOME": str(app / ".xdg")},
    )
    assert proc.stdin is not None and proc.stdout is not None

    def rpc(msg: dict) -> dict | None:
        proc.stdin.write(json.dumps(msg).encode() + b"\n")
        proc.stdin.flush()
        if "id" not in msg:
            return None
        while True:
            line = proc.stdout.readline()
            assert line, "toolhost mcp closed its stdout"
            answer = json.loads(line)
            if answer.get("id") == msg["id"]:
                return answer

    try:
        init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t"}}
        assert "result" in rpc({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init})
        rpc({"jsonrpc": "2.0", "method": "notifications/initialized"})
        answer = rpc(
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {
                    "name": "echo.say",
                    "arguments": {"text": "via mcp"},
                    "_meta": {"traceparent": TRACEPARENT},
                },
            }
        )
        assert answer is not None and answer["result"]["isError"] is False, answer

        def found(r):
            mine = [s for s in r.spans if s.trace_id == TRACE_ID]
            names = {s.name: s for s in mine}
            wanted = ("tools/call echo.say", "tools.invoke", "execute_tool echo.say")
            return names if all(n in names for n in wanted) else None

        spans = collector.wait(found, 60, "the MCP face's spans in the caller's trace")
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    server = spans["tools/call echo.say"]
    assert server.kind == 2 and server.parent_id == PARENT_ID
    a = server.attributes
    assert a["mcp.method.name"] == "tools/call" and a["network.transport"] == "pipe"
    assert a["jsonrpc.request.id"] == "2" and a["gen_ai.tool.name"] == "echo.say"
    assert spans["tools.invoke"].parent_id == server.span_id
    assert spans["execute_tool echo.say"].parent_id == spans["tools.invoke"].span_id


async def test_an_unsampled_caller_gets_no_spans_but_the_trace_flag_travels(app, collector):
    """Parent-based sampling: a ``traceparent`` with the sampled flag off makes no span in the
    host or the sidecar; the worker still gets the trace (flag off) in its ``call``."""
    unsampled = TRACEPARENT[:-2] + "00"
    regs = {"echo": echo(tools=["echo.say", "echo.env"])}
    async with running_host(app, regs, host=ON) as host:
        await wait_available(host, "echo.say")
        async with served(host, app) as srv, srv.peer("unix-json") as peer:
            for rid in range(3):
                resp = await peer.request(
                    rid,
                    "tools.invoke",
                    {
                        "tool": "echo.say",
                        "input": {"text": "x"},
                        "trace": {"traceparent": unsampled},
                    },
                )
                assert resp["result"]["status"] == "success"
            # A sampled call after them: once it is exported, the others would have been too.
            resp = await peer.request(
                9, "tools.invoke", {"tool": "echo.say", "input": {"text": "y"}}
            )
            assert resp["result"]["status"] == "success"
        await wait_spans(
            collector,
            lambda r: r.named("execute_tool echo.say") and r.named("tool echo.say"),
            "the sampled call's spans",
        )
        assert [s for s in collector.spans if s.trace_id == TRACE_ID] == []
        assert len(collector.named("execute_tool echo.say")) == 1


async def test_json_logs_tag_a_sidecar_line_with_its_call_and_trace(app, collector, tmp_path):
    """``host.logFormat: json``: a stderr line written while one traced call runs on the worker
    is forwarded with the sidecar, pid, tool, callId and the call span's trace and span ids."""
    marker = tmp_path / "seen"
    got: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage() == "traced.log says hello":
                got.append(record)
                marker.write_text("x")

    handler = Keep()
    sidecar_log = logging.getLogger("toolhost.sidecar")
    sidecar_log.addHandler(handler)
    sidecar_log.setLevel(logging.INFO)
    try:
        regs = {"traced": script("traced", ["traced.log"])}
        async with running_host(app, regs, host={**ON, "logFormat": "json"}) as host:
            await wait_available(host, "traced.log")
            env = await host.invoker.invoke(
                InvokeRequest("traced.log", raw({"marker": str(marker)}))
            )
            assert env.status == "success" and msgspec.json.decode(env.data) == {"seen": True}
            (call_span,) = await wait_spans(
                collector, lambda r: r.named("execute_tool traced.log"), "the call span"
            )
    finally:
        sidecar_log.removeHandler(handler)
    (rec,) = got
    fields = rec.__dict__
    assert fields["sidecar"] == "traced" and fields["stream"] == "stderr"
    assert fields["pid"] == env.meta.pid and fields["tool"] == "traced.log"
    assert fields["callId"] == int(call_span.attributes["gen_ai.tool.call.id"])
    assert fields["trace_id"] == call_span.trace_id and fields["span_id"] == call_span.span_id


async def test_a_remote_mcp_server_call_is_an_mcp_client_span_over_tcp(app, collector, tmp_path):
    from tests.integration.test_mcp_http import entry, http_server

    with http_server(tmp_path) as server:
        await server.listening()
        async with running_host(app, {"remote": entry(server.port)}, host=ON) as host:
            await wait_available(host, "whoami")
            env = await host.invoker.invoke(InvokeRequest("whoami", raw({})))
            assert env.status == "success", env
            session = host.pools["remote"].workers[0].session

            def found(r):
                call, client = r.named("execute_tool whoami"), r.named("tools/call whoami")
                return (call[0], client[0]) if call and client else None

            call, client = await wait_spans(collector, found, "the MCP HTTP client span")
    assert client.kind == 3 and client.parent_id == call.span_id
    assert client.attributes["network.transport"] == "tcp"
    # server/discover answered: the stateless era has no session, so the span names none.
    assert session is None and "mcp.session.id" not in client.attributes


async def test_sdk_spans_mask_a_vault_value_the_sidecar_fetched(app, collector):
    """A tool fetches a vault value through ``ctx.vault``, names a span after it, sets it as
    attributes and an event, and raises an exception holding it: the spans the sidecar exports
    hold it nowhere (span names, attributes, events, the exception event, the status)."""
    secret = "s3cr3t/Value+42"
    Vault(vault_path(str(app))).set("API_KEY", secret)
    entries = {
        "traced": script("traced", ["traced.leak"], vault=[{"key": "API_KEY"}]),
    }
    async with running_host(app, entries, host=ON) as host:
        await wait_available(host, "traced.leak")
        env = await host.invoker.invoke(InvokeRequest("traced.leak", raw({"key": "API_KEY"})))
        assert env.status == "failed" and "***" in env.error.message

        def found(r):
            tool = r.named("tool traced.leak")
            inner = [s for s in r.spans if s.name.startswith("traced.leak ")]
            return (tool[0], inner[0]) if tool and inner else None

        tool, inner = await wait_spans(collector, found, "the sidecar's spans")
    # The exception was recorded, the status is an error naming it, all of it masked.
    assert "exception" in inner.events and inner.is_error
    assert inner.name == "traced.leak ***" and inner.attributes["token"] == "***"
    assert tool.is_error and tool.status_message == "ValueError: upstream refused the token ***"
    assert tool.service == "traced"
    with collector.cond:
        bodies = b"".join(collector.bodies)
    assert b"upstream refused the token ***" in bodies  # the exception event's message
    assert secret.encode() not in bodies
