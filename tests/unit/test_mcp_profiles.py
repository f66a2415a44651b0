"""Per-client profiles of ``toolhost mcp``: patterns, filters, refusals that name the profile, the
registry's ``host.mcp`` checked with clear messages, and bearer tokens that each give a profile."""

import json
import os

import pytest

from supervisor.contracts.registry import McpConfig, McpProfileConfig, McpTokenConfig
from supervisor.mcp_face.auth import DEFAULT, Identity, TokenTable, load_tokens
from supervisor.mcp_face.profiles import Profile, from_config, from_patterns, named, split_patterns
from supervisor.registry.load import load_registry

TOOLS = [{"name": n} for n in ("web.fetch", "web.search", "file.hash", "file.read", "shell.run")]


@pytest.mark.parametrize(
    ("patterns", "shown"),
    [
        ("web.*,file.hash", ["web.fetch", "web.search", "file.hash"]),
        (" file.* , ", ["file.hash", "file.read"]),
        ("*", [t["name"] for t in TOOLS]),
        ("web.fetch", ["web.fetch"]),
        ("web", []),
        ("*.r*", ["file.read", "shell.run"]),
        ("[fs]*", ["file.hash", "file.read", "shell.run"]),
    ],
)
def test_tools_patterns_filter_lists_in_order(patterns, shown):
    profile = from_patterns(patterns)
    assert [t["name"] for t in profile.tools_of(TOOLS)] == shown
    for tool in TOOLS:
        assert profile.allows("tool", tool["name"]) == (tool["name"] in shown)


def test_tools_patterns_hide_resources_and_prompts_and_name_themselves():
    profile = from_patterns("web.*,file.hash")
    assert profile.name == "--tools web.*,file.hash"
    assert profile.resources_of([{"uri": "file:///a"}]) == []
    assert profile.prompts_of([{"name": "p"}]) == []
    assert profile.refusal("tool", "shell.run") == (
        "tool 'shell.run' is not in profile '--tools web.*,file.hash'"
    )
    with pytest.raises(ValueError, match="at least one pattern"):
        from_patterns(" , ")
    assert split_patterns("a,,b ,") == ["a", "b"]


def test_a_registry_profile_filters_every_kind():
    profile = from_config(
        "git",
        McpProfileConfig(
            tools=["git.*"], resources=["git://repo/*"], prompts=["commit-*", "review"]
        ),
    )
    assert profile.resources_of(
        [{"uri": "git://repo/HEAD"}, {"uri": "file:///etc/passwd"}, {"name": "no uri"}]
    ) == [{"uri": "git://repo/HEAD"}]
    assert profile.templates_of(
        [{"uriTemplate": "git://repo/{ref}"}, {"uriTemplate": "file:///{path}"}]
    ) == [{"uriTemplate": "git://repo/{ref}"}]
    assert profile.prompts_of([{"name": "commit-msg"}, {"name": "review"}, {"name": "x"}]) == [
        {"name": "commit-msg"},
        {"name": "review"},
    ]
    assert profile.allows("resource", "git://repo/a/b")  # * spans slashes
    assert not profile.allows("prompt", "reviewer")  # whole names only
    assert profile.refusal("prompt", "x") == "prompt 'x' is not in profile 'git'"
    assert "git" in repr(profile)


def test_an_empty_profile_shows_nothing():
    nothing = Profile("none")
    assert nothing.tools_of(TOOLS) == []
    assert not nothing.allows("tool", "")


def test_named_profiles_and_unknown_names():
    config = McpConfig(profiles={"web": McpProfileConfig(tools=["web.*"])})
    assert named(config, "web").allows("tool", "web.fetch")
    with pytest.raises(KeyError) as exc:
        named(config, "wbe")
    assert exc.value.args[0] == "no profile 'wbe' in host.mcp.profiles (profiles: web)"
    with pytest.raises(KeyError, match="none in the registry"):
        named(McpConfig(), "x")


# the registry -------------------------------------------------------------------------------


def load(tmp_path, host):
    path = tmp_path / "tools" / "external.tools.jsonc"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schemaVersion": 2, "host": host, "sidecars": {}}))
    return load_registry(tmp_path, use_global=False)


def test_host_mcp_is_read(tmp_path):
    reg = load(
        tmp_path,
        {
            "mcp": {
                "profiles": {"web": {"tools": ["web.*"], "prompts": ["*"]}},
                "tokens": {
                    "ci": {"tokenFile": ".toolhost/ci.token", "profile": "web"},
                    "admin": {"tokenFile": "/etc/toolhost/admin.token"},
                },
            }
        },
    )
    assert reg.errors == []
    assert reg.host.mcp.profiles["web"].tools == ["web.*"]
    assert reg.host.mcp.tokens["ci"] == McpTokenConfig(
        token_file=".toolhost/ci.token", profile="web"
    )
    assert reg.host.mcp.tokens["admin"].profile is None
    # The token files are the host's own: no sidecar may read them.
    private = reg.host_private([], [])
    assert str(tmp_path / ".toolhost" / "ci.token") in private or any(
        str(tmp_path / ".toolhost").startswith(p) for p in private
    )
    assert "/etc/toolhost/admin.token" in private


