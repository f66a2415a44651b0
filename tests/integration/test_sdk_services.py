"""The SDK's side of host services: ``ctx.invoke``, ``ctx.state``, ``ctx.vault`` from sync and
async tools, through a running host; a clear error in oneshot mode."""

import base64
import json
import subprocess
import sys
import urllib.parse

import msgspec
import trio

from supervisor.calls.call import InvokeRequest
from supervisor.host.vault import Vault, vault_path
from tests.conftest import FIXTURES, echo, raw, ready_pids, running_host, script, wait_for
from tests.kernel import served

TOOLS = ["sdksvc.sync", "sdksvc.async"]


def entries(**extra):
    return {
        "svc": script(
            "sdk_services",
            TOOLS,
            state=[{"name": "notes", "keyPrefix": "n/"}],
            vault=[{"key": "TOKEN"}],
            **extra,
        ),
        "echo": echo(tools=["echo.say"]),
    }


def data(env):
    assert env.status == "success", env
    return msgspec.json.decode(bytes(env.data))


async def ready(host):
    await wait_for(host, lambda: ready_pids(host, "svc") and ready_pids(host, "echo"))


async def test_sync_and_async_tools_use_every_service(app):
    Vault(vault_path(str(app))).set("TOKEN", "tok-abcdef")
    async with running_host(app, entries()) as host:
        await ready(host)
        got = data(
            await host.invoker.invoke(
                InvokeRequest("sdksvc.sync", raw({"text": "one", "secret": "TOKEN"}))
            )
        )
        assert got["status"] == "success" and got["childData"]["text"] == "one"
        assert got["stored"] == {"text": "one"} and got["keys"] == ["n/a"]
        assert got["refused"] == "state-refused" and got["secretLength"] == 10
        got = data(
            await host.invoker.invoke(
                InvokeRequest("sdksvc.async", raw({"text": "two", "key": "n/b"}))
            )
        )
        assert got["status"] == "success" and got["childData"]["text"] == "two"
        assert got["stored"] == {"text": "two"} and got["casWrote"] is False
        assert got["keys"] == ["n/a", "n/b"]


async def test_compare_and_set_from_two_sdk_workers(app):
    async with running_host(
        app, entries(pool={"min": 2, "max": 2}, env={"SVC_CONCURRENCY": "1"})
    ) as host:
        await wait_for(host, lambda: len(ready_pids(host, "svc")) == 2 and ready_pids(host, "echo"))
        results = []

        async def one():
            results.append(
                data(
                    await host.invoker.invoke(
                        InvokeRequest("sdksvc.sync", raw({"increments": 200}), timeout_ms=120_000)
                    )
                )
            )

        async with trio.open_nursery() as n:
            n.start_soon(one)
            n.start_soon(one)
        assert len({r["pid"] for r in results}) == 2
        env = await host.invoker.invoke(InvokeRequest("sdksvc.async", raw({"key": "n/x"})))
        assert data(env)["status"] == "success"
        # the counter: read through a service call of its own
        store = host.services.store()
        assert msgspec.json.decode(store.get("notes\x1fshared:", "n/counter")) == 400


def test_oneshot_mode_says_services_need_a_persistent_worker(tmp_path):
    line = json.dumps({"tool": "sdksvc.sync", "input": {}, "cwd": str(tmp_path)})
    r = subprocess.run(
        [sys.executable, str(FIXTURES / "sdk_services.py")],
        input=line + "\n",
        capture_output=True,
        text=True,
        timeout=30,
    )
    answer = json.loads(r.stdout.splitlines()[0])
    assert answer["ok"] is False and answer["code"] == "unsupported"
    assert "persistent worker" in answer["error"]
    assert "Traceback" not in r.stderr


async def test_encoded_forms_of_a_vault_value_are_masked_in_the_envelope_the_kernel_gets(app):
    """A tool returns a handed-out value base64- (standard, URL-safe unpadded, inside ``Basic``
    credentials), hex- (both cases) and URL-encoded: the kernel's envelope holds none of it."""
    secret = "tok/en+v@lue=99"
    Vault(vault_path(str(app))).set("API_KEY", secret)
    entries = {"traced": script("traced", ["traced.encoded"], vault=[{"key": "API_KEY"}])}
    async with running_host(app, entries) as host:
        await wait_for(host, lambda: ready_pids(host, "traced"))
        async with served(host, app) as srv, srv.peer("unix-json") as peer:
            resp = await peer.request(
                1, "tools.invoke", {"tool": "traced.encoded", "input": {"key": "API_KEY"}}
            )
    env = resp["result"]
    assert env["status"] == "success", env
    assert env["data"] == {
        "b64": "***",
        "b64url": "***",
        "hex": "***",
        "HEX": "***",
        "url": "https://api.example/?token=***",
    }
    # "user:" and the value share the encoded text's groups: only what they mix stays.
    assert env["content"].startswith("Authorization: Basic dXNlcj")
    assert "***" in env["content"]
    raw = secret.encode()
    wire_text = json.dumps(resp)
    for form in (
        secret,
        base64.b64encode(raw).decode(),
        base64.b64encode(raw).decode().rstrip("="),
        base64.urlsafe_b64encode(raw).decode().rstrip("="),
        base64.b64encode(b"user:" + raw).decode()[8:-4],
        raw.hex(),
        raw.hex().upper(),
        urllib.parse.quote(secret, safe=""),
    ):
        assert form not in wire_text, form
