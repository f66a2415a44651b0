"""``toolhost serve`` with foreign tools: an MCP server streaming ``tool.progress`` and cancelled
with ``tools.cancel`` over the socket, a oneshot script, an autodiscovered simple-json script."""

import shutil

import trio

from supervisor.client import open_client
from tests.conftest import FIXTURES, script, write_registry
from tests.e2e.conftest import serve
from tests.e2e.test_serve import wait_visible

MCP_SERVER = {
    "command": "python",
    "args": [str(FIXTURES.parent / "mcp" / "server.py")],
    "protocol": "mcp",
    "probe": {"startTimeoutMs": 20_000},
}


def test_foreign_tools_over_the_socket(tmp_path):
    root = tmp_path / "app"
    (root / "tools" / "auto").mkdir(parents=True)
    shutil.copy2(FIXTURES.parent / "auto" / "fractalic_template.py", root / "tools" / "auto")
    write_registry(
        root,
        {
            "fx": MCP_SERVER,
            "fly": script("flyflor", ["fly.echo"], mode="oneshot"),
        },
        autodiscover=[{"path": "tools/auto", "probeTimeoutMs": 5000}],
    )
    with serve(root):
        sock = root / ".toolhost" / "host.sock"
        trio.run(wait_visible, sock, ["slow", "fly.echo", "fractalic_template"])

        async def session():
            async with open_client(sock) as client:
                events = []
                env = await client.invoke(
                    "slow",
                    {"seconds": 0.2, "steps": 2},
                    stream=True,
                    on_event=lambda name, data: events.append((name, data)),
                )
                assert env.status == "success", env
                assert events == [
                    ("tool.start", {"tool": "slow"}),
                    ("tool.progress", {"progress": 1, "total": 2, "message": "step 1 of 2"}),
                    ("tool.progress", {"progress": 2, "total": 2, "message": "step 2 of 2"}),
                ]
                started = trio.Event()
                out = {}

                async def long_call():
                    out["env"] = await client.invoke(
                        "slow",
                        {"seconds": 30, "steps": 30},
                        stream=True,
                        request_id="long",
                        on_event=lambda name, _: name == "tool.progress" and started.set(),
                    )

                async with trio.open_nursery() as n:
                    n.start_soon(long_call)
                    with trio.fail_after(20):
                        await started.wait()
                    assert await client.cancel("long") is True
                assert out["env"].status == "failed" and out["env"].error.code == "cancelled"
                env = await client.invoke("fly.echo", {"n": 1})
                assert env.status == "success" and env.data["echo"] == {"n": 1}
                env = await client.invoke("fractalic_template", {"action": "example"})
                assert env.data == {"result": "success", "data": "default"}
                listed = {t["name"] for t in await client.tools("mcp")}
                assert {"slow", "fly.echo", "fractalic_template"} <= listed

        trio.run(session)
