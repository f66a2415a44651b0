"""The host's own process runs out of file descriptors (issue 12): the sampler skips its samples
with a log line, the accept loop backs off, existing clients and calls keep going, and it all
recovers when descriptors come back."""

import contextlib
import logging
import os
import resource

import trio

from supervisor.server.admission import ACCEPT_RETRY_S
from tests.conftest import echo, running_host, wait_available
from tests.kernel import served, unix_peer


async def poll(pred, timeout: float = 10):
    """Poll a condition nothing signals (a log line, a sample count) every 20 ms."""
    with trio.fail_after(timeout):
        while not pred():
            await trio.sleep(0.02)


@contextlib.contextmanager
def exhausted_fds(spare: int = 0):
    """Lower this process's soft RLIMIT_NOFILE and fill it; ``spare`` descriptors stay free."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    used = max(int(n) for n in os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (used + 64, hard))
    hogs: list[int] = []
    try:
        while True:
            try:
                hogs.append(os.open("/dev/null", os.O_RDONLY))
            except OSError:
                break
        for _ in range(spare):
            os.close(hogs.pop())
        yield hogs
    finally:
        for fd in hogs:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_sampler_accept_loop_and_calls_survive_emfile(app, caplog):
    caplog.set_level(logging.INFO)
    sidecars = {"echo": echo(tools=["echo.say"])}
    async with running_host(app, sidecars, host={"statsIntervalMs": 50}) as host:
        await wait_available(host, "echo.say")
        async with served(host, app) as srv, unix_peer(srv.sock) as peer:
            samples = host.usage.sampler.accounting.samples
            await poll(lambda: host.usage.sampler.accounting.samples > samples)
            late = None
            with exhausted_fds(spare=1):
                # A client connecting now is left in the backlog: the host cannot accept it.
                late = await trio.open_unix_socket(str(srv.sock))
                await poll(
                    lambda: any("cannot measure now" in r.getMessage() for r in caplog.records)
                )
                for i in range(5):  # the existing client and its calls are served throughout
                    resp = await peer.request(
                        i + 1, "tools.invoke", {"tool": "echo.say", "input": {"text": str(i)}}
                    )
                    assert resp["result"]["status"] == "success"
                # The accept loop retries every 0.1 s and says so once per interval, without
                # a traceback (trio's own loop logged every retry with one).
                await trio.sleep(5 * ACCEPT_RETRY_S)
                emfile = [r for r in caplog.records if "EMFILE" in r.getMessage()]
                assert len(emfile) == 1, [r.getMessage() for r in emfile]
                assert emfile[0].name == "toolhost.server" and emfile[0].exc_info is None
                assert "host's socket cannot accept" in emfile[0].getMessage()
            # Descriptors are back: the waiting client is accepted, the sampler measures again.
            from tests.kernel import UnixPeer

            async with late:
                waiting = UnixPeer(late)
                with trio.fail_after(10):
                    resp = await waiting.request(1, "system.health")
                assert resp["result"]["status"] == "ok"
            samples = host.usage.sampler.accounting.samples
            await poll(lambda: host.usage.sampler.accounting.samples > samples)
