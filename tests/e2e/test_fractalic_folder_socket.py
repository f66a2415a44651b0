"""A Fractalic ``tools/`` folder moved over unchanged, end to end through a running ``toolhost
serve`` and its kernel socket (PROTOCOL 3.3, issue 23): YAML python-cli, bash-cli from --help,
``module:function`` (200 calls, one worker, one import), a multi-tool script, a simple-json script
overridden by YAML, an mcp manifest, broken/bomb/deep/huge YAML; every tool with its state and
reason, the host alive throughout; editing a script's help and reloading changes its schema while
unchanged scripts are not probed again; ``toolhost doctor`` explains each file's route."""

import json
import os
import textwrap

import trio

from supervisor.client import open_client
from tests.conftest import write_registry
from tests.e2e.conftest import cli, serve
from tests.fractalic_files import BOMB, DEEP_YAML, MCP_YAML, SJ_YAML

GREET = """
import argparse, json
p = argparse.ArgumentParser(description="Greet someone")
p.add_argument("--user-name", required=True)
p.add_argument("--shout", action="store_true")
p.add_argument("--times", type=int, default=1)
a = p.parse_args()
text = " ".join(["hello " + a.user_name] * a.times)
print(json.dumps({"greeting": text.upper() if a.shout else text}))
"""

GREET_YAML = """
name: greet
description: Greet someone (argparse, from the manifest)
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

COUNT_SH = """#!/bin/bash
if [ "$1" = "--help" ]; then
  cat <<'EOF'
Usage: count.sh --word WORD [--times N]
Repeat a word.

Options:
  -w, --word WORD     the word to repeat
  -n, --times N       how many times
  -h, --help          show this help
EOF
  exit 0
fi
word=""; times=1; upper=0
while [ $# -gt 0 ]; do
  case "$1" in
    --word) word="$2"; shift 2;;
    --times) times="$2"; shift 2;;
    --upper) upper=1; shift;;
    *) echo "unknown argument $1" >&2; exit 2;;
  esac
done
out=""
for i in $(seq "$times"); do out="$out$word "; done
if [ "$upper" = 1 ]; then out=$(echo "$out" | tr a-z A-Z); fi
echo "$out"
"""

MATHMOD = """
import os
logs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "logs")
with open(os.path.join(logs, "_imports.log"), "a") as f:
    f.write(f"{os.getpid()}\\n")

def add(a, b):
    return {"sum": a + b, "pid": os.getpid()}
"""

ADD_YAML = """
name: add
description: Add two numbers (module:function)
command: python
entry: "mathmod:add"
parameters:
  type: object
  properties: {a: {type: integer}, b: {type: integer}}
  required: [a, b]
"""

MULTI = """
import argparse, json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
arg = sys.argv[1] if len(sys.argv) > 1 else ""
if arg.startswith("--") or arg.startswith("{"):
    with open(os.path.join(here, "..", "logs", "_probes.log"), "a") as f:
        f.write(arg + "\\n")
