"""Archive formats (suffix inference, content sniffing) and the ``archive.create`` tool.

``archive.create`` never stores a symlink: symlinks met while walking the source are skipped
(not followed, not stored) and listed in ``skipped``, as are sockets, FIFOs and device files.
That keeps every archive it writes extractable by ``archive.extract``, which refuses link
members, and means no archive can smuggle out a file a symlink points at.
"""

from __future__ import annotations

import os
import stat
import tarfile
import zipfile
from pathlib import Path
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from sidecars.sdk import Context, Sidecar, ToolError
from sidecars.sdk.paths import atomic_output, confine, host_private, reject

ArchiveFormat = Literal["zip", "tar", "tar.gz"]

_SUFFIXES: tuple[tuple[str, ArchiveFormat], ...] = (
    (".tar.gz", "tar.gz"),
    (".tgz", "tar.gz"),
    (".tar", "tar"),
    (".zip", "zip"),
)
_UNSUPPORTED_SUFFIXES = (".tar.bz2", ".tbz2", ".tbz", ".tar.xz", ".txz", ".tar.zst", ".7z", ".rar")

CHUNK_BYTES = 1 << 20

DESCRIPTION = (
    "Create a zip, tar or tar.gz archive of a file or directory inside the project. The format "
    "is taken from the output suffix (.zip, .tar, .tar.gz/.tgz) unless given, zip otherwise. "
    "Entries are named after the source (a directory 'src' gives 'src/...'; '.' gives bare "
    "names). Symlinks, sockets, FIFOs and devices are skipped and listed. An existing output is "
    "only replaced with overwrite=true; the archive is written atomically."
)


def infer_format(name: str) -> ArchiveFormat | None:
    """The archive format a file name's suffix implies.

    Args:
        name: A file name or path.

    Returns:
        ``zip``, ``tar`` or ``tar.gz``, or ``None`` when the suffix says nothing.

    Raises:
        ToolError: ``invalid-input`` (reason ``unsupported-format``) for a known archive suffix
            this tool cannot write or read, such as ``.tar.xz``.
    """
    lower = name.lower()
    for suffix, fmt in _SUFFIXES:
        if lower.endswith(suffix):
            return fmt
    for suffix in _UNSUPPORTED_SUFFIXES:
        if lower.endswith(suffix):
            raise reject(
                name,
                "unsupported-format",
                f"{name!r}: {suffix} archives are not supported; use zip, tar or tar.gz",
            )
    return None


def sniff_format(path: Path) -> ArchiveFormat | None:
    """Detect an archive's format from its content.

    Args:
        path: An existing regular file.

    Returns:
        The format, or ``None`` when the content is not a zip, tar or gzip stream. A gzip
        stream is reported as ``tar.gz``; opening it as tar later confirms or refuses it.
    """
    with path.open("rb") as f:
        head = f.read(512)
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return "zip"
    if head.startswith(b"\x1f\x8b"):
        return "tar.gz"
    if head[257:262] == b"ustar":
        return "tar"
    if zipfile.is_zipfile(path):  # a zip with a prefix (self-extracting stub)
        return "zip"
    if len(head) == 512:  # a pre-POSIX tar has no magic: let tarfile check the header checksum
        try:
            with tarfile.open(path, "r:") as tf:
                if tf.next() is not None:
                    return "tar"
        except (tarfile.TarError, OSError, EOFError):
            pass
    return None


class ArchiveCreateInput(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    """What to archive and where to write the archive."""

    source: Annotated[
        str, Meta(description="File or directory to archive, relative to the project ('.' = all).")
    ]
    output: Annotated[str, Meta(description="Archive path to write, relative to the project.")]
    format: Annotated[
        ArchiveFormat | None,
        Meta(description="zip, tar or tar.gz; inferred from the output suffix, else zip."),
    ] = None
    overwrite: Annotated[bool, Meta(description="Replace an existing output file.")] = False


class SkippedEntry(msgspec.Struct, rename="camel"):
    """A path found under the source that was deliberately not archived."""

    path: Annotated[str, Meta(description="Path relative to the project.")]
    reason: Annotated[
        str, Meta(description="symlink, special-file, archive-output or host-private.")
    ]


class ArchiveCreateOutput(msgspec.Struct, rename="camel"):
    """The archive that was written."""

    output: Annotated[str, Meta(description="The archive path as given.")]
    format: Annotated[ArchiveFormat, Meta(description="The format written.")]
    files: Annotated[int, Meta(description="Regular files stored.")]
    directories: Annotated[int, Meta(description="Directory entries stored.")]
    bytes: Annotated[int, Meta(description="Size of the archive file.")]
    source_bytes: Annotated[int, Meta(description="Total size of the stored files.")]
    skipped: Annotated[list[SkippedEntry], Meta(description="Entries left out, with why.")]


class _Entry(msgspec.Struct, frozen=True):
    path: Path
    arcname: str
    is_dir: bool


def _walk(
    root: Path, prefix: str, project: Path, exclude: dict[Path, str | None], ctx: Context
) -> tuple[list[_Entry], list[SkippedEntry]]:
    """List what to archive under directory ``root``, sorted, without following symlinks.

    ``exclude`` maps paths never to store to the reason reported for them (``None``: silent).
    """
    entries: list[_Entry] = []
    skipped: list[SkippedEntry] = []
    if prefix:
        entries.append(_Entry(root, prefix, True))
    stack: list[tuple[Path, str]] = [(root, prefix)]
    while stack:
        ctx.check_cancelled()
        directory, arc_dir = stack.pop()
        with os.scandir(directory) as it:
            children = sorted(it, key=lambda e: e.name)
        subdirs: list[tuple[Path, str]] = []
        for child in children:
            path = Path(child.path)
            arcname = f"{arc_dir}/{child.name}" if arc_dir else child.name
            shown = path.relative_to(project).as_posix()
            if path in exclude:
                why = exclude[path]
                if why is not None:
                    skipped.append(SkippedEntry(shown, why))
            elif host_private(path):
                skipped.append(SkippedEntry(shown, "host-private"))
            elif child.is_symlink():
                skipped.append(SkippedEntry(shown, "symlink"))
            elif child.is_dir(follow_symlinks=False):
                entries.append(_Entry(path, arcname, True))
                subdirs.append((path, arcname))
            elif child.is_file(follow_symlinks=False):
                entries.append(_Entry(path, arcname, False))
            else:
                skipped.append(SkippedEntry(shown, "special-file"))
        stack.extend(reversed(subdirs))  # depth-first, in name order
    return entries, skipped


def _write_zip(tmp: Path, entries: list[_Entry], ctx: Context) -> int:
    """Write ``entries`` to a zip at ``tmp``; return the stored file bytes."""
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, strict_timestamps=False) as zf:
        for entry in entries:
            ctx.check_cancelled()
            zf.write(entry.path, entry.arcname)
        return sum(info.file_size for info in zf.infolist() if not info.is_dir())


