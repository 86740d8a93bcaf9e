"""kill -9 while a book is ingested into a large bank: what is lost, and how long the bank takes to verify and resume.

    python -m longmem.bench.crash --work runs/library                   # into the library benchmark's 10M-token bank
    python -m longmem.bench.crash --work runs/library --bank library-1000000 --after 10

The bank is one of ``python -m longmem.bench.library``'s (``--work``, built there first), the book one of its
library's, whose bank of its own (``src-<stem>``, built there too) is the reference. Each step is a fresh process
of the project's own command line, as a user would run it:

1. ``longmem bank ingest BANK BOOK --title T`` is started, and killed (SIGKILL) once ``--after`` of its segments are
   committed (default: half of the book's; it may commit more before the signal lands: those count as committed,
   not lost).
2. The bank is opened here: the document must be "ingesting" with at least as many segments as were seen committed
   (so nothing committed was lost; what the killed process was writing, at most one segment, is); then
   ``longmem bank verify BANK``, timed, must pass.
3. ``longmem bank ingest BANK BOOK --title T`` again: it must resume, and the document, complete, must hold the same
   segments as the book ingested alone (token ids and keys/values' CRC-32, segment by segment).
4. ``longmem bank delete BANK --document ID`` removes it again (timed: the compaction of the bank's K/V files), so the
   bank is left as it was found, which is checked (tokens, documents, ``verify``).

Prints one JSON object (stdout) and a markdown table; exits non-zero when a check fails.
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from longmem.bench.inference import log, machine_facts, report
from longmem.util.data import data_dir

DEFAULT_BANK = "library-10000000"
DEFAULT_BOOK = "pg65636.txt"  # the smaller of natural-dev's two books (~48k tokens, ~150 segments)
TITLE = "crash test (kill -9 mid-ingest)"


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "longmem", *args]


def run_timed(argv: list[str], what: str) -> float:
    """Run a command to its end, returning its wall time; a failure stops the benchmark with its output."""
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"error: {what} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return time.perf_counter() - t0


def committed(db: Path, title: str) -> int:
    """Segments committed so far of the document titled ``title`` (read-only, as another reader would)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return con.execute("SELECT count(*) FROM segments s JOIN documents d ON d.id = s.document_id "
                           "WHERE d.title = ?", [title]).fetchone()[0]
    finally:
        con.close()


def segments_of(bank, doc_id: int) -> list[tuple[bytes, int]]:
    """A document's segments as (token ids, keys/values' CRC-32), in order."""
    return [(bytes(t), c) for t, c in bank.db.execute(
        "SELECT tokens, kv_crc32 FROM segments WHERE document_id = ? ORDER BY seq", [doc_id])]


def kill_mid_ingest(argv: list[str], db: Path, after: int, timeout: float) -> tuple[int, float]:
    """Start ``argv``, SIGKILL it once ``after`` segments of ``TITLE`` are committed; (segments seen, seconds run)."""
    t0 = time.perf_counter()
    err = tempfile.TemporaryFile("w+")  # not a pipe: a child that writes much to it never blocks on it
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, text=True)
    try:
        seen = 0
        while seen < after:
            if proc.poll() is not None:
                err.seek(0)
                raise SystemExit(f"error: the ingestion ended ({proc.returncode}) before {after} segments: "
                                 f"{err.read()[-4000:]}")
            if time.perf_counter() - t0 > timeout:
                raise SystemExit(f"error: {after} segments not committed within {timeout:.0f} s ({seen} were)")
            time.sleep(0.05)
            try:
                seen = committed(db, TITLE)
            except sqlite3.OperationalError:  # the bank is busy: ask again
                continue
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        return seen, time.perf_counter() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        err.close()


