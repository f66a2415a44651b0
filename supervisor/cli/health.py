"""``toolhost health --live|--ready``: a probe for systemd and Kubernetes exec checks.

Prints one JSON line and exits 0 when the probe passes, 1 when it does not (including when no
host answers within ``--timeout``).
"""

from __future__ import annotations

import argparse
import sys

import msgspec
import trio

from supervisor.cli.common import EXIT_FAILED, EXIT_OK, socket_path
from supervisor.client import open_client
from supervisor.contracts.rpc import HealthResult
from supervisor.server.health import Probe, probe


def run(args: argparse.Namespace) -> int:
    kind: Probe = "ready" if args.ready else "live"
    path = socket_path(args)
    health, error = trio.run(_ask, path, args.timeout)
    ok, body = probe(kind, health, error)
    sys.stdout.write(msgspec.json.encode(body).decode() + "\n")
    return EXIT_OK if ok else EXIT_FAILED


async def _ask(path: str, seconds: float) -> tuple[HealthResult | None, str]:
    try:
        with trio.fail_after(seconds):
            async with open_client(path, name="toolhost-health") as client:
                return await client.health(), ""
    except trio.TooSlowError:
        return None, f"no answer from {path} within {seconds:g} s"
    except Exception as exc:  # connection refused, lost, bad answer: not live
        return None, f"{path}: {exc}"
