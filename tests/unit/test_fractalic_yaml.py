"""Fractalic ``*.yaml`` manifests and CLI tools (PROTOCOL 3.3): safe loading against hostile YAML,
validation naming every problem, input as flags, CLI answers."""

import msgspec

from supervisor.contracts.registry import TOOL_NAME_PATTERN
from supervisor.protocols import fractalic_yaml as fy

BOMB = """
a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
"""


def test_a_good_manifest_loads_and_validates():
    doc, problems = fy.load_yaml(
        b"name: greet\ndescription: Say hi\ncommand: python-cli\nentry: greet.py\n"
        b"parameters:\n  type: object\n  properties: {user_name: {type: string}}\n"
    )
    assert problems == []
    m, name, problems = fy.validate(doc, "greet", TOOL_NAME_PATTERN)
    assert problems == [] and name == "greet" and m is not None
    assert m.command == "python-cli" and m.entry == "greet.py"
    assert m.parameters == {"type": "object", "properties": {"user_name": {"type": "string"}}}


def test_hostile_yaml_is_a_problem_not_a_crash():
    doc, problems = fy.load_yaml(BOMB.encode())
    assert doc is None and "aliases followed" in problems[0]
    deep = ("[" * 10_000 + "]" * 10_000).encode()
    doc, problems = fy.load_yaml(deep)
    assert doc is None and "deeper than 64" in problems[0]
    deep_map = "".join("  " * i + f"k{i}:\n" for i in range(200)).encode()
    assert "deeper than 64" in fy.load_yaml(deep_map)[1][0]
    huge = b"name: x\ndescription: " + b"y" * 100_000 + b"\n"
    assert "scalar of 100000" in fy.load_yaml(huge)[1][0]
    assert "limit" in fy.load_yaml(b"#" * (fy.MAX_YAML_BYTES + 1))[1][0]
    doc, problems = fy.load_yaml(b"name: [unclosed\n")
    assert doc is None and problems[0].startswith("bad YAML")
    assert fy.load_yaml(b"\xff\xfe")[1] == ["not UTF-8"]
    # Python-object tags are refused by safe loading.
    doc, problems = fy.load_yaml(b"name: !!python/object/apply:os.system ['true']\n")
    assert doc is None and "bad YAML" in problems[0]
    # A recursive document (an alias inside its own anchor) would never encode: refused.
    recursive = b"parameters: &p {type: object, properties: {x: *p}}\n"
    doc, problems = fy.load_yaml(recursive)
    assert doc is None and "*p refers to a node that contains it" in problems[0]
    assert "contains it" in fy.load_yaml(b"x: &a [1, [2, *a]]\n")[1][0]
    # What JSON cannot hold is a problem, not an exception later; the rest becomes JSON.
    doc, problems = fy.load_yaml(b"parameters: {properties: {true: 1, ~: 2}}\n")
    assert doc is None and "not representable as JSON" in problems[0]
    doc, problems = fy.load_yaml(b"d: 2001-01-01\nn: .nan\n")
    assert problems == [] and doc == {"d": "2001-01-01", "n": None}
    # A few aliases within bounds are fine.
    doc, problems = fy.load_yaml(b"a: &x {type: string}\nb: *x\n")
    assert problems == [] and doc == {"a": {"type": "string"}, "b": {"type": "string"}}


def test_validation_reports_every_problem():
    doc = {"name": "bad name!", "command": "perl", "parameters": [1], "description": 3}
    m, name, problems = fy.validate(doc, "stem", TOOL_NAME_PATTERN)
    assert m is None and name == "stem"
    text = "; ".join(problems)
    for part in (
        "not a valid tool name",
        "unknown command 'perl'",
        "entry is missing",
        "parameters must be",
        "description must be",
    ):
        assert part in text
    assert fy.validate(["x"], "s", TOOL_NAME_PATTERN)[2][0].startswith("the document")
    bad_py = {"command": "python", "entry": "mod.py"}
    assert "module:function" in fy.validate(bad_py, "s", TOOL_NAME_PATTERN)[2][0]


def test_input_becomes_flags():
    flags = fy.cli_args(
        {
            "user_name": "ada",
            "shout": True,
            "quiet": False,
            "times": 3,
            "skip": None,
            "tag": ["a", "b"],
            "opts": {"k": 1},
        }
    )
    assert flags == [
        "--user-name",
        "ada",
        "--shout",
        "--times",
        "3",
        "--tag",
        "a",
        "--tag",
        "b",
        "--opts",
        '{"k":1}',
    ]
    assert fy.cli_args([1]) == "the input must be a JSON object"


def test_cli_answers():
    a = fy.parse_cli_answer("t", b'{"x": 1}\n', 0)
    assert a.ok and msgspec.json.decode(a.data) == {"x": 1}
    a = fy.parse_cli_answer("t", b"hello there\n", 0)
    assert a.ok and msgspec.json.decode(a.data) == {"result": "hello there"}
    a = fy.parse_cli_answer("t", b"partial", 2)
    assert not a.ok and a.code == "failed" and "exit status 2" in a.error
    a = fy.parse_cli_answer("t", b"", -9)
    assert not a.ok and a.code == "worker-crashed"


def test_mcp_hint_shows_the_registry_entry():
    hint = fy.mcp_hint("files", "npx -y @mcp/server-files /data")
    assert '"protocol":"mcp"' in hint and '"command":"npx"' in hint
    assert '"protocol":"mcp-http"' in fy.mcp_hint("remote", "https://example.test/mcp")
