"""Host services (PROTOCOL 3.5) end to end: a real worker asks the host for child calls, state
and secrets while one of its calls is in flight."""

import json
import os
import stat
from pathlib import Path

import msgspec
import trio

from supervisor.calls.call import InvokeRequest
from supervisor.host.vault import Vault, vault_path
from tests.conftest import (
    echo,
    raw,
    ready_pids,
    running_host,
    script,
    wait_available,
    wait_for,
)
from tests.kernel import served

MANIFEST = """
[[tool]]
name = "svc.compose"
requires = ["echo.say"]

[[tool]]
name = "svc.run"

[[tool]]
name = "svc.nest"
"""

SVC_TOOLS = ["svc.run", "svc.compose", "svc.nest"]


def manifests(app):
    folder = app / "manifests-test"
    folder.mkdir(exist_ok=True)
    (folder / "svc.toml").write_text(MANIFEST)
    return [str(folder)]


def svc(**extra):
    return script("services", SVC_TOOLS, **extra)


def sidecars(**svc_extra):
    return {"svc": svc(**svc_extra), "echo": echo(tools=["echo.say", "echo.sleep"])}


def data(env):
    assert env.status == "success", env
    return msgspec.json.decode(bytes(env.data))


def invoke(tool, input, **more):
    return {"method": "tools.invoke", "params": {"tool": tool, "input": input, **more}}


APPROVED = {"granted": True, "by": "test"}


async def test_composite_child_calls_pass_the_gates_and_are_audited(app):
    entries = {
        "svc": svc(sandbox={"svc.compose": "approval-required"}),
        "echo": echo(tools=["echo.say", "echo.sleep"], sandbox={"echo.say": "approval-required"}),
        "other": echo(tools=["echo.fail"], sandbox="approval-required"),
    }
    async with running_host(
        app, entries, manifest_dirs=manifests(app), host={"auditLog": ".toolhost/audit.jsonl"}
    ) as host:
        await wait_available(host, "svc.compose", "echo.fail")
        from supervisor.contracts.rpc import Approval

        env = await host.invoker.invoke(
            InvokeRequest(
                "svc.compose",
                raw(
                    {
                        "requests": [
                            invoke("echo.say", {"text": "covered"}),  # in requires: covered
                            invoke("echo.fail", {}),  # not in requires: refused
                            invoke("no.such.tool", {}),
                        ]
                    }
                ),
                approval=Approval(granted=True, by="alice"),
                client="k1",
            )
        )
        covered, refused, unknown = (r["result"] for r in data(env)["responses"])
        assert covered["status"] == "success" and covered["data"]["text"] == "covered"
        assert refused["status"] == "unavailable"
        assert refused["error"]["code"] == "approval-required"
        assert unknown["error"]["code"] == "unknown-tool"
        assert host.views.stats().sidecars["svc"].hostRequests == 3
        host.audit.flush()
        lines = [json.loads(x) for x in (app / ".toolhost/audit.jsonl").read_text().splitlines()]
        parent = next(x for x in lines if x["tool"] == "svc.compose")
        children = [x for x in lines if x.get("via") == f"svc.compose#{parent['callId']}"]
        assert sorted(c["tool"] for c in children) == ["echo.fail", "echo.say", "no.such.tool"]
        assert sorted(parent["children"]) == sorted(f"{c['tool']}#{c['callId']}" for c in children)
        assert parent["requests"] == 3 and parent["approval"]["by"] == "alice"
        assert next(c for c in children if c["tool"] == "echo.say")["approval"]["by"] == "alice"


async def test_depth_is_one_and_bad_requests_get_error_responses(app):
    async with running_host(app, sidecars(), manifest_dirs=manifests(app)) as host:
        await wait_available(host, "svc.run", "echo.say")
        nested = {"requests": [invoke("svc.run", {})]}
        env = await host.invoker.invoke(
            InvokeRequest("svc.run", raw({"requests": [invoke("svc.nest", nested)]}))
        )
        # svc.nest is served by the same one-slot worker: refused before it could deadlock
        (resp,) = data(env)["responses"]
        assert resp["error"]["code"] == "would-deadlock"
        bad = [
            '{"type":"request","id":"x1","callId":999,"method":"state.get","params":{}}',
            '{"type":"request","id":"x2"}',
            '{"type":"request","id":"x3","callId":1,"method":"no.such"}',
        ]
        env = await host.invoker.invoke(InvokeRequest("svc.run", raw({"raw": bad})))
        codes = [r["error"]["code"] for r in data(env)["responses"]]
        assert codes == ["unknown-call", "invalid-request", "unknown-call"]
        # the worker's own call id: unknown method; malformed params: invalid-request
        env = await host.invoker.invoke(
            InvokeRequest(
                "svc.run",
                raw(
                    {
                        "requests": [
                            {"method": "no.such", "params": {}},
                            {"method": "tools.invoke", "params": {"tool": 5}},
                        ]
                    }
                ),
            )
        )
        codes = [r["error"]["code"] for r in data(env)["responses"]]
        assert codes == ["unknown-method", "invalid-request"]
        assert (
            await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": "still fine"})))
        ).status == "success"


