"""``data.convert``: small structured-data conversions between JSON, TOML, CSV and MessagePack.

Reading: ``json`` (strict, via msgspec), ``json5`` and ``jsonc`` (via ``json5``; plain JSON
input takes the fast path), ``toml`` (``tomllib``), ``csv`` (a header row, then one object of
strings per row; short rows are padded with ``""``, long rows are refused) and ``msgpack``
(``msgspec.msgpack``). Text formats must be UTF-8 (a leading BOM is ignored).

Writing: ``json`` (two-space indented), ``toml`` (``tomli_w``; needs a top-level object and no
nulls), ``csv`` (needs a list of flat objects; the header is the union of their keys in the
order first seen; ``null`` becomes an empty cell, booleans ``true``/``false``) and ``msgpack``.

The source is a project file (``input``; the format may come from its suffix) or an inline
string (``text``; base64 when ``from`` is msgpack). Without ``output`` the result is returned
inline: ``text`` for text formats, ``base64`` for msgpack. Inputs are limited to
``maxConvertBytes`` (config, default 16 MiB).
"""

from __future__ import annotations

import base64
import binascii
import csv
import datetime
import io
import os
import re
import tomllib
from typing import Annotated, Any, Literal

import json5
import msgspec
import tomli_w
from msgspec import Meta

from sidecars.sdk import Context, Sidecar, ToolError
from sidecars.sdk.paths import atomic_output, confine, reject

SourceFormat = Literal["json", "json5", "jsonc", "toml", "csv", "msgpack"]
TargetFormat = Literal["json", "toml", "csv", "msgpack"]

DEFAULT_MAX_CONVERT_BYTES = 16 << 20

_SUFFIXES: dict[str, SourceFormat] = {
    ".json": "json",
    ".json5": "json5",
    ".jsonc": "jsonc",
    ".toml": "toml",
    ".csv": "csv",
    ".msgpack": "msgpack",
    ".mpk": "msgpack",
    ".msgpck": "msgpack",
}
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_EXTRA = "\x00extra"  # restkey for CSV rows longer than the header

DESCRIPTION = (
    "Convert structured data between json, json5/jsonc (read only), toml, csv and msgpack. "
    "Read from a project file ('input'; format inferred from its suffix) or an inline string "
    "('text'; base64 for msgpack). With 'output' the result is written to a project file "
    "(overwrite=true to replace one); otherwise it is returned inline as 'text' (or 'base64' "
    "for msgpack). CSV means a header row and a list of flat objects; TOML needs a top-level "
    "object and cannot hold null."
)


class DataConvertInput(msgspec.Struct, forbid_unknown_fields=True, rename="camel", kw_only=True):
    """What to convert, from which format to which."""

    input: Annotated[
        str | None, Meta(description="Source file relative to the project (or give 'text').")
    ] = None
    text: Annotated[
        str | None, Meta(description="Inline source data (base64 when 'from' is msgpack).")
    ] = None
    from_: Annotated[
        SourceFormat | None,
        Meta(description="Source format; inferred from the input file's suffix when omitted."),
    ] = msgspec.field(default=None, name="from")
    to: Annotated[TargetFormat, Meta(description="Target format.")]
    output: Annotated[
        str | None, Meta(description="File to write, relative to the project; else inline.")
    ] = None
    overwrite: Annotated[bool, Meta(description="Replace an existing output file.")] = False


class DataConvertOutput(msgspec.Struct, rename="camel", kw_only=True, omit_defaults=True):
    """The converted data, or where it was written."""

    from_: Annotated[SourceFormat, Meta(description="Source format.")] = msgspec.field(name="from")
    to: Annotated[TargetFormat, Meta(description="Target format.")]
    bytes: Annotated[int, Meta(description="Size of the converted data in bytes.")]
    output: Annotated[str | None, Meta(description="The output path, when written.")] = None
    text: Annotated[str | None, Meta(description="Inline result of a text format.")] = None
    base64: Annotated[str | None, Meta(description="Inline msgpack result, base64.")] = None


def json_path(path: list[str | int]) -> str:
    """Render a JSON path such as ``$.servers[2]["host name"]``.

    Args:
        path: Object keys and array indices from the root.

    Returns:
        The path in JSONPath-like notation.
    """
    out = "$"
    for step in path:
        if isinstance(step, int):
            out += f"[{step}]"
        elif _IDENTIFIER.match(step):
            out += f".{step}"
        else:
            out += f"[{msgspec.json.encode(step).decode()}]"
    return out


def first_null(value: Any, path: list[str | int] | None = None) -> list[str | int] | None:
    """The path of the first ``None`` in document order, or ``None`` if there is none.

    Args:
        value: Decoded data.
        path: The path of ``value`` itself (root when omitted).

    Returns:
        The path to the first null, or ``None``.
    """
    here = path or []
    if value is None:
        return here
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = first_null(item, [*here, key])
        if found is not None:
            return found
    return None


