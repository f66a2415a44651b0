"""The utility sidecar: file.hash, path confinement, data.convert, schemas and both protocols.

Archive tools are in ``test_utility_archives.py``. The last tests spawn the real
``python -m sidecars.utility`` process.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import subprocess
import sys
import threading
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import pytest

from sidecars.sdk import ToolError
from sidecars.sdk.paths import confine
from sidecars.utility import app

if TYPE_CHECKING:
    from conftest import Utility

PAYLOAD = bytes(range(256)) * 12_289  # ~3 MiB: several read chunks, not a multiple of 1 MiB

# file.hash and confinement -----------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["sha256", "sha1", "md5", "blake2b"])
def test_hash_matches_hashlib(utility: Utility, algorithm: str) -> None:
    utility.write("data/blob.bin", PAYLOAD)
    data = utility.ok("file.hash", {"path": "data/blob.bin", "algorithm": algorithm})
    assert data == {
        "path": "data/blob.bin",
        "algorithm": algorithm,
        "digest": hashlib.new(algorithm, PAYLOAD).hexdigest(),
        "size": len(PAYLOAD),
    }


def test_hash_defaults_to_sha256(utility: Utility) -> None:
    utility.write("a.txt", "hello\n")
    data = utility.ok("file.hash", {"path": "a.txt"})
    assert data["algorithm"] == "sha256"
    assert data["digest"] == hashlib.sha256(b"hello\n").hexdigest()


def test_hash_missing_file_is_failed_not_found(utility: Utility) -> None:
    details, error = utility.refuse("file.hash", {"path": "nope.txt"}, "failed", "not-found")
    assert details == {"path": "nope.txt", "reason": "not-found"}
    assert "'nope.txt'" in error


def test_hash_directory_is_not_a_file(utility: Utility) -> None:
    (utility.root / "dir").mkdir()
    utility.refuse("file.hash", {"path": "dir"}, "invalid-input", "not-a-file")


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("../outside.txt", "parent-traversal"),
        ("sub/../../outside.txt", "parent-traversal"),
        ("sub/../a.txt", "parent-traversal"),  # even when it would stay inside
        ("sub\\..\\..\\outside.txt", "parent-traversal"),
        ("/etc/passwd", "absolute-path"),
        ("\\server\\share", "absolute-path"),
        ("C:\\Windows\\win.ini", "absolute-path"),
        ("", "empty-path"),
        ("a.txt\x00.png", "nul-byte"),
    ],
)
def test_hash_rejects_bad_paths(utility: Utility, path: str, reason: str) -> None:
    utility.write("a.txt", "x")
    (utility.root.parent / "outside.txt").write_text("secret")
    details, error = utility.refuse("file.hash", {"path": path}, "invalid-input", reason)
    assert details == {"path": path, "reason": reason}
    assert repr(path) in error


def test_hash_symlink_escaping_the_project_is_rejected(utility: Utility, project: Path) -> None:
    outside = project.parent / "secret.txt"
    outside.write_text("secret")
    (project / "link.txt").symlink_to(outside)
    (project / "linkdir").symlink_to(project.parent)
    (project / "dangling").symlink_to(project.parent / "not-there")
    for path in ("link.txt", "linkdir/secret.txt", "dangling"):
        # A dangling link to outside is an escape, not "not found": nothing leaks about outside.
        utility.refuse("file.hash", {"path": path}, "invalid-input", "symlink-escape")


def test_hash_symlink_inside_the_project_is_allowed(utility: Utility, project: Path) -> None:
    utility.write("real/a.txt", "inside")
    (project / "alias.txt").symlink_to("real/a.txt")
    (project / "aliasdir").symlink_to("real")
    for path in ("alias.txt", "aliasdir/a.txt"):
        data = utility.ok("file.hash", {"path": path})
        assert data["digest"] == hashlib.sha256(b"inside").hexdigest()


def test_confine_kinds_and_new_paths(utility: Utility, project: Path) -> None:
    utility.write("f.txt", "x")
    assert confine(project, "new/file.txt", must_exist=False) == project / "new/file.txt"
    assert confine(project, ".", kind="dir") == project
    assert confine(project, "./f.txt", kind="file") == project / "f.txt"
    with pytest.raises(ToolError) as info:
        confine(project, "f.txt", kind="dir", label="destination")
    assert info.value.details == {"path": "f.txt", "reason": "not-a-directory"}
    assert info.value.message.startswith("destination 'f.txt'")
    loop = project / "loop"
    loop.symlink_to("loop")
    with pytest.raises(ToolError) as info:
        confine(project, "loop")
    assert (info.value.code, info.value.details) == (
        "failed",
        {"path": "loop", "reason": "inaccessible"},
    )


# data.convert ------------------------------------------------------------------------------

DOC = {"title": "demo", "owner": {"name": "Ada", "admin": True}, "ports": [80, 443], "ratio": 0.5}


def inline(text: str, src: str, to: str) -> dict[str, Any]:
    return {"text": text, "from": src, "to": to}


def test_convert_json_file_to_toml_file(utility: Utility) -> None:
    utility.write("conf.json", json.dumps(DOC))
    data = utility.ok("data.convert", {"input": "conf.json", "to": "toml", "output": "o/c.toml"})
    written = utility.root / "o/c.toml"
    assert data == {
        "from": "json",
        "to": "toml",
        "bytes": written.stat().st_size,
        "output": "o/c.toml",
    }
    assert tomllib.loads(written.read_text()) == DOC


def test_convert_toml_to_json_inline(utility: Utility) -> None:
    text = 'title = "demo"\nwhen = 2024-05-01\n[owner]\nname = "Ada"\n'
    data = utility.ok("data.convert", inline(text, "toml", "json"))
    assert json.loads(data["text"]) == {
        "title": "demo",
        "when": "2024-05-01",
        "owner": {"name": "Ada"},
    }


def test_convert_jsonc_and_json5(utility: Utility) -> None:
    utility.write("settings.jsonc", '// top\n{\n  "a": 1, /* inline */\n  "b": [1, 2,],\n}\n')
    data = utility.ok("data.convert", {"input": "settings.jsonc", "to": "json"})
    assert data["from"] == "jsonc"
    assert json.loads(data["text"]) == {"a": 1, "b": [1, 2]}
    text = "{unquoted: 'single', hex: 0x10, trailing: [1,],}"
    data = utility.ok("data.convert", inline(text, "json5", "json"))
    assert json.loads(data["text"]) == {"unquoted": "single", "hex": 16, "trailing": [1]}


def test_convert_csv_to_json(utility: Utility) -> None:
    utility.write("t.csv", 'name,qty\nbolt,3\n"nut, hex",10\nshort\n')
    data = utility.ok("data.convert", {"input": "t.csv", "to": "json"})
    assert json.loads(data["text"]) == [
        {"name": "bolt", "qty": "3"},
        {"name": "nut, hex", "qty": "10"},
        {"name": "short", "qty": ""},
    ]


def test_convert_json_to_csv(utility: Utility) -> None:
    rows = [{"a": 1, "b": "x,y"}, {"b": None, "c": True}, {"a": 2.5}]
    data = utility.ok("data.convert", inline(json.dumps(rows), "json", "csv"))
    assert data["text"] == 'a,b,c\n1,"x,y",\n,,true\n2.5,,\n'
    first, *_ = csv.DictReader(io.StringIO(data["text"]))
    assert first == {"a": "1", "b": "x,y", "c": ""}


@pytest.mark.parametrize(
    ("doc", "reason", "path"),
    [
        ({"a": 1}, "csv-needs-list", "$"),
        ([{"a": 1}, 3], "csv-not-flat", "$[1]"),
        ([{"a": {"nested": 1}}], "csv-not-flat", "$[0].a"),
    ],
)
def test_convert_csv_output_needs_flat_objects(
    utility: Utility, doc: Any, reason: str, path: str
) -> None:
    payload = inline(json.dumps(doc), "json", "csv")
    details, error = utility.refuse("data.convert", payload, "invalid-input", reason)
    assert details["jsonPath"] == path
    assert path == "$" or path in error


def test_convert_msgpack_round_trip(utility: Utility) -> None:
    utility.write("doc.json", json.dumps(DOC))
    utility.ok("data.convert", {"input": "doc.json", "to": "msgpack", "output": "doc.msgpack"})
    assert msgspec.msgpack.decode((utility.root / "doc.msgpack").read_bytes()) == DOC
    back = utility.ok("data.convert", {"input": "doc.msgpack", "to": "json"})
    assert back["from"] == "msgpack"
    assert json.loads(back["text"]) == DOC
    packed = utility.ok("data.convert", inline(json.dumps(DOC), "json", "msgpack"))
    assert msgspec.msgpack.decode(base64.b64decode(packed["base64"])) == DOC
    again = utility.ok("data.convert", inline(packed["base64"], "msgpack", "json"))
    assert json.loads(again["text"]) == DOC
    utility.refuse("data.convert", inline("***", "msgpack", "json"), "invalid-input", "bad-base64")


def test_convert_toml_output_refuses_null_with_its_path(utility: Utility) -> None:
    doc = {"servers": [{"host": "a", "port": 1}, {"host": "b", "port": None}], "x": None}
    payload = inline(json.dumps(doc), "json", "toml")
    details, error = utility.refuse("data.convert", payload, "invalid-input", "toml-null")
    assert details["jsonPath"] == "$.servers[1].port"
    assert "$.servers[1].port" in error
    payload = inline('{"odd key": {"k": null}}', "json", "toml")
    details, _ = utility.refuse("data.convert", payload, "invalid-input", "toml-null")
    assert details["jsonPath"] == '$["odd key"].k'


def test_convert_toml_output_needs_an_object(utility: Utility) -> None:
    payload = inline("[1, 2]", "json", "toml")
    _, error = utility.refuse("data.convert", payload, "invalid-input", "toml-needs-object")
    assert "top-level object" in error


def test_convert_non_utf8_names_the_byte_offset(utility: Utility) -> None:
    utility.write("bad.json", b'{"name": "caf\xe9"}')
    payload = {"input": "bad.json", "to": "toml"}
    details, error = utility.refuse("data.convert", payload, "invalid-input", "not-utf8")
    assert details == {"reason": "not-utf8", "offset": 13, "path": "bad.json"}
    assert "offset 13" in error
    assert "0xe9" in error
    utility.write("bom.csv", b"\xef\xbb\xbfa\n\xff\n")  # the BOM counts towards the offset
    payload = {"input": "bom.csv", "to": "json"}
    assert utility.refuse("data.convert", payload, "invalid-input", "not-utf8")[0]["offset"] == 5


def test_convert_input_errors(utility: Utility) -> None:
    utility.write("a.json", "{}")
    utility.write("a.data", "{}")
    for payload, code, reason in [
        ({"input": "missing.json", "to": "toml"}, "failed", "not-found"),
        ({"input": "../x.json", "to": "toml"}, "invalid-input", "parent-traversal"),
        ({"to": "json"}, "invalid-input", "input-or-text"),
        ({"input": "a.json", "text": "{}", "to": "json"}, "invalid-input", "input-or-text"),
        ({"text": "{}", "to": "json"}, "invalid-input", "unknown-format"),
        ({"input": "a.data", "to": "json"}, "invalid-input", "unknown-format"),
        (inline("{oops", "json", "toml"), "invalid-input", "parse-error"),
        (inline("a = ", "toml", "json"), "invalid-input", "parse-error"),
        (inline("a\n1,2\n", "csv", "json"), "invalid-input", "csv-ragged"),
        (inline("a,a\n1,2\n", "csv", "json"), "invalid-input", "csv-duplicate-header"),
    ]:
        utility.refuse("data.convert", payload, code, reason)
    utility.configure(maxConvertBytes=1)
    utility.refuse("data.convert", {"input": "a.json", "to": "toml"}, "invalid-input", "too-large")


def test_convert_refuses_to_overwrite_unless_asked(utility: Utility) -> None:
    utility.write("a.json", '{"k": 1}')
    utility.write("a.toml", "old = true\n")
    payload = {"input": "a.json", "to": "toml", "output": "a.toml"}
    utility.refuse("data.convert", payload, "invalid-input", "exists")
    assert (utility.root / "a.toml").read_text() == "old = true\n"
    utility.ok("data.convert", {**payload, "overwrite": True})
    assert tomllib.loads((utility.root / "a.toml").read_text()) == {"k": 1}
    assert utility.names() == ["a.json", "a.toml"]  # no temporary file left


# schemas -----------------------------------------------------------------------------------


def test_schemas_are_strict_and_camel_case(utility: Utility) -> None:
    ready = app.ready_message()
    names = ["file.hash", "archive.create", "archive.extract", "data.convert"]
    names += ["lsp.symbols", "lsp.diagnostics", "task.background"]
    assert [t.name for t in ready.tools] == names
    for tool in ready.tools:
        assert tool.inputSchema["additionalProperties"] is False, tool.name
        assert all("_" not in key for key in tool.inputSchema["properties"]), tool.name
        assert all(p.get("description") for p in tool.inputSchema["properties"].values())
    convert_schema = ready.tools[3].inputSchema
    assert "from" in convert_schema["properties"]
    assert convert_schema["required"] == ["to"]
    assert "sourceBytes" in (ready.tools[1].outputSchema or {})["properties"]
    result = utility.run("file.hash", {"path": "a", "algo": "md5"})
    assert (result.ok, result.code) == (False, "invalid-input")


# the real process --------------------------------------------------------------------------


def test_persistent_protocol_hashes_a_file(utility: Utility, project: Path) -> None:
    utility.write("blob.bin", PAYLOAD)
    init = {
        "type": "init",
        "protocol": 1,
        "sidecar": "utility",
        "config": {},
        "projectDir": str(project),
        "configDir": str(project),
        "cwd": str(project),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "sidecars.utility"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=project,
    )
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout
    watchdog = threading.Timer(20, proc.kill)
    watchdog.start()

    def send(msg: dict[str, Any]) -> None:
        stdin.write(json.dumps(msg).encode() + b"\n")
        stdin.flush()

    def receive() -> dict[str, Any]:
        line = stdout.readline()
        assert line, "the sidecar closed stdout"
        msg: dict[str, Any] = json.loads(line)
        return msg

    try:
        send(init)
        ready = receive()
        assert (ready["type"], ready["name"], ready["version"]) == ("ready", "utility", "1.0.0")
        names = {t["name"] for t in ready["tools"]}
        assert names == {
            "file.hash",
            "archive.create",
            "archive.extract",
            "data.convert",
            "lsp.symbols",
            "lsp.diagnostics",
            "task.background",
        }
        send({"type": "call", "id": 7, "tool": "file.hash", "input": {"path": "blob.bin"}})
        send({"type": "call", "id": 8, "tool": "file.hash", "input": {"path": "../x"}})
        send({"type": "ping", "id": "p1"})
        # Wait for every answer before shutdown: the SDK drops calls still queued at shutdown.
        by_id = {m["id"]: m for m in (receive(), receive(), receive())}
        send({"type": "shutdown"})
        stdin.close()
        assert proc.wait(timeout=10) == 0
    finally:
        watchdog.cancel()
        proc.kill()
        proc.wait()
        stdout.close()
    assert by_id["p1"]["type"] == "pong"
    assert (by_id[7]["type"], by_id[7]["ok"]) == ("result", True)
    assert by_id[7]["data"]["digest"] == hashlib.sha256(PAYLOAD).hexdigest()
    assert by_id[7]["data"]["size"] == len(PAYLOAD)
    assert (by_id[8]["ok"], by_id[8]["code"]) == (False, "invalid-input")
    assert by_id[8]["details"] == {"path": "../x", "reason": "parent-traversal"}


def oneshot(project: Path, request: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
    proc = subprocess.run(
        [sys.executable, "-m", "sidecars.utility"],
        input=json.dumps(request).encode() + b"\n",
        capture_output=True,
        cwd=project,
        timeout=20,
        check=False,
    )
    return proc.returncode, [json.loads(line) for line in proc.stdout.decode().splitlines()]


def test_oneshot_protocol(utility: Utility, project: Path) -> None:
    utility.write("a.txt", "abc")
    request = {
        "tool": "file.hash",
        "input": {"path": "a.txt", "algorithm": "md5"},
        "projectDir": str(project),
        "cwd": str(project),
        "config": {},
    }
    code, out = oneshot(project, request)
    assert code == 0
    digest = hashlib.md5(b"abc").hexdigest()
    assert out == [{"ok": True, "path": "a.txt", "algorithm": "md5", "digest": digest, "size": 3}]
    code, out = oneshot(project, {**request, "input": {"path": "/etc/passwd"}})
    assert code == 1
    assert len(out) == 1
    assert (out[0]["ok"], out[0]["code"], out[0]["reason"]) == (
        False,
        "invalid-input",
        "absolute-path",
    )
