"""Reading untrusted files: time to refusal and peak memory of a zip-bomb EPUB before and after the extraction
limits, and what the limits cost a real book.

    git archive 78469e0 | (mkdir -p /tmp/longmem-78469e0 && tar -x -C /tmp/longmem-78469e0)   # the old code
    python -m longmem.bench.extract --before /tmp/longmem-78469e0      # full run (~7 minutes, most of it "before")
    python -m longmem.bench.extract --quick                            # small sizes, no "before"

Scenarios, each in a fresh process that imports only the readers (a bare ``longmem`` package, as the extraction
child does: no torch), opens the file with ``open_source`` and reads every block:

- ``bomb``: an EPUB whose one chapter inflates to ``--bomb-mb`` (340) MiB of XHTML, ~1.3 MB on disk (the issue's
  file). Before: the code of ``--before`` (a checkout of an older commit), stopped at ``--before-timeout`` if it
  has not finished. After: the upload check (``check_source``), then the job's read with the default limits
  (refused from the zip directory), then with the directory checks set out of the way (``max_zip_ratio`` and
  ``max_unzipped_bytes`` huge), so that the streamed reader meets the whole text and ``max_chars`` decides.
- ``book``: real books (``--books``, from the shared Gutenberg set) as EPUBs of ~100 KB chapters, before and after;
  and one (``--pdf-book``) as a PDF typeset by fpdf2 (a test dependency; skipped without it), to see what a page
  costs against ``max_extract_seconds``.

Peak memory is sampled by this process every 50 ms with psutil over the scenario process and its extraction child
(counted once it runs its own program: right after the fork a child's RSS is still its parent's); "increment" is the
peak over the scenario's RSS once its imports were done. Prints one JSON object (stdout), then a markdown table.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import psutil

from longmem.util.data import data_dir

ROOT = Path(__file__).resolve().parents[2]  # the checkout whose longmem/ the "after" reads run
MIB = 2**20
SCENARIO = """
import json, sys, time, types
root, path, limits = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
package = types.ModuleType("longmem"); package.__path__ = [root + "/longmem"]; sys.modules["longmem"] = package
from longmem.ingest.readers import open_source
import psutil
check_only = limits is not None and limits.pop("check_only", False)
kw = {}
if limits is not None:
    from longmem.ingest.limits import ExtractLimits
    kw["limits"] = ExtractLimits(**limits)
def read():
    if check_only:
        from longmem.ingest.readers import check_source
        return check_source(path, **kw)
    return sum(len(b.text) for b in open_source(path, **kw).blocks())
print(json.dumps({"ready_rss_mb": psutil.Process().memory_info().rss / 2**20}), flush=True)
t0 = time.perf_counter()
try:
    chars = read()
    out = {"outcome": "passed"} if check_only else {"outcome": "read", "chars": chars}
except Exception as e:
    out = {"outcome": type(e).__name__, "message": str(e)[:300]}
out["s"] = time.perf_counter() - t0
print(json.dumps(out), flush=True)
"""


def log(msg: str) -> None:
    print(f"[bench-extract {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_scenario(code_root: Path, path: Path, limits: dict | None, timeout: float) -> dict:
    """Run one read in a fresh process; its result with the peak RSS of it and its extraction child."""
    proc = subprocess.Popen([sys.executable, "-c", SCENARIO, str(code_root), str(path), json.dumps(limits)],
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONSAFEPATH": "1"})
    me, peak, t0 = psutil.Process(proc.pid), 0.0, time.monotonic()
    ready = json.loads(proc.stdout.readline() or "{}")
    while proc.poll() is None and time.monotonic() - t0 < timeout:
        try:
            rss = me.memory_info().rss + sum(c.memory_info().rss for c in me.children(recursive=True)
                                             if any("child_main" in part for part in c.cmdline()))
            peak = max(peak, rss / MIB)
        except psutil.Error:
            pass
        time.sleep(0.05)
    if proc.poll() is None:
        for c in me.children(recursive=True):
            c.kill()
        proc.kill()
        proc.wait()
        result = {"outcome": "still reading when stopped", "s": time.monotonic() - t0}
    else:
        result = json.loads(proc.stdout.read().strip().splitlines()[-1])
    proc.stdout.close()
    ready_mb = ready.get("ready_rss_mb", 0.0)
    return {**result, "peak_rss_mb": peak, "ready_rss_mb": ready_mb, "increment_mb": max(0.0, peak - ready_mb)}


def chapters_of(text: str, size: int = 100_000) -> list[str]:
    """A book's paragraphs as XHTML chapters of about ``size`` characters."""
    out, cur, n = [], [], 0
    for para in (p.strip() for p in text.split("\n\n")):
        if para:
            cur.append(f"<p>{html.escape(' '.join(para.split()))}</p>\n")
            n += len(cur[-1])
        if n >= size:
            out.append("".join(cur))
            cur, n = [], 0
    return out + (["".join(cur)] if cur else [])


