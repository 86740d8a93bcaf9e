"""Screenshots of the web app for the docs: one full-page PNG per tab, with realistic content.

    python tests/screenshots.py --out docs/screenshots      # or: make screenshots

Starts ``python app.py`` on the real embedded backbone with a fresh banks directory, then drives it in Debian's
Chromium (installed with apt-get when missing) through Playwright: ingests the opening of The Great Gatsby into bank
``gatsby``, asks a question about it in Chat (what it read open), continues a passage in Continue, builds, evaluates
and uses the sample classifier in Classify (the app's own sample file, one click), and shows the Model tab. Writes
banks.png, chat.png, continue.png, classify.png and model.png. On a 2-core CPU it takes a few minutes (2 on an
AVX512-BF16 one), most of it the classifier. The chat answers with the reader the app picks (the best installed:
``make screenshots`` takes a second set with an empty cache, the embedded 135M alone).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from browser import (  # the script's own folder, tests/, is first on sys.path
    MS,
    REPO,
    VIEWPORT,
    BrowserUnavailable,
    app_errors,
    choose,
    ensure_chromium,
    ensure_playwright,
    launch_chromium,
    log_tail,
    start_app,
    type_new_value,
    upload_file,
    wait_idle,
)

from app.chat_tab import RETRIEVED_TITLE

SHARED = REPO.parent / "shared" / "data"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Full-page screenshots of each tab of the LongMem web app, with content.")
    p.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots", help="where the PNGs go")
    p.add_argument("--book", type=Path, default=SHARED / "books" / "pg64317.txt",
                   help="a plain-text book (default: The Great Gatsby from ../shared/data/books)")
    p.add_argument("--book-kb", type=int, default=60,
                   help="use only the book's first BOOK_KB kilobytes (ingestion: a few hundred tokens/s on a CPU)")
    p.add_argument("--bank", default="gatsby", help="bank for the book")
    p.add_argument("--question", default="Where did the narrator go to college?",
                   help="the question asked in the Chat tab")
    p.add_argument("--passage", default="I decided to call to him. Miss Baker had mentioned him at dinner, and that "
                   "would do for an introduction. But I didn't call to him, for he gave a sudden intimation that he "
                   "was content to be alone",
                   help="the passage continued in the Continue tab")
    p.add_argument("--text", default="The soup was rich and warming, and the staff were lovely.",
                   help="the text classified in the Classify tab")
    p.add_argument("--port", type=int, default=None, help="port for the app (default: a free one)")
    p.add_argument("--work", type=Path, default=None,
                   help="working directory (banks, app.log; default: a temporary one, removed unless --keep)")
    p.add_argument("--keep", action="store_true", help="keep the working directory")
    p.add_argument("--headed", action="store_true", help="show the browser window (needs a display)")
    return p.parse_args(argv)


def excerpt(book: Path, out: Path, kb: int) -> Path:
    """The first ``kb`` KB of ``book`` (without a Project Gutenberg start marker), cut at a paragraph end."""
    text = book.read_text(encoding="utf-8", errors="replace")
    if text.startswith("*** START OF"):
        text = text.split("\n", 1)[1]
    text = text.lstrip("\n")
    cut = text[: kb * 1024]
    end = cut.rfind("\n\n")
    out.write_text(cut[: end if end > len(cut) // 2 else len(cut)].rstrip() + "\n", encoding="utf-8")
    return out


def step(msg: str, t0: float) -> None:
    print(f"[{time.perf_counter() - t0:6.1f} s] {msg}", flush=True)


def wait_jobs_done(page, timeout_s: float) -> None:
    """Wait until no job of the Memory banks tab's panel is queued or running, and the newest one is done."""
    page.wait_for_function(
        "() => { const jobs = [...document.querySelectorAll('#jobs-panel div.job')];"
        " return jobs.length && jobs.every(j => !['queued', 'running'].includes(j.dataset.status)); }",
        timeout=timeout_s * MS)
    job = page.locator("#jobs-panel div.job").first
    status = job.get_attribute("data-status")
    if status != "done":
        raise RuntimeError(f"ingestion ended {status}: {job.inner_text()}")


def shoot(page, path: Path) -> None:
    page.evaluate("() => window.scrollTo(0, 0)")
    page.screenshot(path=str(path), full_page=True)
    _shrink(path)  # committed: the repository keeps its tracked files under 20 MB
    print(f"    wrote {path} ({path.stat().st_size / 1024:,.0f} KB)", flush=True)


def _shrink(path: Path) -> None:
    """Reduce a PNG to a 256-colour palette: UI screenshots lose nothing visible and shrink to under half."""
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(path) as im:
        small = im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)


