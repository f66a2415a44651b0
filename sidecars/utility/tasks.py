"""``task.background``: start, watch, page the output of and cancel long-running commands.

# Strategy: ``config.taskCommand`` (an argument list) is the only program this tool runs; a
# call's ``args`` are appended, never passed through a shell. Each task gets a directory
# ``<projectDir>/.toolhost/tasks/<id>/`` holding ``meta.json`` (argv, keeper pid and the pid's
# kernel start time), ``stdout.log``/``stderr.log``, the keeper's ``control`` FIFO (``cancel``
# asks it to stop its group: a restarted confined worker may not signal it) and ``exit.json``
# once it ended. A keeper process (:mod:`sidecars.utility.taskrun`, in its own session, so its
# pid is the task's process group) runs the command, records the exit and watches the host:
# when the host's process ends the task's group is stopped, unless ``config.detach`` is true.
# Because everything is on disk and the keeper is identified by pid *and* start time (a reused
# pid never matches), a worker that restarted re-attaches to its tasks with no state of its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from sidecars.sdk import Context, Reply, Sidecar, ToolError
from sidecars.sdk.commands import Missing, require, resolve
from sidecars.sdk.paths import confine, create_parents
from sidecars.utility.taskrun import CONTROL, group_members

HINT = 'set "taskCommand": ["<program>", "<fixed args>..."]; call args are appended'
KEEPER = str(Path(__file__).with_name("taskrun.py"))
TASKS_DIR = ".toolhost/tasks"
DEFAULT_MAX_TASKS = 4
DEFAULT_CANCEL_GRACE_MS = 3000
DEFAULT_OUTPUT_BYTES = 16 << 10
MAX_OUTPUT_BYTES = 1 << 20
KEEPER_MARGIN_S = 2.0
"""How much longer than the grace a cancel waits for a keeper it asked to stop its group."""
ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")

_start_lock = threading.Lock()
_children: dict[int, subprocess.Popen[bytes]] = {}
"""Keepers this worker started, polled so they never linger as zombies."""


class TaskInput(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    """One task action."""

    action: Annotated[
        Literal["start", "status", "output", "cancel"],
        Meta(description="start a task, or status/output/cancel one by id."),
    ]
    args: Annotated[
        list[str] | None,
        Meta(description="start: arguments appended to config.taskCommand (no shell)."),
    ] = None
    id: Annotated[str | None, Meta(description="The task id that start returned.")] = None
    stream: Annotated[
        Literal["stdout", "stderr"] | None, Meta(description="output: which stream (stdout).")
    ] = None
    offset: Annotated[
        Annotated[int, Meta(ge=0)] | None,
        Meta(description="output: byte offset to read from; omitted = the tail."),
    ] = None
    max_bytes: Annotated[
        Annotated[int, Meta(ge=1, le=MAX_OUTPUT_BYTES)] | None,
        Meta(description="output: most bytes returned (16 KiB when omitted, at most 1 MiB)."),
    ] = None


def _reap() -> None:
    for pid, proc in list(_children.items()):
        if proc.poll() is not None:
            _children.pop(pid, None)


def _start_time(pid: int) -> int | None:
    """The kernel start time of ``pid`` (clock ticks since boot), None when gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] == b"Z":
        return None
    return int(fields[19])


def _tasks_root(ctx: Context) -> Path:
    return confine(
        ctx.project_dir, TASKS_DIR, must_exist=False, kind="dir", label="tasks dir", own_state=True
    )


def _task_dir(ctx: Context, task_id: str | None) -> Path:
    if not task_id:
        raise ToolError(
            "this action needs the task's id", code="invalid-input", details={"reason": "no-id"}
        )
    if not ID_RE.match(task_id):
        raise ToolError(
            f"{task_id!r} is not a task id",
            code="invalid-input",
            details={"id": task_id, "reason": "bad-id"},
        )
    path = _tasks_root(ctx) / task_id
    if not (path / "meta.json").is_file():
        raise ToolError(
            f"no task {task_id!r}", code="failed", details={"id": task_id, "reason": "unknown-task"}
        )
    return path


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc), encoding="utf-8")
    os.replace(tmp, path)


