"""XXE and friends stay closed: external entities, XIncludes, external DTDs and remote stylesheets in an HTML file, in
an EPUB's chapters, package (OPF), container and NCX are never fetched or resolved, entities stay literal text, and
no DOCTYPE text reaches the stored text. A local HTTP server counts every request; a local file holds a secret."""

from __future__ import annotations

import http.server
import threading
import time
from pathlib import Path

import pytest
from docfiles import NCX, package, write_epub

from longmem.ingest.formats import extract
from longmem.ingest.limits import ExtractLimits
from longmem.ingest.readers import open_source

SECRET = "SECRET-7f3a9c"
FETCHED = "FETCHED-2b8e41"
LAUGHS = "".join(f'<!ENTITY lol{i} "{f"&lol{i - 1};" * 10}">' for i in range(1, 10))  # 10^9 "lol" if expanded


@pytest.fixture(scope="module")
def server():
    """An HTTP server on 127.0.0.1 that records every path asked for and answers with FETCHED."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.path)
            body = f'<?xml version="1.0"?><x>{FETCHED}</x><!ENTITY e "{FETCHED}">'.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    httpd.shutdown()


@pytest.fixture
def secret(tmp_path) -> Path:
    p = tmp_path / "secret.txt"
    p.write_text(SECRET)
    return p


def hostile_doctype(url: str, secret: Path, root: str = "html") -> str:
    return (f'<?xml-stylesheet type="text/xsl" href="{url}/style.xsl"?>\n'
            f'<!DOCTYPE {root} PUBLIC "-//W3C//DTD XHTML 1.1//EN" "{url}/external.dtd" [\n'
            f'  <!ENTITY xxe SYSTEM "file://{secret}">\n  <!ENTITY remote SYSTEM "{url}/entity">\n'
            f'  <!ENTITY % pe SYSTEM "{url}/parameter.dtd"> %pe;\n  {LAUGHS}\n]>\n')


def hostile_page(url: str, secret: Path) -> str:
    return (f'<?xml version="1.0" encoding="utf-8"?>\n{hostile_doctype(url, secret)}'
            f'<html xmlns="http://www.w3.org/1999/xhtml" xmlns:xi="http://www.w3.org/2001/XInclude">'
            f'<head><title>Hostile &xxe;</title><link rel="stylesheet" href="{url}/style.css"/>'
            f'<script src="{url}/script.js"></script></head>'
            f'<body><p>Before &xxe; and &remote; and &lol9; after.</p>'
            f'<xi:include href="file://{secret}" parse="text"/><xi:include href="{url}/include.xml"/>'
            f'<img src="{url}/image.png"/><iframe src="{url}/frame.html"></iframe><p>End.</p></body></html>')


PAGE_TEXT = "Before &xxe; and &remote; and &lol9; after.\n\nEnd."


def read(path: Path, kind: str, tmp_path: Path, inline: bool) -> tuple[str, str]:
    """(title, text) of a file, read in this process (``formats.extract``) or as the app does (a child)."""
    if inline:
        out = tmp_path / "out.txt"
        facts = extract(path, kind, out, ExtractLimits())
        return facts["title"], out.read_text(encoding="utf-8")
    with open_source(path) as src:
        return src.title, "".join(b.text for b in src.blocks())


def assert_closed(title: str, text: str, seen: list[str]) -> None:
    for leak in (SECRET, FETCHED, "]>", "DOCTYPE", "ENTITY", "lollol"):
        assert leak not in text and leak not in title, leak
    assert seen == []


@pytest.mark.parametrize("inline", [True, False], ids=["in-process", "child"])
def test_html_file_resolves_and_fetches_nothing(server, secret, tmp_path, inline):
    url, seen = server
    p = tmp_path / "hostile.html"
    p.write_text(hostile_page(url, secret))
    t0 = time.perf_counter()
    title, text = read(p, "html", tmp_path, inline)
    assert time.perf_counter() - t0 < 30  # the billion laughs were never expanded
    assert (title, text) == ("Hostile &xxe;", PAGE_TEXT)  # entities stay literal, as written
    assert_closed(title, text, seen)


@pytest.mark.parametrize("inline", [True, False], ids=["in-process", "child"])
def test_epub_package_container_ncx_and_chapters_resolve_and_fetch_nothing(server, secret, tmp_path, inline):
    url, seen = server
    opf = package(2, title="Book &xxe; &remote; &lol9;", prolog=hostile_doctype(url, secret, "package"),
                  metadata=f'<xi:include xmlns:xi="http://www.w3.org/2001/XInclude" href="file://{secret}" '
                           f'parse="text"/><xi:include xmlns:xi="http://www.w3.org/2001/XInclude" href="{url}/x"/>')
    container = ('<?xml version="1.0"?>\n' + hostile_doctype(url, secret, "container")
                 + '<container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container"><rootfiles>'
                 '&xxe;&remote;<rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/>'
                 '</rootfiles></container>')
    ncx = NCX.replace('<?xml version="1.0"?>', '<?xml version="1.0"?>\n' + hostile_doctype(url, secret, "ncx"))
    ncx = ncx.replace("<navMap/>", "<navMap>&xxe;&remote;</navMap>")
    p = write_epub(tmp_path / "hostile.epub", [hostile_page(url, secret), hostile_page(url, secret)], opf=opf,
                   container=container, ncx=ncx)
    title, text = read(p, "epub", tmp_path, inline)
    assert title == "Book &xxe; &remote; &lol9;"
    assert text == PAGE_TEXT + "\n\n" + PAGE_TEXT
    assert_closed(title, text, seen)


def test_doctype_is_dropped_in_any_chunking():
    """The DOCTYPE is cut out however the markup is split into chunks (here: one byte at a time)."""
    from longmem.ingest.htmltext import html_paragraphs

    markup = ('<!DOCTYPE html [<!ENTITY a "]"><!ENTITY b "x">]  >\n<p>one</p><!doctype html><p>two</p>'
              '<!DOCTYPE x [ ] >').encode()
    out: list[str] = []
    html_paragraphs([markup[i:i + 1] for i in range(len(markup))], out.append)
    whole: list[str] = []
    html_paragraphs([markup], whole.append)
    assert out == whole == ["one", "two"]
