"""Operator approval: ``approval-required`` calls that wait for ``toolhost approve CALL_ID``.

# Strategy: with ``host.approvalSource: "operator"`` the kernel's ``approval`` param is not
# honoured. At the gate, before quota admission and the pool, the invoker hands such a call to
# :meth:`Approvals.hold` instead of starting it: no task waits; the call is an entry with a
# deadline timer (its own timeout) on the invoker's timer heap. ``approvals.decide`` (the operator,
# with the operator token) resumes it, which starts the call for real with the operator's
# approval, or refuses it; the deadline, ``tools.cancel`` and a client that leaves end it with one
# envelope. Pending calls are listed (``approvals.list``, ``toolhost status``) with an id, the tool
# and a preview of the input. The token is a random secret in ``operator.token`` next to the
# socket (0600): a kernel is given the socket, not that file. The host reads it once, at start
# and at ``registry.reload`` (private_files.py): a file rewritten under the host (by a tool)
# approves nothing. With the default ``"kernel"`` source nothing here runs. See
# docs/security.md.
"""

from __future__ import annotations

import hmac
import itertools
import logging
import os
import secrets
from collections.abc import Callable
from typing import Any

import msgspec

from supervisor.calls.call import InvokeRequest
from supervisor.calls.timers import Timer, Timers
from supervisor.contracts.envelope import Envelope
from supervisor.contracts.rpc import Approval
from supervisor.policy import results
from supervisor.private_files import TokenFile

log = logging.getLogger("toolhost.approvals")

TOKEN_NAME = "operator.token"
OPERATOR_PENDING = Approval(granted=True, by="operator (pending)")
"""What the gate is shown for a call an operator will decide (it is never recorded)."""
PREVIEW_BYTES = 512


class PendingApproval(msgspec.Struct, kw_only=True):
    """One call waiting for an operator (``approvals.list``)."""

    callId: str
    tool: str
    sidecar: str | None
    input: str
    """The call's input JSON, cut at 512 bytes (what the operator is asked to approve)."""
    inputBytes: int
    waitingMs: int
    deadlineInMs: int


class _Held:
    __slots__ = ("info", "key", "refuse", "resume", "started", "timer")

    def __init__(
        self,
        info: PendingApproval,
        key: Any,
        resume: Callable[[Approval], None],
        refuse: Callable[[Envelope], None],
        started: float,
    ) -> None:
        self.info = info
        self.key = key
        self.resume = resume
        self.refuse = refuse
        self.started = started
        self.timer: Timer | None = None


def token_path(socket_path: str) -> str:
    """Where the operator token lives: next to the socket."""
    return os.path.join(os.path.dirname(socket_path) or ".", TOKEN_NAME)


