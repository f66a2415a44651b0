"""Load ``tools/external.tools.jsonc`` (and the user-global one), validate, merge.

# Strategy: parse with json5, check the top level, then validate each ``sidecars.<id>`` on its
# own so a broken entry marks only that sidecar invalid. Nothing here raises for bad input: every
# problem becomes a message naming the file and JSON path, and the host keeps running. The result
# keeps each entry's raw JSON so a reload can tell which sidecars changed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import json5
import msgspec

from supervisor.contracts.registry import (
    MCP_NAME_PATTERN,
    AutodiscoverConfig,
    AutodiscoverEntry,
    HostConfig,
    RegistryTop,
    SidecarConfig,
)
from supervisor.policy.host_private import private_roots
from supervisor.protocols.mcp_http import header_problems, url_problem
from supervisor.registry.check import (
    checked,
    confine_problems,
    join_surrogates,
    nesting_problem,
)

REGISTRY_RELPATH = "tools/external.tools.jsonc"
SIDECAR_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
TOP_KEYS = ("schemaVersion", "host", "autodiscover", "sidecars")

BUILTIN_PREFIXES = ("workspace.", "patch.", "git.", "process.", "shell.")
BUILTIN_NAMES = frozenset(("file.read", "file.write", "file.edit", "file.list"))


def is_builtin(tool: str) -> bool:
    """True for names in the kernel's builtin coding namespaces (refused for sidecars)."""
    return (
        tool in BUILTIN_NAMES
        or tool.startswith(BUILTIN_PREFIXES)
        or tool in {p.rstrip(".") for p in BUILTIN_PREFIXES}
    )


class SidecarEntry(msgspec.Struct, kw_only=True):
    """One sidecar as loaded: valid config, or errors plus whatever tools could be salvaged."""

    id: str
    source: str
    config_dir: str
    config: SidecarConfig | None
    errors: list[str] = msgspec.field(default_factory=list)
    warnings: list[str] = msgspec.field(default_factory=list)
    tools: list[str] = msgspec.field(default_factory=list)
    fingerprint: bytes = b""

    @property
    def valid(self) -> bool:
        return self.config is not None


class Registry(msgspec.Struct, kw_only=True):
    """The merged registry."""

    app_root: str
    files: list[str] = msgspec.field(default_factory=list)
    host: HostConfig = msgspec.field(default_factory=HostConfig)
    autodiscover: list[AutodiscoverConfig] = msgspec.field(default_factory=list)
    """Folders of simple-json scripts (strings normalised to configs with defaults)."""
    sidecars: dict[str, SidecarEntry] = msgspec.field(default_factory=dict)
    errors: list[str] = msgspec.field(default_factory=list)
    unreadable: bool = False
    """A file exists but could not be read or parsed at all (or a named one is missing)."""
    unusable: list[str] = msgspec.field(default_factory=list)
    """Registry files that exist but could not be read or parsed (their problems are in
    ``errors``), so nobody mistakes them for files that are not there."""
    missing: str = ""
    """The absolute path of a registry named explicitly (``--registry``) that does not exist."""

    def path(self, rel: str) -> str:
        """An absolute path for a registry-relative one (for I/O only, never written back)."""
        return os.path.normpath(os.path.join(self.app_root, rel))

    @property
    def project_dir(self) -> str:
        return self.path(self.host.project_dir)

    @property
    def workspace_dir(self) -> str:
        return self.path(self.host.workspace_dir)

    def host_private(self, manifest_dirs: list[str], install_dirs: list[str]) -> tuple[str, ...]:
        """The host-private paths of this registry (PROTOCOL 1): ``.toolhost/``, ``tools/``,
        ``manifests/``, every registry and manifest file read, the files ``host`` names, the
        autodiscover folders and the host's installation."""
        h = self.host
        state = [h.socket, h.audit_log, h.quota_state, h.ws.token_file if h.ws else ""]
        state += [t.token_file for t in h.mcp.tokens.values()]
        state.append(os.path.join(os.path.dirname(h.socket), "operator.token"))
        files = [self.path(f) for f in self.files] + [self.path(p) for p in state if p]
        folders = [self.path(a.path) for a in self.autodiscover]
        folders += [os.path.abspath(d) for d in manifest_dirs]
        folders += [os.path.abspath(d) for d in install_dirs]
        return private_roots(app_root=self.app_root, files=files, folders=folders)

    def host_secrets(self) -> tuple[str, ...]:
        """What no sidecar may even read (PROTOCOL 7, never granted): the app root's
        ``.toolhost/``, the state files ``host`` names wherever they are (socket, audit log,
        quota state, tokens) and every registry file read (its ``env`` may hold keys). The
        rest of :meth:`host_private` (``tools/``, manifests, the installation) stays readable
        where a grant covers it, never writable."""
        h = self.host
        state = [h.socket, h.audit_log, h.quota_state, h.ws.token_file if h.ws else ""]
        state.append(os.path.join(os.path.dirname(h.socket), "operator.token"))
        files = [self.path(f) for f in self.files] + [self.path(p) for p in state if p]
        roots = private_roots(app_root=self.app_root, files=files)
        skip = {os.path.join(self.app_root, d) for d in ("tools", "manifests")}
        return tuple(r for r in roots if r not in skip and os.path.realpath(r) not in skip)

    def anchor_dir(self, entry: SidecarEntry, anchor: str) -> str:
        if anchor == "config":
            return entry.config_dir
        if anchor == "workspace":
            return self.workspace_dir
        return self.app_root


