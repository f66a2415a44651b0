"""Host services for process-json workers (PROTOCOL 3.5): ``tools.invoke``, ``state.*``, ``vault``.

# Strategy: a worker's ``request`` names one of its calls in flight; the worker checks that (an
# unknown or abandoned call is ``unknown-call``) and hands the request here with the call and a
# ``reply`` that writes the ``response`` line. Every method answers through ``reply`` exactly
# once, synchronously where it can (reads, refusals), later where it must: a child call answers
# from its own finish, a state write once the writer thread committed it. A worker that never
# asks pays nothing; one that floods is bounded per call (``too-many-requests``).
#
# - ``tools.invoke``: a child :class:`~supervisor.calls.call.Call` through the same gates as a
#   kernel's call (one :class:`~supervisor.calls.call.InvokeRequest` to ``Invoker.start``).
#   The parent's approval covers the child only when the child tool is in the parent tool's
#   manifest ``requires``. Depth 1 (``nesting-refused``). A child of the parent's own sidecar
#   runs when a slot is free now and is refused ``would-deadlock`` otherwise (waiting could
#   hold the parent's slot forever). Children end with their parent.
# - ``state.*``: names and key prefixes the sidecar entry or the tool's manifest declares;
#   ``session`` scope keys on the kernel's ``session`` (``session-required`` without one).
#   Compare-and-set through ``ifValue``/``ifAbsent`` on ``state.set`` (``conflict``).
# - ``vault.get``: keys the sidecar entry declares; every value handed out is added to the
#   host's redactor, and from then on masked from every envelope (``on_secret`` turns the call
#   path's masking on), stderr tail and log line the host writes.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec
import trio

from supervisor.calls.call import Call, InvokeRequest
from supervisor.calls.invoke import Invoker
from supervisor.contracts import wire
from supervisor.contracts.manifest import ToolManifest
from supervisor.contracts.registry import SidecarConfig, StateDecl
from supervisor.host.state_store import ABSENT, ANY, StateError, StateStore, Write
from supervisor.host.vault import Vault, VaultError, vault_path
from supervisor.policy.redact import Redactor

log = logging.getLogger("toolhost.services")

MAX_OUTSTANDING = 32
"""Requests one call may have unanswered at once."""
STATE_MAX_BYTES = 1 << 20
STATE_FILE = ".toolhost/state.db"

Reply = Callable[[wire.Response], None]


class InvokeReq(msgspec.Struct, forbid_unknown_fields=True):
    tool: str
    input: msgspec.Raw = msgspec.field(default_factory=lambda: wire.EMPTY_OBJECT)
    timeoutMs: int | None = None


NOTHING = msgspec.Raw(b"")
"""An absent Raw field (msgspec.Raw cannot be Optional)."""


class StateReq(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    key: str | None = None
    value: msgspec.Raw = NOTHING
    prefix: str = ""
    ifValue: msgspec.Raw = NOTHING
    """Compare-and-set: write only while the stored value equals this."""
    ifAbsent: bool = False
    """Write only while the key holds no value."""


class VaultReq(msgspec.Struct, forbid_unknown_fields=True):
    key: str


class ServiceFailure(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _error(rid: Any, code: str, message: str) -> wire.Response:
    return wire.Response(id=rid, error=wire.ServiceError(code=code, message=message))


def _ok(rid: Any, result: Any) -> wire.Response:
    return wire.Response(id=rid, result=msgspec.Raw(msgspec.json.encode(result)))


class HostServices:
    """The host side of worker requests.

    Args:
        invoker: Runs child calls.
        app_root: Where ``.toolhost/state.db`` and ``.toolhost/vault.json`` live.
        redactor: The host's redactor: every vault value handed out is added to it.
        on_secret: Called after a vault value was handed out (the call path masks envelopes
            from then on).
        sidecar_config: The running configuration of a sidecar (its declarations).
        manifest: A tool's manifest (``requires``, ``state``), if any.
        count_request: Accounting of one request of a sidecar's worker.
    """

    def __init__(
        self,
        invoker: Invoker,
        app_root: str,
        *,
        redactor: Redactor,
        on_secret: Callable[[], None] = lambda: None,
        sidecar_config: Callable[[str], SidecarConfig | None],
        manifest: Callable[[str], ToolManifest | None],
        count_request: Callable[[str], None] = lambda sidecar: None,
        state_max_bytes: int = STATE_MAX_BYTES,
    ) -> None:
        self.invoker = invoker
        self.app_root = app_root
        self.sidecar_config = sidecar_config
        self.manifest = manifest
        self.count_request = count_request
        self.state_max_bytes = state_max_bytes
        self.redactor = redactor
        self.on_secret = on_secret
        self.vault = Vault(vault_path(app_root))
        self._store: StateStore | None = None
        self._writes: deque[tuple[Write, Call, Reply, Any]] = deque()
        self._wake = trio.Event()
        self._limiter = trio.CapacityLimiter(1)

    # the writer ---------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Commit queued state writes, a batch per transaction, until cancelled."""
        task_status.started()
        try:
            while True:
                if not self._writes:
                    self._wake = trio.Event()
                    await self._wake.wait()
                batch = list(self._writes)
                self._writes.clear()
                store = self._store
                assert store is not None
                try:
                    verdicts = await trio.to_thread.run_sync(
                        store.apply, [w for w, _, _, _ in batch], limiter=self._limiter
                    )
                except Exception as exc:  # sqlite3.Error, OSError: answer, keep serving
                    log.error("state: write failed: %s", exc)
                    for _, call, reply, rid in batch:
                        self._answer(call, reply, _error(rid, "state-failed", str(exc)))
                    continue
                for (_, call, reply, rid), verdict in zip(batch, verdicts):
                    if verdict is None:
                        self._answer(call, reply, _ok(rid, {}))
                    else:
                        self._answer(
                            call, reply, _error(rid, verdict, "the value changed meanwhile")
                        )
        finally:
            if self._store is not None:
                self._store.close()
                self._store = None

    # requests -------------------------------------------------------------------------------

    def handle(self, call: Call, req: wire.Request, reply: Reply) -> None:
        """Answer ``req``, made by ``call``'s worker while ``call`` is in flight."""
        rid = req.id
        call.requests += 1
        self.count_request(call.sidecar)
        if call.outstanding >= MAX_OUTSTANDING:
            reply(
                _error(
                    rid,
                    "too-many-requests",
                    f"call {call.tool}#{call.id} already has {MAX_OUTSTANDING} requests unanswered",
                )
            )
            return
        call.outstanding += 1
        method = req.method
        try:
            if method == "tools.invoke":
                self._invoke(call, req, reply)
            elif method in ("state.get", "state.set", "state.delete", "state.list"):
                self._state(call, method, req, reply)
            elif method == "vault.get":
                self._vault(call, req, reply)
            else:
                raise ServiceFailure("unknown-method", f"unknown host service {method!r}")
        except ServiceFailure as exc:
            self._answer(call, reply, _error(rid, exc.code, exc.message))
        except msgspec.ValidationError as exc:
            self._answer(call, reply, _error(rid, "invalid-request", f"{method} params: {exc}"))
        except msgspec.DecodeError as exc:
            self._answer(call, reply, _error(rid, "invalid-request", f"{method} params: {exc}"))

    def _answer(self, call: Call, reply: Reply, response: wire.Response) -> None:
        call.outstanding -= 1
        reply(response)

    # tools.invoke ---------------------------------------------------------------------------

    def _invoke(self, parent: Call, req: wire.Request, reply: Reply) -> None:
        p = msgspec.json.decode(req.params, type=InvokeReq)
        if parent.parent is not None:
            raise ServiceFailure(
                "nesting-refused",
                f"{parent.tool} is itself a child call: tools.invoke goes one level deep",
            )
        if p.timeoutMs is not None and p.timeoutMs < 1:
            raise ServiceFailure("invalid-request", "tools.invoke params.timeoutMs: expected >= 1")
        inv = self.invoker
        desc = inv.catalog.get(p.tool)
        if desc is not None and desc.sidecar == parent.sidecar and parent.dispatch.pick() is None:
            raise ServiceFailure(
                "would-deadlock",
                f"{p.tool} is served by {parent.sidecar}, whose workers are all busy (one with "
                f"{parent.tool} itself, which waits for it): give the sidecar more workers "
                "(pool.min/max) or more concurrency, or call a tool of another sidecar",
            )
        manifest = parent.manifest
        approval = parent.approval if manifest is not None and p.tool in manifest.requires else None
        rid = req.id

        def done(env: Any) -> None:
            self._answer(parent, reply, _ok(rid, env))

        child = InvokeRequest(
            p.tool,
            p.input,
            timeout_ms=p.timeoutMs,
            approval=approval,
            client=parent.client,
            session=parent.session,
            parent=parent,
        )
        inv.start(child, done)

    # state ----------------------------------------------------------------------------------

    def _declared(self, call: Call, name: str) -> StateDecl:
        decls: list[StateDecl] = []
        cfg = self.sidecar_config(call.sidecar)
        if cfg is not None:
            decls.extend(cfg.state)
        manifest = call.manifest or self.manifest(call.tool)
        if manifest is not None:
            decls.extend(manifest.state)
        for d in decls:
            if d.name == name:
                return d
        raise ServiceFailure(
            "state-refused",
            f"{call.sidecar} declares no state named {name!r} (declare it under "
            f"sidecars.{call.sidecar}.state or the tool's manifest)",
        )

    def _namespace(self, call: Call, decl: StateDecl) -> str:
        if decl.scope == "session":
            if not call.session:
                raise ServiceFailure(
                    "session-required",
                    f"state {decl.name!r} is session-scoped and this call has no session "
                    "(the kernel passes `session` in tools.invoke)",
                )
            return f"{decl.name}\x1fsession:{call.session}"
        return f"{decl.name}\x1fshared:{decl.scope_id or ''}"

    def store(self) -> StateStore:
        if self._store is None:
            try:
                self._store = StateStore(os.path.join(self.app_root, STATE_FILE))
            except StateError as exc:
                raise ServiceFailure("state-failed", str(exc)) from exc
        return self._store

    def _state(self, call: Call, method: str, req: wire.Request, reply: Reply) -> None:
        p = msgspec.json.decode(req.params, type=StateReq)
        decl = self._declared(call, p.name)
        ns = self._namespace(call, decl)
        rid = req.id
        if method == "state.list":
            prefix = p.prefix or decl.key_prefix
            if not prefix.startswith(decl.key_prefix):
                raise ServiceFailure(
                    "state-refused", f"prefix {prefix!r} is outside {decl.key_prefix!r}"
                )
            self._answer(call, reply, _ok(rid, {"keys": self.store().keys(ns, prefix)}))
            return
        key = p.key
        if key is None:
            raise ServiceFailure("invalid-request", f"{method} needs params.key")
        if not key.startswith(decl.key_prefix):
            raise ServiceFailure(
                "state-refused",
                f"key {key!r} is outside the declared prefix {decl.key_prefix!r} of {p.name!r}",
            )
        store = self.store()
        if method == "state.get":
            value = store.get(ns, key)
            result = msgspec.Raw(b'{"value":' + (value if value is not None else b"null") + b"}")
            self._answer(call, reply, wire.Response(id=rid, result=result))
            return
        expect: Any = ANY
        if p.ifAbsent:
            expect = ABSENT
        elif p.ifValue is not NOTHING and bytes(p.ifValue):
            expect = msgspec.json.decode(p.ifValue)
        if method == "state.set":
            if not bytes(p.value):
                raise ServiceFailure("invalid-request", "state.set needs params.value")
            value = bytes(p.value)
            if len(value) > self.state_max_bytes:
                raise ServiceFailure(
                    "too-large",
                    f"the value is {len(value)} bytes; at most {self.state_max_bytes} are kept",
                )
            write = Write(ns, key, value, expect)
        else:
            write = Write(ns, key, None, expect)
        self._writes.append((write, call, reply, rid))
        self._wake.set()

    # vault ----------------------------------------------------------------------------------

    def _vault(self, call: Call, req: wire.Request, reply: Reply) -> None:
        p = msgspec.json.decode(req.params, type=VaultReq)
        cfg = self.sidecar_config(call.sidecar)
        decl = next((d for d in cfg.vault if d.key == p.key), None) if cfg is not None else None
        if decl is None:
            raise ServiceFailure(
                "vault-refused",
                f"{call.sidecar} declares no vault key {p.key!r} (sidecars.{call.sidecar}.vault)",
            )
        try:
            value = self.vault.get(p.key, list(decl.scopes))
        except VaultError as exc:
            raise ServiceFailure(exc.code, exc.message) from exc
        if value is None:
            raise ServiceFailure(
                "not-found", f"the vault has no {p.key!r}: `toolhost vault set {p.key}`"
            )
        self.redactor.add(value)
        self.on_secret()
        self._answer(call, reply, _ok(req.id, {"value": value}))
