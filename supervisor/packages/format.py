"""The package format: ``package.toml`` plus a payload, as a folder or a ``.tar.gz``.

# Strategy: a package is checked in three independent passes, each collecting every problem it
# finds (so one refusal names them all): ``package.toml`` against its Struct and the rules a
# Struct cannot say (portable command and args, no builtin tool names); the payload walk (regular
# files, folders and in-package relative symlinks only; nothing absolute, nothing leading out);
# and the checksum over the walk. Archives are checked member by member before anything is
# extracted, into a temporary folder outside the app root, so a refused archive changes nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import re
import stat
import tarfile
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import msgspec
import tomli_w

from supervisor.contracts.packages import PackageFile
from supervisor.contracts.validation import describe_all
from supervisor.packages.errors import ErrorCode, PackageError
from supervisor.packages.fsio import IGNORED_DIRS
from supervisor.policy.version import RangeError, compatibility, satisfies
from supervisor.registry.load import is_builtin

PACKAGE_FILE = "package.toml"
PACKAGE_PLACEHOLDER = "{package}"
MAX_PAYLOAD_BYTES = 256 * 1024 * 1024
MAX_PAYLOAD_ENTRIES = 20_000
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")

OWNED_KEYS = (
    "command",
    "args",
    "cwd",
    "protocol",
    "mode",
    "tools",
    "packageId",
    "packageVersion",
    "protocolVersion",
    "compatibleCore",
    "upgrade",
)
"""Registry-entry keys the package decides; every other key belongs to the operator."""

_BAD_NAME = re.compile(r"[\x00-\x1f\x7f\\]")


class PayloadEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One payload item as the checksum sees it."""

    path: str
    kind: Literal["d", "f", "x", "l"]
    """folder, file, executable file, symlink"""
    digest: str = "-"
    """sha256 of a file's bytes, or a symlink's target"""
    size: int = 0


def _refuse(problems: list[str], message: str | None = None) -> PackageError:
    if message is None:
        message = problems[0] if len(problems) == 1 else f"the package has {len(problems)} problems"
    return PackageError("invalid-package", message, problems)


# package.toml ------------------------------------------------------------------------------


def read_package(root: Path) -> PackageFile:
    """Read and validate ``root/package.toml`` (the payload is checked by :func:`scan_payload`).

    Raises:
        PackageError: ``invalid-package`` with every problem found.
    """
    path = root / PACKAGE_FILE
    if path.is_symlink() or not path.is_file():
        raise _refuse([f"{PACKAGE_FILE}: missing at the package root"])
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise _refuse([f"{PACKAGE_FILE}: not valid TOML: {exc}"]) from exc
    shape = describe_all(PackageFile, raw)
    if shape:
        problems = [f"{PACKAGE_FILE}: {p}" for p in shape]
        stand_in = _stand_in(raw, shape)
        if stand_in is not None:  # the fields that are right still get their rules checked
            problems += check_rules(stand_in, root)
        raise _refuse(problems)
    pkg = msgspec.convert(raw, PackageFile)
    problems = check_rules(pkg, root)
    if problems:
        raise _refuse(problems)
    return pkg


_NEUTRAL: dict[str, object] = {
    "id": "x",
    "version": "0",
    "kind": "process-json",
    "protocol": "1",
    "command": "x",
    "tools": ["x.y"],
    "compatibleCore": ">=0",
    "checksum": "sha256:" + "0" * 64,
}
_FIELD = re.compile(r"^([A-Za-z]+)")


def _stand_in(raw: dict[str, object], shape: list[str]) -> PackageFile | None:
    """``raw`` with each field that broke its type replaced by a value no rule objects to."""
    bad = {m.group(1) for p in shape if (m := _FIELD.match(p))}
    known = {f.encode_name for f in msgspec.structs.fields(PackageFile)}
    doc = {k: v for k, v in raw.items() if k in known and k not in bad}
    for key in bad & known:
        if key in _NEUTRAL:
            doc[key] = _NEUTRAL[key]
    try:
        return msgspec.convert(doc, PackageFile)
    except msgspec.ValidationError:
        return None


def _has_dotdot(path: str) -> bool:
    return ".." in path.split("/")


