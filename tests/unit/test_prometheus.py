"""``toolhost stats --prometheus``: valid text exposition 0.0.4, checked with the reference
parser of the Prometheus Python client."""

import re

import msgspec
from prometheus_client.parser import text_string_to_metric_families

from supervisor.cli.prometheus import exposition
from supervisor.contracts.stats import (
    HostStats,
    Latency,
    SidecarStats,
    StatsResult,
    ToolStats,
    WorkerStats,
)

NAME = re.compile(r"^toolhost_[a-zA-Z_:][a-zA-Z0-9_:]*$")


def doc():
    lat = Latency(count=4, p50=1.5, p90=3.0, p99=9.0, max=9.5, sum=15.0)
    stats = StatsResult(
        uptimeMs=12_500.0,
        sampleIntervalMs=1000,
        samples=12,
        host=HostStats(rssBytes=50_000_000, cpuSeconds=1.25, spawns=3, restarts=1),
        sidecars={
            "utility": SidecarStats(
                calls=5,
                success=3,
                failed=1,
                unavailable=1,
                latency=lat,
                cpuSeconds=0.75,
                rssBytes=30_000_000,
                peakRssBytes=40_000_000,
                workers=1,
                restarts=1,
                exits={"crashed": 1},
                limitActions={"rssMb": 1},
                workerStats=[WorkerStats(index=2, pid=4242, state="ready", rssBytes=30_000_000)],
            )
        },
        tools={
            "file.hash": ToolStats(
                sidecar="utility",
                calls=5,
                success=3,
                failed=1,
                unavailable=1,
                timeouts=1,
                quotaLimited=1,
                latency=lat,
                cpuSeconds=0.5,
                limited=True,
            ),
            "web.search": ToolStats(sidecar=None),
        },
    )
    return msgspec.to_builtins(stats)


def test_parses_with_the_reference_parser_and_names_are_prefixed():
    text = exposition(doc())
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families, text
    for name, fam in families.items():
        assert NAME.match(name), name
        assert fam.documentation
        assert fam.type in ("counter", "gauge", "summary")
    calls = {
        (s.labels["tool"], s.labels["status"]): s.value
        for s in families["toolhost_tool_calls"].samples
    }
    assert calls[("file.hash", "success")] == 3 and calls[("file.hash", "unavailable")] == 1
    assert calls[("web.search", "success")] == 0
    lat = {
        (s.name, s.labels.get("quantile")): s.value
        for s in families["toolhost_tool_latency_seconds"].samples
        if s.labels["tool"] == "file.hash"
    }
    assert lat[("toolhost_tool_latency_seconds", "0.99")] == 0.009
    assert lat[("toolhost_tool_latency_seconds_count", None)] == 4
    assert lat[("toolhost_tool_latency_seconds_sum", None)] == 0.015
    limited = {s.labels["tool"]: s.value for s in families["toolhost_tool_quota_limited"].samples}
    assert limited == {"file.hash": 1.0, "web.search": 0.0}
    rss = families["toolhost_worker_rss_bytes"].samples[0]
    assert rss.labels == {"sidecar": "utility", "worker": "2"} and rss.value == 30_000_000
    exits = families["toolhost_sidecar_worker_exits"].samples[0]
    assert exits.labels == {"sidecar": "utility", "reason": "crashed"} and exits.value == 1
    assert families["toolhost_uptime_seconds"].samples[0].value == 12.5


def test_every_sample_follows_its_help_and_type():
    text = exposition(doc())
    declared = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            declared.add(line.split()[2])
        elif line and not line.startswith("#"):
            name = re.split(r"[{ ]", line, maxsplit=1)[0]
            base = re.sub(r"_(sum|count)$", "", name)
            assert name in declared or base in declared, line
    assert text.endswith("\n")


def test_label_values_are_escaped():
    data = doc()
    data["tools"] = {'we"ird\\name\nx': data["tools"]["file.hash"]}
    text = exposition(data)
    assert 'tool="we\\"ird\\\\name\\nx"' in text
    samples = [
        s
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "toolhost_tool_calls_total"
    ]
    assert {s.labels["tool"] for s in samples} == {'we"ird\\name\nx'}
