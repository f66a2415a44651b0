"""The few pieces of ``ctypes`` the walls use, made from ``_ctypes`` as ``ctypes`` makes them.

# Strategy: the walls (``walls``, ``landlock``, ``seccomp``, ``netns``, ``linux``) call a handful
# of libc functions (``prctl``, ``capset``, ``syscall``, ``setns``, ``unshare``) with integers,
# two structures and byte buffers. ``import ctypes`` costs the exec shim's bare interpreter
# ~3 ms on a quiet machine and 7-9 ms under load (it defines every C type, binds
# ``pythonapi`` and makes libffi closures); this module defines only the types used, over the
# same ``_ctypes`` classes ``ctypes`` itself subclasses (``_SimpleCData``, ``CFuncPtr``,
# ``Structure``, ``dlopen``), so a function, a structure or a buffer made here is exactly what
# ``ctypes`` would make: the same C calls, the same ``errno`` copy (``get_errno``). Names follow
# ``ctypes``'s. The standard library only; nothing but ``_ctypes`` at import.
"""

import _ctypes
from _ctypes import Structure, addressof, byref, get_errno, set_errno

__all__ = [
    "CDLL",
    "Structure",
    "addressof",
    "byref",
    "c_char",
    "c_int",
    "c_long",
    "c_uint32",
    "c_ulong",
    "c_ushort",
    "c_void_p",
    "create_string_buffer",
    "get_errno",
    "set_errno",
]


class c_int(_ctypes._SimpleCData):  # ctypes's names
    _type_ = "i"


class c_uint32(_ctypes._SimpleCData):
    _type_ = "I"


class c_long(_ctypes._SimpleCData):
    _type_ = "l"


class c_ulong(_ctypes._SimpleCData):
    _type_ = "L"


class c_ushort(_ctypes._SimpleCData):
    _type_ = "H"


class c_void_p(_ctypes._SimpleCData):
    _type_ = "P"


class c_char(_ctypes._SimpleCData):
    _type_ = "c"


class _Function(_ctypes.CFuncPtr):
    """A C function of a :class:`CDLL` (``ctypes.CDLL(..., use_errno=True)``'s kind)."""

    _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
    _restype_ = c_int


class CDLL:
    """A loaded library (None: this process's own symbols), as ``ctypes.CDLL(name,
    use_errno=True)``: its functions return ``int`` unless given a ``restype``.

    Raises:
        OSError: The library could not be loaded.
    """

    def __init__(self, name: str | None) -> None:
        self._handle = _ctypes.dlopen(name, 0)  # type: ignore[arg-type] # RTLD_LOCAL, as ctypes

    def __getattr__(self, name: str) -> _Function:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        func = _Function((name, self))  # type: ignore[arg-type] # what ctypes.CDLL passes
        setattr(self, name, func)
        return func


def create_string_buffer(init: bytes | int, size: int | None = None) -> _ctypes.Array:
    """A mutable ``char`` array, as ``ctypes.create_string_buffer``: ``init`` bytes (padded with
    NULs to ``size``, one NUL more without it) or ``init`` NUL bytes."""
    if isinstance(init, int):
        return (c_char * init)()
    n = len(init) + 1 if size is None else size
    buf = (c_char * n)()
    buf.raw = init[:n].ljust(n, b"\0")  # type: ignore[misc,assignment] # typeshed: ctypes.c_char
    return buf
