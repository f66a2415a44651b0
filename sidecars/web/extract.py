"""Main text, title and links of an HTML page: trafilatura for the text, lxml for the links.

No regular expressions touch HTML here. trafilatura finds the main content (boilerplate such as
navigation, footers and cookie banners dropped) and renders it as plain text or Markdown; lxml
(already trafilatura's parser) lists the ``<a href>`` links, made absolute against the page URL.
"""

from __future__ import annotations

from typing import Any

MAX_LINKS = 500


def decode(body: bytes, content_type: str) -> str:
    """Bytes to text: the charset of the Content-Type, else UTF-8 (bad bytes replaced)."""
    charset = "utf-8"
    for part in content_type.split(";")[1:]:
        key, _, value = part.strip().partition("=")
        if key.lower() == "charset" and value:
            charset = value.strip("\"'")
    try:
        return body.decode(charset, "replace")
    except LookupError:
        return body.decode("utf-8", "replace")


def main_text(html: str, url: str | None, *, markdown: bool = False) -> str:
    """The page's main text (plain or Markdown); empty when nothing readable was found."""
    import trafilatura

    text = trafilatura.extract(
        html,
        url=url,
        output_format="markdown" if markdown else "txt",
        include_links=markdown,
        include_comments=False,
        favor_recall=True,
    )
    return text or ""


def title_of(html: str, url: str | None) -> str | None:
    """The page title as trafilatura's metadata reads it (og:title, <title>, <h1>...)."""
    import trafilatura

    meta = trafilatura.extract_metadata(html, default_url=url)
    return meta.title if meta is not None and meta.title else None


def links_of(html: str, url: str | None) -> list[dict[str, str]]:
    """Every ``<a href>`` (http/https only, absolute, first occurrence), with its text."""
    import lxml.html

    try:
        doc = lxml.html.document_fromstring(html)
    except Exception:  # lxml raises ParserError/ValueError on empty or odd input
        return []
    if url:
        doc.make_links_absolute(url, resolve_base_href=True, handle_failures="discard")
    links: list[dict[str, str]] = []
    seen: set[str] = set()
    for anchor in doc.iter("a"):
        href = (anchor.get("href") or "").strip()
        if not href.startswith(("http://", "https://")) or href in seen:
            continue
        seen.add(href)
        links.append({"url": href, "text": " ".join(anchor.text_content().split())[:200]})
        if len(links) >= MAX_LINKS:
            break
    return links


def extract(html: str, url: str | None) -> dict[str, Any]:
    """``{title, text, links}`` of one HTML document."""
    return {
        "title": title_of(html, url),
        "text": main_text(html, url),
        "links": links_of(html, url),
    }