def check_rules(pkg: PackageFile, root: Path | None) -> list[str]:
    """What ``pkg`` breaks beyond its Struct: portable command and args, tool names, defaults.

    ``root`` (the package folder) lets the command be checked on disk; None skips that part.
    """
    out: list[str] = []
    cmd = pkg.command
    if posixpath.isabs(cmd) or cmd.startswith("~"):
        out.append(
            f"command: absolute paths are refused ({cmd!r}); use a path inside the package "
            "(bin/tool) or a bare PATH name (python)"
        )
    elif _BAD_NAME.search(cmd):
        out.append(f"command: {cmd!r} contains a control character or backslash")
    elif "/" in cmd:
        norm = posixpath.normpath(cmd)
        if _has_dotdot(cmd) or norm.startswith(".."):
            out.append(f"command: {cmd!r} uses '..'; it must stay inside the package")
        elif root is not None:
            out += _check_command_file(root, norm, cmd)
    for i, arg in enumerate(pkg.args):
        where = f"args[{i}]"
        if posixpath.isabs(arg) or arg.startswith("~"):
            out.append(f"{where}: absolute paths are refused ({arg!r})")
        elif "/" in arg and _has_dotdot(arg):
            out.append(f"{where}: {arg!r} uses '..'; paths must stay inside the package")
        elif PACKAGE_PLACEHOLDER in arg and not arg.startswith(PACKAGE_PLACEHOLDER):
            out.append(f"{where}: {PACKAGE_PLACEHOLDER} may only start an argument")
    seen: set[str] = set()
    for i, tool in enumerate(pkg.tools):
        if tool in seen:
            out.append(f"tools[{i}]: {tool} is listed twice")
        seen.add(tool)
        if is_builtin(tool):
            out.append(
                f"tools[{i}]: {tool} is a builtin coding tool; packages must not duplicate it"
            )
    try:
        satisfies("0", pkg.compatible_core)
    except RangeError as exc:
        out.append(f"compatibleCore: {exc}")
    for key in pkg.defaults:
        if key in OWNED_KEYS:
            out.append(f"defaults.{key}: decided by the package itself, not a default")
    return out


def _check_command_file(root: Path, norm: str, cmd: str) -> list[str]:
    target = root / norm
    real_root = os.path.realpath(root)
    real = os.path.realpath(target)
    if not (real == real_root or real.startswith(real_root.rstrip("/") + "/")):
        return [f"command: {cmd!r} is a link out of the package"]
    if not os.path.isfile(real):
        return [f"command: {cmd!r} is not a file in the package"]
    if not os.access(real, os.X_OK):
        return [f"command: {cmd!r} is not executable (chmod +x it before packing)"]
    return []


def check_compatible(pkg: PackageFile, host_version: str) -> None:
    """Refuse a package this host cannot run (``compatibleCore``, sidecar protocol version).

    Raises:
        PackageError: ``incompatible``.
    """
    state, message = compatibility(
        host_version, pkg.compatible_core, protocol=pkg.kind, protocol_version=pkg.protocol
    )
    if state == "incompatible":
        raise PackageError("incompatible", f"{pkg.id} {pkg.version}: {message}")


def render_package(pkg: PackageFile) -> bytes:
    """``package.toml`` as the manager writes it (tomli-w; empty optional fields left out)."""
    doc = {k: v for k, v in msgspec.to_builtins(pkg).items() if v not in ("", [], {})}
    return tomli_w.dumps(doc).encode()


def registry_command(pkg: PackageFile, install_rel: str) -> tuple[str, list[str]]:
    """The registry ``command`` and ``args`` for ``pkg`` installed at ``install_rel``.

    ``install_rel`` is relative to the app root (``tools/packages/<id>``); the command becomes
    ``./tools/packages/<id>/bin/x`` (cwd anchor ``app``) and ``{package}`` in args the same
    relative folder. Nothing absolute is produced.
    """
    base = "./" + install_rel.strip("/")
    cmd = pkg.command
    if "/" in cmd:
        cmd = base + "/" + posixpath.normpath(cmd)
    args = [
        base + a[len(PACKAGE_PLACEHOLDER) :] if a.startswith(PACKAGE_PLACEHOLDER) else a
        for a in pkg.args
    ]
    return cmd, args


# payload -----------------------------------------------------------------------------------


