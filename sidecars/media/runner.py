"""Run one delegate call with the oneshot process-json protocol (PROTOCOL 3.2).

# Strategy: the delegate gets its own session (so the whole process group can be killed), the
# allow-listed environment, one request line on a closed stdin, and the call's remaining time.
# stdout is read up to the output cap (over it: killed, ``output-too-large``); stderr is drained
# into a bounded tail. The first stdout line is the answer; anything else is ``failed`` with the
# exit code and the stderr tail, so an audit can say what went wrong.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sidecars.media.delegates import ENGINES
from sidecars.sdk import Context, ToolError

ENV_ALLOW = ("PATH", "HOME", "LANG", "TZ", "TMPDIR")
"""PROTOCOL 3's allow-list (plus every ``LC_*``): nothing else reaches a delegate."""

STDERR_TAIL = 4096
DEFAULT_TIMEOUT_MS = 60_000
DEFAULT_OUTPUT_CAP = 1 << 20
CANCEL_POLL_S = 0.05
MARGIN_MS = 150
"""A delegate is stopped this long before the host's deadline, so the sidecar still answers."""


class DelegateSpec:
    """One ``config.localCommands`` entry: ``{"command": str, "args": [str], "env": {}}``."""

    def __init__(self, tool: str, raw: Any) -> None:
        if not isinstance(raw, Mapping) or not isinstance(raw.get("command"), str):
            raise ValueError(f"config.localCommands[{tool!r}] needs a string 'command'")
        args = raw.get("args", [])
        env = raw.get("env", {})
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ValueError(f"config.localCommands[{tool!r}].args must be a list of strings")
        if not isinstance(env, Mapping) or not all(isinstance(v, str) for v in env.values()):
            raise ValueError(f"config.localCommands[{tool!r}].env must map names to strings")
        self.tool = tool
        self.command: str = raw["command"]
        self.args: list[str] = list(args)
        self.env: dict[str, str] = dict(env)

    def resolve(self, cwd: str) -> str:
        """The executable to start, following the registry's portability rules.

        ``python``/``python3`` mean this interpreter; a bare name is looked up on PATH; a
        relative path (``./bin/x``) resolves against ``cwd`` and must stay inside it; an
        absolute command is refused.

        Raises:
            ToolError: ``unavailable`` when the command is absolute, escapes or is not found.
        """
        cmd = self.command
        hint = f"fix config.localCommands[{self.tool!r}].command"
        if cmd in ("python", "python3"):
            return sys.executable
        if os.path.isabs(cmd):
            raise ToolError(
                f"delegate command {cmd!r} is absolute; give a PATH name or a relative path",
                code="unavailable",
                details={"command": cmd, "reason": "outside-root-denied", "hint": hint},
            )
        if "/" in cmd:
            root = Path(os.path.realpath(cwd))
            real = Path(os.path.realpath(root / cmd))
            if not real.is_relative_to(root):
                raise ToolError(
                    f"delegate command {cmd!r} leaves its cwd {cwd}",
                    code="unavailable",
                    details={"command": cmd, "reason": "outside-root-denied", "hint": hint},
                )
            if os.access(real, os.X_OK) and real.is_file():
                return str(real)
        else:
            found = shutil.which(cmd)
            if found is not None:
                return found
        raise ToolError(
            f"delegate command {cmd!r} for {self.tool} was not found",
            code="unavailable",
            details={"command": cmd, "reason": "command-not-found", "hint": hint},
        )


BUNDLED = "sidecars.media.delegates."
ENGINE_RECHECK_S = 30.0
"""A module engine found missing is looked for again after this long (one found stays found)."""
_module_checks: dict[tuple[str, str, tuple[tuple[str, str], ...]], tuple[str | None, float]] = {}
_module_lock = threading.Lock()


def check_engine(spec: DelegateSpec, exe: str, sidecar: str) -> None:
    """Raise ``unavailable`` (reason ``engine-missing``, the package as hint) when ``spec`` is a
    bundled delegate whose engine is absent, looked for in the delegate's own environment: the
    executable on its PATH, the module imported for real by its interpreter (a module that is
    found but fails while importing counts as absent). Other delegates are not inspected."""
    if spec.command not in ("python", "python3") or spec.args[:1] != ["-m"] or len(spec.args) < 2:
        return
    found = (
        ENGINES.get(spec.args[1].removeprefix(BUNDLED))
        if spec.args[1].startswith(BUNDLED)
        else None
    )
    if found is None:
        return
    kind, name, install = found
    env = delegate_env(spec.env, sidecar)
    if kind == "binary":
        problem = None if shutil.which(name, path=env.get("PATH")) else f"{name} is not on PATH"
    else:
        problem = _module_problem(exe, name, env)
    if problem is not None:
        raise ToolError(
            f"{spec.tool} is unavailable: its engine {name} is missing ({problem}); "
            f"install: {install}",
            code="unavailable",
            details={"reason": "engine-missing", "engine": name, "hint": install},
        )


