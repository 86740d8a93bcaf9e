"""Background jobs: long work (ingesting books) runs in a worker thread of the process, not inside the request that
started it, so a client can leave, reload the page and find the job where it is.

    jobs = JobManager()
    job_id = jobs.submit("ingest", bank="gatsby", title="gatsby.txt", work=lambda ctx: ...)
    jobs.get(job_id)      # a JobState snapshot: status, bytes/tokens done, tokens/s, time left, message
    jobs.cancel(job_id)   # the work stops at its next ``ctx.check()``

Jobs run one at a time, in submission order (they compete for the same CPU cores as everything else). The work
function reports progress through its ``JobContext`` and returns a message for the finished state. The manager keeps
the last ``keep`` finished jobs for display.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

log = logging.getLogger(__name__)

ACTIVE = ("queued", "running")


class Cancelled(Exception):
    """Raised inside a job's work when someone cancelled it."""


@dataclass(frozen=True)
class JobState:
    id: str
    kind: str  # e.g. "ingest"
    bank: str  # the bank the job works on
    title: str  # what it works on, for people (file names)
    status: str = "queued"  # queued | running | done | failed | cancelled
    step: str = ""  # what it is doing now, e.g. "book.epub (2/3)"
    bytes_done: int = 0  # of the current file's text stream (or of the step's items: ``unit``)
    bytes_total: int = 0
    unit: str = "B"  # what bytes_done / bytes_total count: "B" (a file's bytes) or a step's items (e.g. "texts")
    tokens_done: int = 0  # tokens stored by this job so far (all files)
    file_tokens: int = 0  # ... of which from the current file
    tokens_per_s: float = 0.0
    eta_s: float | None = None  # seconds left for the current file, estimated from its bytes
    message: str = ""  # outcome when finished (or the error, readable)
    submitted: float = field(default_factory=time.time)
    started: float | None = None
    finished: float | None = None

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    @property
    def fraction(self) -> float:
        return self.bytes_done / self.bytes_total if self.bytes_total else 0.0

    def to_dict(self) -> dict:
        return asdict(self)


class JobContext:
    """What a job's work sees: progress reporting and the cancel check."""

    def __init__(self, manager: "JobManager", job_id: str, cancel: threading.Event):
        self._manager, self.job_id, self._cancel = manager, job_id, cancel
        self._t0 = time.perf_counter()
        self._file_t0 = self._t0
        self._file_tokens0 = 0  # job tokens when the current file started
        self._tokens = 0

    def check(self) -> None:
        """Raise ``Cancelled`` if the job was cancelled."""
        if self._cancel.is_set():
            raise Cancelled()

    def new_file(self, step: str, unit: str = "B") -> None:
        """A new step (a file; ``unit``: what its progress counts, bytes or its items, e.g. "texts")."""
        self._file_t0, self._file_tokens0 = time.perf_counter(), self._tokens
        self._manager._update(self.job_id, step=step, bytes_done=0, bytes_total=0, file_tokens=0, eta_s=None,
                              unit=unit)

    def progress(self, bytes_done: int, bytes_total: int, tokens_done: int) -> None:
        """Report progress (and stop here if cancelled): bytes of the current file, tokens of the whole job."""
        now = time.perf_counter()
        self._tokens = tokens_done
        rate_b = bytes_done / max(now - self._file_t0, 1e-9)
        eta = (bytes_total - bytes_done) / rate_b if bytes_done > 0 else None
        self._manager._update(self.job_id, bytes_done=bytes_done, bytes_total=bytes_total, tokens_done=tokens_done,
                              file_tokens=tokens_done - self._file_tokens0, eta_s=eta,
                              tokens_per_s=tokens_done / max(now - self._t0, 1e-9))
        self.check()

    def count(self, done: int, total: int) -> None:
        """Report progress through a step that stores no tokens (e.g. fitting a classifier, begun with
        ``new_file(step, unit)``): ``done`` of ``total`` of its items; stop here if cancelled."""
        self.progress(done, total, self._tokens)


Work = Callable[[JobContext], str]


class JobManager:
    """A queue of jobs run one at a time by a daemon worker thread."""

    def __init__(self, keep: int = 50):
        self._lock = threading.Lock()
        self._jobs: dict[str, JobState] = {}
        self._cancel: dict[str, threading.Event] = {}
        self._queue: queue.Queue = queue.Queue()
        self._ids = itertools.count(1)
        self._keep = keep
        self._worker: threading.Thread | None = None

    def submit(self, kind: str, bank: str, title: str, work: Work) -> str:
        with self._lock:
            job_id = f"{kind}-{next(self._ids)}"
            self._jobs[job_id] = JobState(id=job_id, kind=kind, bank=bank, title=title)
            self._cancel[job_id] = threading.Event()
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._run, name="longmem-jobs", daemon=True)
                self._worker.start()
        self._queue.put((job_id, work))
        return job_id

    def get(self, job_id: str) -> JobState:
        with self._lock:
            if job_id not in self._jobs:
                raise KeyError(f"no job {job_id!r}")
            return self._jobs[job_id]

    def list(self, bank: str | None = None) -> list[JobState]:
        """Jobs, newest first (optionally only those of one bank)."""
        with self._lock:
            jobs = [j for j in self._jobs.values() if bank is None or j.bank == bank]
        return sorted(jobs, key=lambda j: j.submitted, reverse=True)

    def busy(self, bank: str) -> bool:
        """Whether a queued or running job works on ``bank``."""
        return any(j.active for j in self.list(bank))

    def cancel(self, job_id: str) -> JobState:
        """Ask a job to stop: a queued job never starts, a running one stops at its next progress report."""
        with self._lock:
            state = self._jobs.get(job_id)
            if state is None:
                raise KeyError(f"no job {job_id!r}")
            self._cancel[job_id].set()
            if state.status == "queued":
                self._jobs[job_id] = replace(state, status="cancelled", message="cancelled before it started",
                                             finished=time.time())
            return self._jobs[job_id]

    def wait(self, job_id: str, timeout: float | None = None) -> JobState:
        """Block until the job has finished (for scripts and tests)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.get(job_id).active:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {self.get(job_id).status} after {timeout} s")
            time.sleep(0.05)
        return self.get(job_id)

    # -- worker -------------------------------------------------------------------------------------------------
    def _update(self, job_id: str, **changes) -> None:
        with self._lock:
            self._jobs[job_id] = replace(self._jobs[job_id], **changes)

    def _run(self) -> None:
        while True:
            job_id, work = self._queue.get()
            if self.get(job_id).status != "queued":  # cancelled while it waited
                continue
            self._update(job_id, status="running", started=time.time())
            ctx = JobContext(self, job_id, self._cancel[job_id])
            try:
                message = work(ctx)
                status = "done"
            except Cancelled:
                status, message = "cancelled", "cancelled; what was stored so far stays in the bank"
            except Exception as e:  # a job's failure is shown to its user, never crashes the app
                log.exception("job %s failed", job_id)
                status, message = "failed", str(e) or type(e).__name__
            self._update(job_id, status=status, message=message, finished=time.time(), eta_s=None)
            self._forget_old()

    def _forget_old(self) -> None:
        with self._lock:
            done = sorted((j for j in self._jobs.values() if not j.active), key=lambda j: j.submitted)
            for j in done[: max(0, len(done) - self._keep)]:
                del self._jobs[j.id]
                del self._cancel[j.id]
