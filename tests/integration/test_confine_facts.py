"""Issue 28, what an operator sees (PROTOCOL 7): ``required`` on a kernel that cannot enforce a
profile makes its tools ``sandbox: denied`` before any call (no worker started); a confined
sidecar that hits its walls fails with the grant that would allow it in its envelope; egress
bytes in ``system.stats``; the confinement in ``toolhost status`` and ``toolhost doctor``;
per-call workers' facts read from their processes. Real host, real processes, real kernel."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from supervisor.calls.call import InvokeRequest
from supervisor.cli import doctor, doctor_confine
from supervisor.cli.prometheus import exposition
from supervisor.cli.render import stats_text, status_text
from supervisor.contracts.confine import KernelFacts
from supervisor.host.host import build_host
from supervisor.host.loading import HostOptions
from tests.conftest import echo, raw, running_host, wait_available, wait_for, write_registry
from tests.integration.confine_kit import HOSTILE, KERNEL, need
from tests.integration.test_confine_host import TOOL, entry, http_server, world
from tests.kernel import served

DENIED = str(HOSTILE.parent / "denied_sidecar.py")
OLD_KERNEL = KernelFacts(landlock_abi=5, seccomp=True, arch="x86_64", root=True, netns="root")
"""Linux 6.10: Landlock without signal scoping (ABI 6)."""


@asynccontextmanager
async def host_on(
    app: Path, sidecars: dict[str, Any], kernel: KernelFacts | None = None, **host_cfg: Any
) -> AsyncIterator[Any]:
    """A host on ``sidecars`` (``kernel``: describe another kernel to its confiner)."""
    write_registry(app, sidecars, host={"zygote": {"enabled": False}, **host_cfg})
    host = await build_host(
        HostOptions(app_root=str(app), use_global=False, manifest_dirs=[], seed=1)
    )
    if kernel is not None:
        host.confiner.probe = lambda: kernel
    async with trio.open_nursery() as nursery:
        await nursery.start(host.run)
        try:
            yield host
        finally:
            host.stop()
            with trio.move_on_after(15):
                await host.wait_stopped()
            nursery.cancel_scope.cancel()


def denied_entry(marks: Path, **more: Any) -> dict[str, Any]:
    """The sidecar leaves a mark in ``marks`` (granted for writing) when it starts at all: a
    denied sidecar must never start."""
    marks.mkdir(exist_ok=True)
    confine = {"write": [str(marks)], **more.pop("confine", {})}
    return {
        "command": "python",
        "args": [DENIED],
        "tools": ["denied.read", "denied.fetch"],
        "env": {"DENIED_MARKER": str(marks / "started")},
        "restart": {"backoffMs": 20, "maxBackoffMs": 200},
        "confine": confine,
        **more,
    }


async def test_required_on_a_kernel_that_cannot_enforce_the_profile_denies_before_any_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = world(tmp_path, monkeypatch)
    marks = tmp_path / "marks"
    async with host_on(
        w["app"], {"denied": denied_entry(marks)}, OLD_KERNEL, confinement="required"
    ) as host:
        d = host.catalog.get("denied.read")
        st = d.stability
        assert (st.sandbox, st.effective, d.visible) == ("denied", "unavailable", False)
        assert st.runtime == "failed"  # not "starting": nothing ever will
        assert [(r.field, r.code) for r in st.reasons] == [("sandbox", "confinement-unavailable")]
        assert "signal and abstract-socket scoping" in st.reasons[0].message
        assert "Linux 6.12" in st.reasons[0].hint and "best-effort" in st.reasons[0].hint
        env = await host.invoker.invoke(InvokeRequest("denied.read", raw({"path": "/etc/hosts"})))
        assert env.status == "unavailable", env
        status = next(s for s in host.views.sidecar_statuses() if s.id == "denied")
        assert status.confinement == "denied"
        assert any("confinement-unavailable" in e for e in status.errors), status.errors
        text = status_text(host.views.snapshot())
        row = next(line for line in text.splitlines() if line.startswith("denied "))
        assert "denied" in row.split()[1:]
        rep = doctor_confine.report(host, "denied")
        assert rep is not None and rep.label == "denied" and "Linux 6.12" in rep.denied
        assert any("denied:" in line for line in doctor_confine.render(rep))
        health = host.views.health()
        assert health.sidecars.unavailable == 1
        # a restart request starts nothing either
        assert not await host.start_sidecar("denied")
        assert "denied" not in host.pools
    assert not (marks / "started").exists()


async def test_required_on_a_kernel_that_can_enforce_it_starts_confined(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = KERNEL.landlock_abi >= 6 and KERNEL.seccomp and KERNEL.arch and KERNEL.netns
    if not (full and (KERNEL.pids_cgroup or not KERNEL.root)):
        pytest.skip("this kernel cannot enforce the whole strict profile (the test above)")
    w = world(tmp_path, monkeypatch)
    marks = tmp_path / "marks"
    async with host_on(w["app"], {"denied": denied_entry(marks)}, confinement="required") as host:
        await wait_available(host, "denied.read", timeout=40)
        assert host.catalog.get("denied.read").stability.sandbox == "allowed"
    assert (marks / "started").exists()


async def test_a_confined_sidecar_that_hits_its_walls_is_told_which_grant_would_allow_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    need(KERNEL.landlock_abi >= 6, "Landlock ABI 6 (Linux 6.12)")
    need(bool(KERNEL.seccomp and KERNEL.arch and KERNEL.netns), "seccomp and namespaces")
    w = world(tmp_path, monkeypatch)
    outside = tmp_path / "outside"
    outside.mkdir()
    planted = outside / "data.txt"
    planted.write_text("planted")
    allowed, other = http_server(), http_server()
    a, o = allowed.server_address[1], other.server_address[1]
    e = denied_entry(tmp_path / "marks", confine={"network": {"allow": [f"127.0.0.1:{a}"]}})
    try:
        async with host_on(w["app"], {"denied": e}, confinement="best-effort") as host:
            await wait_available(host, "denied.read", timeout=40)

            async def call(tool: str, args: dict[str, Any]) -> Any:
                return await host.invoker.invoke(InvokeRequest(tool, raw(args)))

            # a file outside every grant: an ordinary EACCES, and the grant that would allow it
            env = await call("denied.read", {"path": str(planted)})
            assert env.status == "failed", env
            assert "Permission denied" in env.error.message
            hint = f"confine.read would allow {planted}"
            assert hint in env.error.message
            assert any(hint in h for h in env.error.details["confinement"]["hints"])
            # a secret: no grant allows it, and the envelope says so
            env = await call("denied.read", {"path": str(w["key"])})
            assert env.status == "failed"
            assert f"{w['key']} is never granted" in env.error.message
            assert "confine.read would" not in env.error.message
            # a destination the proxy refuses: its 403's rule is in the envelope
            env = await call("denied.fetch", {"url": f"http://127.0.0.1:{o}/"})
            assert env.status == "failed" and "403" in env.error.message, env
            assert f"the egress proxy refused 127.0.0.1:{o}" in env.error.message
            assert f'confine.network.allow "127.0.0.1:{o}" would allow it' in env.error.message
            env = await call("denied.fetch", {"url": f"http://127.0.0.1:{a}/"})
            assert env.status == "success", env
            # egress bytes per sidecar in system.stats, over the kernel socket
            with trio.move_on_after(5):  # a record is made when its connection closes
                while host.egress.statistics()["denied"].connections < 1:
                    await trio.sleep(0.02)
            async with served(host, w["app"]) as srv, srv.peer("unix-json") as kernel:
                got = await kernel.request(1, "system.stats", {})
            egress = got["result"]["sidecars"]["denied"]["egress"]
            assert egress["connections"] == 1 and egress["refused"] == 1, egress
            assert egress["bytesIn"] > 0 and egress["bytesOut"] > 0
            row = next(x for x in stats_text(got["result"]).splitlines() if x.startswith("denied"))
            assert f"{egress['bytesIn']}/{egress['bytesOut']} (1 refused)" in row
            metrics = exposition(got["result"])
            line = 'toolhost_sidecar_egress_bytes_total{sidecar="denied",direction="in"} '
            assert line + str(egress["bytesIn"]) in metrics
            assert (
                'toolhost_sidecar_egress_connections_total{sidecar="denied",allowed="false"} 1'
                in metrics
            )
            # toolhost status and doctor: the walls read from the worker
            status = next(s for s in host.views.sidecar_statuses() if s.id == "denied")
            assert status.confinement == "fs+proxy+seccomp"
            assert "fs+proxy+seccomp" in status_text(host.views.snapshot())
            rep = doctor_confine.report(host, "denied")
            assert rep is not None and rep.source == "worker"
            assert rep.profile["network"] == {"allow": [f"127.0.0.1:{a}"], "loopback": []}
            lines = "\n".join(doctor_confine.render(rep))
            assert "enforced (read from its worker): fs+proxy+seccomp" in lines
            assert "profile: project read" in lines
            # widen the profile as the hint says: the same read succeeds
            write_registry(
                w["app"],
                {
                    "denied": {
                        **e,
                        "confine": {**e["confine"], "read": [str(outside)]},
                    }
                },
                host={"zygote": {"enabled": False}, "confinement": "best-effort"},
            )
            result = await host.reload()
            assert result.restarted == ["denied"], result
            await wait_available(host, "denied.read", timeout=40)
            env = await call("denied.read", {"path": str(planted)})
            assert env.status == "success", env
            assert msgspec.json.decode(env.data) == {"text": "planted"}
    finally:
        allowed.shutdown()
        other.shutdown()


@pytest.mark.parametrize("mode", ["oneshot", "simple"])
async def test_per_call_workers_show_the_walls_read_from_their_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    need(KERNEL.landlock_abi >= 6, "Landlock ABI 6 (Linux 6.12)")
    need(bool(KERNEL.seccomp and KERNEL.arch and KERNEL.netns), "seccomp and namespaces")
    w = world(tmp_path, monkeypatch)
    tool = TOOL[mode]
    async with host_on(w["app"], {"hostile": entry(mode)}, confinement="best-effort") as host:
        await wait_available(host, tool, timeout=40)
        env = await host.invoker.invoke(
            InvokeRequest(tool, raw({"attacks": {"key": {"kind": "read", "path": str(w["key"])}}}))
        )
        assert env.status == "success", env
        text = json.dumps(msgspec.json.decode(env.data) if env.data else env.content)
        assert "EACCES" in text

        def facts() -> Any:
            d = host.catalog.get(tool)
            return d.stability.details.confinement if d is not None else None

        got = await wait_for(host, facts, timeout=10, what="confinement facts")
        assert got.mode == "best-effort"
        assert (got.filesystem, got.network, got.syscalls) == ("enforced", "isolated", "filtered")
        assert got.no_new_privs
        status = next(s for s in host.views.sidecar_statuses() if s.id == "hostile")
        assert status.confinement == "fs+net+seccomp"


async def test_doctor_says_which_grant_a_sidecar_that_cannot_start_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    need(KERNEL.landlock_abi >= 6, "Landlock ABI 6 (Linux 6.12)")
    w = world(tmp_path, monkeypatch)
    outside = tmp_path / "outside"
    outside.mkdir()
    e = denied_entry(tmp_path / "marks")
    e["env"] = {"DENIED_MARKER": str(outside / "started")}  # not granted: it cannot start
    write_registry(w["app"], {"denied": e}, host={"confinement": "best-effort"})
    options = HostOptions(
        app_root=str(w["app"]),
        use_global=False,
        manifest_dirs=[],
        restart_policy="never",
        audit=False,
    )
    report = await doctor.examine(options, 30)
    rep = next(s for s in report.sidecars if s.id == "denied")
    assert not rep.ok and rep.confinement is not None
    assert rep.confinement.label == "fs+net+seccomp"
    hint = f"confine.read would allow {outside / 'started'}"
    assert any(hint in h for h in rep.confinement.hints), rep.confinement.hints
    assert f"fix (its stderr shows the walls refused it): {hint}" in doctor.render(report)
    assert not (outside / "started").exists()


async def test_a_reload_that_changes_host_confinement_denies_or_starts_the_sidecar(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    need(KERNEL.landlock_abi >= 5, "Landlock ABI 5")
    w = world(tmp_path, monkeypatch)
    marks = tmp_path / "marks"
    e = denied_entry(marks)

    def registry(mode: str) -> None:
        write_registry(
            w["app"], {"denied": e}, host={"zygote": {"enabled": False}, "confinement": mode}
        )

    async with host_on(w["app"], {"denied": e}, OLD_KERNEL, confinement="best-effort") as host:
        await wait_available(host, "denied.read", timeout=40)  # best-effort: what it can
        assert (marks / "started").exists()
        (marks / "started").unlink()
        registry("required")
        result = await host.reload()
        assert result.applied and "denied" not in host.pools
        d = host.catalog.get("denied.read")
        assert (d.stability.sandbox, d.stability.effective) == ("denied", "unavailable")
        assert [r.code for r in d.stability.reasons] == ["confinement-unavailable"]
        assert not (marks / "started").exists()
        registry("best-effort")
        await host.reload()
        await wait_available(host, "denied.read", timeout=40)
        assert host.catalog.get("denied.read").stability.sandbox == "allowed"
        assert (marks / "started").exists()


async def test_a_oneshot_call_that_hits_its_walls_names_the_grant_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    need(KERNEL.landlock_abi >= 6, "Landlock ABI 6 (Linux 6.12)")
    w = world(tmp_path, monkeypatch)
    planted = tmp_path / "outside" / "data.txt"
    planted.parent.mkdir()
    planted.write_text("planted")
    e = denied_entry(tmp_path / "marks", mode="oneshot")
    async with host_on(w["app"], {"denied": e}, confinement="best-effort") as host:
        await wait_available(host, "denied.read", timeout=40)
        env = await host.invoker.invoke(InvokeRequest("denied.read", raw({"path": str(planted)})))
        assert env.status == "failed", env
        assert f"confine.read would allow {planted}" in env.error.message
        # the call's process reported its walls: the descriptor shows them
        d = host.catalog.get("denied.read")
        facts = d.stability.details.confinement
        assert facts is not None and facts.filesystem == "enforced", d.stability.details


async def test_sidecar_logs_name_the_grant_its_stderr_shows_was_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    need(KERNEL.landlock_abi >= 6, "Landlock ABI 6 (Linux 6.12)")
    w = world(tmp_path, monkeypatch)
    outside = tmp_path / "outside"
    outside.mkdir()
    e = denied_entry(tmp_path / "marks")
    e["env"] = {"DENIED_MARKER": str(outside / "started")}  # not granted: it cannot start
    async with (
        host_on(w["app"], {"denied": e}, confinement="best-effort") as host,
        served(host, w["app"]) as srv,
    ):

        def failed() -> bool:
            d = host.catalog.get("denied.read")
            return d is not None and d.stability.runtime == "failed"

        await wait_for(host, failed, timeout=40, what="the start to fail")
        async with srv.peer("unix-json") as kernel:
            got = await kernel.request(1, "sidecar.logs", {"sidecar": "denied"})
    result = got["result"]
    assert "Permission denied" in result["stderr"]
    hint = f"confine.read would allow {outside / 'started'}"
    assert any(hint in h for h in result["confinement"]["hints"]), result.get("confinement")


@pytest.mark.parametrize(("project", "warned"), [(".", True), ("workspace", False)])
async def test_a_project_dir_at_the_app_root_is_warned_about_when_confined(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, project: str, warned: bool
) -> None:
    """Landlock grants the app root entry by entry around ``.toolhost/``: confined sidecars
    cannot list its top or create anything there; the operator is told at load, with the fix."""
    app = tmp_path / "app"
    (app / "workspace").mkdir(parents=True)
    host_cfg = {"confinement": "best-effort", "projectDir": project}
    with caplog.at_level("WARNING"):
        async with running_host(app, {}, host=host_cfg):
            pass
    said = [
        r.getMessage() for r in caplog.records if "projectDir is the app root" in r.getMessage()
    ]
    assert bool(said) is warned, said
    if warned:
        assert '"workspace"' in said[0] and str(app) in said[0]


@pytest.mark.parametrize("project", [".", "workspace"])
async def test_family_folders_are_made_at_load_only_on_a_carved_project(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, project: str
) -> None:
    """``confine.folders`` (the computer and browser families' ``screenshots``) are made at load
    where nothing new can be made at the project's top (the app root), and only there; a name
    that is host-private is refused and logged."""
    app = tmp_path / "app"
    (app / "workspace").mkdir(parents=True)
    confine = {"project": "write", "folders": ["shots", ".toolhost"]}
    host_cfg = {"confinement": "best-effort", "projectDir": project}
    with caplog.at_level("WARNING"):
        async with running_host(app, {"e": echo(confine=confine)}, host=host_cfg):
            pass
    carved = project == "."
    assert (app / "shots").is_dir() is carved
    assert not (app / "workspace" / "shots").exists()
    said = " ".join(r.getMessage() for r in caplog.records)
    assert ("confine.folders '.toolhost'" in said) is carved


async def test_a_grant_of_a_file_that_does_not_exist_yet_is_named_at_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Landlock grants what it can open: a ``confine.write`` of a log file the sidecar creates
    later grants nothing. The plan's ``refused`` (``toolhost doctor``) and the log say so, with
    the fix; a file that exists is granted and not named."""
    app = tmp_path / "app"
    app.mkdir()
    absent, present = tmp_path / "later.log", tmp_path / "there.log"
    present.touch()
    reg = {"e": echo(confine={"write": [str(absent), str(present)]})}
    with caplog.at_level("WARNING"):
        async with running_host(app, reg, host={"confinement": "best-effort"}) as host:
            plan = host.confiner.plans["e"]
    named = [r for r in plan.refused if "does not exist at load" in r]
    assert len(named) == 1 and named[0].startswith(f"{absent}: confine.write"), plan.refused
    assert "create it before the host starts" in named[0]
    assert str(present) in plan.write
    assert any(named[0] in r.getMessage() for r in caplog.records)
