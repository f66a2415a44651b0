"""Reading what a host runs from: its options, the registry and the manifests, into a plan.

# Strategy: :func:`load` is the one place that reads the registry files, the known catalog
# (``manifests/*.toml``) and the ``autodiscover`` folders and builds the plan from them; it does
# disk I/O and nothing else (no trio, no pool, no catalog), so the host calls it at start and at
# every reload and decides afterwards what to do with the result. What the host runs from now is
# one :class:`Loaded`, shared by the host (which writes a reload's values into it) and by the
# parts that read it live (the views, the host services).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from pathlib import Path

import msgspec

import supervisor
from supervisor.registry.check import every_problem
from supervisor.registry.discover import add_discovered, scan_all
from supervisor.registry.load import Registry, load_registry
from supervisor.registry.manifests import KnownCatalog, bundled_manifest_dir, load_known_catalog
from supervisor.registry.plan import Plan, build_plan

log = logging.getLogger("toolhost.host")


class HostOptions(msgspec.Struct, kw_only=True):
    """How to find the registry; defaults follow PROTOCOL 1."""

    app_root: str
    registry_path: str | None = None
    global_registry: str | None = None
    use_global: bool = True
    manifest_dirs: list[str] | None = None
    seed: int | None = None
    cancel_grace_ms: int = 500
    stop_grace_ms: int = 2000
    restart_policy: str | None = None
    """Override every sidecar's restart policy (``toolhost doctor`` starts each one once)."""
    audit: bool = True
    log_format: str | None = None
    """``text`` | ``json`` over ``host.logFormat`` (``toolhost serve --log-format``)."""
    socket: str | None = None
    """The socket it will be served on, when not ``host.socket`` (``toolhost serve --socket``)."""


class Loaded:
    """What the host runs from now: the registry, the known catalog, the plan built from them
    and the host-private paths (one instance per host; a reload writes its values into it).

    Args:
        registry: The registry as read.
        known: The known catalog (``manifests/*.toml``).
        plan: The plan built from both (autodiscovered sidecars included).
        host_private: Paths no tool may touch (PROTOCOL 1), sent to every worker in ``init``.
    """

    __slots__ = ("host_private", "known", "plan", "registry")

    def __init__(
        self,
        registry: Registry,
        known: KnownCatalog,
        plan: Plan,
        host_private: tuple[str, ...] = (),
    ) -> None:
        self.registry = registry
        self.known = known
        self.plan = plan
        self.host_private = host_private


def install_dirs() -> list[str]:
    """The host's installation: its packages and, in a virtual environment, the environment."""
    dirs = [os.path.dirname(supervisor.__file__)]
    spec = importlib.util.find_spec("sidecars")
    if spec is not None and spec.submodule_search_locations:
        dirs += list(spec.submodule_search_locations)
    if sys.prefix != sys.base_prefix:
        dirs.append(sys.prefix)
    # A source checkout (an editable install, `make serve`): its build and CI files run code
    # the next time the operator builds, tests or commits.
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(supervisor.__file__)))
    if os.path.isfile(os.path.join(checkout, "pyproject.toml")):
        names = ("pyproject.toml", "Makefile", ".ci", ".git", "bench", "deploy")
        dirs += [os.path.join(checkout, name) for name in names]
    return dirs


def load(options: HostOptions) -> Loaded:
    """Read the registry and manifests ``options`` name and build a plan (nothing is applied)."""
    app_root = os.path.abspath(options.app_root)
    host_version = supervisor.__version__
    registry = load_registry(
        app_root,
        registry_path=options.registry_path,
        global_path=options.global_registry,
        use_global=options.use_global,
    )
    dirs = (
        [Path(d) for d in options.manifest_dirs]
        if options.manifest_dirs is not None
        else [bundled_manifest_dir(), Path(app_root) / "manifests"]
    )
    known = load_known_catalog(dirs)
    try:
        os.makedirs(registry.project_dir, exist_ok=True)
    except OSError as exc:
        log.warning("projectDir %s cannot be created: %s", registry.project_dir, exc)
    host_private = registry.host_private([str(d) for d in dirs], install_dirs())
    plan = build_plan(registry, known, host_version=host_version)
    if registry.autodiscover:
        registry.errors += add_discovered(
            plan, registry, known, scan_all(registry), host_version=host_version
        )
    for problem in every_problem(registry, known):
        log.warning("registry: %s", problem)
    return Loaded(registry, known, plan, host_private)
