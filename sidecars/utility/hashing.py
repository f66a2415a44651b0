"""``file.hash``: the digest of one file inside the project, streamed in chunks."""

from __future__ import annotations

import hashlib
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from sidecars.sdk import Context, Sidecar, ToolError
from sidecars.sdk.paths import confine

Algorithm = Literal["sha256", "sha1", "md5", "blake2b"]

CHUNK_BYTES = 1 << 20
"""Read size; one chunk is the most the tool holds in memory."""

PROGRESS_EVERY_BYTES = 64 << 20
"""A progress event is sent after each this many bytes (large files only)."""

DESCRIPTION = (
    "Compute the hex digest of a file inside the project (sha256 by default; also sha1, md5, "
    "blake2b). The file is streamed, so any size works. Paths are relative to the project "
    "directory and may not leave it."
)


class FileHashInput(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    """Which file to hash and how."""

    path: Annotated[str, Meta(description="File path relative to the project directory.")]
    algorithm: Annotated[
        Algorithm | None,
        Meta(description="Digest algorithm; sha256 when omitted. blake2b gives 64 bytes."),
    ] = None


class FileHashOutput(msgspec.Struct, rename="camel"):
    """The digest of the file."""

    path: Annotated[str, Meta(description="The path as given.")]
    algorithm: Annotated[Algorithm, Meta(description="The algorithm used.")]
    digest: Annotated[str, Meta(description="Lowercase hexadecimal digest.")]
    size: Annotated[int, Meta(description="File size in bytes.")]


def file_hash(args: FileHashInput, ctx: Context) -> FileHashOutput:
    """Hash one regular file inside the project.

    Args:
        args: The validated input.
        ctx: The call context (project directory, cancellation, progress).

    Returns:
        The digest, the algorithm and the number of bytes hashed.

    Raises:
        ToolError: ``invalid-input`` for a refused path or a directory, ``failed`` when the
            file is missing or unreadable, ``cancelled`` when the host cancels the call.
    """
    algorithm: Algorithm = args.algorithm or "sha256"
    path = confine(ctx.project_dir, args.path, must_exist=True, kind="file")
    hasher = hashlib.new(algorithm, usedforsecurity=False)
    size = 0
    next_progress = PROGRESS_EVERY_BYTES
    try:
        with path.open("rb") as f:
            while chunk := f.read(CHUNK_BYTES):
                hasher.update(chunk)
                size += len(chunk)
                if size >= next_progress:
                    ctx.check_cancelled()
                    ctx.progress({"bytes": size})
                    next_progress += PROGRESS_EVERY_BYTES
    except OSError as exc:
        raise ToolError(
            f"cannot read {args.path!r}: {exc.strerror or exc}",
            code="failed",
            details={"path": args.path, "reason": "read-error"},
        ) from None
    return FileHashOutput(path=args.path, algorithm=algorithm, digest=hasher.hexdigest(), size=size)


def register(app: Sidecar) -> None:
    """Register ``file.hash`` on ``app``.

    Args:
        app: The utility sidecar.
    """
    app.tool(
        "file.hash",
        description=DESCRIPTION,
        read_only=True,
        concurrency_safe=True,
        permission="read",
    )(file_hash)
