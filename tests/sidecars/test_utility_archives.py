"""archive.create and archive.extract: round trips, symlink policy and hostile archives."""

from __future__ import annotations

import io
import os
import stat
import struct
import tarfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sidecars.utility import extract

if TYPE_CHECKING:
    from conftest import Utility

PAYLOAD = bytes(range(256)) * 300


def make_tree(utility: Utility) -> None:
    utility.write("src/readme.md", "# hi\n")
    utility.write("src/bin/tool.sh", "#!/bin/sh\necho hi\n").chmod(0o755)
    utility.write("src/deep/er/data.bin", PAYLOAD[:70_000])
    (utility.root / "src/empty").mkdir()


# archive.create ----------------------------------------------------------------------------


@pytest.mark.parametrize(("suffix", "fmt"), [(".zip", "zip"), (".tar", "tar"), (".tgz", "tar.gz")])
def test_round_trip_is_byte_identical(utility: Utility, suffix: str, fmt: str) -> None:
    make_tree(utility)
    created = utility.ok("archive.create", {"source": "src", "output": f"dist/src{suffix}"})
    assert created["format"] == fmt
    assert (created["files"], created["directories"]) == (3, 5)
    assert created["bytes"] == (utility.root / f"dist/src{suffix}").stat().st_size
    assert created["sourceBytes"] == 5 + 18 + 70_000
    assert utility.names("dist") == [f"src{suffix}"]  # no temporary file left
    extracted = utility.ok(
        "archive.extract", {"archive": f"dist/src{suffix}", "destination": "out"}
    )
    assert extracted == {
        "destination": "out",
        "format": fmt,
        "files": 3,
        "directories": 5,
        "bytes": 70_023,
    }
    assert utility.tree("out/src") == utility.tree("src")
    assert os.stat(utility.root / "out/src/bin/tool.sh").st_mode & 0o100
    assert not os.stat(utility.root / "out/src/readme.md").st_mode & 0o111
    assert utility.names() == ["dist", "out", "src"]


def test_create_defaults_to_zip_and_extract_sniffs_content(utility: Utility) -> None:
    utility.write("one.txt", "1")
    assert utility.ok("archive.create", {"source": "one.txt", "output": "b.bin"})["format"] == "zip"
    assert zipfile.ZipFile(utility.root / "b.bin").namelist() == ["one.txt"]
    utility.ok("archive.create", {"source": "one.txt", "output": "t.bin", "format": "tar.gz"})
    data = utility.ok("archive.extract", {"archive": "t.bin", "destination": "x"})
    assert data["format"] == "tar.gz"
    assert (utility.root / "x/one.txt").read_text() == "1"


def test_create_project_root_uses_bare_names_and_skips_itself(utility: Utility) -> None:
    utility.write("a.txt", "a")
    data = utility.ok("archive.create", {"source": ".", "output": "all.zip"})
    assert zipfile.ZipFile(utility.root / "all.zip").namelist() == ["a.txt"]
    assert data["skipped"] == []
    again = {"source": ".", "output": "all.zip", "overwrite": True}
    data = utility.ok("archive.create", again)
    assert data["skipped"] == [{"path": "all.zip", "reason": "archive-output"}]


def test_create_refuses_unsupported_suffixes_unless_format_is_given(utility: Utility) -> None:
    utility.write("a.txt", "a")
    payload = {"source": "a.txt", "output": "a.tar.xz"}
    utility.refuse("archive.create", payload, "invalid-input", "unsupported-format")
    assert not (utility.root / "a.tar.xz").exists()
    assert utility.ok("archive.create", {**payload, "format": "tar"})["format"] == "tar"
    with tarfile.open(utility.root / "a.tar.xz", "r:") as tf:
        assert tf.getnames() == ["a.txt"]


def test_create_refuses_to_overwrite_unless_asked(utility: Utility) -> None:
    utility.write("a.txt", "a")
    utility.write("out.zip", "keep me")
    payload = {"source": "a.txt", "output": "out.zip"}
    details, _ = utility.refuse("archive.create", payload, "invalid-input", "exists")
    assert details == {"path": "out.zip", "reason": "exists"}
    assert (utility.root / "out.zip").read_text() == "keep me"
    utility.ok("archive.create", {**payload, "overwrite": True})
    assert zipfile.ZipFile(utility.root / "out.zip").namelist() == ["a.txt"]


