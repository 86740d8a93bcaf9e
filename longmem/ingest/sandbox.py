"""Text extraction in a child process with a memory cap and a time cap: a hostile file costs only its own job.

    got = extract_in_child(Path("book.epub"), "epub", None, ExtractLimits(), check=ctx.check)
    got.text_path, got.title, got.meta, got.size    # the caller owns (and removes) got.text_path
    title_in_child(Path("book.pdf"), "pdf", ExtractLimits())   # only the title it gives itself ("" if none)

Why a child process, and not only streaming. The readers stream (``documents``, ``htmltext``): paragraphs are
written out as they are parsed, so a real book needs a few tens of MiB whatever its size. But part of the work is
done by libraries we do not control, and some of it cannot be streamed: pypdf holds the whole file and one
decoded stream at a time, lxml and zlib run C code that no Python check can interrupt, and a new malformation can
find a path nobody bounded. In a child process, ``resource.setrlimit(RLIMIT_AS)`` caps the memory of every such
path (a ``MemoryError`` there is reported as the memory limit) and the parent's clock caps its time (the child is
killed at ``max_extract_seconds``; ``RLIMIT_CPU`` stops it too if the parent itself dies). Killing it is also how a
job is cancelled at once, wherever the extraction is, and how Ctrl-C ends it: the child runs in its own session, so
only the parent decides when it stops. The price is the child's start (an interpreter importing lxml and, for
PDFs, pypdf; docs/benchmarks.md), paid once per file; the web app's process never parses an untrusted document.

The child imports the readers without the package's ``__init__`` (which loads torch: seconds of start-up and
hundreds of MiB of address space that the memory cap would count), by registering a bare ``longmem`` package whose
path is this directory. It reads one JSON request on stdin and writes one JSON answer on stdout: the facts of the
text it wrote (op "extract") or the document's title (op "title"), or the error (``InputError``'s message, and the
limit's name for a ``LimitError``). POSIX only (``resource``, sessions); where ``resource`` is missing, the child runs
without the memory cap.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

from longmem.ingest.limits import MIB, ExtractLimits, LimitError
from longmem.text.io import InputError

log = logging.getLogger(__name__)

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # longmem/, imported bare by the child (no torch)
POLL_S = 0.1  # how often the parent looks at the clock and the cancel check while the child works
STDERR_TAIL = 2000  # characters of a crashed child's stderr that go into the log
# seconds a child may look for a document's title (``title_in_child``): that is done while an upload waits, and a
# title is in the first bytes of HTML, in two small files of an EPUB, in a PDF's trailer
TITLE_SECONDS = 10.0
BOOT = ("import sys, types\n"
        "package = types.ModuleType('longmem')\n"
        "package.__path__ = [sys.argv[1]]\n"
        "sys.modules['longmem'] = package\n"
        "from longmem.ingest.sandbox import child_main\n"
        "child_main()\n")


@dataclass(frozen=True)
class Extracted:
    """What the child wrote: the UTF-8 text file (the caller's to remove) and its facts."""
    text_path: Path
    title: str
    meta: dict
    chars: int  # characters of text
    size: int  # bytes of text_path


def extract_in_child(path: Path, kind: str, demos, limits: ExtractLimits,
                     check: Callable[[], None] | None = None) -> Extracted:
    """Extract the text of ``path`` (a file of one of ``formats.KINDS``, read by its format's reader; ``demos`` a
    ``DemoFormat`` for demonstration files) in a child process held to ``limits``. ``check`` is called every
    ``POLL_S`` seconds; whatever it raises (a job's ``Cancelled``) stops the child at once and is raised here, as is
    ``KeyboardInterrupt``. Raises ``InputError`` for unreadable files and ``LimitError`` when a limit is crossed, the
    time and memory caps included; the temporary text file is removed then."""
    fd, name = tempfile.mkstemp(prefix="longmem-text-", suffix=".txt")
    os.close(fd)
    out = Path(name)
    request = {"op": "extract", "path": str(path), "kind": kind, "out": str(out), "limits": asdict(limits),
               "demos": asdict(demos) if demos is not None else None}
    try:
        facts = _ask(request, path, limits, check)
        return Extracted(out, facts["title"], facts["meta"], facts["chars"], out.stat().st_size)
    except BaseException:
        _unlink(out)
        raise


def title_in_child(path: Path, kind: str, limits: ExtractLimits, check: Callable[[], None] | None = None) -> str:
    """The raw title that a document of ``kind`` (one of ``formats.TITLED_KINDS``) gives itself
    (``formats.read_title``; "" if none), read in a child process held to ``limits`` with at most ``TITLE_SECONDS``
    on its clock. Raises as ``extract_in_child`` does."""
    limits = replace(limits, max_extract_seconds=min(limits.max_extract_seconds, TITLE_SECONDS))
    request = {"op": "title", "path": str(path), "kind": kind, "limits": asdict(limits)}
    return _ask(request, path, limits, check)["title"]


def _ask(request: dict, path: Path, limits: ExtractLimits, check: Callable[[], None] | None) -> dict:
    """Run one request in a child process; returns its answer's facts, or raises its error (see
    ``extract_in_child``)."""
    with tempfile.TemporaryFile() as err:
        answer, code = _run(json.dumps(request).encode(), err, path, limits, check)
        if answer is None:
            err.seek(0)
            tail = err.read().decode("utf-8", errors="replace")[-STDERR_TAIL:]
            log.warning("the %s child of %s ended with status %s; its stderr ends with:\n%s", request["op"], path,
                        code, tail)
            raise _crash(path, code, limits)
    if "error" in answer:
        if answer.get("limit"):
            raise LimitError(answer["error"], answer["limit"])
        raise InputError(answer["error"])
    return answer["ok"]


def _run(request: bytes, err, path: Path, limits: ExtractLimits, check) -> tuple[dict | None, int]:
    """Run the child to its end (or kill it); returns (its JSON answer or None, its exit status)."""
    env = {**os.environ, "PYTHONSAFEPATH": "1"}  # the child's imports never come from the current directory
    proc = subprocess.Popen([sys.executable, "-c", BOOT, str(PACKAGE_DIR)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=err, env=env, start_new_session=True)
    deadline = time.monotonic() + limits.max_extract_seconds
    data: bytes | None = request
    try:
        while True:
            try:
                stdout, _ = proc.communicate(data, timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                data = None
                if check is not None:
                    check()
                if time.monotonic() > deadline:
                    raise limits.error("max_extract_seconds", f"{path}: reading its text took too long") from None
    finally:
        if proc.returncode is None:  # stopped here (time, cancel, Ctrl-C): end the child and all it started
            _kill(proc)
    try:
        return json.loads(stdout.decode("utf-8").strip().splitlines()[-1]), proc.returncode
    except (ValueError, IndexError):
        return None, proc.returncode


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()


def _crash(path: Path, code: int, limits: ExtractLimits) -> InputError:
    """The error for a child that died without answering."""
    if code == -signal.SIGXCPU:
        return limits.error("max_extract_seconds", f"{path}: reading its text used too much CPU time")
    if code < 0:
        what = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
        return LimitError(f"{path}: the reader was killed ({what}); a file that needs more memory than "
                          f"{limits.describe('max_extract_memory_mb')} can end so", "max_extract_memory_mb")
    return InputError(f"{path}: the reader stopped with status {code} before it was done (details in the log)")


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# -----------------------------------------------------------------------------
# the child

def _cap(limits: ExtractLimits) -> None:
    """Hold this process to the memory cap (address space) and, as a backstop, to a CPU-time cap."""
    try:
        import resource
    except ImportError:  # not POSIX: the parent's clock still applies
        return

    def lower(which: int, value: int) -> None:
        soft, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(which, (value, value if which != resource.RLIMIT_CPU else hard))

    lower(resource.RLIMIT_AS, limits.max_extract_memory_mb * MIB)
    lower(resource.RLIMIT_CPU, math.ceil(limits.max_extract_seconds) + 1)


def child_main() -> None:
    """Entry point of the child process (see the module docstring for the protocol)."""
    logging.basicConfig(level=logging.ERROR)  # the parent reads the child's stderr only when it crashes
    warnings.simplefilter("ignore")  # parsers warn about every flaw of a damaged file
    request = json.loads(sys.stdin.buffer.read())
    limits = ExtractLimits(**request["limits"])
    path = Path(request["path"])
    _cap(limits)
    try:
        if request["op"] == "title":
            from longmem.ingest.formats import read_title

            answer = {"ok": {"title": read_title(path, request["kind"], limits)}}
        else:
            from longmem.ingest.demofiles import DemoFormat
            from longmem.ingest.formats import extract

            demos = DemoFormat(**request["demos"]) if request["demos"] is not None else None
            answer = {"ok": extract(path, request["kind"], Path(request["out"]), limits, demos)}
    except LimitError as e:
        answer = {"error": str(e), "limit": e.limit}
    except InputError as e:
        answer = {"error": str(e)}
    except MemoryError:
        answer = {"error": str(limits.error("max_extract_memory_mb", f"{path}: reading its text needed more memory")),
                  "limit": "max_extract_memory_mb"}
    except RecursionError:
        answer = {"error": f"{path}: cannot read this file: it is nested too deeply"}
    except Exception as e:  # the readers turn known failures into InputError; anything else is still the file's
        log.exception("reading %s failed", path)
        answer = {"error": f"{path}: cannot read this file ({type(e).__name__}: {e})"}
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
