"""``toolhost dev``: regenerate or check the generated files (schemas, manifests)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from supervisor.contracts import envelope, manifest, packages, registry, rpc, snapshot, stats, wire
from supervisor.registry.manifests import bundled_manifest_dir

SCHEMA_SOURCES: dict[str, Callable[[], Any]] = {
    "registry.schema.json": lambda: msgspec.json.schema(registry.RegistryFile),
    "manifest.schema.json": lambda: msgspec.json.schema(manifest.ManifestFile),
    "process-json.host.schema.json": lambda: msgspec.json.schema(wire.HostMessage),
    "process-json.worker.schema.json": lambda: msgspec.json.schema(wire.WorkerMessage),
    "descriptor.schema.json": lambda: msgspec.json.schema(snapshot.Descriptor),
    "envelope.schema.json": lambda: msgspec.json.schema(envelope.EnvelopeView),
    "rpc.request.schema.json": lambda: msgspec.json.schema(rpc.Request),
    "rpc.response.schema.json": lambda: msgspec.json.schema(rpc.Response),
    "rpc.error.schema.json": lambda: msgspec.json.schema(rpc.ErrorResponse),
    "rpc.event.schema.json": lambda: msgspec.json.schema(rpc.Event),
    "rpc.catalog.schema.json": lambda: msgspec.json.schema(rpc.Catalog),
    "package.schema.json": lambda: msgspec.json.schema(packages.PackageFile),
    "rpc.packages.schema.json": lambda: msgspec.json.schema(packages.PackagesStatus),
    "rpc.stats.schema.json": lambda: msgspec.json.schema(stats.StatsResult),
}


def schema_files() -> dict[str, str]:
    """File name -> expected content of every generated JSON Schema."""
    return {
        name: json.dumps(make(), indent=2, sort_keys=True) + "\n"
        for name, make in SCHEMA_SOURCES.items()
    }


def manifest_files() -> dict[str, str]:
    from sidecars.sdk.manifest import BUNDLED, render

    return {f"{family}.toml": render(family) for family in BUNDLED}


def _sync(folder: Path, expected: dict[str, str], args: argparse.Namespace, what: str) -> int:
    stale = [
        name
        for name, text in expected.items()
        if not (folder / name).exists() or (folder / name).read_text(encoding="utf-8") != text
    ]
    if args.write:
        folder.mkdir(parents=True, exist_ok=True)
        for name in stale:
            (folder / name).write_text(expected[name], encoding="utf-8")
        print(f"{what}: wrote {len(stale)} of {len(expected)} file(s) in {folder}")
        return 0
    if stale:
        print(
            f"{what} are stale: {', '.join(stale)}; run `toolhost dev {what} --write`",
            file=sys.stderr,
        )
        return 1
    print(f"{what}: {len(expected)} file(s) fresh")
    return 0


def schemas(args: argparse.Namespace) -> int:
    return _sync(bundled_manifest_dir() / "schema", schema_files(), args, "schemas")


def manifests(args: argparse.Namespace) -> int:
    return _sync(bundled_manifest_dir(), manifest_files(), args, "manifests")
