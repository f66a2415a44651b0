"""The package format: every bad package is refused with a reason naming what is wrong."""

import io
import os
import tarfile

import pytest

from supervisor.packages.errors import PackageError
from supervisor.packages.format import (
    extract_archive,
    load_verified,
    open_source,
    payload_checksum,
    registry_command,
    scan_payload,
    write_checksum,
)
from tests.pkgkit import build

HOST = "0.1.0"


def refused(root, code="invalid-package"):
    with pytest.raises(PackageError) as info, open_source(root) as folder:
        load_verified(folder, HOST)
    assert info.value.code == code, str(info.value)
    return str(info.value)


def test_a_good_package_and_its_archive_pass(tmp_path):
    pkg = load_verified(build(tmp_path, "1.0.0"), HOST)
    assert (pkg.id, pkg.version, pkg.tools, pkg.command) == (
        "greet",
        "1.0.0",
        ["greet.version"],
        "bin/greet",
    )
    with open_source(build(tmp_path, "1.1.0", archive=True)) as root:
        assert load_verified(root, HOST).version == "1.1.0"


@pytest.mark.parametrize(
    ("fields", "code", "message"),
    [
        ({"checksum": "sha256:" + "1" * 64}, "checksum-mismatch", "payload checksum is sha256:"),
        ({"command": "/usr/bin/python3"}, "invalid-package", "command: absolute paths are refused"),
        ({"command": "~/bin/greet"}, "invalid-package", "command: absolute paths are refused"),
        ({"command": "../bin/greet"}, "invalid-package", "command: '../bin/greet' uses '..'"),
        ({"command": "bin/nothing"}, "invalid-package", "'bin/nothing' is not a file"),
        ({"args": ["/etc/passwd"]}, "invalid-package", "args[0]: absolute paths are refused"),
        ({"args": ["{package}/../../x"]}, "invalid-package", "args[0]: '{package}/../../x' uses"),
        ({"args": ["x{package}"]}, "invalid-package", "args[0]: {package} may only start"),
        ({"compatibleCore": ">=99"}, "incompatible", "does not admit toolhost 0.1.0"),
        ({"compatibleCore": ">=banana"}, "invalid-package", "compatibleCore: cannot parse"),
        ({"protocol": "2"}, "incompatible", "process-json protocol 2 is not supported"),
        ({"tools": None}, "invalid-package", "package.toml: tools: required field missing"),
        ({"tools": []}, "invalid-package", "package.toml: tools: expected array of length >= 1"),
        ({"tools": ["file.read"]}, "invalid-package", "file.read is a builtin coding tool"),
        ({"kind": "mcp"}, "invalid-package", 'package.toml: kind: invalid value "mcp"'),
        ({"bogus": 1}, "invalid-package", "package.toml: bogus: unknown field"),
        ({"id": "Bad/Id"}, "invalid-package", "package.toml: id: expected str matching"),
        ({"version": "1.0/evil"}, "invalid-package", "package.toml: version: expected str"),
        ({"defaults": {"command": "x"}}, "invalid-package", "defaults.command: decided by the"),
        ({"checksum": None}, "invalid-package", "package.toml: checksum: required field missing"),
    ],
)
def test_bad_package_toml_is_refused(tmp_path, fields, code, message):
    assert message in refused(build(tmp_path, "1.0.0", toml=fields), code)


def test_a_refusal_names_every_problem(tmp_path):
    text = refused(
        build(tmp_path, "1.0.0", toml={"command": "../x", "args": ["/a"], "tools": ["git.push"]})
    )
    assert "command:" in text and "args[0]:" in text and "git.push is a builtin" in text


def test_every_missing_field_is_named_not_just_the_first(tmp_path):
    root = build(tmp_path, "1.0.0", toml={"version": None, "checksum": None, "bogus": 1})
    with pytest.raises(PackageError) as info:
        load_verified(root, HOST)
    assert info.value.code == "invalid-package"
    assert info.value.problems == [
        "package.toml: bogus: unknown field",
        "package.toml: version: required field missing",
        "package.toml: checksum: required field missing",
    ]
    assert info.value.message == "the package has 3 problems"


def test_problems_of_every_pass_are_named_together(tmp_path):
    root = build(
        tmp_path,
        "1.0.0",
        toml={"compatibleCore": ">=99", "checksum": "sha256:" + "1" * 64, "tools": ["file.read"]},
    )
    (root / "share" / "out").symlink_to("/etc")
    with pytest.raises(PackageError) as info:
        load_verified(root, HOST)
    problems = info.value.problems
    assert info.value.code == "invalid-package" and len(problems) == 2, problems
    assert "file.read is a builtin" in problems[0] and "absolute path" in problems[1]
    (root / "share" / "out").unlink()
    build_ok = build(tmp_path / "b", "1.0.0", toml={"compatibleCore": ">=99"})
    (build_ok / "share" / "extra").write_text("changes the checksum")
    with pytest.raises(PackageError) as info:
        load_verified(build_ok, HOST)
    assert info.value.code == "incompatible"
    assert len(info.value.problems) == 2 and "payload checksum is" in info.value.problems[1]


