"""How a script in an ``autodiscover`` folder publishes its tools (PROTOCOL 3.3), as pure functions.

# Strategy: discovery asks a script, in order, four questions and keeps the first usable answer:
# the simple-json probe (``{"__test__": true}``), ``--fractalic-dump-multi-schema`` (a JSON list
# of ``{name, description, command?, parameters}``: one script, several tools, each called with
# its name as the first argument), ``--fractalic-dump-schema`` (one CLI tool with that schema),
# and ``--help`` (argparse/GNU-style help read into a schema). The runtime runs the processes;
# these functions judge what they printed and say, for ``toolhost doctor``, why each step did not
# answer. A :class:`Discovery` is plain data, so it can be cached until the script changes.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import msgspec

from supervisor.protocols import cli_help
from supervisor.protocols.outcome import preview
from supervisor.protocols.simple_json import ANY_OBJECT, ProbeVerdict

MULTI_SCHEMA_ARG = "--fractalic-dump-multi-schema"
HELP_ARG = "--help"
MULTI_COMMANDS = ("simple-json", "python-cli", "bash-cli")
MAX_MULTI_TOOLS = 256
"""A multi-schema list longer than this is cut (and the cut is reported)."""

DiscoveryRoute = Literal["simple-json", "multi-schema", "schema-dump", "help", "none"]
FoundKind = Literal["simple-json", "cli", "unavailable"]


class FoundTool(msgspec.Struct, frozen=True, kw_only=True):
    """One tool a script publishes, and how a call runs it."""

    name: str
    description: str
    schema: dict[str, Any]
    kind: FoundKind
    argv: list[str]
    """The command line before the input (a multi-tool script's ends with the tool's name)."""
    reason: str = ""
    """Why the tool cannot run (``kind == "unavailable"``)."""


class Discovery(msgspec.Struct, frozen=True, kw_only=True):
    """What discovery found out about one script."""

    route: DiscoveryRoute
    verdict: ProbeVerdict
    """The simple-json probe's verdict (the reason of a script nothing else answered)."""
    tools: list[FoundTool] = msgspec.field(default_factory=list)
    steps: list[str] = msgspec.field(default_factory=list)
    """Why each step before the route (or every step, for ``none``) did not answer."""
    notes: list[str] = msgspec.field(default_factory=list)
    """Entries of a multi-schema list that were left out, and why."""
    transient: bool = False
    """A step timed out or could not run: the result may differ next time (never cached)."""


def _schema(value: Any) -> dict[str, Any] | None:
    if value is None:
        return dict(ANY_OBJECT)
    if isinstance(value, dict) and value.get("type", "object") == "object":
        return value
    return None


def _decode(stdout: bytes) -> Any:
    text = stdout.strip()
    if not text:
        raise ValueError("printed nothing")
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError:
        raise ValueError(f"printed something that is not JSON: {preview(text)}") from None
    except RecursionError:
        raise ValueError("printed JSON nested too deeply") from None


