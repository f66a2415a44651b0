"""Resources, resource templates, prompts and completions of hosted MCP servers (SDK-written,
stateless era over stdio) served to kernels: ``resources.list``/``templates``/``read``,
``prompts.list``/``get``, ``completion.complete``; lists answered from what the host holds,
collisions owned by the first sidecar in the registry, list_changed followed, and nothing listed
once the owning sidecar is gone."""

import os
import subprocess
import sys

import msgspec
import trio

from supervisor.host.offers import HostedOffers
from tests.conftest import FIXTURES, free_port, running_host, wait_available, wait_for
from tests.integration.test_mcp_http import Server
from tests.kernel import served

OFFERS = FIXTURES.parent / "mcp" / "offers.py"


def offers(name: str) -> dict:
    return {
        "command": "python",
        "args": [str(OFFERS)],
        "protocol": "mcp",
        "env": {"OFFERS_NAME": name},
        "restart": {"backoffMs": 20, "maxBackoffMs": 200},
        "probe": {"startTimeoutMs": 20_000},
    }


def ok(resp):
    assert "error" not in resp, resp
    return resp["result"]


async def test_resources_prompts_and_completions_to_kernels(app):
    reg = {"alpha": offers("alpha"), "beta": offers("beta")}
    async with running_host(app, reg) as host:
        known = HostedOffers(host.views)
        await wait_for(host, lambda: known.listed("prompts") and known.shadowed(), 30)
        shadowed = {(s.get("uri") or s.get("name"), s["sidecar"]) for s in known.shadowed()}
        assert ("note://readme", "beta") in shadowed and ("greet", "beta") in shadowed
        async with served(host, app) as srv, srv.peer("unix-json") as peer:
            hello = ok(await peer.hello())
            assert hello["capabilities"]["resources"] is True
            assert hello["capabilities"]["prompts"] is True

            listed = ok(await peer.request(1, "resources.list"))["resources"]
            by_uri = {(r["uri"], r["sidecar"]) for r in listed}
            assert ("note://readme", "alpha") in by_uri
            assert ("note://shared", "alpha") in by_uri
            assert not any(r["sidecar"] == "beta" for r in listed)  # every URI is alpha's first
            templates = ok(await peer.request(2, "resources.templates"))["resourceTemplates"]
            assert [(t["uriTemplate"], t["sidecar"]) for t in templates] == [
                ("note://page/{name}", "alpha")
            ]

            read = ok(await peer.request(3, "resources.read", {"uri": "note://readme"}))
            assert read["contents"][0]["text"] == "readme of alpha"
            read = ok(await peer.request(4, "resources.read", {"uri": "note://page/intro"}))
            assert read["contents"][0]["text"] == "page intro from alpha"
            missing = await peer.request(5, "resources.read", {"uri": "nowhere://x"})
            assert missing["error"]["code"] == "not-found"

            prompts = ok(await peer.request(6, "prompts.list"))["prompts"]
            [greet] = prompts
            assert greet["name"] == "greet" and greet["sidecar"] == "alpha"
            assert {a["name"] for a in greet["arguments"]} == {"who", "tone"}
            got = ok(
                await peer.request(
                    7, "prompts.get", {"name": "greet", "arguments": {"who": "Ada", "tone": "wry"}}
                )
            )
            text = got["messages"][0]["content"]["text"]
            assert text == "Say hello to Ada in a wry tone (alpha)"

            done = ok(
                await peer.request(
                    8,
                    "completion.complete",
                    {
                        "ref": {"type": "ref/prompt", "name": "greet"},
                        "argument": {"name": "tone", "value": "w"},
                    },
                )
            )
            assert done["completion"]["values"] == ["warm", "witty", "wry"]

            # The server publishes a resource: its list_changed is followed.
            await wait_available(host, "add_note")
            inv = ok(
                await peer.request(
                    9, "tools.invoke", {"tool": "add_note", "input": {"name": "fresh"}}
                )
            )
            assert inv["status"] == "success"
            with trio.fail_after(15):
                while True:
                    listed = ok(await peer.request(10, "resources.list"))["resources"]
                    if any(r["uri"] == "note://fresh" for r in listed):
                        break
                    await trio.sleep(0.05)

            # alpha gone: beta owns what it publishes (nothing shadowed any more).
            assert await host.stop_sidecar("alpha")
            listed = ok(await peer.request(11, "resources.list"))["resources"]
            assert {r["sidecar"] for r in listed} == {"beta"}
            read = ok(await peer.request(12, "resources.read", {"uri": "note://readme"}))
            assert read["contents"][0]["text"] == "readme of beta"
            assert known.shadowed() == []


class OffersServer(Server):
    """``offers.py --http PORT``."""

    def start(self) -> None:
        with open(self.log, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(OFFERS), "--http", str(self.port)],
                stdout=subprocess.DEVNULL,
                stderr=err,
                env={**os.environ, "OFFERS_NAME": "remote"},
            )


async def test_a_remote_server_over_http_gone_and_back(app, tmp_path):
    port = free_port()
    server = OffersServer(port, tmp_path / "server.log")
    server.start()
    try:
        await server.listening()
        entry = {
            "protocol": "mcp-http",
            "url": f"http://127.0.0.1:{port}/mcp",
            "restart": {"backoffMs": 20, "maxBackoffMs": 300},
            "probe": {"startTimeoutMs": 20_000, "intervalMs": 300, "failureThreshold": 1},
        }
        async with running_host(app, {"remote": entry}) as host:
            known = HostedOffers(host.views)
            await wait_for(host, lambda: known.listed("resources"), 30)
            worker = host.pools["remote"].workers[0]
            assert worker.conn.era == "modern"
            assert {r["uri"] for r in known.listed("resources")} == {
                "note://readme",
                "note://shared",
            }
            # The server's answer, as the JSON it sent (the host passes it on undecoded).
            raw = await known.request("remote", "resources/read", {"uri": "note://readme"})
            read = msgspec.json.decode(raw)
            assert read["contents"][0]["text"] == "readme of remote"
            raw = await known.request(
                "remote", "prompts/get", {"name": "greet", "arguments": {"who": "Bo"}}, "greet"
            )
            got = msgspec.json.decode(raw)
            assert (
                got["messages"][0]["content"]["text"] == "Say hello to Bo in a warm tone (remote)"
            )

            server.kill()  # gone: nothing listed, and a list does not wait for it
            await wait_for(host, lambda: not known.listed("resources"), 20)
            started = trio.current_time()
            assert known.listed("prompts") == []
            assert trio.current_time() - started < 0.05

            server.start()  # back: listed again
            await wait_for(host, lambda: known.listed("resources"), 30)
            assert {p["name"] for p in known.listed("prompts")} == {"greet"}
    finally:
        server.kill()