def write_epub(path: Path, title: str, bodies: list[str] | None = None, bomb_bytes: int = 0) -> Path:
    """An EPUB of ``bodies`` (chapter XHTML bodies), or one chapter of ``bomb_bytes`` of repeated paragraphs."""
    n = len(bodies) if bodies is not None else 1
    items = "".join(f'<item id="c{i}" href="c{i}.xhtml" media-type="application/xhtml+xml"/>' for i in range(n))
    spine = "".join(f'<itemref idref="c{i}"/>' for i in range(n))
    head = ('<?xml version="1.0" encoding="utf-8"?>\n<!DOCTYPE html>\n<html xmlns="http://www.w3.org/1999/xhtml">'
            f"<head><title>{html.escape(title)}</title></head><body>")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        z.writestr("mimetype", "application/epub+zip", compress_type=zipfile.ZIP_STORED)
        z.writestr("META-INF/container.xml", '<?xml version="1.0"?><container version="1.0" xmlns="urn:oasis:names:'
                   'tc:opendocument:xmlns:container"><rootfiles><rootfile full-path="content.opf" media-type='
                   '"application/oebps-package+xml"/></rootfiles></container>')
        z.writestr("content.opf", '<?xml version="1.0"?><package xmlns="http://www.idpf.org/2007/opf" version="3.0">'
                   f'<metadata xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>{html.escape(title)}</dc:title>'
                   f"</metadata><manifest>{items}</manifest><spine>{spine}</spine></package>")
        if bodies is not None:
            for i, body in enumerate(bodies):
                z.writestr(f"c{i}.xhtml", head + body + "</body></html>")
        else:
            block = ("<p>" + "All work and no play makes Jack a dull boy. " * 20 + "</p>\n").encode()
            block *= MIB // len(block)
            with z.open("c0.xhtml", "w", force_zip64=True) as f:
                f.write(head.encode())
                for done in range(0, bomb_bytes, len(block)):
                    f.write(block[: bomb_bytes - done])
                f.write(b"</body></html>")
    return path


def write_pdf(path: Path, text: str) -> int | None:
    """The book typeset as a PDF (fpdf2, Helvetica 11 pt); returns its pages, or None without fpdf2."""
    try:
        from fpdf import FPDF
    except ImportError:
        return None
    pdf = FPDF()
    pdf.set_font("helvetica", size=11)
    pdf.add_page()
    for para in (p.strip() for p in text.split("\n\n")):
        if para:
            pdf.multi_cell(0, 5, " ".join(para.split()).encode("latin-1", "replace").decode("latin-1"))
            pdf.ln(2)
    pdf.output(str(path))
    return pdf.page_no()


def machine() -> dict:
    from longmem.bench.inference import cpu_name

    cpu = cpu_name()
    import lxml.etree
    import pypdf

    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "lxml": ".".join(map(str, lxml.etree.LXML_VERSION)), "pypdf": pypdf.__version__}


