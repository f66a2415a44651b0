"""Per-tool manifest settings on the invoke path, whatever the protocol: ``timeoutMs``, and
``retry = {maxAttempts, backoffMs}`` for ``readOnly`` tools on ``worker-crashed`` / ``timeout``
only, with ``meta.attempts`` telling how many ran."""

import msgspec
import trio

from supervisor.calls.call import InvokeRequest
from tests.conftest import echo, raw, running_host, script, wait_available

FLY = ["fly.flaky", "fly.hang", "fly.fail"]

MANIFEST = """
sidecar = "fly"

[[tool]]
name = "fly.flaky"
readOnly = true
retry = { maxAttempts = 3, backoffMs = 20 }

[[tool]]
name = "fly.hang"
readOnly = true
timeoutMs = 400
retry = { maxAttempts = 2, backoffMs = 0 }

[[tool]]
name = "fly.fail"
readOnly = true
retry = { maxAttempts = 5, backoffMs = 0 }

[[tool]]
name = "echo.crash"
readOnly = false
retry = { maxAttempts = 3, backoffMs = 0 }
"""


def manifests(app):
    folder = app / "manifests-test"
    folder.mkdir()
    (folder / "fly.toml").write_text(MANIFEST)
    return [str(folder)]


async def test_read_only_tool_is_retried_after_a_crash(app):
    counters = app / "counters"  # the script counts its attempts there: granted, as it must be
    counters.mkdir()
    confine = {"write": [str(counters)]}
    sidecars = {"fly": script("flyflor", FLY, mode="oneshot", confine=confine)}
    async with running_host(app, sidecars, manifest_dirs=manifests(app)) as host:
        await wait_available(host, "fly.flaky")
        env = await host.invoker.invoke(
            InvokeRequest("fly.flaky", raw({"counter": str(counters / "c1"), "n": 3}))
        )
        assert env.status == "success" and env.meta.attempts == 3
        assert msgspec.json.decode(env.data) == {"attempt": 3}
        assert host.views.stats().sidecars["fly"].retries == 2
        # Out of attempts: the last failure is the answer, with the count.
        env = await host.invoker.invoke(
            InvokeRequest("fly.flaky", raw({"counter": str(counters / "c2"), "n": 10}))
        )
        assert env.status == "failed" and env.error.code == "worker-crashed"
        assert env.meta.attempts == 3
        assert "killed by SIGKILL" in env.error.message


async def test_a_timeout_ends_the_call_its_deadline_covers_every_attempt(app):
    sidecars = {"fly": script("flyflor", FLY, mode="oneshot")}
    async with running_host(app, sidecars, manifest_dirs=manifests(app)) as host:
        await wait_available(host, "fly.hang")
        t0 = trio.current_time()
        env = await host.invoker.invoke(InvokeRequest("fly.hang", raw({"pidfile": str(app / "p")})))
        assert env.status == "failed" and env.error.code == "timeout"
        assert "within 400 ms" in env.error.message  # the manifest's timeoutMs
        assert env.meta.attempts == 1  # one deadline per call: nothing is left for a retry
        assert trio.current_time() - t0 < 2


async def test_the_tool_s_own_failure_is_never_retried(app):
    sidecars = {"fly": script("flyflor", FLY, mode="oneshot")}
    async with running_host(app, sidecars, manifest_dirs=manifests(app)) as host:
        await wait_available(host, "fly.fail")
        env = await host.invoker.invoke(InvokeRequest("fly.fail", raw({"code": "failed"})))
        assert env.status == "failed" and env.meta.attempts == 1


async def test_a_tool_that_is_not_read_only_is_never_retried(app):
    sidecars = {"echo": echo(tools=["echo.crash", "echo.say"])}
    async with running_host(app, sidecars, manifest_dirs=manifests(app)) as host:
        await wait_available(host, "echo.crash")
        env = await host.invoker.invoke(InvokeRequest("echo.crash", raw({})))
        assert env.error.code == "worker-crashed" and env.meta.attempts == 1
        assert host.views.stats().sidecars["echo"].retries == 0
