"""Replicas behind a real load balancer: three ``toolhost serve`` + ``toolhost mcp --http`` on one
machine behind HAProxy (round robin, health checks on ``/readyz``), driven by the official SDK
client in the stateless era. 3,000 ``tools/call`` spread over the replicas; one replica killed
with SIGKILL in the middle. Every call is answered (a result, or an error the client can retry:
never a hang past its deadline), the calls before the kill reached every replica, and the calls
after it succeed on the two left."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp.shared.exceptions import MCPError

from tests.conftest import echo, free_port, write_registry
from tests.e2e.conftest import serve, stop
from tests.e2e.mcp_client import http_client_in, start_http

pytestmark = pytest.mark.slow

HAPROXY = shutil.which("haproxy") or (
    "/usr/sbin/haproxy" if os.path.exists("/usr/sbin/haproxy") else None
)
CI = os.environ.get("CI") == "true"
CALLS = 3000
KILL_AFTER = 1500
CONCURRENCY = 12
DEADLINE_S = 20.0
SETTLE_S = 4.0
"""After the kill: long enough for HAProxy's checks (every 0.5 s, 0.25 s once one failed; down
after 2 failures) and for the calls that were in flight on the killed replica to be answered."""
AFTER_MIN = 300
"""Calls started past the settle window that the drive waits for, however fast the machine: at
least ``CALLS`` calls are made, more when the ones after the kill all fit inside ``SETTLE_S``
(CI once ran its last 1,500 in under 4 s, and the test had nothing after the kill to judge)."""
MODERN = "2026-07-28"


@dataclass
class Replica:
    name: str
    root: Path
    host: subprocess.Popen[bytes]
    face: subprocess.Popen[bytes]
    url: str
    pid: int = 0
    """Its echo worker's pid (one worker per replica): which replica answered a call."""

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1].split("/", 1)[0])

    def kill(self) -> None:
        for proc in (self.face, self.host):
            proc.send_signal(signal.SIGKILL)
        for proc in (self.face, self.host):
            proc.wait()


def _drain(proc: subprocess.Popen[bytes]) -> None:
    """Read a process's stderr to its end in a thread, so a chatty one never blocks on it."""
    stream = proc.stderr
    if stream is not None:
        threading.Thread(target=lambda: stream.read(), daemon=True).start()


@contextmanager
def _replicas(tmp: Path, token: str, count: int = 3) -> Iterator[list[Replica]]:
    with ExitStack() as stack:
        replicas = []
        for i in range(count):
            root = tmp / f"r{i}"
            root.mkdir()
            write_registry(
                root,
                {"echo": echo(tools=["echo.say"], env={"ECHO_CONCURRENCY": "8"})},
            )
            private = root / ".toolhost"
            private.mkdir(mode=0o700)
            (private / "mcp.token").write_text(token + "\n")
            os.chmod(private / "mcp.token", 0o600)
            host = stack.enter_context(serve(root))
            _drain(host)
            face, url = start_http(root)
            stack.callback(stop, face)
            _drain(face)
            replicas.append(Replica(f"r{i}", root, host, face, url))
        yield replicas


HAPROXY_CONFIG = """
global
    maxconn 2048
defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    timeout check 3s
    retries 3
    option redispatch
frontend mcp
    bind 127.0.0.1:{port}
    default_backend replicas
backend replicas
    balance roundrobin
    option httpchk GET /readyz
    http-check expect status 200
    default-server inter 500ms fastinter 250ms fall 2 rise 2
{servers}
"""


