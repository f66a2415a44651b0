"""``screen.screenshot`` and ``computer.window`` through the platform's own commands.

# Strategy: nothing is bundled. At each call (and each ``pong``) the first usable command found on
# PATH is picked: screenshots from ``grim`` (Wayland), ``gnome-screenshot``, ``spectacle``,
# ImageMagick ``import`` or ``scrot``; windows from ``xdotool`` (works without a window manager)
# or ``wmctrl`` (needs one). Commands run with an argument list (no shell), the display taken from
# ``config.display`` or the worker's ``DISPLAY``/``WAYLAND_DISPLAY`` (the registry entry's
# ``env``: the host passes no display by default). A screenshot is written to a temporary file
# beside its target under projectDir and renamed into place, so a killed worker never leaves half
# a PNG. Width and height come from the PNG header, not from a library.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecars.sdk import ToolError

SCREENSHOT_COMMANDS = ("grim", "gnome-screenshot", "spectacle", "import", "scrot")
WINDOW_COMMANDS = ("xdotool", "wmctrl")
REGION_CAPABLE = ("grim", "import", "scrot")
SCREENSHOT_HINT = (
    "install one of: ImageMagick (import), scrot, grim (Wayland), gnome-screenshot, spectacle"
)
WINDOW_HINT = "install xdotool (or wmctrl, which needs a window manager)"
STDERR_TAIL = 2000
MAX_WINDOWS = 200


@dataclass(frozen=True)
class Region:
    x: int
    y: int
    width: int
    height: int


def display_env(config: dict[str, Any]) -> dict[str, str]:
    """The environment for platform commands: the worker's, with ``config.display`` applied."""
    env = dict(os.environ)
    display = config.get("display")
    if isinstance(display, str) and display:
        env["DISPLAY"] = display
    return env


def display_problem(config: dict[str, Any]) -> str | None:
    """Why no display can be reached, or None."""
    env = display_env(config)
    if env.get("DISPLAY") or env.get("WAYLAND_DISPLAY"):
        return None
    return (
        'no display: set the registry entry\'s env.DISPLAY (e.g. ":0") or config.display; '
        "the host passes no DISPLAY to sidecars by default"
    )


PIN_KEYS = {SCREENSHOT_COMMANDS: "screenshotCommand", WINDOW_COMMANDS: "windowCommand"}


def find(candidates: tuple[str, ...], config: dict[str, Any]) -> str | None:
    """The first candidate on PATH; ``config.screenshotCommand`` / ``windowCommand`` may pin one
    of them (an unknown or absent pinned name falls back to the search order)."""
    pinned = config.get(PIN_KEYS.get(candidates, ""))
    names = (pinned,) if isinstance(pinned, str) and pinned in candidates else candidates
    for name in names:
        if shutil.which(name):
            return name
    return None


