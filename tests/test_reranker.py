"""The passage reranker (``longmem.model.reranker``) and its training (``training/reranker.py``): an untrained one is
the same for a seed; a pair's score does not depend on its batch; a checkpoint round-trips and is refused over other
base weights or when malformed; training on a handful of questions puts their passages above BM25's near misses."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import story

from longmem.model.embedder import Embedder
from longmem.model.reranker import ADAPTER_FILE, CONFIG_FILE, Reranker, RerankerError

QUESTION = "Who found Wilson's body in the grass?"
PASSAGES = ["The gardener saw the body lying in the grass by the pool, and ran to the house.",
            "The miller carried his sacks to the bridge before dawn.",
            "It rained all week; nobody went out."]


@pytest.fixture(scope="module")
def stock() -> Embedder:
    return Embedder.load()


def perturbed(stock: Embedder, seed: int = 0, rank: int = 4) -> Reranker:
    """A reranker whose factors are not zero (as if trained), in eval mode."""
    r = Reranker.new(stock, rank, seed=seed, max_length=64)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in r.named_parameters():
            if name.endswith("lora_b"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return r.eval()


def test_an_untrained_reranker_is_the_same_for_a_seed_and_leaves_the_embedder_alone(stock):
    before = stock.encode(PASSAGES[:1])
    a, b = Reranker.new(stock, 4, seed=1).eval(), Reranker.new(stock, 4, seed=1).eval()
    assert np.array_equal(a.score(QUESTION, PASSAGES), b.score(QUESTION, PASSAGES))
    c = Reranker.new(stock, 4, seed=2).eval()
    assert not np.allclose(a.score(QUESTION, PASSAGES), c.score(QUESTION, PASSAGES))  # the head's seed counts
    assert np.array_equal(stock.encode(PASSAGES[:1]), before)
    learns = {n for n, p in a.named_parameters() if p.requires_grad}
    assert learns and all("lora_" in n or n.startswith("head.") or "token_type" in n for n in learns)
    assert len([n for n in learns if "lora_" in n]) == 2 * 6 * 6  # A and B on 6 projections of 6 layers


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pairs_score_does_not_depend_on_its_batch(stock, dtype):
    r = perturbed(stock)
    alone = np.array([r.score(QUESTION, [p], dtype=dtype)[0] for p in PASSAGES])
    together = r.score(QUESTION, PASSAGES, dtype=dtype)
    assert together.dtype == np.float32 and together.shape == (3,)
    tol = 1e-5 if dtype == torch.float32 else 0.05
    assert np.allclose(alone, together, atol=tol)
    assert np.allclose(r.score(QUESTION, PASSAGES, batch_size=2, dtype=dtype), together, atol=tol)
    if dtype == torch.bfloat16:  # bfloat16 scores are float32's rounded, not other scores
        assert np.allclose(together, r.score(QUESTION, PASSAGES), atol=0.05)


def test_scoring_refuses_training_mode_and_one_string(stock):
    r = Reranker.new(stock, 4)
    with pytest.raises(RuntimeError, match="training mode"):
        r.score(QUESTION, PASSAGES)
    with pytest.raises(TypeError, match="list of passages"):
        r.eval().score(QUESTION, PASSAGES[0])
    assert r.score(QUESTION, []).shape == (0,)
    with pytest.raises(ValueError, match="rank must be >= 1"):
        Reranker.new(stock, 0)
    with pytest.raises(ValueError, match="max_length must be in"):
        Reranker.new(stock, 4, max_length=4)


def test_a_checkpoint_round_trips(stock, tmp_path):
    r = perturbed(stock)
    r.save(tmp_path / "rr", provenance={"trained_on": 2})
    again = Reranker.load(tmp_path / "rr", stock)
    assert again.config["provenance"] == {"trained_on": 2} and not again.training
    assert again.max_length == 64 and not any(p.requires_grad for p in again.parameters())
    assert np.allclose(again.score(QUESTION, PASSAGES), r.score(QUESTION, PASSAGES), atol=1e-6)
    untrained = Reranker.new(stock, 4, max_length=64).eval()
    untrained.head.load_state_dict(r.head.state_dict())
    assert not np.allclose(again.score(QUESTION, PASSAGES), untrained.score(QUESTION, PASSAGES), atol=1e-3)
    assert sorted(p.name for p in (tmp_path / "rr").iterdir()) == [ADAPTER_FILE, CONFIG_FILE]


def test_a_checkpoint_over_other_weights_or_malformed_is_refused(stock, tmp_path):
    folder = tmp_path / "rr"
    perturbed(stock).save(folder)
    good = json.loads((folder / CONFIG_FILE).read_text())
    (folder / CONFIG_FILE).write_text(json.dumps({**good, "base_sha256": "0" * 64}))
    with pytest.raises(RerankerError, match="trained over other base weights"):
        Reranker.load(folder, stock)
    (folder / CONFIG_FILE).write_text(json.dumps({**good, "rank": 8}))
    with pytest.raises(RerankerError, match="do not fit a rank-8 reranker"):
        Reranker.load(folder, stock)
    (folder / CONFIG_FILE).write_text("{not json")
    with pytest.raises(RerankerError, match="not a reranker config"):
        Reranker.load(folder, stock)
    with pytest.raises(RerankerError, match="not a reranker checkpoint"):
        Reranker.load(tmp_path / "nothing", stock)


def test_examples_tie_team_questions_to_the_passages_holding_their_evidence(tmp_path):
    """A team question's gold passages are those its evidence overlaps, short ones too; its hard negatives are BM25's
    best others; a finder question's gold is its own passage."""
    from longmem.eval.natural import Question
    from longmem.text.passages import cut_passages
    from training.questions import FinderQuestion, book_passages
    from training.reranker import examples_of

    data = tmp_path / "data"
    (data / "books").mkdir(parents=True)
    text = story(chapters=3, paragraphs=10, seed=3)
    (data / "books" / "tale.txt").write_text(text)
    spans = cut_passages(text)
    target = spans[5]
    evidence = text[target.start + 5: target.start + 60]
    def asked(passage: str) -> str:  # the passage's first words: BM25 finds it and its near misses
        return " ".join(passage.split()[:8]) + "?"

    team = {"t": [Question("tale.txt", asked(target.text), ["x"], evidence),
                  Question("tale.txt", "Unanswered?", [], "")]}
    mine = book_passages(text)[2]
    finder = [FinderQuestion("tale.txt", mine[0], mine[1], asked(mine[2]), "x", "w", "id")]
    got = examples_of(finder, team, data, hard=4)
    assert [e.source for e in got] == ["finder", "t"]  # the unanswerable question is not an example
    assert got[0].gold == [mine[2]] and got[1].gold == [target.text]
    for e in got:
        assert len(e.negatives) == 4 and not set(e.negatives) & set(e.gold)
        assert 1 <= e.bm25_rank <= 5
    bad = {"t": [Question("tale.txt", "Where?", ["x"], "words the tale does not hold")]}
    with pytest.raises(ValueError, match="in no passage"):
        examples_of([], bad, data, hard=4)


