"""The package manager's one exception: a stable code, a message, and the problems behind it."""

from __future__ import annotations

from typing import Literal

ErrorCode = Literal[
    "invalid-package",  # package.toml or the payload breaks a rule (problems name each one)
    "checksum-mismatch",  # the payload is not what package.toml's checksum says
    "incompatible",  # compatibleCore or the protocol version does not admit this toolhost
    "conflict",  # the operation does not fit the current state (already installed, ...)
    "not-found",  # no such package, nothing staged, no previous version
    "busy",  # another package operation holds the lock
    "io-failed",  # the file system refused a step; the step was undone
]


class PackageError(Exception):
    """A refused or failed package operation.

    Attributes:
        code: One of :data:`ErrorCode`.
        message: One line for the operator.
        problems: Every rule that failed, each naming what is wrong (validation refusals).
        committed: For ``io-failed``: the registry swap had already happened, so the
            transaction completes on recovery instead of being undone.
    """

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        problems: list[str] | None = None,
        *,
        committed: bool = False,
    ) -> None:
        super().__init__(message)
        self.code: ErrorCode = code
        self.message = message
        self.problems = list(problems or [])
        self.committed = committed

    def __str__(self) -> str:
        if not self.problems or self.problems == [self.message]:
            return self.message
        return self.message + "".join(f"\n  - {p}" for p in self.problems)
