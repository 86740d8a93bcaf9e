"""The web app in a real browser: ``python app.py`` on the real embedded backbone, driven by Playwright through
Debian's Chromium (installed with apt-get when missing; never downloaded by Playwright).

One walk through the page as a new user would do it: drop a small book on the Chat tab (the first one), watch it
load into a bank of its own, ask about it and watch the answer stream in, with what it read (each citation opening
onto its surrounding text, its place naming part and chapter) and what memory retrieved in their collapsible
blocks; reload and find the bank, the conversation and then the tab again; find the bank and its finished job in the
Memory banks tab; build and evaluate the Classify tab's sample classifier in one click. Before the book, an empty
file is refused by its own name, beside the question box and not over it. Full-page screenshots go to
``$LONGMEM_SCREENSHOTS`` (else pytest's tmp_path). Skipped, with the reason, only when Chromium (or the playwright
package) cannot be installed.

    python -m pytest -q tests/test_browser.py          # or: pytest -m browser
"""

from __future__ import annotations

import os
import random
import re
import time
from pathlib import Path

import pytest
from browser import (
    MS,
    VIEWPORT,
    BrowserUnavailable,
    app_errors,
    ensure_chromium,
    ensure_playwright,
    launch_chromium,
    open_passages,
    start_app,
    uncovered,
    upload_file,
    wait_idle,
)

from app.chat_tab import RETRIEVED_TITLE

pytestmark = [pytest.mark.browser, pytest.mark.integration]

BANK = "gull_point"  # the bank a dropped gull_point.txt gets
QUESTION = "Who kept the lighthouse on Gull Point, and what did he do every evening? Tell me about him."
READ = "Read from the book"

OPENING = """\
The Keeper of Gull Point

The lighthouse keeper's name was Elias Brandt, and he kept the light on Gull Point for thirty-one years. He had
come to the island as a young man with one trunk, a fiddle with three strings, and a letter from the harbour board
that called him "a sober and careful person, fit for the charge of a coastal light." Nobody on the mainland could
remember a keeper before him, and after a while nobody tried.

The tower stood on a shelf of black rock at the northern end of the island. It was built of granite blocks hauled
from the quarry at Penmarrow, and its walls were so thick that the stair inside wound through them like a worm
through an apple. At the top, behind a brass door that Elias polished every Sunday, sat the great lens: a beehive
of glass prisms taller than a man, which turned on a bath of mercury and threw its beam twenty-two miles out to sea.

Every evening, half an hour before sunset, Elias climbed the hundred and twelve steps, trimmed the wick, filled the
reservoir with paraffin, wound the clockwork that turned the lens, and lit the lamp. Then he wrote the time in the
logbook in his small, upright hand, and added a line about the weather. He did this on calm nights and on nights
when the spray reached the gallery rail, on his birthday and on the night his brother died, and he never once let
the light go out.
"""

CLOSING = """\
In the spring of his last year on the island the harbour board sent a young man named Tobias Quill to learn the
work. Tobias was clever and impatient, and at first he thought the logbook a waste of ink. Elias said nothing. He
only handed him the pen each evening and waited. By midsummer Tobias was writing the weather without being asked,
and by autumn he had learned to tell a rising sea from a falling one by the sound it made against the rocks.

When Elias Brandt finally left Gull Point, he took the fiddle, the trunk, and nothing else. The logbook stayed in
the tower, on its shelf beside the brass door, where the keeper who came after him could read, in a small and
upright hand, thirty-one years of evenings on which the light had been lit on time.
"""

WEATHER = ["a light westerly breeze and a long, lazy swell", "fog from the south that hid the reef until noon",
           "a hard gale from the north-east with rain in squalls", "a clear sky and a sea like hammered pewter",
           "drizzle all day and a falling glass", "a fresh wind from the west and white horses on the bank",
           "thick weather and the horn sounding every two minutes", "a calm so deep that the gulls sat on the water"]
SHIPS = ["the coal brig Margaret Hale", "two herring boats from Penmarrow", "the mail steamer Corrie",
         "a Norwegian timber barque", "the revenue cutter Vigilant", "a yawl with a torn mainsail",
         "the schooner Brothers Three", "no ships at all"]