@contextmanager
def _haproxy(tmp: Path, replicas: list[Replica]) -> Iterator[str]:
    assert HAPROXY is not None
    port = free_port()
    servers = "\n".join(f"    server {r.name} 127.0.0.1:{r.port} check" for r in replicas)
    config = tmp / "haproxy.cfg"
    config.write_text(HAPROXY_CONFIG.format(port=port, servers=servers))
    check = subprocess.run([HAPROXY, "-c", "-f", str(config)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    proc = subprocess.Popen(
        [HAPROXY, "-db", "-f", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _drain(proc)
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, "haproxy exited"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "haproxy did not listen"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(proc)


@dataclass
class Outcome:
    started: float
    ended: float
    pid: int | None = None
    error: str | None = None


async def _ready(url: str) -> None:
    """Until ``/readyz`` answers 200 (the host behind it listens, its sidecars are up)."""
    async with httpx2.AsyncClient(timeout=5) as http:
        with anyio.fail_after(60):
            while True:
                try:
                    r = await http.get(url.replace("/mcp", "/readyz"))
                    if r.status_code == 200:
                        return
                except httpx2.TransportError:
                    pass
                await anyio.sleep(0.1)


async def _drive(url: str, token: str, victim: Replica) -> tuple[list[Outcome], float]:
    outcomes: list[Outcome] = []
    inflight: dict[int, Outcome] = {}
    killed_at = 0.0
    issued = 0
    done = 0
    killed = anyio.Event()
    late = 0  # calls started past the settle window

    def more() -> bool:
        return issued < CALLS or not killed.is_set() or late < AFTER_MIN

    def answered(n: int, outcome: Outcome) -> None:
        nonlocal done, killed_at
        inflight.pop(n, None)
        outcomes.append(outcome)
        done += 1
        if done == KILL_AFTER and not killed.is_set():
            victim.kill()
            killed_at = time.monotonic()
            killed.set()

    async def session() -> None:
        async with http_client_in(url, token, mode="auto") as client:
            assert client.protocol_version == MODERN  # the stateless era, through the balancer

            async def caller() -> None:
                nonlocal issued, late
                while more():
                    issued += 1
                    n = issued
                    outcome = Outcome(started=time.monotonic(), ended=0.0)
                    if killed.is_set() and outcome.started > killed_at + SETTLE_S:
                        late += 1
                    inflight[n] = outcome
                    try:
                        with anyio.fail_after(DEADLINE_S + 5):  # a hang fails the test
                            result = await client.call_tool(
                                "echo.say", {"text": f"call {n}"}, read_timeout_seconds=DEADLINE_S
                            )
                        if result.is_error:
                            outcome.error = f"isError: {result.content}"
                        else:
                            assert result.structured_content["text"] == f"call {n}"
                            outcome.pid = result.structured_content["pid"]
                    except MCPError as exc:  # the balancer's 502 or the like: the client may retry
                        outcome.error = f"MCPError {exc.error.code}: {exc}"
                    outcome.ended = time.monotonic()
                    answered(n, outcome)

            async with anyio.create_task_group() as tg:
                for _ in range(CONCURRENCY):
                    tg.start_soon(caller)

    while more():
        try:
            await session()
        except* httpx2.TransportError as group:
            # A connection the replica's death cut under a request: the SDK's client does not
            # survive its transport failing, so, as a real client would, this one reconnects;
            # the calls it had in flight got an error it can retry (none hung).
            now = time.monotonic()
            for n, outcome in list(inflight.items()):
                outcome.error = f"transport: {group.exceptions[0]!r}"
                outcome.ended = now
                answered(n, outcome)
    assert len(outcomes) == issued  # every call answered
    return outcomes, killed_at


@pytest.mark.skipif(
    HAPROXY is None and not CI,
    reason="haproxy is not installed (apt-get install haproxy); CI installs it (.ci/run)",
)
def test_three_replicas_behind_haproxy_one_killed(tmp_path):
    assert HAPROXY is not None, "CI must install haproxy (.ci/run)"
    token = "replica-token-" + os.urandom(8).hex()
    with _replicas(tmp_path, token) as replicas, _haproxy(tmp_path, replicas) as url:

        async def main() -> tuple[list[Outcome], float]:
            for replica in replicas:  # which echo worker is whose
                await _ready(replica.url)
                async with http_client_in(replica.url, token, mode="auto") as direct:
                    said = await direct.call_tool("echo.say", {"text": "who"})
                    replica.pid = said.structured_content["pid"]
            await _ready(url)
            return await _drive(url, token, replicas[1])

        outcomes, killed_at = anyio.run(main)

    failures = sum(o.error is not None for o in outcomes)
    print(
        f"{len(outcomes)} calls, {failures} failed around the kill, "
        f"slowest {max(o.ended - o.started for o in outcomes):.2f} s"
    )
    assert len(outcomes) >= CALLS
    slowest = max(o.ended - o.started for o in outcomes)
    assert slowest < DEADLINE_S, f"a call took {slowest:.1f} s"
    by_pid = {r.pid: r.name for r in replicas}
    assert len(by_pid) == 3
    before = [o for o in outcomes if o.ended < killed_at]
    after = [o for o in outcomes if o.started > killed_at + SETTLE_S]
    failed = [o for o in outcomes if o.error is not None]
    # Before the kill: the calls succeed and are spread over all three replicas.
    assert [o.error for o in before if o.error] == []
    spread = {by_pid[o.pid] for o in before if o.pid is not None}
    assert spread == {"r0", "r1", "r2"}
    # Around the kill: only calls in flight when it died may fail (MCP or transport errors).
    assert all(killed_at - 1 < o.ended and o.started < killed_at + SETTLE_S for o in failed)
    assert len(failed) <= CONCURRENCY, [o.error for o in failed]
    # After it: every call succeeds, on the two replicas left.
    assert len(after) >= AFTER_MIN
    assert [o.error for o in after if o.error] == []
    assert {by_pid[o.pid] for o in after if o.pid is not None} == {"r0", "r2"}
