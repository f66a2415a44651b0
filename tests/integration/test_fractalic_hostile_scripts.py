"""Scripts of an autodiscover folder that print hostile output (issue 23): JSON nested far past
any parser's recursion limit as a call's answer, as a multi-schema list and as a schema dump.
Each is a clear outcome for that tool; the folder's other tools and the host carry on."""

import textwrap

import msgspec

from supervisor.calls.call import InvokeRequest
from tests.conftest import raw, running_host, wait_available, wait_for
from tests.fractalic_files import SANE

DEEP = "'[' * 200000 + ']' * 200000"

ANSWER = f"""
import json, sys
if sys.argv[1] == '{{"__test__": true}}':
    print(json.dumps({{"ok": True}})); sys.exit(0)
if sys.argv[1].startswith("--"):
    sys.exit(1)
print({DEEP})
"""

INTROSPECTION = f"""
import sys
if sys.argv[1] in ("--fractalic-dump-multi-schema", "--fractalic-dump-schema"):
    print('[{{"name": "x", "parameters": ' + {DEEP} + '}}]'); sys.exit(0)
sys.exit(2)
"""

CLI = f"""
print({DEEP})
"""


async def test_deeply_nested_output_is_an_outcome_not_a_crash(app):
    folder = app / "tools"
    folder.mkdir()
    for name, text in {
        "deep_answer.py": ANSWER,
        "deep_schema.py": INTROSPECTION,
        "deep_cli.py": CLI,
        "sane.py": SANE,
    }.items():
        (folder / name).write_text(textwrap.dedent(text).lstrip())
    (folder / "deep_cli.yaml").write_text("command: python-cli\nentry: deep_cli.py\n")
    cfg = [{"path": "tools", "probeTimeoutMs": 5000}]
    async with running_host(app, {}, autodiscover=cfg) as host:
        await wait_available(host, "deep_answer", "deep_cli", "sane")
        # Neither the multi-schema list nor the dump could be read: listed unavailable.
        await wait_for(host, lambda: host.catalog.get("deep_schema") is not None)
        d = host.catalog.get("deep_schema")
        assert d.stability.effective == "unavailable"
        assert host.catalog.get("x") is None
        # An answer nested too deeply to parse is passed on as text, not parsed.
        env = await host.invoker.invoke(InvokeRequest("deep_answer", raw({})))
        assert env.status == "success" and (env.content or "").startswith("[[[["), repr(env)[:300]
        env = await host.invoker.invoke(InvokeRequest("deep_cli", raw({})))
        assert env.status == "success", env
        # {"result": text}; large, so the result funnel passes it as the model's text.
        assert '{"result":"[[[[' in (env.content or bytes(env.data or b"").decode())
        env = await host.invoker.invoke(InvokeRequest("sane", raw({})))
        assert msgspec.json.decode(env.data) == {"sane": True}
