"""Which confined starts without a zygote need no second interpreter: a Python worker run by
the host's own interpreter starts that interpreter on the exec shim (``--python``), which puts
the walls up and runs the worker's module or script in it.

# Strategy: the exec shim (``confine_exec.py``) costs a whole bare interpreter start before the
# worker's own. For ``<python> [flags] -m MOD ARGS`` or ``<python> [flags] SCRIPT ARGS`` the
# worker's interpreter can run the shim itself, with the same flags; but that interpreter's own
# start (``site``: every ``.pth`` file of its site folders, ``sitecustomize``,
# ``usercustomize``, the modules they import) then runs *before* the walls, where the shim's
# bare ``-I -S`` start runs only the standard library. :func:`direct_argv` takes that form only
# where this adds nothing a worker could have planted: the interpreter is the host's own (its
# site folders are those the host itself ran at its start), the worker's environment changes
# nothing of that start (no ``PYTHONPATH``, ``PYTHONHOME``, ...), and no folder that start reads
# code from can be written by a worker (under Landlock: no write grant on, above or below one;
# without Landlock: not writable by this user at all). Everything else keeps the shim and its
# ``execvp``. The reasoning and the trade-off: docs/confinement.md ("The exec shim").
"""

from __future__ import annotations

import os
import site
import sys
import zipfile
from collections.abc import Mapping, Sequence

from supervisor.processes.confine import SHIM

FLAGS = frozenset("bBdEIOPqRsSuv")
"""Interpreter flags the ``--python`` form keeps as they are (no argument, nothing to do with
how the main module is found or read: not ``-c``, ``-i``, ``-x``, ``-h``, ``-V``)."""
VALUED = frozenset("WX")
"""Flags with a value (``-W error``, ``-Xdev``)."""
INERT_ENV = frozenset(
    (
        "PYTHONASYNCIODEBUG",
        "PYTHONCOERCECLOCALE",
        "PYTHONDEVMODE",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONFAULTHANDLER",
        "PYTHONHASHSEED",
        "PYTHONINTMAXSTRDIGITS",
        "PYTHONIOENCODING",
        "PYTHONMALLOC",
        "PYTHONNODEBUGRANGES",
        "PYTHONNOUSERSITE",
        "PYTHONOPTIMIZE",
        "PYTHONSAFEPATH",
        "PYTHONTRACEMALLOC",
        "PYTHONUNBUFFERED",
        "PYTHONUTF8",
        "PYTHONWARNDEFAULTENCODING",
        "PYTHONWARNINGS",
    )
)
"""``PYTHON*`` variables that make the interpreter's start read no other file; any other one
(``PYTHONPATH``, ``PYTHONHOME``, ``PYTHONUSERBASE``, ``PYTHONPYCACHEPREFIX``, ``PYTHONSTARTUP``,
``PYTHONPLATLIBDIR``, ...) keeps the shim."""


def split(argv: Sequence[str]) -> tuple[list[str], list[str]] | None:
    """``(interpreter and flags, ["-m", module, *args] or [script, *args])`` of a Python
    command the ``--python`` form can run (None: another form, or a flag it does not keep)."""
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == "-m":
            if i + 1 < len(argv) and argv[i + 1] and not argv[i + 1].startswith("-"):
                return list(argv[:i]), list(argv[i:])
            return None
        if not a.startswith("-"):
            return list(argv[:i]), list(argv[i:])
        if a.startswith("--") or a == "-":
            return None
        letters = a[1:]
        for j, letter in enumerate(letters):
            if letter in VALUED:
                if j == len(letters) - 1:
                    i += 1  # its value is the next argument
                break
            if letter not in FLAGS:
                return None
        i += 1
    return None


def _letters(flags: Sequence[str]) -> set[str]:
    out: set[str] = set()
    skip = False
    for a in flags[1:]:
        if skip:
            skip = False
            continue
        for j, letter in enumerate(a[1:]):
            if letter in VALUED:
                skip = j == len(a) - 2
                break
            out.add(letter)
    return out


