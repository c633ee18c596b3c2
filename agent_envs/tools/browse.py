"""The browse tool: read a web page as text, from the network or from an in-memory site.

A page becomes readable text: its title, its URL, the visible text, then its links listed as
``[n] anchor text: url`` so a model can follow them with another browse call. With `pages=`
the tool serves a fixed site (the synthetic web world) and never touches the network; without
it, pages are fetched with aiohttp under a byte cap and a time limit, by content type.

    >>> import asyncio
    >>> site = {"https://w/a": "<html><title>A</title><p>Hello.</p><a href='/b'>Bee</a></html>"}
    >>> print(asyncio.run(BrowseTool(pages=site)("https://w/a")).text)
    Title: A
    URL: https://w/a
    <BLANKLINE>
    Hello.
    Bee
    <BLANKLINE>
    Links:
    [1] Bee: https://w/b
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal
from urllib.parse import urldefrag, urljoin, urlsplit

from agent_envs.base.messages import MESSAGES
from agent_envs.base.tool import Tool, ToolResult
from agent_envs.net.http import (
    LoopSemaphore,
    PermanentError,
    RetryPolicy,
    SessionPool,
    TransientError,
    raise_for_status,
    with_retries,
)
from agent_envs.remote.cache import ToolCache

# Elements whose text is never part of the readable page.
_DROP_TAGS = ("script", "style", "noscript", "template", "svg", "iframe", "head", "title")
# fmt: off
_BLOCK_TAGS = ("p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "article",
               "header", "footer", "pre", "blockquote", "table", "ul", "ol", "dd", "dt")
# fmt: on
_TEXT_TYPES = ("text/plain", "text/markdown", "text/csv", "application/json", "application/xml", "text/xml")


@dataclass
class Page:
    """A page reduced to what a model reads."""

    url: str
    title: str
    text: str
    links: list[tuple[str, str]]  # (anchor text, absolute url)

    def render(self, max_chars: int, max_links: int) -> str:
        text = self.text
        if len(text) > max_chars:
            text = text[:max_chars].rstrip() + f"\n[... page truncated at {max_chars} characters]"
        parts = [f"Title: {self.title}" if self.title else "Title: (none)", f"URL: {self.url}", "", text]
        if self.links:
            shown = self.links[:max_links]
            parts += ["", "Links:"] + [f"[{i}] {t or '(no text)'}: {u}" for i, (t, u) in enumerate(shown, 1)]
            if len(self.links) > max_links:
                parts.append(f"[... {len(self.links) - max_links} more links]")
        return "\n".join(parts)


def html_to_page(html: str, url: str, extractor: Literal["bs4", "trafilatura"] = "bs4") -> Page:
    """Readable title, text and links of an HTML document (links resolved against `url`)."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, "html.parser")
    title = soup.title.get_text(" ", strip=True) if soup.title else ""
    if not title and (h1 := soup.find("h1")) is not None:
        title = h1.get_text(" ", strip=True)
    base = url
    if (base_tag := soup.find("base", href=True)) is not None:
        base = urljoin(url, str(base_tag["href"]))
    links: list[tuple[str, str]] = []
    seen: set[str] = set()
    for a in soup.find_all("a", href=True):
        href = str(a["href"]).strip()
        if not href or href.startswith(("#", "javascript:", "mailto:", "tel:")):
            continue
        absolute = urldefrag(urljoin(base, href))[0]
        if absolute in seen or urlsplit(absolute).scheme not in ("http", "https"):
            continue
        seen.add(absolute)
        links.append((" ".join(a.get_text(" ", strip=True).split()), absolute))
    text = ""
    if extractor == "trafilatura":
        try:
            import trafilatura

            text = trafilatura.extract(html, url=url, include_comments=False, include_tables=True) or ""
        except ImportError as exc:
            raise ImportError(
                f"BrowseTool(extractor='trafilatura') needs `pip install 'agent-envs[web]'` ({exc})"
            ) from exc
    if not text:
        for tag in soup(_DROP_TAGS):
            tag.decompose()
        for tag in soup.find_all(_BLOCK_TAGS):
            tag.insert_before("\n")
            tag.insert_after("\n")
        body = soup.body or soup
        text = body.get_text("")
    return Page(url=url, title=title, text=_tidy(text), links=links)


