"""The registry file ``tools/external.tools.jsonc``, schemaVersion 2 (PROTOCOL 1).

Every config struct forbids unknown fields so a typo becomes a ``manifest: invalid`` reason
that names the JSON path instead of a silently ignored key.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

PositiveInt = Annotated[int, Meta(ge=1)]
NonNegInt = Annotated[int, Meta(ge=0)]
NonNegFloat = Annotated[float, Meta(ge=0)]
TOOL_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$"
SidecarId = Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]

DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024
"""A tool's output goes into a model's context: 64 KiB unless a sidecar sets more."""

ToolName = Annotated[str, Meta(pattern=TOOL_NAME_PATTERN)]

Anchor = Literal["app", "project", "config", "workspace"]
Protocol = Literal["process-json", "simple-json", "mcp", "mcp-http"]
Mode = Literal["persistent", "oneshot"]
SandboxValue = Literal["allowed", "approval-required", "denied"]
UpgradeState = Literal["idle", "staged", "applying", "rollback-required", "failed"]
RestartPolicyName = Literal["always", "on-failure", "never"]


class _Config(Struct, forbid_unknown_fields=True, rename="camel", kw_only=True):
    """Base for registry structs: strict, camelCase on disk."""


class WsConfig(_Config):
    """``host.ws``: the optional WebSocket gateway."""

    listen: str = "127.0.0.1:7717"
    token_file: str = ".toolhost/ws.token"


class ZygoteConfig(_Config):
    """``host.zygote``: the preforked interpreter Python workers start from (docs/zygote.md)."""

    enabled: bool = True
    preload: list[Annotated[str, Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_.]*$")]] = msgspec.field(
        default_factory=list
    )
    """Modules imported in the zygote before it forks, after the SDK (``sidecars.sdk``); only
    modules that start no thread, event loop or socket when imported."""
    reply_timeout_ms: Annotated[int, Meta(ge=1, le=1000)] = 100
    """How long a start waits for the zygote before it execs the worker instead."""


class TelemetryConfig(_Config):
    """``host.telemetry``: OpenTelemetry traces and metrics (docs/telemetry.md); where they go
    comes from the standard ``OTEL_*`` variables."""

    enabled: bool = False
    capture_content: bool = False
    """Record tool inputs and outputs as span attributes (vault values redacted); off by
    default, as the GenAI conventions ask."""


ConfinementMode = Literal["required", "best-effort", "off"]
ProjectAccess = Literal["none", "read", "write"]
KeepScope = Literal["worker", "sidecar", "host"]
"""``confine.keep``: how long processes a worker left outside its process group may live."""
ConfinePath = Annotated[str, Meta(min_length=1, max_length=4096)]
"""A path of a profile: relative to appRoot, or absolute (checked by registry.check)."""
Port = Annotated[int, Meta(ge=1, le=65535)]
EgressRule = Annotated[str, Meta(min_length=1, max_length=300)]
"""``host:port``, ``*.domain:port``, ``address:port`` (``[v6]:port``) or ``*`` (policy.egress)."""


class NetworkGrant(_Config):
    """``confine.network`` as an object: outbound through the host's egress proxy to ``allow``,
    and these loopback TCP ports directly (PROTOCOL 7)."""

    allow: list[EgressRule] = msgspec.field(default_factory=list)
    loopback: list[Port] = msgspec.field(default_factory=list)


NetworkValue = Literal["none", "host"] | NetworkGrant


class ConfineConfig(_Config):
    """``confine``: what the kernel lets a sidecar's processes touch (PROTOCOL 7).

    A key left out takes the family's default (``[confine]`` in its manifest), else the strict
    default (``project: read``, ``network: none``, 64 processes); a key set here replaces that
    default whole (a list is not merged with the default's list).
    """

    project: ProjectAccess | UnsetType = UNSET
    read: list[ConfinePath] | UnsetType = UNSET
    write: list[ConfinePath] | UnsetType = UNSET
    network: NetworkValue | UnsetType = UNSET
    unix: list[ConfinePath] | UnsetType = UNSET
    """Unix sockets it may connect to (``socket(AF_UNIX)`` is refused without one)."""
    processes: Annotated[int, Meta(ge=1, le=1_000_000)] | UnsetType = UNSET
    """Most processes and threads alive at once in the worker's tree."""
    keep: KeepScope | UnsetType = UNSET
    """What processes the worker started in a session or group of their own may outlive
    (toolhost extension of PROTOCOL 7): ``worker`` (the default) nothing, they are killed with
    its pids group when it ends; ``sidecar`` the worker: they move to the sidecar's kept pids
    group (same ``processes`` limit), emptied when the sidecar leaves the registry or the host
    stops; ``host`` also the host: that group is left running when the host stops."""
    folders: list[ConfinePath] | UnsetType = UNSET
    """Folders at the top of ``projectDir`` it writes by default (the computer and browser
    families' ``screenshots``), by name: with ``project: write`` on a project granted entry by entry
    (``projectDir: "."``, where nothing new can be made at the top), the host makes them at
    load so the grant covers them."""


MCP_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
"""Names of ``host.mcp`` profiles and tokens (checked by the loader, which names the key)."""
McpPattern = Annotated[str, Meta(min_length=1, max_length=1024)]


class McpProfileConfig(_Config):
    """``host.mcp.profiles.<name>``: what one MCP client of ``toolhost mcp`` sees, as
    shell-style patterns (``web.*``, ``file.hash``, ``file:///repo/*``). A kind a profile leaves
    out is hidden from its clients (``["*"]`` shows all of that kind)."""

    tools: list[McpPattern] = msgspec.field(default_factory=list)
    """Tool names."""
    resources: list[McpPattern] = msgspec.field(default_factory=list)
    """Resource URIs (and the URI templates of resource templates)."""
    prompts: list[McpPattern] = msgspec.field(default_factory=list)
    """Prompt names."""


class McpTokenConfig(_Config):
    """``host.mcp.tokens.<name>``: one more bearer token ``toolhost mcp --http`` accepts, and the
    profile its clients get."""

    token_file: Annotated[str, Meta(min_length=1)]
    """The token (0600, generated on first start when missing; relative to the app root)."""
    profile: str | None = None
    """A name in ``host.mcp.profiles``; none: everything the host serves to MCP."""


class McpConfig(_Config):
    """``host.mcp``: per-client slices of ``toolhost mcp`` (docs/mcp-server.md)."""

    profiles: dict[str, McpProfileConfig] = msgspec.field(default_factory=dict)
    """Named slices, for ``toolhost mcp --profile NAME`` and for tokens."""
    tokens: dict[str, McpTokenConfig] = msgspec.field(default_factory=dict)
    """Bearer tokens of ``toolhost mcp --http`` besides ``--token-file``'s, each with its
    profile, so each client on one port sees its own slice."""
    max_adopted: PositiveInt = 128
    """Stdio sessions of ``toolhost mcp`` the host serves itself at once (``mcp.adopt``); one
    more is refused with ``overloaded`` (``--relay`` still works)."""


class HostConfig(_Config):
    """``host``: where the host listens and which folders anchor paths."""

    socket: str = ".toolhost/host.sock"
    ws: WsConfig | None = None
    project_dir: str = "workspace"
    """Where file tools may read and write (created at start if missing); the host-private
    paths inside it stay out of reach (PROTOCOL 1)."""
    workspace_dir: str = "."
    allow_degraded: bool = False
    audit_log: str = ".toolhost/audit.jsonl"
    """Audit log path; an empty string turns auditing off."""
    audit_max_bytes: NonNegInt = 10 * 1024 * 1024
    audit_keep: NonNegInt = 3
    max_frame_bytes: PositiveInt = 16 * 1024 * 1024
    max_concurrent_spawns: PositiveInt = 4
    """Workers starting at once, host-wide (a start holds its slot until ready or exit)."""
    max_restarts_per_second: NonNegFloat = 10.0
    """Host-wide rate of worker restarts after failures (0: unlimited)."""
    restart_burst: PositiveInt = 10
    """Restarts allowed at once before ``maxRestartsPerSecond`` paces them."""
    stats_interval_ms: Annotated[int, Meta(ge=50)] = 1000
    """How often the accounting sampler measures worker processes (RSS, CPU)."""
    zygote: ZygoteConfig = msgspec.field(default_factory=ZygoteConfig)
    """The zygote (``enabled: false``: every worker is exec'd)."""
    quota_state: str = ".toolhost/quota-state.json"
    """Where ``callsPerDay`` counts survive host restarts; an empty string keeps them in memory."""
    max_connections: PositiveInt = 1024
    """Client connections served at once (Unix socket and WebSocket together); a connection over
    it gets one ``overloaded`` error line and is closed. Lowered to half the open-file limit."""
    max_calls_per_client: PositiveInt = 32
    """Calls one connection may have in flight or queued; past it the host stops reading that
    client's frames until one ends (well below a pool's default queue of 64)."""
    log_format: Literal["text", "json"] = "text"
    """``json``: one JSON object per log line on stderr (docs/telemetry.md)."""
    telemetry: TelemetryConfig = msgspec.field(default_factory=TelemetryConfig)
    """OpenTelemetry (off by default; needs the ``toolhost[otel]`` extra)."""
    approval_source: Literal["kernel", "operator"] = "kernel"
    """Who grants ``approval-required`` calls: the kernel's ``approval`` param (``kernel``) or
    only an operator, with ``toolhost approve CALL_ID`` (``operator``)."""
    console: bool = True
    """The web console at ``/`` on the gateway's HTTP port (docs/console.md); it needs ``ws``
    and the gateway token. ``false`` answers 404 there."""
    shutdown_grace_ms: NonNegInt = 5000
    """On SIGTERM/SIGINT, how long running calls may take to finish; the ones still running then
    are cancelled with a message naming this setting."""
    confinement: ConfinementMode = "best-effort"
    """Kernel confinement of every sidecar (PROTOCOL 7, docs/confinement.md): ``best-effort``
    enforces what this kernel supports and reports it, ``required`` keeps a sidecar whose profile
    cannot be fully enforced from starting (``confinement-unavailable``), ``off`` confines
    nothing (PROTOCOL 7's default: ``best-effort``)."""

    mcp: McpConfig = msgspec.field(default_factory=McpConfig)
    """``toolhost mcp``'s profiles and extra tokens (read by ``toolhost mcp``, at start and on
    SIGHUP)."""


class PoolConfig(_Config):
    """``sidecars.<id>.pool``: how many workers, how much queueing."""

    min: NonNegInt = 1
    max: PositiveInt = 1
    queue: NonNegInt = 64
    max_calls_per_worker: NonNegInt = 0
    idle_ms: NonNegInt = 60_000


class ProbeConfig(_Config):
    """``sidecars.<id>.probe``: health pings and the start deadline."""

    interval_ms: NonNegInt = 10_000
    timeout_ms: PositiveInt = 1_000
    failure_threshold: PositiveInt = 3
    start_timeout_ms: PositiveInt = 10_000


class RestartConfig(_Config):
    """``sidecars.<id>.restart``: policy, backoff and intensity limit."""

    policy: RestartPolicyName = "always"
    backoff_ms: NonNegInt = 100
    max_backoff_ms: NonNegInt = 30_000
    intensity: PositiveInt = 5
    period_ms: PositiveInt = 60_000
    reset_after_ms: NonNegInt = 30_000


class ToolQuotaConfig(_Config):
    """``sidecars.<id>.quota.tools.<tool>``: one tool's own quota; 0 means "not set here".

    Window and concurrency quotas apply on top of the sidecar's; ``cpuSecondsPerCall`` and
    ``maxOutputBytes`` replace the sidecar's value for this tool.
    """

    calls_per_minute: NonNegInt = 0
    calls_per_day: NonNegInt = 0
    max_concurrent: NonNegInt = 0
    cpu_seconds_per_call: NonNegFloat = 0
    max_output_bytes: NonNegInt = 0


class QuotaConfig(_Config):
    """``sidecars.<id>.quota``: 0 means unlimited for every field (docs/quotas-and-limits.md)."""

    calls_per_minute: NonNegInt = 0
    calls_per_day: NonNegInt = 0
    max_concurrent: NonNegInt = 0
    cpu_seconds_per_call: NonNegFloat = 0
    rss_mb: NonNegInt = 0
    max_output_bytes: NonNegInt = 0
    tools: dict[ToolName, ToolQuotaConfig] = msgspec.field(default_factory=dict)


class LimitsConfig(_Config):
    """``sidecars.<id>.limits``: rlimits set on every worker process before exec.

    ``RLIMIT_CORE`` is always 0. Zero leaves a limit as inherited.
    """

    memory_mb: NonNegInt = 0
    """``RLIMIT_AS`` in MiB (address space, not RSS: leave room for thread stacks and arenas)."""
    nofile: NonNegInt = 4096
    """``RLIMIT_NOFILE`` (capped at the host's own hard limit)."""
    nproc: NonNegInt = 0
    """Processes a worker may have below it; also sets an ``RLIMIT_NPROC`` backstop."""
    cpu_seconds: NonNegInt = 0
    """``RLIMIT_CPU`` of a long-lived worker over its whole life (SIGXCPU, then it is replaced)."""


StateScope = Literal["session", "shared"]
VaultScope = Literal["profile", "shared"]


class StateDecl(_Config):
    """A named store a sidecar may use through ``state.*`` (PROTOCOL 3.5)."""

    name: Annotated[str, Meta(min_length=1, max_length=128)]
    key_prefix: str = ""
    scope: StateScope = "shared"
    scope_id: str | None = None


class VaultDecl(_Config):
    """A secret a sidecar may fetch with ``vault.get`` (PROTOCOL 3.5)."""

    key: Annotated[str, Meta(min_length=1, max_length=256)]
    scopes: list[VaultScope] = msgspec.field(default_factory=lambda: ["shared"])


class SidecarConfig(_Config):
    """One entry of ``sidecars``."""

    command: Annotated[str, Meta(min_length=1)] | None = None
    """Required for every protocol but ``mcp-http`` (checked by the loader with the JSON path)."""
    url: str | None = None
    """``mcp-http`` only: the Streamable HTTP endpoint of a remote MCP server (http/https)."""
    args: list[str] = msgspec.field(default_factory=list)
    cwd: Anchor = "app"
    env: dict[str, str] = msgspec.field(default_factory=dict)
    protocol: Protocol = "process-json"
    mode: Mode = "persistent"
    tools: list[ToolName] = msgspec.field(default_factory=list)
    enabled: bool = True
    critical: bool = False
    """Readiness (``toolhost health --ready``, ``/readyz``) needs this sidecar available."""
    config: dict[str, Any] = msgspec.field(default_factory=dict)
    timeout_ms: PositiveInt = 30_000
    max_output_bytes: PositiveInt = DEFAULT_MAX_OUTPUT_BYTES
    package_id: str | None = None
    package_version: str | None = None
    protocol_version: str | None = None
    compatible_core: str | None = None
    upgrade: UpgradeState = "idle"
    pool: PoolConfig = msgspec.field(default_factory=PoolConfig)
    probe: ProbeConfig = msgspec.field(default_factory=ProbeConfig)
    restart: RestartConfig = msgspec.field(default_factory=RestartConfig)
    quota: QuotaConfig = msgspec.field(default_factory=QuotaConfig)
    limits: LimitsConfig = msgspec.field(default_factory=LimitsConfig)
    sandbox: SandboxValue | dict[str, SandboxValue] | None = None
    state: list[StateDecl] = msgspec.field(default_factory=list)
    vault: list[VaultDecl] = msgspec.field(default_factory=list)
    spawn: Literal["auto", "exec"] = "auto"
    """How workers start: ``auto`` forks eligible Python workers from the zygote, ``exec``
    always starts a fresh process (PROTOCOL 1)."""
    confine: ConfineConfig = msgspec.field(default_factory=ConfineConfig)
    """The sidecar's confinement profile, key by key over its family's (PROTOCOL 7)."""


class AutodiscoverConfig(_Config):
    """One ``autodiscover`` folder of simple-json scripts (PROTOCOL 3.3).

    Written as a plain string (``"tools/auto"``) it takes every default; as an object it can
    tune the probe and the calls of every script found there.
    """

    path: Annotated[str, Meta(min_length=1)]
    probe_timeout_ms: PositiveInt = 200
    """Deadline of the ``{"__test__": true}`` and ``--fractalic-dump-schema`` runs."""
    timeout_ms: PositiveInt = 30_000
    concurrency: PositiveInt = 4
    """Script runs at once for the whole folder."""
    sandbox: SandboxValue | None = None
    confine: ConfineConfig = msgspec.field(default_factory=ConfineConfig)
    """What the kernel lets the folder's scripts and python tools touch (PROTOCOL 7), key by
    key over the strict default, as a sidecar entry's ``confine``."""


AutodiscoverEntry = str | AutodiscoverConfig


class RegistryFile(_Config):
    """The whole file. ``sidecars`` values are validated one by one (see registry.load)."""

    schema_version: Literal[1, 2]
    host: HostConfig = msgspec.field(default_factory=HostConfig)
    autodiscover: list[AutodiscoverEntry] = msgspec.field(default_factory=list)
    sidecars: dict[SidecarId, SidecarConfig] = msgspec.field(default_factory=dict)


class RegistryTop(_Config):
    """First pass over the file: the top level strict, each sidecar entry left raw.

    The loader validates every ``sidecars.<id>`` separately so one broken entry marks only
    that sidecar ``manifest: invalid``.
    """

    schema_version: Literal[1, 2]
    host: HostConfig = msgspec.field(default_factory=HostConfig)
    autodiscover: list[AutodiscoverEntry] = msgspec.field(default_factory=list)
    sidecars: dict[SidecarId, dict[str, Any]] = msgspec.field(default_factory=dict)