def scenario(args) -> dict:
    from longmem.storage import BankDirectory
    from longmem.storage.writes import DB_NAME

    directory = BankDirectory(Path(args.work) / "banks")
    if not directory.exists(args.bank):
        raise SystemExit(f"error: no bank {args.bank!r} under {args.work}: build it with "
                         f"`python -m longmem.bench.library --work {args.work}` first")
    stem = Path(args.book).stem
    if not directory.exists(f"src-{stem}"):
        raise SystemExit(f"error: no reference bank src-{stem} under {args.work} (the library benchmark makes it)")
    book = data_dir() / "books" / args.book
    banks = ["--banks-dir", str(directory.root)]
    with directory.open(args.bank) as bank:
        if any(d.title == TITLE for d in bank.documents()):
            raise SystemExit(f"error: bank {args.bank!r} already holds {TITLE!r} (an earlier run that stopped "
                             "midway): delete that document first (`longmem bank delete --document`)")
        before = bank.stats()
        db = bank.path / DB_NAME
    with directory.open(f"src-{stem}") as src:
        whole = src.documents()[0].n_segments
    after = args.after or max(1, whole // 2)
    if after >= whole:
        raise SystemExit(f"error: --after {after}: the book has {whole} segments; kill before its last")
    ingest = cli("bank", "ingest", args.bank, str(book), "--title", TITLE, *banks)
    log(f"ingesting {args.book} into {args.bank} ({before['tokens']:,} tokens), killed after {after} of its {whole} "
        "segments")
    seen, ran_s = kill_mid_ingest(ingest, db, after, args.timeout)
    with directory.open(args.bank) as bank:
        (doc,) = [d for d in bank.documents() if d.title == TITLE]
        left = {"status": doc.status, "segments": doc.n_segments}
    log(f"killed after {ran_s:.0f} s: {seen} segments seen committed, {left['segments']} in the bank, {left['status']}")
    verify_s = run_timed(cli("bank", "verify", args.bank, *banks), "verify after the kill")
    log(f"verified in {verify_s:.1f} s")
    resume_s = run_timed(ingest, "the resumed ingestion")
    with directory.open(args.bank) as bank, directory.open(f"src-{stem}") as src:
        (doc,) = [d for d in bank.documents() if d.title == TITLE]
        same = segments_of(bank, doc.id) == segments_of(src, src.documents()[0].id)
        resumed = {"status": doc.status, "segments": doc.n_segments, "same_as_alone": same}
    log(f"resumed in {resume_s:.1f} s: {resumed}")
    delete_s = run_timed(cli("bank", "delete", args.bank, "--document", str(doc.id), "--yes", *banks),
                         "deleting the document again")
    with directory.open(args.bank) as bank:
        after = bank.stats()
        report_after = bank.verify()
    log(f"deleted in {delete_s:.1f} s; bank verifies: {report_after.ok}")
    checks = {"nothing_committed_lost": left["segments"] >= seen and left["status"] == "ingesting",
              "resumed_complete": resumed["status"] == "complete",
              "same_as_ingested_alone": same,
              "bank_as_found": (after["tokens"], after["documents"]) == (before["tokens"], before["documents"])
              and report_after.ok}
    return {"bank": args.bank, "bank_tokens": before["tokens"], "book": args.book, "killed_after_s": ran_s,
            "book_segments": whole, "segments_seen": seen, "left": left, "verify_s": verify_s, "resume_s": resume_s,
            "resumed": resumed,
            "delete_s": delete_s, "checks": checks, "ok": all(checks.values())}


def markdown(r: dict) -> str:
    rows = [("bank", f"{r['bank']} ({r['bank_tokens']:,} tokens)"), ("book ingested", r["book"]),
            ("killed (SIGKILL) after", f"{r['killed_after_s']:.0f} s, {r['segments_seen']} of the book's "
                                       f"{r['book_segments']} segments seen committed"),
            ("left in the bank", f"{r['left']['segments']} segments, {r['left']['status']}"),
            ("`longmem bank verify`, s", f"{r['verify_s']:.1f}"),
            ("`longmem bank ingest` again (resumes), s", f"{r['resume_s']:.1f}"),
            ("resumed", f"{r['resumed']['segments']} segments, {r['resumed']['status']}"),
            ("`longmem bank delete --document`, s", f"{r['delete_s']:.1f}"),
            *((k.replace("_", " "), "yes" if v else "**no**") for k, v in r["checks"].items())]
    m = r["machine"]
    return "\n".join([f"kill -9 mid-ingest: {m['cpu']}, {m['threads']} threads", "", "| step | result |",
                      "|---|---|", *(f"| {a} | {b} |" for a, b in rows)])


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m longmem.bench.crash", description=__doc__.split("\n\n")[0])
    p.add_argument("--work", required=True, help="the library benchmark's work folder (its banks are reused)")
    p.add_argument("--bank", default=DEFAULT_BANK, help=f"the bank ingested into (default {DEFAULT_BANK})")
    p.add_argument("--book", default=DEFAULT_BOOK, help=f"the book ingested, one of the library's (default "
                                                       f"{DEFAULT_BOOK})")
    p.add_argument("--after", type=int, default=0, help="kill once this many of its segments are committed (default "
                                                         "0: half of the book's)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for those segments")
    p.add_argument("--out", default=None, help="also write the JSON results to this path")
    args = p.parse_args(argv)
    if args.after < 0:
        p.error("--after must be >= 0")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    t0 = time.perf_counter()
    out = {"machine": machine_facts("auto", os.cpu_count() or 1), **scenario(args)}
    out["wall_s"] = time.perf_counter() - t0
    report(out, markdown(out), args.out)
    if not out["ok"]:
        raise SystemExit(1)
    return out


if __name__ == "__main__":
    main()
