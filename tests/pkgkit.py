"""Build real small packages for the package manager tests, and check an app root's invariants.

A package holds ``bin/greet``, a stdlib-only process-json sidecar whose one tool answers its own
version (read from ``share/behaviour.json``), so a test can tell which version served a call.
``mode`` makes a broken build: ``exit`` (dies before ready), ``probe-unavailable`` (its first pong
says unavailable), ``missing-tool`` (ready without the declared tool).
"""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path
from typing import Any

import json5
import tomli_w

from supervisor.packages.format import payload_checksum, scan_payload

SIDECAR = r'''#!/usr/bin/env python3
"""greet: a tiny process-json sidecar built by tests/pkgkit.py."""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "..", "share", "behaviour.json")) as f:
    CONF = json.load(f)
VERSION, MODE, TOOLS = CONF["version"], CONF["mode"], CONF["tools"]
if MODE == "exit":
    sys.stderr.write(f"greet {VERSION}: broken build, exiting\n")
    sys.exit(3)
if MODE == "missing-tool":
    TOOLS = [t + ".renamed" for t in TOOLS]


def write(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    msg = json.loads(line)
    kind = msg.get("type")
    if kind == "init":
        tools = [{"name": t, "description": t, "inputSchema": {"type": "object"}} for t in TOOLS]
        write({"type": "ready", "protocol": 1, "name": "greet", "version": VERSION,
               "concurrency": 1, "tools": tools})
    elif kind == "ping":
        status = "unavailable" if MODE == "probe-unavailable" else "healthy"
        write({"type": "pong", "id": msg["id"], "status": status})
    elif kind == "call":
        write({"type": "result", "id": msg["id"], "ok": True,
               "data": {"version": VERSION, "pid": os.getpid()}, "content": "greet " + VERSION})
    elif kind == "shutdown":
        break
'''

TOOL = "greet.version"
FAST_DEFAULTS = {
    "timeoutMs": 10000,
    "probe": {"intervalMs": 10000, "timeoutMs": 2000, "startTimeoutMs": 8000},
    "restart": {"backoffMs": 20, "maxBackoffMs": 200},
}


def build(
    dest: Path,
    version: str,
    *,
    pid: str = "greet",
    tools: list[str] | None = None,
    mode: str = "ok",
    archive: bool = False,
    toml: dict[str, Any] | None = None,
) -> Path:
    """Write a package folder (or ``.tar.gz``) under ``dest``; returns its path.

    ``toml`` overrides ``package.toml`` keys (a value of None removes the key); the checksum is
    computed over the payload unless ``toml`` gives one.
    """
    fields = toml or {}
    tools = tools or [TOOL]
    root = dest / f"{pid}-{version}-{mode}"
    (root / "bin").mkdir(parents=True)
    (root / "share").mkdir()
    script = root / "bin" / "greet"
    script.write_text(SIDECAR)
    script.chmod(0o755)
    (root / "share" / "behaviour.json").write_text(
        json.dumps({"version": version, "mode": mode, "tools": tools})
    )
    doc: dict[str, Any] = {
        "id": pid,
        "version": version,
        "kind": "process-json",
        "protocol": "1",
        "command": "bin/greet",
        "tools": tools,
        "compatibleCore": ">=0.1",
        "description": "says which version it is",
        "checksum": "sha256:" + "0" * 64,
        "defaults": FAST_DEFAULTS,
    }
    explicit_checksum = "checksum" in fields
    for key, value in fields.items():
        if value is None:
            doc.pop(key, None)
        else:
            doc[key] = value
    (root / "package.toml").write_text(tomli_w.dumps(doc))
    if not explicit_checksum and "checksum" in doc:
        doc["checksum"] = payload_checksum(scan_payload(root))
        (root / "package.toml").write_text(tomli_w.dumps(doc))
    if not archive:
        return root
    out = dest / f"{pid}-{version}-{mode}.tar.gz"
    with tarfile.open(out, "w:gz") as tf:
        tf.add(root, arcname=f"{pid}-{version}")
    return out


def tree_state(root: Path) -> dict[str, str]:
    """Every file under ``root/tools`` with its content (links as ``-> target``)."""
    out = {}
    tools = root / "tools"
    for dirpath, dirnames, filenames in os.walk(tools):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "-> " + os.readlink(p)
            elif p.is_file() and name != ".lock":
                out[rel] = p.read_bytes().hex()
            elif p.is_dir():
                out[rel] = "/"
    return out


def registry_entry(root: Path, sid: str = "greet") -> dict[str, Any] | None:
    doc = json5.loads((root / "tools" / "external.tools.jsonc").read_text())
    return doc.get("sidecars", {}).get(sid)


def installed_version(root: Path, pid: str = "greet", where: str = "") -> str | None:
    import tomllib

    folder = (
        root / "tools" / "packages" / where / pid if where else root / "tools" / "packages" / pid
    )
    try:
        return tomllib.loads((folder / "package.toml").read_text())["version"]
    except FileNotFoundError:
        return None


def assert_no_absolute_paths(root: Path) -> None:
    """No file the manager writes holds an absolute path (or the app root's location)."""
    import tomllib

    tools = root / "tools"
    texts = [tools / "external.tools.jsonc", tools / "external.tools.jsonc.next"]
    texts += list((tools / "packages").rglob("package.toml"))
    texts += [tools / "packages" / ".journal.json", tools / "packages" / ".upgrades.json"]
    seen = 0
    for path in texts:
        if not path.exists():
            continue
        seen += 1
        text = path.read_text()
        assert str(root) not in text, f"{path} mentions {root}"
        data = tomllib.loads(text) if path.suffix == ".toml" else json5.loads(text)
        for value in _strings(data):
            assert not value.startswith(("/", "~")), f"{path}: absolute path {value!r}"
    assert seen, "nothing was checked"


def _strings(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for k, v in node.items() for s in [*_strings(k), *_strings(v)]]
    if isinstance(node, list):
        return [s for v in node for s in _strings(v)]
    return []
