"""Multi-tool scripts (PROTOCOL 3.3, ``--fractalic-dump-multi-schema``) beside other tools of
their folder: a script may list a tool named after itself; a listed name another tool of the
folder already has is not taken over (and the worker says why, for ``toolhost doctor``)."""

import textwrap

import msgspec

from supervisor.calls.call import InvokeRequest
from tests.conftest import raw, running_host, wait_available
from tests.fractalic_files import SANE

BOTH = """
import json, sys
TOOLS = [
    {"name": "both", "description": "The script's own name, listed"},
    {"name": "extra", "description": "Another tool", "command": "bash-cli"},
    {"name": "sane", "description": "Taken: sane.py is this folder's sane"},
]
arg = sys.argv[1] if len(sys.argv) > 1 else ""
if arg == "--fractalic-dump-multi-schema":
    print(json.dumps(TOOLS)); sys.exit(0)
if arg in ("both", "sane"):
    print(json.dumps({"ran": arg, "input": json.loads(sys.argv[2])})); sys.exit(0)
if arg == "extra":
    print("flags: " + " ".join(sys.argv[2:])); sys.exit(0)
sys.exit(2)
"""


async def test_a_multi_tool_script_beside_other_tools(app):
    folder = app / "tools"
    folder.mkdir()
    (folder / "both.py").write_text(textwrap.dedent(BOTH).lstrip())
    (folder / "sane.py").write_text(textwrap.dedent(SANE).lstrip())
    cfg = [{"path": "tools", "probeTimeoutMs": 5000}]
    async with running_host(app, {}, autodiscover=cfg) as host:
        await wait_available(host, "both", "extra", "sane")
        both = host.catalog.get("both")
        assert both.description == "The script's own name, listed"
        assert both.stability.details.path.command == "./tools/both.py"
        env = await host.invoker.invoke(InvokeRequest("both", raw({"q": 1})))
        assert msgspec.json.decode(env.data) == {"ran": "both", "input": {"q": 1}}
        env = await host.invoker.invoke(InvokeRequest("extra", raw({"dry_run": True, "n": 2})))
        assert msgspec.json.decode(env.data) == {"result": "flags: --dry-run --n 2"}
        # sane stays sane.py's tool.
        env = await host.invoker.invoke(InvokeRequest("sane", raw({})))
        assert msgspec.json.decode(env.data) == {"sane": True}
        (worker,) = [w for w in host.pools["auto:tools"].workers if w.state == "ready"]
        assert worker.discovery_notes == [
            "tools/both.py: sane is already a tool of this folder; not registered"
        ]


PAIR = """
import json, sys
TOOLS = [{"name": "alpha", "description": "A"}, {"name": "beta", "description": "B"}]
arg = sys.argv[1] if len(sys.argv) > 1 else ""
if arg == "--fractalic-dump-multi-schema":
    print(json.dumps(TOOLS)); sys.exit(0)
if arg in ("alpha", "beta"):
    print(json.dumps({"ran": arg})); sys.exit(0)
sys.exit(2)
"""


async def test_the_folder_status_lists_the_script_tools_not_the_script(app):
    folder = app / "tools"
    folder.mkdir()
    (folder / "pair.py").write_text(textwrap.dedent(PAIR).lstrip())
    cfg = [{"path": "tools", "probeTimeoutMs": 5000}]
    async with running_host(app, {}, autodiscover=cfg) as host:
        await wait_available(host, "alpha", "beta")
        assert host.catalog.get("pair") is None
        (status,) = [s for s in host.views.sidecar_statuses() if s.id == "auto:tools"]
        assert status.tools == ["alpha", "beta"]  # not "pair", the file's own name
        env = await host.invoker.invoke(InvokeRequest("beta", raw({})))
        assert msgspec.json.decode(env.data) == {"ran": "beta"}