def _running(meta: dict[str, Any], folder: Path) -> bool:
    if (folder / "exit.json").exists():
        return False
    pid = meta.get("pid")
    return isinstance(pid, int) and _start_time(pid) == meta.get("startTime")


def status_of(folder: Path) -> dict[str, Any]:
    """The public status of the task stored in ``folder``."""
    _reap()
    meta = _read_json(folder / "meta.json") or {}
    running = _running(meta, folder)
    exit_doc = None if running else _read_json(folder / "exit.json")
    started = float(meta.get("startedAt", 0.0))
    out: dict[str, Any] = {
        "id": folder.name,
        "status": "running",
        "pid": meta.get("pid"),
        "args": meta.get("args", []),
        "startedAt": started,
    }
    if running:
        out["durationMs"] = round((time.time() - started) * 1000)
    elif exit_doc is None:
        # The keeper is gone without recording an exit: killed with its group (SIGKILL).
        out.update(status="killed", exitCode=None, signal=None, reason="lost")
    else:
        ended = float(exit_doc.get("endedAt", time.time()))
        reason = str(exit_doc.get("reason", "exited"))
        if (folder / "cancel.json").exists():
            reason = "cancelled"
        exit_code = exit_doc.get("exitCode")
        out.update(
            status="exited" if exit_code is not None else "killed",
            exitCode=exit_code,
            signal=exit_doc.get("signal"),
            reason=reason,
            endedAt=ended,
            durationMs=round((ended - started) * 1000),
        )
        if exit_doc.get("error"):
            out["error"] = exit_doc["error"]
    return out


def _count_running(root: Path) -> int:
    if not root.is_dir():
        return 0
    count = 0
    for folder in root.iterdir():
        meta = _read_json(folder / "meta.json")
        if meta is not None and _running(meta, folder):
            count += 1
    return count


def _int_config(config: dict[str, Any], key: str, default: int, low: int) -> int:
    value = config.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ToolError(
            f"config.{key} must be an integer >= {low}",
            code="failed",
            details={"reason": "bad-config", "key": key},
        )
    return value


def start(args: TaskInput, ctx: Context) -> Reply:
    argv = require(ctx.config, "taskCommand", ctx.project_dir, hint=HINT, tool="task.background")
    extra = args.args or []
    if any("\x00" in a for a in extra):
        raise ToolError(
            "args may not contain NUL bytes", code="invalid-input", details={"reason": "nul-byte"}
        )
    limit = _int_config(ctx.config, "maxTasks", DEFAULT_MAX_TASKS, 1)
    detach = ctx.config.get("detach", False) is True
    root = _tasks_root(ctx)
    with _start_lock:
        _reap()
        running = _count_running(root)
        if running >= limit:
            raise ToolError(
                f"{running} tasks are running; the limit is {limit} (config.maxTasks)",
                code="unavailable",
                details={"reason": "too-many-tasks", "limit": limit},
            )
        task_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        folder = root / task_id
        try:
            create_parents(folder)
            folder.mkdir()
        except PermissionError as exc:
            raise ToolError(
                f"cannot create the task folder {TASKS_DIR}/{task_id}: {exc.strerror}. Under"
                " confinement a projectDir that is the app root cannot hold it (its .toolhost/"
                " is the host's, never granted): set host.projectDir to a folder of its own"
                ' (e.g. "workspace")',
                code="failed",
                details={"reason": "tasks-dir-denied", "dir": TASKS_DIR},
            ) from exc
        watch = 0 if detach else os.getppid()
        with open(folder / "keeper.log", "ab") as keeper_log:
            proc = subprocess.Popen(
                [sys.executable, KEEPER, str(folder), str(watch), "--", *argv, *extra],
                cwd=ctx.project_dir,
                stdin=subprocess.DEVNULL,
                stdout=keeper_log,
                stderr=keeper_log,
                start_new_session=True,
                close_fds=True,
            )
        _children[proc.pid] = proc
        meta = {
            "id": task_id,
            "argv": [*argv, *extra],
            "args": extra,
            "pid": proc.pid,
            "startTime": _start_time(proc.pid),
            "startedAt": time.time(),
            "detach": detach,
        }
        _write_json(folder / "meta.json", meta)
    rel = f"{TASKS_DIR}/{task_id}"
    data = {"id": task_id, "status": "running", "pid": proc.pid, "dir": rel, "detach": detach}
    return Reply(data=data, content=f"task {task_id} started (pid {proc.pid}); output in {rel}/")


