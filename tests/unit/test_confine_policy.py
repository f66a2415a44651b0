"""The confinement resolver (PROTOCOL 7): profiles key by key, carving around never-granted
paths, and what each kernel can enforce. Pure: a fake file tree, no disk."""

from __future__ import annotations

import posixpath
from collections.abc import Sequence

import msgspec
import pytest

from supervisor.contracts.confine import KernelFacts, Layout, Profile
from supervisor.contracts.registry import ConfineConfig, NetworkGrant
from supervisor.policy.confine import (
    STRICT,
    effective,
    folders_to_make,
    grants,
    resolve,
    with_collector,
)

TREE: dict[str, list[str]] = {
    "/": ["usr", "etc", "home", "app", "work"],
    "/etc": ["passwd", "shadow", "gshadow", "hosts", "ssh", "ssl", "sudoers.d"],
    "/etc/ssh": ["ssh_config", "ssh_host_rsa_key", "ssh_host_rsa_key.pub", "ssh_host_ed25519_key"],
    "/etc/ssl": ["certs", "private"],
    "/app": [".toolhost", "tools", "manifests", "workspace", "README", "link-to-state", "src"],
    "/app/tools": ["external.tools.jsonc", "packages", "auto"],
    "/home/u": [".ssh", "notes", "app2"],
}
LINKS = {"/app/link-to-state": "/app/.toolhost", "/app/workspace/out": "/app/.toolhost/vault.json"}


def listdir(path: str) -> Sequence[str] | None:
    return TREE.get(path)


def realpath(path: str) -> str:
    path = posixpath.normpath(path)
    for link, target in LINKS.items():
        if path == link or path.startswith(link + "/"):
            return target + path[len(link) :]
    return path


LAYOUT = Layout(
    app_root="/app",
    project_dir="/app/workspace",
    cwd="/app",
    program="/app/src/tool.py",
    home="/home/u",
    install=("/venv", "/usr/lib/python3.11"),
    secrets=("/app/.toolhost", "/app/tools/external.tools.jsonc"),
    host_private=(
        "/app/.toolhost",
        "/app/tools",
        "/app/manifests",
        "/app/tools/external.tools.jsonc",
        "/venv",
    ),
)
FULL = KernelFacts(
    landlock_abi=7, seccomp=True, arch="x86_64", root=True, netns="root", pids_cgroup=True
)


def plan_for(profile: Profile, *, kernel: KernelFacts = FULL, mode: str = "best-effort", **lay):
    layout = msgspec.structs.replace(LAYOUT, **lay)
    return resolve(
        "s",
        profile,
        mode=mode,  # type: ignore[arg-type]
        kernel=kernel,
        layout=layout,
        listdir=listdir,
        realpath=realpath,
    )


# -- profiles, key by key --------------------------------------------------------------------

WEB = ConfineConfig(project="write", network=NetworkGrant(allow=["*"]))


@pytest.mark.parametrize(
    ("entry", "family", "expected"),
    [
        (ConfineConfig(), None, STRICT),
        (ConfineConfig(), WEB, Profile(project="write", network=NetworkGrant(allow=["*"]))),
        (
            ConfineConfig(network="host"),
            WEB,
            Profile(project="write", network="host"),
        ),
        (
            ConfineConfig(project="none", read=["data"]),
            WEB,
            Profile(project="none", read=("data",), network=NetworkGrant(allow=["*"])),
        ),
        (
            ConfineConfig(read=[]),  # an empty list replaces the family's list
            ConfineConfig(read=["a", "b"], processes=8),
            Profile(processes=8),
        ),
        (
            ConfineConfig(processes=3, unix=["/tmp/.X11-unix"]),
            None,
            Profile(processes=3, unix=("/tmp/.X11-unix",)),
        ),
    ],
)
def test_effective_profile_takes_each_key_from_entry_then_family_then_strict(
    entry: ConfineConfig, family: ConfineConfig | None, expected: Profile
) -> None:
    assert effective(entry, family) == expected


