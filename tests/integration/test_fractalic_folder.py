"""A Fractalic ``tools/`` folder hosted unchanged (PROTOCOL 3.3, issue 23): YAML manifests for
``python-cli``/``bash-cli``/``simple-json``, a manifest overriding a script of the same stem,
``mcp`` and ``python`` manifests listed unavailable with hints, broken and hostile YAML as
unavailable descriptors naming the file and every problem, the host alive throughout."""

import os
import textwrap

import msgspec

from supervisor.calls.call import InvokeRequest
from tests.conftest import raw, running_host, wait_available, wait_for
from tests.fractalic_files import BOMB, DEEP_YAML, MCP_YAML, SJ_YAML

GREET = """
import argparse, json
p = argparse.ArgumentParser(description="Greet someone")
p.add_argument("--user-name", required=True)
p.add_argument("--shout", action="store_true")
p.add_argument("--times", type=int, default=1)
a = p.parse_args()
text = ("hello " + a.user_name) * a.times
print(json.dumps({"greeting": text.upper() if a.shout else text, "pid": __import__("os").getpid()}))
"""

GREET_YAML = """
name: greet
description: Greet someone from argparse
command: python-cli
entry: greet.py
parameters:
  type: object
  properties:
    user_name: {type: string}
    shout: {type: boolean}
    times: {type: integer}
  required: [user_name]
"""

WORDS_SH = """#!/bin/bash
# prints plain text, fails when asked
if [ "$1" = "--fail" ]; then echo "it went wrong" >&2; exit 4; fi
echo "words: $*"
"""

WORDS_YAML = """
name: words
description: Echo words (bash)
command: bash-cli
entry: words.sh
"""

SJ = """
import json, sys
if sys.argv[1] == '{"__test__": true}':
    print(json.dumps({"ok": True})); sys.exit(0)
if sys.argv[1] == "--fractalic-dump-schema":
    print(json.dumps({"description": "from the script", "parameters": {"type": "object"}}))
    sys.exit(0)
print(json.dumps({"echo": json.loads(sys.argv[1])}))
"""


def write_folder(app):
    folder = app / "tools"
    folder.mkdir()
    files = {
        "greet.py": GREET,
        "greet.yaml": GREET_YAML,
        "words.sh": WORDS_SH,
        "words.yaml": WORDS_YAML,
        "sj.py": SJ,
        "sj.yaml": SJ_YAML,
        "files.yaml": MCP_YAML,
        "greet_auto.yaml": "name: greet_auto\ncommand: python-cli\nentry: greet.py\n",
        "broken.yaml": "name: broken\ncommand: [python-cli\n",
        "bomb.yaml": BOMB,
        "deep.yaml": DEEP_YAML,
        "incomplete.yaml": "name: incomplete\ncommand: cobol\n",
        "escape.yaml": "name: escape\ncommand: python-cli\nentry: ../../outside.py\n",
    }
    for name, text in files.items():
        (folder / name).write_text(textwrap.dedent(text).lstrip())
    os.chmod(folder / "words.sh", 0o755)
    return folder


def folder_cfg():
    return [{"path": "tools", "probeTimeoutMs": 5000}]


def reasons(host, tool):
    d = host.catalog.get(tool)
    return d and d.stability.effective == "unavailable" and d.stability.reasons


