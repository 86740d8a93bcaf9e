"""`longmem bank ...`, `classify --bank` and `generate --bank` end to end, on a tiny model saved to disk."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from docfiles import extraction_children, slow_pdf
from helpers import story
from tiny import small_config, tiny_llama

from longmem.cli.main import main
from longmem.model.longmem import LongMemModel
from longmem.storage import BankDirectory
from longmem.tasks.classify import Classifier

pytestmark = pytest.mark.heavy  # whole command-line runs, end to end

WORDS = "the lamps were lit again while the boat drifted past the mill towards the sea".split()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny llama saved as a Hugging Face directory, and an (untrained) LongMem checkpoint that names it."""
    root = tmp_path_factory.mktemp("tiny")
    backbone = tiny_llama()
    backbone.model.save_pretrained(root / "backbone")
    backbone.tokenizer.save_pretrained(root / "backbone")
    model = LongMemModel(backbone, small_config(backbone=str(root / "backbone"), segment_len=64))
    return str(model.save(root / "ckpt"))


@pytest.fixture
def run(tmp_path, checkpoint, capsys):
    banks = str(tmp_path / "banks")

    def run(*argv, model=False):
        extra = ["--banks-dir", banks] + (["--checkpoint", checkpoint] if model else [])
        code = main([*argv, *extra])
        out = capsys.readouterr()
        return code, out.out, out.err
    run.banks = banks
    return run


@pytest.fixture
def files(tmp_path):
    g = torch.Generator().manual_seed(0)
    book = tmp_path / "book.txt"
    book.write_text(" ".join(WORDS[int(i)] for i in torch.randint(len(WORDS), (600,), generator=g)))
    demos = tmp_path / "demos.csv"
    rows = [f"{'a fine bright film' if i % 2 else 'a dull grey film'} {i},{i % 2}" for i in range(40)]
    demos.write_text("text,label\n" + "\n".join(rows) + "\n")
    return book, demos


def test_bank_lifecycle(run, files):
    book, _ = files
    code, out, err = run("bank", "ingest", "lib", str(book), "--create", model=True)
    assert code == 0 and "ingested as document 1" in out
    assert "book.txt: 100%" in err and "Source(" not in err  # the progress bar is named after the file
    code, out, _ = run("bank", "ingest", "lib", str(book), model=True)
    assert code == 0 and "skipped" in out
    code, out, _ = run("bank", "list")
    assert "lib" in out and "tiny" not in out.split("lib")[0]
    code, out, _ = run("bank", "info", "lib")
    assert code == 0 and "[1] book (book.txt, text)" in out and "complete" in out
    assert run("bank", "verify", "lib")[1].strip().endswith("lib: ok")
    next(BankDirectory(run.banks).path("lib").glob("keys-0-*.faiss")).write_bytes(b"junk")
    code, out, _ = run("bank", "verify", "lib")
    assert code == 0 and "index files brought up to date (1 rebuilt" in out
    assert run("bank", "rebuild-index", "lib")[0] == 0
    assert run("bank", "rename", "lib", "library")[0] == 0
    code, _, err = run("bank", "delete", "library")
    assert code == 2 and "without --yes" in err
    assert run("bank", "delete", "library", "--document", "1", "--yes")[0] == 0
    code, out, _ = run("bank", "info", "library")
    assert "0 tokens" in out
    assert run("bank", "delete", "library", "--yes")[0] == 0
    assert "no banks" in run("bank", "list")[1]


def test_bank_ingest_compile_stores_the_book_as_the_eager_run_does(run, files, monkeypatch):
    """``--compile``: the same document and tokens as without it; with no C++ compiler it is refused by name."""
    book, _ = files
    code, out, _ = run("bank", "ingest", "eager", str(book), "--create", model=True)
    assert code == 0
    code, out, err = run("bank", "ingest", "fast", str(book), "--create", "--compile", model=True)
    assert code == 0 and "ingested as document 1" in out and "Warning" not in err
    directory = BankDirectory(run.banks)
    with directory.open("eager") as a, directory.open("fast") as b:
        assert [d.n_tokens for d in a.documents()] == [d.n_tokens for d in b.documents()] and b.verify().ok
    monkeypatch.setenv("CXX", "no-such-compiler")
    code, _, err = run("bank", "ingest", "none", str(book), "--create", "--compile", model=True)
    assert code != 0 and "C++ compiler" in err and "no-such-compiler" in err and "Traceback" not in err
    assert not directory.exists("none")  # refused before a bank was made