def site_folders(letters: set[str], env: Mapping[str, str]) -> list[str] | None:
    """Where the host's interpreter, started with these flags and ``env``, reads code from
    before its main module runs (None: a start this module cannot vouch for)."""
    folders = [p for p in sys.path if p and os.path.isabs(p)]  # stdlib, site, .pth entries
    if "S" in letters:
        return folders
    if sys.flags.no_site:
        return None  # the host ran without site: its path does not show what site adds
    folders += site.getsitepackages()
    user_site = not ({"s", "I"} & letters) and "PYTHONNOUSERSITE" not in env
    if user_site and _venv_hides_user_site():
        user_site = False
    if user_site:
        home = env.get("HOME", "")
        if not home or not os.path.isabs(home):
            return None
        version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
        folders.append(os.path.join(home, ".local", "lib", version, "site-packages"))
    return folders


def _venv_hides_user_site() -> bool:
    """The host runs in a virtual environment without the system's site packages (``site``
    then turns the user site folder off)."""
    if sys.prefix == sys.base_prefix:
        return False
    try:
        with open(os.path.join(sys.prefix, "pyvenv.cfg"), encoding="utf-8") as f:
            for line in f:
                key, sep, value = line.partition("=")
                if sep and key.strip().lower() == "include-system-site-packages":
                    return value.strip().lower() != "true"
    except OSError:
        return False
    return True


def _overlaps(a: str, b: str) -> bool:
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def problem(
    argv: Sequence[str],
    cwd: str,
    env: Mapping[str, str],
    writable: Sequence[str] | None,
) -> str | None:
    """Why ``argv`` must go through the shim and its ``execvp`` (None: the ``--python`` form
    may run it).

    Args:
        argv: The sidecar's command (``argv[0]`` resolved).
        cwd: Its working directory.
        env: Its whole environment.
        writable: What the walls let the worker write (Landlock's write grants); None: no
            Landlock, the worker writes whatever this user may.
    """
    if not argv or not sys.platform.startswith("linux"):
        return "not a Python command"
    exe = os.path.abspath(os.path.join(cwd, argv[0]))
    host = os.path.abspath(sys.executable)
    if os.path.dirname(exe) != os.path.dirname(host) or (
        os.path.realpath(exe) != os.path.realpath(host)
    ):
        return "the command is not the host's python"
    parts = split(argv)
    if parts is None:
        return "not python [flags] -m MODULE or python [flags] SCRIPT"
    flags, tail = parts
    letters = _letters(flags)
    if tail[0] != "-m":
        script = os.path.join(cwd, tail[0])
        if not os.path.isfile(script) or zipfile.is_zipfile(script):
            return f"{tail[0]} is not a script file"
    if not ({"E", "I"} & letters):
        for key in env:
            if key.startswith("PYTHON") and key not in INERT_ENV:
                return f"{key} changes the interpreter's start"
    folders = site_folders(letters, env)
    if folders is None:
        return "the interpreter's start reads what this host cannot see"
    for folder in dict.fromkeys(os.path.realpath(f) for f in folders):
        if writable is None:
            if os.access(folder, os.W_OK) or not os.path.exists(folder):
                return f"{folder}: a worker could write it (no Landlock)"
            continue
        for grant in writable:
            if _overlaps(folder, os.path.realpath(grant)):
                return f"{folder}: the walls let a worker write {grant}"
    return None


def direct_argv(argv: Sequence[str], walls_fd: int) -> list[str]:
    """The ``--python`` form of ``argv`` (which :func:`problem` accepted): its interpreter and
    flags on the exec shim, which puts the walls up from ``walls_fd`` and runs the rest."""
    parts = split(argv)
    assert parts is not None
    flags, tail = parts
    return [*flags, SHIM, str(walls_fd), "--python", *tail]
