"""Fractalic ``*.yaml`` tool manifests and CLI tools (PROTOCOL 3.3) as pure functions.

# Strategy: a manifest is read in two passes. First the YAML *event* stream (PyYAML's
# ``yaml.parse``, iterative, no object built) is walked with hard bounds: nesting depth, scalar
# size, and the number of nodes the document would expand to once aliases are followed (each
# anchor's subtree size is recorded when it closes, each alias adds it). Only a document inside
# those bounds is given to ``yaml.safe_load`` (plain data types only, no object construction), so
# deep nesting, alias bombs and huge scalars become a reported problem, never a RecursionError,
# a memory blow-up or a host crash. The loaded mapping is then validated field by field and
# *every* problem is collected, so an unusable manifest is one unavailable descriptor that names
# its file and all of its problems. CLI tools (``python-cli``/``bash-cli``) get their input as
# flags (``--field-name value``); their stdout is the answer (JSON, else ``{"result": text}``).
"""

from __future__ import annotations

import re
from typing import Any, Literal

import msgspec
import yaml

from supervisor.protocols.outcome import CallOutcome, describe_status, preview, raw_json

MAX_YAML_BYTES = 256 * 1024
"""A manifest larger than this is not read at all."""
MAX_DEPTH = 64
MAX_SCALAR = 64 * 1024
MAX_NODES = 20_000
"""Nodes the document may expand to, aliases followed (an alias bomb needs millions)."""
COMMANDS = ("simple-json", "python-cli", "bash-cli", "python", "mcp")
RouteKind = Literal["simple-json", "cli", "python", "unavailable"]


class Route(msgspec.Struct, frozen=True, kw_only=True):
    """How the folder's call site serves one tool that a manifest declared."""

    kind: RouteKind
    argv: list[str] = msgspec.field(default_factory=list)
    source: str = ""
    """The manifest (relative to the app root) the route comes from."""
    description: str = ""
    parameters: dict[str, Any] | None = None
    code: str = ""
    reason: str = ""
    hint: str = ""


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    """A validated manifest: what the YAML declared, once every field checked out."""

    name: str
    description: str
    command: str
    entry: str
    parameters: dict[str, Any] | None


def check_events(text: str) -> list[str]:
    """Bounds on the YAML event stream; the problems found (empty: safe to load).

    Also reports a syntax error as a problem (the event stream is the parser's).
    """
    depth = 0
    # One frame per open collection: [nodes counted inside it, anchor or None].
    stack: list[list[Any]] = []
    anchors: dict[str, int] = {}
    total = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            size = 0
            if isinstance(event, yaml.AliasEvent):
                if any(frame[1] == event.anchor for frame in stack):
                    # An alias inside its own anchor: a recursive document, which no JSON
                    # Schema can be (and whose encoding would never end).
                    return [f"the alias *{event.anchor} refers to a node that contains it"]
                size = anchors.get(event.anchor or "", 1)
            elif isinstance(event, yaml.ScalarEvent):
                if len(event.value) > MAX_SCALAR:
                    return [f"a scalar of {len(event.value)} characters (limit {MAX_SCALAR})"]
                size = 1
                if event.anchor:
                    anchors[event.anchor] = 1
            elif isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    return [f"nested deeper than {MAX_DEPTH} levels"]
                stack.append([1, event.anchor])
                continue
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
                count, anchor = stack.pop()
                if anchor:
                    anchors[anchor] = count
                size = count
                if not stack:
                    total += size
                    size = 0
            else:
                continue
            if stack:
                stack[-1][0] += size
                if stack[-1][0] > MAX_NODES:
                    return [f"expands to more than {MAX_NODES} nodes (aliases followed)"]
            else:
                total += size
            if total > MAX_NODES:
                return [f"expands to more than {MAX_NODES} nodes (aliases followed)"]
    except yaml.YAMLError as exc:
        return [f"bad YAML: {_one_line(str(exc))}"]
    except RecursionError:
        return [f"nested deeper than {MAX_DEPTH} levels"]
    return []


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]


def load_yaml(data: bytes) -> tuple[Any, list[str]]:
    """Safely load one manifest's bytes; ``(document, problems)``."""
    if len(data) > MAX_YAML_BYTES:
        return None, [f"{len(data)} bytes (limit {MAX_YAML_BYTES})"]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None, ["not UTF-8"]
    problems = check_events(text)
    if problems:
        return None, problems
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        return None, [f"bad YAML: {_one_line(str(exc))}"]
    except (RecursionError, ValueError, TypeError) as exc:
        return None, [f"bad YAML: {_one_line(str(exc))}"]
    # The manifest becomes JSON (descriptors, fingerprints): dates, sets and binary turn into
    # their JSON forms here, and what JSON cannot hold (a ``true`` or ``null`` mapping key) is a
    # problem now rather than a failure later.
    try:
        return msgspec.json.decode(msgspec.json.encode(doc)), []
    except (TypeError, ValueError, RecursionError, msgspec.MsgspecError) as exc:
        return None, [f"not representable as JSON: {_one_line(str(exc))}"]