async def test_a_fractalic_folder_is_hosted_unchanged(app):
    write_folder(app)
    async with running_host(app, {}, autodiscover=folder_cfg()) as host:
        await wait_available(host, "greet", "words", "sj")

        # python-cli: schema from the manifest, input as flags (_ -> -, true bare, false omitted).
        d = host.catalog.get("greet")
        assert d.sidecar == "auto:tools" and d.description == "Greet someone from argparse"
        assert d.inputSchema["required"] == ["user_name"]
        assert d.stability.details.path.command == "./tools/greet.yaml"
        env = await host.invoker.invoke(
            InvokeRequest("greet", raw({"user_name": "ada", "shout": True, "times": 2}))
        )
        assert env.status == "success", env
        assert msgspec.json.decode(env.data)["greeting"] == "HELLO ADAHELLO ADA"
        env = await host.invoker.invoke(
            InvokeRequest("greet", raw({"user_name": "bo", "shout": False}))
        )
        assert msgspec.json.decode(env.data)["greeting"] == "hello bo"
        # argparse refuses a missing required flag: exit 2, failed, stderr tail kept.
        env = await host.invoker.invoke(InvokeRequest("greet", raw({"times": 1})))
        assert env.status == "failed" and env.error.code == "failed"
        assert env.error.exitCode == 2 and "--user-name" in env.error.stderr

        # A CLI manifest without parameters: the schema comes from the script's --help.
        await wait_available(host, "greet_auto")
        auto = host.catalog.get("greet_auto").inputSchema
        assert (
            auto["required"] == ["user_name"] and auto["properties"]["shout"]["type"] == "boolean"
        )
        assert host.catalog.get("words").inputSchema == {
            "type": "object",
            "additionalProperties": True,
        }

        # bash-cli: plain stdout becomes {"result": text}; a non-zero exit is failed.
        env = await host.invoker.invoke(
            InvokeRequest("words", raw({"color": "red", "very_loud": True}))
        )
        assert msgspec.json.decode(env.data) == {"result": "words: --color red --very-loud"}
        env = await host.invoker.invoke(InvokeRequest("words", raw({"fail": True})))
        assert env.status == "failed" and env.error.exitCode == 4
        assert "it went wrong" in env.error.stderr
        env = await host.invoker.invoke(InvokeRequest("words", raw([1, 2])))
        assert env.status == "failed" and env.error.code == "invalid-input"

        # The manifest overrides the simple-json script of the same stem.
        d = host.catalog.get("sj")
        assert d.description == "From the manifest"
        assert d.inputSchema["properties"] == {"q": {"type": "string"}}
        env = await host.invoker.invoke(InvokeRequest("sj", raw({"q": "x"})))
        assert msgspec.json.decode(env.data) == {"echo": {"q": "x"}}

        # Unusable manifests: unavailable descriptors naming the file and every problem.
        def all_listed():
            names = ("files", "broken", "bomb", "deep", "incomplete", "escape")
            return all(reasons(host, n) for n in names)

        await wait_for(host, all_listed)
        (r,) = reasons(host, "files")
        assert r.code == "mcp-manifest" and "tools/files.yaml" in r.message
        assert '"protocol":"mcp"' in r.hint and '"command":"npx"' in r.hint
        (r,) = reasons(host, "broken")
        assert r.code == "manifest-invalid" and "tools/broken.yaml: bad YAML" in r.message
        (r,) = reasons(host, "bomb")
        assert "tools/bomb.yaml" in r.message and "aliases followed" in r.message
        (r,) = reasons(host, "deep")
        assert "tools/deep.yaml" in r.message and "deeper than 64" in r.message
        (r,) = reasons(host, "incomplete")
        assert "unknown command 'cobol'" in r.message and "entry is missing" in r.message
        (r,) = reasons(host, "escape")
        assert "outside the folder" in r.message
        env = await host.invoker.invoke(InvokeRequest("bomb", raw({})))
        assert env.status == "unavailable"

        # Still alive, and editing a manifest then reloading changes the schema.
        (app / "tools" / "greet.yaml").write_text(
            GREET_YAML.replace("required: [user_name]", "required: [user_name, times]")
        )
        result = await host.reload()
        assert result.restarted == ["auto:tools"]

        def required_changed():
            d = host.catalog.get("greet")
            return d and d.inputSchema.get("required") == ["user_name", "times"]

        await wait_for(host, required_changed)
        await wait_available(host, "greet")
        env = await host.invoker.invoke(InvokeRequest("greet", raw({"user_name": "cy"})))
        assert msgspec.json.decode(env.data)["greeting"] == "hello cy"


async def test_registry_entry_overrides_a_manifest(app):
    from tests.conftest import echo

    folder = write_folder(app)
    (folder / "echo.say.yaml").write_text("name: echo.say\ncommand: python-cli\nentry: greet.py\n")
    async with running_host(
        app, {"echo": echo(tools=["echo.say"])}, autodiscover=folder_cfg()
    ) as host:
        await wait_available(host, "echo.say", "greet")
        assert host.catalog.get("echo.say").sidecar == "echo"
        errors = host.views.snapshot().registry.errors
        assert any("echo.say is served by sidecar echo" in e for e in errors)


LOUD_SH = """#!/bin/bash
if [ "$1" = "--help" ]; then
  cat <<'HELP'
Usage: loud.sh [OPTIONS] --text TEXT
Say a text, loudly if asked.

Options:
  -t, --text TEXT      what to say
  --loud               upper-case it
  --mode {plain,box}   how to frame it
  -h, --help           show this help
HELP
  exit 0
fi
text=""; loud=0
while [ $# -gt 0 ]; do
  case "$1" in
    --text) text="$2"; shift 2;;
    --loud) loud=1; shift;;
    *) shift;;
  esac
done
if [ $loud = 1 ]; then text="${text^^}"; fi
echo "$text"
"""

COUNT_PY = """
import argparse, json
p = argparse.ArgumentParser(description="Count letters")
p.add_argument("--word_text", required=True, help="the word")
a = p.parse_args()
print(json.dumps({"count": len(a.word_text)}))
"""


