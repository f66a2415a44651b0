"""Operator approval: ``approval-required`` calls that wait for ``toolhost approve CALL_ID``.

# Strategy: with ``host.approvalSource: "operator"`` the kernel's ``approval`` param is not
# honoured. The invoker's gate lets such a call through to the awaiting gear (never the direct
# one), and before the call is admitted to quotas and the pool it waits here, bounded by its own
# deadline, for an operator's decision. Pending calls are listed (``approvals.list``, shown by
# ``toolhost status``) with an id, the tool and a preview of the input; ``approvals.decide`` grants
# or denies one. A decision must carry the operator token, a random secret kept next to the
# socket in ``operator.token`` (0600): a kernel is given the socket, not that file. With the
# default ``"kernel"`` source nothing here runs. See docs/security.md.
"""

from __future__ import annotations

import hmac
import itertools
import logging
import os
import secrets
import stat
import time
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from supervisor.contracts.envelope import Envelope
from supervisor.contracts.rpc import Approval
from supervisor.policy import results

if TYPE_CHECKING:
    from supervisor.runtime.invoke import Invoker, Prepared

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


class Decision(msgspec.Struct, kw_only=True):
    granted: bool
    by: str


class _Waiter:
    __slots__ = ("deadline", "decision", "event", "info", "started")

    def __init__(self, info: PendingApproval, deadline: float) -> None:
        self.info = info
        self.deadline = deadline
        self.started = trio.current_time()
        self.event = trio.Event()
        self.decision: Decision | None = None


def token_path(socket_path: str) -> str:
    """Where the operator token lives: next to the socket."""
    return os.path.join(os.path.dirname(socket_path) or ".", TOKEN_NAME)


def read_or_create_token(path: str) -> str:
    """The operator token, generated into a new 0600 file when absent.

    Raises:
        OSError: The file cannot be read or created.
    """
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, mode=0o700, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        st = os.stat(path)
        if stat.S_IMODE(st.st_mode) & 0o077:
            log.warning("%s was readable by others; tightening it to 0600", path)
            os.chmod(path, 0o600)
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(token + "\n")
    return token


class Approvals:
    """Calls waiting for an operator, and the decisions that release them.

    Args:
        token_file: The operator token's path (created on first use).
    """

    def __init__(self, token_file: str = "") -> None:
        self.token_file = token_file
        self._pending: dict[str, _Waiter] = {}
        self._ids = itertools.count(1)
        self._prefix = secrets.token_hex(3)

    def pending(self) -> list[PendingApproval]:
        """Every call waiting now, oldest first."""
        now = trio.current_time()
        out = []
        for w in self._pending.values():
            info = msgspec.structs.replace(
                w.info,
                waitingMs=int((now - w.started) * 1000),
                deadlineInMs=max(0, int((w.deadline - now) * 1000)),
            )
            out.append(info)
        return out

    def check_token(self, token: str) -> bool:
        """Whether ``token`` is the operator token (constant-time)."""
        if not self.token_file or not token:
            return False
        try:
            expected = read_or_create_token(self.token_file)
        except OSError:
            return False
        return hmac.compare_digest(token.encode(), expected.encode())

    def decide(self, call_id: str, *, granted: bool, by: str) -> bool:
        """Grant or deny a waiting call; False when no call waits under ``call_id``."""
        waiter = self._pending.get(call_id)
        if waiter is None or waiter.event.is_set():
            return False
        waiter.decision = Decision(granted=granted, by=by)
        waiter.event.set()
        log.warning(
            "approval %s for %s (%s) %s by %s",
            call_id,
            waiter.info.tool,
            waiter.info.callId,
            "granted" if granted else "denied",
            by,
        )
        return True

    async def wait(self, prep: Prepared, input_raw: msgspec.Raw) -> Envelope | Approval:
        """Wait (until the call's deadline) for an operator; the approval, or the refusal."""
        if self.token_file:
            try:
                read_or_create_token(self.token_file)  # so `toolhost approve` can find it
            except OSError as exc:
                log.error("operator token %s: %s", self.token_file, exc)
        call_id = f"{self._prefix}-{next(self._ids)}"
        data = bytes(input_raw)
        preview = data[:PREVIEW_BYTES].decode("utf-8", "replace")
        deadline = trio.current_time() + prep.timeout / 1000.0
        info = PendingApproval(
            callId=call_id,
            tool=prep.tool,
            sidecar=prep.desc.sidecar,
            input=preview + ("..." if len(data) > PREVIEW_BYTES else ""),
            inputBytes=len(data),
            waitingMs=0,
            deadlineInMs=prep.timeout,
        )
        waiter = self._pending[call_id] = _Waiter(info, deadline)
        log.warning(
            "call %s of %s waits for an operator: `toolhost approve %s`",
            call_id,
            prep.tool,
            call_id,
        )
        try:
            with trio.move_on_at(deadline):
                await waiter.event.wait()
        finally:
            del self._pending[call_id]
        decision = waiter.decision
        if decision is None:
            return results.unavailable(
                prep.tool,
                "approval-required",
                f"{prep.tool} requires an operator's approval and none came within "
                f"{prep.timeout} ms (call {call_id}; `toolhost approve {call_id}`)",
                details={"callId": call_id, "approvalSource": "operator"},
                sidecar=prep.desc.sidecar,
            )
        if not decision.granted:
            return results.unavailable(
                prep.tool,
                "approval-required",
                f"{prep.tool}: the operator ({decision.by}) denied call {call_id}",
                details={"callId": call_id, "approvalSource": "operator", "deniedBy": decision.by},
                sidecar=prep.desc.sidecar,
            )
        return Approval(granted=True, by=f"operator:{decision.by}")


async def await_operator(
    invoker: Invoker, prep: Prepared, input_raw: msgspec.Raw, call_key: Any
) -> Envelope | Approval:
    """The invoker's hook: wait for an operator, reachable by ``tools.cancel`` meanwhile."""
    from supervisor.runtime.invoke import CallHandle

    host = invoker.host
    invoker.approvals.token_file = token_path(
        host.endpoints.get("unix") or host.registry.path(host.registry.host.socket)
    )
    handle = CallHandle()
    if call_key is not None:
        invoker.calls[call_key] = handle
    t0 = time.monotonic()
    try:
        with handle.waiting():
            got = await invoker.approvals.wait(prep, input_raw)
    finally:
        if call_key is not None and invoker.calls.get(call_key) is handle:
            del invoker.calls[call_key]
    if handle.cancelled:
        return results.failed(
            prep.tool,
            "cancelled",
            f"{prep.tool} was cancelled while it waited for approval",
            sidecar=prep.desc.sidecar,
            duration_ms=round((time.monotonic() - t0) * 1000.0, 3),
        )
    return got