def run(args: argparse.Namespace, work: Path) -> None:
    t0 = time.perf_counter()
    chromium = ensure_chromium()
    sync_playwright = ensure_playwright()
    args.out.mkdir(parents=True, exist_ok=True)
    book = excerpt(args.book, work / "The Great Gatsby.txt", args.book_kb)
    step(f"book excerpt: {book.stat().st_size / 1024:,.0f} KB; starting the app", t0)

    with start_app(work / "app", port=args.port) as (_proc, url, ready_s), sync_playwright() as p:
        step(f"app ready at {url} after {ready_s:.1f} s", t0)
        browser = launch_chromium(p, chromium, headless=not args.headed)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.set_default_timeout(60 * MS)
            page.goto(url, wait_until="domcontentloaded")

            # -- Memory banks: the book into bank gatsby ---------------------------------------------------------
            page.get_by_role("tab", name="Memory banks").click()
            page.get_by_role("tab", name="Memory banks", selected=True).wait_for()
            page.locator("#jobs-panel #jobs-empty").wait_for()
            page.locator("#upload-bank input[role=combobox]").wait_for()  # the tab's controls drawn, not only its panel
            type_new_value(page, "upload-bank", args.bank)
            upload_file(page, "upload-files", book)
            page.click("#ingest")
            page.locator("#jobs-panel div.job").first.wait_for()
            step("ingesting the book", t0)
            wait_jobs_done(page, timeout_s=1800)
            step("ingested: " + page.locator("#jobs-panel div.job").first.inner_text().replace("\n", " "), t0)

            # -- Chat -------------------------------------------------------------------------------------------------
            page.get_by_role("tab", name="Chat").click()
            choose(page, "chat-bank", args.bank)
            wait_idle(page, "chatbot")
            page.locator("#question textarea").fill(args.question)
            page.click("#send")
            # what the answer read, shown whole once the answer ends (the bank's own model also shows what memory
            # retrieved; another reader reads with memory off): the first passage opened in its surrounding text
            read = page.locator("#chatbot .thought-group", has_text=re.compile("Read from the book|The closest"))
            read.first.wait_for(timeout=600 * MS)
            wait_idle(page, "chatbot", timeout_s=120)
            read.first.locator(".title").click()
            read.first.locator("details summary").first.click()
            read.first.locator("details[open] blockquote").first.wait_for(timeout=10 * MS)
            page.locator("#chatbot [data-testid=user]").first.scroll_into_view_if_needed()
            step("answered", t0)
            shoot(page, args.out / "chat.png")

            # -- Continue ---------------------------------------------------------------------------------------------
            page.get_by_role("tab", name="Continue").click()
            choose(page, "continue-bank", args.bank)
            page.locator("#continue-passage textarea").fill(args.passage)
            found = page.locator(".gr-accordion", has=page.locator("button.label-wrap", has_text=RETRIEVED_TITLE))
            found.locator("button.label-wrap").click()  # open it: the passages show when the continuation is done
            page.click("#continue")
            found.get_by_text(re.compile(r"retrieved \d+×")).first.wait_for(timeout=600 * MS)
            wait_idle(page, "continuation", timeout_s=120)
            step("continued", t0)
            shoot(page, args.out / "continue.png")

            # -- Classify: the sample file, one click ---------------------------------------------------------------
            page.get_by_role("tab", name="Classify").click()
            page.click("#classify-sample")
            page.locator("#build-status", has_text="Building").wait_for(timeout=120 * MS)
            step("building the sample classifier (its examples into memory)", t0)
            page.wait_for_function("() => document.querySelector('#saved-classifier input[role=combobox]').value "
                                   "=== 'restaurant-reviews'", timeout=1800 * MS)  # the job saved it
            step("classifier saved; evaluating", t0)
            page.click("#evaluate")
            page.locator("#eval-summary", has_text="Accuracy").wait_for(timeout=3600 * MS)
            page.locator("img[src*='confusion']").first.wait_for(timeout=60 * MS)
            page.locator("img[src*='curve']").first.wait_for(timeout=60 * MS)
            step("evaluated: " + page.locator("#eval-summary").inner_text().replace("\n", " "), t0)
            page.locator("#classify-text textarea").fill(args.text)
            page.click("#classify-one")
            page.locator("#prediction", has_text="positive").first.wait_for(timeout=300 * MS)  # shown
            wait_idle(page, "prediction", timeout_s=120)
            step("classified: " + page.locator("#prediction").inner_text().replace("\n", " "), t0)
            shoot(page, args.out / "classify.png")

            # -- Model ------------------------------------------------------------------------------------------------
            page.get_by_role("tab", name="Model").click()
            page.locator("#model-info", has_text="Backbone").wait_for()
            page.get_by_role("button", name="Refresh", exact=True).click()  # memory use now that banks are loaded
            wait_idle(page, "model-info")
            page.locator("#model-info", has_text=args.bank).wait_for()
            shoot(page, args.out / "model.png")

            # -- Memory banks, last: both banks, both jobs, the book's documents ----------------------------------
            page.get_by_role("tab", name="Memory banks").click()
            wait_jobs_done(page, timeout_s=60)
            choose(page, "documents-bank", args.bank)
            page.locator("#documents-table", has_text="complete").wait_for(timeout=60 * MS)
            shoot(page, args.out / "banks.png")
        finally:
            browser.close()
    errors = app_errors(work / "app" / "app.log")
    step(f"done; {len(errors)} error lines in {work / 'app' / 'app.log'}", t0)
    for line in errors:
        print("    " + line)


def main(argv=None) -> int:
    args = parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="longmem-shots-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        run(args, work)
    except BrowserUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception:
        print(f"end of the app log ({work / 'app' / 'app.log'}):\n{log_tail(work / 'app' / 'app.log')}",
              file=sys.stderr)
        args.keep = True
        raise
    finally:
        if not args.keep and args.work is None:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"working directory kept: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
