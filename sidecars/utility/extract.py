"""``archive.extract``: unpack a zip, tar or tar.gz inside the project, refusing hostile input.

Three phases, so a refused archive leaves nothing behind:

1. **Plan.** Every member is checked before one byte is written: names (absolute, ``..``,
   NUL), types (symlink, hard link, device, FIFO, encrypted), file/directory conflicts, the
   member count (``maxExtractFiles``, default 10000) and the total of the *declared* sizes
   (``maxExtractBytes``, default 256 MiB). A tar is scanned incrementally, so a stream with
   millions of members is refused at member 10001 rather than read to the end.
2. **Stage.** Members are written into a fresh hidden staging directory (a sibling of the
   destination, or inside it when it already exists) while the bytes actually produced are
   counted against the same ``maxExtractBytes``: declared sizes are only a claim.
3. **Commit.** A new destination is the staging directory renamed into place (atomic). An
   existing destination directory is merged: every target is checked first (no symlinked
   directories on the way, no file/directory clashes, no existing file unless
   ``overwrite``), then the files are renamed in. On any failure the staging directory and any
   parent directory the call created are removed.

File modes keep only the executable bit (``0o755``/``0o644`` less the umask); owners, setuid
bits and directory modes from the archive are ignored. File modification times are kept.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import shutil
import stat
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Annotated, Any

import msgspec
from msgspec import Meta

from sidecars.sdk import Context, Sidecar, ToolError
from sidecars.sdk.paths import confine, create_parents, host_private, reject, remove_created
from sidecars.utility.archives import ArchiveFormat, sniff_format

DEFAULT_MAX_EXTRACT_BYTES = 256 << 20
DEFAULT_MAX_EXTRACT_FILES = 10_000
CHUNK_BYTES = 1 << 20

DESCRIPTION = (
    "Extract a zip, tar or tar.gz archive inside the project into a destination directory "
    "(created if missing; merged into if it exists, replacing files only with overwrite=true). "
    "The format is detected from the content unless given. Archives with absolute or '..' "
    "member paths, links, device or FIFO members, or more than the configured files/bytes "
    "(default 10000 files, 256 MiB) are refused as a whole and nothing is written."
)

_READ_ERRORS = (
    OSError,
    EOFError,
    zlib.error,
    zipfile.BadZipFile,
    tarfile.TarError,
    NotImplementedError,
    RuntimeError,
)


class ArchiveExtractInput(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    """Which archive to extract and where."""

    archive: Annotated[str, Meta(description="Archive file, relative to the project.")]
    destination: Annotated[
        str, Meta(description="Directory to extract into, relative to the project ('.' = root).")
    ]
    format: Annotated[
        ArchiveFormat | None, Meta(description="zip, tar or tar.gz; detected from content.")
    ] = None
    overwrite: Annotated[
        bool, Meta(description="Replace files that already exist in the destination.")
    ] = False


class ArchiveExtractOutput(msgspec.Struct, rename="camel"):
    """What was extracted."""

    destination: Annotated[str, Meta(description="The destination as given.")]
    format: Annotated[ArchiveFormat, Meta(description="The archive format.")]
    files: Annotated[int, Meta(description="Regular files written.")]
    directories: Annotated[int, Meta(description="Directories in the archive.")]
    bytes: Annotated[int, Meta(description="Uncompressed bytes written.")]


@dataclass(frozen=True, slots=True)
class _Member:
    name: str
    parts: tuple[str, ...]
    is_dir: bool
    size: int
    executable: bool
    mtime: float
    ref: Any  # the zipfile.ZipInfo or tarfile.TarInfo


class _Refusal(Exception):
    """A member-level refusal, turned into a ToolError naming the archive."""

    def __init__(self, member: str, reason: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.member = member
        self.reason = reason
        self.message = message
        self.extra = extra


@dataclass(slots=True)
class _Limits:
    max_bytes: int
    max_files: int
    written: int = 0


def _config_limit(ctx: Context, key: str, default: int) -> int:
    value = ctx.config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ToolError(
            f"sidecar config {key} must be a non-negative integer, got {value!r}",
            code="failed",
            details={"reason": "bad-config", "key": key},
        )
    return value


# planning ----------------------------------------------------------------------------------

_DRIVE = re.compile(r"^[A-Za-z]:")


def _member_parts(name: str) -> tuple[str, ...]:
    """Split a member name into safe components or raise :class:`_Refusal`."""
    if "\x00" in name:
        raise _Refusal(name, "bad-name", f"member {name!r} has a NUL byte in its name")
    if name.startswith(("/", "\\")) or _DRIVE.match(name):
        raise _Refusal(name, "absolute-path", f"member {name!r} has an absolute path")
    parts = tuple(p for p in re.split(r"[\\/]", name) if p not in ("", "."))
    if ".." in parts:
        raise _Refusal(name, "parent-traversal", f"member {name!r} contains a '..' component")
    return parts


class _Planner:
    """Accumulates validated members and enforces count, size and conflict rules."""

    def __init__(self, limits: _Limits) -> None:
        self.limits = limits
        self.members: list[_Member] = []
        self.seen = 0
        self.declared = 0
        self.files: set[tuple[str, ...]] = set()
        self.dirs: set[tuple[str, ...]] = set()

    def add(self, name: str, kind: str, size: int, mode: int, mtime: float, ref: Any) -> None:
        self.seen += 1
        if self.seen > self.limits.max_files:
            raise _Refusal(
                name,
                "too-many-files",
                f"archive has more than {self.limits.max_files} members (at {name!r})",
                limit=self.limits.max_files,
            )
        parts = _member_parts(name)
        if kind in ("symlink", "hardlink"):
            raise _Refusal(
                name, f"{kind}-member", f"member {name!r} is a {kind}; links are refused"
            )
        if kind == "special":
            raise _Refusal(
                name, "special-member", f"member {name!r} is a device, FIFO or socket; refused"
            )
        is_dir = kind == "dir"
        if not parts:
            if is_dir:
                return  # "./": the destination itself
            raise _Refusal(name, "bad-name", f"member {name!r} has an empty path")
        for i in range(1, len(parts)):
            if parts[:i] in self.files:
                raise _Refusal(
                    name,
                    "member-conflict",
                    f"member {name!r} is below a file member of the archive",
                )
        if (parts in self.files) if is_dir else (parts in self.dirs):
            raise _Refusal(name, "member-conflict", f"member {name!r} is both file and directory")
        self.dirs.update(parts[:i] for i in range(1, len(parts)))
        if is_dir:
            self.dirs.add(parts)
        else:
            self.files.add(parts)
            self.declared += size
            if self.declared > self.limits.max_bytes:
                raise _Refusal(
                    name,
                    "too-large",
                    f"archive declares more than {self.limits.max_bytes} uncompressed bytes "
                    f"(limit reached at member {name!r})",
                    limit=self.limits.max_bytes,
                    stage="declared",
                )
        executable = bool(mode & 0o111) and not is_dir
        self.members.append(_Member(name, parts, is_dir, size, executable, mtime, ref))


def _zip_kind(info: zipfile.ZipInfo) -> str:
    mode = info.external_attr >> 16
    if mode and stat.S_ISLNK(mode):
        return "symlink"
    if mode and (
        stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)
    ):
        return "special"
    return "dir" if info.is_dir() else "file"


def _plan_zip(zf: zipfile.ZipFile, planner: _Planner) -> None:
    for info in zf.infolist():
        if info.flag_bits & 0x1:
            raise _Refusal(
                info.filename, "encrypted-member", f"member {info.filename!r} is encrypted"
            )
        mode = info.external_attr >> 16
        mtime = _zip_mtime(info)
        planner.add(info.filename, _zip_kind(info), info.file_size, mode, mtime, info)


def _zip_mtime(info: zipfile.ZipInfo) -> float:
    try:
        return datetime.datetime(*info.date_time).timestamp()
    except (ValueError, OverflowError):
        return 0.0


def _tar_kind(info: tarfile.TarInfo) -> str:
    if info.issym():
        return "symlink"
    if info.islnk():
        return "hardlink"
    if info.isdir():
        return "dir"
    if info.isreg():
        return "file"
    return "special"  # character/block device, FIFO, or a type tarfile does not know


def _plan_tar(tf: tarfile.TarFile, planner: _Planner) -> None:
    while (info := tf.next()) is not None:
        planner.add(info.name, _tar_kind(info), info.size, info.mode, info.mtime, info)


# staging -----------------------------------------------------------------------------------


def _read_error(member: str, exc: BaseException) -> _Refusal:
    return _Refusal(member, "corrupt-member", f"member {member!r} cannot be read: {exc}")


def _copy(src: IO[bytes], dst: IO[bytes], member: str, limits: _Limits, ctx: Context) -> None:
    """Copy one member, counting the bytes really produced against the byte limit.

    Errors while reading are the archive's fault (:class:`_Refusal`); errors while writing
    (``OSError``) are the file system's and propagate as they are.
    """
    while True:
        try:
            chunk = src.read(CHUNK_BYTES)
        except _READ_ERRORS as exc:
            raise _read_error(member, exc) from None
        if not chunk:
            return
        limits.written += len(chunk)
        if limits.written > limits.max_bytes:
            raise _Refusal(
                member,
                "too-large",
                f"extracting member {member!r} produced more than {limits.max_bytes} bytes in "
                "total; the archive's declared sizes are wrong",
                limit=limits.max_bytes,
                stage="extracted",
            )
        dst.write(chunk)
        ctx.check_cancelled()


def _stage(
    members: list[_Member],
    opener: Callable[[Any], IO[bytes]],
    staging: Path,
    limits: _Limits,
    ctx: Context,
) -> int:
    """Write every planned member below ``staging``; return the number of files written."""
    files = 0
    for member in members:
        ctx.check_cancelled()
        target = staging.joinpath(*member.parts)
        if member.is_dir:
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            src = opener(member.ref)
        except _READ_ERRORS as exc:
            raise _read_error(member.name, exc) from None
        with src, target.open("wb") as dst:
            _copy(src, dst, member.name, limits, ctx)
        if member.executable:
            mode = target.stat().st_mode
            target.chmod(mode | ((mode & 0o444) >> 2))
        if member.mtime:
            with contextlib.suppress(OSError, OverflowError, ValueError):
                os.utime(target, (member.mtime, member.mtime))
        files += 1
    return files


# committing --------------------------------------------------------------------------------


def _walk_staged(staging: Path) -> Iterator[tuple[tuple[str, ...], bool]]:
    """Yield (relative parts, is_dir) for everything staged, parents before children."""
    for dirpath, dirnames, filenames in os.walk(staging):
        rel = Path(dirpath).relative_to(staging).parts
        dirnames.sort()
        for d in dirnames:
            yield (*rel, d), True
        for f in sorted(filenames):
            yield (*rel, f), False


def _check_merge(
    dest: Path, staged: Iterable[tuple[tuple[str, ...], bool]], overwrite: bool
) -> None:
    """Refuse a merge that would follow a symlink, clash with a file, or overwrite silently."""
    for parts, is_dir in staged:
        name = "/".join(parts)
        try:
            st = os.lstat(dest.joinpath(*parts))
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            raise _Refusal(
                name, "symlink-in-destination", f"destination path {name!r} is a symlink; refused"
            )
        if is_dir and not stat.S_ISDIR(st.st_mode):
            raise _Refusal(
                name, "member-conflict", f"member {name!r} is a directory, the destination a file"
            )
        if not is_dir and stat.S_ISDIR(st.st_mode):
            raise _Refusal(
                name, "member-conflict", f"member {name!r} is a file, the destination a directory"
            )
        if not is_dir and not overwrite:
            raise _Refusal(
                name, "exists", f"{name!r} already exists in the destination; pass overwrite=true"
            )


def _check_private(dest: Path, members: Iterable[_Member]) -> None:
    """Refuse a member whose target is one of the host's own files (PROTOCOL 1)."""
    for member in members:
        if host_private(dest.joinpath(*member.parts)):
            raise _Refusal(
                member.name,
                "host-private",
                f"member {member.name!r} would be written to the host's own files; refused",
            )


