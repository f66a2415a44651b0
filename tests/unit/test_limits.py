"""Worker rlimits, output and line limits computed from a registry entry (pure)."""

import resource

import msgspec
import pytest

from supervisor.contracts.registry import SidecarConfig
from supervisor.processes.limits import (
    MAX_LINE,
    MIN_LINE,
    NPROC_HEADROOM,
    line_limit,
    output_limit,
    rlimits,
)

INF = resource.RLIM_INFINITY
HOST = {
    resource.RLIMIT_CORE: (0, INF),
    resource.RLIMIT_AS: (INF, INF),
    resource.RLIMIT_NOFILE: (1024, 2048),
    resource.RLIMIT_NPROC: (INF, INF),
    resource.RLIMIT_CPU: (INF, INF),
}


def cfg(**kw):
    return msgspec.convert({"command": "python", **kw}, SidecarConfig)


def as_dict(limits):
    return {which: (soft, hard) for which, soft, hard in limits}


def test_defaults_core_zero_and_nofile_capped_at_host_hard():
    got = rlimits(cfg(), per_call=False, host=HOST)
    assert got[0] == (resource.RLIMIT_CORE, 0, 0)
    assert as_dict(got) == {resource.RLIMIT_CORE: (0, 0), resource.RLIMIT_NOFILE: (2048, 2048)}


@pytest.mark.parametrize(
    ("limits", "quota", "per_call", "tasks", "expected"),
    [
        (
            {"memoryMb": 256, "nofile": 100},
            {},
            False,
            None,
            {resource.RLIMIT_AS: (256 << 20, 256 << 20), resource.RLIMIT_NOFILE: (100, 100)},
        ),
        (
            {"nofile": 0, "nproc": 5},
            {},
            False,
            80,
            {resource.RLIMIT_NPROC: (85 + NPROC_HEADROOM,) * 2},
        ),
        ({"nofile": 0, "nproc": 5}, {}, False, None, {}),  # no count, no RLIMIT_NPROC
        # A long-lived worker: RLIMIT_CPU is the lifetime budget, not the per-call quota.
        (
            {"nofile": 0, "cpuSeconds": 60},
            {"cpuSecondsPerCall": 2},
            False,
            None,
            {resource.RLIMIT_CPU: (60, 62)},
        ),
        ({"nofile": 0}, {"cpuSecondsPerCall": 2}, False, None, {}),
        # A per-call process: RLIMIT_CPU is the per-call quota (rounded up; tools may raise it).
        ({"nofile": 0}, {"cpuSecondsPerCall": 1.5}, True, None, {resource.RLIMIT_CPU: (2, 4)}),
        (
            {"nofile": 0},
            {"cpuSecondsPerCall": 1, "tools": {"a.b": {"cpuSecondsPerCall": 7}}},
            True,
            None,
            {resource.RLIMIT_CPU: (7, 9)},
        ),
        ({"nofile": 0}, {"tools": {"a.b": {"cpuSecondsPerCall": 7}}}, True, None, {}),
    ],
)
def test_rlimits(limits, quota, per_call, tasks, expected):
    c = cfg(tools=["a.b"], limits=limits, quota=quota)
    got = as_dict(rlimits(c, per_call=per_call, host=HOST, user_tasks=tasks))
    got.pop(resource.RLIMIT_CORE)
    assert got == expected


def test_nothing_above_the_host_hard_limit():
    host = {**HOST, resource.RLIMIT_AS: (1 << 30, 1 << 30), resource.RLIMIT_CPU: (INF, 10)}
    c = cfg(limits={"memoryMb": 4096, "cpuSeconds": 60})
    got = as_dict(rlimits(c, per_call=False, host=host))
    assert got[resource.RLIMIT_AS] == (1 << 30, 1 << 30)
    assert got[resource.RLIMIT_CPU] == (10, 10)


@pytest.mark.parametrize(
    ("entry", "tool", "result_limit", "expected"),
    [
        ({}, None, None, 64 * 1024),
        ({"maxOutputBytes": 1000}, None, None, 1000),
        ({"maxOutputBytes": 1000, "quota": {"maxOutputBytes": 500}}, None, None, 500),
        ({"quota": {"maxOutputBytes": 500}}, None, 100, 100),
        (
            {
                "tools": ["a.b"],
                "quota": {"maxOutputBytes": 500, "tools": {"a.b": {"maxOutputBytes": 900}}},
            },
            "a.b",
            None,
            900,
        ),
        ({"tools": ["a.b"], "quota": {"maxOutputBytes": 500}}, "a.b", None, 500),
    ],
)
def test_output_limit(entry, tool, result_limit, expected):
    assert output_limit(cfg(**entry), tool, result_limit) == expected


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({}, MIN_LINE),  # 2 x 64 KiB + 64 KiB, raised to the 1 MiB floor
        ({"maxOutputBytes": 1000}, MIN_LINE),
        ({"maxOutputBytes": 100 * 1024 * 1024}, MAX_LINE),
        (
            {
                "maxOutputBytes": 1000,
                "tools": ["a.b"],
                "quota": {"tools": {"a.b": {"maxOutputBytes": 1 << 21}}},
            },
            MIN_LINE,  # a tool quota cannot raise the sidecar's maxOutputBytes
        ),
    ],
)
def test_line_limit(entry, expected):
    assert line_limit(cfg(**entry)) == expected