def output(args: TaskInput, ctx: Context) -> Reply:
    folder = _task_dir(ctx, args.id)
    stream = args.stream or "stdout"
    path = folder / f"{stream}.log"
    limit = args.max_bytes or DEFAULT_OUTPUT_BYTES
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        size = 0
    offset = max(0, size - limit) if args.offset is None else min(args.offset, size)
    chunk = b""
    if size > offset:
        with path.open("rb") as f:
            f.seek(offset)
            chunk = f.read(limit)
    state = status_of(folder)
    data = {
        "id": folder.name,
        "stream": stream,
        "offset": offset,
        "nextOffset": offset + len(chunk),
        "size": size,
        "text": chunk.decode("utf-8", "replace"),
        "status": state["status"],
        "complete": state["status"] != "running" and offset + len(chunk) >= size,
    }
    return Reply(data=data, content=data["text"] or f"(no {stream} output yet)")


def _ask_keeper(folder: Path, grace_ms: int) -> bool:
    """Ask the task's keeper to stop its group (its ``control`` FIFO): it can signal the
    group even when this worker cannot (a restarted confined worker is in another Landlock
    domain, which signals do not cross). False: no keeper reads it (gone, or too old)."""
    try:
        fd = os.open(folder / CONTROL, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:  # ENXIO: no reader
        return False
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        os.write(fd, f"cancel {grace_ms}\n".encode("ascii"))
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def cancel(args: TaskInput, ctx: Context) -> Reply:
    folder = _task_dir(ctx, args.id)
    meta = _read_json(folder / "meta.json") or {}
    grace_ms = _int_config(ctx.config, "cancelGraceMs", DEFAULT_CANCEL_GRACE_MS, 0)
    if _running(meta, folder):
        pgid = int(meta["pid"])
        _write_json(folder / "cancel.json", {"at": time.time()})
        asked = _ask_keeper(folder, grace_ms)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
        # An asked keeper kills what is left at the grace's end itself, and then ends.
        end = time.monotonic() + grace_ms / 1000.0 + (KEEPER_MARGIN_S if asked else 0.0)
        while group_members(pgid) and time.monotonic() < end:
            _reap()
            time.sleep(0.02)
        if group_members(pgid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
            if not (folder / "exit.json").exists():
                _write_json(
                    folder / "exit.json",
                    {"exitCode": None, "signal": 9, "reason": "cancelled", "endedAt": time.time()},
                )
        _reap()
    state = status_of(folder)
    return Reply(data=state, content=f"task {folder.name}: {state['status']}")


def task_background(args: TaskInput, ctx: Context) -> Reply:
    """Dispatch one ``task.background`` action."""
    if args.action == "start":
        return start(args, ctx)
    # The other actions work without taskCommand too (tasks started before a config change).
    if args.action == "output":
        return output(args, ctx)
    if args.action == "cancel":
        return cancel(args, ctx)
    state = status_of(_task_dir(ctx, args.id))
    return Reply(data=state, content=f"task {state['id']}: {state['status']}")


def health(config: dict[str, Any], cwd: str) -> str | None:
    """Why ``task.background`` is unavailable now, or None when the command resolves."""
    got = resolve(config, "taskCommand", cwd, hint=HINT)
    return got.message if isinstance(got, Missing) else None


def register(app: Sidecar) -> None:
    """Register ``task.background`` on ``app``.

    Args:
        app: The utility sidecar.
    """
    app.tool(
        "task.background",
        description=(
            "Run config.taskCommand (with your args appended, no shell) as a background task: "
            "start returns an id; status gives running/exit code/duration; output pages "
            "stdout or stderr (tail by default, or from an offset); cancel stops the task's "
            "whole process group. Output files live under .toolhost/tasks/<id>/."
        ),
        concurrency_safe=True,
        permission="execute",
        sandbox="approval-required",
    )(task_background)
