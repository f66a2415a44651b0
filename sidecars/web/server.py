"""The ``web`` sidecar: ``web.fetch``, ``web.extract``, ``web.download``, ``web.search``.

Async tools on the SDK's Trio loop; one pooled httpx client per worker (per event loop), every
connection checked by the SSRF guard (:mod:`sidecars.web.net`, :mod:`sidecars.web.policy`).
Each call's time is bounded by ``config.timeoutMs`` and by the call's own deadline.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import os
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec
import trio
from msgspec import Meta

from sidecars.sdk import Context, Reply, Sidecar, ToolError
from sidecars.sdk.paths import atomic_output, confine, project_relative
from sidecars.web import extract as ex
from sidecars.web.policy import ConfigError, Limits, Policy, media_type, policy_from_config
from sidecars.web.search import http_error, parse_results, providers_from_config
from supervisor.contracts import wire

if TYPE_CHECKING:
    import httpx

app = Sidecar("web", version="1.0.0", concurrency=8)
"""The sidecar; ``app.run()`` serves it (see ``__main__``)."""

# The engines (the `web` extra), imported lazily by the tools and checked by the SDK before
# `ready`: a tool whose engine cannot be imported is unavailable with this fix.
INSTALL = "pip install -e '.[web]' (httpx[http2], trafilatura, lxml_html_clean)"
for _module in ("httpx", "httpcore", "h2"):
    app.engine(_module, install=INSTALL)
for _module in ("lxml.html", "lxml.html.clean", "trafilatura"):
    app.engine(_module, install=INSTALL, tools=("web.fetch", "web.extract"))

MARGIN_S = 0.15
TEXT_TYPES = ("text/", "application/json", "application/xml", "application/xhtml+xml")


class FetchInput(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    """A URL to fetch."""

    url: Annotated[str, Meta(description="http or https URL.")]
    as_: Annotated[
        Literal["text", "markdown", "raw"] | None,
        Meta(description="text (HTML: main text), markdown (HTML: main text as Markdown), raw."),
    ] = msgspec.field(default=None, name="as")
    max_bytes: (
        Annotated[int, Meta(ge=1, description="Body limit; at most the sidecar's config.maxBytes.")]
        | None
    ) = None


class ExtractInput(msgspec.Struct, forbid_unknown_fields=True):
    """A page (URL or HTML file in the project) to extract."""

    url: Annotated[str | None, Meta(description="http or https URL.")] = None
    path: Annotated[str | None, Meta(description="HTML file relative to the project.")] = None


class DownloadInput(msgspec.Struct, forbid_unknown_fields=True):
    """A URL to save into the project."""

    url: Annotated[str, Meta(description="http or https URL.")]
    path: Annotated[str, Meta(description="Target file relative to the project directory.")]
    overwrite: Annotated[bool, Meta(description="Replace an existing file.")] = False


class SearchInput(msgspec.Struct, forbid_unknown_fields=True):
    """A web search."""

    query: Annotated[str, Meta(min_length=1, description="What to search for.")]
    limit: Annotated[int, Meta(ge=1, le=50, description="At most this many results.")] = 10
    provider: Annotated[
        str | None, Meta(description="Provider name from config.providers; the first if absent.")
    ] = None


# per-worker state ------------------------------------------------------------------------------


class _State:
    token: object = None
    key: str = ""
    client: httpx.AsyncClient | None = None


def _settings(config: dict[str, Any]) -> tuple[Limits, Policy]:
    import httpx

    try:
        limits = Limits(config)
        hosts = [httpx.URL(p.url).host for p in providers_from_config(config)]
        return limits, policy_from_config(config, hosts)
    except ConfigError as exc:
        raise ToolError(str(exc), details={"reason": "bad-config"}) from None


def _client(config: dict[str, Any]) -> tuple[httpx.AsyncClient, Limits]:
    """The worker's pooled client (rebuilt for a new event loop or a new config)."""
    from sidecars.web.net import make_client, proxy_from_env

    limits, policy = _settings(config)
    token = trio.lowlevel.current_trio_token()
    key = msgspec.json.encode(config).decode()
    if _State.client is None or _State.token is not token or _State.key != key:
        _State.client = make_client(policy, proxy_from_env())
        _State.token, _State.key = token, key
    return _State.client, limits


def _time_limit(ctx: Context, limits: Limits) -> float:
    left = ctx.time_left()
    cap = limits.timeout_ms / 1000.0
    return cap if left is None else max(0.01, min(cap, left - MARGIN_S))


def _timeout_error(url: str, seconds: float) -> ToolError:
    return ToolError(
        f"{url} did not complete within {seconds:.2f} s",
        details={"url": url, "reason": "timeout", "limitMs": round(seconds * 1000)},
    )