def test_cli_errors_name_the_problem(run, files, tmp_path):
    code, _, err = run("bank", "info", "nope")
    assert code == 2 and "no bank named 'nope'" in err
    code, _, err = run("bank", "create", "../out", model=True)
    assert code == 2 and "invalid bank name" in err
    code, _, err = run("bank", "ingest", "nope", str(files[0]), model=True)
    assert code == 2 and "no bank named 'nope'" in err
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    code, _, err = run("bank", "ingest", "x", str(empty), "--create", model=True)
    assert code == 2 and "the file is empty" in err and not BankDirectory(run.banks).exists("x")
    code, _, err = run("bank", "ingest", "x", str(files[1]), "--create", "--label-words", "0=bad,2=good", model=True)
    assert code == 2 and "label '1' is not one of: 0, 2" in err
    code, _, err = run("bank", "ingest", "x", str(files[1]), "--create", "--label-column", "sentiment", model=True)
    assert code == 2 and "no 'sentiment' column" in err
    code, _, err = run("generate", "--bank", "nope", "--prompt", "hi")
    assert code == 2 and "no bank named 'nope'" in err


def test_classify_and_generate_with_a_bank(run, files):
    _, demos = files
    code, out, _ = run("bank", "ingest", "demos", str(demos), "--create", "--label-words", "0=negative,1=positive",
                       model=True)
    assert code == 0 and "ingested" in out
    code, out, err = run("classify", "--bank", "demos", "--text", "a fine bright film", "--text", "a dull film",
                         model=True)  # a head fitted on the bank's 40 demonstrations, stored with it
    assert code == 0 and "head fitted on 40 examples: cross-validated accuracy" in err
    lines = [line.split("\t") for line in out.strip().splitlines()]
    assert [(cols[0], cols[3]) for cols in lines] == [("positive", "a fine bright film"), ("negative", "a dull film")]
    assert all(0.5 <= float(cols[1]) <= 1 and cols[2] in ("sure", "unsure") for cols in lines)
    code, again, err = run("classify", "--bank", "demos", "--text", "a fine bright film", model=True)
    assert code == 0 and "head fitted" not in err and again.split("\t")[:2] == out.split("\t")[:2]  # stored
    code, out, _ = run("classify", "--bank", "demos", "--text", "a fine bright film", "--method", "in-context",
                       "--finder", "lexical", "--shots", "2", "--calibrate", "--show-demos", model=True)
    lines = out.strip().splitlines()
    cols = lines[0].split("\t")
    assert code == 0 and cols[0] in {"negative", "positive"} and 0 < float(cols[1]) <= 1 and cols[2] == "-"
    read = [line for line in lines[1:] if line.startswith("  read: ")]
    assert 1 <= len(read) <= 2 and all("Sentiment:" in line for line in read)  # the bank's demonstrations
    code, _, err = run("classify", "--bank", "demos", "--text", "x", "--classifier", "nope", model=True)
    assert code == 2 and "no classifier 'nope'" in err
    code, _, err = run("classify", "--bank", "demos", "--text", "x", "--classifier", "nope", "--method", "in-context",
                       model=True)
    assert code == 2 and "--classifier names a saved classifier for --method head" in err
    with BankDirectory(run.banks).open("demos") as bank:  # a classifier saved as the Classify tab saves one
        examples = [{"text": f"a fine bright film {i}" if i % 2 else f"a dull grey film {i}",
                     "label": "positive" if i % 2 else "negative"} for i in range(12)]
        bank.save_classifier("mood", {"spec": {"name": "mood", "template": "Review: {text} Sentiment: {label}",
                                               "labels": ["negative", "positive"]}, "memory_examples": examples})
    code, out, err = run("classify", "--bank", "demos", "--text", "a fine bright film", "--classifier", "mood",
                         model=True)
    assert code == 0 and "head fitted on 12 examples" in err and out.startswith("positive\t")
    code, _, err = run("classify", "--bank", "demos", "--text", "x", "--shots", "-1", model=True)
    assert code == 2 and "shots must be >= 0" in err
    code, out, err = run("generate", "--bank", "demos", "--prompt", "a fine", "--max-new-tokens", "5",
                         "--temperature", "0", model=True)
    assert code == 0 and "tokens in memory" in err and out.strip()


