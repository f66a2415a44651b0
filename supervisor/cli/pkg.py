"""``toolhost pkg``: stage, apply, roll back and list external tool packages.

With a host serving the app root, each command asks it (``packages.*`` over the socket): the host
drains and restarts only that sidecar and verifies the new version. With none, the command runs
the transaction itself and the next ``toolhost serve`` verifies it. Either way an interrupted
earlier apply or rollback is recovered first.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import trio

from supervisor.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, app_root, die, socket_path
from supervisor.cli.render import table
from supervisor.client import ConnectionLost, RpcError, open_client, single_leaf
from supervisor.contracts.packages import ApplyResult, PackagesStatus, StageResult
from supervisor.packages.errors import PackageError
from supervisor.packages.fsio import LockBusy
from supervisor.packages.manager import PackageManager, Transaction

T = TypeVar("T")

NO_HOST_NOTE = (
    "no host is running: it is installed, and the next `toolhost serve` starts and verifies it"
)


class _NoHost(Exception):
    pass


def _ask_host(args: argparse.Namespace, method: str, params: dict[str, Any]) -> Any:
    """The running host's answer; raises :class:`_NoHost` when nothing serves the socket."""
    path = socket_path(args)

    async def main() -> Any:
        async with open_client(path, name="toolhost-pkg") as client:
            return await client.request(method, params)

    try:
        try:
            return trio.run(main)
        except BaseExceptionGroup as group:
            raise single_leaf(group) from None
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        raise _NoHost from exc


def _manager(args: argparse.Namespace) -> PackageManager:
    return PackageManager(app_root(args), registry_path=getattr(args, "registry", None))


def _direct(
    args: argparse.Namespace,
    op: Callable[[PackageManager, list[str]], T],
    *,
    creates: bool,
    precheck: Callable[[PackageManager], None] | None = None,
    readonly: bool = False,
) -> T:
    """Run ``op`` on this process's own manager, under its lock, after recovery."""
    mgr = _manager(args)
    if not mgr.exists():
        if not creates:
            return op(mgr, [])  # nothing to lock or recover, and nothing to create
        if precheck is not None:
            precheck(mgr)  # a refusal must not leave even the lock file behind
    try:
        mgr.lock.acquire()
    except LockBusy as exc:
        raise PackageError("busy", str(exc)) from exc
    try:
        # Only a command that cannot be refused rewrites .next (a refusal changes no file).
        recovered = mgr.recover(refresh_next=readonly)
        for line in recovered:
            print(f"toolhost: recovered: {line}", file=sys.stderr)
        return op(mgr, recovered)
    finally:
        mgr.lock.release()


def _run(
    args: argparse.Namespace,
    method: str,
    params: dict[str, Any],
    local: Callable[[PackageManager, list[str]], T],
    result_type: type[T],
    show: Callable[[T], int],
    *,
    creates: bool = False,
    precheck: Callable[[PackageManager], None] | None = None,
    readonly: bool = False,
) -> int:
    try:
        try:
            result = msgspec.convert(_ask_host(args, method, params), result_type)
        except _NoHost:
            result = _direct(args, local, creates=creates, precheck=precheck, readonly=readonly)
    except PackageError as exc:
        return _refused(exc.code, exc.message, exc.problems)
    except RpcError as exc:
        data = exc.data if isinstance(exc.data, dict) else {}
        return _refused(data.get("reason") or exc.code, exc.message, data.get("problems") or [])
    except ConnectionLost:
        return die("the host closed the connection")
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(msgspec.to_builtins(result), indent=2) + "\n")
        return _exit_code(result)
    return show(result)


def _refused(code: str, message: str, problems: list[str]) -> int:
    lines = [f"toolhost: {code}: {message}"]
    lines += [f"  - {p}" for p in problems if p != message]
    print("\n".join(lines), file=sys.stderr)
    return EXIT_FAILED


def _exit_code(result: Any) -> int:
    if isinstance(result, ApplyResult) and (
        result.upgrade in ("rollback-required", "failed") or result.rolledBack
    ):
        return EXIT_FAILED
    return EXIT_OK


# commands ----------------------------------------------------------------------------------


