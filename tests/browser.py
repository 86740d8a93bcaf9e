"""Real-browser helpers: Debian's Chromium driven by Playwright, and the web app started as ``python app.py`` in a
subprocess on the real embedded backbone.

Nothing here downloads a browser through Playwright (``playwright install`` fetches from outside PyPI/apt): the
browser is the distribution's ``chromium`` package, installed with apt-get when missing, and only the ``playwright``
pip package comes from PyPI.

    path = ensure_chromium()                      # or BrowserUnavailable(reason)
    sync_playwright = ensure_playwright()
    with start_app(tmp_dir) as (proc, url, ready_s), sync_playwright() as p:
        browser = launch_chromium(p, path)
        page = browser.new_page(viewport=VIEWPORT)
        page.goto(url)
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHROMIUM_NAMES = ("chromium", "chromium-browser")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-background-networking", "--disable-component-update",
                 "--disable-default-apps", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
VIEWPORT = {"width": 1280, "height": 900}
APT_TIMEOUT_S = 900


class BrowserUnavailable(RuntimeError):
    """Chromium or Playwright is missing and could not be installed; the message says why."""


class AppFailed(RuntimeError):
    """The app exited or did not answer in time; the message carries the end of its log."""


# -- the browser ----------------------------------------------------------------------------------------------------
def _which_chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def ensure_chromium() -> str:
    """The path of a Chromium binary; installs Debian's ``chromium`` package with apt-get when there is none.

    Raises ``BrowserUnavailable`` with the reason when it is missing and cannot be installed (no apt-get, not
    root, no package source reachable)."""
    path = _which_chromium()
    if path:
        return path
    if not shutil.which("apt-get"):
        raise BrowserUnavailable("Chromium is not installed and there is no apt-get to install it with")
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        raise BrowserUnavailable("Chromium is not installed and installing it with apt-get needs root "
                                 "(run: sudo apt-get install chromium)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")  # with its recommends: fonts-liberation for the text
    try:
        done = subprocess.run("apt-get update -qq && apt-get install -y -qq chromium",
                              shell=True, env=env, capture_output=True, text=True, timeout=APT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise BrowserUnavailable(f"installing Chromium with apt-get took over {APT_TIMEOUT_S} s") from None
    path = _which_chromium()
    if path:
        return path
    tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
    raise BrowserUnavailable(f"Chromium could not be installed with apt-get (exit {done.returncode}): "
                             + " | ".join(tail))


def ensure_playwright():
    """Playwright's ``sync_playwright``; pip-installs the ``playwright`` package (never a browser) when missing."""
    try:
        return importlib.import_module("playwright.sync_api").sync_playwright
    except ImportError:
        pass
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "playwright"], capture_output=True,
                              text=True, timeout=600)
    except subprocess.TimeoutExpired:
        raise BrowserUnavailable("pip install playwright took over 600 s") from None
    importlib.invalidate_caches()
    try:
        return importlib.import_module("playwright.sync_api").sync_playwright
    except ImportError as e:
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        raise BrowserUnavailable(f"the playwright package is missing and pip could not install it ({e}): "
                                 + " | ".join(tail)) from None


def launch_chromium(p, path: str, headless: bool = True):
    """Start Chromium at ``path`` through Playwright ``p`` (offline-friendly flags; sandbox off: we run as root)."""
    return p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS, headless=headless)