def global_registry_path(env: Mapping[str, str] = os.environ) -> Path:
    """``$XDG_CONFIG_HOME/toolhost/external.tools.jsonc``, else under ``~/.config``."""
    base = env.get("XDG_CONFIG_HOME") or os.path.join(
        env.get("HOME") or os.path.expanduser("~"), ".config"
    )
    return Path(base) / "toolhost" / "external.tools.jsonc"


_JSON5_AT = re.compile(r"^<string>:(?P<line>\d+) (?P<what>.*) at column (?P<col>\d+)$", re.S)
_JSON5_CHAR = re.compile(r'^Unexpected "(?P<char>.+)"$', re.S)


def jsonc_error(exc: Exception, display: str) -> str:
    """``display: not valid JSONC at line L, column C: unexpected ','`` for a json5 error.

    json5 names its input ``<string>`` and puts the line before the message and the column
    after it; the operator needs the file, the line and the column.
    """
    text = str(exc)
    m = _JSON5_AT.match(text)
    if m is None:
        if text == "Empty strings are not legal JSON5":
            text = "the file is empty"
        return f"{display}: not valid JSONC: {text}"
    what = m.group("what")
    char = _JSON5_CHAR.match(what)
    what = f"unexpected '{char.group('char')}'" if char else what[:1].lower() + what[1:]
    where = f"line {m.group('line')}, column {m.group('col')}"
    return f"{display}: not valid JSONC at {where}: {what}"


def parse_text(text: str, display: str) -> tuple[dict[str, Any] | None, list[str]]:
    """Parse JSONC text; returns the object or the reasons it is unusable (never raises)."""
    deep = nesting_problem(text)
    if deep is not None:
        return None, [f"{display}: not usable: {deep}"]
    try:
        data = json5.loads(text)
    except (ValueError, RecursionError) as exc:
        return None, [jsonc_error(exc, display)]
    except Exception as exc:  # json5 has raised other types on garbage; never let one escape
        return None, [f"{display}: not valid JSONC: {type(exc).__name__}: {exc}"]
    if not isinstance(data, dict):
        return None, [f"{display}: top level must be an object, got {type(data).__name__}"]
    return join_surrogates(data), []


class _FileView(msgspec.Struct, kw_only=True):
    display: str
    config_dir: str
    data: dict[str, Any]


