"""Scenario ``confine`` (issue 28): what kernel confinement costs a worker start.

- ``prepare``: ms to make one sidecar's shared walls (``SidecarWalls``: the Landlock ruleset
  of the strict profile, the network namespace through its helper), once per sidecar;
- ``apply``: µs inside a forked child to put every wall up (``Armed.apply``: pids cgroup, join
  the namespace, capabilities, ``no_new_privs``, enter the ruleset, the seccomp filter), each
  all but the cgroup join, each wall alone, and the Landlock ruleset built in the child instead
  (``landlock-build``); the cgroup join is a migration, which waits for an RCU grace period
  unless another migration just happened (so ``cgroup`` alone, measured right after the
  previous one, is fast, and ``apply`` shows what an isolated worker start pays);
- ``fork``: fork a warm process -> the child's first line, with and without the walls, and
  (``fork+walls spare``) from a spare that joined the child's group ahead, as the zygote's
  spare does (the request -> the first line of the child it forks inside the group);
- on the real paths (``bench/confine_paths.py``, ``toolhost serve`` hosts confined and not):
  worker spawn -> ready through the zygote, exec'd, and through the exec shim (target: at most
  1.2x without); host CPU per call (at most 1.05x); ``web.fetch`` of a 100 KB loopback page
  through the egress proxy against directly (at most 1.2x), and confined without the proxy
  (``network: "host"``), which splits that ratio into the proxy's part and the walls'.

Every pair is measured alternating in the same run; the ratios are of medians over the rounds.
``python -m bench.confine`` runs it alone (``--rounds N``, ``--out FILE``); ``python -m bench
--only confine`` (``toolhost bench --only confine``) runs it in the harness.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import confine_paths
from bench.run import Bench
from bench.stats import Figure, Row, Stats, Target
from supervisor.contracts.confine import ConfinePlan, Layout, Profile
from supervisor.policy.confine import resolve
from supervisor.processes.confine import SidecarWalls, install_paths, probe
from supervisor.processes.pids_cgroup import PidsCgroups
from supervisor.processes.walls import Walls, arm

REPO = Path(__file__).resolve().parents[1]


def plan_for(root: str) -> ConfinePlan:
    """The strict profile (``project: read``, no network) of a sidecar in a temp app root."""
    app = os.path.join(root, "app")
    os.makedirs(os.path.join(app, "workspace"), exist_ok=True)
    layout = Layout(
        app_root=app,
        project_dir=os.path.join(app, "workspace"),
        cwd=app,
        program=str(REPO / "sidecars" / "sdk" / "__init__.py"),
        home=os.path.join(root, "home"),
        install=(*install_paths(), str(REPO)),
        secrets=(os.path.join(app, ".toolhost"),),
        host_private=(os.path.join(app, ".toolhost"),),
    )
    return resolve(
        "bench",
        Profile(),
        mode="best-effort",
        kernel=probe(),
        layout=layout,
        listdir=lambda p: os.listdir(p) if os.path.isdir(p) else None,
        realpath=os.path.realpath,
    )


def _apply_us(walls: Walls) -> float:
    """µs for ``Armed.apply`` in a forked child (armed in this process first)."""
    armed = arm(walls)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        t = time.perf_counter_ns()
        try:
            armed.apply()
        except OSError:
            os._exit(1)
        os.write(w, b"%d" % (time.perf_counter_ns() - t))
        os._exit(0)
    os.close(w)
    data = os.read(r, 64)
    os.close(r)
    os.waitpid(pid, 0)
    return int(data) / 1000 if data else float("nan")


def _fork_line_s(armed_walls: Walls | None) -> float:
    """Fork -> the child's first line (after the walls, when given)."""
    armed = arm(armed_walls) if armed_walls is not None else None
    r, w = os.pipe()
    t = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        if armed is not None:
            armed.apply()
        os.write(w, b"ready\n")
        os._exit(0)
    os.close(w)
    os.read(r, 16)
    elapsed = time.perf_counter() - t
    os.close(r)
    os.waitpid(pid, 0)
    return elapsed