@pytest.mark.heavy
def test_training_puts_questions_passages_above_their_near_misses(tmp_path):
    """A few questions about a book whose passages share their words: trained on them, the reranker ranks their own
    passages among their hard negatives better than it did untrained (the loss falls; the checkpoint loads)."""
    from dataclasses import asdict

    import training.reranker as trainer
    from training.questions import FinderQuestion, book_passages

    data = tmp_path / "data"
    (data / "books").mkdir(parents=True)
    (data / "books" / "tale.txt").write_text(story(chapters=3, paragraphs=10, seed=3))
    spans = book_passages((data / "books" / "tale.txt").read_text())

    def asked(text: str) -> str:  # a sentence of the passage, its words backwards
        return " ".join(text.split(". ")[1].split()[::-1]) + "?"

    rows = [FinderQuestion("tale.txt", s[0], s[1], asked(s[2]), "x", "w", "id") for s in spans[:12]]
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps(asdict(r)) + "\n" for r in rows))
    out = tmp_path / "run"
    assert trainer.main(["--questions", str(path), "--out", str(out), "--data", str(data), "--epochs", "6",
                         "--batch", "4", "--lr", "2e-3", "--val-books", "0", "--hard", "4", "--negatives", "3",
                         "--rank", "4", "--max-length", "128"]) == 0
    log = [json.loads(line)["loss"] for line in (out / "log.jsonl").read_text().splitlines()]
    assert np.mean(log[-3:]) < np.mean(log[:3])
    trained = Reranker.load(out / "reranker")
    assert trained.config["provenance"]["trained_on"] == 12
    examples = trainer.examples_of(rows, {}, data, 4)
    untrained = Reranker.new(Embedder.load(), 4, max_length=128).eval()
    assert (np.mean([trainer.rank_of_gold(trained, e) for e in examples])
            < np.mean([trainer.rank_of_gold(untrained, e) for e in examples]))
