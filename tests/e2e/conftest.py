"""Run the real ``toolhost`` command in a temp app root."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

TOOLHOST = [sys.executable, "-m", "supervisor"]


@contextmanager
def serve(
    root: Path, *extra: str, env: dict[str, str] | None = None, nofile: int | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Start ``toolhost serve`` and return once it logged that it is serving (``nofile``: its
    soft open-file limit)."""
    full_env = {**os.environ, "XDG_CONFIG_HOME": str(root / ".xdg"), **(env or {})}

    def limit() -> None:
        if nofile is not None:
            _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))

    proc = subprocess.Popen(
        [*TOOLHOST, "serve", "--app-root", str(root), *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=full_env,
        preexec_fn=limit if nofile is not None else None,
    )
    try:
        assert proc.stderr is not None
        lines = []
        for raw in proc.stderr:
            line = raw.decode(errors="replace")
            lines.append(line)
            if "toolhost serving" in line:
                break
        else:
            pytest.fail("toolhost serve exited early:\n" + "".join(lines))
        yield proc
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if it has not ended within 15 s; reaped either way."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cli(root: Path, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TOOLHOST, *args, "--app-root", str(root)],
        capture_output=True,
        text=True,
        input=input,
        timeout=60,
        env={**os.environ, "XDG_CONFIG_HOME": str(root / ".xdg")},
    )
