"""``computer.mouse`` and ``computer.keyboard``: only through the configured delegate commands.

# Strategy: ``config.mouseCommand`` / ``config.keyboardCommand`` are argument templates, e.g.
# ``["python", "-m", "sidecars.computer.xdo", "mouse", "{action}", "{x}", "{y}", "{button}"]``.
# Each ``{name}`` is replaced by the call's value (a placeholder may sit inside an element:
# ``"--x={x}"``); the result runs with no shell, so text never meets a shell parser. A missing
# template means the tool is ``unavailable``: there is no fallback that moves a pointer or types.
# Control actions are serialised in the worker (one lock), so two calls never interleave keys.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from typing import Any

from sidecars.computer.platform import STDERR_TAIL, display_env
from sidecars.sdk import ToolError
from sidecars.sdk.commands import Missing, resolve

MOUSE_FIELDS = ("action", "x", "y", "button", "toX", "toY", "direction", "amount")
KEYBOARD_FIELDS = ("action", "text", "keys")
PLACEHOLDER = re.compile(r"\{([A-Za-z]+)\}")
HINT = (
    "`toolhost init --add computer` configures the bundled xdotool delegate when xdotool is "
    "installed (apt install xdotool)"
)

control_lock = threading.Lock()


def template_problem(
    config: dict[str, Any], key: str, fields: tuple[str, ...], cwd: str
) -> str | None:
    """Why the ``key`` delegate cannot run, or None."""
    got = resolve(config, key, cwd, hint=HINT)
    if isinstance(got, Missing):
        return got.message
    for element in got.argv[1:]:
        for name in PLACEHOLDER.findall(element):
            if name not in fields:
                return f"config.{key} uses unknown placeholder {{{name}}} (known: {fields})"
    return None


def expand(template: list[str], values: dict[str, str]) -> list[str]:
    """Replace every ``{name}`` of ``template[1:]`` with ``values[name]``."""
    return [template[0]] + [
        PLACEHOLDER.sub(lambda m: values[m.group(1)], element) for element in template[1:]
    ]


def run_delegate(
    tool: str,
    key: str,
    fields: tuple[str, ...],
    values: dict[str, str],
    config: dict[str, Any],
    cwd: str,
    deadline: float,
) -> dict[str, Any]:
    """Run the delegate of ``key`` with ``values``; its facts, or a ``ToolError``."""
    problem = template_problem(config, key, fields, cwd)
    if problem is not None:
        raise ToolError(
            f"{tool} is unavailable: {problem}",
            code="unavailable",
            details={"reason": "no-delegate", "key": key},
        )
    got = resolve(config, key, cwd, hint=HINT)
    assert not isinstance(got, Missing)
    argv = expand(got.argv, values)
    with control_lock:
        left = deadline - time.monotonic()
        try:
            proc = subprocess.run(
                argv,
                capture_output=True,
                timeout=max(0.1, left),
                env=display_env(config),
                stdin=subprocess.DEVNULL,
                cwd=cwd,
            )
        except subprocess.TimeoutExpired:
            raise ToolError(
                f"{tool}: the delegate did not finish in time",
                code="failed",
                details={"reason": "delegate-timeout", "command": got.argv[0]},
            ) from None
        except OSError as exc:
            raise ToolError(
                f"{tool}: cannot run the delegate: {exc.strerror or exc}",
                code="unavailable",
                details={"reason": "delegate-missing", "command": got.argv[0]},
            ) from None
    if proc.returncode != 0:
        stderr = proc.stderr.decode("utf-8", "replace")[-STDERR_TAIL:]
        raise ToolError(
            f"{tool}: the delegate exited with {proc.returncode}: {stderr.strip()}",
            code="failed",
            details={
                "reason": "delegate-failed",
                "exitCode": proc.returncode,
                "stderr": stderr,
            },
        )
    return {
        "delegate": got.argv[0].rsplit("/", 1)[-1],
        "stdout": proc.stdout.decode("utf-8", "replace")[-STDERR_TAIL:],
    }
