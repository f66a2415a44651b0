"""``toolhost mcp``: the host's tools as one MCP server, over stdio or Streamable HTTP.

Without ``--embedded`` it is a kernel client of a running host (its socket): on stdio it hands its
stdin and stdout to the host (``mcp.adopt``), which serves the session in its own process, and
only waits (a terminal, ``--relay``, or a host that does not adopt: it relays the session
itself); with ``--embedded`` it runs the host in-process on the app root (no socket file; each
MCP session gets an in-memory kernel connection into the host). ``--http HOST:PORT``
serves Streamable HTTP instead of stdio.
``--tools PATTERNS`` or ``--profile NAME`` (``host.mcp.profiles``) limit what is served; over
HTTP every ``host.mcp.tokens`` entry is one more token with its own profile, and SIGHUP reads the
registry's ``host.mcp`` and the token files again (and, with ``--embedded``, reloads the host).
stdout is protocol on stdio, so logs go to stderr.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from typing import Any

import trio

from supervisor import telemetry
from supervisor.cli.common import (
    EXIT_FAILED,
    EXIT_USAGE,
    RootTaken,
    app_root,
    die,
    freeze_start_up,
    lock_root,
    serving_pid,
    socket_path,
)
from supervisor.client import open_client
from supervisor.host.host import Host, HostStartError, build_host
from supervisor.host.loading import HostOptions
from supervisor.mcp_face.face import Connect, embedded_connector, unix_connector
from supervisor.mcp_face.http import HealthHook, HttpLimits
from supervisor.mcp_face.profiles import Profile, from_patterns, named
from supervisor.packages.fsio import FileLock
from supervisor.registry.load import Registry, load_registry
from supervisor.server.health import http_answer

log = logging.getLogger("toolhost.mcp")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    try:
        return trio.run(_main, args)
    except KeyboardInterrupt:
        return 0
    finally:
        if args.embedded:
            from supervisor.processes.warden import process_warden

            process_warden().close()


async def _main(args: argparse.Namespace) -> int:
    reg = _registry(args)
    if reg.missing:
        return die(f"registry {reg.missing} does not exist (named by --registry)", EXIT_USAGE)
    for problem in reg.errors:
        if problem.startswith("host.mcp"):
            log.warning("registry: %s", problem)
    try:
        args.slice = cli_profile(args, reg)
    except (KeyError, ValueError) as exc:
        return die(str(exc.args[0]), EXIT_USAGE)
    if not args.embedded:
        path = socket_path(args)
        # Over HTTP the host may come later (sessions get 503 until it listens); on stdio a
        # front-end wants a clear message at once.
        if args.http is None and not os.path.exists(path):  # noqa: ASYNC240 - once, at start
            return die(f"no host listening on {path}: start `toolhost serve`, or use --embedded")
        if args.http is None:
            code = await _adopted(args, reg, path)
            if code is not None:
                return code
        # MCP server spans from this process when the registry turns telemetry on.
        tracing = telemetry.start(reg.host.telemetry.enabled)
        try:
            return await _serve(args, reg, unix_connector(path), _socket_health(path), tracing)
        finally:
            if tracing is not None:
                with trio.CancelScope(shield=True), trio.move_on_after(5):
                    await trio.to_thread.run_sync(tracing.shutdown, abandon_on_cancel=True)
    options = HostOptions(
        app_root=app_root(args), registry_path=args.registry, use_global=not args.no_global
    )
    try:  # one host per app root: not beside a `toolhost serve` of it, or another embedded one
        lock = await _lock_embedded(options.app_root)
    except RootTaken as exc:
        return die(str(exc), EXIT_FAILED)
    try:
        host = await build_host(options)
        async with trio.open_nursery() as nursery:
            try:
                await nursery.start(host.run)
            except HostStartError as exc:  # a symlinked audit log or token: one line, no traceback
                return die(str(exc), EXIT_FAILED)
            with trio.move_on_after(args.settle):
                await _settled(host)
            freeze_start_up()
            try:
                code = await _serve(
                    args,
                    reg,
                    embedded_connector(host, nursery),
                    _host_health(host),
                    host.telemetry,
                    host=host,
                )
            finally:
                host.stop()
                with trio.move_on_after(10):
                    await host.wait_stopped()
                nursery.cancel_scope.cancel()
    finally:
        if lock is not None:
            lock.release()
    return code


EMBEDDED_LOCK_WAIT_S = 15.0
"""How long ``--embedded`` waits for another embedded host of its app root to end: a front-end
restarting its MCP server starts the new one while the old one still stops (up to 10 s)."""


async def _lock_embedded(root: str) -> FileLock | None:
    """The app root's host lock for this embedded host: refused at once beside a ``toolhost
    serve`` (still starting, or serving), after :data:`EMBEDDED_LOCK_WAIT_S` beside another
    embedded host still running.

    Raises:
        RootTaken: Another host holds it (or the lock is a symlink).
    """
    advice = "Use `toolhost mcp` without --embedded to reach the running one, or stop it first"
    deadline = trio.current_time() + EMBEDDED_LOCK_WAIT_S
    while True:
        try:
            return lock_root(root, advice, "embedded")
        except RootTaken as exc:
            # A serve says so in the lock from its start; an older one only once serving.
            serve = exc.role == "serve" or str(serving_pid(root)) == exc.holder
            if not exc.holder or serve or trio.current_time() >= deadline:
                raise
        await trio.sleep(0.1)


async def _adopted(args: argparse.Namespace, reg: Registry, path: str) -> int | None:
    """Hand the stdio session to the host (``mcp.adopt``) and wait for its end; None when the
    relay must serve it (forced, a terminal, a host that does not adopt)."""
    from supervisor.mcp_face.handover import Refused, Relay, hand_over, wants_relay

    why = wants_relay(getattr(args, "relay", False))
    if why:
        log.debug("relaying the session: %s", why)
        return None
    params: dict[str, Any] = {"telemetry": reg.host.telemetry.enabled}
    if getattr(args, "tools", None) is not None:
        params["tools"] = args.tools
    elif getattr(args, "profile", None) is not None:
        params["profile"] = args.profile
    try:
        ended = await hand_over(path, params)
    except Relay as exc:
        log.debug("relaying the session: the host does not adopt it (%s)", exc)
        return None
    except Refused as exc:
        return die(exc.message, EXIT_USAGE if exc.code == "invalid-params" else EXIT_FAILED)
    except OSError as exc:
        return die(f"cannot reach the host: {exc}")
    if ended.reason in ("stdin-closed", "client-gone"):
        return 0
    if ended.reason == "host-stopped":
        log.warning("the host stopped; the MCP session ended")
        return 0
    if ended.reason == "connection-lost":
        return die("the host connection closed; the MCP session ended", EXIT_FAILED)
    return die(f"the host ended the MCP session: {ended.error or ended.reason}", EXIT_FAILED)


def _registry(args: argparse.Namespace) -> Registry:
    return load_registry(app_root(args), registry_path=args.registry, use_global=not args.no_global)


def cli_profile(args: argparse.Namespace, reg: Registry) -> Profile | None:
    """The profile ``--tools`` or ``--profile`` names (None: everything).

    Raises:
        KeyError: ``--profile`` names no profile of the registry.
        ValueError: ``--tools`` has no pattern.
    """
    if getattr(args, "tools", None) is not None:
        return from_patterns(args.tools)
    if getattr(args, "profile", None) is not None:
        return named(reg.host.mcp, args.profile)
    return None


async def _settled(host: Host) -> None:
    """Until no tool is ``runtime: starting`` (a front-end often lists tools only once)."""
    while any(d.stability.runtime == "starting" for d in host.catalog.tools()):
        await host.feed.wait_change()


def _host_health(host: Host) -> HealthHook:
    async def answer(path: str) -> tuple[int, bytes]:
        return http_answer(path, host.views.health())

    return answer


def _socket_health(sock: str) -> HealthHook:
    async def answer(path: str) -> tuple[int, bytes]:
        health = None
        with trio.move_on_after(5):
            try:
                async with open_client(sock, name="toolhost-mcp-health") as client:
                    health = await client.health()
            except Exception as exc:  # no host, lost connection: not live
                log.debug("health: %s", exc)
        return http_answer(path, health)

    return answer


async def _serve(
    args: argparse.Namespace,
    reg: Registry,
    connect: Connect,
    health: HealthHook,
    tracing: Any = None,
    *,
    host: Host | None = None,
) -> int:
    if args.http is None:
        from supervisor.mcp_face.stdio import serve_mcp_stdio

        try:
            await serve_mcp_stdio(connect, tracing=tracing, profile=args.slice)
        except OSError as exc:
            return die(f"cannot reach the host: {exc}")
        return 0
    from supervisor.mcp_face.auth import load_tokens
    from supervisor.mcp_face.http import McpHttpServer
    from supervisor.server.listen import ListenError
    from supervisor.server.ws import parse_listen

    default_file = args.token_file or os.path.join(app_root(args), ".toolhost", "mcp.token")
    try:
        parse_listen(args.http)
    except ValueError as exc:
        return die(str(exc), EXIT_FAILED)
    tokens, problems = load_tokens(default_file, args.slice, reg.host.mcp, reg.path)
    if problems:
        return die("; ".join(problems), EXIT_FAILED)
    server = McpHttpServer(
        connect,
        tokens,
        allowed_origins=set(args.allow_origin or []),
        health=health,
        tracing=tracing,
        limits=_http_limits(args),
    )
    async with trio.open_nursery() as nursery:
        try:
            port = await nursery.start(server.serve, args.http)
        except ListenError as exc:
            return die(str(exc), EXIT_FAILED)
        bind, _ = parse_listen(args.http)
        # Where the bearer token is: a first client needs it (the file is made at first start).
        print(
            f"toolhost mcp: Streamable HTTP on http://{bind}:{port}/mcp"
            f" (clients send Authorization: Bearer <the token in {default_file}>)",
            file=sys.stderr,
        )
        sys.stderr.flush()
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
            async for signum in signals:
                if signum != signal.SIGHUP:
                    break
                await _reload(args, server, default_file, host)
        nursery.cancel_scope.cancel()
    return 0


async def _reload(args: argparse.Namespace, server: Any, default_file: str, host: Any) -> None:
    """SIGHUP: ``host.mcp`` and every token file read again (the embedded host reloaded)."""
    from supervisor.mcp_face.auth import load_tokens

    if host is not None:
        result = await host.reload()
        log.warning("reload: %s", result.summary())
    reg = _registry(args)
    if reg.unreadable:
        log.warning("reload: the registry cannot be read; MCP tokens and profiles kept")
        return
    try:
        args.slice = cli_profile(args, reg)
    except (KeyError, ValueError) as exc:
        log.warning("reload: %s; the profile read before is kept", exc.args[0])
    tokens, problems = load_tokens(
        default_file, args.slice, reg.host.mcp, reg.path, previous=server.tokens
    )
    for problem in problems + [p for p in reg.errors if p.startswith("host.mcp")]:
        log.warning("reload: %s", problem)
    server.set_tokens(tokens)
    log.warning("reload: %d MCP token(s) accepted", len(tokens.tokens))


def _http_limits(args: argparse.Namespace) -> HttpLimits:
    """``--max-connections``, ``--header-timeout``, ``--idle-timeout`` over the defaults."""
    given = {
        "max_connections": args.max_connections,
        "header_timeout_s": args.header_timeout,
        "idle_timeout_s": args.idle_timeout,
    }
    return HttpLimits()._replace(**{k: v for k, v in given.items() if v is not None})
