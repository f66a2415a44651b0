"""Resource quotas and limits with real misbehaving sidecars: a memory hog, a CPU spinner, a
sidecar writing 10 MB, a forking one. Each is contained, the caller gets a structured result,
the worker is replaced, and a healthy sidecar next to it keeps serving throughout."""

import resource

import msgspec
import psutil
import trio

from supervisor.calls.call import InvokeRequest
from supervisor.processes.limits import MIN_LINE
from tests.conftest import bystander, echo, raw, running_host, script, wait_available, wait_for

HOG_TOOLS = ["hog.memory", "hog.leak", "hog.spin", "hog.big", "hog.fork", "hog.limits", "hog.ok"]
FAST = {"statsIntervalMs": 100}


def hog(**extra):
    return script("hog", HOG_TOOLS, **extra)


def sidecars(**extra):
    return {"good": echo(tools=["echo.say"]), "hog": hog(**extra)}


async def replaced(host, first_pid):
    """Wait until the hog sidecar serves again from a new worker."""
    await wait_for(
        host,
        lambda: any(w.state == "ready" and w.pid != first_pid for w in host.pools["hog"].workers),
    )
    env = await host.invoker.invoke(InvokeRequest("hog.ok", raw({})))
    assert env.status == "success" and env.meta.pid != first_pid
    return env.meta.pid


async def test_memory_over_rss_quota(app):
    async with running_host(app, sidecars(quota={"rssMb": 60}), host=FAST) as host:
        await wait_available(host, "echo.say", "hog.ok")
        first = host.pools["hog"].workers[0].pid
        async with bystander(host):
            with trio.fail_after(30):
                env = await host.invoker.invoke(
                    InvokeRequest("hog.memory", raw({"mb": 200}), timeout_ms=30_000)
                )
            assert env.status == "failed" and env.error.code == "quota-exceeded", env
            details = env.error.details
            assert details["rule"] == "rssMb" and details["limitMb"] == 60
            assert 60 < details["measuredMb"] < 200
            assert f"{details['measuredMb']} MB RSS" in env.error.message
            assert env.meta.pid == first
            await replaced(host, first)
        st = host.views.stats().sidecars["hog"]
        assert st.limitActions == {"rssMb": 1} and st.exits["quota-exceeded"] == 1
        assert st.peakRssBytes > 60 * 2**20
        assert host.views.stats().tools["hog.memory"].quotaExceeded == 1


async def test_idle_worker_over_rss_is_recycled_gracefully(app):
    async with running_host(app, sidecars(quota={"rssMb": 60}), host=FAST) as host:
        await wait_available(host, "echo.say", "hog.ok")
        first = host.pools["hog"].workers[0].pid
        env = await host.invoker.invoke(InvokeRequest("hog.leak", raw({"mb": 100})))
        assert env.status == "success"  # the call itself was fine; the leak stays behind
        await replaced(host, first)
        st = host.views.stats().sidecars["hog"]
        assert st.exits == {"recycled": 1} and st.limitActions == {"rssMb": 1}
        assert st.restarts == 0  # a graceful recycle is not charged to the restart policy


async def test_cpu_spin_over_per_call_quota(app):
    async with running_host(app, sidecars(quota={"cpuSecondsPerCall": 0.5}), host=FAST) as host:
        await wait_available(host, "echo.say", "hog.ok")
        first = host.pools["hog"].workers[0].pid
        async with bystander(host):
            with trio.fail_after(30):
                env = await host.invoker.invoke(
                    InvokeRequest("hog.spin", raw({"seconds": 60}), timeout_ms=60_000)
                )
            assert env.status == "failed" and env.error.code == "quota-exceeded", env
            d = env.error.details
            assert d["rule"] == "cpuSecondsPerCall" and d["enforcedBy"] == "sampling"
            assert d["limitSeconds"] == 0.5 and d["measuredSeconds"] > 0.5
            await replaced(host, first)
        # A call under the limit on the new worker is fine, and its CPU is accounted.
        env = await host.invoker.invoke(InvokeRequest("hog.spin", raw({"seconds": 0.05})))
        assert env.status == "success" and env.meta.cpuMs > 0
        st = host.views.stats()
        assert st.sidecars["hog"].limitActions == {"cpuSecondsPerCall": 1}
        assert st.tools["hog.spin"].cpuReportedCalls == 1
        assert st.tools["hog.spin"].cpuSampledSeconds > 0.4  # the spinner's share was sampled


async def test_cpu_rlimit_kills_a_per_call_process(app):
    spinner = script("spin_oneshot", ["spin.now"], mode="oneshot", quota={"cpuSecondsPerCall": 1})
    # A slow sampler: the kernel's RLIMIT_CPU must do the job on its own.
    async with running_host(
        app, {"good": echo(tools=["echo.say"]), "spin": spinner}, host={"statsIntervalMs": 600_000}
    ) as host:
        await wait_available(host, "echo.say", "spin.now")
        async with bystander(host):
            with trio.fail_after(30):
                env = await host.invoker.invoke(
                    InvokeRequest("spin.now", raw({"spin": True}), timeout_ms=60_000)
                )
            assert env.status == "failed" and env.error.code == "quota-exceeded", env
            assert env.error.details == {
                "rule": "cpuSecondsPerCall",
                "limitSeconds": 1,
                "enforcedBy": "rlimit",
            }
            assert env.error.exitCode == -24  # SIGXCPU
            env = await host.invoker.invoke(InvokeRequest("spin.now", raw({})))
            assert env.status == "success"


