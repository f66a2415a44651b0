"""The keeper of one ``task.background`` task (run as a script, standard library only).

Usage: ``python taskrun.py <taskdir> <watch-pid> -- <argv...>``

# Strategy: the utility worker starts this keeper in a new session, so the keeper leads the
# task's process group. The keeper runs the task's command in that group (stdin from /dev/null,
# stdout/stderr appended to ``<taskdir>/stdout.log`` and ``stderr.log``) and waits on two pidfds:
# the command's and, unless ``<watch-pid>`` is 0 (``config.detach``), the host's. When the host
# goes away the keeper stops the group (SIGTERM, grace, SIGKILL). When the command ends, the
# keeper stops what is left of its group (grandchildren) and writes ``<taskdir>/exit.json``
# atomically, so a worker that restarted meanwhile (and so is not the keeper's parent) still
# learns the exit code. SIGTERM/SIGINT/SIGHUP reach the keeper too when the group is signalled;
# it catches them (a handler, not SIG_IGN, so the command gets default dispositions) and keeps
# waiting for the command to end. ``cancel`` asks the keeper through ``<taskdir>/control``, a
# FIFO it reads (``cancel <grace-ms>``): a worker that restarted under confinement runs in
# another Landlock domain and may not signal the keeper's group, but the keeper may.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import stat
import subprocess
import sys
import time

GRACE_S = 2.0
CONTROL = "control"
"""The FIFO in the task's folder the keeper reads requests from."""


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) pids in process group ``pgid``, this process excluded."""
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # fields[0] is the state, fields[2] the process group.
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":
            found.append(int(name))
    return found


def stop_group(grace_s: float) -> None:
    """SIGTERM the rest of this group, wait up to ``grace_s``, then SIGKILL what remains."""
    pgid = os.getpgrp()
    for pid in group_members(pgid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + grace_s
    while group_members(pgid) and time.monotonic() < end:
        time.sleep(0.05)
    for pid in group_members(pgid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def write_json(path: str, doc: dict[str, object]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    if len(argv) < 5 or argv[3] != "--":
        print("usage: taskrun.py <taskdir> <watch-pid> -- <argv...>", file=sys.stderr)
        return 2
    taskdir, watch, command = argv[1], int(argv[2]), argv[4:]
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    host_fd = None
    if watch > 0:
        try:
            host_fd = os.pidfd_open(watch)
        except ProcessLookupError:
            write_json(os.path.join(taskdir, "exit.json"), _exit_doc(None, "host-stopped"))
            return 0
    control = os.path.join(taskdir, CONTROL)
    ctl_fd = None
    with contextlib.suppress(OSError):
        os.mkfifo(control, 0o600)
        # Read-write: the keeper holds a writer itself, so the FIFO never reads as closed.
        ctl_fd = os.open(control, os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW)
        if not stat.S_ISFIFO(os.fstat(ctl_fd).st_mode):  # not the FIFO it made: ignore it
            os.close(ctl_fd)
            ctl_fd = None
    try:
        with (
            open(os.path.join(taskdir, "stdout.log"), "ab") as out,
            open(os.path.join(taskdir, "stderr.log"), "ab") as err,
        ):
            proc = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=err, close_fds=True
            )
    except OSError as exc:
        doc = _exit_doc(None, "start-failed")
        doc["error"] = f"{command[0]}: {exc.strerror or exc}"
        write_json(os.path.join(taskdir, "exit.json"), doc)
        return 0
    child_fd = os.pidfd_open(proc.pid)
    reason = "exited"
    fds = [fd for fd in (child_fd, host_fd, ctl_fd) if fd is not None]
    while True:
        try:
            ready, _, _ = select.select(fds, [], [])
        except InterruptedError:
            continue
        if child_fd in ready:
            break
        if host_fd is not None and host_fd in ready:
            reason = "host-stopped"
            stop_group(GRACE_S)
            break
        if ctl_fd is not None and ctl_fd in ready:
            grace = _cancel_request(ctl_fd)
            if grace is not None:
                reason = "cancelled"
                stop_group(grace)
                break
    code = proc.wait()
    stop_group(0.5)  # whatever the command left running in its group
    if ctl_fd is not None:
        with contextlib.suppress(OSError):
            os.unlink(control)
        os.close(ctl_fd)
    write_json(os.path.join(taskdir, "exit.json"), _exit_doc(code, reason))
    return 0


def _cancel_request(fd: int) -> float | None:
    """The grace in seconds of a ``cancel <grace-ms>`` line read from ``fd`` (None: none)."""
    try:
        data = os.read(fd, 4096)
    except OSError:
        return None
    for line in data.decode("ascii", "replace").splitlines():
        words = line.split()
        if words[:1] == ["cancel"]:
            ms = words[1] if len(words) > 1 and words[1].isdigit() else ""
            return int(ms) / 1000.0 if ms else GRACE_S
    return None


def _exit_doc(code: int | None, reason: str) -> dict[str, object]:
    return {
        "exitCode": code if code is not None and code >= 0 else None,
        "signal": -code if code is not None and code < 0 else None,
        "reason": reason,
        "endedAt": time.time(),
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv))
