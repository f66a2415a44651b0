"""The ``utility`` sidecar: file hashing, archives, data conversion, LSP queries, background tasks.

Run it with ``python -m sidecars.utility``; it answers the persistent process-json protocol
(PROTOCOL 3.1) and a single Flyflor oneshot request (3.2). Importing this package only builds
:data:`app` and registers the tools; it does not start serving. Up to four calls run at once.

Tools
-----
``file.hash`` ``{path, algorithm?}`` -> ``{path, algorithm, digest, size}``
    Hex digest of one regular file, streamed in 1 MiB chunks. ``algorithm`` is ``sha256``
    (default), ``sha1``, ``md5`` or ``blake2b`` (64-byte digest). Read-only.

``archive.create`` ``{source, output, format?, overwrite?}`` ->
``{output, format, files, directories, bytes, sourceBytes, skipped}``
    Archives a file or directory as ``zip`` (deflate), ``tar`` or ``tar.gz`` (PAX). The
    format comes from ``format``, else the output suffix (``.zip``, ``.tar``, ``.tar.gz``,
    ``.tgz``), else zip; ``.tar.xz``/``.tar.bz2``/``.7z``/``.rar`` outputs are refused.
    Entries are named after the source's last component (``src`` -> ``src/...``; ``.`` -> bare
    names; a file -> its name). **Symlinks are never stored or followed**: they are skipped and
    listed in ``skipped`` (reason ``symlink``), as are sockets/FIFOs/devices
    (``special-file``) and the output itself (``archive-output``). Owners are not recorded. An
    existing output is refused unless ``overwrite``; the archive is written to a temporary file
    in the output's directory and renamed into place. ``bytes`` is the archive's size.

``archive.extract`` ``{archive, destination, format?, overwrite?}`` ->
``{destination, format, files, directories, bytes}``
    Format detected from content unless given. All or nothing: members are checked first,
    written into a hidden staging directory next to (or, if it exists, inside) the destination,
    and moved into place only when everything succeeded. Refused members: absolute paths, any
    ``..`` component, NUL in names, symlinks, hard links, devices/FIFOs, encrypted zip members,
    file/directory clashes. Limits from the sidecar config: ``maxExtractFiles`` members
    (default 10000) and ``maxExtractBytes`` uncompressed bytes (default 256 MiB), enforced on
    the declared sizes before writing and again on the bytes actually produced. Merging into an
    existing directory refuses symlinked paths and existing files unless ``overwrite``.
    ``bytes`` counts uncompressed bytes written.

``data.convert`` ``{input | text, from?, to, output?, overwrite?}`` ->
``{from, to, bytes, output | text | base64}``
    ``from``: ``json``, ``json5``, ``jsonc``, ``toml``, ``csv``, ``msgpack`` (inferred from the
    input suffix when omitted); ``to``: ``json``, ``toml``, ``csv``, ``msgpack``. Inline
    msgpack (``text`` in, ``base64`` out) is base64. Sources are limited to
    ``maxConvertBytes`` (config, default 16 MiB). See :mod:`sidecars.utility.convert`.

``lsp.symbols`` / ``lsp.diagnostics`` ``{path}``
    Ask the language server of ``config.lspCommand`` (kept running as this worker's child) for
    a file's symbols or published diagnostics. See :mod:`sidecars.utility.lsp`.

``task.background`` ``{action, args?, id?, stream?, offset?, maxBytes?}``
    ``action`` is ``start``, ``status``, ``output`` or ``cancel``: background runs of
    ``config.taskCommand``. See :mod:`sidecars.utility.tasks`.

Both answer ``unavailable`` (in ``pong`` too) while their command is not configured or not
found; docs/sidecars/lsp-task.md has the details.

Paths and errors
----------------
Every path is relative to ``projectDir`` and confined to it by
:func:`sidecars.sdk.paths.confine`: empty paths, NUL bytes, absolute paths, any ``..``
component, and paths whose real path (all symlinks followed, the last component included)
leaves the project are refused with code ``invalid-input`` and
``details = {"path": <as given>, "reason": <code>}``; reasons ``empty-path``, ``nul-byte``,
``absolute-path``, ``parent-traversal``, ``symlink-escape``, ``not-a-file``,
``not-a-directory``, plus ``exists`` (output present, no ``overwrite``), ``source-is-output``,
``unknown-format``, ``unsupported-format``. A missing file is code ``failed`` with reason
``not-found`` (``inaccessible`` when it cannot be examined): the call was well formed, the file
is just not there. I/O errors are ``failed`` (``io-error``, ``read-error``).

Archive member refusals are ``invalid-input`` with ``details = {"path": <archive>, "member":
<member name>, "reason": ...}`` and the member named in the message; reasons
``absolute-path``, ``parent-traversal``, ``bad-name``, ``symlink-member``, ``hardlink-member``,
``special-member``, ``encrypted-member``, ``member-conflict``, ``too-many-files`` (with
``limit``), ``too-large`` (with ``limit`` and ``stage``: ``declared`` or ``extracted``),
``corrupt-member``, and for merges ``exists`` and ``symlink-in-destination``. An unreadable
archive is ``bad-archive`` (no member).

``data.convert`` refusals are ``invalid-input`` with reasons ``input-or-text``, ``not-utf8``
(with the byte ``offset``), ``parse-error``, ``bad-base64``, ``csv-ragged``,
``csv-duplicate-header``, ``csv-needs-list``, ``csv-not-flat``, ``toml-needs-object``,
``toml-null`` (those four with ``jsonPath``), ``unsupported-value`` and ``too-large``.
A malformed limit in the sidecar config is ``failed`` with reason ``bad-config``.
"""

from sidecars.sdk import Sidecar
from sidecars.utility import archives, convert, extract, hashing, lsp, tasks
from supervisor.contracts import wire

app = Sidecar("utility", version="1.0.0", concurrency=4)
"""The sidecar; ``app.run()`` serves it (see ``__main__``)."""

for _module in (hashing, archives, extract, convert, lsp, tasks):
    _module.register(app)


@app.health
def _health(sidecar: Sidecar) -> dict[str, wire.ToolHealth]:
    """``pong``: the lsp and task tools are unavailable until their command resolves."""
    out: dict[str, wire.ToolHealth] = {}
    reason = lsp.health(sidecar.config, sidecar.project_dir)
    if reason is not None:
        for name in ("lsp.symbols", "lsp.diagnostics"):
            out[name] = wire.ToolHealth(status="unavailable", reason=reason)
    reason = tasks.health(sidecar.config, sidecar.project_dir)
    if reason is not None:
        out["task.background"] = wire.ToolHealth(status="unavailable", reason=reason)
    return out


__all__ = ["app"]
