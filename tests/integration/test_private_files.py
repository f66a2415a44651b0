"""The audit log and the quota state are private (issue 12): an existing 0644 file is set to 0600
on open with a warning; another user's file is refused and the host says so."""

import logging
import os
import stat

import pytest

from supervisor.calls.call import InvokeRequest
from supervisor.private_files import NotPrivate, open_private
from tests.conftest import echo, raw, running_host, wait_available


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


async def test_existing_world_readable_audit_and_quota_state_become_0600(app, caplog):
    caplog.set_level(logging.WARNING, logger="toolhost.files")
    folder = app / ".toolhost"
    folder.mkdir(mode=0o700)
    audit = folder / "audit.jsonl"
    audit.write_text("")
    audit.chmod(0o644)
    state = folder / "quota-state.json"
    state.write_text('{"version": 1, "day": 0, "counts": {}}\n')
    state.chmod(0o644)
    cfg = echo(tools=["echo.say"], quota={"callsPerDay": 100})
    async with running_host(app, {"echo": cfg}) as host:
        await wait_available(host, "echo.say")
        env = await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": "x"})))
        assert env.status == "success"
        host.audit.flush()
        assert mode(audit) == 0o600 and audit.read_text().count("\n") == 1
        assert mode(state) == 0o600
    assert mode(state) == 0o600  # rewritten on the way out, still private
    messages = [r.getMessage() for r in caplog.records]
    assert any("audit.jsonl had mode 0644" in m for m in messages), messages
    assert any("quota-state.json had mode 0644" in m for m in messages), messages


def test_another_users_file_is_refused(tmp_path):
    if os.getuid() != 0:
        pytest.skip("chown to another user needs root")
    path = tmp_path / "audit.jsonl"
    path.write_text("")
    os.chown(path, 65534, 65534)
    with pytest.raises(NotPrivate, match="belongs to uid 65534"):
        open_private(str(path), os.O_WRONLY | os.O_APPEND)