def _bad(message: str, reason: str, **details: Any) -> ToolError:
    return ToolError(message, code="invalid-input", details={"reason": reason, **details})


# reading -----------------------------------------------------------------------------------


def _decode_utf8(raw: bytes, source: str) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        offset = exc.start + (3 if raw.startswith(b"\xef\xbb\xbf") else 0)
        bad = raw[offset : offset + 1].hex()
        raise _bad(
            f"{source} is not valid UTF-8: byte 0x{bad} at offset {offset} ({exc.reason})",
            "not-utf8",
            offset=offset,
        ) from None


def _read_csv(text: str, source: str) -> list[dict[str, str]]:
    reader = csv.DictReader(io.StringIO(text, newline=""), restkey=_EXTRA, restval="")
    header = reader.fieldnames or []
    duplicates = sorted({name for name in header if header.count(name) > 1})
    if duplicates:
        raise _bad(f"{source}: CSV header repeats {duplicates[0]!r}", "csv-duplicate-header")
    rows: list[dict[str, str]] = []
    for row in reader:
        if _EXTRA in row:
            raise _bad(
                f"{source}: CSV line {reader.line_num} has more fields than the header "
                f"({len(header)})",
                "csv-ragged",
                line=reader.line_num,
            )
        rows.append(row)
    return rows


def parse(raw: bytes, fmt: SourceFormat, source: str) -> Any:
    """Decode ``raw`` in format ``fmt``.

    Args:
        raw: The bytes of the source.
        fmt: The source format.
        source: How messages name the source (``input 'a.json'`` or ``text``).

    Returns:
        The decoded data: dicts, lists, strings, numbers, booleans, ``None`` (and dates
        from TOML, bytes and timestamps from msgpack).

    Raises:
        ToolError: ``invalid-input`` with reason ``not-utf8`` (with ``offset``),
            ``parse-error``, ``csv-ragged`` or ``csv-duplicate-header``.
    """
    if fmt == "msgpack":
        try:
            return msgspec.msgpack.decode(raw)
        except msgspec.DecodeError as exc:
            raise _bad(f"{source} is not valid msgpack: {exc}", "parse-error") from None
    text = _decode_utf8(raw, source)
    try:
        if fmt == "toml":
            return tomllib.loads(text)
        if fmt == "csv":
            return _read_csv(text, source)
        try:
            return msgspec.json.decode(text)
        except msgspec.DecodeError:
            if fmt == "json":
                raise
        return json5.loads(text)
    except (msgspec.DecodeError, ValueError, csv.Error) as exc:
        raise _bad(f"{source} is not valid {fmt}: {exc}", "parse-error") from None


# writing -----------------------------------------------------------------------------------


def _cell(value: Any, path: list[str | int]) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    raise _bad(
        f"CSV cells must be scalars; {json_path(path)} is {_describe(value)}",
        "csv-not-flat",
        jsonPath=json_path(path),
    )


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if value is None:
        return "null"
    return f"a {type(value).__name__}"


def _write_csv(data: Any) -> bytes:
    if not isinstance(data, list):
        raise _bad(
            f"CSV output needs a list of objects; the top level is {_describe(data)}",
            "csv-needs-list",
            jsonPath="$",
        )
    header: dict[str, None] = {}
    for i, row in enumerate(data):
        if not isinstance(row, dict):
            raise _bad(
                f"CSV output needs a list of objects; $[{i}] is {_describe(row)}",
                "csv-not-flat",
                jsonPath=f"$[{i}]",
            )
        header.update(dict.fromkeys(str(k) for k in row))
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    if header:
        writer.writerow(header)
    for i, row in enumerate(data):
        cells = {str(k): _cell(v, [i, str(k)]) for k, v in row.items()}
        writer.writerow([cells.get(name, "") for name in header])
    return buf.getvalue().encode()


def _write_toml(data: Any) -> bytes:
    if not isinstance(data, dict):
        raise _bad(
            f"TOML output needs a top-level object (a table); the top level is {_describe(data)}",
            "toml-needs-object",
            jsonPath="$",
        )
    null_at = first_null(data)
    if null_at is not None:
        where = json_path(null_at)
        raise _bad(f"TOML has no null; the first null is at {where}", "toml-null", jsonPath=where)
    return tomli_w.dumps(data).encode()


