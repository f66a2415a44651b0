"""simple-json scripts (PROTOCOL 3.3, Fractalic): autodiscovery, the ``{"__test__": true}`` probe
and ``--fractalic-dump-schema``, unavailable-with-reason for scripts that fail the probe, calls with
the input as the single argument, registry override, reload."""

import os
import shutil

import msgspec
import trio

from supervisor.calls.call import InvokeRequest
from tests.conftest import (
    FIXTURES,
    echo,
    pid_alive,
    raw,
    running_host,
    wait_available,
    wait_for,
)

AUTO = FIXTURES.parent / "auto"


def install(app, names, folder="tools/auto"):
    target = app / folder
    target.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy2(AUTO / name, target / name)
    return target


def generous(folder="tools/auto", **extra):
    # A loaded CI machine can take longer than Fractalic's 200 ms to start Python.
    return {"path": folder, "probeTimeoutMs": 5000, **extra}


async def test_fractalic_template_is_probed_described_and_called(app):
    install(app, ["fractalic_template.py", "hello.sh"])
    async with running_host(app, {}, autodiscover=[generous()]) as host:
        await wait_available(host, "fractalic_template", "hello")
        d = host.catalog.get("fractalic_template")
        assert d.sidecar == "auto:tools/auto" and d.protocol == "simple-json"
        assert d.description == "Tool description"  # from --fractalic-dump-schema
        assert d.inputSchema["required"] == ["action"]
        assert d.inputSchema["properties"]["action"]["enum"] == ["example"]
        assert d.stability.probe == "healthy" and d.stability.runtime == "ready"
        assert d.stability.details.path.command == "./tools/auto/fractalic_template.py"
        env = await host.invoker.invoke(
            InvokeRequest("fractalic_template", raw({"action": "example", "param": "x"}))
        )
        assert env.status == "success"
        assert msgspec.json.decode(env.data) == {"result": "success", "data": "x"}
        # The template's own error convention: {"error": ...} (exit 0 here) is failed.
        env = await host.invoker.invoke(
            InvokeRequest("fractalic_template", raw({"action": "dance"}))
        )
        assert env.status == "failed" and env.error.code == "failed"
        assert env.content == "Unknown action: dance"
        # A shell script works the same way.
        env = await host.invoker.invoke(InvokeRequest("hello", raw({"name": "sh"})))
        assert env.status == "success"
        assert msgspec.json.decode(env.data) == {"hello": {"name": "sh"}}
        assert host.catalog.get("hello").description == "Say hello from sh"


async def test_scripts_that_fail_the_probe_are_unavailable_with_reasons(app):
    install(app, ["fractalic_template.py"])
    install(app, ["slow_probe.py", "not_json.py"], folder="tools/slow")
    auto = [generous(), {"path": "tools/slow", "probeTimeoutMs": 400}]
    async with running_host(app, {}, autodiscover=auto) as host:
        await wait_available(host, "fractalic_template")

        def probed():
            slow, junk = host.catalog.get("slow_probe"), host.catalog.get("not_json")
            return (
                slow.stability.probe == "unavailable"
                and junk.stability.probe == "unavailable"
                and (slow, junk)
            )

        slow, junk = await wait_for(host, probed)
        for d in (slow, junk):
            assert d.stability.effective == "unavailable" and not d.visible
            assert d.stability.runtime == "ready"
        (reason,) = slow.stability.reasons
        assert reason.field == "probe" and reason.code == "probe-timeout"
        assert "within 400 ms" in reason.message and "probeTimeoutMs" in reason.hint
        (reason,) = junk.stability.reasons
        assert reason.code == "probe-not-json" and "not JSON" in reason.message
        assert "chatty script" in reason.message
        env = await host.invoker.invoke(InvokeRequest("slow_probe", raw({})))
        assert env.status == "unavailable" and env.error.code == "not-visible"
        assert env.error.details["reasons"][0]["code"] == "probe-timeout"
        assert {d.name for d in host.catalog.visible()} == {"fractalic_template"}


