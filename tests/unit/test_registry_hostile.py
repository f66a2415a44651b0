"""Hostile registry and manifest files: every problem is reported with its JSON path, and
nothing the loader is fed makes it raise (issue 12)."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.registry.load import load_registry
from supervisor.registry.manifests import load_known_catalog, load_manifest_file
from supervisor.registry.plan import build_plan

REL = "tools/external.tools.jsonc"
GOOD = {"command": "python", "args": ["-m", "x"], "tools": ["a.b"]}


def load_text(root, text: str | bytes):
    path = root / REL
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return load_registry(root, use_global=False)


def entry_doc(entry) -> str:
    return '{"schemaVersion": 2, "sidecars": {"s": ' + entry + "}}"


def test_deep_nesting_is_a_reason_not_a_recursion_error(tmp_path):
    reg = load_text(tmp_path, "[" * 100_000 + "]" * 100_000)
    assert reg.unreadable
    assert any("nested deeper than 64 levels" in e for e in reg.errors), reg.errors


def test_deep_nesting_inside_an_entry(tmp_path):
    inner = "[" * 900 + "]" * 900
    reg = load_text(tmp_path, entry_doc('{"command": "x", "config": {"k": ' + inner + "}}"))
    assert any("nested deeper" in e for e in reg.errors)


@pytest.mark.parametrize(
    ("value", "shown"),
    [("NaN", "NaN"), ("Infinity", "Infinity"), ("-Infinity", "-Infinity"), ("1e999", "Infinity")],
)
def test_non_finite_numbers_are_reported_as_themselves(tmp_path, value, shown):
    reg = load_text(tmp_path, entry_doc('{"command": "x", "pool": {"max": ' + value + "}}"))
    entry = reg.sidecars["s"]
    assert not entry.valid
    assert entry.errors == [
        f"sidecars.s.pool.max: {shown} is not a number (JSON has no NaN or Infinity)"
    ]
    assert "null" not in entry.errors[0]


def test_nan_in_a_free_form_field_is_refused_too(tmp_path):
    reg = load_text(tmp_path, entry_doc('{"command": "x", "config": {"ratio": NaN}}'))
    assert reg.sidecars["s"].errors == [
        "sidecars.s.config.ratio: NaN is not a number (JSON has no NaN or Infinity)"
    ]


def test_nan_in_host_keeps_host_defaults(tmp_path):
    reg = load_text(tmp_path, '{"schemaVersion": 2, "host": {"maxRestartsPerSecond": Infinity}}')
    assert reg.host.max_restarts_per_second == 10.0
    assert any(e.startswith("host.maxRestartsPerSecond: Infinity") for e in reg.errors)


def test_huge_integers_are_refused(tmp_path):
    reg = load_text(tmp_path, entry_doc('{"command": "x", "pool": {"max": ' + "9" * 40 + "}}"))
    assert reg.sidecars["s"].errors == [
        "sidecars.s.pool.max: number with 40 digits is out of the 64-bit range"
    ]
    reg = load_text(tmp_path, '{"schemaVersion": 2, "x": ' + "9" * 5000 + "}")
    assert reg.unreadable and "not valid JSONC" in reg.errors[0]


def test_bad_utf8_directory_and_unreadable_file(tmp_path):
    reg = load_text(tmp_path, b'{"schemaVersion": 2, "sidecars": {"s": "\xff\xfe"}}')
    assert reg.unreadable and "not UTF-8 (byte 0xff" in reg.errors[0]
    (tmp_path / REL).unlink()
    (tmp_path / REL).mkdir()
    reg = load_registry(tmp_path, use_global=False)
    assert reg.errors == [f"{REL}: cannot read: it is a directory, not a file"]
    (tmp_path / REL).rmdir()
    # Unreadable even for root: a symlink loop (ELOOP).
    loop = tmp_path / "tools" / "loop"
    loop.symlink_to(tmp_path / REL)
    (tmp_path / REL).symlink_to(loop)
    reg = load_registry(tmp_path, use_global=False)
    assert reg.unreadable and "cannot read" in reg.errors[0], reg.errors


def test_every_problem_of_an_entry_is_listed(tmp_path):
    entry = {
        "command": "",
        "pool": {"max": 0, "mx": 1},
        "protocol": "grpc",
        "tools": ["ok", "bad name"],
        "bogus": True,
    }
    reg = load_text(tmp_path, json.dumps({"schemaVersion": 2, "sidecars": {"s": entry}}))
    errors = reg.sidecars["s"].errors
    assert sorted(errors) == sorted(
        [
            'sidecars.s.command: expected str of length >= 1, got ""',
            "sidecars.s.pool.max: expected int >= 1, got 0",
            "sidecars.s.pool.mx: unknown field",
            'sidecars.s.protocol: invalid value "grpc"',
            "sidecars.s.tools[1]: expected str matching regex "
            "'^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$', got \"bad name\"",
            "sidecars.s.bogus: unknown field",
        ]
    ), errors
    # The invalid entry's tools stay in the plan as manifest: invalid, with every reason.
    from supervisor.registry.manifests import KnownCatalog

    plan = build_plan(reg, KnownCatalog(), host_version="0.1.0")
    assert plan.tools["ok"].manifest_state == "invalid"
    assert "pool.mx: unknown field" in plan.tools["ok"].reasons["manifest"].message


def test_every_host_problem_is_listed(tmp_path):
    reg = load_text(
        tmp_path, json.dumps({"schemaVersion": 2, "host": {"maxFrameBytes": 0, "sokket": "x"}})
    )
    assert "host.maxFrameBytes: expected int >= 1, got 0 (host defaults used)" in reg.errors
    assert "host.sokket: unknown field (host defaults used)" in reg.errors


def test_a_duplicate_tool_is_a_reason_naming_both_sidecars(tmp_path):
    from supervisor.registry.manifests import KnownCatalog

    doc = {"schemaVersion": 2, "sidecars": {"one": GOOD, "two": GOOD}}
    reg = load_text(tmp_path, json.dumps(doc))
    plan = build_plan(reg, KnownCatalog(), host_version="0.1.0", which=lambda n, p: "/bin/true")
    tp = plan.tools["a.b"]
    assert tp.manifest_state == "invalid"
    reason = tp.reasons["manifest"]
    assert reason.code == "duplicate-tool"
    assert "one, two" in reason.message
    assert reg.sidecars["one"].warnings == ["sidecars.one.tools: a.b is also declared by two"]
    assert reg.sidecars["two"].warnings == ["sidecars.two.tools: a.b is also declared by one"]


def test_hostile_manifest_files(tmp_path):
    (tmp_path / "deep.toml").write_text("a = " + "[" * 100_000 + "]" * 100_000 + "\n")
    (tmp_path / "nan.toml").write_text('[[tool]]\nname = "x.y"\ntimeoutMs = nan\n')
    (tmp_path / "bad.toml").write_bytes(b"\xff\xfe = 1\n")
    (tmp_path / "dir.toml").mkdir()
    catalog = load_known_catalog([tmp_path])
    errors = " | ".join(catalog.errors)
    assert "deep.toml: not valid TOML: maximum recursion depth" in errors
    assert "nan.toml: tool[0].timeoutMs: NaN is not a number" in errors
    assert "bad.toml: cannot read:" in errors
    assert "dir.toml: cannot read: it is a directory" in errors
    assert load_manifest_file(tmp_path / "absent.toml")[1] is not None


# property tests --------------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=30,
)
field_names = st.sampled_from(
    [
        "command", "args", "cwd", "env", "protocol", "mode", "tools", "enabled", "config",
        "timeoutMs", "pool", "probe", "restart", "quota", "limits", "sandbox", "upgrade",
        "min", "max", "queue", "callsPerDay", "tools", "bogus",
    ]
)  # fmt: skip
entries = st.dictionaries(field_names, json_values | st.dictionaries(field_names, json_values))
documents = st.fixed_dictionaries(
    {"schemaVersion": st.sampled_from([1, 2, 3, "2", None])},
    optional={
        "sidecars": st.dictionaries(st.text(max_size=10), entries | json_values, max_size=3),
        "host": st.dictionaries(
            st.sampled_from(["socket", "maxFrameBytes", "ws", "auditLog", "x"]), json_values
        ),
        "autodiscover": json_values,
        "extra": json_values,
    },
)


def to_json5(doc) -> str:
    """JSON text where non-finite floats are written the JSON5 way."""
    return json.dumps(doc, allow_nan=True)


def _check(reg):
    for entry in reg.sidecars.values():
        assert entry.valid or entry.errors, entry
    assert all(isinstance(e, str) and e for e in reg.errors)


PROP = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROP
@given(doc=documents)
def test_random_registries_load_or_report(tmp_path_factory, doc):
    root = tmp_path_factory.mktemp("reg")
    reg = load_text(root, to_json5(doc))
    _check(reg)
    from supervisor.registry.manifests import KnownCatalog

    build_plan(reg, KnownCatalog(), host_version="0.1.0", which=lambda n, p: None)


VALID = json.dumps(
    {
        "schemaVersion": 2,
        "host": {"socket": ".toolhost/h.sock"},
        "sidecars": {"s": {**GOOD, "pool": {"min": 1, "max": 2}, "env": {"A": "1"}}},
    },
    indent=1,
)


@PROP
@given(
    cuts=st.lists(
        st.tuples(st.integers(0, len(VALID)), st.integers(0, 8), st.text(max_size=6)),
        min_size=1,
        max_size=6,
    )
)
def test_mutated_registries_load_or_report(tmp_path_factory, cuts):
    text = VALID
    for pos, drop, insert in cuts:
        pos = min(pos, len(text))
        text = text[:pos] + insert + text[pos + drop :]
    reg = load_text(tmp_path_factory.mktemp("mut"), text)
    _check(reg)


@PROP
@given(data=st.binary(max_size=200))
def test_random_bytes_load_or_report(tmp_path_factory, data):
    reg = load_text(tmp_path_factory.mktemp("bin"), data)
    _check(reg)


def test_surrogate_escapes(tmp_path):
    # A pair is one character (json5 leaves it as two code points); a lone one is a problem,
    # not a UnicodeEncodeError out of msgspec (found by the property test).
    doc = '{"schemaVersion": 2, "host": {"ws": {"\\ud800": 1}}, "sidecars": {"s": %s}}'
    entry = '{"command": "x", "env": {"E": "\\ud83d\\ude00"}, "tools": ["a.b"]}'
    reg = load_text(tmp_path, doc % entry)
    assert reg.sidecars["s"].config.env == {"E": "\U0001f600"}
    assert "host.ws: a key contains an unpaired UTF-16 surrogate escape (host defaults used)" in (
        reg.errors
    )


def test_a_nan_does_not_hide_the_other_problems_of_an_entry(tmp_path):
    reg = load_text(
        tmp_path,
        entry_doc('{"command": "x", "pool": {"max": "two"}, "timeoutMs": NaN, "bogus": 1}'),
    )
    assert sorted(reg.sidecars["s"].errors) == sorted(
        [
            "sidecars.s.timeoutMs: NaN is not a number (JSON has no NaN or Infinity)",
            'sidecars.s.pool.max: expected int, got "two"',
            "sidecars.s.bogus: unknown field",
        ]
    )
    # A NaN in a free-form field still lets the rules a struct cannot express be checked.
    reg = load_text(
        tmp_path, entry_doc('{"command": "x", "pool": {"min": 3, "max": 2}, "config": {"r": NaN}}')
    )
    assert reg.sidecars["s"].errors == [
        "sidecars.s.config.r: NaN is not a number (JSON has no NaN or Infinity)",
        "sidecars.s.pool.min: 3 is above pool.max 2",
    ]
    assert not reg.sidecars["s"].valid


def test_a_nan_does_not_hide_the_other_problems_of_host_and_manifest(tmp_path):
    reg = load_text(tmp_path, '{"schemaVersion": 2, "host": {"maxFrameBytes": NaN, "sokket": 1}}')
    assert reg.errors == [
        "host.maxFrameBytes: NaN is not a number (JSON has no NaN or Infinity)"
        " (host defaults used)",
        "host.sokket: unknown field (host defaults used)",
    ]
    path = tmp_path / "m.toml"
    path.write_text('[[tool]]\nname = "a.b"\ntimeoutMs = nan\nbogus = 1\n')
    manifest, error = load_manifest_file(path)
    assert manifest is None and error is not None
    assert "tool[0].timeoutMs: NaN is not a number" in error, error
    assert "tool[0].bogus: unknown field" in error, error