def scan_payload(root: Path) -> list[PayloadEntry]:
    """Every payload item under ``root`` in a stable order (``package.toml`` excluded).

    Raises:
        PackageError: ``invalid-package`` naming each link out, absolute link, special file or
            oversized payload.
    """
    entries: list[PayloadEntry] = []
    problems: list[str] = []
    total = 0
    real_root = os.path.realpath(root)

    def walk(folder: str, rel: str) -> None:
        nonlocal total
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            name = entry.name
            path = f"{rel}/{name}" if rel else name
            if not rel and name == PACKAGE_FILE:
                continue
            if name in IGNORED_DIRS and entry.is_dir(follow_symlinks=False):
                continue
            if _BAD_NAME.search(name):
                problems.append(f"{path!r}: file names must not hold control characters")
                continue
            if len(entries) >= MAX_PAYLOAD_ENTRIES:
                problems.append(f"payload: more than {MAX_PAYLOAD_ENTRIES} entries")
                return
            if entry.is_symlink():
                target = os.readlink(entry.path)
                problem = _link_problem(path, target, real_root, entry.path)
                if problem:
                    problems.append(problem)
                    continue
                entries.append(PayloadEntry(path=path, kind="l", digest=target))
            elif entry.is_dir(follow_symlinks=False):
                entries.append(PayloadEntry(path=path, kind="d"))
                walk(entry.path, path)
            elif entry.is_file(follow_symlinks=False):
                st = entry.stat(follow_symlinks=False)
                total += st.st_size
                if total > MAX_PAYLOAD_BYTES:
                    problems.append(f"payload: larger than {MAX_PAYLOAD_BYTES} bytes")
                    return
                kind: Literal["f", "x"] = "x" if st.st_mode & stat.S_IXUSR else "f"
                entries.append(
                    PayloadEntry(path=path, kind=kind, digest=_sha256(entry.path), size=st.st_size)
                )
            else:
                problems.append(f"{path}: not a regular file, folder or symlink")

    walk(os.fspath(root), "")
    if problems:
        raise _refuse(problems)
    return entries


def _link_problem(path: str, target: str, real_root: str, full: str) -> str | None:
    if posixpath.isabs(target):
        return f"{path}: symlink to an absolute path ({target!r}) is refused"
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    real = os.path.realpath(full)
    if joined.startswith("..") or not (real == real_root or real.startswith(real_root + "/")):
        return f"{path}: symlink leads out of the package ({target!r})"
    return None


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def payload_checksum(entries: list[PayloadEntry]) -> str:
    """``sha256:<hex>`` over one line per entry: ``<kind> <digest> <path>``."""
    h = hashlib.sha256()
    for e in entries:
        h.update(f"{e.kind} {e.digest} {e.path}\n".encode())
    return "sha256:" + h.hexdigest()


def _checksum_problem(pkg: PackageFile, entries: list[PayloadEntry]) -> str | None:
    actual = payload_checksum(entries)
    if actual == pkg.checksum:
        return None
    return f"{pkg.id} {pkg.version}: payload checksum is {actual}, package.toml says {pkg.checksum}"


def verify_payload(root: Path, pkg: PackageFile) -> None:
    """Check the payload's rules and its checksum against ``package.toml``.

    Raises:
        PackageError: ``invalid-package`` or ``checksum-mismatch``.
    """
    problem = _checksum_problem(pkg, scan_payload(root))
    if problem is not None:
        raise PackageError("checksum-mismatch", problem, [problem])


def load_verified(root: Path, host_version: str) -> PackageFile:
    """Everything a package must pass before it is staged or applied (all three passes).

    Every pass runs even when an earlier one failed, so the refusal names every problem; its
    code is the gravest kind found (``invalid-package``, then ``incompatible``, then
    ``checksum-mismatch``).

    Raises:
        PackageError: with every problem in ``problems``.
    """
    found: dict[ErrorCode, list[str]] = {
        "invalid-package": [],
        "incompatible": [],
        "checksum-mismatch": [],
    }
    pkg: PackageFile | None = None
    entries: list[PayloadEntry] | None = None
    try:
        pkg = read_package(root)
    except PackageError as exc:
        found["invalid-package"] += exc.problems
    try:
        entries = scan_payload(root)
    except PackageError as exc:
        found["invalid-package"] += exc.problems
    if pkg is not None:
        try:
            check_compatible(pkg, host_version)
        except PackageError as exc:
            found["incompatible"].append(exc.message)
        if entries is not None:
            problem = _checksum_problem(pkg, entries)
            if problem is not None:
                found["checksum-mismatch"].append(problem)
    problems = [p for kind in found.values() for p in kind]
    if not problems:
        assert pkg is not None
        return pkg
    code = next(k for k, v in found.items() if v)
    message = problems[0] if len(problems) == 1 else f"the package has {len(problems)} problems"
    raise PackageError(code, message, problems)


