"""What an operator is told about confinement: the status label, the ``confinement-unavailable``
reason, and which grant would allow what a sidecar was denied (pure: a fake file tree)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.contracts.confine import ConfinementFacts, EgressRecord, KernelFacts, Profile
from supervisor.contracts.registry import NetworkGrant
from supervisor.policy.confine_explain import (
    denial_hints,
    denied_paths,
    facts_label,
    label,
    planned_facts,
    unavailable_reason,
)
from tests.unit.test_confine_policy import FULL, LAYOUT, plan_for

STRICT_PLAN = plan_for(Profile())
PRIVATE = LAYOUT.host_private


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("PermissionError: [Errno 13] Permission denied: '/data/x.csv'", [("/data/x.csv", "")]),
        ('[Errno 1] Operation not permitted: "/it\'s/here"', [("/it's/here", "")]),
        (
            "Error: EACCES: permission denied, open '/srv/a/b.json'\n    at Object.openSync",
            [("/srv/a/b.json", "open")],
        ),
        ("Error: EPERM: operation not permitted, mkdir '/opt/new'", [("/opt/new", "mkdir")]),
        ("cat: /home/u/.ssh/id_ed25519: Permission denied", [("/home/u/.ssh/id_ed25519", "")]),
        ("open /var/lib/thing: permission denied", [("/var/lib/thing", "")]),
        # the same path twice is named once; a relative path and other errors are not paths
        (
            "[Errno 13] Permission denied: '/a/b'\ncat: /a/b: Permission denied",
            [("/a/b", "")],
        ),
        ("[Errno 13] Permission denied: 'relative.txt'", []),
        ("[Errno 2] No such file or directory: '/nope'", []),
        ("failed: timeout", []),
    ],
)
def test_denied_paths_are_found_in_the_usual_error_texts(
    text: str, expected: list[tuple[str, str]]
) -> None:
    assert denied_paths(text) == expected


def test_a_path_outside_every_grant_names_confine_read() -> None:
    hints = denial_hints(STRICT_PLAN, "[Errno 13] Permission denied: '/data/x.csv'")
    assert hints == ["confine.read would allow /data/x.csv (confine.write to change it)"]


def test_a_path_inside_a_read_grant_names_confine_write() -> None:
    # project: read grants /app/workspace read-only: the refusal was a write
    hints = denial_hints(STRICT_PLAN, "[Errno 13] Permission denied: '/app/workspace/out.txt'")
    assert hints == ["confine.write would allow /app/workspace/out.txt"]


def test_a_write_operation_outside_the_grants_names_confine_write() -> None:
    hints = denial_hints(STRICT_PLAN, "EACCES: permission denied, mkdir '/opt/new'")
    assert hints == ["confine.write would allow /opt/new"]


def test_a_path_inside_a_write_grant_was_not_refused_by_the_walls() -> None:
    plan = plan_for(Profile(project="write"))
    assert denial_hints(plan, "[Errno 13] Permission denied: '/app/workspace/out.txt'") == []


def test_a_new_file_at_the_top_of_a_carved_project_names_the_project_folder_fix() -> None:
    # STRICT_PLAN's cwd is the app root (carved around .toolhost/): listed, not writable
    hints = denial_hints(STRICT_PLAN, "[Errno 13] Permission denied: '/app/all.tar'")
    assert len(hints) == 1 and "nothing can be made there" in hints[0], hints
    assert 'host.projectDir to a folder of its own (e.g. "workspace")' in hints[0]


def test_never_granted_and_host_private_paths_say_no_grant_allows_them() -> None:
    text = (
        "[Errno 13] Permission denied: '/app/.toolhost/vault.json'\n"
        "cat: /home/u/.ssh/id_ed25519: Permission denied\n"
        "[Errno 13] Permission denied: '/etc/ssh/ssh_host_rsa_key'\n"
        "[Errno 13] Permission denied: '/app/tools/packages/x'"
    )
    hints = denial_hints(STRICT_PLAN, text, host_private=PRIVATE)
    assert len(hints) == 4
    assert not any(h.startswith("confine.") for h in hints)
    assert hints[0].startswith("/app/.toolhost/vault.json is never granted")
    assert hints[1].startswith("/home/u/.ssh/id_ed25519 is never granted")
    assert hints[2].startswith("/etc/ssh/ssh_host_rsa_key is never granted")
    assert hints[3].startswith("/app/tools/packages/x is host-private")


def test_network_refusals_name_the_loopback_or_allow_grant() -> None:
    plan = STRICT_PLAN
    assert plan.netns  # the full kernel gives a namespace
    hints = denial_hints(plan, "Error: connect ECONNREFUSED 127.0.0.1:9222")
    assert hints == ["confine.network.loopback [9222] would allow 127.0.0.1:9222"]
    hints = denial_hints(plan, "ConnectionRefusedError: [Errno 111] Connection refused")
    assert len(hints) == 1 and "reaches nothing" in hints[0]
    assert "confine.network.allow" in hints[0]
    text = "socket.socket()\nPermissionError: [Errno 1] Operation not permitted"
    hints = denial_hints(plan, text)
    assert len(hints) == 1 and 'network: "none"' in hints[0]
    # network: host is never refused by the walls
    assert denial_hints(plan_for(Profile(network="host")), "Connection refused") == []


def test_a_proxy_refusal_during_the_call_is_named_with_its_rule() -> None:
    plan = plan_for(Profile(network=NetworkGrant(allow=["api.example.com:443"])))
    refused = EgressRecord(
        sidecar="s",
        host="evil.example",
        port=443,
        allowed=False,
        rule="no-rule",
        reason="evil.example:443 matches no confine.network.allow rule",
    )
    allowed = EgressRecord(sidecar="s", host="api.example.com", port=443, allowed=True, rule="x")
    hints = denial_hints(plan, "HTTP Error 403: Forbidden", refusals=[allowed, refused])
    assert hints == [
        "the egress proxy refused evil.example:443: evil.example:443 matches no"
        ' confine.network.allow rule; confine.network.allow "evil.example:443" would allow it'
    ]


def test_an_allowed_destination_the_proxy_could_not_reach_is_not_called_refused() -> None:
    plan = plan_for(Profile(network=NetworkGrant(allow=["10.0.0.5:80"])))
    unreachable = EgressRecord(
        sidecar="s",
        host="10.0.0.5",
        port=80,
        allowed=False,
        rule="unreachable",
        reason="10.0.0.5:80 (10.0.0.5) cannot be reached: [Errno 111] Connection refused",
    )
    assert denial_hints(plan, "connect-error", refusals=[unreachable]) == [
        "the egress proxy could not reach 10.0.0.5:80: 10.0.0.5:80 (10.0.0.5) cannot be"
        " reached: [Errno 111] Connection refused"
    ]


def test_nothing_is_hinted_without_confinement() -> None:
    plan = plan_for(Profile(), mode="off")
    assert denial_hints(plan, "[Errno 13] Permission denied: '/data/x.csv'") == []


def test_required_with_a_missing_wall_is_a_sandbox_reason_with_the_fix() -> None:
    old = KernelFacts(landlock_abi=5, seccomp=True, arch="x86_64", root=True, netns="root")
    plan = plan_for(Profile(), kernel=old, mode="required")
    reason = unavailable_reason(plan)
    assert reason is not None
    assert (reason.field, reason.code) == ("sandbox", "confinement-unavailable")
    assert "Landlock ABI 6" in reason.message and "sidecar s" in reason.message
    assert "Linux 6.12" in reason.hint and "best-effort" in reason.hint
    assert "pids cgroup" in reason.hint  # root without a pids cgroup: the process limit
    assert unavailable_reason(plan_for(Profile(), mode="required")) is None
    assert unavailable_reason(plan_for(Profile(), kernel=old)) is None  # best-effort


def test_labels() -> None:
    assert label(STRICT_PLAN, None) == "fs+net+seccomp"
    assert label(STRICT_PLAN, None, denied=True) == "denied"
    assert label(None, None) == "off"
    assert label(plan_for(Profile(), mode="off"), None) == "off"
    proxy = plan_for(Profile(network=NetworkGrant(allow=["*"])))
    assert label(proxy, None) == "fs+proxy+seccomp"
    assert label(plan_for(Profile(network="host")), None) == "fs+seccomp"
    # a worker's facts win over the plan
    partial = ConfinementFacts(mode="best-effort", filesystem="partial", syscalls="filtered")
    assert label(STRICT_PLAN, partial) == "fs(partial)+seccomp"
    assert facts_label(ConfinementFacts(mode="best-effort")) == "none"
    bare = plan_for(Profile(), kernel=KernelFacts())
    assert planned_facts(bare).filesystem == "none" and label(bare, None) == "none"
    assert planned_facts(STRICT_PLAN) == ConfinementFacts(
        mode="best-effort",
        filesystem="enforced",
        network="isolated",
        syscalls="filtered",
        no_new_privs=True,
    )
    assert FULL.netns == "root"


def test_install_paths_grant_the_bundled_sidecars_outside_the_repository(tmp_path: Path) -> None:
    # From another folder, an editable install finds ``sidecars`` only through its own finder:
    # the walls must grant it all the same, or every bundled sidecar fails to import its SDK.
    import sidecars

    code = "from supervisor.processes.confine import install_paths; print(install_paths())"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    folder = os.path.dirname(os.path.abspath(sidecars.__file__))
    granted = ast.literal_eval(done.stdout.strip())
    assert any(folder == g or folder.startswith(g + "/") for g in granted), granted