def test_profile_decodes_from_registry_json() -> None:
    raw = {"project": "write", "network": {"allow": ["*.example.com:443"], "loopback": [9222]}}
    cfg = msgspec.convert(raw, ConfineConfig)
    assert effective(cfg).network == NetworkGrant(allow=["*.example.com:443"], loopback=[9222])
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"network": "some"}, ConfineConfig)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"network": {"loopback": [70000]}}, ConfineConfig)


# -- paths -----------------------------------------------------------------------------------


def test_strict_profile_reads_system_install_program_cwd_and_project_but_no_secret() -> None:
    read, write, _, never, refused = grants(STRICT, LAYOUT, listdir, realpath)
    assert "/usr" in read and "/venv" in read and "/usr/lib/python3.11" not in read  # under /usr
    assert "/app/src" in read  # the program's folder (and the cwd, carved)
    assert "/app/workspace" in read
    assert "/app" not in read  # the cwd holds .toolhost: carved into its entries
    assert "/app/README" in read and "/app/manifests" in read
    assert "/app/.toolhost" not in read and "/app/link-to-state" not in read
    assert "/app/tools/packages" in read and "/app/tools/external.tools.jsonc" not in read
    assert "/etc" not in read and "/etc/passwd" in read and "/etc/hosts" in read
    assert "/etc/shadow" not in read and "/etc/gshadow" not in read
    assert "/etc/sudoers.d" not in read
    assert "/etc/ssh/ssh_config" in read and "/etc/ssh/ssh_host_rsa_key.pub" not in read
    assert not any(p.startswith("/etc/ssh/ssh_host_") for p in read)
    assert "/etc/ssl/certs" in read and "/etc/ssl/private" not in read
    assert write == ("/dev/full", "/dev/null", "/dev/zero")
    assert "/app/.toolhost" in never and "/home/u/.ssh" in never
    assert refused == []


def test_project_write_is_read_write_and_leaves_nothing_readonly_below_it() -> None:
    read, write, _, _, _ = grants(Profile(project="write"), LAYOUT, listdir, realpath)
    assert "/app/workspace" in write and "/app/workspace" not in read


@pytest.mark.parametrize(
    ("profile", "in_read", "in_write", "refused_word"),
    [
        # A project of "." is the app root: carved, the host-private parts read-only or absent.
        (
            Profile(project="write"),
            ["/app/tools/packages", "/app/manifests"],
            ["/app/README", "/app/src"],
            None,
        ),
        (Profile(read=(".toolhost",)), [], [], "never granted"),
        (Profile(read=("/app/link-to-state",)), [], [], "never granted"),
        (Profile(write=("tools",)), ["/app/tools/packages"], [], "host-private"),
        (Profile(write=("/home/u",)), [], ["/home/u/notes", "/home/u/app2"], None),
        (Profile(read=("/home/u/.ssh/id_ed25519",)), [], [], "never granted"),
    ],
)
def test_grants_never_reach_secrets_or_write_host_private(
    profile: Profile, in_read: list[str], in_write: list[str], refused_word: str | None
) -> None:
    layout = msgspec.structs.replace(LAYOUT, project_dir="/app")
    read, write, _, _, refused = grants(profile, layout, listdir, realpath)
    for p in in_read:
        assert p in read
    for p in in_write:
        assert p in write
    for p in write:
        assert not p.startswith(("/app/.toolhost", "/app/tools", "/app/manifests", "/venv"))
        assert not p.startswith("/home/u/.ssh")
    for p in read:
        assert not p.startswith(("/app/.toolhost", "/home/u/.ssh", "/etc/shadow"))
        assert p != "/app/tools/external.tools.jsonc"
    if refused_word:
        assert any(refused_word in r for r in refused), refused
    else:
        assert refused == []


def test_a_symlink_in_the_project_to_a_secret_is_not_granted() -> None:
    layout = msgspec.structs.replace(LAYOUT, project_dir="/app/workspace/out")
    read, write, _, _, refused = grants(Profile(project="write"), layout, listdir, realpath)
    assert not any(p.startswith("/app/.toolhost") for p in read + write)
    assert refused and "confine.project" in refused[0]


