"""Swapping one registry entry keeps the operator's comments and layout, and is always correct."""

import json5
import pytest

from supervisor.packages.jsonc import set_sidecar

ENTRY = {"command": "./tools/packages/greet/bin/greet", "tools": ["greet.version"]}

COMMENTED = """// my registry: keep this comment
{
  "schemaVersion": 2,
  /* the sidecars */
  "sidecars": {
    // the utility one
    "utility": { "command": "python", "args": ["-m", "sidecars.utility"], "tools": ["file.hash"] },
    "greet": {
      "command": "./tools/packages/greet/bin/greet", // old version
      "tools": ["greet.version"],
      "packageVersion": "1.0.0",
    },
  },
}
"""


def parsed(text):
    return json5.loads(text)


def test_replacing_an_entry_keeps_comments_elsewhere():
    entry = {**ENTRY, "packageVersion": "1.1.0"}
    text, preserved = set_sidecar(COMMENTED, "greet", entry)
    assert preserved
    assert "// my registry: keep this comment" in text and "// the utility one" in text
    assert "/* the sidecars */" in text
    doc = parsed(text)
    assert doc["sidecars"]["greet"] == entry
    assert doc["sidecars"]["utility"] == parsed(COMMENTED)["sidecars"]["utility"]


def test_adding_an_entry_after_a_trailing_comma_and_without_one():
    text, preserved = set_sidecar(COMMENTED, "new", ENTRY)
    assert preserved and parsed(text)["sidecars"]["new"] == ENTRY
    no_trailing = '{"schemaVersion": 2, "sidecars": {"a": {"command": "x"}}}'
    text, preserved = set_sidecar(no_trailing, "b", ENTRY)
    assert preserved and parsed(text)["sidecars"] == {"a": {"command": "x"}, "b": ENTRY}


@pytest.mark.parametrize(
    "text",
    [
        "{schemaVersion: 2, sidecars: {}}",
        "{'schemaVersion': 2, 'sidecars': {'a': {'command': 'it''s'}}}".replace("''", "\\'"),
        '{"schemaVersion": 2, "sidecars": {/* empty */}} // tail',
        '{"schemaVersion": 2, "sidecars": {"a": {"b": [1, 2,], "c": "}{//"}}}',
        '\ufeff{"schemaVersion": 2, "sidecars": {"greet": 1}}',
    ],
)
def test_edits_of_json5_forms_parse_to_the_intended_document(text):
    new, _ = set_sidecar(text, "greet", ENTRY)
    expected = parsed(text)
    expected["sidecars"] = {**expected["sidecars"], "greet": ENTRY}
    assert parsed(new) == expected


def test_without_a_sidecars_object_the_document_is_rewritten_correctly():
    new, preserved = set_sidecar('// c\n{"schemaVersion": 2, "host": {"socket": "s"}}', "g", ENTRY)
    assert not preserved
    assert parsed(new) == {"schemaVersion": 2, "host": {"socket": "s"}, "sidecars": {"g": ENTRY}}


def test_no_file_yet():
    new, _ = set_sidecar(None, "g", ENTRY)
    assert parsed(new) == {"schemaVersion": 2, "sidecars": {"g": ENTRY}}


def test_invalid_jsonc_is_an_error():
    with pytest.raises(ValueError):
        set_sidecar("{ not json", "g", ENTRY)
