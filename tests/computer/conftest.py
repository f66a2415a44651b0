"""An X server (Xvfb on a free display) and a real Tk window of the test, for computer.* tests.

Locally the tests skip with a reason when Xvfb, xdotool, ImageMagick or tkinter is missing;
with ``CI=true`` they fail instead (``.ci/run`` installs them).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
NEEDED = {"Xvfb": "xvfb", "xdotool": "xdotool", "import": "imagemagick"}
SCREEN = (1024, 768)


def _missing() -> list[str]:
    missing = [pkg for exe, pkg in NEEDED.items() if shutil.which(exe) is None]
    try:
        import tkinter  # noqa: F401
    except ImportError:
        missing.append("python3-tk (tkinter for the test window)")
    return missing


def require_x() -> None:
    missing = _missing()
    if not missing:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must install: {', '.join(missing)}")
    pytest.skip(f"needs {', '.join(missing)} (apt-get install -y xvfb xdotool imagemagick)")


@dataclass
class Window:
    id: int
    x: int
    y: int
    width: int
    height: int
    record: Path
    frame: int = 0

    @property
    def centre(self) -> tuple[int, int]:
        return self.x + self.width // 2, self.y + self.height // 2

    def events(self) -> list[str]:
        return self.record.read_text().splitlines()[1:]

    def wait_event(self, prefix: str, timeout: float = 10, count: int = 1) -> list[str]:
        """Wait until the window recorded ``count`` events starting with ``prefix``; all such
        events."""
        deadline = time.monotonic() + timeout
        while True:
            found = [e for e in self.events() if e.startswith(prefix)]
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.02)


@dataclass
class Display:
    name: str
    window: Window

    def env(self) -> dict[str, str]:
        return {**os.environ, "DISPLAY": self.name}

    def xdotool(self, *args: str) -> str:
        out = subprocess.run(
            ["xdotool", *args], capture_output=True, text=True, env=self.env(), timeout=10
        )
        assert out.returncode == 0, out.stderr
        return out.stdout


@contextlib.contextmanager
def xvfb() -> Iterator[str]:
    """Xvfb on a display it picks itself (``-displayfd``), no window on it; its name (``:N``)."""
    require_x()
    read_fd, write_fd = os.pipe()
    server = subprocess.Popen(
        [
            "Xvfb",
            "-displayfd",
            str(write_fd),
            "-screen",
            "0",
            f"{SCREEN[0]}x{SCREEN[1]}x24",
            "-nolisten",
            "tcp",
        ],
        pass_fds=(write_fd,),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.close(write_fd)
    try:
        with os.fdopen(read_fd) as f:
            number = f.readline().strip()
        assert number, "Xvfb did not report its display"
        yield f":{number}"
    finally:
        _stop(server)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def empty_display() -> Iterator[str]:
    """An X server with no window at all (an empty desktop)."""
    with xvfb() as name:
        yield name


@pytest.fixture
def xdisplay(tmp_path: Path) -> Iterator[Display]:
    """Xvfb and the Tk window, for one test."""
    with xvfb() as name:
        yield from _with_window(name, tmp_path)


def _with_window(name: str, tmp_path: Path) -> Iterator[Display]:
    window_proc = None
    try:
        record = tmp_path / "window-events.txt"
        record.write_text("")
        window_proc = subprocess.Popen(
            [sys.executable, str(HERE / "xwindow.py"), str(record)],
            env={**os.environ, "DISPLAY": name},
        )
        deadline = time.monotonic() + 20
        while not record.read_text().startswith("ready"):
            assert window_proc.poll() is None, "the test window exited"
            assert time.monotonic() < deadline, "the test window never mapped"
            time.sleep(0.02)
        frame = int(record.read_text().split()[1])
        display = Display(name, Window(frame, 100, 80, 320, 200, record))
        # The id a window list reports: the visible window carrying the title.
        found = display.xdotool("search", "--onlyvisible", "--name", "toolhost-test-window")
        display.window.id = int(found.split()[0])
        display.window.frame = frame
        yield display
    finally:
        if window_proc is not None:
            _stop(window_proc)


def pixel(path: Path, x: int, y: int) -> tuple[int, int, int]:
    """The RGB colour of one pixel of a PNG (Pillow, from the test extra)."""
    from PIL import Image

    with Image.open(path) as image:
        r, g, b = image.convert("RGB").getpixel((x, y))
        return r, g, b
