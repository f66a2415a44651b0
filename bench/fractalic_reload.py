"""A Fractalic folder's reload with the probe cache: ``python -m bench.fractalic_reload``.

A folder of ``--scripts`` simple-json scripts (each answers the ``{"__test__": true}`` probe and
``--fractalic-dump-schema``, issue 23); one script is edited
and the registry reloaded, which restarts the folder's sidecar. Measured: from ``Host.reload()``
until every tool of the folder is available again. Baseline: the same reload with the probe cache
emptied first (every script probed again, as before the cache); rounds alternate between the two
so both see the same machine load. Ratio: baseline p50 / cached p50.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import trio

SCRIPT = """
import json, sys
if sys.argv[1] == '{"__test__": true}':
    print(json.dumps({"success": True, "_simple": True})); sys.exit(0)
if sys.argv[1] == "--fractalic-dump-schema":
    schema = {"type": "object"}
    print(json.dumps({"description": "tool %(n)d, version %(v)d", "parameters": schema}))
    sys.exit(0)
print(json.dumps({"n": %(n)d}))
"""


def _write_app(root: Path, scripts: int) -> list[str]:
    folder = root / "tools"
    folder.mkdir(parents=True)
    for n in range(scripts):
        (folder / f"t{n}.py").write_text(SCRIPT % {"n": n, "v": 0})
    registry = {
        "schemaVersion": 2,
        "autodiscover": [{"path": "tools", "probeTimeoutMs": 5000}],
        "sidecars": {},
    }
    (folder / "external.tools.jsonc").write_text(json.dumps(registry))
    return [f"t{n}" for n in range(scripts)]


async def _rounds(root: Path, names: list[str], rounds: int) -> tuple[list[float], list[float]]:
    from supervisor.host.host import build_host
    from supervisor.host.loading import HostOptions
    from supervisor.workers import discovery as fractalic_probe

    host = await build_host(HostOptions(app_root=str(root), use_global=False, manifest_dirs=[]))
    sid = "auto:tools"

    async def settled(old_pool: object) -> None:
        with trio.fail_after(120):
            while not (
                host.pools.get(sid) is not old_pool
                and all(
                    (d := host.catalog.get(t)) is not None and d.stability.effective == "available"
                    for t in names
                )
            ):
                await host.feed.wait_change()

    cached: list[float] = []
    baseline: list[float] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(host.run)
        await settled(None)
        for i in range(rounds * 2):
            (root / "tools" / "t0.py").write_text(SCRIPT % {"n": 0, "v": i + 1})
            cold = i % 2 == 0
            if cold:
                fractalic_probe.CACHE.clear()
            old = host.pools.get(sid)
            t0 = time.perf_counter()
            await host.reload()
            await settled(old)
            (baseline if cold else cached).append(time.perf_counter() - t0)
        host.stop()
        with trio.move_on_after(15):
            await host.wait_stopped()
        nursery.cancel_scope.cancel()
    return baseline, cached


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scripts", type=int, default=20, help="scripts in the folder")
    parser.add_argument("--rounds", type=int, default=10, help="reloads of each kind")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        names = _write_app(root, args.scripts)
        baseline, cached = trio.run(_rounds, root, names, args.rounds)
    base_p50 = statistics.median(baseline)
    cached_p50 = statistics.median(cached)
    rows = {
        f"reload, {args.scripts} scripts, all probed again p50 ms": round(base_p50 * 1000, 1),
        f"reload, {args.scripts} scripts, probe cache p50 ms": round(cached_p50 * 1000, 1),
        "speed-up of the cached reload": round(base_p50 / cached_p50, 1),
    }
    for key, value in rows.items():
        print(f"{key:55} {value}")


if __name__ == "__main__":
    main()
