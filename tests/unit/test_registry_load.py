"""Registry validation messages name the JSON path; one broken entry never spoils the others."""

import json

import pytest

from supervisor.registry.load import is_builtin, load_registry


def write(root, text, rel="tools/external.tools.jsonc"):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if isinstance(text, str) else json.dumps(text))
    return path


def load(tmp_path, doc):
    write(tmp_path, doc)
    return load_registry(tmp_path, use_global=False)


GOOD = {"command": "python", "args": ["-m", "x"], "tools": ["a.b"]}


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({**GOOD, "pool": {"max": "two"}}, 'sidecars.s.pool.max: expected int, got "two"'),
        ({**GOOD, "pool": {"max": 0}}, "sidecars.s.pool.max: expected int >= 1, got 0"),
        ({**GOOD, "pool": {"mx": 1}}, "sidecars.s.pool.mx: unknown field"),
        ({**GOOD, "bogus": True}, "sidecars.s.bogus: unknown field"),
        ({**GOOD, "cwd": "home"}, 'sidecars.s.cwd: invalid value "home"'),
        ({**GOOD, "protocol": "grpc"}, 'sidecars.s.protocol: invalid value "grpc"'),
        ({"args": []}, "sidecars.s.command: required field missing"),
        ({**GOOD, "command": ""}, 'sidecars.s.command: expected str of length >= 1, got ""'),
        ({**GOOD, "tools": ["ok", "bad name"]}, "sidecars.s.tools[1]: expected str matching regex"),
        (
            {**GOOD, "restart": {"policy": "sometimes"}},
            'sidecars.s.restart.policy: invalid value "sometimes"',
        ),
        ({**GOOD, "pool": {"min": 3, "max": 2}}, "sidecars.s.pool.min: 3 is above pool.max 2"),
        (
            {**GOOD, "sandbox": {"zz.top": "denied"}},
            "sidecars.s.sandbox.zz.top: not one of this sidecar's tools",
        ),
        (
            {**GOOD, "protocol": "mcp", "mode": "oneshot"},
            "sidecars.s.mode: oneshot applies to process-json only",
        ),
        ("not an object", "sidecars.s: expected object, got str"),
        (
            {**GOOD, "quota": {"tools": {"zz.top": {"callsPerMinute": 1}}}},
            "sidecars.s.quota.tools.zz.top: not one of this sidecar's tools",
        ),
        (
            {**GOOD, "quota": {"tools": {"a.b": {"rssMb": 1}}}},
            'sidecars.s.quota.tools["a.b"].rssMb: unknown field',
        ),
        (
            {**GOOD, "quota": {"callsPerMinute": -1}},
            "sidecars.s.quota.callsPerMinute: expected int >= 0, got -1",
        ),
        ({**GOOD, "limits": {"memMb": 1}}, "sidecars.s.limits.memMb: unknown field"),
        (
            {**GOOD, "limits": {"nofile": "many"}},
            'sidecars.s.limits.nofile: expected int, got "many"',
        ),
    ],
)
def test_entry_errors_name_the_path(tmp_path, entry, message):
    reg = load(tmp_path, {"schemaVersion": 2, "sidecars": {"s": entry, "good": GOOD}})
    bad = reg.sidecars["s"]
    assert not bad.valid
    assert bad.errors and bad.errors[0].startswith(message), bad.errors
    assert reg.sidecars["good"].valid  # one broken entry never spoils another


def test_salvages_tool_names_of_an_invalid_entry(tmp_path):
    reg = load(
        tmp_path,
        {"schemaVersion": 2, "sidecars": {"s": {**GOOD, "tools": ["x.y", "z.w"], "pool": 5}}},
    )
    assert reg.sidecars["s"].tools == ["x.y", "z.w"]
    assert not reg.sidecars["s"].valid


@pytest.mark.parametrize("version", [3, "2", None, 0])
def test_bad_schema_version_invalidates_every_sidecar(tmp_path, version):
    doc = {"sidecars": {"a": GOOD}}
    if version is not None:
        doc["schemaVersion"] = version
    reg = load(tmp_path, doc)
    assert not reg.sidecars["a"].valid
    assert "schemaVersion" in reg.sidecars["a"].errors[0]
    assert any("schemaVersion" in e for e in reg.errors)


def test_schema_version_1_accepted(tmp_path):
    assert load(tmp_path, {"schemaVersion": 1, "sidecars": {"a": GOOD}}).sidecars["a"].valid


def test_jsonc_comments_and_trailing_commas(tmp_path):
    reg = load(
        tmp_path,
        """// comment
        {
          "schemaVersion": 2, /* block */
          "sidecars": { "a": { "command": "python", "tools": ["a.b",], }, },
        }""",
    )
    assert reg.sidecars["a"].valid and reg.errors == []


def test_unparseable_file_is_reported_not_raised(tmp_path):
    reg = load(tmp_path, "{ this is not json")
    assert reg.unreadable
    assert reg.sidecars == {}
    assert reg.errors[0].startswith("tools/external.tools.jsonc: not valid JSONC")


def test_top_level_must_be_object(tmp_path):
    reg = load(tmp_path, "[1, 2]")
    assert reg.errors == ["tools/external.tools.jsonc: top level must be an object, got list"]


def test_missing_file_is_an_empty_registry(tmp_path):
    reg = load_registry(tmp_path, use_global=False)
    assert reg.sidecars == {} and reg.errors == [] and reg.files == []