def _merge(staging: Path, dest: Path, overwrite: bool) -> None:
    staged = list(_walk_staged(staging))
    _check_merge(dest, staged, overwrite)
    for parts, is_dir in staged:
        target = dest.joinpath(*parts)
        if is_dir:
            target.mkdir(exist_ok=True)
        else:
            os.replace(staging.joinpath(*parts), target)


# the tool ----------------------------------------------------------------------------------


def _open_archive(path: Path, fmt: ArchiveFormat) -> tuple[Any, Callable[[Any], IO[bytes]]]:
    """Open ``path``; return the archive object and a member opener."""
    if fmt == "zip":
        zf = zipfile.ZipFile(path)
        return zf, zf.open
    tf = tarfile.open(path, "r:gz" if fmt == "tar.gz" else "r:")  # noqa: SIM115 (caller closes)

    def open_member(info: tarfile.TarInfo) -> IO[bytes]:
        f = tf.extractfile(info)
        if f is None:
            raise tarfile.ReadError(f"no data for {info.name!r}")
        return f

    return tf, open_member


def archive_extract(args: ArchiveExtractInput, ctx: Context) -> ArchiveExtractOutput:
    """Extract an archive inside the project, all or nothing.

    Args:
        args: The validated input.
        ctx: The call context; ``ctx.config`` may set ``maxExtractBytes``/``maxExtractFiles``.

    Returns:
        The counts of files, directories and bytes written.

    Raises:
        ToolError: ``invalid-input`` for a refused path, an unknown format or any refused
            member (``details.member`` names it); ``failed`` for a missing archive or I/O error.
    """
    limits = _Limits(
        max_bytes=_config_limit(ctx, "maxExtractBytes", DEFAULT_MAX_EXTRACT_BYTES),
        max_files=_config_limit(ctx, "maxExtractFiles", DEFAULT_MAX_EXTRACT_FILES),
    )
    project = Path(os.path.realpath(ctx.project_dir))
    archive = confine(project, args.archive, must_exist=True, kind="file", label="archive")
    dest = confine(project, args.destination, must_exist=False, kind="dir", label="destination")
    try:
        fmt = args.format or sniff_format(archive)
    except OSError as exc:
        raise ToolError(
            f"cannot read archive {args.archive!r}: {exc.strerror or exc}",
            code="failed",
            details={"path": args.archive, "reason": "read-error"},
        ) from None
    if fmt is None:
        raise reject(
            args.archive, "unknown-format", f"archive {args.archive!r} is not a zip, tar or tar.gz"
        )

    def refused(r: _Refusal) -> ToolError:
        details = {"path": args.archive, "member": r.member, "reason": r.reason, **r.extra}
        return ToolError(
            f"archive {args.archive!r} refused: {r.message}", code="invalid-input", details=details
        )

    try:
        handle, opener = _open_archive(archive, fmt)
    except _READ_ERRORS as exc:
        raise reject(
            args.archive, "bad-archive", f"archive {args.archive!r} is not a valid {fmt}: {exc}"
        ) from None
    with handle:
        planner = _Planner(limits)
        try:
            if fmt == "zip":
                _plan_zip(handle, planner)
            else:
                _plan_tar(handle, planner)
            _check_private(dest, planner.members)
        except _Refusal as r:
            raise refused(r) from None
        except _READ_ERRORS as exc:
            raise reject(
                args.archive, "bad-archive", f"archive {args.archive!r} is corrupt: {exc}"
            ) from None
        existed = dest.exists()
        created: list[Path] = []
        staging: Path | None = None
        try:
            if not existed:
                created = create_parents(dest)
            parent = dest if existed else dest.parent
            staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.extract-", dir=parent))
            files = _stage(planner.members, opener, staging, limits, ctx)
            if existed:
                _merge(staging, dest, args.overwrite)
            else:
                os.rename(staging, dest)
        except _Refusal as r:
            raise refused(r) from None
        except OSError as exc:
            raise ToolError(
                f"cannot extract {args.archive!r} into {args.destination!r}: {exc}",
                code="failed",
                details={"path": args.destination, "reason": "io-error"},
            ) from None
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
            if not dest.exists():
                remove_created(created)
    return ArchiveExtractOutput(
        destination=args.destination,
        format=fmt,
        files=files,
        directories=sum(1 for m in planner.members if m.is_dir),
        bytes=limits.written,
    )


def register(app: Sidecar) -> None:
    """Register ``archive.extract`` on ``app``.

    Args:
        app: The utility sidecar.
    """
    app.tool("archive.extract", description=DESCRIPTION, permission="write")(archive_extract)