def _spare_line_s(walls: Walls) -> float:
    """A spare (a fork that joined the worker's pids group ahead, as the zygote's does) is asked
    for the worker -> the child's first line, after the walls (the join skipped: the child was
    forked inside the group)."""
    walls.cgroup_joined = True
    armed = arm(walls)
    r, w = os.pipe()
    go_r, go_w = os.pipe()
    joined_r, joined_w = os.pipe()
    spare = os.fork()
    if spare == 0:  # pragma: no cover - the spare
        fd = os.open(walls.cgroup_procs, os.O_WRONLY)
        os.write(fd, b"%d" % os.getpid())
        os.close(fd)
        os.write(joined_w, b"j")
        os.read(go_r, 1)
        child = os.fork()
        if child == 0:
            armed.apply()
            os.write(w, b"ready\n")
            os._exit(0)
        os.waitpid(child, 0)
        os._exit(0)
    os.read(joined_r, 1)
    t = time.perf_counter()
    os.write(go_w, b"g")
    os.read(r, 16)
    elapsed = time.perf_counter() - t
    os.waitpid(spare, 0)
    for fd in (r, w, go_r, go_w, joined_r, joined_w):
        os.close(fd)
    return elapsed


def measure(
    rounds: int, log: Any = print, *, paths: tuple[int, int, int, int] = (6, 5, 3000, 30)
) -> dict[str, Any]:
    """Every figure of the scenario (times in seconds per sample).

    Args:
        rounds: Rounds of the in-process walls measurements.
        log: Progress lines.
        paths: The real paths' rounds, starts per configuration per round, calls per CPU
            window, ``web.fetch`` calls per round.
    """
    root = tempfile.mkdtemp(prefix="bench-confine-")
    plan = plan_for(root)
    groups = PidsCgroups.probe(f"toolhost-bench-{os.getpid()}")
    samples: dict[str, list[float]] = {"prepare": []}
    for _ in range(max(3, rounds // 10)):
        t = time.perf_counter()
        SidecarWalls(plan, tmp_root=root).close()
        samples["prepare"].append(time.perf_counter() - t)
    shared = SidecarWalls(plan, tmp_root=root)
    made: list[str] = []

    def full() -> Walls:
        group = groups.create(f"w{len(made)}", plan.processes) if groups else None
        if group:
            made.append(group)
        return shared.worker(cgroup=group)[0]

    def cgroup_only() -> Walls:
        group = groups.create(f"w{len(made)}", plan.processes) if groups else None
        if group:
            made.append(group)
        return Walls(cgroup_procs=PidsCgroups.procs_file(group) if group else "")

    parts: dict[str, Any] = {
        "apply without cgroup": lambda: shared.worker()[0],
        "cgroup": cgroup_only,
        "landlock": Walls(landlock_abi=plan.landlock_abi, ruleset_fd=shared.ruleset_fd),
        "landlock-build": Walls(landlock_abi=plan.landlock_abi, read=plan.read, write=plan.write),
        "seccomp": Walls(seccomp_arch=plan.seccomp_arch, sockets="none", allow_unix=False),
        "netns": Walls(netns_fds=shared.holder.fds if shared.holder else ()),
        "caps": Walls(drop_caps=plan.drop_caps),
    }
    out: dict[str, Any] = {"rules": shared.rules, "plan_missing": list(plan.missing)}
    keys = ["apply", *parts, "fork", "fork+walls"]
    if groups is not None:
        keys.append("fork+walls spare")
    samples.update({k: [] for k in keys})
    for i in range(rounds):
        if i % 10 == 0:
            log(f"confine: round {i + 1}/{rounds}")
        samples["apply"].append(_apply_us(full()) / 1e6)
        for name, walls in parts.items():
            samples[name].append(_apply_us(walls() if callable(walls) else walls) / 1e6)
        samples["fork"].append(_fork_line_s(None))
        samples["fork+walls"].append(_fork_line_s(full()))
        if groups is not None:
            samples["fork+walls spare"].append(_spare_line_s(full()))
    for group in made:
        PidsCgroups.remove(group)
    if groups is not None:
        groups.close()
    shared.close()
    shutil.rmtree(root, ignore_errors=True)
    out["samples"] = samples
    path_rounds, starts, cpu_calls, fetches = paths
    spawn = confine_paths.spawn_to_ready(path_rounds, starts, log)
    out["spawn"] = {f"spawn {k}": v for k, v in spawn.items()}
    out["cpu"] = confine_paths.host_cpu(path_rounds, cpu_calls, log)
    out["fetch"] = {
        f"web.fetch {k}": v for k, v in confine_paths.web_fetch(path_rounds, fetches, log).items()
    }
    return out


SPAWN_PAIRS = [(f"spawn {a}", f"spawn {b}") for a, b in confine_paths.PAIRS]
FETCH_PAIR = ("web.fetch proxy", "web.fetch direct")
FETCH_PARTS = [
    ("web.fetch proxy", "web.fetch confined"),
    ("web.fetch confined", "web.fetch direct"),
]
"""The target's ratio split: the proxy's own cost (both confined) and the walls' (no proxy)."""


def ratios(data: dict[str, Any]) -> dict[str, float]:
    """The targets' ratios: medians confined / not."""
    med = statistics.median
    out = {f"{a} / {b}": med(data["spawn"][a]) / med(data["spawn"][b]) for a, b in SPAWN_PAIRS}
    out["host CPU per call walls / off"] = med(data["cpu"]["walls"]) / med(data["cpu"]["off"])
    for a, b in [FETCH_PAIR, *FETCH_PARTS]:
        out[f"{a} / {b}"] = med(data["fetch"][a]) / med(data["fetch"][b])
    return out


def _median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def confine(b: Bench) -> None:
    """The harness's scenario (``python -m bench --only confine``)."""
    quick = b.settings.quick
    data = measure(10 if quick else 60, b.log, paths=(2, 2, 500, 10) if quick else (6, 5, 3000, 30))
    s = data["samples"]
    rows = {}
    for key in s:
        rows[key] = b.results.add(
            Row(scenario="confine", name=f"confine {key}", stats=Stats.of(s[key]))
        )
    rows["fork+walls"].baseline = rows["fork"].name
    if "fork+walls spare" in rows:
        rows["fork+walls spare"].baseline = rows["fork"].name
    for group in ("spawn", "fetch"):
        for key, values in data[group].items():
            rows[key] = b.results.add(Row(scenario="confine", name=key, stats=Stats.of(values)))
    for key, base in SPAWN_PAIRS:
        rows[key].baseline = rows[base].name
        rows[key].target = Target("spawn -> ready <= 1.2x without", 1.2)
    key, base = FETCH_PAIR
    rows[key].baseline = rows[base].name
    rows[key].target = Target("web.fetch through the proxy <= 1.2x direct", 1.2)
    rows["web.fetch confined"].baseline = rows["web.fetch direct"].name
    cpu = data["cpu"]
    for k in ("walls", "off"):
        b.results.figure(
            Figure(
                "confine", f"host CPU per call, confinement {k}", statistics.median(cpu[k]), "µs"
            )
        )
    b.results.figure(
        Figure(
            "confine",
            "host CPU per call, confined / not",
            statistics.median(cpu["walls"]) / statistics.median(cpu["off"]),
            "x",
            target=Target("host CPU per call <= 1.05x", 1.05),
        )
    )
    b.results.figure(
        Figure("confine", "Landlock rules of the strict profile", data["rules"], "rules")
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.confine", description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    data = measure(args.rounds)
    s = data["samples"]
    table = []
    for key, values in s.items():
        unit_us = key.startswith("apply") or key in ("cgroup", "landlock", "landlock-build")
        unit_us = unit_us or key in ("seccomp", "netns", "caps")
        med = statistics.median(values) * (1e6 if unit_us else 1e3)
        table.append((key, med, "µs" if unit_us else "ms"))
    missing = data["plan_missing"] or "nothing"
    print(f"strict profile: {data['rules']} Landlock rules; missing here: {missing}")
    for key, med, unit in table:
        print(f"  {key:<18} p50 {med:9.1f} {unit}")
    for group in ("spawn", "fetch"):
        for key, values in data[group].items():
            print(f"  {key:<24} p50 {statistics.median(values) * 1e3:9.1f} ms (n={len(values)})")
    for key, values in data["cpu"].items():
        print(f"  host CPU per call {key:<6} p50 {statistics.median(values):9.1f} µs")
    for key, ratio in ratios(data).items():
        print(f"  {key}: {ratio:.2f}x")
    if args.out:
        summary = {k: statistics.median(v) for k, v in s.items()}
        record = {
            "rules": data["rules"],
            "p50_s": summary,
            "samples": s,
            "spawn_s": data["spawn"],
            "hostCpuUsPerCall": data["cpu"],
            "fetch_s": data["fetch"],
            "ratios": ratios(data),
        }
        args.out.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
