"""``tasks.readout``: a multinomial logistic regression fitted on labelled features, its out-of-fold probabilities
(never from a model that saw the example) and its penalty chosen by cross-validation."""

from __future__ import annotations

import pytest
import torch

from longmem.tasks.readout import choose_l2, cross_fit, fit, fit_cv, folds_of


def blobs(n: int = 90, f: int = 6, seed: int = 0, labels=("a", "b", "c")) -> tuple[torch.Tensor, list[str]]:
    """``n`` points in ``f`` dimensions around one centre per label (the first two dimensions), the rest noise."""
    g = torch.Generator().manual_seed(seed)
    ys = [labels[i % len(labels)] for i in range(n)]
    centres = {y: torch.tensor([3.0 * (i == 1) - 1.5 * (i == 2), 3.0 * (i == 0)]) for i, y in enumerate(labels)}
    x = torch.randn(n, f, generator=g, dtype=torch.float64)
    x[:, :2] += torch.stack([centres[y] for y in ys]).double()
    return x, ys


def test_a_readout_learns_separable_labels_and_gives_probabilities():
    x, ys = blobs()
    r = fit(x, ys)
    assert r.labels == ("a", "b", "c")
    p = r.probs(x)
    assert p.shape == (90, 3) and torch.allclose(p.sum(-1), torch.ones(90, dtype=torch.float64))
    assert sum(a == b for a, b in zip(r.predict(x), ys)) >= 85
    test, ty = blobs(seed=1)
    assert sum(a == b for a, b in zip(r.predict(test), ty)) >= 80  # not memorised: new points of the same blobs


def test_a_larger_penalty_gives_smaller_weights():
    x, ys = blobs()
    assert fit(x, ys, l2=100.0).weight.norm() < fit(x, ys, l2=0.1).weight.norm()


def test_out_of_fold_probabilities_never_read_their_own_label():
    x, ys = blobs(60)
    p = cross_fit(x, ys, seed=3)
    fold = folds_of(60, seed=3)[0]
    flipped = [("a" if y != "a" else "b") if i in fold else y for i, y in enumerate(ys)]
    q = cross_fit(x, flipped, seed=3, classes=("a", "b", "c"))
    assert torch.allclose(p[fold], q[fold])  # that fold's predictions come from the other folds only
    assert not torch.allclose(p, q)


def test_folds_keep_a_group_together_and_cover_every_example():
    folds = folds_of(10, folds=3, seed=0, groups=[0, 0, 1, 1, 2, 2, 3, 3, 4, 4])
    assert sorted(i for f in folds for i in f) == list(range(10))
    for f in folds:
        assert all((i ^ 1) in f for i in f)  # 2k and 2k + 1 share a group


def test_the_penalty_chosen_is_larger_when_the_features_are_noise():
    x, ys = blobs(60, f=40)
    noise = torch.randn(60, 40, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    assert choose_l2(noise, ys) > choose_l2(x, ys)
    assert fit_cv(x, ys).l2 == choose_l2(x, ys)


def test_bad_input_is_refused_clearly():
    x, ys = blobs(30)
    with pytest.raises(ValueError, match="two labels"):
        fit(x, ["a"] * 30)
    with pytest.raises(ValueError, match="for 29 labels"):
        fit(x, ys[:29])
    with pytest.raises(ValueError, match="not among the classes"):
        fit(x, ys, classes=("a", "b"))
    with pytest.raises(ValueError, match="takes"):
        fit(x, ys).probs(x[:, :3])


def test_a_readout_is_fitted_under_inference_mode_too():
    x, ys = blobs(30)
    with torch.inference_mode():
        r = fit(x.clone(), ys)
    assert torch.allclose(r.weight, fit(x, ys).weight)


def test_a_few_examples_whose_other_folds_hold_one_label_still_get_a_penalty_and_a_readout():
    x, _ = blobs(6)
    ys = ["a", "b", "b", "b", "b", "b"]  # the fold holding "a" leaves only "b" to fit on
    p = cross_fit(x, ys, folds=6)
    assert torch.allclose(p.sum(-1), torch.ones(6, dtype=torch.float64)) and p[0, 1] == 1.0
    assert fit_cv(x, ys).labels == ("a", "b")


def test_a_paired_gap_is_the_mean_difference_over_the_same_items_with_its_interval():
    from longmem.tasks.measure import paired_gap

    mean, half, n = paired_gap([True, True, False, True], [True, False, False, False])
    assert (mean, n) == (50.0, 4) and half > 0  # two of four items won, none lost
    assert paired_gap([True] * 3, [True] * 3) == (0.0, 0.0, 3)
    with pytest.raises(ValueError, match="same items"):
        paired_gap([True], [True, False])
