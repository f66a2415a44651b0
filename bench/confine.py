"""Scenario ``confine`` (issue 28): what kernel confinement costs a worker start.

- ``prepare``: ms to make one sidecar's shared walls (``SidecarWalls``: the Landlock ruleset
  of the strict profile, the network namespace through its helper), once per sidecar;
- ``apply``: µs inside a forked child to put every wall up (``Armed.apply``: pids cgroup, join
  the namespace, capabilities, ``no_new_privs``, enter the ruleset, the seccomp filter), each
  all but the cgroup join, each wall alone, and the Landlock ruleset built in the child instead
  (``landlock-build``); the cgroup join is a migration, which waits for an RCU grace period
  unless another migration just happened (so ``cgroup`` alone, measured right after the
  previous one, is fast, and ``apply`` shows what an isolated worker start pays);
- ``fork`` (the zygote's way): fork a warm process -> the child's first line, with and without
  the walls (target: at most 1.2x);
- ``exec`` (the shim): exec a program -> its first line, directly and through
  ``confine_exec.py`` with the walls, for ``/bin/true``-like C programs and for a Python worker
  that imports the SDK (target for worker spawn -> ready: at most 1.2x).

Every pair is measured alternating in the same run. ``python -m bench.confine`` runs it alone
(``--rounds N``, ``--out FILE``); ``toolhost bench --only confine`` runs it in the harness.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.run import Bench
from bench.stats import Figure, Row, Stats, Target
from supervisor.contracts.confine import ConfinePlan, Layout, Profile
from supervisor.policy.confine import resolve
from supervisor.processes.confine import SidecarWalls, install_paths, probe, shim_argv
from supervisor.processes.pids_cgroup import PidsCgroups
from supervisor.processes.walls import Walls, arm

REPO = Path(__file__).resolve().parents[1]
WORKER = [sys.executable, "-c", "import sidecars.sdk, sys; sys.stdout.write('ready\\n')"]
TINY = ["/bin/echo", "ready"]


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


def _exec_line_s(argv: list[str], walls: Walls | None, inherit: Sequence[int] = ()) -> float:
    """Exec -> the program's first line, directly or through the shim."""
    pass_fds: list[int] = []
    if walls is not None:
        r, w = os.pipe()
        os.write(w, walls.dumps())
        os.close(w)
        argv = shim_argv(argv, r)
        pass_fds = [r, *inherit]
    t = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, pass_fds=pass_fds, cwd=REPO)
    assert proc.stdout is not None
    proc.stdout.readline()
    elapsed = time.perf_counter() - t
    proc.stdout.close()
    proc.wait()
    if pass_fds:
        os.close(pass_fds[0])
    return elapsed


def measure(rounds: int, log: Any = print) -> dict[str, Any]:
    """Every figure of the scenario (times in seconds per sample)."""
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
    keys = ["apply", *parts, "fork", "fork+walls", "exec tiny", "exec tiny+shim"]
    keys += ["exec worker", "exec worker+shim"]
    samples.update({k: [] for k in keys})
    for i in range(rounds):
        if i % 10 == 0:
            log(f"confine: round {i + 1}/{rounds}")
        samples["apply"].append(_apply_us(full()) / 1e6)
        for name, walls in parts.items():
            samples[name].append(_apply_us(walls() if callable(walls) else walls) / 1e6)
        samples["fork"].append(_fork_line_s(None))
        samples["fork+walls"].append(_fork_line_s(full()))
        samples["exec tiny"].append(_exec_line_s(TINY, None))
        w = full()
        samples["exec tiny+shim"].append(_exec_line_s(TINY, w, shared.inherited(w)))
        if i % 2 == 0:  # the worker start is slow: every other round
            samples["exec worker"].append(_exec_line_s(WORKER, None))
            w = full()
            samples["exec worker+shim"].append(_exec_line_s(WORKER, w, shared.inherited(w)))
    for group in made:
        PidsCgroups.remove(group)
    if groups is not None:
        groups.close()
    shared.close()
    shutil.rmtree(root, ignore_errors=True)
    out["samples"] = samples
    return out


def _median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def confine(b: Bench) -> None:
    """The harness's scenario (``toolhost bench --only confine``)."""
    rounds = 10 if b.settings.quick else 60
    data = measure(rounds, b.log)
    s = data["samples"]
    rows = {}
    for key in s:
        rows[key] = b.results.add(
            Row(scenario="confine", name=f"confine {key}", stats=Stats.of(s[key]))
        )
    pairs = [
        ("fork+walls", "fork", None),
        ("exec tiny+shim", "exec tiny", None),
        ("exec worker+shim", "exec worker", Target("spawn -> ready <= 1.2x without", 1.2)),
    ]
    for key, base, target in pairs:
        rows[key].baseline = rows[base].name
        rows[key].target = target
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
    for key, base in (
        ("fork+walls", "fork"),
        ("exec tiny+shim", "exec tiny"),
        ("exec worker+shim", "exec worker"),
    ):
        ratio = statistics.median(s[key]) / statistics.median(s[base])
        print(f"  {key} / {base}: {ratio:.2f}x")
    if args.out:
        summary = {k: statistics.median(v) for k, v in s.items()}
        args.out.write_text(
            json.dumps({"rules": data["rules"], "p50_s": summary, "samples": s}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
