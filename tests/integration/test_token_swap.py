"""Issue 30 items 2 and 3: tokens and private files cannot be swapped under the host.

The operator token is read at start and at ``registry.reload`` only (a tool that rewrites the file
approves nothing); a symlinked token, audit log, vault or state file is refused and its target
left byte-identical (a dangling one is never created); an audit log deleted or replaced under a
running host is reopened with a line saying so."""

import json
import os
import stat

import pytest
import trio

from supervisor.calls.call import InvokeRequest
from tests.conftest import echo, raw, running_host, wait_available
from tests.integration.test_host_services import STATE, data, manifests, sidecars
from tests.kernel import served

REG = {"echo": echo(tools=["echo.say"], sandbox={"echo.say": "approval-required"})}
CALL = {"tool": "echo.say", "input": {"text": "approve me"}}
SYMLINK = "is a symlink; refusing to follow it"


def audit_lines(host, app):
    host.audit.flush()
    text = (app / ".toolhost" / "audit.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


async def one_pending(operator):
    with trio.fail_after(10):
        while True:
            got = (await operator.request("l", "approvals.list"))["result"]["pending"]
            if got:
                return got[0]["callId"]
            await trio.sleep(0.01)


async def decide(operator, call_id, token):
    params = {"callId": call_id, "by": "op", "token": token}
    return await operator.request("d", "approvals.decide", params)


def rewrite(path, text):
    """What ``data.convert {"output": ..., "overwrite": true}`` did: a new file at the path."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    tmp.chmod(0o600)
    os.replace(tmp, path)


async def test_a_token_rewritten_under_the_host_approves_nothing_until_reload(app):
    token_file = app / ".toolhost" / "operator.token"
    async with running_host(app, REG, host={"approvalSource": "operator"}) as host:
        await wait_available(host, "echo.say")
        async with (
            served(host, app) as srv,
            srv.peer("unix-json") as kernel,
            srv.peer("ws-json") as operator,
        ):
            results = []

            async def call():
                results.append((await kernel.request(1, "tools.invoke", CALL))["result"])

            async with trio.open_nursery() as nursery:
                nursery.start_soon(call)
                call_id = await one_pending(operator)
                original = token_file.read_text().strip()
                rewrite(token_file, "PWNED\n")
                refused = await decide(operator, call_id, "PWNED")
                assert refused["error"]["code"] == "unauthorized", refused
                granted = await decide(operator, call_id, original)
                assert granted["result"] == {"callId": call_id, "granted": True}
            assert results[0]["status"] == "success"

            # registry.reload reads the file again: the new token is in force, the old one not.
            reloaded = (await operator.request("r", "registry.reload"))["result"]
            assert not reloaded.get("errors"), reloaded
            async with trio.open_nursery() as nursery:
                nursery.start_soon(call)
                call_id = await one_pending(operator)
                refused = await decide(operator, call_id, original)
                assert refused["error"]["code"] == "unauthorized", refused
                granted = await decide(operator, call_id, "PWNED")
                assert granted["result"] == {"callId": call_id, "granted": True}
        changed = [x for x in audit_lines(host, app) if x.get("event") == "token-changed"]
        assert len(changed) == 1, changed
        assert changed[0]["token"] == "operator" and changed[0]["path"] == str(token_file)


@pytest.fixture(params=["elsewhere", "dangling"])
def target(request, tmp_path):
    """Where a planted symlink points: a 0644 file outside the app, or nothing."""
    path = tmp_path / "outside" / "target"
    path.parent.mkdir()
    if request.param == "elsewhere":
        path.write_text('{"shared": {"K": "outside"}}\n')
        path.chmod(0o644)
    return path


def snapshot(path):
    if not path.exists():
        return None
    st = path.lstat()
    return path.read_bytes(), stat.S_IMODE(st.st_mode), st.st_mtime_ns


@pytest.mark.parametrize("name", ["audit.jsonl", "operator.token"])
async def test_a_symlinked_audit_log_or_token_stops_the_host_at_start(app, target, name):
    folder = app / ".toolhost"
    folder.mkdir(mode=0o700)
    link = folder / name
    link.symlink_to(target)
    before = snapshot(target)
    refused = None
    try:
        async with running_host(app, REG, host={"approvalSource": "operator"}) as host:
            await wait_available(host, "echo.say")  # a fixed host never gets here
            await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": "x"})))
            host.audit.flush()
    except BaseException as exc:  # the start error, wrapped by the test's nursery
        refused = exc
    assert refused is not None, f"the host started with {name} a symlink"
    text = " ".join(str(e) for e in _leaves(refused))
    assert f"{link} {SYMLINK}" in text, text
    assert snapshot(target) == before  # same bytes and mode; a dangling target not created
    assert link.is_symlink()


def _leaves(exc):
    if isinstance(exc, BaseExceptionGroup):
        for sub in exc.exceptions:
            yield from _leaves(sub)
    else:
        yield exc


async def test_a_symlinked_vault_or_state_file_is_refused(app, target):
    folder = app / ".toolhost"
    folder.mkdir(mode=0o700)
    before = snapshot(target)
    for name in ("vault.json", "state.db"):
        (folder / name).symlink_to(target)
    requests = [
        {"method": "vault.get", "params": {"key": "K"}},
        {"method": "state.set", "params": {"name": "notes", "key": "n/a", "value": 1}},
    ]
    reg = sidecars(vault=[{"key": "K"}], **STATE)
    async with running_host(app, reg, manifest_dirs=manifests(app)) as host:
        await wait_available(host, "svc.run")
        env = await host.invoker.invoke(InvokeRequest("svc.run", raw({"requests": requests})))
        vault, state = data(env)["responses"]
    assert vault["error"]["code"] == "vault-insecure", vault
    assert f"{folder / 'vault.json'} {SYMLINK}" in vault["error"]["message"]
    assert "outside" not in json.dumps(vault)
    assert f"{folder / 'state.db'} {SYMLINK}" in state["error"]["message"], state
    assert snapshot(target) == before


async def test_an_audit_log_deleted_or_replaced_under_the_host_is_reopened(app):
    path = app / ".toolhost" / "audit.jsonl"
    async with running_host(app, {"echo": echo(tools=["echo.say"])}) as host:
        await wait_available(host, "echo.say")
        await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": "1"})))
        host.audit.flush()
        path.unlink()
        await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": "2"})))
        lines = audit_lines(host, app)
        assert [x.get("event") or x["tool"] for x in lines] == ["audit-reopened", "echo.say"]
        assert lines[0]["reason"] == "deleted" and lines[0]["path"] == str(path)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600

        rewrite(path, "")
        await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": "3"})))
        lines = audit_lines(host, app)
        assert [x.get("event") or x["tool"] for x in lines] == ["audit-reopened", "echo.say"]
        assert lines[0]["reason"] == "replaced"

        # Unchanged: no reopen line.
        await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": "4"})))
        assert [x.get("event") or x["tool"] for x in audit_lines(host, app)] == [
            "audit-reopened",
            "echo.say",
            "echo.say",
        ]