async def test_nesting_refused_at_depth_two(app):
    # Two workers: the child svc.nest runs on the second one, and asks for a grandchild.
    async with running_host(app, {"svc": svc(pool={"min": 2, "max": 2})}) as host:
        await wait_for(host, lambda: len(ready_pids(host, "svc")) == 2)
        env = await host.invoker.invoke(
            InvokeRequest(
                "svc.run",
                raw({"requests": [invoke("svc.nest", {"requests": [invoke("svc.run", {})]})]}),
            )
        )
        (child,) = data(env)["responses"]
        child_env = child["result"]
        assert child_env["status"] == "success"
        (grandchild,) = child_env["data"]["responses"]
        assert grandchild["error"]["code"] == "nesting-refused"


async def test_child_deadline_and_cancel_with_the_parent(app):
    async with running_host(app, sidecars(), manifest_dirs=manifests(app)) as host:
        await wait_available(host, "svc.run", "echo.sleep")
        async with served(host, app) as srv, srv.peer("unix-json") as peer:
            await peer.send(
                {
                    "id": 1,
                    "method": "tools.invoke",
                    "params": {
                        "tool": "svc.run",
                        "input": {"requests": [invoke("echo.sleep", {"seconds": 30})]},
                    },
                }
            )
            with trio.fail_after(10):  # the child reaches the echo worker (no host event for it)
                while host.pools["echo"].workers[0].inflight != 1:
                    await trio.sleep(0.01)
            await peer.send({"id": 2, "method": "tools.cancel", "params": {"id": 1}})
            got = {}
            with trio.fail_after(10):
                while len(got) < 2:
                    msg = await peer.recv()
                    got[msg.get("id")] = msg
            assert got[2]["result"] == {"cancelled": True}
            assert got[1]["result"]["error"]["code"] == "cancelled"
        # the child was cancelled with its parent: nothing is left running or queued
        await wait_for(
            host, lambda: host.invoker.engine.calls == {} and not host.pools["echo"].inflight
        )
        stats = host.views.stats()
        assert stats.tools["echo.sleep"].cancels == 1
        # a child's deadline never outlives its parent's
        env = await host.invoker.invoke(
            InvokeRequest(
                "svc.run",
                raw({"requests": [invoke("echo.sleep", {"seconds": 5}, timeoutMs=60_000)]}),
                timeout_ms=600,
            )
        )
        assert env.error.code == "timeout"
        await wait_for(
            host,
            lambda: (
                stats_of(host, "echo.sleep").timeouts + stats_of(host, "echo.sleep").cancels >= 2
            ),
        )


def stats_of(host, tool):
    return host.views.stats().tools[tool]


STATE = {"state": [{"name": "notes", "keyPrefix": "n/"}, {"name": "chat", "scope": "session"}]}