CHORES = ["scraped the salt from the gallery windows", "mended the hinge of the oil-store door",
          "carried up two cans of paraffin", "cleaned the soot from the chimney of the lamp",
          "painted the iron rail of the gallery", "dug potatoes in the walled garden",
          "rowed across to the mainland for flour and tea", "oiled the clockwork and set it by the church clock"]
MOODS = ["He played the fiddle for an hour after supper.", "He read a chapter of Robinson Crusoe by the lamp.",
         "He wrote a letter to his sister in Carrick that he did not send.", "He slept badly and rose twice to look "
         "at the light.", "He watched the seals on the low rocks until it was too dark to see them.",
         "He counted the flashes of the Skerry light across the sound, as he often did."]
MONTHS = ["March", "April", "May", "June", "July", "August"]


def write_book(path: Path, entries: int = 36, seed: int = 7) -> Path:
    """A ~3k-token story in two parts of two chapters each (PART ONE: I, II; PART TWO: I, II): an opening with the
    distinctive fact, a keeper's logbook, an ending. Deterministic."""
    rng = random.Random(seed)
    log = []
    for i in range(entries):
        day, month = 1 + (i * 5) % 28, MONTHS[i * len(MONTHS) // entries]
        log.append(f"{day} {month}. Lit at {6 + i % 3}.{10 + (i * 7) % 50:02d}. The weather was {rng.choice(WEATHER)}. "
                   f"Passing the point before dusk: {rng.choice(SHIPS)}. In the morning I {rng.choice(CHORES)}, and in "
                   f"the afternoon I {rng.choice(CHORES)}. {rng.choice(MOODS)}")
    title, opening = OPENING.split("\n\n", 1)
    heading = "From the logbook of Gull Point light, kept by E. Brandt\n\n"
    half = len(log) // 2  # two parts of two chapters each, numbered again in each part (as A Lost Lady is)
    text = (f"{title}\n\n\nPART ONE\n\n\nI\n\n{opening}\n\nII\n\n{heading}" + "\n\n".join(log[:half])
            + "\n\n\nPART TWO\n\n\nI\n\n" + "\n\n".join(log[half:]) + "\n\nII\n\n" + CLOSING)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def chromium() -> str:
    try:
        path = ensure_chromium()
        ensure_playwright()
    except BrowserUnavailable as e:
        pytest.skip(str(e))
    return path


def open_page(browser, url: str, errors: list[str]):
    """A page of the app at ``url`` (60 s waits), its JavaScript errors appended to ``errors``."""
    page = browser.new_page(viewport=VIEWPORT)
    page.set_default_timeout(60 * MS)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url, wait_until="domcontentloaded")
    return page


def _shots_dir(tmp_path: Path) -> Path:
    out = Path(os.environ.get("LONGMEM_SCREENSHOTS") or tmp_path / "screenshots")
    out.mkdir(parents=True, exist_ok=True)
    return out


# Records, in the page, each distinct text of the first answer bubble of #chatbot (so no streamed step is missed
# between two round trips of the test), and when the passages block appeared.
RECORDER = """() => {
  window.__answers = []; window.__passagesAt = null;
  const t0 = performance.now();
  window.__recorder = setInterval(() => {
    const bubbles = document.querySelectorAll('#chatbot [data-testid=bot]');
    const text = bubbles.length ? bubbles[0].innerText.trim() : '';
    const seen = window.__answers;
    if (text && (!seen.length || seen[seen.length - 1].text !== text))
      seen.push({t: performance.now() - t0, text: text});
    if (window.__passagesAt === null && document.querySelector('#chatbot .thought-group'))
      window.__passagesAt = performance.now() - t0;
  }, 40);
}"""


