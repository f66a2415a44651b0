"""``toolhost serve``: run the host in the foreground until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys

import trio

from supervisor.cli.common import (
    EXIT_USAGE,
    RootTaken,
    app_root,
    die,
    freeze_start_up,
    lock_root,
    remove_serving,
    write_serving,
)
from supervisor.host.host import Host, HostStartError, build_host
from supervisor.host.loading import HostOptions
from supervisor.mcp_face.adopted import McpAdopter
from supervisor.policy.redact import Redactor
from supervisor.private_files import TokenFile
from supervisor.processes.warden import process_warden
from supervisor.registry.load import Registry, load_registry
from supervisor.server.backend import Backend
from supervisor.server.listen import ListenError, first_listen_error, open_tcp
from supervisor.server.stream import ConnectionLimits
from supervisor.server.systemd import Notifier
from supervisor.server.unix import bind_unix, serve_unix
from supervisor.server.ws import parse_listen, serve_ws
from supervisor.telemetry import logs

log = logging.getLogger("toolhost")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    try:
        return trio.run(_serve, args)
    except (ListenError, BaseExceptionGroup) as exc:
        found = first_listen_error(exc)
        if found is None:
            raise
        return die(str(found), 1)
    finally:
        process_warden().close()


async def _serve(args: argparse.Namespace) -> int:
    options = HostOptions(
        app_root=app_root(args),
        registry_path=args.registry,
        use_global=not args.no_global,
        log_format=getattr(args, "log_format", None),
        socket=args.socket,
    )
    redactor = Redactor()
    reg = load_registry(
        options.app_root, registry_path=args.registry, use_global=options.use_global
    )
    logs.configure(options.log_format or reg.host.log_format, redactor.text)
    if reg.missing:
        return die(f"registry {reg.missing} does not exist (named by --registry)", EXIT_USAGE)
    path = args.socket or reg.path(reg.host.socket)
    # Every listener is opened before anything starts: a second host must not disturb the
    # first, and an address in use is one line naming it (ListenError), before any sidecar runs.
    unix_listener, ws_listeners = await _listen(
        path, "--socket" if args.socket else "host.socket", reg
    )
    # One host per app root (a second serve on another socket, an `mcp --embedded`).
    try:
        lock = lock_root(
            options.app_root, "Stop it first, or serve another folder (--app-root)", "serve"
        )
    except RootTaken as exc:
        await _unlisten(path, unix_listener, ws_listeners)
        return die(str(exc), 1)
    try:
        async with trio.open_nursery() as nursery:
            host = await build_host(options, redactor=redactor)
            try:
                await nursery.start(host.run)
            except HostStartError as exc:
                return die(str(exc), 1)
            backend = Backend.of(host)
            backend.adopter = McpAdopter(host, backend)  # mcp.adopt: stdio sessions served here
            reg = host.registry
            limits = ConnectionLimits(
                max_frame=reg.host.max_frame_bytes, max_connections=reg.host.max_connections
            )
            server_scope = trio.CancelScope()
            gateway_scope = trio.CancelScope()

            async def serve(task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
                with server_scope:
                    await serve_unix(
                        backend,
                        path,
                        limits=limits,
                        listener=unix_listener,
                        task_status=task_status,
                    )

            await nursery.start(serve)
            host.endpoints["unix"] = path
            ws = reg.host.ws
            if ws is not None:
                token = TokenFile(reg.path(ws.token_file))  # read now and at reload only
                try:
                    token.load()
                    host.tokens.add("gateway", token)
                except (OSError, ValueError) as exc:
                    log.error("WebSocket gateway disabled: %s", exc)
                else:

                    async def serve_gateway(
                        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
                    ) -> None:
                        with gateway_scope:
                            await serve_ws(
                                backend,
                                ws.listen,
                                token,
                                limits=limits,
                                listeners=ws_listeners,
                                task_status=task_status,
                            )

                    port = await nursery.start(serve_gateway)
                    bind, _ = parse_listen(ws.listen)
                    host.endpoints["ws"] = f"ws://{bind}:{port}/ws"
                    log.info(
                        "WebSocket gateway on %s, web console on http://%s:%s/ (token in %s)",
                        host.endpoints["ws"],
                        bind,
                        port,
                        ws.token_file,
                    )
            if "ws" not in host.endpoints:  # the gateway stayed off: free its port
                for listener in ws_listeners or []:
                    await listener.aclose()
            log.info(
                "toolhost serving %d sidecar(s) on %s (registry: %s)",
                len(host.plan.sidecars),
                path,
                ", ".join([*reg.files, *(f"{f} (not usable)" for f in reg.unusable)]) or "none",
            )
            try:  # the CLI finds this host even after host.socket was edited
                write_serving(options.app_root, host.endpoints)
            except OSError as exc:
                log.warning("cannot record the endpoints in .toolhost/serving.json: %s", exc)
            freeze_start_up()
            notifier = Notifier()
            # The signal handlers are in place before READY: a SIGTERM right after it (systemd, a
            # test) must stop the host gracefully, not kill it with the default disposition.
            await nursery.start(_watch_signals, host, nursery.cancel_scope, notifier)
            notifier.ready(_status_line(host))
            nursery.start_soon(notifier.watchdog)
            nursery.start_soon(
                notifier.follow_status, lambda: _status_line(host), host.feed.wait_change
            )
            # host.run returns once every pool has drained and stopped; then close the socket.
            try:
                await host.wait_stopped()
            finally:
                remove_serving(options.app_root)
            server_scope.cancel()
            gateway_scope.cancel()
            nursery.cancel_scope.cancel()
    finally:
        if lock is not None:
            lock.release()
    return 0


async def _listen(
    path: str, setting: str, reg: Registry
) -> tuple[trio.SocketListener, list[trio.SocketListener] | None]:
    """The kernel socket and, when ``host.ws`` is set, the gateway's TCP listeners.

    Raises:
        ListenError: One of them cannot be opened (nothing stays bound then).
    """
    unix_listener = await bind_unix(path, setting)
    if reg.host.ws is None:
        return unix_listener, None
    try:
        try:
            bind, port = parse_listen(reg.host.ws.listen)
        except ValueError as exc:
            raise ListenError(f"cannot listen ({exc})") from exc
        return unix_listener, await open_tcp(bind, port, "host.ws.listen")
    except BaseException:
        await _unlisten(path, unix_listener, None)
        raise


async def _unlisten(
    path: str, unix_listener: trio.SocketListener, ws_listeners: list[trio.SocketListener] | None
) -> None:
    """Close what :func:`_listen` opened and remove the socket file."""
    for listener in [unix_listener, *(ws_listeners or [])]:
        await listener.aclose()
    with contextlib.suppress(OSError):
        os.unlink(path)


def _status_line(host: Host) -> str:
    """systemd's STATUS=: how many tools are available (and whether the host is ready)."""
    health = host.views.health()
    ready = "" if health.ready else "; not ready (a critical sidecar is down)"
    return f"{health.tools.available} tools available{ready}"


async def _watch_signals(
    host: Host,
    scope: trio.CancelScope,
    notifier: Notifier,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """SIGHUP reloads; the first SIGINT/SIGTERM stops gracefully, a second one at once."""
    stopping = False
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        task_status.started()
        async for signum in signals:
            if signum == signal.SIGHUP:
                result = await host.reload()
                log.info("reload: %s", result.summary())
                continue
            if stopping:
                log.warning("second signal: stopping at once")
                scope.cancel()
                return
            stopping = True
            notifier.notify("STOPPING=1")
            log.info("stopping (%s): draining calls", signal.Signals(signum).name)
            host.stop()