async def test_state_rules_and_durability_across_a_restart(app):
    async with running_host(app, sidecars(**STATE), manifest_dirs=manifests(app)) as host:
        await wait_available(host, "svc.run")
        env = await host.invoker.invoke(
            InvokeRequest(
                "svc.run",
                raw(
                    {
                        "requests": [
                            {
                                "method": "state.set",
                                "params": {"name": "notes", "key": "n/a", "value": {"x": 1}},
                            },
                            {"method": "state.get", "params": {"name": "notes", "key": "n/a"}},
                            {
                                "method": "state.set",
                                "params": {"name": "notes", "key": "other", "value": 1},
                            },
                            {"method": "state.get", "params": {"name": "undeclared", "key": "n/a"}},
                            {
                                "method": "state.set",
                                "params": {"name": "chat", "key": "k", "value": 1},
                            },
                            {
                                "method": "state.set",
                                "params": {
                                    "name": "notes",
                                    "key": "n/big",
                                    "value": "x" * (1 << 20),
                                },
                            },
                            {"method": "state.list", "params": {"name": "notes"}},
                            {
                                "method": "state.set",
                                "params": {
                                    "name": "notes",
                                    "key": "n/a",
                                    "value": 2,
                                    "ifValue": {"x": 9},
                                },
                            },
                        ]
                    }
                ),
            )
        )
        r = data(env)["responses"]
        assert "error" not in r[0] and r[1]["result"] == {"value": {"x": 1}}
        assert r[2]["error"]["code"] == "state-refused"
        assert r[3]["error"]["code"] == "state-refused"
        assert r[4]["error"]["code"] == "session-required"
        assert r[5]["error"]["code"] == "too-large"
        assert r[6]["result"] == {"keys": ["n/a"]}
        assert r[7]["error"]["code"] == "conflict"
        env = await host.invoker.invoke(
            InvokeRequest(
                "svc.run",
                raw(
                    {
                        "requests": [
                            {
                                "method": "state.set",
                                "params": {"name": "chat", "key": "k", "value": "s1"},
                            }
                        ]
                    }
                ),
                session="session-1",
            )
        )
        assert "error" not in data(env)["responses"][0]
    db = app / ".toolhost" / "state.db"
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    async with running_host(app, sidecars(**STATE), manifest_dirs=manifests(app)) as host:
        await wait_available(host, "svc.run")
        get = {"requests": [{"method": "state.get", "params": {"name": "chat", "key": "k"}}]}
        env = await host.invoker.invoke(InvokeRequest("svc.run", raw(get), session="session-1"))
        assert data(env)["responses"][0]["result"] == {"value": "s1"}
        env = await host.invoker.invoke(InvokeRequest("svc.run", raw(get), session="session-2"))
        assert data(env)["responses"][0]["result"] == {"value": None}
        env = await host.invoker.invoke(
            InvokeRequest(
                "svc.run",
                raw(
                    {
                        "requests": [
                            {"method": "state.get", "params": {"name": "notes", "key": "n/a"}}
                        ]
                    }
                ),
            )
        )
        assert data(env)["responses"][0]["result"] == {"value": {"x": 1}}


async def test_concurrent_increments_from_two_workers_lose_nothing(app):
    entries = sidecars(**STATE, pool={"min": 2, "max": 2})
    async with running_host(app, entries, manifest_dirs=manifests(app)) as host:
        await wait_for(host, lambda: len(ready_pids(host, "svc")) == 2)
        incr = {"incr": {"name": "notes", "key": "n/counter", "times": 500}}
        results = []

        async def one():
            results.append(
                await host.invoker.invoke(InvokeRequest("svc.run", raw(incr), timeout_ms=120_000))
            )

        async with trio.open_nursery() as n:
            n.start_soon(one)
            n.start_soon(one)
        pids = {data(e)["pid"] for e in results}
        assert len(pids) == 2  # really two workers
        env = await host.invoker.invoke(
            InvokeRequest(
                "svc.run",
                raw(
                    {
                        "requests": [
                            {"method": "state.get", "params": {"name": "notes", "key": "n/counter"}}
                        ]
                    }
                ),
            )
        )
        assert data(env)["responses"][0]["result"] == {"value": 1000}


async def test_vault_values_are_redacted_everywhere_the_host_writes(app):
    secret = "s3cr3t-Value-42"
    Vault(vault_path(str(app))).set("API_KEY", secret)
    entries = sidecars(vault=[{"key": "API_KEY"}])
    async with running_host(
        app, entries, manifest_dirs=manifests(app), host={"auditLog": ".toolhost/audit.jsonl"}
    ) as host:
        await wait_available(host, "svc.run")
        ok = await host.invoker.invoke(
            InvokeRequest("svc.run", raw({"secret": {"key": "API_KEY", "as": "result"}}))
        )
        bad = await host.invoker.invoke(
            InvokeRequest("svc.run", raw({"secret": {"key": "API_KEY", "as": "error"}}))
        )
        refused = await host.invoker.invoke(
            InvokeRequest(
                "svc.run", raw({"requests": [{"method": "vault.get", "params": {"key": "OTHER"}}]})
            )
        )
        assert ok.status == "success" and bad.status == "failed"
        for env in (ok, bad):
            text = msgspec.json.encode(env).decode()
            assert secret not in text and "***" in text
        assert "vault-refused" in msgspec.json.encode(refused).decode()
        assert secret not in host.pools["svc"].stderr_tail()
        assert "the secret is ***" in host.pools["svc"].stderr_tail()
        async with served(host, app) as srv, srv.peer("unix-json") as peer:
            logs = await peer.request(1, "sidecar.logs", {"sidecar": "svc"})
            assert secret not in json.dumps(logs) and "***" in json.dumps(logs)
        host.audit.flush()
        assert secret not in (app / ".toolhost/audit.jsonl").read_text()
        assert secret not in os.environ.get("API_KEY", "")
        worker = host.pools["svc"].workers[0]
        env_of_worker = Path(f"/proc/{worker.pid}/environ").read_bytes().decode(errors="replace")
        assert secret not in env_of_worker