def test_upload_ingest_and_chat_in_a_real_browser(chromium, tmp_path):
    sync_playwright = ensure_playwright()
    shots = _shots_dir(tmp_path)
    book = write_book(tmp_path / "gull_point.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    timings: dict[str, float] = {}
    page_errors: list[str] = []
    t_start = time.perf_counter()

    with start_app(tmp_path / "app") as (proc, url, ready_s), sync_playwright() as p:
        timings["app ready"] = ready_s
        browser = launch_chromium(p, chromium)
        try:
            page = open_page(browser, url, page_errors)

            # -- a first click on another tab, as soon as the tabs are drawn, stays there: Gradio reports the first tab
            #    selected as the tabs mount, and that report, remembered for a reload, must not throw the reader back
            page.get_by_role("tab", name="Continue").click()
            page.wait_for_timeout(2000)  # the report and its memo round trip take well under a second
            assert page.get_by_role("tab", name="Continue", selected=True).count() == 1, "thrown back to another tab"
            page.get_by_role("tab", name="Chat").click()

            # -- Chat, the first tab: an empty file is refused by its own name, beside the work, not over it ----------
            page.get_by_role("tab", name="Chat", selected=True).wait_for()
            page.locator("#chat-bank input[role=combobox]").wait_for()
            page.locator("#question textarea").fill(QUESTION)  # typed before the refusal: it stays, in view
            upload_file(page, "chat-book", empty, taken="#chat-notice .notice-error")
            notice = page.locator("#chat-notice .notice-error")
            notice.wait_for(timeout=60 * MS)
            assert "empty.txt" in notice.inner_text() and "/tmp" not in notice.inner_text(), notice.inner_text()
            assert page.locator("#question textarea").input_value() == QUESTION
            assert uncovered(page, "#question textarea") and uncovered(page, "#clear-chat"), "the error covers work"
            assert not page.locator(".toast-body").count(), "an error toast is shown"
            page.screenshot(path=str(shots / "0-refused.png"), full_page=True)
            page.locator("#question textarea").fill("")

            # -- drop a book, watch it load ---------------------------------------------------------------------------
            t0 = time.perf_counter()
            upload_file(page, "chat-book", book, taken="#chat-loading")  # and wait until the upload reached the server
            loading = page.locator("#chat-loading-panel #chat-loading")
            loading.wait_for(timeout=120 * MS)
            page.wait_for_function(f"() => document.querySelector('#chat-bank input[role=combobox]').value === "
                                   f"'{BANK}'", timeout=30 * MS)  # the picker shows the new bank
            seen_running = loading.get_attribute("data-status") == "running"
            if seen_running:  # a few seconds in, so that the bar has moved
                page.wait_for_function(
                    "() => { const p = document.querySelector('#chat-loading');"
                    " const b = document.querySelector('#chat-loading progress');"
                    " return !p || p.dataset.status !== 'running' || (b && b.value > 0); }", timeout=300 * MS)
            page.screenshot(path=str(shots / "1-ingesting.png"), full_page=True)
            page.wait_for_function(
                "() => { const p = document.querySelector('#chat-loading');"
                " return p && !['queued', 'running'].includes(p.dataset.status); }", timeout=600 * MS)
            timings["ingestion"] = time.perf_counter() - t0
            text = loading.inner_text()
            assert loading.get_attribute("data-status") == "done", f"loading ended: {text}"
            assert "is ready" in text and "tokens in memory" in text, text
            page.screenshot(path=str(shots / "2-ingested.png"), full_page=True)

            # -- ask, watch the answer stream -----------------------------------------------------------------------
            wait_idle(page, "chatbot")  # the bank's (empty) history has loaded
            page.locator("#question textarea").fill(QUESTION)
            page.evaluate(RECORDER)
            t0 = time.perf_counter()
            page.click("#send")
            page.locator("#chatbot [data-testid=user]", has_text="Gull Point").wait_for()
            page.wait_for_function("() => window.__answers.length >= 1", timeout=300 * MS)  # its first words
            page.screenshot(path=str(shots / "3-streaming.png"), full_page=True)
            page.locator("#chatbot .thought-group", has_text=RETRIEVED_TITLE).wait_for(timeout=300 * MS)
            wait_idle(page, "chatbot", timeout_s=120)
            timings["answer"] = time.perf_counter() - t0
            answers = page.evaluate("() => window.__answers")
            page.evaluate("() => clearInterval(window.__recorder)")

            final = page.locator("#chatbot [data-testid=bot]").first.inner_text().strip()
            texts = [a["text"] for a in answers]
            shown = page.evaluate("() => window.__passagesAt")  # the passages found: shown while the answer is made
            assert shown is not None and answers and shown <= answers[0]["t"] + 1000, (shown, answers[:1])
            assert final, "the answer is empty"
            assert len(texts) >= 2, f"the answer did not stream (observed: {texts})"
            assert len(texts[-1]) > len(texts[0]), f"the answer did not grow while streaming: {texts[:3]}"
            assert final.startswith(texts[0][:20]), (texts[0], final)
            assert page.locator("#question textarea").input_value() == ""  # the question box was cleared

            # the passages block: collapsed, opens on a click and quotes the book
            title = page.locator("#chatbot .thought-group .title").last
            assert "expanded" not in (title.get_attribute("class") or ""), "the passages block starts open"
            block = open_passages(page)
            block.get_by_text("gull_point").first.wait_for(timeout=10 * MS)  # quotes from the book, by title
            page.screenshot(path=str(shots / "4-answered.png"), full_page=True)

            # what the answer read: its citations, each opening onto the passage marked in its surrounding text
            read = page.locator("#chatbot .thought-group", has_text=READ)
            read.locator(".title").click()
            first = read.locator("details summary").first
            first.wait_for(timeout=10 * MS)
            assert first.inner_text().startswith("[1] gull_point"), first.inner_text()
            places = read.locator("details summary").all_inner_texts()
            place = re.compile(r"gull_point, Part (One|Two), chapter II?, \d+% through the book")
            assert any(place.search(t) for t in places), places  # as the book gives it: part, chapter, where
            first.click()
            read.locator("details[open] blockquote mark").first.wait_for(timeout=10 * MS)
            # its sentence that supports the answer (bold) or, where none does, the one nearest the question (italics)
            read.locator("details[open] blockquote :is(b, i)").first.wait_for(timeout=10 * MS)
            read.evaluate("el => el.scrollIntoView({block: 'start'})")
            page.screenshot(path=str(shots / "5-citations.png"), full_page=True)

            # -- a reload keeps the chosen bank and the conversation, and then the tab ------------------------------
            page.reload(wait_until="domcontentloaded")
            picked = "document.querySelector('#chat-bank input[role=combobox]')?.value"
            try:
                page.wait_for_function(f"() => {picked} === '{BANK}'", timeout=60 * MS)
            except Exception as e:  # what the page shows instead, and what the app reported
                raise AssertionError(f"after a reload Chat's bank is {page.evaluate('() => ' + picked)!r}, not "
                                     f"{BANK!r}; page errors {page_errors}; app errors "
                                     f"{app_errors(tmp_path / 'app' / 'app.log')}") from e
            page.locator("#chatbot [data-testid=user]", has_text="Gull Point").wait_for(timeout=60 * MS)
            page.locator("#chatbot .thought-group", has_text=READ).wait_for(timeout=30 * MS)

            # -- bank management, one tab away: the new bank, ready, and its finished job ---------------------------
            page.get_by_role("tab", name="Memory banks").click()
            page.locator("#banks-table", has_text=BANK).wait_for(timeout=30 * MS)
            page.locator("#banks-table", has_text="ready").wait_for(timeout=30 * MS)
            job = page.locator("#jobs-panel div.job", has_text=BANK).first
            job.wait_for(timeout=30 * MS)
            assert job.get_attribute("data-status") == "done" and "ingested" in job.inner_text()
            assert job.locator("progress").get_attribute("value") == "100.0"
            page.screenshot(path=str(shots / "6-banks.png"), full_page=True)
            assert not page.locator("#cancel-ingestion").is_visible(), "Cancel shows while nothing runs"
            page.reload(wait_until="domcontentloaded")
            page.get_by_role("tab", name="Memory banks", selected=True).wait_for(timeout=60 * MS)

            # -- Classify: the sample file builds a classifier in one click, then it is evaluated -------------------
            page.get_by_role("tab", name="Classify").click()
            assert not page.locator("#per-label").is_visible(), "an empty results table is shown"
            t0 = time.perf_counter()
            page.click("#classify-sample")
            page.locator("#build-status", has_text="Building").wait_for(timeout=120 * MS)
            page.wait_for_function("() => document.querySelector('#saved-classifier input[role=combobox]').value "
                                   "=== 'restaurant-reviews'", timeout=600 * MS)  # the job saved it
            page.get_by_label("Also plot accuracy against the examples in memory").uncheck()
            page.click("#evaluate")
            summary = page.locator("#eval-summary", has_text="Accuracy")
            summary.wait_for(timeout=900 * MS)
            page.locator("#per-label", has_text="positive").wait_for(timeout=30 * MS)
            timings["sample classifier"] = time.perf_counter() - t0
            accuracy = float(re.search(r"Accuracy ([0-9.]+)%", summary.inner_text()).group(1))
            assert "on 60 held-out examples" in summary.inner_text(), summary.inner_text()
            page.screenshot(path=str(shots / "7-classify.png"), full_page=True)
        finally:
            browser.close()
        assert proc.poll() is None, "the app exited during the test"
        log_path = tmp_path / "app" / "app.log"

    timings["total"] = time.perf_counter() - t_start
    print(f"\nscreenshots in {shots}; timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
    print(f"sample classifier: {accuracy:.1f}% on 60 held-out reviews")
    print(f"job seen running: {seen_running}; answer streamed in {len(texts)} observed steps, first {texts[0]!r}, "
          f"final {len(final)} chars; app log: {log_path}")
    errors = app_errors(log_path)
    assert not page_errors, f"JavaScript errors in the page: {page_errors}"
    assert not any("Traceback" in line for line in errors), f"errors in {log_path}: {errors}"
    for name in ("1-ingesting.png", "2-ingested.png", "3-streaming.png", "4-answered.png", "6-banks.png"):
        assert (shots / name).stat().st_size > 10_000, name


def test_the_chat_tab_names_its_reader_and_answers_with_the_one_switched_to(chromium, tmp_path, monkeypatch):
    """The app started with another reader than the bank's model (a tiny Qwen2 GGUF, where the 1.5B would be too slow
    here): Chat names it, its answer's passages block says that it answered with the bank's memory not read; switched
    to the embedded 135M (the bank's own model), the next answer says so, with the bank's memory."""
    from tiny_gguf import tiny_gguf

    sync_playwright = ensure_playwright()
    monkeypatch.setenv("LONGMEM_CACHE_DIR", str(tmp_path / "cache"))  # the tiny reader's copy stays out of the user's
    reader = tmp_path / "tiny-qwen.gguf"
    tiny_gguf(reader, "qwen2", seed=3)
    book = write_book(tmp_path / "gull_point.txt", entries=8)
    page_errors: list[str] = []
    with start_app(tmp_path / "app", extra_args=("--reader", str(reader))) as (proc, url, _), sync_playwright() as p:
        browser = launch_chromium(p, chromium)
        try:
            page = open_page(browser, url, page_errors)
            picker = page.locator("#chat-reader input[role=combobox]")
            picker.wait_for()
            assert picker.input_value() == "tiny-qwen"  # the reader the app was started with, by name
            upload_file(page, "chat-book", book, taken="#chat-loading")
            page.wait_for_function(
                "() => { const p = document.querySelector('#chat-loading');"
                " return p && p.dataset.status === 'done'; }", timeout=600 * MS)
            wait_idle(page, "chatbot")

            def ask(question: str) -> str:
                page.locator("#question textarea").fill(question)
                page.click("#send")
                page.locator("#chatbot [data-testid=user]", has_text=question).wait_for()
                page.locator("#chatbot .thought-group", has_text="answered by").nth(asked[0]).wait_for(
                    timeout=300 * MS)
                wait_idle(page, "chatbot", timeout_s=120)
                asked[0] += 1
                return page.locator("#chatbot .thought-group .title", has_text="answered by").last.inner_text()

            asked = [0]
            title = ask("Who kept the lighthouse on Gull Point?")
            assert "answered by tiny-qwen, memory not read" in title, title
            picker.click()
            page.get_by_role("option", name="SmolLM2-135M-Instruct").click()
            page.wait_for_function("() => document.querySelector('#chat-reader input[role=combobox]').value === "
                                   "'SmolLM2-135M-Instruct'")
            title = ask("What did the keeper polish every Sunday?")
            assert "answered by SmolLM2-135M-Instruct, with the bank's memory" in title, title
            page.screenshot(path=str(_shots_dir(tmp_path) / "reader-switched.png"), full_page=True)
        finally:
            browser.close()
        assert proc.poll() is None, "the app exited during the test"
    assert not page_errors, f"JavaScript errors in the page: {page_errors}"
    errors = app_errors(tmp_path / "app" / "app.log")
    assert not any("Traceback" in line for line in errors), errors