def validate(doc: Any, stem: str, name_pattern: str) -> tuple[Manifest | None, str, list[str]]:
    """Check a loaded manifest; ``(manifest or None, tool name, every problem)``.

    The tool name is the manifest's ``name`` when usable, else the file's stem.
    """
    if not isinstance(doc, dict):
        return None, stem, ["the document is not a mapping of name, description, command, entry"]
    problems: list[str] = []
    name = doc.get("name", stem)
    if not isinstance(name, str) or not re.match(name_pattern, name):
        problems.append(f"name {preview(str(name).encode())!s} is not a valid tool name")
        name = stem
    description = doc.get("description", "")
    if not isinstance(description, str):
        problems.append("description must be a string")
        description = ""
    command = doc.get("command")
    if command is None:
        problems.append(f"command is missing (one of {', '.join(COMMANDS)})")
    elif command not in COMMANDS:
        problems.append(f"unknown command {command!r} (one of {', '.join(COMMANDS)})")
    entry = doc.get("entry")
    if entry is None or entry == "":
        problems.append("entry is missing")
    elif not isinstance(entry, str):
        problems.append("entry must be a string")
    elif command == "python" and not re.match(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", entry):
        problems.append(f"entry {entry!r} must be 'module:function' for command python")
    parameters = doc.get("parameters")
    if parameters is not None and (
        not isinstance(parameters, dict) or parameters.get("type", "object") != "object"
    ):
        problems.append("parameters must be a JSON Schema object ({type: object, ...})")
    if problems:
        return None, name, problems
    assert isinstance(command, str) and isinstance(entry, str)
    return (
        Manifest(
            name=name,
            description=description,
            command=command,
            entry=entry,
            parameters=parameters,
        ),
        name,
        [],
    )


def mcp_hint(name: str, entry: str) -> str:
    """The registry entry that would host an ``mcp`` manifest's server directly."""
    if entry.startswith(("http://", "https://")):
        sidecar: dict[str, Any] = {"protocol": "mcp-http", "url": entry}
    else:
        words = entry.split() or ["<server command>"]
        sidecar = {"command": words[0], "args": words[1:], "protocol": "mcp"}
    body = msgspec.json.encode({"sidecars": {name: sidecar}}).decode()
    return f"host the MCP server itself: add to tools/external.tools.jsonc {body}"


# CLI tools ---------------------------------------------------------------------------------


def cli_args(input_obj: Any) -> list[str] | str:
    """The flags for one call's input, or a message when the input cannot be flags.

    ``field_name: v`` -> ``--field-name v``; ``true`` -> bare flag; ``false``/``null`` omitted;
    a list repeats the flag per item; an object is passed as JSON text.
    """
    if not isinstance(input_obj, dict):
        return "the input must be a JSON object"
    out: list[str] = []
    for key, value in input_obj.items():
        flag = "--" + str(key).replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, list):
            for item in value:
                out += [flag, _text(item)]
        else:
            out += [flag, _text(value)]
    return out


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return msgspec.json.encode(value).decode()


def parse_cli_answer(tool: str, stdout: bytes, exit_code: int | None) -> CallOutcome:
    """A CLI tool's answer: stdout JSON, else ``{"result": text}``; a non-zero exit is failed."""
    text = stdout.strip()
    status = describe_status(exit_code)
    if exit_code is not None and exit_code < 0:
        return CallOutcome(
            ok=False, code="worker-crashed", error=f"{tool}: the script was {status}"
        )
    if exit_code != 0:
        said = f"; stdout: {preview(text)}" if text else ""
        return CallOutcome(
            ok=False, code="failed", error=f"{tool}: the script ended with {status}{said}"
        )
    if not text:
        return CallOutcome(ok=True, data=raw_json({"result": ""}))
    try:
        msgspec.json.decode(text)
        return CallOutcome(ok=True, data=msgspec.Raw(text))
    except (msgspec.DecodeError, RecursionError):  # RecursionError: nested too deeply
        return CallOutcome(ok=True, data=raw_json({"result": text.decode("utf-8", "replace")}))


__all__ = [
    "Manifest",
    "Route",
    "check_events",
    "cli_args",
    "load_yaml",
    "mcp_hint",
    "parse_cli_answer",
    "validate",
]