async def test_a_vault_file_others_can_read_is_refused(app):
    v = Vault(vault_path(str(app)))
    v.set("API_KEY", "value-for-nobody")
    os.chmod(vault_path(str(app)), 0o644)
    async with running_host(
        app, sidecars(vault=[{"key": "API_KEY"}]), manifest_dirs=manifests(app)
    ) as host:
        await wait_available(host, "svc.run")
        env = await host.invoker.invoke(
            InvokeRequest(
                "svc.run",
                raw({"requests": [{"method": "vault.get", "params": {"key": "API_KEY"}}]}),
            )
        )
        (resp,) = data(env)["responses"]
        assert resp["error"]["code"] == "vault-insecure"
        assert "chmod 600" in resp["error"]["message"]


async def test_a_flooding_worker_is_bounded_and_bystanders_keep_serving(app):
    async with running_host(app, sidecars(**STATE), manifest_dirs=manifests(app)) as host:
        await wait_available(host, "svc.run", "echo.say")
        flood = {
            "parallel": True,
            "requests": [
                {"method": "state.set", "params": {"name": "notes", "key": f"n/{i}", "value": i}}
                for i in range(200)
            ],
        }
        results = {}

        async def flooding():
            results["flood"] = await host.invoker.invoke(
                InvokeRequest("svc.run", raw(flood), timeout_ms=60_000)
            )

        async with trio.open_nursery() as n:
            n.start_soon(flooding)
            for i in range(20):
                env = await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": f"b{i}"})))
                assert env.status == "success"
        codes = [r.get("error", {}).get("code") for r in data(results["flood"])["responses"]]
        assert codes.count("too-many-requests") > 0
        assert codes.count(None) >= 32


WRONG = ["1.5", "true", "false", "{}", '{"a":1}', "[]", "[1]", "null"]
"""JSON values of the wrong type for some field (each field rejects all of them)."""


def request_line(**fields: str) -> str:
    base = {"id": '"q"', "callId": "$CALL", "method": '"state.get"', "params": '{"name":"n"}'}
    base.update(fields)
    body = ",".join(f'"{k}":{v}' for k, v in base.items() if v != "ABSENT")
    return '{"type":"request",' + body + "}"


async def test_a_wrongly_typed_field_is_invalid_request_and_the_worker_keeps_serving(app):
    """PROTOCOL 3.5: every field of a request may have the wrong type; each such request is
    answered ``invalid-request`` (on its id when the id is usable, else on ``id: null``), and
    the same worker keeps serving: no protocol error, no restart."""
    async with running_host(app, {"svc": svc()}) as host:
        await wait_available(host, "svc.run")
        pid = ready_pids(host, "svc")
        cases: list[tuple[str, object]] = []  # (line, expected response id)
        for bad in [*WRONG, '"7"', '"$CALL"', "ABSENT"]:
            cases.append((request_line(callId=bad), "q"))
        for bad in ["123", "-1", *WRONG, "ABSENT"]:
            cases.append((request_line(method=bad), "q"))
        for bad in ["[]", '"x"', "5", "true", "null", "1.5"]:
            cases.append((request_line(params=bad), "q"))
        for bad in ["1.5", "true", "{}", '{"id":"q"}', "[]", '["q"]', "null", "ABSENT"]:
            cases.append((request_line(id=bad), None))
        # a well-typed request in between still works on the same call
        cases.append((request_line(method='"no.such"'), "q"))
        env = await host.invoker.invoke(
            InvokeRequest("svc.run", raw({"raw": [line for line, _ in cases]}))
        )
        responses = data(env)["responses"]
        assert len(responses) == len(cases)
        for (line, rid), resp in zip(cases, responses, strict=True):
            want = "unknown-method" if '"no.such"' in line else "invalid-request"
            assert resp["error"]["code"] == want, (line, resp)
            assert resp["id"] == rid, (line, resp)
            assert resp["error"]["message"], line
        assert ready_pids(host, "svc") == pid
        snap = host.catalog.get("svc.run").stability
        assert snap.runtime == "ready" and snap.details.restarts == 0
        assert data(await host.invoker.invoke(InvokeRequest("svc.run", raw({}))))["pid"] == pid[0]