def render(data: Any, fmt: TargetFormat) -> bytes:
    """Encode ``data`` in format ``fmt``.

    Args:
        data: Decoded data, as :func:`parse` returns it.
        fmt: The target format.

    Returns:
        The encoded bytes (UTF-8 for text formats).

    Raises:
        ToolError: ``invalid-input`` with reason ``toml-needs-object``, ``toml-null``,
            ``csv-needs-list``, ``csv-not-flat`` (each with ``jsonPath``) or
            ``unsupported-value`` for values the target cannot hold.
    """
    try:
        if fmt == "toml":
            return _write_toml(data)
        if fmt == "csv":
            return _write_csv(data)
        if fmt == "msgpack":
            return msgspec.msgpack.encode(data)
        return msgspec.json.format(msgspec.json.encode(data), indent=2) + b"\n"
    except (TypeError, ValueError, msgspec.EncodeError) as exc:
        raise _bad(f"cannot write {fmt}: {exc}", "unsupported-value") from None


# the tool ----------------------------------------------------------------------------------


def _max_bytes(ctx: Context) -> int:
    value = ctx.config.get("maxConvertBytes", DEFAULT_MAX_CONVERT_BYTES)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ToolError(
            f"sidecar config maxConvertBytes must be a non-negative integer, got {value!r}",
            code="failed",
            details={"reason": "bad-config", "key": "maxConvertBytes"},
        )
    return value


def _load_source(args: DataConvertInput, ctx: Context) -> tuple[bytes, SourceFormat, str]:
    """Return the raw source bytes, the source format and how to name the source."""
    limit = _max_bytes(ctx)
    if (args.input is None) == (args.text is None):
        raise _bad("give exactly one of 'input' (a file) or 'text' (inline data)", "input-or-text")
    if args.input is not None:
        path = confine(ctx.project_dir, args.input, must_exist=True, kind="file", label="input")
        fmt = args.from_ or _SUFFIXES.get(os.path.splitext(args.input)[1].lower())
        if fmt is None:
            raise reject(
                args.input,
                "unknown-format",
                f"cannot tell the format of input {args.input!r} from its suffix; give 'from'",
            )
        size = path.stat().st_size
        if size > limit:
            raise _bad(
                f"input {args.input!r} is {size} bytes; the limit is {limit}",
                "too-large",
                path=args.input,
                limit=limit,
            )
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ToolError(
                f"cannot read input {args.input!r}: {exc.strerror or exc}",
                code="failed",
                details={"path": args.input, "reason": "read-error"},
            ) from None
        return raw, fmt, f"input {args.input!r}"
    text = args.text or ""
    if args.from_ is None:
        raise _bad("'from' is required with inline 'text'", "unknown-format")
    if args.from_ == "msgpack":
        try:
            raw = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise _bad(f"text is not valid base64 (msgpack input): {exc}", "bad-base64") from None
    else:
        raw = text.encode("utf-8", "surrogatepass")
    if len(raw) > limit:
        raise _bad(f"text is {len(raw)} bytes; the limit is {limit}", "too-large", limit=limit)
    return raw, args.from_, "text"


def data_convert(args: DataConvertInput, ctx: Context) -> DataConvertOutput:
    """Convert structured data between formats.

    Args:
        args: The validated input.
        ctx: The call context; ``ctx.config["maxConvertBytes"]`` bounds the source size.

    Returns:
        The result inline (``text`` or ``base64``) or the path written (``output``).

    Raises:
        ToolError: ``invalid-input`` for refused paths, undecodable or unrepresentable data
            (``details.reason`` says which; ``jsonPath``/``offset`` say where); ``failed``
            when the input file is missing or unreadable.
    """
    raw, source_fmt, source = _load_source(args, ctx)
    try:
        data = parse(raw, source_fmt, source)
    except ToolError as exc:
        if args.input is not None and exc.details is not None:
            exc.details.setdefault("path", args.input)
        raise
    ctx.check_cancelled()
    encoded = render(data, args.to)
    if args.output is None:
        if args.to == "msgpack":
            b64 = base64.b64encode(encoded).decode("ascii")
            return DataConvertOutput(from_=source_fmt, to=args.to, bytes=len(encoded), base64=b64)
        return DataConvertOutput(
            from_=source_fmt, to=args.to, bytes=len(encoded), text=encoded.decode("utf-8")
        )
    target = confine(ctx.project_dir, args.output, must_exist=False, kind="file", label="output")
    if os.path.lexists(target) and not args.overwrite:
        raise reject(
            args.output, "exists", f"output {args.output!r} exists; pass overwrite=true to replace"
        )
    try:
        with atomic_output(target) as tmp:
            tmp.write_bytes(encoded)
    except OSError as exc:
        raise ToolError(
            f"cannot write output {args.output!r}: {exc.strerror or exc}",
            code="failed",
            details={"path": args.output, "reason": "io-error"},
        ) from None
    return DataConvertOutput(from_=source_fmt, to=args.to, bytes=len(encoded), output=args.output)


def register(app: Sidecar) -> None:
    """Register ``data.convert`` on ``app``.

    Args:
        app: The utility sidecar.
    """
    app.tool("data.convert", description=DESCRIPTION, permission="write")(data_convert)