TOOLS = [
    {"name": "shout", "description": "Upper-case a text",
     "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                    "required": ["text"]}},
    {"name": "repeat", "description": "Repeat a text", "command": "python-cli",
     "parameters": {"type": "object", "properties": {"text": {"type": "string"},
                    "times": {"type": "integer"}}}},
    {"name": "not a name", "description": "left out"},
]
if arg == "--fractalic-dump-multi-schema":
    print(json.dumps(TOOLS)); sys.exit(0)
if arg == "shout":
    data = json.loads(sys.argv[2])
    print(json.dumps({"tool": "shout", "out": data["text"].upper()})); sys.exit(0)
if arg == "repeat":
    p = argparse.ArgumentParser()
    p.add_argument("--text"); p.add_argument("--times", type=int, default=1)
    a = p.parse_args(sys.argv[2:])
    print(json.dumps({"tool": "repeat", "out": a.text * a.times})); sys.exit(0)
print("usage: multi.py TOOL ...", file=sys.stderr)
sys.exit(2)
"""

SJ = """
import json, sys
if sys.argv[1] == '{"__test__": true}':
    print(json.dumps({"success": True, "_simple": True})); sys.exit(0)
if sys.argv[1] == "--fractalic-dump-schema":
    print(json.dumps({"description": "from the script", "parameters": {"type": "object"}}))
    sys.exit(0)
print(json.dumps({"echo": json.loads(sys.argv[1])}))
"""

PLAIN = """
import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
if sys.argv[1].startswith("--") or sys.argv[1] == '{"__test__": true}':
    with open(os.path.join(here, "..", "logs", "_probes.log"), "a") as f:
        f.write("plain " + sys.argv[1] + "\\n")
if sys.argv[1] == '{"__test__": true}':
    print(json.dumps({"success": True, "_simple": True})); sys.exit(0)
if sys.argv[1].startswith("--"):
    sys.exit(1)
print(json.dumps({"plain": json.loads(sys.argv[1])}))
"""

DUMPED = """
import argparse, json, sys
if sys.argv[1:] == ["--fractalic-dump-schema"]:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    print(json.dumps({"description": "Weather by city (legacy CLI)", "parameters": schema}))
    sys.exit(0)
p = argparse.ArgumentParser()
p.add_argument("--city", required=True)
print(json.dumps({"city": p.parse_args().city, "sky": "clear"}))
"""


def write_folder(root):
    folder = root / "tools"
    folder.mkdir(parents=True)
    files = {
        "greet.py": GREET,
        "greet.yaml": GREET_YAML,
        "count.sh": COUNT_SH,
        "mathmod.py": MATHMOD,
        "add.yaml": ADD_YAML,
        "multi.py": MULTI,
        "sj.py": SJ,
        "sj.yaml": SJ_YAML,
        "files.yaml": MCP_YAML,
        "broken.yaml": "name: broken\ncommand: [python-cli\n",
        "bomb.yaml": BOMB,
        "deep.yaml": DEEP_YAML,
        "huge.yaml": "name: huge\ndescription: " + "x" * 100_000 + "\n",
        "incomplete.yaml": "name: incomplete\ncommand: cobol\n",
        "notes.txt": "not a tool\n",
        "plain.py": PLAIN,
        "dumped.py": DUMPED,
        "recursive.yaml": "name: recursive\nparameters: &p {type: object, items: [*p]}\n",
        "badkey.yaml": "name: badkey\ncommand: python-cli\nentry: greet.py\nx: {true: 1}\n",
    }
    for name, text in files.items():
        body = text if name.endswith(".sh") else textwrap.dedent(text).lstrip()
        (folder / name).write_text(body)
    os.chmod(folder / "count.sh", 0o755)
    return folder


async def wait_catalog(client, pred, what, timeout=60):
    """The catalog (name -> descriptor) once ``pred`` holds, woken by ``catalog.changed``."""
    with trio.fail_after(timeout):
        while True:
            cat = {d.name: d for d in (await client.catalog()).tools}
            if pred(cat):
                return cat
            with trio.move_on_after(2):  # an event, or a re-read in case one raced the read
                await client.events.receive()


def unavailable(d, *fragments):
    text = " ".join(f"{r.code} {r.message} {r.hint}" for r in d.stability.reasons)
    return d.stability.effective == "unavailable" and all(f in text for f in fragments)


def test_a_fractalic_folder_through_the_kernel_socket(tmp_path):
    root = tmp_path / "app"
    folder = write_folder(root)
    # The scripts log their runs in logs/ (tools/ is never writable): the folder grants it.
    logs = root / "logs"
    logs.mkdir()
    auto = {"path": "tools", "probeTimeoutMs": 5000, "confine": {"write": ["logs"]}}
    write_registry(root, {}, autodiscover=[auto])
    sock = root / ".toolhost" / "host.sock"
    working = ["greet", "count", "add", "shout", "repeat", "sj", "plain", "dumped"]

    with serve(root) as proc:

        async def session():
            async with open_client(sock) as client:
                await client.subscribe()
                cat = await wait_catalog(
                    client,
                    lambda c: all(n in c and c[n].visible for n in working),
                    "the folder's working tools",
                )
                # The multi-tool script is not a tool itself; its two valid entries are.
                assert "multi" not in cat and "not a name" not in cat
                assert cat["shout"].description == "Upper-case a text"
                assert cat["repeat"].inputSchema["properties"]["times"] == {"type": "integer"}
                assert cat["greet"].inputSchema["required"] == ["user_name"]
                # bash-cli with GNU-style help and no YAML: schema read from --help.
                count = cat["count"].inputSchema
                assert set(count["properties"]) == {"word", "times"}
                assert count["required"] == ["word"]
                assert cat["sj"].description == "From the manifest"
                assert cat["add"].sidecar == "auto-python:tools"

                # Every unusable manifest: listed, unavailable, reason naming file and problem.
                assert unavailable(cat["files"], "mcp-manifest", '"protocol":"mcp"', "npx")
                assert unavailable(cat["broken"], "tools/broken.yaml", "bad YAML")
                assert unavailable(cat["bomb"], "tools/bomb.yaml", "expands to more than")
                assert unavailable(cat["deep"], "tools/deep.yaml", "nested deeper than")
                assert unavailable(cat["huge"], "tools/huge.yaml", "a scalar of")
                # All problems of a manifest, not only the first.
                assert unavailable(
                    cat["incomplete"],
                    "tools/incomplete.yaml",
                    "unknown command",
                    "entry is missing",
                )
                assert unavailable(cat["recursive"], "tools/recursive.yaml", "contains it")
                assert unavailable(cat["badkey"], "tools/badkey.yaml", "not representable")
                assert "notes" not in cat and "mathmod" not in cat

                # python-cli: underscores become dashes, true a bare flag, an int as text.
                env = await client.invoke("greet", {"user_name": "ada", "shout": True, "times": 2})
                assert env.status == "success", env
                assert env.data == {"greeting": "HELLO ADA HELLO ADA"}
                env = await client.invoke("greet", {"user_name": "bo", "shout": False})
                assert env.data == {"greeting": "hello bo"}
                env = await client.invoke("greet", {"times": 1})
                assert env.status == "failed" and env.error.code == "failed"
                assert env.error.exitCode == 2 and "--user-name" in env.error.stderr
                # bash-cli: plain stdout becomes {"result": text}.
                env = await client.invoke("count", {"word": "hi", "times": 3})
                assert env.status == "success", env
                assert env.data == {"result": "hi hi hi"}
                # Multi-tool script: each tool runs with its name first, by its convention.
                env = await client.invoke("shout", {"text": "abc"})
                assert env.data == {"tool": "shout", "out": "ABC"}, env
                env = await client.invoke("repeat", {"text": "ab", "times": 2})
                assert env.data == {"tool": "repeat", "out": "abab"}, env
                # A simple-json script overridden by YAML still runs as simple-json.
                env = await client.invoke("sj", {"q": "x"})
                assert env.data == {"echo": {"q": "x"}}
                # A legacy CLI script with --fractalic-dump-schema: its schema, input as flags.
                assert cat["dumped"].description == "Weather by city (legacy CLI)"
                assert cat["dumped"].inputSchema["required"] == ["city"]
                env = await client.invoke("dumped", {"city": "Oslo"})
                assert env.data == {"city": "Oslo", "sky": "clear"}, env
                env = await client.invoke("plain", {"n": 1})
                assert env.data == {"plain": {"n": 1}}
                env = await client.invoke("files", {})
                assert env.status == "unavailable"  # refused at the gate, the host unharmed
                # module:function 200 times: one worker, one import.
                pids = set()
                for i in range(200):
                    env = await client.invoke("add", {"a": i, "b": 1})
                    assert env.status == "success" and env.data["sum"] == i + 1, env
                    pids.add(env.data["pid"])
                assert len(pids) == 1
                imports = (logs / "_imports.log").read_text().split()
                assert imports == [str(pids.pop())]

                # Edit count.sh's help (a new --upper flag) and reload: its schema changes; the
                # unchanged scripts' discovery is served from the cache (no new probe runs).
                probes_before = (logs / "_probes.log").read_text()
                assert "plain {" in probes_before and "--fractalic-dump-multi" in probes_before
                text = (folder / "count.sh").read_text()
                text = text.replace(
                    "  -h, --help", "  -u, --upper         shout the words\n  -h, --help"
                )
                (folder / "count.sh").write_text(text)
                await client.request("registry.reload")
                cat = await wait_catalog(
                    client,
                    lambda c: (
                        "upper" in c.get("count").inputSchema.get("properties", {})
                        if c.get("count")
                        else False
                    ),
                    "count's new schema",
                )
                assert cat["count"].inputSchema["properties"]["upper"]["type"] == "boolean"
                cat = await wait_catalog(
                    client, lambda c: all(n in c and c[n].visible for n in working), "all back"
                )
                env = await client.invoke("count", {"word": "hi", "upper": True})
                assert env.data == {"result": "HI"}, env
                env = await client.invoke("repeat", {"text": "z", "times": 3})
                assert env.data == {"tool": "repeat", "out": "zzz"}
                assert (logs / "_probes.log").read_text() == probes_before
                health = await client.health()
                assert health.status in ("ok", "degraded", "healthy"), health

        trio.run(session)
        assert proc.poll() is None  # the host stayed up throughout

    # toolhost doctor explains each file's route, and why a file is not a tool.
    out = cli(root, "doctor", "--json", "--timeout", "30")
    report = json.loads(out.stdout)
    (tools_folder,) = report["folders"]
    files = {f["file"]: f for f in tools_folder["files"]}
    assert files["tools/greet.yaml"]["route"] == "yaml"
    assert files["tools/greet.py"]["route"] == "not registered"
    assert "entry of a manifest" in files["tools/greet.py"]["why"][0]
    assert files["tools/count.sh"]["route"] == "help"
    assert any("--fractalic-dump-multi-schema" in w for w in files["tools/count.sh"]["why"])
    assert files["tools/dumped.py"]["route"] == "schema dump"
    assert files["tools/plain.py"]["route"] == "simple-json probe"
    assert files["tools/multi.py"]["route"] == "multi-schema"
    assert files["tools/multi.py"]["tools"] == ["shout", "repeat"]
    assert any("not a valid tool name" in w for w in files["tools/multi.py"]["why"])
    assert files["tools/sj.py"]["route"] == "not registered"
    assert "entry of a manifest" in files["tools/sj.py"]["why"][0]
    assert files["tools/sj.yaml"]["route"] == "yaml" and files["tools/sj.yaml"]["tools"] == ["sj"]
    assert files["tools/notes.txt"]["why"] == ["not a script (neither .py nor executable)"]
    assert any("bad YAML" in w for w in files["tools/broken.yaml"]["why"])
    human = cli(root, "doctor", "--timeout", "30").stdout
    assert "tools/multi.py: multi-schema -> shout, repeat" in human