def _read_file(path: Path, display: str) -> tuple[_FileView | None, list[str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, []
    except IsADirectoryError:
        return None, [f"{display}: cannot read: it is a directory, not a file"]
    except PermissionError as exc:
        return None, [f"{display}: cannot read: permission denied ({exc.strerror})"]
    except UnicodeDecodeError as exc:
        return None, [
            f"{display}: cannot read: not UTF-8 (byte 0x{exc.object[exc.start]:02x} "
            f"at offset {exc.start})"
        ]
    except (OSError, ValueError) as exc:
        return None, [f"{display}: cannot read: {exc}"]
    data, errors = parse_text(text, display)
    if data is None:
        return None, errors
    return _FileView(display=display, config_dir=str(path.parent), data=data), []


def _salvage_tools(raw: Any) -> list[str]:
    if isinstance(raw, dict) and isinstance(raw.get("tools"), list):
        return [t for t in raw["tools"] if isinstance(t, str) and t]
    return []


def _fingerprint(raw: Any) -> bytes:
    try:
        return msgspec.json.encode(raw, order="sorted")
    except (TypeError, ValueError, OverflowError, RecursionError, msgspec.EncodeError):
        return repr(raw).encode()  # only ever compared with another fingerprint


def load_registry(
    app_root: str | os.PathLike[str],
    *,
    registry_path: str | os.PathLike[str] | None = None,
    global_path: str | os.PathLike[str] | None = None,
    use_global: bool = True,
) -> Registry:
    """Read, validate and merge the registry files.

    Args:
        app_root: The application root (anchor ``app``).
        registry_path: The project registry (default ``<app_root>/tools/external.tools.jsonc``).
        global_path: The user-global registry (default per :func:`global_registry_path`).
        use_global: Whether to read the user-global registry at all.

    Returns:
        The merged registry; problems are in ``errors`` and in each entry's ``errors``.
    """
    root = os.path.abspath(app_root)
    project = Path(registry_path) if registry_path else Path(root) / REGISTRY_RELPATH
    views: list[_FileView] = []
    errors: list[str] = []
    files: list[str] = []
    unusable: list[str] = []
    if use_global:
        gpath = Path(global_path) if global_path else global_registry_path()
        view, errs = _read_file(gpath, "~global:" + gpath.name)
        errors += errs
        if view:
            views.append(view)
            files.append(str(gpath))
        elif errs:
            unusable.append(str(gpath))
    display = os.path.relpath(project, root) if project.is_absolute() else str(project)
    full = project if project.is_absolute() else Path(root) / project
    view, errs = _read_file(full, display)
    missing = ""
    if view is None and not errs and registry_path is not None:
        missing = os.path.abspath(full)
        errs = [f"{display}: no such file ({missing})"]
    errors += errs
    unreadable = bool(errors)
    if view:
        views.append(view)
        files.append(display)
    elif errs:
        unusable.append(display)
    reg = Registry(
        app_root=root,
        files=files,
        errors=errors,
        unreadable=unreadable,
        unusable=unusable,
        missing=missing,
    )
    host_raw: dict[str, Any] = {}
    for view in views:
        try:
            _merge_file(reg, view, host_raw)
        except Exception as exc:  # a loader bug must not take the host down: report it
            reg.errors.append(f"{view.display}: cannot be loaded: {type(exc).__name__}: {exc}")
            reg.unreadable = True
    if host_raw:
        try:
            host, problems = checked(host_raw, HostConfig, "host")
        except Exception as exc:  # never raise for bad input
            host, problems = None, [f"host: cannot be used: {type(exc).__name__}"]
        if problems or not isinstance(host, HostConfig):
            reg.errors += [p + " (host defaults used)" for p in problems]
        else:
            reg.host = host
            for name in ("project_dir", "workspace_dir", "socket", "audit_log", "quota_state"):
                value = getattr(reg.host, name)
                if os.path.isabs(value):
                    reg.errors.append(
                        f"host.{_camel(name)}: absolute paths are not portable, "
                        f"got {value!r} (default used)"
                    )
                    setattr(reg.host, name, getattr(HostConfig(), name))
            reg.errors += mcp_problems(reg.host)
    return reg


def mcp_problems(host: HostConfig) -> list[str]:
    """What ``host.mcp`` gets wrong beyond its types; a token that names no profile, or shares
    its file with another, is dropped (its clients are refused, never given everything)."""
    problems: list[str] = []
    mcp = host.mcp
    for kind, names in (("profiles", mcp.profiles), ("tokens", mcp.tokens)):
        for name in list(names):
            if not re.match(MCP_NAME_PATTERN, name):
                problems.append(
                    f"host.mcp.{kind}.{name}: a name of letters, digits, '.', '_' and '-' "
                    f"(at most 64, not starting with '.', '_' or '-') is needed (ignored)"
                )
                del names[name]
    files: dict[str, str] = {}
    for name, token in list(mcp.tokens.items()):
        where = f"host.mcp.tokens.{name}"
        if token.profile is not None and token.profile not in mcp.profiles:
            known = ", ".join(sorted(mcp.profiles)) or "none"
            problems.append(
                f"{where}.profile: no profile {token.profile!r} in host.mcp.profiles "
                f"(profiles: {known}); this token is not accepted"
            )
            del mcp.tokens[name]
            continue
        path = os.path.normpath(token.token_file)
        if path in files:
            problems.append(
                f"{where}.tokenFile: {token.token_file!r} is host.mcp.tokens.{files[path]}'s "
                "file too; each token needs its own (this one is not accepted)"
            )
            del mcp.tokens[name]
            continue
        files[path] = name
    for name, profile in mcp.profiles.items():
        if not (profile.tools or profile.resources or profile.prompts):
            problems.append(
                f"host.mcp.profiles.{name}: names no tools, resources or prompts, so its "
                'clients see nothing (["*"] shows all of a kind)'
            )
    return problems


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def _merge_file(reg: Registry, view: _FileView, host_raw: dict[str, Any]) -> None:
    data = view.data
    where = view.display
    for key in data:
        if key not in TOP_KEYS:
            reg.errors.append(f"{where}: {key}: unknown top-level field")
    top_raw = {k: v for k, v in data.items() if k in TOP_KEYS and k not in ("sidecars", "host")}
    schema_error: str | None = None
    converted, top_problems = checked({**top_raw, "sidecars": {}}, RegistryTop, "")
    top = converted if isinstance(converted, RegistryTop) and not top_problems else None
    for message in top_problems:
        if message.startswith("schemaVersion"):
            schema_error = f"{where}: {message} (expected 1 or 2)"
            reg.errors.append(schema_error)
        elif not message.startswith("sidecars:"):
            reg.errors.append(f"{where}: {message}")
    if "host" in data and not isinstance(data["host"], dict):
        reg.errors.append(f"{where}: host: expected object, got {_kind(data['host'])}")
    if isinstance(data.get("host"), dict):
        host_raw.update(data["host"])
    if top is not None:
        reg.autodiscover = _folders(top.autodiscover) or reg.autodiscover
    elif isinstance(data.get("autodiscover"), list):
        reg.autodiscover = _folders([a for a in data["autodiscover"] if isinstance(a, str)])
    sidecars = data.get("sidecars", {})
    if not isinstance(sidecars, dict):
        reg.errors.append(f"{where}: sidecars: expected object, got {type(sidecars).__name__}")
        return
    for sid, raw in sidecars.items():
        entry = SidecarEntry(
            id=sid,
            source=where,
            config_dir=view.config_dir,
            config=None,
            tools=_salvage_tools(raw),
            fingerprint=_fingerprint(raw),
        )
        prefix = f"sidecars.{sid}"
        if schema_error is not None:
            entry.errors.append(schema_error)
        elif not re.match(SIDECAR_ID_PATTERN, sid):
            entry.errors.append(f"{prefix}: sidecar id must match {SIDECAR_ID_PATTERN}")
        elif not isinstance(raw, dict):
            entry.errors.append(f"{prefix}: expected object, got {_kind(raw)}")
        else:
            _check_entry(entry, raw, prefix)
        reg.sidecars[sid] = entry


def _kind(value: Any) -> str:
    """The JSON name of a value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _folders(entries: list[AutodiscoverEntry]) -> list[AutodiscoverConfig]:
    return [AutodiscoverConfig(path=e) if isinstance(e, str) else e for e in entries]


def validate_entry(sid: str, raw: Any) -> list[str]:
    """Problems of one ``sidecars.<sid>`` value, exactly as :func:`load_registry` reports them
    (used by writers such as the package manager before they write an entry)."""
    prefix = f"sidecars.{sid}"
    if not re.match(SIDECAR_ID_PATTERN, sid):
        return [f"{prefix}: sidecar id must match {SIDECAR_ID_PATTERN}"]
    if not isinstance(raw, dict):
        return [f"{prefix}: expected object, got {_kind(raw)}"]
    entry = SidecarEntry(id=sid, source="", config_dir="", config=None)
    _check_entry(entry, raw, prefix)
    return entry.errors


def _check_entry(entry: SidecarEntry, raw: dict[str, Any], prefix: str) -> None:
    """Every problem of one entry: values, fields and (when it converts) the semantic rules."""
    config, problems = checked(raw, SidecarConfig, prefix)
    entry.errors += problems
    if isinstance(config, SidecarConfig):
        entry.config = config
        _check_semantics(entry, prefix)
        if problems:
            entry.config = None
    if entry.config is not None:
        entry.tools = list(entry.config.tools)


def _check_semantics(entry: SidecarEntry, prefix: str) -> None:
    """Rules a struct cannot express; any failure makes the entry invalid."""
    cfg = entry.config
    assert cfg is not None
    problems: list[str] = _endpoint_problems(cfg, prefix)
    if cfg.pool.min > cfg.pool.max:
        problems.append(f"{prefix}.pool.min: {cfg.pool.min} is above pool.max {cfg.pool.max}")
    if cfg.mode == "oneshot" and cfg.protocol != "process-json":
        problems.append(f"{prefix}.mode: oneshot applies to process-json only")
    if len(set(cfg.tools)) != len(cfg.tools):
        problems.append(f"{prefix}.tools: a tool is listed twice")
    if isinstance(cfg.sandbox, dict):
        for tool in cfg.sandbox:
            if tool not in cfg.tools:
                problems.append(f"{prefix}.sandbox.{tool}: not one of this sidecar's tools")
    if cfg.tools:
        for tool in cfg.quota.tools:
            if tool not in cfg.tools:
                problems.append(f"{prefix}.quota.tools.{tool}: not one of this sidecar's tools")
    problems += confine_problems(cfg.confine, f"{prefix}.confine")
    if problems:
        entry.errors.extend(problems)
        entry.config = None


def _endpoint_problems(cfg: SidecarConfig, prefix: str) -> list[str]:
    """``command`` for a local sidecar, ``url`` (and no command) for ``mcp-http``."""
    if cfg.protocol != "mcp-http":
        problems = [] if cfg.command else [f"{prefix}.command: required field missing"]
        if cfg.url is not None:
            problems.append(f'{prefix}.url: only for protocol "mcp-http"')
        return problems
    problems = []
    if cfg.command or cfg.args:
        problems.append(
            f'{prefix}.command: protocol "mcp-http" connects to a url; it runs no command'
        )
    if cfg.url is None:
        problems.append(f'{prefix}.url: required for protocol "mcp-http"')
    else:
        problem = url_problem(cfg.url)
        if problem is not None:
            problems.append(f"{prefix}.url: {problem}")
    declared = {d.key for d in cfg.vault}
    for name, problem in header_problems(cfg.config, declared):
        where = f"{prefix}.config.headers.{name}" if name else f"{prefix}.config.headers"
        problems.append(f"{where}: {problem}")
    return problems