def _write_tar(tmp: Path, entries: list[_Entry], fmt: ArchiveFormat, ctx: Context) -> int:
    """Write ``entries`` to a (gzipped) tar at ``tmp``; return the stored file bytes."""
    if fmt == "tar.gz":
        with tarfile.open(tmp, "w:gz", format=tarfile.PAX_FORMAT, compresslevel=6) as tf:
            return _fill_tar(tf, entries, ctx)
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tf:
        return _fill_tar(tf, entries, ctx)


def _fill_tar(tf: tarfile.TarFile, entries: list[_Entry], ctx: Context) -> int:
    """Add ``entries`` to ``tf``; return the stored file bytes.

    TarInfo objects are built by hand rather than with ``gettarinfo`` so a file with several
    hard links is stored as a regular file each time, never as a link member, and owner
    names and ids are not recorded.
    """
    total = 0
    for entry in entries:
        ctx.check_cancelled()
        info = tarfile.TarInfo(entry.arcname)
        if entry.is_dir:
            st = entry.path.stat()
            info.type = tarfile.DIRTYPE
            info.mode = stat.S_IMODE(st.st_mode)
            info.mtime = int(st.st_mtime)
            tf.addfile(info)
            continue
        with entry.path.open("rb") as f:
            st = os.fstat(f.fileno())
            info.size = st.st_size
            info.mode = stat.S_IMODE(st.st_mode)
            info.mtime = int(st.st_mtime)
            tf.addfile(info, f)
        total += st.st_size
    return total


def archive_create(args: ArchiveCreateInput, ctx: Context) -> ArchiveCreateOutput:
    """Archive a file or directory inside the project into a new archive file.

    Args:
        args: The validated input.
        ctx: The call context.

    Returns:
        What was written: counts, sizes and the skipped entries.

    Raises:
        ToolError: ``invalid-input`` for refused paths, an existing output without
            ``overwrite``, or an unsupported suffix; ``failed`` for a missing source or an
            I/O error while writing.
    """
    project = Path(os.path.realpath(ctx.project_dir))
    source = confine(project, args.source, must_exist=True, kind="any", label="source")
    target = confine(project, args.output, must_exist=False, kind="file", label="output")
    fmt: ArchiveFormat = args.format or infer_format(args.output) or "zip"
    if os.path.lexists(target) and not args.overwrite:
        raise reject(
            args.output, "exists", f"output {args.output!r} exists; pass overwrite=true to replace"
        )
    if source == target:
        raise reject(args.output, "source-is-output", "source and output are the same file")
    is_dir = source.is_dir()
    if not is_dir and not source.is_file():
        raise reject(args.source, "not-a-file", f"source {args.source!r} is not a regular file")
    parts = [p for p in args.source.replace("\\", "/").split("/") if p not in ("", ".")]
    prefix = parts[-1] if parts else ""
    try:
        with atomic_output(target, suffix=".tmp") as tmp:
            if is_dir:
                entries, skipped = _walk(
                    source, prefix, project, {target: "archive-output", tmp: None}, ctx
                )
            else:
                entries, skipped = [_Entry(source, prefix, False)], []
            if fmt == "zip":
                source_bytes = _write_zip(tmp, entries, ctx)
            else:
                source_bytes = _write_tar(tmp, entries, fmt, ctx)
            size = tmp.stat().st_size
    except OSError as exc:
        raise ToolError(
            f"cannot create archive {args.output!r}: {exc}",
            code="failed",
            details={"path": args.output, "reason": "io-error"},
        ) from None
    return ArchiveCreateOutput(
        output=args.output,
        format=fmt,
        files=sum(1 for e in entries if not e.is_dir),
        directories=sum(1 for e in entries if e.is_dir),
        bytes=size,
        source_bytes=source_bytes,
        skipped=skipped,
    )


def register(app: Sidecar) -> None:
    """Register ``archive.create`` on ``app``.

    Args:
        app: The utility sidecar.
    """
    app.tool("archive.create", description=DESCRIPTION, permission="write")(archive_create)
