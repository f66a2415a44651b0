"""Fractalic folder speed (issue 23): ``python -m bench.fractalic_folder [--calls N]``.

Two ratios, each against a baseline measured in the same process run:

- a ``command: python`` (``module:function``) tool called through toolhost vs the same function
  run the way Fractalic runs CLI tools: a fresh interpreter per call (``python tool.py --a 1 ...``);
  target: toolhost at least 50x faster at p50;
- a ``python-cli`` tool called through toolhost vs running the same script directly with the
  same flags (``subprocess.run`` from plain Python, interleaved call by call with the hosted
  runs so both see the same machine load); target: toolhost at most 1.2x at p50.

toolhost runs in-process here (``Invoker.invoke``, the same call path the kernel socket ends in,
without the socket hop); the flags and the folder are written to a temporary app root.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import trio

MODULE = """
def add(a, b):
    return {"sum": a + b}
"""

CLI = """
import argparse, json
p = argparse.ArgumentParser()
p.add_argument("--a", type=int, required=True)
p.add_argument("--b", type=int, required=True)
args = p.parse_args()
print(json.dumps({"sum": args.a + args.b}))
"""


def _write_app(root: Path) -> None:
    folder = root / "tools"
    folder.mkdir(parents=True)
    (folder / "mathmod.py").write_text(MODULE)
    (folder / "add_cli.py").write_text(CLI)
    (folder / "add_py.yaml").write_text("command: python\nentry: 'mathmod:add'\n")
    (folder / "add_cli.yaml").write_text("command: python-cli\nentry: add_cli.py\n")
    registry = {
        "schemaVersion": 2,
        "autodiscover": [{"path": "tools", "probeTimeoutMs": 5000}],
        "sidecars": {},
    }
    (root / "tools" / "external.tools.jsonc").write_text(json.dumps(registry))


def _direct(argv: list[str]) -> float:
    t0 = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, check=True).stdout
    elapsed = time.perf_counter() - t0
    assert json.loads(out)["sum"] == 3
    return elapsed


async def _hosted(
    root: Path, calls: int, cli_calls: int, direct_argv: list[str]
) -> tuple[list[float], list[float], list[float]]:
    """Hosted calls; the direct CLI runs are interleaved with the hosted ones (same load)."""
    from supervisor.calls.call import InvokeRequest
    from supervisor.host.host import build_host
    from supervisor.host.loading import HostOptions

    host = await build_host(HostOptions(app_root=str(root), use_global=False, manifest_dirs=[]))
    raw = msgspec.Raw(b'{"a": 1, "b": 2}')
    py: list[float] = []
    cli: list[float] = []
    direct: list[float] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(host.run)
        with trio.fail_after(30):
            while not all(
                (d := host.catalog.get(t)) is not None and d.stability.effective == "available"
                for t in ("add_py", "add_cli")
            ):
                await host.feed.wait_change()
        for i in range(calls + 20):
            t0 = time.perf_counter()
            env = await host.invoker.invoke(InvokeRequest("add_py", raw))
            if i >= 20:
                py.append(time.perf_counter() - t0)
            assert env.status == "success", env
        for _ in range(cli_calls):
            direct.append(_direct(direct_argv))  # blocks the loop: the host is idle meanwhile
            t0 = time.perf_counter()
            env = await host.invoker.invoke(InvokeRequest("add_cli", raw))
            cli.append(time.perf_counter() - t0)
            assert env.status == "success", env
        host.stop()
        with trio.move_on_after(15):
            await host.wait_stopped()
        nursery.cancel_scope.cancel()
    return py, cli, direct


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="python-tool calls via toolhost")
    parser.add_argument("--spawns", type=int, default=60, help="fresh-interpreter runs per row")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _write_app(root)
        script = str(root / "tools" / "add_cli.py")
        flags = ["--a", "1", "--b", "2"]
        argv = [sys.executable, script, *flags]
        py, cli, direct = trio.run(_hosted, root, args.calls, args.spawns, argv)
    direct_p50 = statistics.median(direct)
    py_p50 = statistics.median(py)
    cli_p50 = statistics.median(cli)
    rows = {
        "fresh interpreter per call (direct) p50 ms": round(direct_p50 * 1000, 3),
        "python module:function via toolhost p50 ms": round(py_p50 * 1000, 3),
        "python-cli via toolhost p50 ms": round(cli_p50 * 1000, 3),
        "speed-up of module:function (target >= 50x)": round(direct_p50 / py_p50, 1),
        "python-cli via toolhost / direct (target <= 1.2x)": round(cli_p50 / direct_p50, 3),
    }
    for key, value in rows.items():
        print(f"{key:55} {value}")


if __name__ == "__main__":
    main()