def test_create_skips_symlinks_and_never_follows_them(utility: Utility, project: Path) -> None:
    utility.write("src/real.txt", "real")
    (project.parent / "secret.txt").write_text("secret")
    (project / "src/out-link").symlink_to(project.parent / "secret.txt")
    (project / "src/in-link").symlink_to("real.txt")
    (project / "src/dir-link").symlink_to(project.parent)
    data = utility.ok("archive.create", {"source": "src", "output": "s.tar"})
    assert data["skipped"] == [
        {"path": "src/dir-link", "reason": "symlink"},
        {"path": "src/in-link", "reason": "symlink"},
        {"path": "src/out-link", "reason": "symlink"},
    ]
    with tarfile.open(project / "s.tar") as tf:
        assert tf.getnames() == ["src", "src/real.txt"]
        assert all(m.isreg() or m.isdir() for m in tf.getmembers())


def test_create_rejects_escaping_source_and_output(utility: Utility, project: Path) -> None:
    (project / "up").symlink_to(project.parent)
    utility.write("a.txt", "a")
    for payload, code, reason in [
        ({"source": "up", "output": "x.zip"}, "invalid-input", "symlink-escape"),
        ({"source": "a.txt", "output": "../x.zip"}, "invalid-input", "parent-traversal"),
        ({"source": "a.txt", "output": "up/x.zip"}, "invalid-input", "symlink-escape"),
        ({"source": "/etc", "output": "x.zip"}, "invalid-input", "absolute-path"),
        ({"source": "nope", "output": "x.zip"}, "failed", "not-found"),
    ]:
        utility.refuse("archive.create", payload, code, reason)
    assert not (project.parent / "x.zip").exists()
    assert utility.names() == ["a.txt", "up"]


def test_create_cancelled_leaves_nothing(utility: Utility) -> None:
    make_tree(utility)
    payload = {"source": "src", "output": "new/dir/src.zip"}
    result = utility.run("archive.create", payload, cancelled=True)
    assert (result.ok, result.code) == (False, "cancelled")
    assert utility.names() == ["src"]  # neither the temp file nor new/dir/ remain


# archive.extract: hostile archives ---------------------------------------------------------


def zip_with(utility: Utility, members: list[tuple[zipfile.ZipInfo | str, bytes]]) -> str:
    with zipfile.ZipFile(utility.root / "evil.zip", "w", zipfile.ZIP_DEFLATED) as zf:
        for info, data in members:
            zf.writestr(info, data)
    return "evil.zip"


def tar_with(utility: Utility, members: list[tarfile.TarInfo], gz: bool = False) -> str:
    name = "evil.tar.gz" if gz else "evil.tar"
    with tarfile.open(utility.root / name, "w:gz" if gz else "w") as tf:
        for info in members:
            tf.addfile(info, io.BytesIO(b"x" * info.size) if info.isreg() else None)
    return name


