"""Browse tool: an in-memory site (no network) and a real aiohttp site on 127.0.0.1.

The local site serves every case a real fetch meets: HTML with relative links, plain text, JSON,
a binary type, a redirect, a non-UTF-8 charset, a page larger than the byte cap, a slow page, a
404 and a page that fails with 503 before it works.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from agent_envs.remote import ToolCache
from agent_envs.tools import BrowseTool
from agent_envs.tools.browse import html_to_page

SITE = {
    "https://wiki.test/alpha": (
        "<html><head><title>Alpha Corp</title><script>var x = 1;</script></head><body>"
        "<h1>Alpha Corp</h1><p>Alpha Corp was founded by <b>Ada</b> in 1901.</p>"
        "<p>See <a href='/beta'>Beta River</a> and <a href='https://wiki.test/gamma#history'>Gamma</a>.</p>"
        "<a href='/beta'>Beta again</a><a href='mailto:x@y'>mail</a></body></html>"
    ),
    "https://wiki.test/beta/": "<html><title>Beta River</title><p>The Beta River is long.</p></html>",
    "https://wiki.test/notes": "Plain notes.\n\n\n\nSecond paragraph.",
}


def test_in_memory_page_text_and_followable_links() -> None:
    tool = BrowseTool(pages=SITE)
    res = tool.run("  https://wiki.test/alpha ")
    assert res.ok and res.metadata["url"] == "https://wiki.test/alpha"
    assert res.text.startswith("Title: Alpha Corp\nURL: https://wiki.test/alpha\n\n")
    assert "Alpha Corp was founded by Ada in 1901." in res.text and "var x" not in res.text
    links = res.text.split("Links:\n")[1].split("\n")
    assert links == ["[1] Beta River: https://wiki.test/beta", "[2] Gamma: https://wiki.test/gamma"]
    followed = tool.run("https://wiki.test/beta")  # the link target, stored with a trailing slash
    assert followed.ok and "The Beta River is long." in followed.text
    notes = tool.run("<https://wiki.test/notes>")
    assert notes.text == "Title: (none)\nURL: https://wiki.test/notes\n\nPlain notes.\n\nSecond paragraph."
    assert tool.run("https://wiki.test/alpha").text == res.text  # deterministic


def test_unknown_page_and_empty_url() -> None:
    tool = BrowseTool(pages=SITE)
    res = tool.run("https://wiki.test/nowhere")
    assert not res.ok and res.error == "not_found" and res.text == "Page not found: https://wiki.test/nowhere"
    assert tool.run("  ").error == "empty"


def test_truncation_keeps_links_visible() -> None:
    page = "<html><title>Big</title><p>" + "lorem ipsum " * 500 + "</p><a href='/next'>Next</a></html>"
    res = BrowseTool(pages={"https://w/big": page}, max_chars=100).run("https://w/big")
    body = res.text.split("\n\n")[1]
    assert len(body) < 100 + 60 and "[... page truncated at 100 characters]" in body
    assert res.text.endswith("[1] Next: https://w/next")
    many = "<html>" + "".join(f"<a href='/p{i}'>p{i}</a>" for i in range(8)) + "</html>"
    listed = BrowseTool(pages={"https://w/m": many}, max_links=3).run("https://w/m").text
    assert "[3] p2: https://w/p2" in listed and "[4]" not in listed and "[... 5 more links]" in listed


def test_trafilatura_extractor_drops_boilerplate() -> None:
    nav = "<nav>" + " ".join(f"<a href='/n{i}'>Menu {i}</a>" for i in range(30)) + "</nav>"
    article = (
        "<article><h1>Story</h1>"
        + "".join(
            f"<p>Paragraph {i} tells a long and interesting story about rivers and valleys.</p>"
            for i in range(8)
        )
        + "</article>"
    )
    html = (
        f"<html><head><title>Story</title></head><body>{nav}{article}<footer>Copyright</footer></body></html>"
    )
    page = html_to_page(html, "https://w/s", extractor="trafilatura")
    assert "Paragraph 7 tells" in page.text and "Menu 12" not in page.text
    assert len(page.links) == 30  # links are still listed for navigation


def _pdf(pages: list[str]) -> bytes:
    """A minimal valid PDF: one Helvetica text line per page (offsets computed, as readers check)."""
    n = len(pages)
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>"]
    kids = " ".join(f"{3 + 2 * i} 0 R" for i in range(n))
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {n} >>".encode())
    font = 3 + 2 * n
    for i, text in enumerate(pages):
        objects.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {4 + 2 * i} 0 R "
                       f"/Resources << /Font << /F1 {font} 0 R >> >> >>".encode())  # fmt: skip
        stream = f"BT /F1 10 Tf 20 700 Td ({text}) Tj ET".encode()
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


class _Site:
    def __init__(self) -> None:
        self.flaky_seen = 0
        self.hits: dict[str, int] = {}

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/{name}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        self.hits[name] = self.hits.get(name, 0) + 1
        if name == "page":
            html = "<html><title>Local</title><p>Served locally.</p><a href='other'>Other</a></html>"
            return web.Response(text=html, content_type="text/html")
        if name == "text":
            return web.Response(text="just text", content_type="text/plain")
        if name == "data":
            return web.json_response({"answer": 42})
        if name == "image":
            return web.Response(body=b"\x89PNG\r\n\x1a\n" + bytes(100), content_type="image/png")
        if name == "report.pdf":
            body = _pdf(["Quarterly revenue rose to 42 million.", "Second page here."])
            return web.Response(body=body, content_type="application/pdf")
        if name == "long.pdf":  # 2 pages of 400 words: only the first 600 words are read
            body = _pdf([" ".join(f"w{i}" for i in range(p * 400, (p + 1) * 400)) for p in range(2)])
            return web.Response(body=body, content_type="application/pdf")
        if name == "broken.pdf":
            return web.Response(body=b"%PDF-1.4 not really", content_type="application/pdf")
        if name == "moved":
            raise web.HTTPFound("/page")
        if name == "latin":
            body = "<html><title>Caf\xe9</title><p>Cr\xe8me br\xfbl\xe9e</p></html>".encode("latin-1")
            return web.Response(body=body, content_type="text/html", charset="latin-1")
        if name == "huge":
            return web.Response(text="<html><p>" + "x" * 200_000 + "</p></html>", content_type="text/html")
        if name == "slow":
            await asyncio.sleep(0.8)
            return web.Response(text="late", content_type="text/plain")
        if name == "flaky":
            self.flaky_seen += 1
            if self.flaky_seen == 1:
                return web.Response(status=503, text="busy")
            return web.Response(text="<p>recovered</p>", content_type="text/html")
        return web.Response(status=404, text="no such page")


@pytest.fixture
async def site() -> AsyncIterator[tuple[str, _Site]]:
    state = _Site()
    runner = web.AppRunner(state.app())
    await runner.setup()
    tcp = web.TCPSite(runner, "127.0.0.1", 0)
    await tcp.start()
    port = tcp._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}", state
    await runner.cleanup()


async def test_fetches_html_text_json_and_follows_redirects(site: tuple[str, _Site]) -> None:
    base, _ = site
    tool = BrowseTool()
    try:
        page = await tool(f"{base}/page")
        assert page.ok and page.metadata["content_type"] == "text/html"
        assert (
            page.text
            == f"Title: Local\nURL: {base}/page\n\nServed locally.\nOther\n\nLinks:\n[1] Other: {base}/other"
        )
        assert (await tool(f"{base}/text")).text.endswith("\n\njust text")
        assert '"answer": 42' in (await tool(f"{base}/data")).text
        moved = await tool(f"{base}/moved")
        assert moved.ok and moved.metadata["final_url"] == f"{base}/page" and "Served locally." in moved.text
        latin = await tool(f"{base}/latin")
        assert "Title: Café" in latin.text and "Crème brûlée" in latin.text
    finally:
        await tool.aclose()


async def test_reads_pdfs(site: tuple[str, _Site]) -> None:
    base, _ = site
    tool = BrowseTool()
    try:
        report = await tool(f"{base}/report.pdf")
        assert report.ok and report.metadata["content_type"] == "application/pdf"
        assert report.text.endswith("Quarterly revenue rose to 42 million. Second page here.")
        words = (await tool(f"{base}/long.pdf")).text.split("\n\n", 1)[1].split()
        assert words[0] == "w0" and words[-1] == "w599" and len(words) == 600
        broken = await tool(f"{base}/broken.pdf")
        assert not broken.ok and "unreadable PDF" in broken.text
    finally:
        await tool.aclose()


async def test_limits_and_failures_become_observations(site: tuple[str, _Site]) -> None:
    base, state = site
    tool = BrowseTool(max_bytes=10_000, timeout_s=0.3, max_retries=1, backoff_s=0.01, max_chars=20_000)
    try:
        huge = await tool(f"{base}/huge")
        assert huge.ok and huge.metadata["truncated_bytes"] and huge.metadata["bytes"] == 10_000
        image = await tool(f"{base}/image")
        assert not image.ok and "unsupported content type image/png" in image.text
        missing = await tool(f"{base}/missing")
        assert not missing.ok and "HTTP 404" in missing.text and state.hits["missing"] == 1  # 4xx: no retry
        assert missing.error == "http_404"
        slow = await tool(f"{base}/slow")  # the 0.3 s budget covers retries: one attempt, then the cause
        assert not slow.ok and slow.retries == 0 and slow.error == "timeout" and state.hits["slow"] == 1
        # what was left of the 0.3 s once the call was queued (0.3 s unless the machine is loaded)
        assert re.fullmatch(rf"Could not open {re.escape(base)}/slow: timeout after 0\.(3|2\d*) s\.", slow.text)
        assert slow.latency_s < 0.5, slow.latency_s
        flaky = await tool(f"{base}/flaky")
        assert flaky.ok and flaky.retries == 1 and "recovered" in flaky.text
        bad = await tool("file:///etc/passwd")
        assert not bad.ok and bad.error == "invalid_url"
    finally:
        await tool.aclose()


async def test_page_cache_serves_repeats_and_skips_failures(site: tuple[str, _Site]) -> None:
    base, state = site
    cache = ToolCache()
    tool = BrowseTool(cache=cache, max_retries=0)
    try:
        first, second = await tool(f"{base}/page"), await tool(f"{base}/page#top")
        assert not first.cached and second.cached and first.text == second.text
        assert state.hits["page"] == 1
        for _ in range(2):
            assert not (await tool(f"{base}/missing")).ok
        assert state.hits["missing"] == 2  # errors are never cached
        assert cache.stats()["hits"] == 1 and cache.stats()["puts"] == 1
    finally:
        await tool.aclose()


async def test_in_memory_site_never_opens_a_connection(site: tuple[str, _Site]) -> None:
    base, state = site
    tool = BrowseTool(pages={"https://w/a": "<p>a</p>"})
    res = await tool(f"{base}/page")  # a live URL, but not part of the in-memory site
    assert not res.ok and res.error == "not_found" and state.hits == {}