def _module_problem(exe: str, module: str, env: dict[str, str]) -> str | None:
    key = (exe, module, tuple(sorted(env.items())))
    now = time.monotonic()
    with _module_lock:
        known = _module_checks.get(key)
        if known is not None and (known[0] is None or now - known[1] < ENGINE_RECHECK_S):
            return known[0]
        try:
            proc = subprocess.run(
                [exe, "-c", f"import {module}"],
                capture_output=True,
                env=env,
                stdin=subprocess.DEVNULL,
                timeout=30,
            )
            lines = proc.stderr.decode("utf-8", "replace").strip().splitlines()
            problem = (
                None
                if proc.returncode == 0
                else (lines[-1] if lines else f"exit {proc.returncode}")
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            problem = f"cannot run {exe}: {exc}"
        _module_checks[key] = (problem, now)
        return problem


def delegate_env(extra: Mapping[str, str], sidecar: str) -> dict[str, str]:
    """The allow-listed environment for a delegate."""
    env = {k: v for k, v in os.environ.items() if k in ENV_ALLOW or k.startswith("LC_")}
    env.update(extra)
    env["TOOLHOST_SIDECAR"] = sidecar
    env["TOOLHOST_PROTOCOL"] = "process-json"
    return env


def budget_ms(ctx: Context, config: Mapping[str, Any]) -> float:
    """Milliseconds the delegate may run: the call's remaining deadline less a margin."""
    if ctx.deadline_ms > 0:
        elapsed = (time.monotonic() - ctx.started) * 1000.0
        return max(1.0, ctx.deadline_ms - elapsed - MARGIN_MS)
    value = config.get("delegateTimeoutMs", DEFAULT_TIMEOUT_MS)
    return float(value) if isinstance(value, int | float) and value > 0 else DEFAULT_TIMEOUT_MS


class _Reader(threading.Thread):
    """Drain one pipe: keep the first ``cap`` bytes (or the last ``cap`` with ``tail``)."""

    def __init__(self, pipe: Any, cap: int, *, tail: bool, wake: threading.Event | None) -> None:
        super().__init__(daemon=True)
        self.pipe, self.cap, self.tail, self.wake = pipe, cap, tail, wake
        self.buf = bytearray()
        self.overflow = False

    def run(self) -> None:
        try:
            while chunk := self.pipe.read1(65536):
                self.buf += chunk
                if len(self.buf) > self.cap:
                    if self.tail:
                        del self.buf[: len(self.buf) - self.cap]
                    else:
                        self.overflow = True
                        del self.buf[self.cap :]
                        if self.wake is not None:
                            self.wake.set()
        finally:
            self.pipe.close()
            if self.wake is not None:
                self.wake.set()  # EOF: the delegate closed stdout (it exited, as a rule)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_delegate(
    spec: DelegateSpec, tool: str, payload: dict[str, Any], ctx: Context
) -> dict[str, Any]:
    """Run ``spec`` for one call and return its answer's fields (without ``ok``).

    Args:
        spec: The delegate to start.
        tool: The tool name sent in the request.
        payload: The request's ``input`` (paths already confined and absolute).
        ctx: The call (deadline, cancellation, config, anchors).

    Returns:
        The answer's fields.

    Raises:
        ToolError: ``unavailable`` for a missing command (or a delegate that says so),
            ``failed`` for a crash, a hang past the deadline, garbage or oversized output,
            ``cancelled`` when the host cancels the call.
    """
    config = ctx.config
    exe = spec.resolve(ctx.cwd)
    check_engine(spec, exe, ctx.app.sidecar_id)
    cap = config.get("maxDelegateOutputBytes", DEFAULT_OUTPUT_CAP)
    cap = cap if isinstance(cap, int) and cap > 0 else DEFAULT_OUTPUT_CAP
    request = {
        "tool": tool,
        "input": payload,
        "config": config,
        "cwd": ctx.cwd,
        "projectDir": ctx.project_dir,
        "configDir": ctx.app.config_dir,
    }
    limit_s = budget_ms(ctx, config) / 1000.0
    argv = [exe, *spec.args]
    base = {"command": spec.command, "tool": tool}
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=ctx.cwd,
            env=delegate_env(spec.env, ctx.app.sidecar_id),
            start_new_session=True,
        )
    except OSError as exc:
        raise ToolError(
            f"cannot start delegate {spec.command!r}: {exc.strerror or exc}",
            code="unavailable",
            details={**base, "reason": "spawn-failed"},
        ) from None
    wake = threading.Event()
    out = _Reader(proc.stdout, cap, tail=False, wake=wake)
    err = _Reader(proc.stderr, STDERR_TAIL, tail=True, wake=None)
    out.start()
    err.start()
    assert proc.stdin is not None
    try:
        proc.stdin.write(json.dumps(request).encode("utf-8") + b"\n")
        proc.stdin.close()
    except BrokenPipeError:
        pass
    # Wait on the stdout reader's event (set at EOF or overflow), not on Popen.wait(timeout),
    # which polls with sleeps of up to 50 ms; cancellation is looked at every CANCEL_POLL_S.
    deadline = time.monotonic() + limit_s
    reason = None
    while True:
        left = deadline - time.monotonic()
        woke = left > 0 and wake.wait(min(left, CANCEL_POLL_S))
        if out.overflow:
            reason = "output-too-large"
        elif woke:
            break
        elif ctx.cancelled.is_set():
            reason = "cancelled"
        elif time.monotonic() >= deadline:
            reason = "timeout"
        if reason is not None:
            _kill_group(proc)
            break
    if reason is None:
        try:  # stdout closed: the delegate is exiting (or closed it early and lingers)
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            reason = "timeout"
            _kill_group(proc)
    status = proc.wait()
    _kill_group(proc)  # grandchildren left behind by the delegate die with it
    out.join(timeout=2)
    err.join(timeout=2)
    stderr = err.buf.decode("utf-8", "replace")
    facts = {**base, "exitCode": status, "stderr": stderr}
    if reason == "cancelled":
        raise ToolError("call cancelled", code="cancelled", details=facts)
    if reason == "timeout":
        raise ToolError(
            f"delegate {spec.command!r} for {tool} ran past its deadline "
            f"({limit_s * 1000:.0f} ms) and was killed",
            details={**facts, "reason": "timeout"},
        )
    if reason == "output-too-large" or out.overflow:
        raise ToolError(
            f"delegate {spec.command!r} wrote more than {cap} bytes to stdout and was killed",
            details={**facts, "reason": "output-too-large", "limit": cap},
        )
    return _parse_answer(bytes(out.buf), spec, tool, facts)