async def _get_body(url: str, ctx: Context, max_bytes: int | None = None) -> tuple[Any, bytes]:
    from sidecars.web.net import stream

    client, limits = _client(ctx.config)
    limit = min(max_bytes or limits.max_bytes, limits.max_bytes)
    chunks: list[bytes] = []
    seconds = _time_limit(ctx, limits)
    with trio.move_on_after(seconds) as scope:
        response = await stream(client, url, limits, limit, chunks.append)
    if scope.cancelled_caught:
        raise _timeout_error(url, seconds)
    return response, b"".join(chunks)


# tools -----------------------------------------------------------------------------------------


@app.tool(
    "web.fetch",
    description=(
        "Fetch an http(s) URL: final URL, status, content type and the body as text (HTML: its "
        "main text), markdown, or raw. Limits on bytes, time and redirects; private and "
        "loopback destinations are refused unless configured."
    ),
    read_only=True,
    concurrency_safe=True,
    permission="network",
)
async def web_fetch(args: FetchInput, ctx: Context) -> Reply:
    """Fetch one URL within the limits."""
    response, body = await _get_body(args.url, ctx, args.max_bytes)
    kind = media_type(response.content_type)
    mode = args.as_ or "text"
    is_text = kind.startswith(TEXT_TYPES) or kind.endswith(("+json", "+xml")) or kind == ""
    data: dict[str, Any] = {
        "url": response.url,
        "status": response.status,
        "contentType": response.content_type,
        "bytes": len(body),
        "redirects": response.redirects,
    }
    if not is_text:
        data["encoding"] = "base64"
        data["content"] = base64.b64encode(body).decode("ascii")
        return Reply(data=data, content=f"{response.url}: {kind}, {len(body)} bytes (base64)")
    text = ex.decode(body, response.content_type)
    if mode != "raw" and kind in ("text/html", "application/xhtml+xml"):
        text = await trio.to_thread.run_sync(
            functools.partial(ex.main_text, markdown=mode == "markdown"), text, response.url
        )
    data["encoding"] = "text"
    data["content"] = text
    return Reply(data=data, content=text or f"{response.url}: HTTP {response.status}, empty")


@app.tool(
    "web.extract",
    description=(
        "Extract the main text, title and links of a web page (http(s) URL) or of an HTML file "
        "in the project."
    ),
    read_only=True,
    concurrency_safe=True,
    permission="network",
)
async def web_extract(args: ExtractInput, ctx: Context) -> Reply:
    """Main text, title and links of one page."""
    if (args.url is None) == (args.path is None):
        raise ToolError(
            "give exactly one of url or path",
            code="invalid-input",
            details={"reason": "url-or-path"},
        )
    if args.path is not None:
        path = confine(ctx.project_dir, args.path, must_exist=True, kind="file")
        limits, _ = _settings(ctx.config)
        if path.stat().st_size > limits.max_bytes:
            raise ToolError(
                f"{args.path!r} is over the limit of {limits.max_bytes} bytes",
                code="invalid-input",
                details={"path": args.path, "reason": "too-large", "limit": limits.max_bytes},
            )
        html = ex.decode(path.read_bytes(), "")
        source: dict[str, Any] = {"path": project_relative(ctx.project_dir, path)}
        page_url = None
    else:
        assert args.url is not None
        response, body = await _get_body(args.url, ctx)
        limits, _ = _settings(ctx.config)
        kind = media_type(response.content_type)
        if kind not in limits.extract_types:
            raise ToolError(
                f"{response.url} is {kind or 'of no declared type'}; extract reads "
                f"{', '.join(limits.extract_types)}",
                code="unsupported",
                details={"url": response.url, "reason": "content-type", "contentType": kind},
            )
        html = ex.decode(body, response.content_type)
        page_url = response.url
        source = {"url": response.url, "status": response.status}
        if kind == "text/plain":
            data = {**source, "title": None, "text": html, "links": []}
            return Reply(data=data, content=html)
    facts = await trio.to_thread.run_sync(ex.extract, html, page_url)
    data = {**source, **facts}
    title = f"{facts['title']}\n\n" if facts["title"] else ""
    return Reply(data=data, content=title + (facts["text"] or "(no main text found)"))


