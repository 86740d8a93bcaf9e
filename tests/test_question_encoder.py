"""The question encoder (``longmem.model.question_encoder``) and its training (``training/finder.py``): untrained it
encodes as the stock embedder; a checkpoint round-trips and is refused over other base weights or when malformed;
training on a handful of questions brings them nearer their own passages than BM25's near misses."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import story

from longmem.model.embedder import Embedder, default_model_dir
from longmem.model.question_encoder import (
    CONFIG_FILE,
    QuestionEncoder,
    QuestionEncoderError,
    factors,
    weights_sha256,
    with_factors,
)

QUESTIONS = ["Who found Wilson's body in the grass?", "What did the miller carry to the bridge before dawn?"]


@pytest.fixture(scope="module")
def stock() -> Embedder:
    return Embedder.load()


def config(rank: int = 4) -> dict:
    return {"base": "all-MiniLM-L6-v2", "base_sha256": weights_sha256(default_model_dir()), "rank": rank,
            "max_length": 64}


def test_untrained_factors_encode_as_the_stock_embedder(stock):
    q = with_factors(stock, rank=4)
    assert np.allclose(q.encode(QUESTIONS), stock.encode(QUESTIONS), atol=1e-5)
    assert len(factors(q.model)) == 2 * 6 * 6  # A and B on the 6 projections of each of the 6 layers
    assert not factors(stock.model)  # the stock embedder is not changed


def perturbed(stock: Embedder, rank: int = 4) -> Embedder:
    q = with_factors(stock, rank)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in q.model.named_parameters():
            if name.endswith("lora_b"):
                p.normal_(0, 0.05)
    q.model.eval()
    return q


def test_a_checkpoint_round_trips(stock, tmp_path):
    q = perturbed(stock)
    enc = QuestionEncoder(q, config())
    enc.save(tmp_path / "enc", provenance={"trained_on": 2})
    again = QuestionEncoder.load(tmp_path / "enc", stock)
    assert again.config["provenance"] == {"trained_on": 2} and again.dim == 384
    assert np.allclose(again.encode(QUESTIONS), enc.encode(QUESTIONS), atol=1e-6)
    assert not np.allclose(again.encode(QUESTIONS), stock.encode(QUESTIONS), atol=1e-3)  # the factors count
    assert sorted(p.name for p in (tmp_path / "enc").iterdir()) == ["adapter.safetensors", "config.json"]


def test_a_checkpoint_over_other_weights_or_malformed_is_refused(stock, tmp_path):
    folder = tmp_path / "enc"
    QuestionEncoder(perturbed(stock), config()).save(folder)
    good = json.loads((folder / CONFIG_FILE).read_text())
    (folder / CONFIG_FILE).write_text(json.dumps({**good, "base_sha256": "0" * 64}))
    with pytest.raises(QuestionEncoderError, match="trained over other base weights"):
        QuestionEncoder.load(folder, stock)
    (folder / CONFIG_FILE).write_text(json.dumps({**good, "rank": 8}))
    with pytest.raises(QuestionEncoderError, match="do not fit a rank-8 encoder"):
        QuestionEncoder.load(folder, stock)
    (folder / CONFIG_FILE).write_text("{not json")
    with pytest.raises(QuestionEncoderError, match="not a question-encoder config"):
        QuestionEncoder.load(folder, stock)
    with pytest.raises(QuestionEncoderError, match="not a question-encoder checkpoint"):
        QuestionEncoder.load(tmp_path / "nothing", stock)
    with pytest.raises(ValueError, match="rank must be >= 1"):
        with_factors(stock, 0)


@pytest.mark.heavy
def test_training_brings_questions_nearer_their_passages(tmp_path):
    """A few questions about a book whose passages all share their words: trained on them, the questions rank their
    own passages higher among themselves and their hard negatives than the stock embedder does (the loss falls; the
    checkpoint loads)."""
    from dataclasses import asdict

    import training.finder as finder
    from training.questions import FinderQuestion, book_passages

    data = tmp_path / "data"
    (data / "books").mkdir(parents=True)
    (data / "books" / "tale.txt").write_text(story(chapters=3, paragraphs=10, seed=3))
    spans = book_passages((data / "books" / "tale.txt").read_text())
    def asked(text: str) -> str:  # a sentence of the passage, its words backwards: the passage's words, not its order
        return " ".join(text.split(". ")[1].split()[::-1]) + "?"

    rows = [FinderQuestion("tale.txt", s[0], s[1], asked(s[2]), "x", "w", "id") for s in spans[:12]]
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps(asdict(r)) + "\n" for r in rows))
    out = tmp_path / "run"
    assert finder.main(["--questions", str(path), "--out", str(out), "--data", str(data), "--epochs", "12",
                        "--batch", "4", "--lr", "2e-3", "--val-books", "0", "--hard", "4"]) == 0
    log = [json.loads(line)["loss"] for line in (out / "log.jsonl").read_text().splitlines()]
    assert np.mean(log[-3:]) < np.mean(log[:3])
    enc = QuestionEncoder.load(out / "encoder")
    assert enc.config["provenance"]["trained_on"] == 12
    examples, texts = finder.examples_of(rows, data, 4)
    vectors = finder.passage_vectors(Embedder.load(), texts, out)
    stock_ranks = finder.ranks(QuestionEncoder(with_factors(Embedder.load(), 8), config(8)), examples, vectors)
    assert np.mean(finder.ranks(enc, examples, vectors)) < np.mean(stock_ranks)
