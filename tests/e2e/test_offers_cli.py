"""``toolhost resources`` and ``toolhost prompts`` against a real ``toolhost serve`` hosting two
SDK-written MCP servers that publish the same URIs and prompt: the first in the registry owns
them, the other's are listed as shadowed."""

import json
import time

from tests.conftest import FIXTURES, write_registry
from tests.e2e.conftest import cli, serve

OFFERS = FIXTURES.parent / "mcp" / "offers.py"


def _entry(name: str) -> dict:
    return {
        "command": "python",
        "args": [str(OFFERS)],
        "protocol": "mcp",
        "env": {"OFFERS_NAME": name},
        "probe": {"startTimeoutMs": 20_000},
    }


def test_resources_and_prompts_cli(tmp_path):
    root = tmp_path / "app"
    root.mkdir()
    write_registry(root, {"alpha": _entry("alpha"), "beta": _entry("beta")})
    with serve(root):
        deadline = time.monotonic() + 40
        while True:
            r = cli(root, "resources", "--json")
            data = json.loads(r.stdout) if r.returncode == 0 else {}
            if len(data.get("shadowed", [])) == 2:  # both servers listed theirs
                break
            assert time.monotonic() < deadline, (r.stdout, r.stderr)
            time.sleep(0.2)
        assert {(x["uri"], x["sidecar"]) for x in data["resources"]} == {
            ("note://readme", "alpha"),
            ("note://shared", "alpha"),
        }
        assert [t["uriTemplate"] for t in data["resourceTemplates"]] == ["note://page/{name}"]

        r = cli(root, "resources")
        assert r.returncode == 0, r.stderr
        assert "note://readme  [alpha]  The readme" in r.stdout
        assert "shadowed: note://readme of beta (owned by alpha)" in r.stdout

        r = cli(root, "resources", "note://page/home")
        assert r.returncode == 0 and r.stdout.strip() == "page home from alpha", r.stderr

        r = cli(root, "prompts")
        assert r.returncode == 0, r.stderr
        assert "greet(who, tone)  [alpha]  Greet someone" in r.stdout
        assert "shadowed: greet of beta (owned by alpha)" in r.stdout

        r = cli(root, "prompts", "greet", "--arg", "who=Ada", "--arg", "tone=formal")
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "user: Say hello to Ada in a formal tone (alpha)"

        r = cli(root, "resources", "nowhere://x")
        assert r.returncode != 0 and "not-found" in r.stderr


def test_empty_lists_say_why_and_a_bad_arg_is_a_usage_error(tmp_path):
    """A host with no MCP server: the lists are empty on stdout and say why on stderr; an
    ``--arg`` without ``=`` is refused before anything is asked (exit 2, never an internal
    error)."""
    root = tmp_path / "app"
    root.mkdir()
    write_registry(root, {})
    r = cli(root, "prompts", "greet", "--arg", "who")
    assert r.returncode == 2 and "expected NAME=VALUE, got 'who'" in r.stderr, r.stderr
    assert "internal error" not in r.stderr
    with serve(root):
        for what in ("resources", "prompts"):
            r = cli(root, what)
            assert r.returncode == 0 and r.stdout == "", (r.stdout, r.stderr)
            assert f"no {what}: no available MCP server offers any" in r.stderr
        r = cli(root, "resources", "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["resources"] == [] and r.stderr == ""