def markdown(r: dict) -> str:
    rows = []
    for name, s in r["runs"].items():
        what = s["outcome"] if s["outcome"] != "read" else f"read, {s['chars']:,} characters"
        if s.get("message"):
            what += f": {s['message'][:90]}"
        rows.append(f"| {name} | {s['s']:.2f} | {s['peak_rss_mb']:.0f} | {s['increment_mb']:.0f} | {what} |")
    m = r["machine"]
    return "\n".join([f"Text extraction, {m['cpu']} ({m['cores']} cores), Python {m['python']}, lxml {m['lxml']}, "
                      f"pypdf {m['pypdf']}; bomb: {r['bomb']['mb']} MiB of XHTML in a {r['bomb']['file_kb']:,} KB "
                      "EPUB", "", "| scenario | seconds | peak RSS, MiB | over the imports, MiB | outcome |",
                      "|---|---:|---:|---:|---|", *rows])


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m longmem.bench.extract", description=__doc__.split("\n\n")[0])
    p.add_argument("--before", default=None, help="a checkout of the code to compare with (e.g. commit 78469e0)")
    p.add_argument("--before-timeout", type=float, default=300.0,
                   help="seconds after which the old code's read of the bomb is stopped")
    p.add_argument("--bomb-mb", type=int, default=340, help="MiB of XHTML the bomb's chapter inflates to")
    p.add_argument("--books", default="pg64317.txt,pg67258.txt",
                   help="comma-separated books of the shared data to read as EPUBs (default: The Great Gatsby "
                        "and the largest book of the set)")
    p.add_argument("--pdf-book", default="pg64317.txt", help="book of the shared data to read as a PDF ('' = none)")
    p.add_argument("--quick", action="store_true", help="a 40 MiB bomb, one book, no 'before'")
    p.add_argument("--out", default=None, help="also write the JSON results to this path")
    args = p.parse_args(argv)
    if args.quick:
        args.bomb_mb, args.books, args.before = 40, args.books.split(",")[0], None
    t0 = time.perf_counter()
    runs: dict[str, dict] = {}
    loose = {"max_zip_ratio": 1e9, "max_unzipped_bytes": 2**50}
    with tempfile.TemporaryDirectory(prefix="longmem-bench-extract-") as work:
        bomb = write_epub(Path(work) / "bomb.epub", "Bomb", bomb_bytes=args.bomb_mb * MIB)
        log(f"bomb: {args.bomb_mb} MiB of XHTML in {bomb.stat().st_size / 1e6:.2f} MB")
        if args.before:
            log(f"bomb, before (stopped at {args.before_timeout:.0f} s)")
            runs["bomb, before"] = run_scenario(Path(args.before), bomb, None, args.before_timeout)
        log("bomb, after")
        runs["bomb, after: upload check"] = run_scenario(ROOT, bomb, {"check_only": True}, 600)
        runs["bomb, after: job, default limits"] = run_scenario(ROOT, bomb, {}, 600)
        runs["bomb, after: job, zip checks off (max_chars decides)"] = run_scenario(ROOT, bomb, loose, 1200)
        for name in filter(None, args.books.split(",")):
            text = (data_dir() / "books" / name).read_text(encoding="utf-8", errors="replace")
            book = write_epub(Path(work) / f"{Path(name).stem}.epub", name, bodies=chapters_of(text))
            label = f"book {name} ({len(text) / 1e6:.1f} M characters, {book.stat().st_size / 1e6:.1f} MB EPUB)"
            if args.before:
                log(f"{label}, before")
                runs[f"{label}, before"] = run_scenario(Path(args.before), book, None, 600)
            log(f"{label}, after")
            runs[f"{label}, after"] = run_scenario(ROOT, book, {}, 600)
        if args.pdf_book:
            pdf = Path(work) / "book.pdf"
            pages = write_pdf(pdf, (data_dir() / "books" / args.pdf_book).read_text(encoding="utf-8", errors="replace"))
            label = f"book {args.pdf_book} as a {pages}-page PDF ({pdf.stat().st_size / 1e6:.1f} MB)" if pages else ""
            for side, code in (("before", args.before), ("after", ROOT)):
                if pages and code:
                    log(f"{label}, {side}")
                    runs[f"{label}, {side}"] = run_scenario(Path(code), pdf, {} if side == "after" else None, 600)
        results = {"machine": machine(), "bomb": {"mb": args.bomb_mb, "file_kb": round(bomb.stat().st_size / 1e3)},
                   "before": args.before, "runs": runs, "wall_s": time.perf_counter() - t0}
    text = json.dumps(results, indent=2)
    print(text)
    print()
    print(markdown(results))
    if args.out:
        Path(args.out).write_text(text + "\n")
    return results


if __name__ == "__main__":
    main()
