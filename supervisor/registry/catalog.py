"""The catalog: static plan + runtime facts -> descriptors, with a revision that moves on change.

# Strategy: pure state (no trio). The host feeds it the plan at (re)load and a
# :class:`SidecarFacts` whenever a pool learns something; every update recomputes the affected
# descriptors, compares them with the previous ones, and bumps ``revision`` only when one really
# changed. The changed descriptors are returned, and the names that left are kept for
# :meth:`CatalogState.take_removed`, so the server can publish ``catalog.changed``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec
from msgspec import UNSET

from supervisor.contracts.facts import NOT_STARTED, SidecarFacts, ToolProbe, ToolRuntime
from supervisor.contracts.rpc import MSGPACK_REFUSES
from supervisor.contracts.snapshot import (
    Annotations,
    Descriptor,
    ProbeState,
    Reason,
    RuntimeState,
    Stability,
    StabilityDetails,
    UpgradeField,
)
from supervisor.policy.availability import Facts, assess
from supervisor.registry.load import is_builtin
from supervisor.registry.plan import Plan, ToolPlan, sandbox_for

STATIC_FIELDS = ("discovery", "manifest", "path", "version", "upgrade")
__all__ = ["NOT_STARTED", "CatalogState", "SidecarFacts", "ToolProbe", "ToolRuntime"]


class CatalogState:
    """Descriptors for every tool the host knows of."""

    def __init__(self, *, allow_degraded: bool = False) -> None:
        self.revision = 0
        self.allow_degraded = allow_degraded
        self._plan = Plan()
        self._facts: dict[str, SidecarFacts] = {}
        self._quota: dict[str, int] = {}
        self._descriptors: dict[str, Descriptor] = {}
        self._owner: dict[str, str] = {}
        self._dependents: set[str] = set()
        self._upgrade: dict[str, tuple[UpgradeField, Reason | None]] = {}
        self._denied: dict[str, Reason] = {}
        self._left: set[str] = set()

    # reading -----------------------------------------------------------------------------

    def get(self, name: str) -> Descriptor | None:
        return self._descriptors.get(name)

    def owner(self, name: str) -> str | None:
        """The sidecar that serves ``name`` (None for tools nobody serves)."""
        return self._owner.get(name)

    def tools(self) -> list[Descriptor]:
        return [self._descriptors[n] for n in sorted(self._descriptors)]

    def visible(self) -> list[Descriptor]:
        return [d for d in self.tools() if d.visible]

    def take_removed(self) -> list[str]:
        """Names that left the catalog since the last call (and did not come back), sorted;
        the host publishes them as ``catalog.changed``'s ``removed``."""
        left = sorted(n for n in self._left if n not in self._descriptors)
        self._left.clear()
        return left

    def tool_plan(self, name: str) -> ToolPlan | None:
        """The static facts behind ``name``'s descriptor (a sidecar's announcement included)."""
        return self._effective_plan(name)

    # writing -----------------------------------------------------------------------------

    def load(
        self,
        plan: Plan,
        *,
        allow_degraded: bool | None = None,
        reset: set[str] | frozenset[str] = frozenset(),
    ) -> list[Descriptor]:
        """Install a new plan (start or reload); returns changed or new descriptors.

        Tools that vanished from the plan vanish from the catalog (and count as a change).
        Runtime facts of sidecars in ``reset`` (restarted ones) are forgotten.
        """
        if allow_degraded is not None:
            self.allow_degraded = allow_degraded
        self._plan = plan
        for sid in list(self._facts):
            if sid not in plan.sidecars or sid in reset:
                del self._facts[sid]
        removed = [n for n in self._descriptors if n not in self._names()]
        for name in removed:
            del self._descriptors[name]
            self._owner.pop(name, None)
        self._left.update(removed)
        changed = self._refresh(self._names())
        if removed and not changed:
            self.revision += 1
        return changed

    def update_sidecar(self, sidecar: str, facts: SidecarFacts) -> list[Descriptor]:
        """Record a pool's facts; returns the descriptors that changed."""
        if sidecar not in self._plan.sidecars:
            return []
        self._facts[sidecar] = facts
        names = {n for n, tp in self._plan.tools.items() if tp.sidecar == sidecar}
        names |= {n for n, o in self._owner.items() if o == sidecar}
        if facts.announced:
            names |= set(facts.announced)
        valid = self._names()
        # An announced tool the sidecar no longer lists (MCP tools/list_changed) leaves.
        gone = [n for n in names if n in self._descriptors and n not in valid]
        for name in gone:
            del self._descriptors[name]
            self._owner.pop(name, None)
        self._left.update(gone)
        changed = self._refresh(names)
        if gone and not changed:
            self.revision += 1
        return changed

    def set_quota(self, tool: str, retry_after_ms: int | None) -> list[Descriptor]:
        """Mark ``tool`` quota-limited (with ``retryAfterMs``) or clear it with None."""
        if retry_after_ms is None:
            if self._quota.pop(tool, None) is None:
                return []
        else:
            self._quota[tool] = retry_after_ms
        return self._refresh({tool})

    def set_upgrade(
        self, sidecar: str, state: UpgradeField | None, reason: Reason | None = None
    ) -> list[Descriptor]:
        """Override the registry's ``upgrade`` field for ``sidecar`` (None: stop overriding).

        The package manager's state is the truth for packages it manages; the override outlives
        :meth:`load`, so a reload cannot bring back a stale hand-edited value.
        """
        if state is None:
            if self._upgrade.pop(sidecar, None) is None:
                return []
        else:
            if self._upgrade.get(sidecar) == (state, reason):
                return []
            self._upgrade[sidecar] = (state, reason)
        names = {n for n, o in self._owner.items() if o == sidecar}
        names |= {n for n, tp in self._plan.tools.items() if tp.sidecar == sidecar}
        return self._refresh(names)

    def set_denied(self, denied: Mapping[str, Reason]) -> list[Descriptor]:
        """The sidecars whose tools policy refuses before any call (``sandbox: denied``: a
        confinement ``required`` cannot meet, PROTOCOL 7), each with its reason; replaces the
        previous set. Their runtime reasons are left out (no worker of theirs is started)."""
        if dict(denied) == self._denied:
            return []
        touched = set(denied) | set(self._denied)
        self._denied = dict(denied)
        names = {n for n, o in self._owner.items() if o in touched}
        names |= {n for n, tp in self._plan.tools.items() if tp.sidecar in touched}
        return self._refresh(names)

    def denied_reason(self, sidecar: str) -> Reason | None:
        """Why ``sidecar``'s tools are ``sandbox: denied`` before any call (None: they are not)."""
        return self._denied.get(sidecar)

    def upgrade_of(self, sidecar: str) -> UpgradeField | None:
        """The overriding ``upgrade`` value for ``sidecar``, if any."""
        got = self._upgrade.get(sidecar)
        return got[0] if got else None

    # internals ---------------------------------------------------------------------------

    def _names(self) -> set[str]:
        names = set(self._plan.tools)
        for sid, facts in self._facts.items():
            sp = self._plan.sidecars.get(sid)
            if not facts.announced or sp is None or sp.config is None:
                continue
            if not sp.config.tools:
                names |= set(facts.announced)
            elif sp.announces:
                # An autodiscovered folder: a multi-tool script's tools join, and the script's
                # own planned name leaves (it is not a tool itself).
                names |= set(facts.announced)
                names -= {
                    n
                    for n, tp in self._plan.tools.items()
                    if tp.sidecar == sid and tp.autodiscovered and n not in facts.announced
                }
        return names

    def _refresh(self, names: Iterable[str]) -> list[Descriptor]:
        valid = self._names()
        todo = {n for n in names if n in valid}
        changed: list[Descriptor] = []
        # Tools with ``requires`` go last so they see their dependencies' new visibility.
        later = self._dependents | {n for n in todo if self._has_requires(n)}
        for name in sorted(todo - later):
            self._update_one(name, changed)
        for name in sorted(later):
            if name in valid:
                self._update_one(name, changed)
        if changed:
            self.revision += 1
        return changed

    def _has_requires(self, name: str) -> bool:
        tp = self._plan.tools.get(name)
        return bool(tp and tp.manifest and tp.manifest.requires)

    def _update_one(self, name: str, changed: list[Descriptor]) -> None:
        new = self._describe(name)
        old = self._descriptors.get(name)
        if old != new:
            self._descriptors[name] = new
            if old is None or not _same_but_details(old, new):
                changed.append(new)
        if new.annotations.requires:
            self._dependents.add(name)
        else:
            self._dependents.discard(name)

    def _effective_plan(self, name: str) -> ToolPlan | None:
        tp = self._plan.tools.get(name)
        if tp is not None and not tp.autodiscovered and tp.discovery != "missing":
            return self._completed(tp)
        # A registry sidecar announcing the name serves a tool only the manifests know of, and
        # overrides a discovered script of the same name; the manifest, if any, still wins.
        announced = self._announced_plan(name)
        if announced is None:
            return self._completed(tp) if tp is not None else None
        if tp is not None and tp.manifest is not None and announced.manifest is None:
            announced.manifest = tp.manifest
            sp = self._plan.sidecars[announced.sidecar or ""]
            announced.sandbox = sandbox_for(sp.config, name, tp.manifest)
        return self._completed(announced)

    def _completed(self, tp: ToolPlan) -> ToolPlan:
        """``tp`` with the keys its manifest leaves out taken from the sidecar's announcement
        (description, schemas, read-only hint), so a manifest that only adds ``timeoutMs`` and
        ``retry`` does not erase what an MCP server says about its tool."""
        m = tp.manifest
        if m is None or UNSET not in (m.description, m.input_schema, m.output_schema, m.read_only):
            return tp
        facts = self._facts.get(tp.sidecar) if tp.sidecar else None
        info = facts.announced.get(tp.name) if facts and facts.announced else None
        if info is None:
            return tp
        hint = (info.annotations or {}).get("readOnlyHint")
        filled = msgspec.structs.replace(
            m,
            description=info.description if m.description is UNSET else m.description,
            input_schema=info.inputSchema if m.input_schema is UNSET else m.input_schema,
            output_schema=(info.outputSchema or UNSET)
            if m.output_schema is UNSET
            else m.output_schema,
            read_only=(hint is True) if m.read_only is UNSET else m.read_only,
        )
        return msgspec.structs.replace(tp, manifest=filled)

    def _announced_plan(self, name: str) -> ToolPlan | None:
        # Registry order, not the order pools first published in: a name two MCP servers
        # announce belongs to the sidecar first in the registry (the other's is shadowed).
        for sid in self._plan.sidecars:
            facts = self._facts.get(sid)
            if facts is not None and facts.announced and name in facts.announced:
                sp = self._plan.sidecars[sid]
                cfg = sp.config
                if cfg is None or (cfg.tools and not sp.announces):
                    continue
                if sp.announces and name in self._plan.tools:
                    continue  # a planned tool keeps its own plan (and its file's path)
                tp = ToolPlan(
                    name=name,
                    sidecar=sid,
                    protocol=cfg.protocol,
                    manifest=None,
                    discovery="configured" if cfg.enabled else "disabled",
                    path="resolved",
                    path_details=sp.resolution.details if sp.resolution else None,
                    sandbox=sandbox_for(cfg, name, None),
                    declared=False,
                    autodiscovered=sp.announces,
                )
                if is_builtin(name):
                    tp.manifest_state = "invalid"
                    tp.reasons["manifest"] = Reason(
                        field="manifest",
                        code="duplicates-builtin",
                        message=f"{name} is in a builtin coding namespace",
                        hint=f"the {sid} sidecar must not serve {name}; it is refused",
                    )
                return tp
        return None

    def _describe(self, name: str) -> Descriptor:
        tp = self._effective_plan(name)
        assert tp is not None
        if tp.sidecar is not None:
            self._owner[name] = tp.sidecar
        facts = self._facts.get(tp.sidecar, NOT_STARTED) if tp.sidecar else None
        info = facts.announced.get(name) if facts and facts.announced else None
        specific = dict(tp.reasons)
        if facts is None:
            runtime: RuntimeState = "failed"
            probe: ProbeState = "skipped"
        else:
            tr = facts.tool_runtime.get(name)
            runtime = tr.state if tr else facts.runtime
            rr = tr.reason if tr else facts.runtime_reason
            if rr is not None:
                specific["runtime"] = rr
            tpr = facts.tool_probe.get(name)
            probe = tpr.state if tpr else facts.probe
            pr = tpr.reason if tpr else facts.probe_reason
            if pr is not None:
                specific["probe"] = pr
        manifest = tp.manifest
        requires = list(manifest.requires) if manifest else []
        if manifest is not None:
            # Keys neither the manifest nor an announcement gives: the defaults.
            description = manifest.description if isinstance(manifest.description, str) else ""
            schema = manifest.input_schema
            if not isinstance(schema, dict):
                schema = {"type": "object"}
            annotations = Annotations(
                readOnly=manifest.read_only is True,
                concurrencySafe=manifest.concurrency_safe,
                exclusive=manifest.exclusive,
                permission=manifest.permission,
                resultLimit=manifest.result_limit,
                timeoutMs=manifest.timeout_ms,
                requires=requires,
                outputSchema=out if isinstance(out := manifest.output_schema, dict) else None,
            )
        else:
            description = info.description if info else ""
            schema = info.inputSchema if info else {"type": "object"}
            # No manifest: the sidecar's own hints decide read-only (an absent or non-boolean
            # hint means state-changing, the safe side for disconnects and the MCP face).
            hints = (info.annotations if info else None) or {}
            annotations = Annotations(
                readOnly=hints.get("readOnlyHint") is True,
                outputSchema=info.outputSchema if info else None,
            )
        why = _unportable(schema, annotations.outputSchema)
        if why is not None:  # one such schema would deny MessagePack clients the whole catalog
            schema = {"type": "object"}
            annotations = msgspec.structs.replace(annotations, outputSchema=None)
            if runtime == "ready":  # the announcement is at fault: runtime schema-error
                runtime = "schema-error"
                specific["runtime"] = Reason(
                    field="runtime",
                    code="schema-unportable",
                    message=f"{name}'s announced schema cannot reach every client: {why}",
                    hint="the sidecar must announce a schema without integers over 64 bits",
                )
        upgrade = tp.upgrade
        override = self._upgrade.get(tp.sidecar) if tp.sidecar else None
        if override is not None:
            upgrade, upgrade_reason = override
            specific.pop("upgrade", None)
            if upgrade_reason is not None:
                specific["upgrade"] = upgrade_reason
        retry_after = self._quota.get(name)
        sandbox = tp.sandbox
        if retry_after is not None and sandbox != "denied":
            sandbox = "quota-limited"
        denial = self._denied.get(tp.sidecar) if tp.sidecar else None
        if denial is not None:
            sandbox = "denied"
            specific["sandbox"] = denial
            if tp.sidecar not in self._facts:  # never started: nothing is starting either
                runtime, probe = "failed", "skipped"
        f = Facts(
            discovery=tp.discovery,
            manifest=tp.manifest_state,
            path=tp.path,
            version=tp.version,
            probe=probe,
            runtime=runtime,
            sandbox=sandbox,  # type: ignore[arg-type]
            upgrade=upgrade,
        )
        eff, reasons = assess(f, specific, tp.sidecar)
        if denial is not None or any(r.field in STATIC_FIELDS for r in reasons):
            # A tool that cannot run for a static reason (or that policy keeps from starting):
            # runtime noise would only distract.
            reasons = [r for r in reasons if r.field not in ("runtime", "probe")]
        if requires and eff in ("available", "degraded"):
            blocked = [r for r in requires if not self._is_visible(r)]
            if blocked:
                eff = "unavailable"
                reasons = [
                    *reasons,
                    Reason(
                        field="requires",
                        code="dependency-unavailable",
                        message=f"requires {', '.join(blocked)}, not visible now",
                        hint="make the required tools available first (`toolhost catalog`)",
                    ),
                ]
        visible = eff == "available" or (eff == "degraded" and self.allow_degraded)
        base = facts.details if facts is not None else StabilityDetails()
        details = msgspec.structs.replace(
            base,
            path=tp.path_details,
            retryAfterMs=retry_after,
            install=tp.install if tp.discovery == "missing" else None,
        )
        if eff == "available":
            details = msgspec.structs.replace(details, stderrTail=None)
        stability = Stability(
            discovery=f.discovery,
            manifest=f.manifest,
            path=f.path,
            version=f.version,
            probe=f.probe,
            runtime=f.runtime,
            sandbox=f.sandbox,
            upgrade=f.upgrade,
            effective=eff,
            reasons=reasons,
            details=details,
        )
        return Descriptor(
            name=name,
            description=description,
            inputSchema=schema,
            sidecar=tp.sidecar,
            protocol=tp.protocol,
            visible=visible,
            annotations=annotations,
            stability=stability,
        )

    def _is_visible(self, name: str) -> bool:
        d = self._descriptors.get(name)
        return bool(d and d.visible)


def _unportable(*schemas: object) -> str | None:
    """Why a schema a sidecar announced cannot reach every client (MessagePack carries no
    integer over 64 bits, which JSON allows), or None."""
    for schema in schemas:
        if schema is None:
            continue
        try:
            msgspec.msgpack.encode(schema)
        except MSGPACK_REFUSES as exc:
            return str(exc)
    return None


def _same_but_details(old: Descriptor, new: Descriptor) -> bool:
    """Whether two descriptors differ only in ``stability.details`` (restart counts, exit codes,
    the restart window): live facts that ``catalog.get`` shows but that move no revision and send
    no ``catalog.changed``, so a crash inside the restart intensity does not make the model's
    tool list flap (PROTOCOL 4)."""
    if old.stability.details == new.stability.details:
        return False
    return old == msgspec.structs.replace(
        new, stability=msgspec.structs.replace(new.stability, details=old.stability.details)
    )
