"""``processes/cabi.py``: the walls' few ``ctypes`` pieces, made from ``_ctypes``, behave as
``ctypes``'s own (same calls into this process's libc, same ``errno`` copy, same buffers) and
the exec shim's bare interpreter loads the walls without ``ctypes``."""

from __future__ import annotations

import ctypes
import errno
import os
import subprocess
import sys

import pytest

from supervisor.processes import cabi
from supervisor.processes.confine import SHIM

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") and os.environ.get("CI") != "true", reason="Linux only"
)


def test_a_libc_call_its_result_and_errno_match_ctypes() -> None:
    mine, theirs = cabi.CDLL(None), ctypes.CDLL(None, use_errno=True)
    assert mine.getpid() == theirs.getpid() == os.getpid()
    for lib, get in ((mine, cabi.get_errno), (theirs, ctypes.get_errno)):
        prctl = lib.prctl
        prctl.argtypes = [cabi.c_int, cabi.c_ulong, cabi.c_ulong, cabi.c_ulong, cabi.c_ulong]
        assert prctl(-1, 0, 0, 0, 0) == -1  # no such option
        assert get() == errno.EINVAL
    with pytest.raises(AttributeError):
        _ = mine.no_such_function_here
    getpid = {"x86_64": 39, "aarch64": 172}.get(os.uname().machine)
    if getpid is not None:  # syscall(SYS_getpid): a long result, as Landlock's calls take it
        syscall = mine.syscall
        syscall.restype = cabi.c_long
        assert syscall(cabi.c_long(getpid)) == os.getpid()


def test_buffers_and_structures_are_ctypes_ones() -> None:
    for init, size in ((b"ab\0c", 4), (b"ab", 6), (3, None)):
        mine = cabi.create_string_buffer(init, size)
        theirs = ctypes.create_string_buffer(init, size)
        assert mine.raw == theirs.raw and ctypes.sizeof(mine) == ctypes.sizeof(theirs)

    class Pair(cabi.Structure):
        _fields_ = [("len", cabi.c_ushort), ("ptr", cabi.c_void_p)]

    buf = cabi.create_string_buffer(b"xyz", 3)
    pair = Pair(3, cabi.addressof(buf))
    assert ctypes.sizeof(pair) == 16 and ctypes.string_at(pair.ptr, pair.len) == b"xyz"


def test_the_shims_interpreter_loads_the_walls_without_ctypes() -> None:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import walls, netns;"
        " print(sorted(m for m in sys.modules if m.startswith('ctypes')))"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, os.path.dirname(SHIM)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == "[]"
