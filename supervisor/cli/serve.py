"""``toolhost serve``: run the host in the foreground until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import logging
import signal
import sys

import trio

from supervisor.cli.common import EXIT_USAGE, app_root, die
from supervisor.registry.load import load_registry
from supervisor.runtime.host import Host, HostOptions
from supervisor.runtime.process import warden
from supervisor.server.stream import ConnectionLimits
from supervisor.server.systemd import Notifier
from supervisor.server.unix import SocketInUse, check_free, serve_unix
from supervisor.server.ws import load_or_create_token, parse_listen, serve_ws
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
    except SocketInUse as exc:
        return die(str(exc), 1)
    finally:
        warden().close()


async def _serve(args: argparse.Namespace) -> int:
    options = HostOptions(
        app_root=app_root(args),
        registry_path=args.registry,
        use_global=not args.no_global,
        log_format=getattr(args, "log_format", None),
    )
    host = Host(options)
    reg = load_registry(
        options.app_root, registry_path=args.registry, use_global=options.use_global
    )
    logs.configure(options.log_format or reg.host.log_format, host.services.redactor.text)
    if reg.missing:
        return die(f"registry {reg.missing} does not exist (named by --registry)", EXIT_USAGE)
    path = args.socket or reg.path(reg.host.socket)
    check_free(path)  # before anything starts: a second host must not disturb the first
    async with trio.open_nursery() as nursery:
        await nursery.start(host.run)
        reg = host.registry
        limits = ConnectionLimits(
            max_frame=reg.host.max_frame_bytes, max_connections=reg.host.max_connections
        )
        server_scope = trio.CancelScope()
        gateway_scope = trio.CancelScope()

        async def serve(task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
            with server_scope:
                await serve_unix(host, path, limits=limits, task_status=task_status)

        await nursery.start(serve)
        host.endpoints["unix"] = path
        ws = reg.host.ws
        if ws is not None:
            try:
                token = load_or_create_token(reg.path(ws.token_file))
            except (OSError, ValueError) as exc:
                log.error("WebSocket gateway disabled: %s", exc)
            else:

                async def serve_gateway(
                    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
                ) -> None:
                    with gateway_scope:
                        await serve_ws(
                            host, ws.listen, token, limits=limits, task_status=task_status
                        )

                port = await nursery.start(serve_gateway)
                bind, _ = parse_listen(ws.listen)
                host.endpoints["ws"] = f"ws://{bind}:{port}/ws"
                log.info(
                    "WebSocket gateway on %s (token in %s)", host.endpoints["ws"], ws.token_file
                )
        log.info(
            "toolhost serving %d sidecar(s) on %s (registry: %s)",
            len(host.plan.sidecars),
            path,
            ", ".join([*reg.files, *(f"{f} (not usable)" for f in reg.unusable)]) or "none",
        )
        notifier = Notifier()
        # The signal handlers are in place before READY: a SIGTERM right after it (systemd, a
        # test) must stop the host gracefully, not kill it with the default disposition.
        await nursery.start(_watch_signals, host, nursery.cancel_scope, notifier)
        notifier.ready(_status_line(host))
        nursery.start_soon(notifier.watchdog)
        nursery.start_soon(notifier.follow_status, lambda: _status_line(host), host.wait_change)
        # host.run returns once every pool has drained and stopped; then close the socket.
        await host.wait_stopped()
        server_scope.cancel()
        gateway_scope.cancel()
        nursery.cancel_scope.cancel()
    return 0


def _status_line(host: Host) -> str:
    """systemd's STATUS=: how many tools are available (and whether the host is ready)."""
    health = host.health()
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