def _parse_answer(
    stdout: bytes, spec: DelegateSpec, tool: str, facts: dict[str, Any]
) -> dict[str, Any]:
    line = stdout.split(b"\n", 1)[0].strip()
    answer: Any = None
    if line:
        try:
            answer = json.loads(line)
        except ValueError:
            answer = None
    status = facts["exitCode"]
    if not isinstance(answer, dict) or not isinstance(answer.get("ok"), bool):
        tail = facts["stderr"].strip()[-300:]
        if status != 0:
            message = f"delegate {spec.command!r} for {tool} exited with status {status}"
            reason = "delegate-crashed"
        else:
            message = f"delegate {spec.command!r} for {tool} answered no JSON object"
            reason = "bad-answer"
        raise ToolError(
            f"{message}{': ' + tail if tail else ''}",
            details={**facts, "reason": reason, "stdout": stdout[:300].decode("utf-8", "replace")},
        )
    fields = {k: v for k, v in answer.items() if k != "ok"}
    if answer["ok"]:
        return fields
    code = answer.get("code")
    code = code if code in ("failed", "unavailable", "unsupported") else "failed"
    message = str(answer.get("error") or f"delegate for {tool} failed")
    details = {k: v for k, v in fields.items() if k not in ("code", "error")}
    # The delegate's own engine facts keep their names apart from the delegate process's.
    for key, renamed in (("exitCode", "engineExitCode"), ("stderr", "engineStderr")):
        if key in details:
            details[renamed] = details.pop(key)
    raise ToolError(message, code=code, details={**details, **facts})