def test_home_secrets_are_carved_when_the_app_root_is_home() -> None:
    layout = msgspec.structs.replace(
        LAYOUT, app_root="/home/u", cwd="/home/u", project_dir="/home/u"
    )
    read, write, _, _, _ = grants(Profile(project="write"), layout, listdir, realpath)
    assert "/home/u/notes" in write and "/home/u" not in write
    assert not any(p.startswith("/home/u/.ssh") for p in read + write)


def test_an_unlistable_folder_that_holds_a_secret_grants_nothing() -> None:
    layout = msgspec.structs.replace(LAYOUT, cwd="/work", secrets=("/work/.toolhost",))
    read, _, _, _, _ = grants(STRICT, layout, listdir, realpath)
    assert not any(p.startswith("/work") for p in read)


def test_a_folder_carved_around_the_host_files_alone_is_listed() -> None:
    """projectDir "." (issue 28): the app root's top can be listed (a module there imports,
    ``archive.create`` of "." walks it), nothing at its top is granted by that rule but
    listing; /etc and a $HOME holding key folders are not listed (their names would show)."""
    layout = msgspec.structs.replace(LAYOUT, project_dir="/app")
    read, write, listed, _, _ = grants(Profile(project="write"), layout, listdir, realpath)
    assert listed == ("/app",)
    assert "/app" not in read + write and "/etc" not in listed
    home = msgspec.structs.replace(LAYOUT, app_root="/home/u", cwd="/home/u", project_dir="/home/u")
    assert grants(Profile(project="write"), home, listdir, realpath)[2] == ()
    plan = resolve(
        "s",
        STRICT,
        mode="best-effort",
        kernel=FULL,
        layout=layout,
        listdir=listdir,
        realpath=realpath,
    )
    assert plan.listed == ("/app",)
    # a project of its own is one rule: nothing carved, nothing listed
    assert grants(Profile(project="write"), LAYOUT, listdir, realpath)[2] == ("/app",)  # the cwd
    elsewhere = msgspec.structs.replace(LAYOUT, cwd="/app/workspace", program="")
    assert grants(Profile(project="write"), elsewhere, listdir, realpath)[2] == ()


def test_folders_are_made_only_on_a_carved_project_and_only_as_top_names() -> None:
    carved = msgspec.structs.replace(LAYOUT, project_dir="/app")
    shots = Profile(project="write", folders=("screenshots",))
    assert folders_to_make(shots, carved, realpath) == (["/app/screenshots"], [])
    assert folders_to_make(shots, LAYOUT, realpath) == ([], [])  # workspace/: it makes them
    ro = msgspec.structs.replace(shots, project="read")
    assert folders_to_make(ro, carved, realpath) == ([], [])
    bad = Profile(
        project="write", folders=(".toolhost", "tools", "a/b", "..", "link-to-state", "/etc")
    )
    made, refused = folders_to_make(bad, carved, realpath)
    assert made == [] and len(refused) == 6, refused


# -- the kernel ------------------------------------------------------------------------------

NONE = KernelFacts()
OLD = KernelFacts(landlock_abi=2, seccomp=True, arch="x86_64", root=False, netns="user")
USER_NO_NS = KernelFacts(landlock_abi=7, seccomp=True, arch="x86_64", root=False)
ROOT_NO_CGROUP = KernelFacts(landlock_abi=7, seccomp=True, arch="x86_64", root=True, netns="root")
PROXY = Profile(network=NetworkGrant(allow=["*"], loopback=[9222]))


