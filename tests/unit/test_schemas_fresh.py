"""The committed JSON Schemas and manifests match what the Structs generate."""

from supervisor.cli.dev import manifest_files, schema_files
from supervisor.registry.manifests import bundled_manifest_dir


def test_schemas_are_fresh():
    folder = bundled_manifest_dir() / "schema"
    stale = [
        name
        for name, text in schema_files().items()
        if not (folder / name).exists() or (folder / name).read_text() != text
    ]
    assert stale == [], f"run `toolhost dev schemas --write`: stale {stale}"


def test_manifests_are_fresh():
    folder = bundled_manifest_dir()
    stale = [
        name
        for name, text in manifest_files().items()
        if not (folder / name).exists() or (folder / name).read_text() != text
    ]
    assert stale == [], f"run `toolhost dev manifests --write`: stale {stale}"


def test_registry_schema_names_camel_case_fields():
    import json

    schema = json.loads((bundled_manifest_dir() / "schema" / "registry.schema.json").read_text())
    sidecar = schema["$defs"]["SidecarConfig"]["properties"]
    assert {"timeoutMs", "maxOutputBytes", "compatibleCore", "pool", "probe", "restart"} <= set(
        sidecar
    )
    assert schema["$defs"]["SidecarConfig"]["additionalProperties"] is False
