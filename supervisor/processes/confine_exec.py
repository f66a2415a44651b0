"""The exec shim: ``python -I -S confine_exec.py WALLS-FD -- PROGRAM ARGS...``.

Reads the walls (``Walls.dumps``) from the inherited descriptor, puts them up in this fresh,
single-threaded interpreter and execs the program in its place, so no sidecar instruction runs
before the walls stand, and nothing ran in the threaded host between fork and exec but the
existing pre-exec steps. It imports only the standard library and its sibling modules (no
``site``, no virtual environment): its cost is an interpreter start (``bench/confine.py``).
Exit status 126 with one line on stderr when a wall fails under ``required`` or the program
cannot be executed.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # pragma: no cover - run as a script by the spawn path
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

    from walls import Armed, Walls

    def _main(argv: list[str]) -> None:
        if len(argv) < 4 or argv[2] != "--":
            os.write(2, b"confine_exec: usage: confine_exec.py WALLS-FD -- PROGRAM [ARGS...]\n")
            os._exit(126)
        fd = int(argv[1])
        chunks = []
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(fd)
        try:
            Armed(Walls.loads(b"".join(chunks))).apply()
        except OSError as exc:
            os.write(2, f"toolhost: confinement failed: {exc}\n".encode())
            os._exit(126)
        program = argv[3:]
        try:
            os.execvp(program[0], program)  # a bare name is looked up on the child's PATH
        except OSError as exc:
            os.write(2, f"toolhost: cannot execute {program[0]}: {exc.strerror}\n".encode())
            os._exit(126)

    _main(sys.argv)
