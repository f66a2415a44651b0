"""``toolhost ... | head``: a reader that leaves early is not an internal error (found trying the
README's tour: ``toolhost stats | head -5`` printed "internal error: BrokenPipeError")."""

from __future__ import annotations

import os
import subprocess

from tests.e2e.conftest import TOOLHOST


def test_a_reader_that_has_left_is_not_an_internal_error(app):
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first byte: every write gets EPIPE
    try:
        done = subprocess.run(
            [*TOOLHOST, "dev", "schemas"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            env={**os.environ, "XDG_CONFIG_HOME": str(app / ".xdg")},
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    err = done.stderr.decode()
    assert "internal error" not in err and "Traceback" not in err, err
    assert "BrokenPipeError" not in err, err
    assert done.returncode == 141, (done.returncode, err)