def tar_member(
    name: str, kind: bytes = tarfile.REGTYPE, size: int = 0, link: str = ""
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = size
    info.linkname = link
    return info


def extract_refused(utility: Utility, archive: str, reason: str, member: str) -> dict[str, Any]:
    """Extract into ``dest/inner``; assert the refusal and that nothing at all was written."""
    payload = {"archive": archive, "destination": "dest/inner"}
    details, error = utility.refuse("archive.extract", payload, "invalid-input", reason)
    assert (details["member"], details["path"]) == (member, archive)
    assert repr(member) in error
    assert utility.names() == [archive]  # no destination, no parent, no staging directory
    assert sorted(p.name for p in utility.root.parent.iterdir()) == ["project"]
    return details


@pytest.mark.parametrize("kind", ["zip", "tar"])
def test_extract_rejects_zip_slip(utility: Utility, kind: str) -> None:
    if kind == "zip":
        archive = zip_with(utility, [("ok.txt", b"fine"), ("../evil", b"pwned")])
        member = "../evil"
    else:
        member = "a/../../evil"
        archive = tar_with(utility, [tar_member("ok.txt", size=4), tar_member(member, size=5)])
    extract_refused(utility, archive, "parent-traversal", member)


@pytest.mark.parametrize("kind", ["zip", "tar"])
def test_extract_rejects_absolute_members(utility: Utility, kind: str) -> None:
    if kind == "zip":
        archive = zip_with(utility, [(zipfile.ZipInfo("/etc/x"), b"x")])
    else:
        archive = tar_with(utility, [tar_member("/etc/x", size=1)])
    extract_refused(utility, archive, "absolute-path", "/etc/x")


@pytest.mark.parametrize(
    ("member", "reason"),
    [
        (tar_member("link", tarfile.SYMTYPE, link="/etc/passwd"), "symlink-member"),
        (tar_member("inner-link", tarfile.SYMTYPE, link="ok.txt"), "symlink-member"),
        (tar_member("hard", tarfile.LNKTYPE, link="ok.txt"), "hardlink-member"),
        (tar_member("fifo", tarfile.FIFOTYPE), "special-member"),
        (tar_member("dev", tarfile.CHRTYPE), "special-member"),
        (tar_member("blk", tarfile.BLKTYPE), "special-member"),
    ],
    ids=lambda v: getattr(v, "name", v),
)
def test_extract_rejects_tar_link_and_special_members(
    utility: Utility, member: tarfile.TarInfo, reason: str
) -> None:
    archive = tar_with(utility, [tar_member("ok.txt", size=4), member], gz=True)
    extract_refused(utility, archive, reason, member.name)


def test_extract_rejects_zip_symlink_member(utility: Utility) -> None:
    info = zipfile.ZipInfo("link")
    info.create_system = 3
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    archive = zip_with(utility, [("ok.txt", b"fine"), (info, b"/etc/passwd")])
    extract_refused(utility, archive, "symlink-member", "link")


def test_extract_rejects_file_directory_conflicts(utility: Utility) -> None:
    archive = zip_with(utility, [("a", b"file"), ("a/b", b"below a file")])
    extract_refused(utility, archive, "member-conflict", "a/b")


def zip_bomb(utility: Utility, size: int) -> str:
    """A zip holding ``size`` zero bytes in one member; deflate makes it ~1000x smaller."""
    chunk = bytes(1 << 20)
    with (
        zipfile.ZipFile(utility.root / "bomb.zip", "w", zipfile.ZIP_DEFLATED) as zf,
        zf.open("zeros.bin", "w", force_zip64=True) as f,
    ):
        for _ in range(size >> 20):
            f.write(chunk)
    return "bomb.zip"


def test_extract_rejects_zip_bomb_by_declared_size(utility: Utility) -> None:
    archive = zip_bomb(utility, 50 << 20)
    assert (utility.root / archive).stat().st_size < 200_000
    utility.configure(maxExtractBytes=1 << 20)
    details = extract_refused(utility, archive, "too-large", "zeros.bin")
    assert (details["stage"], details["limit"]) == ("declared", 1 << 20)


def test_extract_counts_real_bytes_when_declarations_lie(
    utility: Utility, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Simulate headers that declare 0 bytes: the byte counter alone must stop the bomb."""
    archive = zip_bomb(utility, 4 << 20)
    utility.configure(maxExtractBytes=1 << 20)
    real_add = extract._Planner.add

    def lying_add(self: Any, name: str, kind: str, size: int, *rest: Any) -> None:
        real_add(self, name, kind, 0, *rest)

    monkeypatch.setattr(extract._Planner, "add", lying_add)
    details = extract_refused(utility, archive, "too-large", "zeros.bin")
    assert (details["stage"], details["limit"]) == ("extracted", 1 << 20)


def test_extract_rejects_zip_whose_header_sizes_were_patched_down(utility: Utility) -> None:
    """Real lying bytes: both size fields say 100 while the member inflates to 2 MiB.

    The declared total (100) passes a 1 MiB limit; the reader must still not write 2 MiB.
    Python's zipfile stops at the declared size and the CRC then fails: the member is refused
    as corrupt and nothing is left behind.
    """
    path = utility.root / "liar.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("zeros.bin", bytes(2 << 20))
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        info, central = zf.getinfo("zeros.bin"), zf.start_dir
    assert data[info.header_offset : info.header_offset + 4] == b"PK\x03\x04"
    assert data[central : central + 4] == b"PK\x01\x02"
    struct.pack_into("<I", data, info.header_offset + 22, 100)  # local header
    struct.pack_into("<I", data, central + 24, 100)  # central directory
    path.write_bytes(data)
    with zipfile.ZipFile(path) as zf:
        assert zf.getinfo("zeros.bin").file_size == 100
    utility.configure(maxExtractBytes=1 << 20)
    extract_refused(utility, "liar.zip", "corrupt-member", "zeros.bin")


def test_extract_rejects_too_many_members(utility: Utility) -> None:
    archive = zip_with(utility, [(f"f{i:02}.txt", b"x") for i in range(12)])
    utility.configure(maxExtractFiles=10)
    assert extract_refused(utility, archive, "too-many-files", "f10.txt")["limit"] == 10


def test_extract_rejects_unknown_and_corrupt_archives(utility: Utility) -> None:
    utility.write("junk.zip", b"\x00not an archive at all" * 40)
    for payload, code, reason in [
        ({"archive": "junk.zip", "destination": "d"}, "invalid-input", "unknown-format"),
        (
            {"archive": "junk.zip", "destination": "d", "format": "zip"},
            "invalid-input",
            "bad-archive",
        ),
        (
            {"archive": "junk.zip", "destination": "d", "format": "tar"},
            "invalid-input",
            "bad-archive",
        ),
        ({"archive": "no.zip", "destination": "d"}, "failed", "not-found"),
        ({"archive": "junk.zip", "destination": "../d"}, "invalid-input", "parent-traversal"),
        ({"archive": "junk.zip", "destination": "junk.zip"}, "invalid-input", "not-a-directory"),
    ]:
        utility.refuse("archive.extract", payload, code, reason)
    assert utility.names() == ["junk.zip"]


def test_extract_bad_config_is_reported(utility: Utility) -> None:
    zip_with(utility, [("a", b"a")])
    utility.configure(maxExtractBytes="lots")
    payload = {"archive": "evil.zip", "destination": "d"}
    details, _ = utility.refuse("archive.extract", payload, "failed", "bad-config")
    assert details["key"] == "maxExtractBytes"


def test_extract_into_project_root_with_dot_entries(utility: Utility) -> None:
    """Members named the way `tar -C dir -cf x.tar .` names them: "." and "./a.txt"."""
    archive = tar_with(utility, [tar_member(".", tarfile.DIRTYPE), tar_member("./a.txt", size=3)])
    data = utility.ok("archive.extract", {"archive": archive, "destination": "."})
    assert (data["files"], data["bytes"]) == (1, 3)
    assert (utility.root / "a.txt").read_bytes() == b"xxx"
    assert utility.names() == ["a.txt", "evil.tar"]  # no staging directory left


def test_extract_merges_into_existing_directory_all_or_nothing(utility: Utility) -> None:
    archive = zip_with(utility, [("new.txt", b"new"), ("keep.txt", b"from archive")])
    utility.write("dest/keep.txt", "mine")
    payload = {"archive": archive, "destination": "dest"}
    details, _ = utility.refuse("archive.extract", payload, "invalid-input", "exists")
    assert details["member"] == "keep.txt"
    assert utility.tree("dest") == {"keep.txt": b"mine"}  # new.txt was not moved in either
    assert utility.ok("archive.extract", {**payload, "overwrite": True})["files"] == 2
    assert utility.tree("dest") == {"keep.txt": b"from archive", "new.txt": b"new"}


def test_extract_merge_refuses_symlinked_directories(utility: Utility, project: Path) -> None:
    archive = zip_with(utility, [("sub/x.txt", b"x")])
    (project / "elsewhere").mkdir()
    (project / "dest").mkdir()
    (project / "dest/sub").symlink_to(project / "elsewhere")
    payload = {"archive": archive, "destination": "dest", "overwrite": True}
    details, _ = utility.refuse(
        "archive.extract", payload, "invalid-input", "symlink-in-destination"
    )
    assert details["member"] == "sub"
    assert utility.names("elsewhere") == []
    assert utility.names("dest") == ["sub"]