# sources -----------------------------------------------------------------------------------


def is_archive(path: Path) -> bool:
    return path.name.endswith(ARCHIVE_SUFFIXES)


def _member_problems(members: list[tarfile.TarInfo]) -> list[str]:
    problems: list[str] = []
    total = 0
    if len(members) > MAX_PAYLOAD_ENTRIES:
        return [f"archive: more than {MAX_PAYLOAD_ENTRIES} members"]
    for m in members:
        name = m.name
        if posixpath.isabs(name) or name.startswith("~"):
            problems.append(f"archive member {name!r}: absolute paths are refused")
        elif _has_dotdot(name):
            problems.append(f"archive member {name!r}: '..' leaves the package")
        elif m.islnk():
            problems.append(f"archive member {name!r}: hard links are refused")
        elif m.issym():
            target = m.linkname
            joined = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
            if posixpath.isabs(target):
                problems.append(f"archive member {name!r}: symlink to an absolute path")
            elif joined.startswith(".."):
                problems.append(f"archive member {name!r}: symlink leads out of the package")
        elif not (m.isfile() or m.isdir()):
            problems.append(f"archive member {name!r}: not a regular file, folder or symlink")
        total += max(0, m.size)
    if total > MAX_PAYLOAD_BYTES:
        problems.append(f"archive: unpacks to more than {MAX_PAYLOAD_BYTES} bytes")
    return problems


def extract_archive(archive: Path, into: Path) -> Path:
    """Check every member, then extract ``archive`` into ``into``; returns the package root.

    The root is ``into`` itself or its single top folder, whichever holds ``package.toml``.

    Raises:
        PackageError: ``invalid-package`` naming each refused member.
    """
    try:
        with tarfile.open(archive, "r:*") as tf:
            members = tf.getmembers()
            problems = _member_problems(members)
            if problems:
                raise _refuse(problems)
            tf.extractall(into, members=members, filter="data")
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise _refuse([f"{archive.name}: not a readable tar archive: {exc}"]) from exc
    if (into / PACKAGE_FILE).exists():
        return into
    tops = [p for p in into.iterdir()]
    if len(tops) == 1 and tops[0].is_dir() and (tops[0] / PACKAGE_FILE).exists():
        return tops[0]
    raise _refuse([f"{archive.name}: no {PACKAGE_FILE} at the archive root"])


@contextlib.contextmanager
def open_source(source: Path) -> Iterator[Path]:
    """The package folder of ``source`` (a folder, or an archive extracted to a temp folder)."""
    if source.is_dir():
        yield source
        return
    if not source.is_file():
        raise PackageError("not-found", f"no package at {source.name!r}: no such file or folder")
    if not is_archive(source):
        raise _refuse([f"{source.name}: a package is a folder or a .tar.gz archive"])
    with tempfile.TemporaryDirectory(prefix="toolhost-pkg-") as tmp:
        yield extract_archive(source, Path(tmp))


def write_checksum(root: Path) -> str:
    """Compute the payload checksum and write it into ``root/package.toml`` (for authors).

    Replaces an existing top-level ``checksum = ...`` line, else adds one at the top, so the
    author's comments and layout stay as they were.
    """
    value = payload_checksum(scan_payload(root))
    path = root / PACKAGE_FILE
    text = path.read_text(encoding="utf-8")
    line = f'checksum = "{value}"'
    new, n = re.subn(r'(?m)^checksum\s*=\s*"[^"\n]*"[ \t]*$', line, text, count=1)
    if n == 0:
        new = line + "\n" + text
    path.write_text(new, encoding="utf-8")
    return value
