"""The process-json oneshot worker (PROTOCOL 3.2): one process per call, one line each way.

# Strategy: a :class:`~supervisor.workers.per_call.PerCallWorker` whose calls write one request
# line (the tool, its input and the sidecar's config and directories, as
# :func:`~supervisor.protocols.oneshot.request_line` words it) to the process's stdin and read
# the first line of its stdout as the answer (:func:`~supervisor.protocols.oneshot.parse_answer`).
"""

from __future__ import annotations

import msgspec

from supervisor.protocols import oneshot
from supervisor.workers.per_call import Invocation, PerCallWorker


class OneshotWorker(PerCallWorker):
    """process-json ``mode: oneshot``: one request line in, the first stdout line out."""

    def _invocation(self, tool: str, input_raw: msgspec.Raw) -> Invocation:
        init = self.spec.init
        line = oneshot.request_line(
            tool,
            input_raw,
            config=init.config if init else {},
            cwd=init.cwd if init else self.spec.cwd,
            project_dir=init.projectDir if init else self.spec.cwd,
            config_dir=init.configDir if init else self.spec.cwd,
            host_private=init.hostPrivate if init else None,
        )
        return Invocation(self.spec.argv, line, True, oneshot.parse_answer)