async def test_non_zero_exit_is_failed_with_stderr_and_data(app):
    install(app, ["failing.py"])
    async with running_host(app, {}, autodiscover=[generous()]) as host:
        await wait_available(host, "failing")
        d = host.catalog.get("failing")
        assert d.inputSchema == {"type": "object", "additionalProperties": True}  # no dump
        env = await host.invoker.invoke(InvokeRequest("failing", raw({"x": 1})))
        assert env.status == "failed" and env.error.code == "failed"
        assert env.error.exitCode == 3 and "cannot frobnicate" in env.error.stderr
        assert msgspec.json.decode(env.data) == {"partial": [1, 2]}
        assert not pid_alive(env.meta.pid)


async def test_registry_entry_overrides_a_discovered_tool(app):
    install(app, ["fractalic_template.py", "hello.sh"])
    (app / "tools" / "auto" / "echo.say.py").write_text("print('{}')\n")
    async with running_host(
        app, {"echo": echo(tools=["echo.say"])}, autodiscover=[generous()]
    ) as host:
        await wait_available(host, "echo.say", "hello")
        d = host.catalog.get("echo.say")
        assert d.sidecar == "echo" and d.protocol == "process-json"
        env = await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": "registry wins"})))
        assert env.content == "registry wins"
        errors = host.views.snapshot().registry.errors
        assert any("echo.say is served by sidecar echo" in e for e in errors)


async def test_registry_simple_json_entry(app):
    install(app, ["fractalic_template.py"], folder="scripts")
    entry = {
        "command": "python",
        "args": ["scripts/fractalic_template.py"],
        "protocol": "simple-json",
        "tools": ["template.run"],
        "probe": {"timeoutMs": 5000},
    }
    async with running_host(app, {"tpl": entry}) as host:
        await wait_available(host, "template.run")
        assert host.catalog.get("template.run").description == "Tool description"
        env = await host.invoker.invoke(InvokeRequest("template.run", raw({"action": "example"})))
        assert msgspec.json.decode(env.data) == {"result": "success", "data": "default"}


async def test_reload_picks_up_a_new_script_and_keeps_unchanged_folders(app):
    install(app, ["fractalic_template.py"])
    async with running_host(app, {}, autodiscover=[generous()]) as host:
        await wait_available(host, "fractalic_template")
        result = await host.reload()
        assert result.unchanged == ["auto:tools/auto"]
        install(app, ["hello.sh"])
        result = await host.reload()
        assert result.restarted == ["auto:tools/auto"]
        await wait_available(host, "fractalic_template", "hello")


SLEEPY = """
import json, subprocess, sys, time
if sys.argv[1] == '{"__test__": true}':
    print(json.dumps({"success": True}))
    sys.exit(0)
args = json.loads(sys.argv[1])
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", args["tag"]])
time.sleep(3600)
"""


def tagged(tag: str) -> list[int]:
    """Pids whose command line ends with ``tag`` (the script, confined, writes no pid file)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if len(argv) > 1 and argv[-2] == tag.encode():
                found.append(int(entry))
    return found


async def test_deadline_kills_the_script_group_and_big_input_is_refused(app):
    folder = app / "tools" / "auto"
    folder.mkdir(parents=True)
    (folder / "sleepy.py").write_text(SLEEPY)
    tag = f"sleepy-{os.getpid()}-{id(app)}"
    async with running_host(app, {}, autodiscover=[generous()]) as host:
        await wait_available(host, "sleepy")
        out = {}

        async def call() -> None:
            out["env"] = await host.invoker.invoke(
                InvokeRequest("sleepy", raw({"tag": tag}), timeout_ms=3000)
            )

        async with trio.open_nursery() as n:
            n.start_soon(call)
            with trio.fail_after(3):
                while not tagged(tag):
                    await trio.sleep(0.02)
            [grandchild] = tagged(tag)
        env = out["env"]
        assert env.status == "failed" and env.error.code == "timeout"
        with trio.fail_after(10):
            while pid_alive(grandchild):
                await trio.sleep(0.05)
        env = await host.invoker.invoke(InvokeRequest("sleepy", raw({"blob": "x" * 300_000})))
        assert env.status == "failed" and env.error.code == "invalid-input"
        assert "too large" in env.error.message
        assert host.pools["auto:tools/auto"].statistics().restarts == 0