def test_unknown_top_level_key_is_reported(tmp_path):
    reg = load(tmp_path, {"schemaVersion": 2, "sidecar": {}})
    assert reg.errors == ["tools/external.tools.jsonc: sidecar: unknown top-level field"]


def test_host_section_errors_keep_defaults(tmp_path):
    reg = load(tmp_path, {"schemaVersion": 2, "host": {"socket": 5}, "sidecars": {"a": GOOD}})
    assert reg.host.socket == ".toolhost/host.sock"
    assert any(e.startswith("host.socket: expected str") for e in reg.errors)
    assert reg.sidecars["a"].valid


def test_absolute_host_paths_refused(tmp_path):
    reg = load(tmp_path, {"schemaVersion": 2, "host": {"projectDir": "/etc"}})
    assert reg.host.project_dir == "workspace"
    assert any("host.projectDir: absolute paths are not portable" in e for e in reg.errors)


def test_global_and_project_merge(tmp_path):
    glob = write(
        tmp_path,
        {
            "schemaVersion": 2,
            "host": {"allowDegraded": True},
            "sidecars": {"a": {**GOOD, "args": ["global"]}, "g": GOOD},
        },
        "cfg/toolhost/external.tools.jsonc",
    )
    write(tmp_path, {"schemaVersion": 2, "sidecars": {"a": {**GOOD, "args": ["project"]}}})
    reg = load_registry(tmp_path, global_path=glob)
    assert reg.sidecars["a"].config.args == ["project"]  # project replaces global by id
    assert reg.sidecars["g"].valid
    assert reg.sidecars["g"].config_dir == str(glob.parent)
    assert reg.sidecars["a"].config_dir == str(tmp_path / "tools")
    assert reg.host.allow_degraded is True
    assert len(reg.files) == 2


def test_global_path_from_xdg(tmp_path, monkeypatch):
    from supervisor.registry.load import global_registry_path

    assert (
        str(global_registry_path({"XDG_CONFIG_HOME": "/x"})) == "/x/toolhost/external.tools.jsonc"
    )
    assert str(global_registry_path({"HOME": "/h"})) == "/h/.config/toolhost/external.tools.jsonc"


@pytest.mark.parametrize(
    ("name", "builtin"),
    [
        ("workspace.read", True),
        ("file.read", True),
        ("file.write", True),
        ("file.edit", True),
        ("file.list", True),
        ("patch.apply", True),
        ("git.status", True),
        ("process.spawn", True),
        ("shell.exec", True),
        ("git", True),
        ("file.hash", False),
        ("archive.create", False),
        ("gitlab.issue", False),
        ("web.search", False),
    ],
)
def test_builtin_names(name, builtin):
    assert is_builtin(name) is builtin


def test_quota_and_limits_parse(tmp_path):
    entry = {
        **GOOD,
        "quota": {"callsPerMinute": 5, "rssMb": 64, "tools": {"a.b": {"callsPerDay": 3}}},
        "limits": {"memoryMb": 512, "nofile": 256, "nproc": 8, "cpuSeconds": 60},
    }
    reg = load(
        tmp_path,
        {
            "schemaVersion": 2,
            "host": {"maxConcurrentSpawns": 2, "maxRestartsPerSecond": 1.5, "statsIntervalMs": 100},
            "sidecars": {"s": entry},
        },
    )
    cfg = reg.sidecars["s"].config
    assert cfg is not None
    assert cfg.quota.calls_per_minute == 5 and cfg.quota.tools["a.b"].calls_per_day == 3
    assert (cfg.limits.memory_mb, cfg.limits.nofile, cfg.limits.nproc) == (512, 256, 8)
    assert reg.host.max_concurrent_spawns == 2 and reg.host.max_restarts_per_second == 1.5


def test_quota_state_must_be_relative(tmp_path):
    reg = load(tmp_path, {"schemaVersion": 2, "host": {"quotaState": "/tmp/q.json"}})
    assert reg.host.quota_state == ".toolhost/quota-state.json"
    assert any("host.quotaState: absolute paths are not portable" in e for e in reg.errors)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (
            '{\n  "schemaVersion": 2,\n  "sidecars": {} x\n}',
            " at line 3, column 18: unexpected 'x'",
        ),
        ('{"a": 1,\n  "b": "x', " at line 2, column 10: unexpected end of input"),
        ("", ": the file is empty"),
    ],
)
def test_a_syntax_error_names_the_file_line_and_column(tmp_path, text, why):
    reg = load(tmp_path, text)
    assert reg.unreadable and reg.files == []
    assert reg.unusable == ["tools/external.tools.jsonc"]
    assert reg.errors == [f"tools/external.tools.jsonc: not valid JSONC{why}"]


def test_a_missing_registry_named_explicitly_is_an_error(tmp_path):
    reg = load_registry(tmp_path, registry_path="typo.jsonc", use_global=False)
    assert reg.missing == str(tmp_path / "typo.jsonc")
    assert reg.unreadable
    assert reg.errors == [f"typo.jsonc: no such file ({tmp_path / 'typo.jsonc'})"]
    # The default registry may be absent: no registry yet is not a mistake.
    reg = load_registry(tmp_path, use_global=False)
    assert reg.missing == "" and reg.errors == [] and not reg.unreadable