def test_links_out_of_the_package_are_refused(tmp_path):
    root = build(tmp_path, "1.0.0")
    outside = tmp_path / "secret"
    outside.write_text("x")
    os.symlink("../../secret", root / "share" / "escape")
    assert "share/escape: symlink leads out of the package" in refused(root)
    os.unlink(root / "share" / "escape")
    os.symlink(str(outside), root / "share" / "abs")
    assert "share/abs: symlink to an absolute path" in refused(root)


def test_a_command_linking_out_is_refused(tmp_path):
    outside = tmp_path / "evil"
    outside.write_text("#!/bin/sh\n")
    outside.chmod(0o755)
    root = build(tmp_path, "1.0.0")
    os.symlink("../../evil", root / "bin" / "run")
    (root / "package.toml").write_text(
        (root / "package.toml").read_text().replace('command = "bin/greet"', 'command = "bin/run"')
    )
    text = refused(root)
    assert "command: 'bin/run' is a link out of the package" in text
    assert "bin/run: symlink leads out" in text


def test_a_symlink_inside_the_package_is_fine_and_checksummed(tmp_path):
    root = build(tmp_path, "1.0.0")
    os.symlink("greet", root / "bin" / "alias")
    entries = scan_payload(root)
    assert any(e.path == "bin/alias" and e.kind == "l" and e.digest == "greet" for e in entries)
    write_checksum(root)
    assert load_verified(root, HOST).version == "1.0.0"


def test_not_executable_command(tmp_path):
    root = build(tmp_path, "1.0.0")
    (root / "bin" / "greet").chmod(0o644)
    assert "command: 'bin/greet' is not executable" in refused(root)


def test_checksum_covers_content_and_exec_bit_but_not_caches(tmp_path):
    root = build(tmp_path, "1.0.0")
    before = payload_checksum(scan_payload(root))
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "x.pyc").write_bytes(b"cache")
    (root / "package.toml").write_text((root / "package.toml").read_text() + "\n# comment\n")
    assert payload_checksum(scan_payload(root)) == before
    (root / "share" / "behaviour.json").chmod(0o755)
    assert payload_checksum(scan_payload(root)) != before
    (root / "share" / "behaviour.json").chmod(0o644)
    (root / "share" / "behaviour.json").write_text("{}")
    assert payload_checksum(scan_payload(root)) != before
    assert refused_code(root) == "checksum-mismatch"


def refused_code(root):
    try:
        load_verified(root, HOST)
    except PackageError as exc:
        return exc.code
    return None


def test_write_checksum_keeps_the_authors_text(tmp_path):
    root = build(tmp_path, "1.0.0", toml={"checksum": "sha256:" + "2" * 64})
    toml = root / "package.toml"
    toml.write_text("# my package\n" + toml.read_text())
    value = write_checksum(root)
    text = toml.read_text()
    assert text.startswith("# my package\n") and f'checksum = "{value}"' in text
    assert load_verified(root, HOST).checksum == value


def _tar(path, members):
    with tarfile.open(path, "w:gz") as tf:
        for info, data in members:
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _file(name, data=b"x"):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _link(name, target, kind=tarfile.SYMTYPE):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info, None


@pytest.mark.parametrize(
    ("member", "message"),
    [
        (_file("/etc/evil"), "archive member '/etc/evil': absolute paths are refused"),
        (_file("pkg/../../evil"), "archive member 'pkg/../../evil': '..' leaves the package"),
        (_link("pkg/out", "../../x"), "archive member 'pkg/out': symlink leads out"),
        (_link("pkg/abs", "/etc/passwd"), "archive member 'pkg/abs': symlink to an absolute"),
        (_link("pkg/hard", "pkg/package.toml", tarfile.LNKTYPE), "hard links are refused"),
    ],
)
def test_bad_archives_are_refused_before_extraction(tmp_path, member, message):
    archive = _tar(tmp_path / "bad.tar.gz", [_file("pkg/package.toml"), member])
    into = tmp_path / "into"
    into.mkdir()
    with pytest.raises(PackageError) as info:
        extract_archive(archive, into)
    assert message in str(info.value)
    assert list(into.iterdir()) == []  # nothing was extracted


def test_an_archive_without_package_toml(tmp_path):
    archive = _tar(tmp_path / "empty.tar.gz", [_file("a/readme")])
    with pytest.raises(PackageError) as info, open_source(archive):
        pass
    assert "no package.toml at the archive root" in str(info.value)


def test_sources_that_are_neither_folder_nor_archive(tmp_path):
    (tmp_path / "x.zip").write_bytes(b"PK")
    with (
        pytest.raises(PackageError, match=r"folder or a \.tar\.gz"),
        open_source(tmp_path / "x.zip"),
    ):
        pass
    with pytest.raises(PackageError) as info, open_source(tmp_path / "missing"):
        pass
    assert info.value.code == "not-found"


def test_registry_command_is_relative(tmp_path):
    pkg = load_verified(build(tmp_path, "1.0.0", toml={"args": ["{package}/share", "-v"]}), HOST)
    cmd, args = registry_command(pkg, "tools/packages/greet")
    assert cmd == "./tools/packages/greet/bin/greet"
    assert args == ["./tools/packages/greet/share", "-v"]
    pkg2 = load_verified(
        build(tmp_path, "2.0.0", toml={"command": "python", "args": ["{package}/x.py"]}), HOST
    )
    assert registry_command(pkg2, "tools/packages/greet") == (
        "python",
        ["./tools/packages/greet/x.py"],
    )