async def test_lifetime_cpu_rlimit_replaces_a_long_lived_worker(app):
    reg = sidecars(limits={"cpuSeconds": 1})
    async with running_host(app, reg, host={"statsIntervalMs": 600_000}) as host:
        await wait_available(host, "echo.say", "hog.ok")
        first = host.pools["hog"].workers[0].pid
        async with bystander(host):
            with trio.fail_after(30):
                env = await host.invoker.invoke(
                    InvokeRequest("hog.spin", raw({"seconds": 60}), timeout_ms=60_000)
                )
            assert env.status == "failed" and env.error.code == "quota-exceeded", env
            assert env.error.details == {"rule": "cpuSeconds", "limitSeconds": 1}
            assert "SIGXCPU" in env.error.message
            await replaced(host, first)
        assert host.views.stats().sidecars["hog"].exits == {"quota-exceeded": 1}


async def test_ten_megabytes_of_output(app):
    reg = sidecars(quota={"maxOutputBytes": 100_000})
    async with running_host(app, reg, host=FAST) as host:
        await wait_available(host, "echo.say", "hog.ok")
        me = psutil.Process()
        before = me.memory_info().rss
        first = host.pools["hog"].workers[0].pid
        limit = host.pools["hog"].workers[0].spec.max_line
        async with bystander(host):
            env = await host.invoker.invoke(InvokeRequest("hog.big", raw({"size": 10_000_000})))
            assert env.status == "failed" and env.error.code == "output-too-large", env
            assert limit == MIN_LINE  # 2 x maxOutputBytes + 64 KiB, at least MIN_LINE
            assert env.error.details == {"lineLimitBytes": limit}
            assert f"line longer than {limit} bytes" in env.error.message
            second = await replaced(host, first)
            # Under the line limit but over maxOutputBytes: cut, marked, same worker.
            env = await host.invoker.invoke(InvokeRequest("hog.big", raw({"size": 150_000})))
            assert env.status == "success" and env.meta.truncated
            assert "truncated by toolhost" in env.content
            assert len(env.content.encode()) + len(env.data) <= 100_000 + 200
            assert env.meta.pid == second
        # The host never held the 10 MB: reading stopped at the line limit.
        assert me.memory_info().rss - before < 48 * 2**20


async def test_output_is_capped_at_64_kib_by_default_and_a_sidecar_may_raise_it(app):
    reg = {"good": echo(tools=["echo.say"]), "hog": hog(maxOutputBytes=1 << 20)}
    async with running_host(app, reg) as host:
        await wait_available(host, "echo.say", "hog.big")
        text = "x" * 100_000  # content and data: 200 KB in all
        env = await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": text})))
        assert env.status == "success" and env.meta.truncated, env.meta
        assert env.meta.originalBytes is not None and env.meta.originalBytes > 200_000
        assert f"output was {env.meta.originalBytes} bytes, limit 65536]" in env.content
        assert len(env.content.encode()) + len(env.data) <= 65536 + 200
        wire = msgspec.json.decode(msgspec.json.encode(env))
        assert wire["meta"]["originalBytes"] == env.meta.originalBytes
        env = await host.invoker.invoke(
            InvokeRequest("hog.big", raw({"size": 300_000}))
        )  # its own cap: 1 MiB
        assert env.status == "success" and not env.meta.truncated, env.meta
        assert env.meta.originalBytes is None and len(env.data) > 300_000


async def test_forking_sidecar_is_capped_and_its_children_die(app):
    # The hog lists its children in the project: it is granted to write there.
    entries = sidecars(limits={"nproc": 3}, confine={"project": "write"})
    async with running_host(app, entries, host=FAST) as host:
        await wait_available(host, "echo.say", "hog.ok")
        first = host.pools["hog"].workers[0].pid
        async with bystander(host):
            with trio.fail_after(30):
                env = await host.invoker.invoke(
                    InvokeRequest("hog.fork", raw({"n": 6}), timeout_ms=30_000)
                )
            assert env.status == "failed" and env.error.code == "quota-exceeded", env
            d = env.error.details
            assert d["rule"] == "nproc" and d["limit"] == 3 and d["measured"] > 3
            await replaced(host, first)
        # the sampler may kill the worker before its sixth fork: every child it made must die
        children = [
            int(p) for p in (app / "workspace" / f"hog-children-{first}").read_text().split()
        ]
        assert len(children) > 3

        def gone():
            return not any(psutil.pid_exists(p) and _alive(p) for p in children)

        with trio.fail_after(10):
            while not gone():  # reaped by init; no event to wait on
                await trio.sleep(0.05)
        assert host.views.stats().sidecars["hog"].limitActions == {"nproc": 1}


def _alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


async def test_rlimits_are_applied_before_exec(app):
    limits = {"memoryMb": 2048, "nofile": 512, "nproc": 40, "cpuSeconds": 3600}
    async with running_host(app, {"hog": hog(limits=limits)}) as host:
        await wait_available(host, "hog.limits")
        env = await host.invoker.invoke(InvokeRequest("hog.limits", raw({})))
        got = msgspec.json.decode(env.data)
        assert got["RLIMIT_AS"] == [2048 << 20, 2048 << 20]
        assert got["RLIMIT_NOFILE"] == [512, 512]
        assert got["RLIMIT_CORE"] == [0, 0]
        assert got["RLIMIT_CPU"] == [3600, 3602]
        nproc = got["RLIMIT_NPROC"][0]
        hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
        assert nproc == hard or 40 + 64 < nproc < 40 + 64 + 100_000
