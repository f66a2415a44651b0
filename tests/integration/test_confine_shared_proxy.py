"""Issue 28, the fallback without network namespaces (a normal user where user namespaces are
off, as on distributions that restrict them): a sidecar with ``network.allow`` runs in the host's
network, its Landlock TCP rule lets it connect only to the egress proxy's shared loopback port,
and it proves who it is with a token of its own in the proxy URL. Through the real host: the
allowed server is reached through the proxy (audited, counted), another is refused ``403``, a
direct connection is refused by the walls, and each worker's token dies with the worker.

The kernel here can make namespaces, so the host's confiner is told it cannot (``netns=""``);
every wall that remains is real."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from tests.conftest import wait_available, wait_for
from tests.integration.confine_kit import KERNEL, need
from tests.integration.test_confine_facts import host_on
from tests.integration.test_confine_host import (
    egress_lines,
    entry,
    http_server,
    reach_through_proxy,
    world,
)

NO_NAMESPACES = msgspec.structs.replace(KERNEL, netns="")


async def test_without_namespaces_the_proxy_is_reached_by_token_and_nothing_else_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    need(KERNEL.landlock_abi >= 4, "Landlock TCP rules (ABI 4, Linux 6.7)")
    need(bool(KERNEL.seccomp and KERNEL.arch), "seccomp filters on x86_64/aarch64")
    w = world(tmp_path, monkeypatch)
    allowed, other = http_server(), http_server()
    a, o = allowed.server_address[1], other.server_address[1]
    e = entry("persistent")
    e["confine"] = {"network": {"allow": [f"127.0.0.1:{a}"]}}
    try:
        async with host_on(
            w["app"],
            {"hostile": e},
            NO_NAMESPACES,
            confinement="best-effort",
            auditLog=".toolhost/audit.jsonl",
        ) as host:
            await wait_available(host, "hostile.attack")
            plan = host.confiner.plans["hostile"]
            assert plan.netns == "" and plan.network == "proxy"
            shared = host.egress.shared_port
            assert shared > 0
            data, stats = await reach_through_proxy(host, a, o)
            tokens = dict(host.egress._tokens)
            # One token, the live worker's; it dies with the worker.
            assert [c.sidecar for c in tokens.values()] == ["hostile"]
            assert await host.stop_sidecar("hostile")
            await wait_for(host, lambda: not host.egress._tokens, 15)
            if host.audit is not None:
                host.audit.flush()
    finally:
        allowed.shutdown()
        other.shutdown()
    assert data["allowed"] == "ok:200:hello"
    assert data["other"] == "HTTP 403"
    assert data["direct"] == "EACCES", data  # Landlock: only the proxy's port may be connected
    assert stats.connections == 1 and stats.refused == 1 and stats.bytes_in > 0
    egress = egress_lines(w["app"])
    assert sorted((x["allowed"], x["port"]) for x in egress) == [(False, o), (True, a)]
    assert {x["sidecar"] for x in egress} == {"hostile"}
