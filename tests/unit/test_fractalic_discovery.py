"""Discovery of autodiscovered scripts (PROTOCOL 3.3): the multi-schema / schema-dump / --help
judges, the order of the steps with a runner that plays a script, the cache keyed by the script's
size and mtime, and the catalog following a folder's announced (multi-tool) tools."""

import os

import msgspec

from supervisor.contracts.registry import TOOL_NAME_PATTERN
from supervisor.contracts.wire import ToolInfo
from supervisor.protocols import fractalic_discovery as fd
from supervisor.registry.catalog import CatalogState, SidecarFacts
from supervisor.workers import discovery as fractalic_probe
from supervisor.workers.discovery import CannotRun, ProbeCache, Ran
from tests.unit.test_discover import make, plan_with

ARGV = ["/py", "/tools/multi.py"]


def enc(obj):
    return msgspec.json.encode(obj)


def test_multi_schema_entries_become_tools_called_with_their_name_first():
    listed = [
        {"name": "alpha", "description": "A", "parameters": {"type": "object"}},
        {"name": "beta", "command": "python-cli"},
        {"name": "gamma", "command": "cobol", "parameters": ["x"], "description": 3},
        {"name": "bad name"},
        "not an object",
        {"name": "alpha"},
    ]
    tools, notes = fd.parse_multi_schema(enc(listed), ARGV, TOOL_NAME_PATTERN, "tools/multi.py")
    by = {t.name: t for t in tools}
    assert list(by) == ["alpha", "beta", "gamma"]
    assert by["alpha"].kind == "simple-json" and by["alpha"].argv == [*ARGV, "alpha"]
    assert by["beta"].kind == "cli" and by["beta"].schema["type"] == "object"
    assert "multi.py" in by["beta"].description
    # Every problem of an entry, not only the first; the file named.
    gamma = by["gamma"]
    assert gamma.kind == "unavailable" and gamma.reason.startswith("tools/multi.py")
    for fragment in ("unknown command 'cobol'", "parameters must be", "description must be"):
        assert fragment in gamma.reason
    assert len(notes) == 3 and "not a valid tool name" in notes[0]
    assert "listed twice" in notes[2]


def test_multi_schema_answers_that_are_not_lists():
    for out, fragment in [
        (b"", "printed nothing"),
        (b"hello", "not JSON"),
        (enc({"name": "x"}), "not a list"),
        (enc([]), "empty list"),
        (enc([{"name": "bad name"}]), "no usable entry"),
    ]:
        why = fd.parse_multi_schema(out, ARGV, TOOL_NAME_PATTERN, "m.py")
        assert isinstance(why, str) and fragment in why, (out, why)
    many = [{"name": f"t{i}"} for i in range(fd.MAX_MULTI_TOOLS + 5)]
    tools, notes = fd.parse_multi_schema(enc(many), ARGV, TOOL_NAME_PATTERN, "m.py")
    assert len(tools) == fd.MAX_MULTI_TOOLS and "only the first" in notes[0]


def test_schema_dump_and_help_make_one_cli_tool():
    dump = {"description": "Dumped", "parameters": {"type": "object", "properties": {"q": {}}}}
    tool = fd.parse_schema_dump(enc(dump), "x", ARGV, "x.py")
    assert tool.kind == "cli" and tool.description == "Dumped" and tool.argv == ARGV
    tool = fd.parse_schema_dump(enc({**dump, "command": "simple-json"}), "x", ARGV, "x.py")
    assert tool.kind == "simple-json"
    assert "no parameters" in fd.parse_schema_dump(enc({"description": "d"}), "x", ARGV, "x.py")
    assert "not a JSON Schema" in fd.parse_schema_dump(
        enc({"parameters": {"type": "array"}}), "x", ARGV, "x.py"
    )
    helped = fd.parse_help(b"usage: x.py --q Q\n\n  --q Q  the query\n", "x", ARGV, "x.py")
    assert helped.kind == "cli" and helped.schema["required"] == ["q"]
    assert "usage" in fd.parse_help(b"just text", "x", ARGV, "x.py")


class Script:
    """Plays a script's answers to each discovery argument; counts the runs."""

    def __init__(self, answers):
        self.answers = answers
        self.runs = []

    async def __call__(self, argv):
        arg = argv[-1]
        self.runs.append(arg)
        answer = self.answers.get(arg, (b"", 2))
        if answer == "timeout":
            return None
        if answer == "cannot":
            raise CannotRun("cannot execute")
        return Ran(output=answer[0], exit_code=answer[1], stderr="oops\n")


async def discover(script, path, **kw):
    return await fractalic_probe.discover(
        script,
        ["/py", str(path)],
        name="m",
        where="tools/m.py",
        timeout_ms=500,
        name_pattern=TOOL_NAME_PATTERN,
        **kw,
    )