async def test_cli_scripts_without_manifest_are_read_from_their_help(app):
    folder = app / "tools"
    folder.mkdir()
    (folder / "loud.sh").write_text(LOUD_SH)
    os.chmod(folder / "loud.sh", 0o755)
    (folder / "count.py").write_text(COUNT_PY)
    async with running_host(app, {}, autodiscover=folder_cfg()) as host:
        await wait_available(host, "loud", "count")
        d = host.catalog.get("loud")
        assert d.description == "Say a text, loudly if asked."
        props = d.inputSchema["properties"]
        assert props["loud"] == {"type": "boolean", "description": "upper-case it"}
        assert props["mode"]["enum"] == ["plain", "box"]
        assert d.inputSchema["required"] == ["text"] and "help" not in props
        env = await host.invoker.invoke(
            InvokeRequest("loud", raw({"text": "hi there", "loud": True}))
        )
        assert msgspec.json.decode(env.data) == {"result": "HI THERE"}
        d = host.catalog.get("count")
        assert d.inputSchema["required"] == ["word_text"]
        assert d.description == "Count letters"
        # argparse wrote --word_text; the flag mapping turns _ into -, which argparse refuses:
        # a failed call with argparse's own message, not a host error.
        env = await host.invoker.invoke(InvokeRequest("count", raw({"word_text": "abc"})))
        assert env.status == "failed" and env.error.exitCode == 2

        # Edit the help and reload: the schema follows.
        (folder / "loud.sh").write_text(
            LOUD_SH.replace(
                "--loud               upper-case it", "--shout              upper-case it"
            )
        )
        result = await host.reload()
        assert result.restarted == ["auto:tools"]

        def changed():
            d = host.catalog.get("loud")
            return d and "shout" in d.inputSchema.get("properties", {})

        await wait_for(host, changed)
        assert "loud" not in host.catalog.get("loud").inputSchema["properties"]


MYMOD = """
import builtins
import os
# Counted in the process (a confined folder tool may not write its cwd, the app root).
builtins.mymod_imports = getattr(builtins, "mymod_imports", 0) + 1

def add(a, b, scale=1):
    return {"sum": (a + b) * scale, "pid": os.getpid(), "imports": builtins.mymod_imports}

def explode(reason):
    raise ValueError(f"no good: {reason}")
"""


async def test_python_module_function_tools_run_in_one_long_lived_worker(app):
    folder = app / "tools"
    folder.mkdir()
    (folder / "mymod.py").write_text(MYMOD)
    (folder / "add.yaml").write_text(
        "name: add\ndescription: Add two numbers\ncommand: python\nentry: 'mymod:add'\n"
        "parameters: {type: object, properties: {a: {type: integer}, b: {type: integer}}}\n"
    )
    (folder / "explode.yaml").write_text("command: python\nentry: 'mymod:explode'\n")
    (folder / "nofunc.yaml").write_text("command: python\nentry: 'mymod:missing'\n")
    async with running_host(app, {}, autodiscover=folder_cfg()) as host:
        await wait_available(host, "add", "explode")
        d = host.catalog.get("add")
        assert d.sidecar == "auto-python:tools" and d.description == "Add two numbers"
        assert d.inputSchema["properties"]["a"] == {"type": "integer"}
        assert host.catalog.get("mymod") is None  # the module is not a script tool
        pids = set()
        for i in range(200):
            env = await host.invoker.invoke(InvokeRequest("add", raw({"a": i, "b": 1, "scale": 2})))
            assert env.status == "success", env
            data = msgspec.json.decode(env.data)
            assert data["sum"] == (i + 1) * 2
            assert data["imports"] == 1  # imported once, never again per call
            pids.add(data["pid"])
        assert len(pids) == 1  # one worker
        first = pids.pop()
        env = await host.invoker.invoke(InvokeRequest("explode", raw({"reason": "bad day"})))
        assert env.status == "failed" and env.error.code == "failed"
        assert "ValueError: no good: bad day" in env.error.message
        env = await host.invoker.invoke(
            InvokeRequest("add", raw({"a": 1}))
        )  # missing argument: TypeError
        assert env.status == "failed" and "TypeError" in env.error.message
        env = await host.invoker.invoke(InvokeRequest("nofunc", raw({})))
        assert env.status in ("failed", "unavailable") and "no function missing" in str(env)
        # Editing the module and reloading restarts the worker: a new import in a new process.
        (folder / "mymod.py").write_text(MYMOD.replace("(a + b) * scale", "(a + b) * scale + 1"))
        result = await host.reload()
        assert "auto-python:tools" in result.restarted
        await wait_available(host, "add")
        env = await host.invoker.invoke(InvokeRequest("add", raw({"a": 1, "b": 1})))
        data = msgspec.json.decode(env.data)
        assert data["sum"] == 3 and data["imports"] == 1 and data["pid"] != first