@pytest.mark.parametrize(
    ("kernel", "profile", "network", "netns", "tcp", "sockets", "pids", "missing"),
    [
        (FULL, STRICT, "none", "root", None, "none", "cgroup", []),
        (FULL, PROXY, "proxy", "root", None, "any", "cgroup", []),
        (FULL, Profile(network="host"), "host", "", None, "any", "cgroup", []),
        (USER_NO_NS, STRICT, "none", "", None, "none", "rlimit", []),
        (USER_NO_NS, PROXY, "proxy", "", (9222,), "stream", "rlimit", ["network namespace"]),
        (OLD, STRICT, "none", "user", None, "none", "rlimit", ["truncation", "ioctl", "scoping"]),
        (ROOT_NO_CGROUP, STRICT, "none", "root", None, "none", "none", ["process limit"]),
        (
            NONE,
            STRICT,
            "none",
            "",
            None,
            "any",
            "rlimit",
            ["filesystem", "network isolation", "syscall filter"],
        ),
        (
            KernelFacts(landlock_abi=4),
            STRICT,
            "none",
            "",
            (),
            "any",
            "rlimit",
            ["ioctls", "scoping", "UDP", "syscall filter"],
        ),
    ],
)
def test_what_each_kernel_enforces_and_what_is_missing(
    kernel: KernelFacts,
    profile: Profile,
    network: str,
    netns: str,
    tcp: tuple[int, ...] | None,
    sockets: str,
    pids: str,
    missing: list[str],
) -> None:
    plan = plan_for(profile, kernel=kernel)
    assert (plan.network, plan.netns, plan.tcp_connect, plan.socket_filter, plan.pids) == (
        network,
        netns,
        tcp,
        sockets,
        pids,
    )
    assert len(plan.missing) == len(missing), plan.missing
    for word, text in zip(missing, plan.missing, strict=True):
        assert word in text
    assert len(plan.fixes) <= len(plan.missing)
    assert plan.unavailable == ""
    assert plan.drop_caps == kernel.root


def test_required_makes_a_sidecar_unavailable_naming_what_is_missing_and_the_fix() -> None:
    plan = plan_for(STRICT, kernel=ROOT_NO_CGROUP, mode="required")
    assert plan.unavailable.startswith("confinement-unavailable: ")
    assert "process limit" in plan.unavailable and "Delegate=yes" in plan.unavailable
    assert "best-effort" in plan.unavailable
    assert plan_for(STRICT, kernel=FULL, mode="required").unavailable == ""


def test_off_plans_nothing() -> None:
    plan = plan_for(STRICT, mode="off")
    assert not plan.active and plan.read == () and plan.seccomp_arch == "" and not plan.drop_caps


def test_unix_grant_opens_af_unix_and_the_proxy_port_avoids_loopback_ports() -> None:
    plan = plan_for(Profile(unix=("/tmp/.X11-unix",)))
    assert plan.allow_unix and plan.unix == ("/tmp/.X11-unix",)
    assert not plan_for(STRICT).allow_unix
    plan = plan_for(Profile(network=NetworkGrant(allow=["*"], loopback=[3128, 3129])))
    assert plan.proxy_port == 3130
    assert plan_for(Profile(network=NetworkGrant(loopback=[9222]))).proxy_port == 0


def test_network_host_reads_the_resolver_configuration() -> None:
    plan = plan_for(Profile(network="host"))
    assert plan.network == "host"
    # /run/systemd/resolve is not in the fake tree, but it is granted (apply skips it if absent)
    assert "/run/systemd/resolve" in plan.read
    assert "/run/systemd/resolve" not in plan_for(STRICT).read


def test_the_telemetry_collector_is_granted_by_address() -> None:
    local = with_collector(STRICT, "http://localhost:4318")
    assert local.network == NetworkGrant(loopback=[4318])
    web = Profile(project="write", network=NetworkGrant(allow=["*"]))
    assert with_collector(web, "http://127.0.0.1:4318").network == NetworkGrant(
        allow=["*"], loopback=[4318]
    )
    remote = with_collector(STRICT, "https://otel.example.com/v1/traces")
    assert remote.network == NetworkGrant(allow=["otel.example.com:443"])
    host = Profile(network="host")
    assert with_collector(host, "http://localhost:4318") == host
    assert with_collector(STRICT, "http://localhost:notaport") == STRICT


@pytest.mark.parametrize("mode", ["best-effort", "off"])
def test_keep_goes_from_the_entry_or_family_into_the_plan(mode: str) -> None:
    family = ConfineConfig(project="write", keep="host")
    assert effective(ConfineConfig(), family).keep == "host"
    assert effective(ConfineConfig(keep="worker"), family).keep == "worker"
    assert effective(ConfineConfig()).keep == "worker"
    # Also with confinement off: the host then keeps a kept group it already has.
    assert plan_for(Profile(keep="sidecar"), mode=mode).keep == "sidecar"
    assert plan_for(STRICT, mode=mode).keep == "worker"
