"""The secret files a host reads at start and at every reload, never per use.

# Strategy: the operator token (``operator.token`` next to the socket: who may approve calls,
# calls/approvals.py) and the gateway's token (``host.ws.tokenFile``) are read once when the
# host starts and again at every ``registry.reload``; a token rewritten under the running host
# approves or admits nothing until then. A token that changed is logged and written to the audit
# log; one that cannot be read keeps the one read before in force and is reported. The audit log
# is opened here at start too: like the tokens, it is a private file (private_files.py) the host
# refuses to start on when it is a symlink or another user's.
"""

from __future__ import annotations

import logging

from supervisor.calls.approvals import Approvals
from supervisor.calls.audit import AuditLog
from supervisor.private_files import TokenFile

log = logging.getLogger("toolhost.host")


class TokenFiles:
    """The tokens of one host, by name (``operator``, ``gateway``).

    Args:
        approvals: Reads the operator token (where ``Approvals.configure`` says).
        audit: Where a changed token is recorded (None: no audit log).
    """

    def __init__(self, approvals: Approvals, audit: AuditLog | None) -> None:
        self.approvals = approvals
        self.audit = audit
        self.files: dict[str, TokenFile] = {}

    def add(self, name: str, token: TokenFile) -> None:
        """Read ``token`` again at every reload from now on (it was read once already)."""
        self.files[name] = token

    def open(self, approval_source: str) -> None:
        """At start: open the audit log and, with ``host.approvalSource: "operator"``, read the
        operator token (created when absent).

        Raises:
            OSError, ValueError: One is a symlink, another user's, or cannot be read or created.
        """
        if self.audit is not None:
            self.audit.open()
        if approval_source == "operator":
            self.approvals.load_token()
        if self.approvals.token is not None:
            self.files["operator"] = self.approvals.token

    def reload(self, approval_source: str) -> list[str]:
        """Read every token again (reload); a changed one is logged and audited. Returns the
        problems, one line each."""
        errors: list[str] = []
        approvals = self.approvals
        first = approval_source == "operator" and "operator" not in self.files
        if first:  # operator approval turned on by this reload: read it for the first time
            try:
                approvals.load_token()
            except (OSError, ValueError) as exc:
                errors.append(f"operator token: {exc}")
            if approvals.token is not None:
                self.files["operator"] = approvals.token
        for name, token in self.files.items():
            if first and name == "operator":
                continue
            try:
                changed = token.load()
            except (OSError, ValueError) as exc:
                errors.append(f"{name} token: {exc}; the one read before stays in force")
                continue
            if changed:
                log.warning("the %s token in %s changed; the new one is in force", name, token.path)
                if self.audit is not None:
                    self.audit.event("token-changed", token=name, path=token.path)
        return errors
