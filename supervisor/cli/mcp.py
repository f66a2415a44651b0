"""``toolhost mcp``: the host's tools as one MCP server, over stdio or Streamable HTTP.

Without ``--embedded`` it is a kernel client of a running host (its socket); with it, it runs the
host in-process on the app root (no socket file; each MCP session gets a socketpair into the
host's own connection handler). ``--http HOST:PORT`` serves Streamable HTTP instead of stdio.
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
from supervisor.cli.common import EXIT_FAILED, EXIT_USAGE, app_root, die, socket_path
from supervisor.client import open_client
from supervisor.host.host import Host, HostStartError, build_host
from supervisor.host.loading import HostOptions
from supervisor.mcp_face.face import Connect, embedded_connector, unix_connector
from supervisor.mcp_face.http import HealthHook, HttpLimits
from supervisor.registry.load import load_registry
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
            from supervisor.processes.child import warden

            warden().close()


async def _main(args: argparse.Namespace) -> int:
    reg = load_registry(app_root(args), registry_path=args.registry, use_global=not args.no_global)
    if reg.missing:
        return die(f"registry {reg.missing} does not exist (named by --registry)", EXIT_USAGE)
    if not args.embedded:
        path = socket_path(args)
        # Over HTTP the host may come later (sessions get 503 until it listens); on stdio a
        # front-end wants a clear message at once.
        if args.http is None and not os.path.exists(path):  # noqa: ASYNC240 - once, at start
            return die(f"no host listening on {path}: start `toolhost serve`, or use --embedded")
        # MCP server spans from this process when the registry turns telemetry on.
        tracing = telemetry.start(reg.host.telemetry.enabled)
        try:
            return await _serve(args, unix_connector(path), _socket_health(path), tracing)
        finally:
            if tracing is not None:
                with trio.CancelScope(shield=True), trio.move_on_after(5):
                    await trio.to_thread.run_sync(tracing.shutdown, abandon_on_cancel=True)
    options = HostOptions(
        app_root=app_root(args), registry_path=args.registry, use_global=not args.no_global
    )
    host = await build_host(options)
    async with trio.open_nursery() as nursery:
        try:
            await nursery.start(host.run)
        except HostStartError as exc:  # a symlinked audit log or token: one line, no traceback
            return die(str(exc), EXIT_FAILED)
        with trio.move_on_after(args.settle):
            await _settled(host)
        try:
            code = await _serve(
                args, embedded_connector(host, nursery), _host_health(host), host.telemetry
            )
        finally:
            host.stop()
            with trio.move_on_after(10):
                await host.wait_stopped()
            nursery.cancel_scope.cancel()
    return code


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
    args: argparse.Namespace, connect: Connect, health: HealthHook, tracing: Any = None
) -> int:
    if args.http is None:
        from supervisor.mcp_face.stdio import serve_mcp_stdio

        try:
            await serve_mcp_stdio(connect, tracing=tracing)
        except OSError as exc:
            return die(f"cannot reach the host: {exc}")
        return 0
    from supervisor.mcp_face.http import McpHttpServer
    from supervisor.private_files import read_token
    from supervisor.server.listen import ListenError
    from supervisor.server.ws import parse_listen

    try:
        parse_listen(args.http)
        token = read_token(
            args.token_file or os.path.join(app_root(args), ".toolhost", "mcp.token")
        )
    except (OSError, ValueError) as exc:
        return die(str(exc), EXIT_FAILED)
    server = McpHttpServer(
        connect,
        token,
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
        print(f"toolhost mcp: Streamable HTTP on http://{bind}:{port}/mcp", file=sys.stderr)
        sys.stderr.flush()
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                break
        nursery.cancel_scope.cancel()
    return 0


def _http_limits(args: argparse.Namespace) -> HttpLimits:
    """``--max-connections``, ``--header-timeout``, ``--idle-timeout`` over the defaults."""
    given = {
        "max_connections": args.max_connections,
        "header_timeout_s": args.header_timeout,
        "idle_timeout_s": args.idle_timeout,
    }
    return HttpLimits()._replace(**{k: v for k, v in given.items() if v is not None})