@app.tool(
    "web.download",
    description=(
        "Download an http(s) URL into a file in the project (streamed, size-limited, written "
        "atomically); returns its size, sha256 and content type."
    ),
    concurrency_safe=True,
    permission="network",
)
async def web_download(args: DownloadInput, ctx: Context) -> Reply:
    """Stream one URL into a project file, renamed into place only when complete."""
    from sidecars.web.net import check_url, stream

    check_url(args.url)
    target = confine(ctx.project_dir, args.path, must_exist=False)
    if target.is_dir():
        raise ToolError(
            f"{args.path!r} is a directory",
            code="invalid-input",
            details={"path": args.path, "reason": "not-a-file"},
        )
    if target.exists() and not args.overwrite:
        raise ToolError(
            f"{args.path!r} exists; pass overwrite to replace it",
            code="invalid-input",
            details={"path": args.path, "reason": "exists"},
        )
    client, limits = _client(ctx.config)
    digest = hashlib.sha256()
    seconds = _time_limit(ctx, limits)
    with atomic_output(target) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_TRUNC)
        try:

            async def sink(chunk: bytes) -> None:
                digest.update(chunk)
                await trio.to_thread.run_sync(_write_all, fd, chunk)

            with trio.move_on_after(seconds) as scope:
                response = await stream(client, args.url, limits, limits.max_download_bytes, sink)
            if scope.cancelled_caught:
                raise _timeout_error(args.url, seconds)
            if response.status >= 400:
                raise ToolError(
                    f"{response.url} answered HTTP {response.status}; nothing saved",
                    details={
                        "url": response.url,
                        "status": response.status,
                        "reason": "http-error",
                    },
                )
            await trio.to_thread.run_sync(os.fsync, fd)
        finally:
            os.close(fd)
    shown = project_relative(ctx.project_dir, target)
    data = {
        "path": shown,
        "url": response.url,
        "bytes": response.bytes,
        "sha256": digest.hexdigest(),
        "contentType": response.content_type,
    }
    return Reply(data=data, content=f"saved {response.url} to {shown} ({response.bytes} bytes)")


def _write_all(fd: int, chunk: bytes) -> None:
    view = memoryview(chunk)
    while view:
        view = view[os.write(fd, view) :]


@app.tool(
    "web.search",
    description="Search the web through the operator's configured search providers.",
    read_only=True,
    concurrency_safe=True,
    permission="network",
)
async def web_search(args: SearchInput, ctx: Context) -> Reply:
    """Query one configured provider."""
    try:
        providers = providers_from_config(ctx.config)
    except ConfigError as exc:
        raise ToolError(str(exc), details={"reason": "bad-config"}) from None
    if not providers:
        raise ToolError(
            "web.search has no provider: set config.providers on the web sidecar",
            code="unavailable",
            details={"reason": "no-providers", "hint": SEARCH_HINT},
        )
    chosen = next((p for p in providers if p.name == args.provider), None)
    if args.provider is not None and chosen is None:
        raise ToolError(
            f"no search provider named {args.provider!r}",
            code="invalid-input",
            details={"reason": "unknown-provider", "providers": [p.name for p in providers]},
        )
    provider = chosen or providers[0]
    from sidecars.web.net import stream

    client, limits = _client(ctx.config)
    params: dict[str, str] | None = None
    body: Any = None
    if provider.method == "GET":
        params = {provider.query_param: args.query}
        if provider.limit_param:
            params[provider.limit_param] = str(args.limit)
    else:
        body = {"query": args.query, "limit": args.limit}
    chunks: list[bytes] = []
    seconds = _time_limit(ctx, limits)
    with trio.move_on_after(seconds) as scope:
        response = await stream(
            client,
            provider.url,
            limits,
            limits.max_bytes,
            chunks.append,
            method=provider.method,
            headers=provider.headers,
            json_body=body,
            params=params,
        )
    if scope.cancelled_caught:
        raise _timeout_error(provider.url, seconds)
    raw = b"".join(chunks)
    if response.status >= 400:
        raise http_error(provider, response.status, raw)
    results = parse_results(provider, response.status, raw, args.limit)
    lines = [f"{r['title']} <{r['url']}>\n{r['snippet']}".strip() for r in results]
    data = {"provider": provider.name, "query": args.query, "results": results}
    return Reply(data=data, content="\n\n".join(lines) or "no results")


SEARCH_HINT = (
    'set config.providers on the web sidecar, e.g. [{"name": "mysearch", "url": '
    '"https://search.example/api", "queryParam": "q", "resultsPath": "results"}]'
)


@app.health
def health(sidecar: Sidecar) -> dict[str, wire.ToolHealth]:
    """``web.search`` is unavailable without providers; a bad config makes every tool so."""
    try:
        _settings(sidecar.config)
        providers = providers_from_config(sidecar.config)
    except (ConfigError, ToolError) as exc:
        bad = wire.ToolHealth(
            status="unavailable",
            reason=str(exc),
            hint="fix the web sidecar's config",
            code="bad-config",
        )
        return {name: bad for name in sidecar.tools}
    if not providers:
        return {
            "web.search": wire.ToolHealth(
                status="unavailable",
                reason="no search providers configured",
                hint=SEARCH_HINT,
                code="no-providers",
            )
        }
    return {}