def parse_multi_schema(
    stdout: bytes, argv: list[str], name_pattern: str, where: str
) -> tuple[list[FoundTool], list[str]] | str:
    """A ``--fractalic-dump-multi-schema`` answer: ``(tools, notes)``, or why it is not one.

    An entry with a valid name but other problems becomes an unavailable tool naming them; an
    entry without a usable name cannot be a tool and is only noted.
    """
    try:
        doc = _decode(stdout)
    except ValueError as exc:
        return str(exc)
    if not isinstance(doc, list):
        return "printed JSON that is not a list of tools"
    if not doc:
        return "printed an empty list"
    tools: list[FoundTool] = []
    notes: list[str] = []
    seen: set[str] = set()
    if len(doc) > MAX_MULTI_TOOLS:
        notes.append(f"{len(doc)} entries; only the first {MAX_MULTI_TOOLS} are used")
        doc = doc[:MAX_MULTI_TOOLS]
    for i, item in enumerate(doc):
        if not isinstance(item, dict):
            notes.append(f"entry {i} is not an object")
            continue
        name = item.get("name")
        if not isinstance(name, str) or not re.match(name_pattern, name):
            notes.append(f"entry {i}: name {preview(str(name).encode())} is not a valid tool name")
            continue
        if name in seen:
            notes.append(f"entry {i}: {name} is listed twice; the first is used")
            continue
        seen.add(name)
        problems: list[str] = []
        description = item.get("description", "")
        if not isinstance(description, str):
            problems.append("description must be a string")
            description = ""
        command = item.get("command", "simple-json")
        if command not in MULTI_COMMANDS:
            problems.append(f"unknown command {command!r} (one of {', '.join(MULTI_COMMANDS)})")
        schema = _schema(item.get("parameters", item.get("inputSchema")))
        if schema is None:
            problems.append("parameters must be a JSON Schema object ({type: object, ...})")
        description = description or f"{name} from the multi-tool script {where}"
        if problems:
            tools.append(
                FoundTool(
                    name=name,
                    description=description,
                    schema=dict(ANY_OBJECT),
                    kind="unavailable",
                    argv=[*argv, name],
                    reason=f"{where} {MULTI_SCHEMA_ARG} entry {name}: " + "; ".join(problems),
                )
            )
            continue
        assert schema is not None
        tools.append(
            FoundTool(
                name=name,
                description=description,
                schema=schema,
                kind="simple-json" if command == "simple-json" else "cli",
                argv=[*argv, name],
            )
        )
    if not tools:
        return "no usable entry: " + "; ".join(notes)
    return tools, notes


def parse_schema_dump(stdout: bytes, name: str, argv: list[str], where: str) -> FoundTool | str:
    """A ``--fractalic-dump-schema`` answer of a script that failed the simple-json probe: one
    CLI tool (input as flags; ``command: simple-json`` in the dump keeps the JSON argument)."""
    try:
        doc = _decode(stdout)
    except ValueError as exc:
        return str(exc)
    if not isinstance(doc, dict):
        return "printed JSON that is not an object"
    raw_schema = doc.get("parameters", doc.get("inputSchema"))
    if raw_schema is None:
        return "printed no parameters"
    schema = _schema(raw_schema)
    if schema is None:
        return "parameters is not a JSON Schema object"
    description = doc.get("description")
    if not isinstance(description, str) or not description:
        description = f"CLI script {where} (schema from {'--fractalic-dump-schema'})"
    kind: FoundKind = "simple-json" if doc.get("command") == "simple-json" else "cli"
    return FoundTool(name=name, description=description, schema=schema, kind=kind, argv=argv)


def parse_help(stdout: bytes, name: str, argv: list[str], where: str) -> FoundTool | str:
    """A ``--help`` answer read as argparse/GNU-style help: one CLI tool, or why not."""
    text = stdout.decode("utf-8", "replace")
    found = cli_help.schema_from_help(text)
    if found is None:
        return "no 'usage:' line (not argparse/GNU-style help)"
    description, schema = found
    return FoundTool(
        name=name,
        description=description or f"CLI script {where} (schema from --help)",
        schema=schema,
        kind="cli",
        argv=argv,
    )


def step_failure(exit_code: int | None, stdout: bytes | None, timed_out: bool, ms: int) -> str:
    """Why a step's run gave nothing to parse (empty: it exited 0 with output)."""
    if timed_out:
        return f"no answer within {ms} ms"
    if exit_code != 0:
        return f"exit status {exit_code}"
    if not stdout or not stdout.strip():
        return "printed nothing"
    return ""


__all__ = [
    "HELP_ARG",
    "MULTI_SCHEMA_ARG",
    "Discovery",
    "FoundTool",
    "parse_help",
    "parse_multi_schema",
    "parse_schema_dump",
    "step_failure",
]
