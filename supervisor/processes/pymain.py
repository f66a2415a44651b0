"""Run a Python worker's module or script as ``__main__`` in an interpreter that is already
running, as ``python -m mod`` or ``python script`` would have run it.

# Strategy: one implementation for the two places a worker's Python code starts without its own
# interpreter start: the zygote's forked child (``zygote_main``) and the exec shim's ``--python``
# form (``confine_exec``: the sidecar's own interpreter starts on the shim, which puts the walls
# up, then runs the worker here). :func:`enter` makes ``sys.argv``, ``sys.orig_argv``,
# ``sys.path`` and a fresh ``__main__`` what the interpreter makes them; :func:`run` runs the code
# there (``runpy`` for a module, ``compile`` + ``exec`` for a script, as the interpreter does).
# An exception that ends the worker is printed without the frames of whoever called :func:`run`
# (the caller's bootstrap), as the interpreter prints it, and ends it with status 1; ``SystemExit``
# and ``KeyboardInterrupt`` go up unchanged (their exit status and signal are the interpreter's).
# The standard library only, imported at run time, nothing at import: the shim loads this file
# in a bare interpreter (``os`` and ``sys`` are there already).
"""

import os
import sys


def enter(orig_argv: list[str], tail: list[str], fresh_path: list[str], safe_path: bool) -> None:
    """Make this interpreter's ``argv``, ``path`` and ``__main__`` those of ``orig_argv``.

    Args:
        orig_argv: The whole command line (``sys.orig_argv``): interpreter, flags, ``tail``.
        tail: ``["-m", module, *args]`` or ``[script, *args]``.
        fresh_path: ``sys.path`` of a fresh interpreter without its first entry.
        safe_path: ``-P``/``-I``/``PYTHONSAFEPATH``: no first entry (neither cwd nor the
            script's folder).
    """
    import builtins
    import types

    sys.orig_argv = list(orig_argv)
    if tail[0] == "-m":
        sys.argv = ["-m", *tail[2:]]
        first = [os.getcwd()]
    else:
        sys.argv = list(tail)
        first = [os.path.dirname(os.path.realpath(tail[0]))]
    sys.path[:] = [*([] if safe_path else first), *fresh_path]
    sys.path_importer_cache.clear()
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    main.__annotations__ = {}
    sys.modules["__main__"] = main


def run(module: str | None, script: str) -> None:
    """Run ``module`` (``-m``) or ``script`` as ``__main__`` (after :func:`enter`).

    An exception other than ``SystemExit`` and ``KeyboardInterrupt`` is printed by
    ``sys.excepthook`` from the worker's own frames on (``runpy``'s for a module), then the
    process exits with status 1, as the interpreter does with an uncaught one.
    """
    import runpy

    mine = {run.__code__}
    try:
        if module is not None:
            runpy._run_module_as_main(module, alter_argv=True)  # type: ignore[attr-defined]
        else:
            _run_script(script)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:
        mine.add(_run_script.__code__)
        tb = cut = exc.__traceback__
        while cut is not None:  # from the frame after the last of ours (callers' frames too)
            if cut.tb_frame.f_code in mine:
                tb = cut.tb_next
            cut = cut.tb_next
        exc.__traceback__ = tb
        sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
        sys.excepthook(type(exc), exc, tb)
        del exc, tb
        sys.exit(1)


def _run_script(script: str) -> None:
    """What the interpreter does for ``python script``: compile the file and run it in the real
    ``__main__`` module (``__file__`` absolute, as since Python 3.9)."""
    from importlib.machinery import SourceFileLoader

    path = os.path.abspath(script)
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    main = sys.modules["__main__"].__dict__
    main.update(
        __file__=path,
        __cached__=None,
        __loader__=SourceFileLoader("__main__", path),
        __package__=None,
        __spec__=None,
    )
    exec(code, main)
