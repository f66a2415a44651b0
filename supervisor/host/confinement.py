"""The host's part of confinement (PROTOCOL 7): each sidecar's plan and walls, per registry load.

# Strategy: :meth:`Confiner.configure` runs at start and at every reload. For each runnable
# sidecar it resolves the plan (``policy.confine.resolve``: the entry's profile over its family's,
# ``host.confinement``, this kernel, the host's layout) and, when the plan is active and
# enforceable, prepares its walls once (``processes.confine.SidecarWalls``: the Landlock
# ruleset, the network namespace, the temp root), reusing what an unchanged plan already has.
# Workers get them through the launch context (``host/launch.py``), never a global. A plan
# ``required`` cannot meet, or walls that cannot be prepared under ``required``, leave the
# sidecar without walls and with a ``problem``: its workers refuse to start with that reason.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket as stdsocket
from collections import deque
from collections.abc import Callable
from functools import partial

import msgspec
import trio

from supervisor.contracts.confine import (
    ConfinementFacts,
    ConfinePlan,
    EgressRecord,
    KernelFacts,
    Layout,
    Profile,
)
from supervisor.contracts.snapshot import Reason
from supervisor.host.egress import EgressProxy, client_for, shared_listener
from supervisor.host.loading import Loaded
from supervisor.host.unix_gate import UnixGate
from supervisor.policy.confine import folders_to_make, resolve, with_collector
from supervisor.policy.confine_explain import (
    denial_hints,
    label,
    unavailable_reason,
    walls_reason,
)
from supervisor.policy.egress import proxy_env
from supervisor.processes import confine
from supervisor.processes.confine_spawn import Prepared, SidecarConfinement
from supervisor.processes.host_temp import HostTemp
from supervisor.processes.peers import PeerGuard
from supervisor.processes.pids_cgroup import KeptGroups, PidsCgroups
from supervisor.processes.unix_gate import Rules
from supervisor.registry.plan import SidecarPlan

log = logging.getLogger("toolhost.confine")
REFUSALS_KEPT = 32
"""Egress refusals kept per sidecar for the hints of failed calls."""


def _listdir(path: str) -> list[str] | None:
    try:
        return os.listdir(path)
    except OSError:
        return None


def programs_read(sp: SidecarPlan, cwd: str) -> tuple[str, ...]:
    """What a sidecar runs besides its command, granted read with it: the folders of the
    scripts and routes of a simple-json folder (and the files their arguments name), and the
    entries of ``PYTHONPATH`` in its ``env`` (the entry's author put them there)."""
    out: list[str] = []
    argvs = [*sp.scripts.values(), *(r.argv for r in sp.routes.values() if r.argv)]
    for argv in argvs:
        program = confine.program_of(argv, cwd)
        if program:
            out.append(os.path.dirname(program))
        for arg in argv[1:]:
            path = os.path.join(cwd, arg)
            if not arg.startswith("-") and os.path.isfile(path):
                out.append(os.path.dirname(os.path.abspath(path)))
    cfg = sp.config
    if cfg is not None:
        out += [p for p in cfg.env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return tuple(dict.fromkeys(os.path.abspath(os.path.join(cwd, p)) for p in out))


class Confiner:
    """Every sidecar's confinement plan and prepared walls, for the registry loaded now."""

    def __init__(self, probe: Callable[[], KernelFacts] = confine.probe) -> None:
        self.probe = probe
        """What this kernel can enforce (``processes.confine.probe``; a test may describe
        another kernel)."""
        self.plans: dict[str, ConfinePlan] = {}
        """The plan of every runnable sidecar (``toolhost doctor`` and the facts read it)."""
        self.problems: dict[str, str] = {}
        """Sidecars that must not start, and why (``confinement-unavailable``)."""
        self.profiles: dict[str, Profile] = {}
        """The effective profile of every runnable sidecar (``toolhost doctor``)."""
        self.denials: dict[str, Reason] = {}
        """The same sidecars' ``sandbox: denied`` reasons (the catalog shows them; no worker
        of theirs is started)."""
        self._host_private: tuple[str, ...] = ()
        self._refusals: dict[str, deque[tuple[float, EgressRecord]]] = {}
        self._held: dict[str, SidecarConfinement] = {}
        self._cgroups: PidsCgroups | None = None
        self._shared: stdsocket.socket | None = None
        """The egress proxy's shared loopback listener, made when a plan first needs it."""
        self._shared_served = False
        self._kept: KeptGroups | None = None
        self._probed = False
        self._temp: HostTemp | None = None
        """The folder the workers' private ``TMPDIR`` s live in (made at the first load that
        confines; the folders of hosts gone since are swept then)."""
        self.proxy: EgressProxy | None = None
        """The host's egress proxy, once it runs (:meth:`attach`)."""
        self.gate: UnixGate | None = None
        """The host's Unix socket gate, once it runs (``unix`` grants checked path by path)."""
        self._served: set[int] = set()
        self.collector = ""
        """The OTLP endpoint sidecars export their spans to (``host.telemetry`` on), granted to
        every confined sidecar (:func:`~supervisor.policy.confine.with_collector`)."""
        self._peers = PeerGuard()

    def refusal(self, pid: int) -> str:
        """Why socket peer ``pid`` is one of this host's confined sidecar processes, which the
        kernel socket refuses ("" if not: ``processes.peers``)."""
        return self._peers.refusal(pid)

    def attach(self, proxy: EgressProxy) -> None:
        """The egress proxy runs: serve every sidecar's listeners now and after each load."""
        self.proxy = proxy
        self._serve()

    def _serve(self) -> None:
        """Hand the listeners of walls not served yet to the proxy (the proxy's port, and a
        relay per ``loopback`` grant)."""
        proxy = self.proxy
        if proxy is None:
            return
        if self._shared is not None and not self._shared_served:
            self._shared_served = True
            proxy.serve_shared(self._shared)
        for sid, held in self._held.items():
            walls = held.walls
            if walls is None or id(walls) in self._served:
                continue
            self._served.add(id(walls))
            plan = held.plan
            for port, listener in walls.listeners.items():
                client = client_for(sid, plan.allow)
                relay = 0 if port == plan.proxy_port else port
                proxy.serve_listener(listener, client, relay_to=relay)

    def get(self, sidecar: str) -> SidecarConfinement | None:
        """The walls a worker of ``sidecar`` starts behind (None: unconfined)."""
        return self._held.get(sidecar)

    def configure(self, loaded: Loaded) -> None:
        """Resolve every sidecar's plan for ``loaded`` and prepare the walls of active ones."""
        registry = loaded.registry
        mode = registry.host.confinement
        kernel = self.probe() if mode != "off" else KernelFacts()
        if mode != "off" and kernel.pids_cgroup and not self._probed:
            self._probed = True
            self._cgroups = PidsCgroups.probe()
            if self._cgroups is not None:
                self._cgroups.sweep()
                self._peers.cgroup_tag = os.path.basename(self._cgroups.base)
                self._kept = KeptGroups(self._cgroups)
        if mode != "off" and self._temp is None:
            self._temp = _host_temp()
        secrets = registry.host_secrets() if mode != "off" else ()
        install = confine.install_paths() if mode != "off" else ()
        if mode != "off" and _same_dir(registry.project_dir, registry.app_root):
            log.warning(
                "host.projectDir is the app root (%s): confined sidecars are granted it entry by"
                " entry around the host's own files, so they cannot create anything new at its"
                " top (only in its folders; a family's default folders, such as screenshots/,"
                ' are made at load); set projectDir to a folder of its own (e.g. "workspace")',
                registry.app_root,
            )
        plans: dict[str, ConfinePlan] = {}
        profiles: dict[str, Profile] = {}
        problems: dict[str, str] = {}
        denials: dict[str, Reason] = {}
        held: dict[str, SidecarConfinement] = {}
        for sp in loaded.plan.sidecars.values():
            cfg = sp.config
            if not sp.runnable or cfg is None:
                continue
            cwd = sp.cwd or registry.app_root
            layout = Layout(
                app_root=registry.app_root,
                project_dir=registry.project_dir,
                cwd=cwd,
                program=confine.program_of(sp.argv, cwd),
                home=os.environ.get("HOME", ""),
                install=install,
                secrets=secrets,
                host_private=loaded.host_private,
            )
            profile = profiles[sp.id] = loaded.known.profile_for(cfg)
            if self.collector:
                profile = with_collector(profile, self.collector)
            extra = programs_read(sp, cwd)
            if extra:
                profile = msgspec.structs.replace(profile, read=(*profile.read, *extra))
            if mode != "off":
                _make_folders(sp.id, profile, layout)
            plan = resolve(
                sp.id,
                profile,
                mode=mode,
                kernel=kernel,
                layout=layout,
                listdir=_listdir,
                realpath=os.path.realpath,
            )
            absent = _absent_grants(profiles[sp.id], registry.app_root)
            if absent:
                plan = msgspec.structs.replace(plan, refused=(*plan.refused, *absent))
            plans[sp.id] = plan
            for why in plan.refused:
                log.warning("sidecar %s: confine grant refused: %s", sp.id, why)
            reason = unavailable_reason(plan)
            if reason is not None:
                problems[sp.id] = plan.unavailable
                denials[sp.id] = reason
                log.warning("sidecar %s: %s", sp.id, plan.unavailable)
                held[sp.id] = SidecarConfinement(plan, None, refused=plan.unavailable)
                continue
            if not plan.active:
                continue
            old = self._held.get(sp.id)
            if old is not None and old.plan == plan:
                held[sp.id] = old
                continue
            try:
                held[sp.id] = self._prepare(plan)
            except OSError as exc:
                message = f"confinement-unavailable: sidecar {sp.id}: walls not prepared: {exc}"
                if plan.mode == "required":
                    problems[sp.id] = message
                    denials[sp.id] = walls_reason(sp.id, str(exc))
                    held[sp.id] = SidecarConfinement(plan, None, refused=message)
                else:
                    log.warning("%s (best-effort: it runs unconfined)", message)
        for sid, old in self._held.items():
            if held.get(sid) is not old:
                if self.proxy is not None and old.walls is not None:
                    self.proxy.forget(sid)
                    self._served.discard(id(old.walls))
                with contextlib.suppress(OSError):
                    old.close()
        if self._kept is not None:  # removed, or no longer granted keep: its processes die
            for sid in self._kept.sidecars():  # (host.confinement off keeps them: no new walls)
                now = plans.get(sid)
                if now is None or now.keep == "worker":
                    self._kept.release(sid)
        self.plans, self.problems, self.denials, self._held = plans, problems, denials, held
        self.profiles = profiles
        self._host_private = tuple(loaded.host_private)
        self._serve()

    def _prepare(self, plan: ConfinePlan) -> SidecarConfinement:
        """The walls of an active, enforceable ``plan``. A sidecar with ``network.allow`` and a
        namespace of its own reaches the proxy at a listener in it; one without (a host that
        cannot make namespaces) reaches the shared loopback listener, its Landlock TCP rule
        naming that port, each worker with a token of its own in the proxy URL.

        Raises:
            OSError: The walls (or the shared listener) could not be made.
        """
        if plan.network != "proxy" or plan.netns or plan.tcp_connect is None:
            walls = confine.SidecarWalls(plan, tmp_root=self._tmp_root)
            env = proxy_env(f"http://127.0.0.1:{plan.proxy_port}") if plan.proxy_port else {}
            return SidecarConfinement(
                plan, walls, self._cgroups, env, kept=self._kept, gate=self._gate_watch
            )
        if self._shared is None:
            self._shared = shared_listener()
        port = self._shared.getsockname()[1]
        walls = confine.SidecarWalls(plan, tmp_root=self._tmp_root, proxy_port=port)
        sid, allow = plan.sidecar, plan.allow

        def issue(worker: str) -> tuple[dict[str, str], Callable[[], None]]:
            proxy = self.proxy
            if proxy is None:
                raise OSError(errno.EAGAIN, "the host's egress proxy is not running")
            token = proxy.add_token(client_for(sid, allow, worker=worker))
            return proxy_env(f"http://toolhost:{token}@127.0.0.1:{port}"), partial(
                proxy.forget, worker
            )

        return SidecarConfinement(
            plan, walls, self._cgroups, worker_env=issue, kept=self._kept, gate=self._gate_watch
        )

    def _gate_watch(
        self, channel: stdsocket.socket, prepared: Prepared, rules: Rules
    ) -> Callable[[], None] | None:
        """Hand a gated worker's report channel to the gate, once it runs (None: it does not:
        the worker's connects fail, never pass unchecked)."""
        gate = self.gate
        return gate.watch(channel, prepared, rules) if gate is not None else None

    # what an operator is told ----------------------------------------------------------------

    def label(self, sidecar: str, facts: ConfinementFacts | None) -> str:
        """The sidecar's confinement column (``fs+net+seccomp``, ``off``, ``denied``): from
        ``facts`` read from a worker when one ran, else from the plan."""
        return label(self.plans.get(sidecar), facts, denied=sidecar in self.denials)

    def note_egress(self, record: EgressRecord) -> None:
        """The egress proxy ended a connection: keep its refusals a while, for the hints of
        the calls that failed meanwhile."""
        if record.allowed:
            return
        kept = self._refusals.setdefault(record.sidecar, deque(maxlen=REFUSALS_KEPT))
        kept.append((trio.current_time(), record))

    def hints(self, sidecar: str, text: str, since: float | None = None) -> list[str]:
        """The grants that would allow what ``text`` (a failure's error and stderr) says
        ``sidecar``'s walls refused, with the egress proxy's refusals since ``since`` (trio
        clock; None: none) (``policy.confine_explain``)."""
        plan = self.plans.get(sidecar)
        if plan is None:
            return []
        kept = self._refusals.get(sidecar, ()) if since is not None else ()
        refusals = [r for t, r in kept if since is not None and t >= since]
        return denial_hints(plan, text, host_private=self._host_private, refusals=refusals)

    def explainer(self, sidecar: str) -> Callable[[str, float], list[str]] | None:
        """What a worker of ``sidecar`` calls when a call fails: the failure's text and when
        the call began (trio clock) in, the grants that would allow what was denied out
        (:meth:`hints`); also logged. None: the sidecar is not confined."""
        plan = self.plans.get(sidecar)
        if plan is None or not plan.active:
            return None

        def explain(text: str, since: float) -> list[str]:
            hints = self.hints(sidecar, text, since)
            if hints:
                log.warning("sidecar %s hit its confinement: %s", sidecar, "; ".join(hints))
            return hints

        return explain

    def close(self) -> None:
        """Release every sidecar's walls (the host stops)."""
        for held in self._held.values():
            with contextlib.suppress(OSError):
                held.close()
        self._held = {}
        if self._shared is not None and not self._shared_served:
            self._shared.close()  # served: the proxy closes it when it stops
        self._shared = None
        if self._kept is not None:
            for path in self._kept.close():
                log.info("kept processes left running (confine.keep: host) in %s", path)
        if self._cgroups is not None:
            with contextlib.suppress(OSError):
                self._cgroups.close()
        if self._temp is not None:
            self._temp.close()
            self._temp = None

    @property
    def _tmp_root(self) -> str | None:
        return self._temp.path if self._temp is not None else None


def _host_temp() -> HostTemp | None:
    """This host's temp folder, after sweeping those of hosts killed before they could remove
    theirs (None: it could not be made; each sidecar's folder is then made in the system's)."""
    try:
        temp = HostTemp()
    except OSError as exc:
        log.warning("cannot make the host's temp folder: %s", exc)
        return None
    for folder in temp.sweep():
        log.info("removed the temp folder of a host that is gone: %s", folder)
    return temp


def _absent_grants(profile: Profile, app_root: str) -> list[str]:
    """The profile's ``read``/``write`` paths that do not exist at load: Landlock grants what
    it can open, so nothing is granted for them (a log file the sidecar creates later)."""
    out = []
    for key, paths in (("read", profile.read), ("write", profile.write)):
        for p in paths:
            full = os.path.normpath(os.path.join(app_root, p))
            if not os.path.lexists(full):
                out.append(
                    f"{full}: confine.{key} {p!r} does not exist at load, so nothing is granted"
                    " (Landlock grants what exists): create it before the host starts (or"
                    " reloads), or grant its folder"
                )
    return out


def _make_folders(sidecar: str, profile: Profile, layout: Layout) -> None:
    """Make the project folders ``profile.folders`` names where the project is carved, so the
    grant covers them (``policy.confine.folders_to_make``); a failure is logged, the sidecar
    runs (its call that writes there fails with a hint)."""
    folders, refused = folders_to_make(profile, layout, os.path.realpath)
    for why in refused:
        log.warning("sidecar %s: %s", sidecar, why)
    for path in folders:
        try:
            if not os.path.isdir(path):
                os.mkdir(path, 0o755)
        except OSError as exc:
            log.warning("sidecar %s: confine.folders: cannot make %s: %s", sidecar, path, exc)


def _same_dir(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)
