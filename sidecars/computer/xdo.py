"""The bundled xdotool delegate of ``computer.mouse`` / ``computer.keyboard``.

``toolhost init --add computer`` registers it (only when ``xdotool`` is on PATH) as::

    "mouseCommand":    ["python", "-m", "sidecars.computer.xdo", "mouse", "{action}", "{x}", "{y}",
                        "{button}", "{toX}", "{toY}", "{direction}", "{amount}"]
    "keyboardCommand": ["python", "-m", "sidecars.computer.xdo", "keyboard", "{action}",
                        "{text}", "{keys}"]

It translates the generic actions into one ``xdotool`` command line (argument list, no shell;
typed text follows ``--`` so it is never read as an option) and exits with xdotool's status.
Standard library only, so it starts fast.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

BUTTONS = {"left": "1", "middle": "2", "right": "3"}
WHEEL = {"up": "4", "down": "5", "left": "6", "right": "7"}


def mouse_args(
    action: str,
    x: str,
    y: str,
    button: str,
    to_x: str,
    to_y: str,
    direction: str,
    amount: str,
    pointer: tuple[str, str] | None = None,
) -> list[str]:
    """xdotool arguments for one mouse action (pointer moved to x, y first).

    ``mousemove --sync`` waits until the pointer has left where it was, so it never returns when
    the pointer is already at the target: the move is left out when ``pointer`` (where it is
    now) is the target, and a drag's second move when it ends where it starts.
    """
    btn = BUTTONS.get(button, "1")
    if action == "position":
        return ["getmouselocation"]
    move = [] if pointer == (x, y) else ["mousemove", "--sync", x, y]
    if action == "move":
        return move
    if action == "click":
        return [*move, "click", btn]
    if action == "double_click":
        return [*move, "click", "--repeat", "2", "--delay", "80", btn]
    if action == "down":
        return [*move, "mousedown", btn]
    if action == "up":
        return [*move, "mouseup", btn]
    if action == "scroll":
        return [
            *move,
            "click",
            "--repeat",
            amount or "1",
            "--delay",
            "30",
            WHEEL.get(direction, "5"),
        ]
    if action == "drag":
        drag = [] if (to_x, to_y) == (x, y) else ["mousemove", "--sync", to_x, to_y]
        return [*move, "mousedown", btn, *drag, "mouseup", btn]
    raise SystemExit(f"xdo: unknown mouse action {action!r}")


def keyboard_args(action: str, text: str, keys: str) -> list[str]:
    """xdotool arguments for typing text or pressing keys (``"ctrl+s Return"``)."""
    if action == "type":
        return ["type", "--delay", "12", "--", text]
    if action == "key":
        return ["key", "--delay", "30", "--", *keys.split()]
    raise SystemExit(f"xdo: unknown keyboard action {action!r}")


def _pointer(exe: str) -> tuple[str, str] | None:
    """Where the pointer is now (``("x", "y")``), or None when xdotool cannot say."""
    out = subprocess.run([exe, "getmouselocation", "--shell"], capture_output=True, text=True)
    if out.returncode != 0:
        return None  # the action itself will fail and say why
    facts = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    return facts.get("X", ""), facts.get("Y", "")


def main(argv: list[str]) -> int:
    exe = shutil.which("xdotool")
    if exe is None:
        print("xdo: xdotool is not on PATH (apt install xdotool)", file=sys.stderr)
        return 127
    if len(argv) == 10 and argv[1] == "mouse":
        pointer = _pointer(exe) if argv[2] != "position" else None
        action, x, y, button, to_x, to_y, direction, amount = argv[2:10]
        args = mouse_args(action, x, y, button, to_x, to_y, direction, amount, pointer)
    elif len(argv) == 5 and argv[1] == "keyboard":
        args = keyboard_args(*argv[2:5])
    else:
        print(
            "usage: xdo mouse ACTION X Y BUTTON TOX TOY DIRECTION AMOUNT | "
            "xdo keyboard ACTION TEXT KEYS",
            file=sys.stderr,
        )
        return 2
    if args == ["getmouselocation"]:
        # Print "x y" (what the sidecar reads back) instead of xdotool's own format.
        out = subprocess.run([exe, "getmouselocation", "--shell"], capture_output=True, text=True)
        if out.returncode != 0:
            sys.stderr.write(out.stderr)
            return out.returncode
        facts = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
        print(facts.get("X", ""), facts.get("Y", ""))
        return 0
    if not args:
        return 0  # a move to where the pointer already is
    os.execv(exe, [exe, *args])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv))
