"""The operator's vault (PROTOCOL 3.5 ``vault``): secrets a sidecar fetches explicitly.

# Strategy: one private JSON file, ``<appRoot>/.toolhost/vault.json`` (0600 in a 0700 folder),
# ``{"shared": {KEY: value}, "profile": {KEY: value}}``. ``toolhost vault set KEY`` reads the
# value from stdin (never argv, never the environment) and rewrites the file atomically (temp
# file + rename, mode 0600). Reading refuses a file that is group- or world-accessible, another
# user's or a symlink (private_files.py), with the fix in the message, instead of trusting a
# secret anyone could have read or written. The host
# re-reads the file when its mtime changes, so ``vault set`` needs no reload.
"""

from __future__ import annotations

import os
import tempfile

import msgspec

from supervisor.private_files import (
    NotPrivate,
    Symlinked,
    make_private,
    open_nofollow,
    read_private,
)

VAULT_FILE = ".toolhost/vault.json"
SCOPES = ("profile", "shared")


class VaultError(Exception):
    """The vault cannot be read or written (the message says why and how to fix it)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class VaultDoc(msgspec.Struct, forbid_unknown_fields=True):
    shared: dict[str, str] = msgspec.field(default_factory=dict)
    profile: dict[str, str] = msgspec.field(default_factory=dict)


def vault_path(app_root: str) -> str:
    return os.path.join(app_root, VAULT_FILE)


class Vault:
    """Read and write the vault file of one app root."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._cache: tuple[tuple[int, ...], VaultDoc] | None = None

    def load(self) -> VaultDoc:
        """The vault now (empty when there is no file).

        Raises:
            VaultError: The file is group/world-accessible, another user's, a symlink, not a
                regular file, or unreadable.
        """
        try:
            fd, _ = open_nofollow(self.path, os.O_RDONLY, create=False)
        except FileNotFoundError:
            return VaultDoc()
        except Symlinked as exc:
            raise VaultError("vault-insecure", str(exc)) from exc
        except OSError as exc:
            raise VaultError("vault-unreadable", f"cannot open {self.path}: {exc}") from exc
        try:
            try:
                make_private(fd, self.path, tighten=False)  # ours, a regular file, 0600
            except NotPrivate as exc:
                raise VaultError("vault-insecure", str(exc)) from exc
            st = os.fstat(fd)
            stamp = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
            if self._cache is not None and self._cache[0] == stamp:
                return self._cache[1]
            data = read_private(fd)
        finally:
            os.close(fd)
        try:
            doc = msgspec.json.decode(data, type=VaultDoc) if data.strip() else VaultDoc()
        except msgspec.DecodeError as exc:
            raise VaultError(
                "vault-unreadable", f"{self.path} is not a valid vault: {exc}"
            ) from exc
        self._cache = (stamp, doc)
        return doc

    def get(self, key: str, scopes: list[str]) -> str | None:
        """The value of ``key`` in the first of ``scopes`` that has it."""
        doc = self.load()
        for scope in scopes:
            table = doc.profile if scope == "profile" else doc.shared
            if key in table:
                return table[key]
        return None

    def set(self, key: str, value: str, scope: str = "shared") -> None:
        doc = self.load()
        (doc.profile if scope == "profile" else doc.shared)[key] = value
        self._save(doc)

    def delete(self, key: str, scope: str | None = None) -> bool:
        doc = self.load()
        found = False
        for name in (scope,) if scope else SCOPES:
            table = doc.profile if name == "profile" else doc.shared
            found = table.pop(key, None) is not None or found
        if found:
            self._save(doc)
        return found

    def keys(self) -> dict[str, list[str]]:
        doc = self.load()
        return {"shared": sorted(doc.shared), "profile": sorted(doc.profile)}

    def _save(self, doc: VaultDoc) -> None:
        folder = os.path.dirname(self.path)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".vault.", dir=folder)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, msgspec.json.format(msgspec.json.encode(doc)))
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        os.replace(tmp, self.path)
        self._cache = None