def run(argv: list[str], config: dict[str, Any], timeout_s: float, tool: str) -> str:
    """Run a platform command; its stdout, or ``failed`` with exit code and stderr tail."""
    exe = shutil.which(argv[0])
    if exe is None:
        raise ToolError(
            f"{tool}: {argv[0]} is no longer on PATH",
            code="unavailable",
            details={"reason": "not-found", "command": argv[0]},
        )
    try:
        proc = subprocess.run(
            [exe, *argv[1:]],
            capture_output=True,
            timeout=max(0.1, timeout_s),
            env=display_env(config),
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise ToolError(
            f"{tool}: {argv[0]} did not finish in {timeout_s:.1f}s",
            code="failed",
            details={"reason": "command-timeout", "command": argv[0]},
        ) from None
    if proc.returncode != 0:
        stderr = proc.stderr.decode("utf-8", "replace")[-STDERR_TAIL:]
        raise ToolError(
            f"{tool}: {argv[0]} exited with {proc.returncode}: {stderr.strip()}",
            code="failed",
            details={
                "reason": "command-failed",
                "command": argv[0],
                "exitCode": proc.returncode,
                "stderr": stderr,
            },
        )
    return proc.stdout.decode("utf-8", "replace")


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk."""
    with path.open("rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise ToolError(
            "the screenshot command did not write a PNG",
            code="failed",
            details={"reason": "not-png"},
        )
    width, height = struct.unpack(">II", head[16:24])
    return int(width), int(height)


def screenshot_argv(command: str, out: Path, region: Region | None) -> list[str]:
    """The argument list that captures the screen (or ``region``) into ``out`` as PNG."""
    if command == "import":
        argv = ["import", "-silent", "-window", "root"]
        if region is not None:
            argv += ["-crop", f"{region.width}x{region.height}+{region.x}+{region.y}", "+repage"]
        return [*argv, f"PNG24:{out}"]
    if command == "scrot":
        argv = ["scrot", "--overwrite"]
        if region is not None:
            argv += ["--autoselect", f"{region.x},{region.y},{region.width},{region.height}"]
        return [*argv, str(out)]
    if command == "grim":
        argv = ["grim", "-t", "png"]
        if region is not None:
            argv += ["-g", f"{region.x},{region.y} {region.width}x{region.height}"]
        return [*argv, str(out)]
    if command == "gnome-screenshot":
        return ["gnome-screenshot", "-f", str(out)]
    return ["spectacle", "--background", "--nonotify", "--fullscreen", "--output", str(out)]


# windows -----------------------------------------------------------------------------------


def window_id(raw: str) -> int | None:
    """``"0x1a00003"`` or ``"27262979"`` as an int; None when it is not an id."""
    text = raw.strip().lower()
    try:
        return int(text, 16) if text.startswith("0x") else int(text, 10)
    except ValueError:
        return None


def list_windows(command: str, config: dict[str, Any], deadline: float) -> list[dict[str, Any]]:
    """Visible, named top-level windows with their geometry."""
    if command == "wmctrl":
        out = run(["wmctrl", "-lpG"], config, deadline - time.monotonic(), "computer.window")
        windows = []
        for line in out.splitlines():
            parts = line.split(None, 8)
            if len(parts) < 8:
                continue
            hex_id, _desk, pid, x, y, w, h = parts[:7]
            name = parts[8] if len(parts) > 8 else ""
            windows.append(
                {
                    "id": int(hex_id, 16),
                    "name": name,
                    "pid": int(pid) or None,
                    "x": int(x),
                    "y": int(y),
                    "width": int(w),
                    "height": int(h),
                }
            )
        return windows
    try:
        out = run(
            ["xdotool", "search", "--onlyvisible", "--name", "."],
            config,
            deadline - time.monotonic(),
            "computer.window",
        )
    except ToolError as exc:
        details = exc.details or {}
        if details.get("exitCode") == 1 and not str(details.get("stderr", "")).strip():
            return []  # xdotool search exits 1, silently, when nothing matches: no windows
        raise
    windows = []
    for token in out.split()[:MAX_WINDOWS]:
        wid = window_id(token)
        if wid is None:
            continue
        try:
            windows.append(geometry("xdotool", wid, config, deadline))
        except ToolError as exc:
            if (exc.details or {}).get("reason") != "unknown-window":
                raise  # a window closed between the search and its geometry is just gone
    return windows


def geometry(command: str, wid: int, config: dict[str, Any], deadline: float) -> dict[str, Any]:
    """One window's name and geometry."""
    if command == "wmctrl":
        for window in list_windows("wmctrl", config, deadline):
            if window["id"] == wid:
                return window
        raise ToolError(
            f"no window {wid:#x}", code="failed", details={"reason": "unknown-window", "id": wid}
        )
    left = deadline - time.monotonic()
    try:
        shell = run(
            ["xdotool", "getwindowgeometry", "--shell", str(wid)], config, left, "computer.window"
        )
        name = run(["xdotool", "getwindowname", str(wid)], config, left, "computer.window")
    except ToolError as exc:
        if (exc.details or {}).get("reason") == "command-failed":
            raise ToolError(
                f"no window {wid:#x}",
                code="failed",
                details={"reason": "unknown-window", "id": wid},
            ) from None
        raise
    facts = dict(line.split("=", 1) for line in shell.splitlines() if "=" in line)
    return {
        "id": wid,
        "name": name.rstrip("\n"),
        "x": int(facts.get("X", 0)),
        "y": int(facts.get("Y", 0)),
        "width": int(facts.get("WIDTH", 0)),
        "height": int(facts.get("HEIGHT", 0)),
    }


def focus(command: str, wid: int, config: dict[str, Any], deadline: float) -> None:
    """Give ``wid`` the input focus (and raise it)."""
    left = deadline - time.monotonic()
    if command == "wmctrl":
        run(["wmctrl", "-i", "-a", hex(wid)], config, left, "computer.window")
        return
    # windowfocus works without a window manager; windowraise keeps it on top.
    run(["xdotool", "windowraise", str(wid)], config, left, "computer.window")
    run(["xdotool", "windowfocus", "--sync", str(wid)], config, left, "computer.window")
