"""``toolhost``: serve the host, and operate a running one."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from supervisor import __version__
from supervisor.cli.common import EXIT_USAGE, add_location_args


def _lazy(module: str, func: str = "run") -> Callable[[argparse.Namespace], int]:
    """Import a command's module only when it runs (keeps ``toolhost --help`` fast)."""

    def call(args: argparse.Namespace) -> int:
        import importlib

        return int(getattr(importlib.import_module(module), func)(args))

    return call


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


def _name_value(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="toolhost",
        description="A resident tool host: supervised sidecar worker pools for an agent kernel.",
    )
    parser.add_argument("--version", action="version", version=f"toolhost {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("serve", help="run the host in the foreground")
    add_location_args(p)
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=None,
        help="log lines as text or one JSON object each (default: host.logFormat, else text)",
    )
    p.set_defaults(func=_lazy("supervisor.cli.serve"))

    p = sub.add_parser("status", help="sidecars and tools of the running host")
    add_location_args(p)
    p.add_argument("--json", action="store_true", help="print the catalog as JSON")
    p.add_argument("--watch", action="store_true", help="redraw on every change")
    p.set_defaults(func=_lazy("supervisor.cli.ops", "status"))

    p = sub.add_parser("catalog", help="every tool descriptor with reasons and hints")
    add_location_args(p)
    p.add_argument("--json", action="store_true", help="print the descriptors as JSON")
    p.set_defaults(func=_lazy("supervisor.cli.ops", "catalog"))

    p = sub.add_parser("restart", help="replace a sidecar's workers")
    add_location_args(p)
    p.add_argument("sidecar")
    p.add_argument(
        "--force", action="store_true", help="restart even with calls running (they fail)"
    )
    p.set_defaults(func=_lazy("supervisor.cli.ops", "restart"))

    p = sub.add_parser("approve", help="grant (or --deny) a call waiting for an operator")
    p.add_argument("call_id", metavar="CALL_ID", help="the id `toolhost status` lists")
    p.add_argument("--deny", action="store_true", help="refuse the call instead")
    p.add_argument("--by", help="who decides (default: $USER)")
    add_location_args(p)
    p.set_defaults(func=_lazy("supervisor.cli.ops", "approve"))

    p = sub.add_parser("logs", help="a sidecar's stderr tail")
    add_location_args(p)
    p.add_argument("sidecar")
    p.add_argument("--bytes", type=int, default=64 * 1024, help="at most this much (max 64 KiB)")
    p.set_defaults(func=_lazy("supervisor.cli.ops", "logs"))

    p = sub.add_parser("stats", help="accounting per sidecar and tool")
    add_location_args(p)
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true")
    fmt.add_argument(
        "--prometheus", action="store_true", help="Prometheus text exposition format 0.0.4"
    )
    p.set_defaults(func=_lazy("supervisor.cli.ops", "stats"))

    p = sub.add_parser("resources", help="hosted MCP resources and templates, or read one")
    add_location_args(p)
    p.add_argument("uri", nargs="?", help="read this resource")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_lazy("supervisor.cli.ops", "resources"))

    p = sub.add_parser("prompts", help="hosted MCP prompts, or get one")
    add_location_args(p)
    p.add_argument("name", nargs="?", help="get this prompt")
    p.add_argument(
        "--arg", action="append", type=_name_value, metavar="NAME=VALUE", help="a prompt argument"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_lazy("supervisor.cli.ops", "prompts"))

    p = sub.add_parser("reload", help="re-read the registry (like SIGHUP)")
    add_location_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_lazy("supervisor.cli.ops", "reload"))

    p = sub.add_parser("doctor", help="start each sidecar once and explain what is wrong")
    add_location_args(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("--timeout", type=float, default=15.0, help="seconds to wait for sidecars")
    p.set_defaults(func=_lazy("supervisor.cli.doctor"))

    p = sub.add_parser("init", help="write tools/external.tools.jsonc for the bundled sidecars")
    add_location_args(p)
    p.add_argument("--force", action="store_true", help="overwrite an existing registry")
    p.add_argument("--stdout", action="store_true", help="print instead of writing")
    p.add_argument(
        "--add",
        action="append",
        default=[],
        metavar="FAMILY",
        help="also register an opt-in bundled family (e.g. browser); adds to an existing registry",
    )
    p.set_defaults(func=_lazy("supervisor.cli.init"))

    p = sub.add_parser("invoke", help="invoke a tool and print the result envelope")
    add_location_args(p)
    p.add_argument("tool", help="tool name, e.g. file.hash")
    p.add_argument("input", nargs="?", default="{}", help="input JSON object ('-' reads stdin)")
    p.add_argument("--timeout", type=int, metavar="MS", help="per-call deadline in milliseconds")
    p.add_argument("--approve", metavar="BY", help="grant approval for approval-required tools")
    p.add_argument("--stream", action="store_true", help="print progress events as they come")
    p.add_argument("--content", action="store_true", help="print only the content text")
    p.set_defaults(func=_lazy("supervisor.cli.ops", "invoke"))

    p = sub.add_parser("state", help="durable sidecar state: list, get, delete")
    st = p.add_subparsers(dest="state_command", metavar="ACTION", required=True)
    q = st.add_parser("list", help="stores and their key counts (keys too, with NAME)")
    add_location_args(q)
    q.add_argument("name", nargs="?", help="a store name")
    for action in ("get", "delete"):
        q = st.add_parser(action, help=f"{action} one key")
        add_location_args(q)
        q.add_argument("name", help="the store name (as declared)")
        q.add_argument("key")
        q.add_argument(
            "--scope",
            default="shared:",
            help="shared:<scopeId> (default: shared:) or session:<session id>",
        )
    p.set_defaults(func=_lazy("supervisor.cli.stores", "state"))

    p = sub.add_parser("vault", help="secrets for sidecars: set (value from stdin), list, delete")
    vt = p.add_subparsers(dest="vault_command", metavar="ACTION", required=True)
    q = vt.add_parser("set", help="store KEY; the value is read from stdin, never argv")
    add_location_args(q)
    q.add_argument("key")
    q.add_argument("--scope", choices=("shared", "profile"), default="shared")
    q = vt.add_parser("list", help="keys only, never values")
    add_location_args(q)
    q = vt.add_parser("delete", help="remove KEY")
    add_location_args(q)
    q.add_argument("key")
    q.add_argument("--scope", choices=("shared", "profile"), default=None)
    p.set_defaults(func=_lazy("supervisor.cli.stores", "vault"))

    p = sub.add_parser("pkg", help="external tool packages: stage, apply, rollback, status")
    pkg = p.add_subparsers(dest="pkg_command", metavar="ACTION")
    q = pkg.add_parser("stage", help="verify a package (folder or .tar.gz) and stage it")
    q.add_argument("source", help="package folder or .tar.gz")
    q = pkg.add_parser("apply", help="apply the staged version of a package")
    q.add_argument("id", help="package id")
    q.add_argument(
        "--auto-rollback",
        action="store_true",
        help="restore the previous version if the new one fails its start or probe",
    )
    q = pkg.add_parser("rollback", help="restore the previous version of a package")
    q.add_argument("id", help="package id")
    q.add_argument("--yes", action="store_true", help="confirm: rolling back is your decision")
    q = pkg.add_parser("status", help="packages, versions, upgrade states, what is staged")
    for action in ("stage", "apply", "rollback", "status"):
        q = pkg.choices[action]
        add_location_args(q)
        q.add_argument("--json", action="store_true", help="print the result as JSON")
        q.set_defaults(func=_lazy("supervisor.cli.pkg", action))
    q = pkg.add_parser("checksum", help="print (or --write) a package folder's payload checksum")
    q.add_argument("folder", help="package folder")
    q.add_argument("--write", action="store_true", help="write it into package.toml")
    q.set_defaults(func=_lazy("supervisor.cli.pkg", "checksum"))

    p = sub.add_parser("bench", help="the latency bench: toolhost against baselines, one run")
    p.add_argument("--quick", action="store_true", help="smoke run: few calls, well under 30 s")
    p.add_argument("--out", type=Path, help="JSON record (default bench/out/last.json)")
    p.add_argument("--plot", type=Path, help="latency CDFs as PNG (needs the 'bench' extra)")
    p.add_argument("--calls", type=int, help="calls per latency row (default 10000)")
    p.add_argument("--only", nargs="+", metavar="SCENARIO", help="run only these scenarios")
    p.add_argument("--profile", type=Path, help="py-spy profile of the host (.svg/.json/.txt)")
    p.add_argument(
        "--against", type=Path, metavar="TREE", help="compare: the other checkout (its .venv)"
    )
    p.add_argument("--rounds", type=int, default=4, help="compare: rounds (default 4)")
    p.set_defaults(func=_lazy("bench.cli"))

    p = sub.add_parser("health", help="liveness/readiness probe: exit code and one JSON line")
    add_location_args(p)
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--live", action="store_true", help="the host answers (default)")
    kind.add_argument(
        "--ready", action="store_true", help="live, and every critical sidecar available"
    )
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for an answer")
    p.set_defaults(func=_lazy("supervisor.cli.health"))

    p = sub.add_parser("mcp", help="serve the host's tools as an MCP server (stdio or HTTP)")
    add_location_args(p)
    p.add_argument(
        "--embedded", action="store_true", help="run the host in-process instead of connecting"
    )
    p.add_argument("--http", metavar="HOST:PORT", help="serve Streamable HTTP on HOST:PORT")
    p.add_argument(
        "--relay",
        action="store_true",
        help="stdio: relay the session to the host instead of handing it over (also "
        "TOOLHOST_MCP_RELAY=1)",
    )
    p.add_argument(
        "--settle",
        type=float,
        default=10.0,
        metavar="S",
        help="--embedded: wait up to S seconds for sidecars to finish starting (default 10)",
    )
    p.add_argument(
        "--token-file",
        help="bearer token file for --http (default <app-root>/.toolhost/mcp.token, created 0600)",
    )
    slice_ = p.add_mutually_exclusive_group()
    slice_.add_argument(
        "--tools",
        metavar="PATTERNS",
        help="serve only these tools (shell-style, comma-separated, e.g. 'web.*,file.hash')",
    )
    slice_.add_argument(
        "--profile",
        metavar="NAME",
        help="serve only what host.mcp.profiles.NAME shows (with --http: to --token-file's "
        "clients; host.mcp.tokens give others theirs)",
    )
    p.add_argument(
        "--allow-origin",
        action="append",
        metavar="ORIGIN",
        help="accept this Origin besides loopback ones (repeatable)",
    )
    p.add_argument(
        "--max-connections",
        type=_positive_int,
        metavar="N",
        help="--http: open connections at once, past it 503 (default 1024, at most half ulimit -n)",
    )
    p.add_argument(
        "--header-timeout",
        type=_positive_float,
        metavar="S",
        help="--http: a request head must arrive within S seconds, else 408 and closed (10)",
    )
    p.add_argument(
        "--idle-timeout",
        type=_positive_float,
        metavar="S",
        help="--http: close a kept-alive connection idle (or a body stalled) for S seconds (60)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging on stderr")
    p.set_defaults(func=_lazy("supervisor.cli.mcp"))

    p = sub.add_parser("dev", help="developer tasks: generated files")
    dev = p.add_subparsers(dest="dev_command", metavar="TASK")
    for name, helptext in (
        ("schemas", "JSON Schemas of the contracts in manifests/schema/"),
        ("manifests", "manifests/*.toml of the bundled SDK sidecars"),
    ):
        q = dev.add_parser(name, help=helptext)
        mode = q.add_mutually_exclusive_group()
        mode.add_argument("--write", action="store_true", help="write the files")
        mode.add_argument("--check", action="store_true", help="fail if the files are stale")
        q.set_defaults(func=_lazy("supervisor.cli.dev", name))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        code = int(func(args))
        sys.stdout.flush()  # here, not at exit, so a closed pipe is caught below
        return code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `toolhost stats | head`: the reader has gone, nothing went wrong
        # Python flushes stdout again at exit; point it at /dev/null so that stays quiet too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141  # what a shell reports for a writer ended by SIGPIPE
    except Exception as exc:  # never a traceback for the operator (TOOLHOST_DEBUG=1 shows it)
        if os.environ.get("TOOLHOST_DEBUG"):
            raise
        print(
            f"toolhost: internal error: {type(exc).__name__}: {exc} "
            "(set TOOLHOST_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