class Approvals:
    """Calls waiting for an operator, and the decisions that release them.

    Args:
        timers: The invoker's timer heap (deadlines of waiting calls).
        clock: Seconds, the timers' clock.
    """

    def __init__(self, timers: Timers, clock: Callable[[], float]) -> None:
        self.timers = timers
        self.clock = clock
        self.source = "kernel"
        """``host.approvalSource`` (:meth:`configure`)."""
        self.token_file = ""
        """Where the operator token is: next to the socket (:meth:`configure`)."""
        self.token: TokenFile | None = None
        """The operator token as read at start or at the last reload (:meth:`load_token`)."""
        self._held: dict[str, _Held] = {}
        self._by_key: dict[Any, str] = {}
        self._ids = itertools.count(1)
        self._prefix = secrets.token_hex(3)

    def configure(self, source: str, socket_path: str) -> None:
        """Apply ``host.approvalSource`` and the socket the token lives next to (the host calls
        this at start and at every reload, before it reads the token)."""
        self.source = source
        self.token_file = token_path(socket_path)

    def operator_decides(self, policy: str) -> bool:
        """Whether a call under ``policy`` must wait for an operator."""
        return policy == "approval-required" and self.source == "operator"

    def pending(self) -> list[PendingApproval]:
        """Every call waiting now, oldest first."""
        now = self.clock()
        return [
            msgspec.structs.replace(
                h.info,
                waitingMs=int((now - h.started) * 1000),
                deadlineInMs=max(0, int(h.info.deadlineInMs - (now - h.started) * 1000)),
            )
            for h in self._held.values()
        ]

    def load_token(self) -> bool:
        """Read the operator token (created when absent): at start and at reload, never at a
        decision. True when it differs from the one read before.

        Raises:
            OSError, ValueError: It cannot be read (a symlink, another user's, empty); the token
                read before, if any, stays in force.
        """
        path = self.token_file
        if self.token is not None and self.token.path == path:
            return self.token.load()
        fresh = TokenFile(path)
        fresh.load()
        before, self.token = self.token, fresh
        return before is not None and before.value != fresh.value

    def check_token(self, token: str) -> bool:
        """Whether ``token`` is the operator token read at start or reload (constant-time)."""
        expected = self.token.value if self.token is not None else ""
        if not expected or not token:
            return False
        return hmac.compare_digest(token.encode(), expected.encode())

    def hold(
        self,
        request: InvokeRequest,
        *,
        sidecar: str | None,
        timeout_ms: int,
        resume: Callable[[Approval], None],
        refuse: Callable[[Envelope], None],
    ) -> str:
        """Park the call ``request`` asks for until an operator decides or ``timeout_ms``
        passes; returns its id.

        ``resume`` gets the operator's approval (start the call then); ``refuse`` gets the
        envelope of a denial, a deadline or a cancel. Exactly one of them is called, once.
        """
        if self.token is None:
            log.error("no operator token was read (see the start-up error): nobody can approve")
        call_id = f"{self._prefix}-{next(self._ids)}"
        tool, key = request.tool, request.key
        data = bytes(request.input)
        info = PendingApproval(
            callId=call_id,
            tool=tool,
            sidecar=sidecar,
            input=data[:PREVIEW_BYTES].decode("utf-8", "replace")
            + ("..." if len(data) > PREVIEW_BYTES else ""),
            inputBytes=len(data),
            waitingMs=0,
            deadlineInMs=timeout_ms,
        )
        held = _Held(info, key, resume, refuse, self.clock())
        self._held[call_id] = held
        if key is not None:
            self._by_key[key] = call_id
        held.timer = self.timers.at(
            held.started + timeout_ms / 1000.0, lambda: self._expire(call_id)
        )
        log.warning(
            "call %s of %s waits for an operator: `toolhost approve %s`", call_id, tool, call_id
        )
        return call_id

    def decide(self, call_id: str, *, granted: bool, by: str) -> bool:
        """Grant or deny a waiting call; False when no call waits under ``call_id``."""
        held = self._take(call_id)
        if held is None:
            return False
        info = held.info
        log.warning(
            "call %s of %s %s by %s", call_id, info.tool, "granted" if granted else "denied", by
        )
        if granted:
            held.resume(Approval(granted=True, by=f"operator:{by}"))
        else:
            held.refuse(
                results.unavailable(
                    info.tool,
                    "approval-required",
                    f"{info.tool}: the operator ({by}) denied call {call_id}",
                    details={"callId": call_id, "approvalSource": "operator", "deniedBy": by},
                    sidecar=info.sidecar,
                )
            )
        return True

    def cancel(self, key: Any, message: str = "") -> bool:
        """``tools.cancel`` (or a client that left) of a call still waiting; False if none."""
        call_id = self._by_key.get(key)
        held = self._take(call_id) if call_id is not None else None
        if held is None:
            return False
        info = held.info
        held.refuse(
            results.failed(
                info.tool,
                "cancelled",
                message or f"{info.tool} was cancelled while it waited for approval",
                sidecar=info.sidecar,
                duration_ms=round((self.clock() - held.started) * 1000.0, 3),
            )
        )
        return True

    def _expire(self, call_id: str) -> None:
        held = self._take(call_id)
        if held is None:
            return
        info = held.info
        held.refuse(
            results.unavailable(
                info.tool,
                "approval-required",
                f"{info.tool} requires an operator's approval and none came within "
                f"{info.deadlineInMs} ms (call {call_id}; `toolhost approve {call_id}`)",
                details={"callId": call_id, "approvalSource": "operator"},
                sidecar=info.sidecar,
            )
        )

    def _take(self, call_id: str) -> _Held | None:
        held = self._held.pop(call_id, None)
        if held is None:
            return None
        if held.key is not None:
            self._by_key.pop(held.key, None)
        self.timers.cancel(held.timer)
        return held
