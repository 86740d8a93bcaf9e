"""``tasks.head``: the classifier head fitted on a bank's examples (the backbone's state at the prompt's end and a
sentence embedding, read by a cross-validated logistic regression), its figures, how it is stored with the bank
and reused, and how it is fitted again when examples are added."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_readout import blobs
from tiny import small_config, tiny_backbone

from longmem.model.baselines import BackboneLM
from longmem.model.longmem import LongMemModel
from longmem.storage import BankDirectory
from longmem.tasks.examples import Example
from longmem.tasks.head import (
    BANK_CLASSIFIER,
    Featurizer,
    Head,
    HeadError,
    bank_head,
    example_features,
    fit_head,
    head_examples,
    head_for,
    head_problem,
    label_suspects,
    text_key,
    unsure_threshold,
)

TEMPLATE = "Review: {text} Sentiment: {label}"


def fake_embed(texts: list[str]) -> np.ndarray:
    """A stand-in sentence embedder (the real one is outside the fast tests): which mood words a text has."""
    return np.array([[t.count("fine"), t.count("dull"), len(t) / 10] for t in texts], dtype=np.float32)


def reviews(n: int = 40) -> list[Example]:
    return [Example(f"a fine warm film {i}", "positive") if i % 2 else Example(f"a dull cold film {i}", "negative")
            for i in range(n)]


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_batched_states_are_each_texts_own_state(family, dtype):
    """Texts of different lengths, right-padded in one batch, give the state a text alone gives at its last
    prompt token (causal attention never reads the padding after it)."""
    bb = tiny_backbone(family, dtype)
    model = LongMemModel(bb, small_config(segment_len=64))
    texts = ["ok", "a much longer review of a film that goes on", "mid length text"]
    batched = Featurizer(model, TEMPLATE, None, ("state",), batch=8).states(texts)
    alone = Featurizer(model, TEMPLATE, None, ("state",), batch=1).states(texts)
    lm = BackboneLM(bb, 64)
    for i, t in enumerate(texts):
        ids = torch.tensor([Featurizer(model, TEMPLATE, None, ("state",)).prompt_ids(t)])
        ref = lm.step(ids, None).hidden[0, -1].float()  # the backbone's own last state, as the reader sees it
        tol = 1e-5 if dtype == torch.float32 else 0.05 * ref.abs().max().item()
        assert torch.allclose(alone[i], ref, atol=tol)
        assert torch.allclose(batched[i], alone[i], atol=tol)
    assert batched.dtype == torch.float32 and batched.shape == (3, bb.spec.hidden)


def test_features_stack_embeddings_then_state_and_refuse_what_they_cannot_read():
    model = LongMemModel(tiny_backbone("llama"), small_config(segment_len=64))
    f = Featurizer(model, TEMPLATE, fake_embed)
    x = f(["a fine film", "a dull film"])
    assert x.shape == (2, 3 + model.backbone.spec.hidden)
    assert torch.equal(x[:, :3], torch.from_numpy(fake_embed(["a fine film", "a dull film"])))
    assert f.signature()["features"] == ["embeddings", "state"]
    assert f.signature()["backbone_sha256"] == model.backbone.fingerprint()
    with pytest.raises(HeadError, match="empty"):
        f(["fine", "  "])
    with pytest.raises(HeadError, match="no sentence embedder"):
        Featurizer(model, TEMPLATE, None)
    with pytest.raises(HeadError, match="unknown head features"):
        Featurizer(model, TEMPLATE, fake_embed, ("colour",))
    with pytest.raises(HeadError, match="needs {text} before {label}"):
        Featurizer(model, "{label}: {text}", fake_embed)
    long = "word " * 200  # longer than the 64-token window: its end is read
    assert len(f.prompt_ids(long)) == 64 and f(["a fine film", long]).shape[0] == 2


def test_a_head_reports_cross_validated_figures_and_finds_flipped_labels():
    ys = ["abc"[i % 3] for i in range(150)]
    x = torch.randn(150, 5, generator=torch.Generator().manual_seed(0))
    x[:, :3] += 6 * torch.nn.functional.one_hot(torch.tensor([i % 3 for i in range(150)]), 3)  # far apart
    flipped = [3, 40, 77]
    noisy = list(ys)
    for i in flipped:
        noisy[i] = "b" if ys[i] != "b" else "c"
    head = fit_head(x.float(), noisy, ["a", "b", "c"], {"features": ["test"]}, [str(i) for i in range(150)])
    s = head.summary()
    assert s["examples"] == 150 and 0.85 <= s["cv_accuracy"] <= 1.0
    assert s["cv_interval"][0] < s["cv_accuracy"] < s["cv_interval"][1]
    # the out-of-fold predictions are those of heads that never saw the example: the flipped ones are doubted
    assert {d["index"] for d in head.suspects} >= set(flipped)
    assert all(d["predicted"] != d["label"] and d["p_predicted"] > d["p_label"] for d in head.suspects)
    assert [d["p_label"] for d in head.suspects] == sorted(d["p_label"] for d in head.suspects)
    cv = head.cross_validated()
    assert sum(cv.confusion[i][i] for i in range(3)) == round(cv.accuracy * 150)
    rows = head.rows(x[:2].float(), ["one", "two"])
    assert [r["text"] for r in rows] == ["one", "two"]
    assert all(abs(sum(r[f"prob_{w}"] for w in "abc") - 1) < 1e-9 and r["confidence"] == max(
        r[f"prob_{w}"] for w in "abc") for r in rows)
    assert all(r["unsure"] == (r["confidence"] < head.unsure_below) for r in rows)


def test_the_unsure_threshold_keeps_the_sure_answers_right_often_enough():
    tied = torch.tensor([0.9, 0.9, 0.9, 0.6])  # the first two right, the third (tied) wrong
    assert unsure_threshold(tied, torch.tensor([True, True, False, True]), target=0.9, min_sure=1) > 1.0
    assert unsure_threshold(torch.tensor([]), torch.tensor([], dtype=torch.bool)) == 0.5
    conf = torch.tensor([0.99, 0.95, 0.9, 0.8, 0.7, 0.6, 0.55, 0.52])
    right = torch.tensor([True, True, True, True, False, True, False, False])
    assert unsure_threshold(conf, right, target=0.8, min_sure=2) == pytest.approx(0.6)  # 5 of the top 6 right
    assert unsure_threshold(conf, right, target=1.0, min_sure=2) == pytest.approx(0.8)
    assert unsure_threshold(conf, right, target=0.8, min_sure=7) > 0.99  # never over 7 examples: all unsure
    assert unsure_threshold(conf, torch.zeros(8, dtype=torch.bool), target=0.5, min_sure=1) > 1.0


def test_suspects_follow_per_label_thresholds():
    oof = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.2, 0.8], [0.2, 0.8]], dtype=torch.float64)
    truths = ["a", "a", "b", "b", "a"]  # the last one reads like a "b"
    out = label_suspects(oof, truths, ["a", "b"])
    assert [(d["index"], d["predicted"]) for d in out] == [(4, "b")]
    assert label_suspects(oof, truths, ["a", "b"], keep=0) == []


def test_a_head_is_refused_on_one_label_and_checks_its_inputs():
    assert head_problem(["x", "x"]) and head_problem([]) and head_problem(["x", "y"]) is None
    assert "10,000 distinct labels" in head_problem([str(i) for i in range(10_000)])
    many = reviews(30)
    assert head_examples(many, limit=100) == many
    few = head_examples(many, seed=1, limit=10)
    assert len(few) == 10 and few == [e for e in many if e in few]  # a sample, in the examples' order
    x = torch.zeros(4, 2)
    with pytest.raises(HeadError, match="at least two labels"):
        fit_head(x, ["a"] * 4, ["a", "b"], {}, list("wxyz"))
    with pytest.raises(HeadError, match="not among the classifier's labels"):
        fit_head(x, ["a", "b", "c", "a"], ["a", "b"], {}, list("wxyz"))
    with pytest.raises(HeadError, match="keys"):
        fit_head(x, ["a", "b", "a", "b"], ["a", "b"], {}, ["w"])


def test_a_head_survives_its_bytes_and_a_bad_blob_is_refused():
    x, ys = blobs(60)
    head = fit_head(x.float(), ys, ["a", "b", "c"], {"features": ["test"]}, [str(i) for i in range(60)])
    again = Head.from_bytes(head.to_bytes({"note": "test"}))
    assert again.labels == head.labels and again.unsure_below == head.unsure_below
    assert again.suspects == head.suspects and again.keys == head.keys and again.truths == head.truths
    assert torch.equal(again.readout.probs(x), head.readout.probs(x))
    assert torch.equal(again.x, head.x)
    with pytest.raises(HeadError, match="could not be read"):
        Head.from_bytes(b"not a safetensors file")


class Counting:
    """A featurizer stand-in that counts the texts it computes (the head must reuse the others)."""

    def __init__(self, inner: Featurizer):
        self.inner, self.computed = inner, []

    def signature(self) -> dict:
        return self.inner.signature()

    def __call__(self, texts, progress=None):
        self.computed += list(texts)
        return self.inner(texts, progress)


def test_a_stored_head_is_reused_and_fitted_again_on_added_examples(tmp_path):
    model = LongMemModel(tiny_backbone("llama"), small_config(segment_len=64))
    with BankDirectory(tmp_path / "banks").create("b", model) as bank:
        bank.save_classifier("mood", {"spec": {"name": "mood", "template": TEMPLATE, "labels": ["negative",
                                                                                                 "positive"]}})
        f = Counting(Featurizer(model, TEMPLATE, fake_embed))
        first = reviews(30)
        head, fitted = head_for(bank, "mood", f, first, ["negative", "positive"])
        assert fitted and f.computed == [e.text for e in first]
        assert head.summary()["cv_accuracy"] == 1.0  # the mood words tell them apart
        f.computed.clear()
        again, fitted = head_for(bank, "mood", f, first, ["negative", "positive"])
        assert not fitted and f.computed == [] and again.keys == head.keys  # stored and current: not fitted again
        more = first + [Example("a fine bright film 99", "positive"), Example("a dull grey film 98", "negative")]
        grown, _ = head_for(bank, "mood", f, more, ["negative", "positive"])
        assert f.computed == ["a fine bright film 99", "a dull grey film 98"]  # only the added examples
        assert grown.keys == [text_key(e.text) for e in more]
        relabelled = [Example(e.text, "positive" if e.label == "negative" else "negative") for e in more]
        f.computed.clear()
        flipped, fitted = head_for(bank, "mood", f, relabelled, ["negative", "positive"])
        assert fitted and f.computed == [] and flipped.truths == [e.label for e in relabelled]  # features reused
        assert Head.from_bytes(bank.classifier_head("mood")).truths == flipped.truths
        f.computed.clear()
        other = Counting(Featurizer(model, "Text: {text} Mood: {label}", fake_embed))  # another template
        head_for(bank, "mood", other, more, ["negative", "positive"])
        assert other.computed == [e.text for e in more]  # features made under another prompt are not reused
        x, keys = example_features(f.inner, [], None)
        assert keys == [] and x.shape[0] == 0


def test_a_banks_demonstrations_make_its_head(tmp_path):
    from longmem.ingest.pipeline import ingest
    from longmem.ingest.readers import DemoFormat

    model = LongMemModel(tiny_backbone("llama"), small_config(segment_len=64))
    demos = tmp_path / "demos.csv"
    demos.write_text("text,label\n" + "".join(f"{e.text},{e.label}\n" for e in reviews(24)))
    fmt = DemoFormat(template=TEMPLATE)
    with BankDirectory(tmp_path / "banks").create("b", model) as bank:
        ingest(bank, model, demos, demos=fmt)
        head, featurizer, fitted = bank_head(bank, model, fake_embed)
        assert fitted and not bank_head(bank, model, fake_embed)[2]  # stored: not fitted again
        assert head.truths == [e.label for e in reviews(24)] and set(head.labels) == {"negative", "positive"}
        assert BANK_CLASSIFIER in bank.classifiers() and bank.classifier_head(BANK_CLASSIFIER) is not None
        [row] = head.rows(featurizer(["a fine warm film 7"]), ["a fine warm film 7"])
        assert row["prediction"] == "positive"
        with pytest.raises(HeadError, match="no classifier 'nope'"):
            bank_head(bank, model, fake_embed, "nope")
