"""The kernel client stays light: every CLI command imports it, and the in-memory link it knows
(``server/link.py``) must not pull the server's session, methods and the host in with it."""

from __future__ import annotations

import subprocess
import sys


def test_the_client_does_not_import_the_host() -> None:
    code = (
        "import sys, supervisor.client, supervisor.mcp_face.face\n"
        "heavy = sorted(m for m in sys.modules if m.startswith(('supervisor.host', "
        "'supervisor.server.session', 'supervisor.server.memory')))\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