def stage(args: argparse.Namespace) -> int:
    source = os.path.abspath(args.source)

    def show(r: StageResult) -> int:
        print(f"staged {r.id} {r.version} in {r.staged} (installed: {r.installed or 'none'})")
        if r.replaced:
            print(f"  replaces the staged {r.replaced}")
        print(f"  apply it with: toolhost pkg apply {r.id}")
        return EXIT_OK

    return _run(
        args,
        "packages.stage",
        {"source": source},
        lambda mgr, _: mgr.stage(source),
        StageResult,
        show,
        creates=True,
        precheck=lambda mgr: mgr.check_stage(source),
    )


def _show_apply(r: ApplyResult) -> int:
    verb = "rolled back" if r.op == "rollback" else "applied"
    print(f"{verb} {r.id} {r.fromVersion or '(none)'} -> {r.toVersion}: upgrade {r.upgrade}")
    if r.rolledBack:
        print("  the new version failed and the previous one was restored (--auto-rollback)")
    if r.message:
        print(f"  {r.message}")
    return _exit_code(r)


def _execute(mgr: PackageManager, txn: Transaction) -> ApplyResult:
    """Run a transaction without a host: installed now, verified by the next host start."""
    mgr.execute(txn)
    j = txn.journal
    return ApplyResult(
        id=j.id,
        op=j.op,
        fromVersion=j.fromVersion,
        toVersion=j.toVersion,
        upgrade="applying",
        verified=False,
        message=NO_HOST_NOTE,
    )


def apply(args: argparse.Namespace) -> int:
    def local(mgr: PackageManager, _: list[str]) -> ApplyResult:
        return _execute(mgr, mgr.prepare_apply(args.id, auto_rollback=args.auto_rollback))

    return _run(
        args,
        "packages.apply",
        {"id": args.id, "autoRollback": args.auto_rollback},
        local,
        ApplyResult,
        _show_apply,
    )


def rollback(args: argparse.Namespace) -> int:
    if not args.yes:
        return die(
            f"rolling {args.id} back to its previous version is an operator decision: "
            "re-run with --yes",
            EXIT_USAGE,
        )

    def local(mgr: PackageManager, _: list[str]) -> ApplyResult:
        return _execute(mgr, mgr.prepare_rollback(args.id))

    return _run(
        args,
        "packages.rollback",
        {"id": args.id, "confirm": True},
        local,
        ApplyResult,
        _show_apply,
    )


def status_text(st: PackagesStatus) -> str:
    """The ``toolhost pkg status`` screen."""
    parts = []
    if st.recovered:
        parts.append("recovered:\n" + "\n".join(f"  - {r}" for r in st.recovered))
    if st.transaction is not None:
        t = st.transaction
        parts.append(
            f"in progress: {t.op} {t.id} {t.fromVersion or '(none)'} -> {t.toVersion}"
            + (" (committed)" if t.committed else "")
        )
    if not st.packages:
        parts.append("no packages under tools/packages")
        return "\n\n".join(parts)
    rows = [
        [
            p.id,
            p.installed or "-",
            p.upgrade,
            p.staged or "-",
            p.previous or "-",
            ",".join(p.tools) or "-",
            p.message,
        ]
        for p in st.packages
    ]
    parts.append(
        table(["PACKAGE", "INSTALLED", "UPGRADE", "STAGED", "PREVIOUS", "TOOLS", "NOTE"], rows)
    )
    problems = [f"  - {p.id}: {msg}" for p in st.packages for msg in p.problems]
    if problems:
        parts.append("problems:\n" + "\n".join(problems))
    return "\n\n".join(parts)


def status(args: argparse.Namespace) -> int:
    def local(mgr: PackageManager, recovered: list[str]) -> PackagesStatus:
        return mgr.status(recovered)

    def show(st: PackagesStatus) -> int:
        print(status_text(st))
        return EXIT_OK

    return _run(args, "packages.status", {}, local, PackagesStatus, show, readonly=True)


def checksum(args: argparse.Namespace) -> int:
    from supervisor.packages.format import payload_checksum, scan_payload, write_checksum

    root = Path(args.folder)
    try:
        value = write_checksum(root) if args.write else payload_checksum(scan_payload(root))
    except PackageError as exc:
        return _refused(exc.code, exc.message, exc.problems)
    except OSError as exc:
        return die(f"{root}: {exc.strerror or exc}", EXIT_FAILED)
    print(value)
    return EXIT_OK