def _tidy(text: str) -> str:
    lines = [" ".join(line.split()) for line in text.splitlines()]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def normalize_url(url: str) -> str:
    """Strip whitespace, surrounding quotes/brackets and the fragment."""
    url = url.strip().strip("\"'<>").strip()
    return urldefrag(url)[0]


class BrowseTool(Tool):
    """`<browse> url </browse>`: the readable text of a page.

    Args:
        pages: an in-memory site {url: html or text}; when given, nothing is fetched.
        max_chars: characters of page text shown (links are listed after it, up to `max_links`).
        max_bytes: bytes read from the network at most (larger bodies are cut).
        timeout_s: time limit of one call, retries included (a slow page is not fetched twice).
        cache: optional `ToolCache` for fetched pages (network mode; failures are never cached).
        concurrency: fetches in flight at once.
        extractor: `bs4` (fast, deterministic) or `trafilatura` (main-content extraction).
        max_retries: retries of transient network failures (5xx, 429, connection, timeout).
    """

    name: ClassVar[str] = "browse"
    argument: ClassVar[str] = "url"
    description: ClassVar[str] = "open a web page by URL; returns its text and its links"

    def __init__(
        self,
        pages: Mapping[str, str] | None = None,
        max_chars: int = 6000,
        max_bytes: int = 2_000_000,
        timeout_s: float = 20.0,
        cache: ToolCache | None = None,
        concurrency: int = 16,
        extractor: Literal["bs4", "trafilatura"] = "bs4",
        max_links: int = 50,
        max_retries: int = 2,
        backoff_s: float = 0.5,
        user_agent: str = "Mozilla/5.0 (compatible; agent-envs browse tool)",
    ) -> None:
        if extractor not in ("bs4", "trafilatura"):
            raise ValueError(f"BrowseTool extractor must be 'bs4' or 'trafilatura', got {extractor!r}")
        self.pages = {normalize_url(u): v for u, v in pages.items()} if pages is not None else None
        self.max_chars = max_chars
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.cache = cache
        self.extractor = extractor
        self.max_links = max_links
        self.retry = RetryPolicy(max_retries=max_retries, backoff_s=backoff_s)
        self.concurrency = LoopSemaphore(concurrency)
        self.pool = SessionPool(limit=concurrency, headers={"User-Agent": user_agent})
        self._parsed: dict[str, Page] = {}  # in-memory site: parse each page once

    def normalize(self, arg: str) -> str:
        return normalize_url(arg)

    @property
    def backend_id(self) -> str:
        return "memory" if self.pages is not None else f"http:{self.extractor}"

    async def call(self, arg: str) -> ToolResult:
        url = self.normalize(arg)
        if not url:
            return ToolResult(MESSAGES["empty_call"].format(tool=self.name), ok=False, error="empty")
        if self.pages is not None:
            return self._from_site(url)
        if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
            return ToolResult(
                f"Cannot open {url!r}: only http:// and https:// URLs can be browsed.",
                ok=False,
                error="invalid_url",
            )
        key = None
        if self.cache is not None:
            key = ToolCache.key(
                self.name, self.backend_id, url, max_chars=self.max_chars, max_links=self.max_links
            )
            cached = self.cache.get(key)
            if cached is not None:
                return ToolResult(
                    cached["text"], cached=True, metadata={"url": url, **cached.get("meta", {})}
                )
            if self.cache.mode == "offline":
                return ToolResult(f"Page {url} is not in the offline cache.", ok=False, error="cache_miss")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        try:
            async with self.concurrency.get():
                (page, meta), retries = await with_retries(
                    lambda: self._fetch(url), self.retry, budget_s=max(deadline - loop.time(), 0.0)
                )
        except (TransientError, PermanentError) as exc:
            tries = f" ({exc.retries} {'retry' if exc.retries == 1 else 'retries'})" if exc.retries else ""
            return ToolResult(
                f"Could not open {url}: {exc}{tries}.",
                ok=False,
                error=exc.kind,
                retries=exc.retries,
                metadata={"url": url},
            )
        text = page.render(self.max_chars, self.max_links)
        if key is not None and self.cache is not None:
            self.cache.put(key, {"text": text, "meta": meta})
        return ToolResult(text, retries=retries, metadata={"url": url, **meta})

    def _from_site(self, url: str) -> ToolResult:
        assert self.pages is not None
        found = url if url in self.pages else None
        if found is None:  # tolerate a trailing-slash difference
            alt = url[:-1] if url.endswith("/") else url + "/"
            found = alt if alt in self.pages else None
        if found is None:
            return ToolResult(f"Page not found: {url}", ok=False, error="not_found", metadata={"url": url})
        page = self._parsed.get(found)
        if page is None:
            content = self.pages[found]
            if "<" in content and re.search(r"<(html|body|p|a|title|div|h\d)\b", content, re.I):
                page = html_to_page(content, found, self.extractor)
            else:
                page = Page(url=found, title="", text=_tidy(content), links=[])
            self._parsed[found] = page
        return ToolResult(page.render(self.max_chars, self.max_links), metadata={"url": found})

    async def _fetch(self, url: str) -> tuple[Page, dict[str, Any]]:
        session = await self.pool.get()
        async with session.get(url, allow_redirects=True) as resp:
            if resp.status >= 400:
                raise_for_status(resp.status, url, "")
            ctype = resp.content_type or "application/octet-stream"
            body = bytearray()
            truncated = False
            async for chunk in resp.content.iter_chunked(65536):
                body += chunk
                if len(body) >= self.max_bytes:
                    del body[self.max_bytes :]
                    truncated = True
                    break
            charset = resp.charset
            final = str(resp.url)
        meta = {"content_type": ctype, "bytes": len(body), "truncated_bytes": truncated, "final_url": final}
        if ctype in ("text/html", "application/xhtml+xml"):
            html = _decode(bytes(body), charset)
            page = await asyncio.to_thread(html_to_page, html, final, self.extractor)
        elif ctype in _TEXT_TYPES or ctype.startswith("text/"):
            page = Page(url=final, title="", text=_tidy(_decode(bytes(body), charset)), links=[])
        elif ctype == "application/pdf":
            page = Page(
                url=final, title="", text=await asyncio.to_thread(_pdf_text, bytes(body), final), links=[]
            )
        else:
            raise PermanentError(f"unsupported content type {ctype} ({len(body)} bytes)", kind="unsupported")
        return page, meta

    async def aclose(self) -> None:
        await self.pool.aclose()


def _decode(body: bytes, charset: str | None) -> str:
    for enc in (charset, "utf-8"):
        if enc:
            try:
                return body.decode(enc)
            except (LookupError, UnicodeDecodeError):
                continue
    return body.decode("utf-8", errors="replace")


def _pdf_text(body: bytes, url: str) -> str:
    """The first 600 words of a PDF (the reference's cap), if a PDF reader is installed."""
    import io

    try:
        from pypdf import PdfReader
    except ImportError as exc:
        raise PermanentError(f"{url} is a PDF and no PDF reader is installed (pip install pypdf)") from exc
    try:
        reader = PdfReader(io.BytesIO(body))
        words: list[str] = []
        for pdf_page in reader.pages:
            words += (pdf_page.extract_text() or "").split()
            if len(words) >= 600:
                break
    except Exception as exc:
        raise PermanentError(f"{url}: unreadable PDF ({type(exc).__name__})") from exc
    return " ".join(words[:600])