def test_classifier_scores_every_label_and_reads_the_bank_template(tmp_path, files):
    model = LongMemModel(tiny_llama(), small_config(segment_len=32))
    directory = BankDirectory(tmp_path / "banks")
    from longmem.ingest.pipeline import ingest
    from longmem.ingest.readers import DemoFormat

    with directory.create("d", model) as bank:
        ingest(bank, model, files[1], demos=DemoFormat(template="{text} => {label}",
                                                       label_words={"0": "no", "1": "yes"}))
        clf = Classifier.from_documents(model, bank.load_memory(), bank.documents())
    assert (clf.template, clf.labels) == ("{text} => {label}", ["no", "yes"])
    scores = clf.scores("a fine bright film")
    tok = model.backbone.tokenizer
    expect = model.score(tok("a fine bright film =>").input_ids, tok(" yes").input_ids, clf.memory)
    assert set(scores) == {"no", "yes"} and scores["yes"] == pytest.approx(expect)
    assert clf.predict("a fine bright film") == max(scores, key=scores.get)
    with pytest.raises(ValueError, match="no demonstrations"):
        Classifier.from_documents(model, None, [])


def test_chat_reads_and_cites_the_passages_of_a_file_or_a_bank(tmp_path, chat_checkpoint, capsys):
    book = tmp_path / "story.txt"
    book.write_text(story())
    question = "What drifted over the harbour? A zeppelin?"
    common = ["--ask", question, "--checkpoint", chat_checkpoint, "--temperature", "0", "--max-new-tokens", "4",
              "--banks-dir", str(tmp_path / "banks")]
    assert main(["chat", "--file", str(book), "--finder", "lexical", *common]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"> {question}\n")
    cited = [line for line in out.splitlines() if line.startswith("  [")]
    assert 1 <= len(cited) <= 4 and "zeppelin" in cited[-1]  # the best passage is read last, nearest the question
    assert cited[-1].startswith(f"  [{len(cited)}] story, Chapter II, ")
    assert main(["bank", "ingest", "lib", str(book), "--create", "--checkpoint", chat_checkpoint,
                 "--banks-dir", str(tmp_path / "banks")]) == 0
    capsys.readouterr()
    assert main(["chat", "--bank", "lib", "--reading", "none", *common]) == 0  # the paper's fusion: nothing read
    assert "  [1]" not in capsys.readouterr().out
    assert main(["chat", "--bank", "lib", "--file", str(book), *common]) == 2
    assert "give --file or --bank, not both" in capsys.readouterr().err


def test_ctrl_c_ends_an_extraction_at_once(tmp_path, checkpoint):
    """Ctrl-C while a file's text is being extracted: the CLI stops within a second or two, its extraction child
    with it, and nothing is left behind."""
    import psutil

    slow = slow_pdf(tmp_path / "slow.pdf")  # ~30 s of pypdf work
    banks = tmp_path / "banks"
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(root), os.environ.get("PYTHONPATH")))),
           "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "longmem", "bank", "ingest", "lib", str(slow), "--create",
                             "--checkpoint", checkpoint, "--banks-dir", str(banks)], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # a terminal's Ctrl-C, even where the tests run as a background job of a non-interactive
                            # shell, which starts them (and would start the CLI) with SIGINT ignored
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not extraction_children(psutil.Process(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    [child] = extraction_children(psutil.Process(proc.pid))
    t0 = time.perf_counter()
    proc.send_signal(signal.SIGINT)  # what Ctrl-C sends to the foreground program
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "interrupted" in err and time.perf_counter() - t0 < 5, err[-2000:]
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    assert not BankDirectory(banks).exists("lib")  # the file is read before the bank is made
    assert not list(tmp_path.glob("longmem-text-*"))  # no extracted text left behind