# -- the app --------------------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""
    except (urllib.error.URLError, OSError):
        return 0, b""


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _default_sigint() -> None:
    """In the child: Ctrl-C (SIGINT) stops the app even when this process was started with SIGINT ignored (as a
    background job of a non-interactive shell is), so that the app can shut down cleanly."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stop(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """Stop the app and anything it started: SIGINT (Ctrl-C) to its process group, then SIGTERM, then SIGKILL."""
    for sig, wait_s in ((signal.SIGINT, grace_s), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers of the group, if any


@contextlib.contextmanager
def start_app(tmp_dir, port: int | None = None, extra_args=(), timeout: float = 300.0):
    """Run ``python app.py --no-browser --port PORT --banks-dir TMP/banks`` from the repository root.

    Yields ``(proc, url, seconds_to_ready)`` once the page and Gradio's config answer; the app's stdout and stderr go
    to ``TMP/app.log``. On exit the app's whole process group is stopped. Raises ``AppFailed`` (with the end of the
    log) when the app exits early or is not ready within ``timeout`` seconds (the first-ever run converts the
    embedded backbone, about a minute)."""
    tmp_dir = Path(tmp_dir)
    tmp_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    url = f"http://127.0.0.1:{port}/"
    log_path = tmp_dir / "app.log"
    cmd = [sys.executable, "app.py", "--no-browser", "--port", str(port), "--banks-dir", str(tmp_dir / "banks"),
           *extra_args]
    env = dict(os.environ, PYTHONUNBUFFERED="1", GRADIO_ANALYTICS_ENABLED="False")
    t0 = time.perf_counter()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True, preexec_fn=_default_sigint)
    try:
        deadline = t0 + timeout
        while True:
            if proc.poll() is not None:
                raise AppFailed(f"the app exited with code {proc.returncode} before it was ready; "
                                f"end of {log_path}:\n{log_tail(log_path)}")
            if time.perf_counter() > deadline:
                raise AppFailed(f"the app was not ready after {timeout:.0f} s; end of {log_path}:\n"
                                f"{log_tail(log_path)}")
            status, _ = _get(url)
            if status == 200:
                status, body = _get(url + "config")
                if status == 200 and _is_json(body):
                    break
            time.sleep(0.5)
        yield proc, url, time.perf_counter() - t0
    finally:
        _stop(proc)


def _is_json(body: bytes) -> bool:
    try:
        json.loads(body)
    except ValueError:
        return False
    return True


def app_errors(log_path: Path) -> list[str]:
    """Lines of the app's log that report an error or a traceback (for the test's report)."""
    try:
        text = Path(log_path).read_text(errors="replace")
    except OSError:
        return []
    keys = ("Traceback", "ERROR", "Error:", "Exception", "exception")
    return [line for line in text.splitlines() if any(k in line for k in keys)]


# -- Gradio page helpers (selectors checked against Gradio 6.31's DOM) -------------------------------------------------
MS = 1000  # Playwright timeouts are in milliseconds


def choose(page, component: str, option: str, timeout_s: float = 60) -> None:
    """Pick ``option`` in the Gradio dropdown with elem_id ``component``: open its list, click the option."""
    box = page.locator(f"#{component} input[role=combobox]")
    box.click()
    page.locator(f"#{component} [role=option]", has_text=option).first.click(timeout=timeout_s * MS)
    page.wait_for_function("([sel, v]) => document.querySelector(sel).value === v",
                           arg=[f"#{component} input[role=combobox]", option], timeout=10 * MS)


def type_new_value(page, component: str, value: str) -> None:
    """Type a value that is not (yet) among a Gradio dropdown's choices (``allow_custom_value``) and commit it."""
    box = page.locator(f"#{component} input[role=combobox]")
    box.click()
    box.fill(value)
    box.press("Enter")
    if box.input_value() != value:
        raise AssertionError(f"dropdown #{component} shows {box.input_value()!r}, not {value!r}")


def upload_file(page, component: str, path, attempts: int = 3, timeout_s: float = 20, taken: str | None = None) -> None:
    """Give a Gradio file component a file and wait until the server has it: the component shows its name or, for a
    component the app clears once it took the file, the element matching the CSS selector ``taken`` (what the app
    shows when it has it) appears. On a loaded machine a selection made while the page is still settling can be
    dropped without an error, so it is made again (``attempts`` times in all) before giving up; never once the file
    was taken (a second upload of a book is a second bank)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    shown = page.locator(f"#{component}", has_text=Path(path).name)
    arrived = shown.or_(page.locator(taken)) if taken else shown
    for attempt in range(attempts):
        page.locator(f"#{component} input[type=file]").set_input_files(str(path))
        try:
            arrived.first.wait_for(timeout=timeout_s * MS)
            return
        except PlaywrightTimeout:
            if attempt == attempts - 1:
                raise


def wait_idle(page, component: str, timeout_s: float = 60) -> None:
    """Wait until the Gradio status tracker of the component with elem_id ``component`` is hidden (nothing pending
    on it: no event running or queued with it as output)."""
    page.wait_for_function(
        "sel => { const s = document.querySelector(sel); return !s || s.classList.contains('hide'); }",
        arg=f"#{component} > [data-testid=status-tracker]", timeout=timeout_s * MS)


def wait_stable_height(page, locator, timeout_s: float = 10, settle_s: float = 0.5) -> float:
    """Wait until the element's height stops changing (the end of an expand animation); returns the height."""
    deadline = time.monotonic() + timeout_s
    last = -1.0
    while True:
        height = locator.evaluate("el => el.getBoundingClientRect().height")
        if height == last or time.monotonic() > deadline:
            return height
        last = height
        time.sleep(settle_s)


def open_passages(page, timeout_s: float = 10):
    """Open the collapsible "What memory retrieved" block of the Chat tab's last answer (a Gradio chatbot
    "thought" message), wait for its expand animation to end and scroll the conversation so that the block's end is
    in view. Returns the block's locator."""
    block = page.locator("#chatbot .thought-group").last
    title = block.locator(".title")
    if "expanded" not in (title.get_attribute("class") or ""):
        title.click()
    page.wait_for_function(
        "() => { const g = [...document.querySelectorAll('#chatbot .thought-group')].pop();"
        " return g.getBoundingClientRect().height > 2 * g.querySelector('.title').getBoundingClientRect().height; }",
        timeout=timeout_s * MS)
    wait_stable_height(page, block, timeout_s)
    block.evaluate("el => el.scrollIntoView({block: 'end'})")
    page.evaluate("() => window.scrollTo(0, 0)")
    return block


def uncovered(page, selector: str) -> bool:
    """Whether the element's centre is on screen and nothing else is drawn over it (what a click there would hit
    is the element or one of its children)."""
    page.locator(selector).first.scroll_into_view_if_needed()
    return page.evaluate(
        "sel => { const el = document.querySelector(sel); const r = el.getBoundingClientRect();"
        " const hit = document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2);"
        " return !!hit && (hit === el || el.contains(hit)); }", selector)
