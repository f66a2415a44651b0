"""``web.search`` through the operator's ``config.providers`` only (never placeholder results).

A provider is ``{name, url, method?: GET|POST, headers?, queryParam?: "q", limitParam?,
resultsPath?}``. GET sends ``?<queryParam>=<query>`` (and ``<limitParam>=<limit>`` when set);
POST sends ``{"query", "limit"}`` as JSON. The answer is JSON; ``resultsPath`` (dotted, e.g.
``data.items``) leads to an array of ``{title, url, snippet?}`` objects. HTTP errors are
``failed`` with the status and a body excerpt; a malformed answer is ``failed`` naming what was
wrong.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sidecars.sdk import ToolError
from sidecars.web.policy import ConfigError

EXCERPT = 500


class Provider:
    """One validated ``config.providers`` entry."""

    def __init__(self, index: int, raw: Any) -> None:
        where = f"config.providers[{index}]"
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{where} must be an object")
        name, url = raw.get("name"), raw.get("url")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where}.name must be a non-empty string")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigError(f"{where}.url must be an http(s) URL")
        method = str(raw.get("method", "GET")).upper()
        if method not in ("GET", "POST"):
            raise ConfigError(f"{where}.method must be GET or POST")
        headers = raw.get("headers", {})
        if not isinstance(headers, Mapping) or not all(
            isinstance(v, str) for v in headers.values()
        ):
            raise ConfigError(f"{where}.headers must map names to strings")
        for key in ("queryParam", "limitParam", "resultsPath"):
            if key in raw and not isinstance(raw[key], str):
                raise ConfigError(f"{where}.{key} must be a string")
        self.name, self.url, self.method = name, url, method
        self.headers: dict[str, str] = dict(headers)
        self.query_param: str = raw.get("queryParam", "q")
        self.limit_param: str | None = raw.get("limitParam")
        self.results_path: str = raw.get("resultsPath", "")


def providers_from_config(config: Mapping[str, Any]) -> list[Provider]:
    """The configured providers (empty list when none).

    Raises:
        ConfigError: For a malformed entry.
    """
    raw = config.get("providers", [])
    if not isinstance(raw, list):
        raise ConfigError("config.providers must be a list")
    return [Provider(i, entry) for i, entry in enumerate(raw)]


def bad_answer(provider: Provider, what: str, status: int) -> ToolError:
    return ToolError(
        f"search provider {provider.name!r} answered malformed results: {what}",
        details={"provider": provider.name, "status": status, "reason": "bad-answer", "what": what},
    )


def parse_results(provider: Provider, status: int, body: bytes, limit: int) -> list[dict[str, str]]:
    """Validate a provider's 2xx answer into ``[{title, url, snippet}]`` (at most ``limit``)."""
    try:
        doc: Any = json.loads(body)
    except ValueError:
        raise bad_answer(provider, "the body is not JSON", status) from None
    path = "$"
    for part in [p for p in provider.results_path.split(".") if p]:
        if not isinstance(doc, Mapping) or part not in doc:
            raise bad_answer(provider, f"{path} has no member {part!r} (resultsPath)", status)
        doc, path = doc[part], f"{path}.{part}"
    if not isinstance(doc, list):
        raise bad_answer(provider, f"{path} is not an array", status)
    results: list[dict[str, str]] = []
    for i, item in enumerate(doc[:limit]):
        at = f"{path}[{i}]"
        if not isinstance(item, Mapping):
            raise bad_answer(provider, f"{at} is not an object", status)
        for key in ("title", "url"):
            if not isinstance(item.get(key), str):
                raise bad_answer(provider, f"{at}.{key} is missing or not a string", status)
        snippet = item.get("snippet", "")
        if not isinstance(snippet, str):
            raise bad_answer(provider, f"{at}.snippet is not a string", status)
        results.append({"title": item["title"], "url": item["url"], "snippet": snippet})
    return results


def http_error(provider: Provider, status: int, body: bytes) -> ToolError:
    excerpt = body[:EXCERPT].decode("utf-8", "replace")
    return ToolError(
        f"search provider {provider.name!r} answered HTTP {status}: {excerpt[:200]}",
        details={
            "provider": provider.name,
            "status": status,
            "body": excerpt,
            "reason": "http-error",
        },
    )
