"""The known catalog: ``manifests/*.toml`` (PROTOCOL 2).

Bundled manifests ship with toolhost; an application may add or override tools in its own
``<appRoot>/manifests/``. A broken file is reported, never fatal.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import msgspec

from supervisor.contracts.confine import Profile
from supervisor.contracts.manifest import ManifestFile, RunRecipe, ToolManifest
from supervisor.contracts.registry import ConfineConfig, SidecarConfig
from supervisor.policy.confine import effective
from supervisor.policy.spawn import STARTUP_PYTHON
from supervisor.registry.check import checked, confine_problems


class KnownTool(msgspec.Struct, frozen=True, kw_only=True):
    manifest: ToolManifest
    family: str
    sidecar: str | None = None
    install: str | None = None


class Family(msgspec.Struct, frozen=True, kw_only=True):
    """A manifest file's family-level facts: who usually serves it, how the bundled code runs
    and its default confinement profile (PROTOCOL 7)."""

    name: str
    sidecar: str | None = None
    run: RunRecipe | None = None
    confine: ConfineConfig | None = None


class KnownCatalog(msgspec.Struct, kw_only=True):
    tools: dict[str, KnownTool] = msgspec.field(default_factory=dict)
    families: dict[str, Family] = msgspec.field(default_factory=dict)
    errors: list[str] = msgspec.field(default_factory=list)

    def family_of(self, cfg: SidecarConfig) -> Family | None:
        """The family whose ``run`` recipe this entry runs: the host's python with the same
        ``-m module`` (or script) as the recipe, whatever the sidecar id. The profile belongs
        to the code, so an entry running other code never inherits it."""
        if cfg.command not in STARTUP_PYTHON:
            return None
        for family in self.families.values():
            run = family.run
            if run is None or run.command not in STARTUP_PYTHON or not run.args:
                continue
            if cfg.args[: len(run.args)] == run.args:
                return family
        return None

    def profile_for(self, cfg: SidecarConfig) -> Profile:
        """The effective confinement profile of an entry: its ``confine`` key by key over its
        family's, over the strict defaults."""
        family = self.family_of(cfg)
        return effective(cfg.confine, family.confine if family else None)

    def get(self, name: str) -> ToolManifest | None:
        known = self.tools.get(name)
        return known.manifest if known else None


def bundled_manifest_dir() -> Path:
    """``manifests/`` next to the installed packages (the repository's own folder)."""
    return Path(__file__).resolve().parents[2] / "manifests"


def load_manifest_file(path: Path) -> tuple[ManifestFile | None, str | None]:
    """Parse one TOML manifest; returns it or an error naming the file and JSON path."""
    try:
        text = path.read_text(encoding="utf-8")
    except IsADirectoryError:
        return None, f"{path.name}: cannot read: it is a directory, not a file"
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        return None, f"{path.name}: cannot read: {exc}"
    try:
        raw = tomllib.loads(text)
    except (ValueError, RecursionError) as exc:  # TOMLDecodeError is a ValueError
        return None, f"{path.name}: not valid TOML: {exc}"
    manifest, problems = checked(raw, ManifestFile, "")
    if isinstance(manifest, ManifestFile) and not problems:
        problems = confine_problems(manifest.confine, "confine")
    if problems or not isinstance(manifest, ManifestFile):
        return None, f"{path.name}: " + "; ".join(problems)
    return manifest, None


def load_known_catalog(dirs: list[Path]) -> KnownCatalog:
    """Read every ``*.toml`` under each folder in order; later folders override earlier ones."""
    catalog = KnownCatalog()
    seen: set[Path] = set()
    for folder in dirs:
        try:
            folder = folder.resolve()
        except OSError:
            continue
        if folder in seen or not folder.is_dir():
            continue
        seen.add(folder)
        for path in sorted(folder.glob("*.toml")):
            mf, error = load_manifest_file(path)
            if mf is None:
                catalog.errors.append(error or path.name)
                continue
            catalog.families[path.stem] = Family(
                name=path.stem, sidecar=mf.sidecar, run=mf.run, confine=mf.confine
            )
            for tool in mf.tool:
                catalog.tools[tool.name] = KnownTool(
                    manifest=tool, family=path.stem, sidecar=mf.sidecar, install=mf.install
                )
    return catalog
