"""Discovery of an autodiscovered script (PROTOCOL 3.3): run the steps, cache what they found.

# Strategy: a simple-json folder's discovery (``folder_discovery.py``) asks each script, in
# order, the simple-json probe, ``--fractalic-dump-multi-schema``, ``--fractalic-dump-schema``
# and ``--help``, each run with its own short deadline (the folder's probe timeout), and keeps
# the first usable answer (judged by
# :mod:`supervisor.protocols.fractalic_discovery`). What a script answered depends only on the
# script, so the result is cached in the host's memory under the script's command line, size and
# mtime: a reload that restarts a folder because one script changed re-runs only that script.
# A result in which a step timed out or could not run is never cached (a busy machine is not a
# property of the script). The cache is bounded (least recently used entries leave first).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from supervisor.protocols import fractalic_discovery as fd
from supervisor.protocols import simple_json
from supervisor.protocols.fractalic_discovery import Discovery, DiscoveryRoute, FoundTool

PROBE_TRIES = 2
"""Tries of a simple-json probe that times out (a busy machine can delay a start)."""
CACHE_LIMIT = 4096


class Ran(msgspec.Struct, frozen=True, kw_only=True):
    """What one discovery run printed."""

    output: bytes
    exit_code: int | None
    stderr: str = ""


class CannotRun(Exception):
    """The script could not be executed at all."""


Runner = Callable[[list[str]], Awaitable[Ran | None]]
"""Runs an argv to its end within the probe deadline; None when it timed out.

Raises :class:`CannotRun` when the program cannot be executed."""


class ProbeCache:
    """Discovery results by ``(what, argv, size, mtime_ns, timeout)``; bounded, LRU."""

    def __init__(self, limit: int = CACHE_LIMIT) -> None:
        self.limit = limit
        self._entries: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple[Any, ...] | None) -> Any:
        if key is None or key not in self._entries:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return self._entries[key]

    def put(self, key: tuple[Any, ...] | None, value: Any) -> None:
        if key is None:
            return
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.limit:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()


CACHE = ProbeCache()
"""One per host process: results are facts about files, valid for any folder that runs them."""


def cache_key(what: str, argv: list[str], timeout_ms: int) -> tuple[Any, ...] | None:
    """The key of a script's result: its file's size and mtime (None: the file is gone)."""
    try:
        st = os.stat(argv[-1])
    except (OSError, IndexError):
        return None
    return (what, tuple(argv), st.st_size, st.st_mtime_ns, timeout_ms)


async def _step(run: Runner, argv: list[str], ms: int) -> tuple[bytes | None, str, bool]:
    """``(output to parse or None, why none, transient)`` of one introspection run."""
    try:
        ran = await run(argv)
    except CannotRun as exc:
        return None, str(exc), True
    why = fd.step_failure(
        ran.exit_code if ran else None, ran.output if ran else None, ran is None, ms
    )
    if why:
        return None, why, ran is None
    assert ran is not None
    return ran.output, "", False


async def _probe(run: Runner, argv: list[str], ms: int) -> tuple[simple_json.ProbeVerdict, bool]:
    """The simple-json probe's verdict, and whether it is transient (timed out, cannot run)."""
    ran: Ran | None = None
    try:
        for _ in range(PROBE_TRIES):
            ran = await run([*argv, simple_json.TEST_ARG])
            if ran is not None:
                break
    except CannotRun as exc:
        return simple_json.ProbeVerdict(ok=False, code="probe-error", message=str(exc)), True
    if ran is None:
        verdict = simple_json.judge_probe(b"", None, timed_out=True, timeout_ms=ms)
        return verdict, True
    verdict = simple_json.judge_probe(ran.output, ran.exit_code, timed_out=False, timeout_ms=ms)
    if not verdict.ok and ran.stderr:
        tail = ran.stderr.strip().splitlines()[-1:]
        if tail:
            message = f"{verdict.message}; stderr: {tail[0][:200]}"
            verdict = msgspec.structs.replace(verdict, message=message)
    return verdict, False