@pytest.mark.parametrize(
    ("mcp", "message"),
    [
        ({"profile": {}}, "host.mcp.profile: unknown field"),
        ({"profiles": {"web": {"tool": ["x"]}}}, "host.mcp.profiles.web.tool: unknown field"),
        ({"profiles": {"web": {"tools": "web.*"}}}, "host.mcp.profiles.web.tools: expected array"),
        ({"profiles": {"web": {"tools": [""]}}}, "host.mcp.profiles.web.tools[0]: expected str"),
        (
            {"profiles": {"bad name": {"tools": ["*"]}}},
            "host.mcp.profiles.bad name: a name of letters, digits",
        ),
        ({"tokens": {"ci": {"profile": "web"}}}, "host.mcp.tokens.ci.tokenFile: required field"),
    ],
)
def test_host_mcp_type_errors_name_the_path(tmp_path, mcp, message):
    reg = load(tmp_path, {"mcp": mcp})
    assert any(e.startswith(message) for e in reg.errors), reg.errors


def test_a_token_naming_no_profile_is_dropped_with_a_clear_error(tmp_path):
    reg = load(
        tmp_path,
        {
            "mcp": {
                "profiles": {"web": {"tools": ["web.*"]}},
                "tokens": {
                    "ci": {"tokenFile": "ci.token", "profile": "wbe"},
                    "ok": {"tokenFile": "ok.token", "profile": "web"},
                    "twin": {"tokenFile": "./ok.token", "profile": "web"},
                },
            }
        },
    )
    assert reg.errors == [
        "host.mcp.tokens.ci.profile: no profile 'wbe' in host.mcp.profiles (profiles: web); "
        "this token is not accepted",
        "host.mcp.tokens.twin.tokenFile: './ok.token' is host.mcp.tokens.ok's file too; each "
        "token needs its own (this one is not accepted)",
    ]
    assert set(reg.host.mcp.tokens) == {"ok"}  # fails closed: never everything


def test_a_profile_that_names_nothing_is_reported(tmp_path):
    reg = load(tmp_path, {"mcp": {"profiles": {"empty": {}}}})
    assert reg.errors == [
        "host.mcp.profiles.empty: names no tools, resources or prompts, so its clients see "
        'nothing (["*"] shows all of a kind)'
    ]


# tokens ---------------------------------------------------------------------------------------


def test_each_token_gives_its_profile(tmp_path):
    web = from_patterns("web.*")
    config = McpConfig(
        profiles={"files": McpProfileConfig(tools=["file.*"])},
        tokens={
            "ci": McpTokenConfig(token_file="ci.token", profile="files"),
            "admin": McpTokenConfig(token_file="admin.token"),
        },
    )
    default = str(tmp_path / "mcp.token")
    table, problems = load_tokens(default, web, config, lambda p: str(tmp_path / p))
    assert problems == []
    for name in ("mcp.token", "ci.token", "admin.token"):  # generated, private
        assert oct(os.stat(tmp_path / name).st_mode & 0o777) == "0o600"
    token = {
        n: (tmp_path / f).read_text().strip()
        for n, f in (("default", "mcp.token"), ("ci", "ci.token"), ("admin", "admin.token"))
    }
    assert table.identify(f"Bearer {token['default']}".encode()) == Identity(DEFAULT, web)
    ci = table.identify(f"Bearer {token['ci']}".encode())
    assert ci is not None and ci.name == "ci" and ci.profile is not None
    assert ci.profile.name == "files" and ci.profile.allows("tool", "file.hash")
    admin = table.identify(f"  Bearer {token['admin']} ".encode())
    assert admin == Identity("admin", None)
    assert table.identify(b"Bearer nope") is None
    assert table.identify(b"") is None
    assert table.identify(token["ci"].encode()) is None  # the scheme is part of it


def test_a_reload_keeps_a_token_it_cannot_read_and_refuses_shared_ones(tmp_path):
    config = McpConfig(tokens={"ci": McpTokenConfig(token_file="ci.token")})
    path = lambda p: str(tmp_path / p)  # noqa: E731
    default = str(tmp_path / "mcp.token")
    first, problems = load_tokens(default, None, config, path)
    assert problems == []
    ci = (tmp_path / "ci.token").read_text().strip()
    # The file becomes a symlink (never followed): the token read before stays.
    (tmp_path / "ci.token").unlink()
    (tmp_path / "elsewhere").write_text("stolen\n")
    (tmp_path / "ci.token").symlink_to(tmp_path / "elsewhere")
    second, problems = load_tokens(default, None, config, path, previous=first)
    assert len(problems) == 1 and "the token read before is kept" in problems[0]
    assert second.identify(f"Bearer {ci}".encode()) == Identity("ci", None)
    assert second.identify(b"Bearer stolen") is None
    # At start there is nothing to keep: the token is not accepted.
    third, problems = load_tokens(default, None, config, path)
    assert "this token is not accepted" in problems[0]
    assert set(third.tokens) == {DEFAULT}
    # Two files with one token: the second is refused.
    (tmp_path / "ci.token").unlink()
    (tmp_path / "ci.token").write_text((tmp_path / "mcp.token").read_text())
    os.chmod(tmp_path / "ci.token", 0o600)
    fourth, problems = load_tokens(default, None, config, path)
    assert problems == [
        f"host.mcp.tokens.ci: {tmp_path / 'ci.token'} holds the same token as --token-file; "
        "each client needs its own token (this one is not accepted)"
    ]
    assert set(fourth.tokens) == {DEFAULT}


def test_a_single_token_table():
    table = TokenTable.single("s3cret")
    assert table.identify(b"Bearer s3cret") == Identity(DEFAULT, None)
    assert table.identify(b"Bearer s3cre") is None
