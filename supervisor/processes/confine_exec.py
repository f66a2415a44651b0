"""The exec shim: ``python -I -S confine_exec.py WALLS-FD -- PROGRAM ARGS...``, or, for a
Python worker run by the host's own interpreter, ``PYTHON [FLAGS] confine_exec.py WALLS-FD
--python -m MODULE ARGS...`` (or ``--python SCRIPT ARGS...``).

Reads the walls (``Walls.dumps``) from the inherited descriptor, puts them up in this fresh,
single-threaded interpreter (the pids group first: the host moves this process into it while
the interpreter starts, and the walls wait for its word and check ``/proc/self/cgroup``),
closes what is left of the descriptors they named, then either
execs the program in its place (``--``), or (``--python``) runs the worker's module or script
in this very interpreter as ``python [FLAGS] -m MODULE`` / ``python [FLAGS] SCRIPT`` would
(``processes.pymain``, the zygote's code): one interpreter start instead of two. So no sidecar
instruction runs before the walls stand, and nothing ran in the threaded host between fork and
exec but the existing pre-exec steps. It imports only the standard library and its sibling
modules, loaded from this folder and dropped from ``sys.modules`` and ``sys.path`` again before
a worker runs (its own ``linux`` or ``walls`` must not be shadowed); the ``--python`` form is
chosen by the host only where the interpreter's own start (``site``, ``.pth`` files) reads
nothing the walls let a worker write (``processes.confine.direct_argv``, docs/confinement.md).
Exit status 126 with one line on stderr when a wall fails under ``required`` or the program
cannot be executed.
"""

import os
import sys

SIBLINGS = ("walls", "landlock", "seccomp", "linux", "netns", "cabi", "pymain")
"""The modules this script loads from its folder (top-level names, dropped again)."""

if __name__ == "__main__":  # pragma: no cover - run as a script by the spawn path
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, _here)

    from walls import Armed, ConfinementError, Walls

    def _walls(fd: int) -> None:
        chunks = []
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(fd)
        try:
            w = Walls.loads(b"".join(chunks))
            named = [w.ruleset_fd, *w.netns_fds, w.channel]
            Armed(w).apply()
        except (OSError, ValueError, TypeError, EOFError) as exc:
            why = exc.strerror if isinstance(exc, ConfinementError) else exc  # "step: why"
            os.write(2, f"toolhost: confinement failed: {why}\n".encode())
            os._exit(126)
        for left in named:  # what the walls did not consume (a ruleset never entered)
            if left >= 0:
                try:
                    os.close(left)
                except OSError:
                    pass

    def _run_here(tail: list[str]) -> None:
        import pymain

        for name in SIBLINGS:
            sys.modules.pop(name, None)
        sys.path_importer_cache.pop(_here, None)
        del sys.path[0]  # ours
        safe = bool(getattr(sys.flags, "safe_path", 0) or sys.flags.isolated)
        if not safe:
            del sys.path[0]  # the interpreter's, for this script's folder
        orig = sys.orig_argv[: len(sys.orig_argv) - len(sys.argv)] + tail
        pymain.enter(orig, tail, sys.path[:], safe)
        pymain.run(tail[1] if tail[0] == "-m" else None, tail[0])

    def _main(argv: list[str]) -> None:
        if len(argv) < 4 or argv[2] not in ("--", "--python"):
            os.write(2, b"confine_exec: usage: confine_exec.py WALLS-FD -- PROGRAM [ARGS...]\n")
            os._exit(126)
        _walls(int(argv[1]))
        program = argv[3:]
        if argv[2] == "--python":
            _run_here(program)
            return
        try:
            os.execvp(program[0], program)  # a bare name is looked up on the child's PATH
        except OSError as exc:
            os.write(2, f"toolhost: cannot execute {program[0]}: {exc.strerror}\n".encode())
            os._exit(126)

    _main(sys.argv)
