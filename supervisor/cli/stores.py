"""``toolhost state`` and ``toolhost vault``: the operator's view of the host-service stores
(PROTOCOL 3.5). Both work on the files under the app root, with or without a running host."""

from __future__ import annotations

import argparse
import os
import sys

import msgspec

from supervisor.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, app_root
from supervisor.host.services import STATE_FILE
from supervisor.host.state_store import StateError, StateStore, Write
from supervisor.host.vault import Vault, VaultError, vault_path

SEP = "\x1f"


def _split(ns: str) -> tuple[str, str]:
    name, _, scope = ns.partition(SEP)
    return name, scope


def _join(name: str, scope: str) -> str:
    return f"{name}{SEP}{scope}"


def _store(args: argparse.Namespace) -> StateStore | None:
    path = os.path.join(app_root(args), STATE_FILE)
    if not os.path.exists(path):
        print(f"toolhost: no state yet ({path} does not exist)", file=sys.stderr)
        return None
    return StateStore(path)


def state(args: argparse.Namespace) -> int:
    """``toolhost state list [NAME] | get NAME KEY | delete NAME KEY`` (``--scope``)."""
    try:
        store = _store(args)
    except StateError as exc:
        print(f"toolhost: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if store is None:
        return EXIT_OK if args.state_command == "list" else EXIT_FAILED
    try:
        scope = getattr(args, "scope", "shared:")
        if args.state_command == "list":
            for ns, count in store.namespaces():
                name, where = _split(ns)
                if args.name and name != args.name:
                    continue
                print(f"{name}\t{where}\t{count} key(s)")
                if args.name:
                    for key in store.keys(ns):
                        print(f"  {key}")
            return EXIT_OK
        ns = _join(args.name, scope)
        if args.state_command == "get":
            value = store.get(ns, args.key)
            if value is None:
                print(f"toolhost: {args.name}/{scope} has no key {args.key!r}", file=sys.stderr)
                return EXIT_FAILED
            sys.stdout.write(msgspec.json.format(value).decode() + "\n")
            return EXIT_OK
        if store.get(ns, args.key) is None:
            print(f"toolhost: {args.name}/{scope} has no key {args.key!r}", file=sys.stderr)
            return EXIT_FAILED
        store.apply([Write(ns, args.key, None)])
        print(f"deleted {args.name}/{scope} {args.key}")
        return EXIT_OK
    finally:
        store.close()


def vault(args: argparse.Namespace) -> int:
    """``toolhost vault set KEY`` (value from stdin) ``| list | delete KEY``."""
    v = Vault(vault_path(app_root(args)))
    try:
        if args.vault_command == "set":
            if sys.stdin.isatty():
                print(f"value for {args.key} (end with Ctrl-D):", file=sys.stderr)
            value = sys.stdin.read()
            if value.endswith("\n"):
                value = value[:-1]
            if not value:
                print("toolhost: empty value on stdin; nothing stored", file=sys.stderr)
                return EXIT_USAGE
            v.set(args.key, value, args.scope)
            print(f"stored {args.key} ({args.scope}) in {v.path}")
        elif args.vault_command == "list":
            for scope, keys in v.keys().items():
                for key in keys:
                    print(f"{key}\t{scope}")
        else:
            if not v.delete(args.key, args.scope):
                print(f"toolhost: the vault has no {args.key!r}", file=sys.stderr)
                return EXIT_FAILED
            print(f"deleted {args.key}")
    except VaultError as exc:
        print(f"toolhost: {exc.message}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK
