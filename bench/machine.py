"""What the run happened on, and what a process costs: /proc readers, machine and git facts.

Host CPU comes from the host process's own accounting (``utime + stime`` in
``/proc/<pid>/stat``), which is steadier than wall time on a shared machine; RSS from
``/proc/<pid>/status``. Both fall back to psutil where /proc is missing.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_times(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds consumed so far by process ``pid`` (all its threads)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
        # The command name may hold spaces: fields start after the last ')'.
        fields = raw[raw.rindex(b")") + 2 :].split()
        return int(fields[11]) / _TICK, int(fields[12]) / _TICK
    except (OSError, ValueError, IndexError):
        t = psutil.Process(pid).cpu_times()
        return float(t.user), float(t.system)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds consumed so far by process ``pid``."""
    return sum(cpu_times(pid))


def rss_bytes(pid: int) -> int:
    """Resident set size of process ``pid`` (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return 0


class CpuWindow:
    """CPU seconds (user, system, total) of a process between :meth:`start` and :meth:`stop`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._t0 = (0.0, 0.0)
        self.user = 0.0
        self.system = 0.0
        self.seconds = 0.0

    def start(self) -> CpuWindow:
        self._t0 = cpu_times(self.pid)
        return self

    def stop(self) -> float:
        """Ends the window; returns the total CPU seconds in it."""
        user, system = cpu_times(self.pid)
        self.user = user - self._t0[0]
        self.system = system - self._t0[1]
        self.seconds = self.user + self.system
        return self.seconds

    def per_call_us(self, calls: int) -> dict[str, float]:
        """Host CPU µs per call: total, user (mostly Python) and system (syscalls)."""
        return {
            "hostCpuUsPerCall": self.seconds / calls * 1e6,
            "hostUserUsPerCall": self.user / calls * 1e6,
            "hostSysUsPerCall": self.system / calls * 1e6,
        }


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_info() -> dict[str, Any]:
    """The commit the bench ran from, and whether the tree had uncommitted changes."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()

    try:
        return {
            "commit": git("rev-parse", "HEAD"),
            "branch": git("rev-parse", "--abbrev-ref", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        }
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "branch": None, "dirty": None}


def machine_info() -> dict[str, Any]:
    """CPU count and model, memory, Python, platform and load at the start of the run."""
    try:
        load: list[float] | None = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "cpuCount": os.cpu_count(),
        "cpuModel": cpu_model(),
        "memoryMb": round(psutil.virtual_memory().total / 2**20),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "loadavg": load,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


class RssSampler:
    """The peak RSS of a process, sampled by a thread every ``interval_s`` while in use."""

    def __init__(self, pid: int, interval_s: float = 0.02) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes(self.pid))
            self.samples += 1
            self._stop.wait(self.interval_s)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes(self.pid))
