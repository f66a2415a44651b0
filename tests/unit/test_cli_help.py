"""Schemas read from ``--help`` (PROTOCOL 3.3): argparse's real output and GNU-style help."""

import subprocess
import sys

from supervisor.protocols.cli_help import schema_from_help

SCRIPT = """
import argparse
p = argparse.ArgumentParser(description="Greet someone nicely")
p.add_argument("--user-name", required=True,
               help="who to greet, a long help text that wraps over more than one line of help")
p.add_argument("--shout", action="store_true", help="shout it")
p.add_argument("--times", type=int, default=1, help="how many")
p.add_argument("-c", "--color", choices=["red", "blue"], help="the color")
p.parse_args()
"""


def test_real_argparse_help(tmp_path):
    script = tmp_path / "greet.py"
    script.write_text(SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, check=True
    ).stdout
    description, schema = schema_from_help(out)
    assert description == "Greet someone nicely"
    props = schema["properties"]
    assert set(props) == {"user_name", "shout", "times", "color"}
    assert props["user_name"]["description"].endswith("more than one line of help")
    assert props["shout"]["type"] == "boolean"
    assert props["color"] == {"type": "string", "enum": ["red", "blue"], "description": "the color"}
    assert schema["required"] == ["user_name"]


def test_gnu_style_help_and_non_help():
    text = (
        "Usage: words.sh [OPTIONS] --name NAME\nEcho words.\n\nOptions:\n"
        "  -n, --name NAME   who\n  --loud            shout\n"
        "      --color=COLOR  the color (required)\n  -h, --help        this help\n"
    )
    description, schema = schema_from_help(text)
    assert description == "Echo words."
    assert schema["required"] == ["name", "color"]
    assert schema["properties"]["loud"] == {"type": "boolean", "description": "shout"}
    assert schema_from_help("hello world\n") is None
    assert schema_from_help("") is None