async def test_discovery_order_first_answer_wins(tmp_path, monkeypatch):
    monkeypatch.setattr(fractalic_probe, "CACHE", ProbeCache())
    path = make(tmp_path, "m.py")
    multi = enc([{"name": "one"}, {"name": "two", "command": "bash-cli"}])
    help_text = (b"usage: m --q Q\n", 0)
    # The simple-json probe passes: a simple-json tool, schema from the dump; nothing else asked.
    s = Script({'{"__test__": true}': (b"{}", 0), "--fractalic-dump-multi-schema": (multi, 0)})
    d = await discover(s, path)
    assert d.route == "simple-json" and s.runs == ['{"__test__": true}', "--fractalic-dump-schema"]
    # It fails: the multi-schema list wins over the schema dump and --help.
    s = Script({"--fractalic-dump-multi-schema": (multi, 0), "--help": help_text})
    path.write_text("print(2)\n")
    d = await discover(s, path)
    assert d.route == "multi-schema" and [t.name for t in d.tools] == ["one", "two"]
    assert [t.kind for t in d.tools] == ["simple-json", "cli"]
    assert "(exit status 2); stderr: oops" in d.steps[0]
    # No multi-schema, no dump: --help; every step's failure is told.
    path.write_text("print(3)\n")
    s = Script({"--help": help_text})
    d = await discover(s, path)
    assert d.route == "help" and len(d.steps) == 3
    assert s.runs == [
        '{"__test__": true}',
        "--fractalic-dump-multi-schema",
        "--fractalic-dump-schema",
        "--help",
    ]
    # A registry simple-json sidecar (multi=False) is never asked for a multi-schema.
    path.write_text("print(4)\n")
    s = Script({"--fractalic-dump-multi-schema": (multi, 0)})
    d = await discover(s, path, multi=False)
    assert d.route == "none" and "--fractalic-dump-multi-schema" not in s.runs


async def test_results_are_cached_until_the_script_changes(tmp_path, monkeypatch):
    cache = ProbeCache()
    monkeypatch.setattr(fractalic_probe, "CACHE", cache)
    path = make(tmp_path, "m.py")
    s = Script({"--help": (b"usage: m [--v]\n\n  --v  verbose\n", 0)})
    first = await discover(s, path)
    runs = len(s.runs)
    assert first.route == "help" and runs == 4
    assert await discover(s, path) == first and len(s.runs) == runs and cache.hits == 1
    path.write_text("print('changed')\n")  # size and mtime move: asked again
    await discover(s, path)
    assert len(s.runs) == 2 * runs
    # A step that timed out, or a script that cannot run, is not a fact about the script.
    path.write_text("print('again, longer')\n")
    slow = Script({'{"__test__": true}': "timeout", "--help": (b"usage: m\n", 0)})
    d = await discover(slow, path)
    assert d.transient and d.verdict.code == "probe-timeout"
    # The probe gets a second try; a script that never answers in time is not asked more.
    assert slow.runs == ['{"__test__": true}'] * 2 and "not tried" in d.steps[-1]
    await discover(slow, path)
    assert len(slow.runs) == 4  # not cached
    hangs = Script({"--fractalic-dump-multi-schema": "timeout", "--help": (b"usage: m\n", 0)})
    d = await discover(hangs, path)
    assert d.route == "none" and d.transient and hangs.runs[-1] == "--fractalic-dump-multi-schema"
    broken = Script({'{"__test__": true}': "cannot"})
    d = await discover(broken, path)
    assert (
        d.route == "none"
        and d.verdict.code == "probe-error"
        and broken.runs == ['{"__test__": true}']
    )


def test_the_cache_is_bounded():
    cache = ProbeCache(limit=2)
    for i in range(3):
        cache.put((i,), i)
    assert cache.get((0,)) is None and cache.get((2,)) == 2
    assert fractalic_probe.cache_key("x", ["/no/such/file"], 1) is None


def test_catalog_follows_the_tools_a_folder_announces(tmp_path):
    echo = {"command": "python", "args": ["e.py"], "tools": ["echo.say"]}
    _, plan, _ = plan_with(tmp_path, {"echo": echo})
    sid = "auto:tools/auto"
    assert plan.sidecars[sid].announces
    cat = CatalogState()
    cat.load(plan)
    assert cat.get("weather").sidecar == sid
    announced = {
        n: ToolInfo(name=n, description=f"{n} from the folder")
        for n in ("one", "two", "echo.say", "file.hash", "git.status")
    }
    changed = cat.update_sidecar(sid, SidecarFacts(runtime="ready", announced=announced))
    # weather.py turned out to be a multi-tool script: it leaves, its tools join.
    assert cat.get("weather") is None and "weather" in cat.take_removed()
    one = cat.get("one")
    assert one.sidecar == sid and one.visible and one.description == "one from the folder"
    assert {d.name for d in changed} >= {"one", "two"}
    # A planned tool keeps its own plan (its file's path), and the registry still wins.
    assert cat.get("file.hash").stability.details.path.command == "./tools/auto/file.hash.py"
    assert cat.get("echo.say").sidecar == "echo"
    # The next worker no longer lists two: it leaves.
    announced.pop("two")
    cat.update_sidecar(sid, SidecarFacts(runtime="ready", announced=announced))
    assert cat.get("two") is None and cat.get("one") is not None
    assert os.path.exists(tmp_path / "tools" / "auto" / "weather.py")
