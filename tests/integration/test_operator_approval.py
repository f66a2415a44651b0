"""``host.approvalSource: "operator"`` (issue 12): a kernel cannot approve its own calls; an
approval-required call waits, listed, until an operator with the operator token decides, or until
its deadline."""

import json

import trio

from supervisor.calls.approvals import token_path
from supervisor.private_files import read_token
from tests.conftest import echo, running_host, wait_available
from tests.kernel import served

REG = {"echo": echo(tools=["echo.say"], sandbox={"echo.say": "approval-required"})}
SELF_APPROVED = {
    "tool": "echo.say",
    "input": {"text": "rm -rf?"},
    "approval": {"granted": True, "by": "the kernel itself"},
}


async def pending_of(peer):
    with trio.fail_after(10):
        return await _pending_of(peer)


async def _pending_of(peer):
    while True:
        got = (await peer.request("l", "approvals.list"))["result"]
        if got["pending"]:
            return got
        await trio.sleep(0.01)


async def test_operator_grants_denies_and_deadlines(app):
    async with running_host(app, REG, host={"approvalSource": "operator"}) as host:
        await wait_available(host, "echo.say")
        worker = host.pools["echo"].workers[0]
        async with (
            served(host, app) as srv,
            srv.peer("unix-json") as kernel,
            srv.peer("ws-json") as operator,
        ):
            token = read_token(token_path(str(srv.sock)))
            answers = {}

            async def call(rid, params):
                answers[rid] = (await kernel.request(rid, "tools.invoke", params))["result"]

            async with trio.open_nursery() as nursery:
                nursery.start_soon(call, 1, SELF_APPROVED)
                listed = await pending_of(operator)
                assert listed["approvalSource"] == "operator"
                (p,) = listed["pending"]
                assert p["tool"] == "echo.say" and json.loads(p["input"]) == {"text": "rm -rf?"}
                assert worker.calls_issued == 0  # the kernel's own approval did not run it
                decide = {"callId": p["callId"], "by": "alice"}
                bad = await operator.request(2, "approvals.decide", {**decide, "token": "guess"})
                assert bad["error"]["code"] == "unauthorized"
                bad = await operator.request(3, "approvals.decide", {**decide, "token": token[:-1]})
                assert bad["error"]["code"] == "unauthorized"
                ok = await operator.request(4, "approvals.decide", {**decide, "token": token})
                assert ok["result"] == {"callId": p["callId"], "granted": True}
            assert answers[1]["status"] == "success" and answers[1]["data"]["text"] == "rm -rf?"
            again = await operator.request(5, "approvals.decide", {**decide, "token": token})
            assert again["error"]["code"] == "not-found"

            async with trio.open_nursery() as nursery:
                nursery.start_soon(call, 6, SELF_APPROVED)
                (p,) = (await pending_of(operator))["pending"]
                await operator.request(
                    7,
                    "approvals.decide",
                    {"callId": p["callId"], "by": "bob", "granted": False, "token": token},
                )
            assert answers[6]["status"] == "unavailable"
            assert answers[6]["error"]["code"] == "approval-required"
            assert "denied" in answers[6]["content"]

            # Nobody decides: the call ends at its own deadline.
            await call(8, {**SELF_APPROVED, "timeoutMs": 200})
            assert answers[8]["error"]["code"] == "approval-required"
            assert "none came within 200 ms" in answers[8]["content"]

            # tools.cancel reaches a call waiting for approval.
            await kernel.send({"id": 9, "method": "tools.invoke", "params": SELF_APPROVED})
            await pending_of(operator)
            await kernel.send({"id": 10, "method": "tools.cancel", "params": {"id": 9}})
            got = {}
            with trio.fail_after(10):
                while len(got) < 2:
                    msg = await kernel.recv()
                    got[msg["id"]] = msg["result"]
            assert got[10] == {"cancelled": True}
            assert got[9]["error"]["code"] == "cancelled"
            assert (await operator.request(11, "approvals.list"))["result"]["pending"] == []
            assert worker.calls_issued == 1
        host.audit.flush()
        lines = [
            json.loads(x) for x in (app / ".toolhost" / "audit.jsonl").read_text().splitlines()
        ]
        assert lines[0]["status"] == "success"
        assert lines[0]["approval"] == {"granted": True, "by": "operator:alice"}


async def test_kernel_source_honours_the_kernels_approval(app):
    async with running_host(app, REG, host={"approvalSource": "kernel"}) as host:
        await wait_available(host, "echo.say")
        async with served(host, app) as srv, srv.peer("unix-json") as kernel:
            env = (await kernel.request(1, "tools.invoke", SELF_APPROVED))["result"]
            assert env["status"] == "success"
            listed = (await kernel.request(2, "approvals.list"))["result"]
            assert listed == {"approvalSource": "kernel", "pending": []}