async def discover(
    run: Runner,
    argv: list[str],
    *,
    name: str,
    where: str,
    timeout_ms: int,
    name_pattern: str,
    multi: bool = True,
) -> Discovery:
    """Ask one script the discovery questions in order (cached while the script is unchanged).

    Args:
        run: Runs an introspection command line (see :data:`Runner`).
        argv: How to run the script (interpreter and path, or the path).
        name: The tool name a single-tool script gets (its file's stem).
        where: The script for messages (relative to the app root).
        timeout_ms: Each step's own deadline.
        name_pattern: Valid tool names (multi-schema entries are checked against it).
        multi: Ask ``--fractalic-dump-multi-schema`` (only autodiscovered folders may publish
            tools the registry does not list).
    """
    key = cache_key("discover" if multi else "discover-single", argv, timeout_ms)
    cached = CACHE.get(key)
    if isinstance(cached, Discovery):  # the tool name is the file's stem: part of the key
        return cached
    found = await _discover(
        run, argv, name=name, where=where, ms=timeout_ms, pattern=name_pattern, multi=multi
    )
    if not found.transient:
        CACHE.put(key, found)
    return found


async def _discover(
    run: Runner, argv: list[str], *, name: str, where: str, ms: int, pattern: str, multi: bool
) -> Discovery:
    verdict, transient = await _probe(run, argv, ms)
    if verdict.ok:
        dump, _why, flaky = await _step(run, [*argv, simple_json.DUMP_SCHEMA_ARG], ms)
        info = simple_json.tool_info(name, dump, f"simple-json script {where}")
        tool = FoundTool(
            name=name,
            description=info.description,
            schema=info.inputSchema,
            kind="simple-json",
            argv=list(argv),
        )
        return Discovery(route="simple-json", verdict=verdict, tools=[tool], transient=flaky)
    steps = [f"simple-json probe: {verdict.message}"]
    if transient:  # could not run, or no answer in time: asking more would only wait longer
        steps.append(STOPPED)
        return Discovery(route="none", verdict=verdict, steps=steps, transient=True)
    order: list[tuple[DiscoveryRoute, str]] = [
        ("multi-schema", fd.MULTI_SCHEMA_ARG),
        ("schema-dump", simple_json.DUMP_SCHEMA_ARG),
        ("help", fd.HELP_ARG),
    ]
    for route, arg in order if multi else order[1:]:
        out, why, flaky = await _step(run, [*argv, arg], ms)
        if out is not None:
            found = _judge(route, out, argv, name=name, where=where, pattern=pattern)
            if not isinstance(found, str):
                tools, notes = found
                return Discovery(
                    route=route, verdict=verdict, tools=tools, steps=steps, notes=notes
                )
            why = found
        steps.append(f"{arg}: {why}")
        if flaky:
            steps.append(STOPPED)
            return Discovery(route="none", verdict=verdict, steps=steps, transient=True)
    return Discovery(route="none", verdict=verdict, steps=steps)


STOPPED = "the later steps were not tried (a script that does not answer in time is not asked more)"


def _judge(
    route: DiscoveryRoute, out: bytes, argv: list[str], *, name: str, where: str, pattern: str
) -> tuple[list[FoundTool], list[str]] | str:
    """What one step's output gives: ``(tools, notes)``, or why it gives none."""
    if route == "multi-schema":
        return fd.parse_multi_schema(out, argv, pattern, where)
    parse = fd.parse_schema_dump if route == "schema-dump" else fd.parse_help
    found = parse(out, name, argv, where)
    return found if isinstance(found, str) else ([found], [])


async def read_help(
    run: Runner, argv: list[str], *, name: str, where: str, timeout_ms: int
) -> FoundTool | None:
    """A CLI manifest's schema from its entry's ``--help`` (cached like :func:`discover`)."""
    key = cache_key("help", argv, timeout_ms)
    cached = CACHE.get(key)
    if isinstance(cached, FoundTool):
        return cached if cached.name == name else msgspec.structs.replace(cached, name=name)
    if cached == "none":
        return None
    out, _why, flaky = await _step(run, [*argv, fd.HELP_ARG], timeout_ms)
    found = fd.parse_help(out, name, argv, where) if out is not None else None
    result = found if isinstance(found, FoundTool) else None
    if not flaky:
        CACHE.put(key, result if result is not None else "none")
    return result
