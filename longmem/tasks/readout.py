"""A linear readout fitted on labelled feature vectors: multinomial logistic regression in a few lines of torch.

What a user who has labelled examples fits on their features (sentence embeddings, a model's hidden states, label
log-probabilities): standardised features, softmax over the labels, an L2 penalty chosen by cross-validation on the
examples themselves (``choose_l2``, by out-of-fold log-likelihood), like scikit-learn's
``LogisticRegressionCV``. Used as the classifier
suite's anchor (``eval.icl``: embeddings + logistic regression) and for heads fitted on demonstrations.

The penalty is per example: the loss is the mean cross-entropy plus ``l2 * |W|^2 / (2 N)``, so ``l2`` is
scikit-learn's ``1 / C``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Sequence

import torch

L2_GRID = (0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0)  # ``choose_l2``'s penalties (1 / C)
FOLDS = 5  # cross-validation folds of ``choose_l2`` and ``cross_fit``


@dataclass(frozen=True)
class Readout:
    """A fitted multinomial logistic regression: standardise, then one linear layer, then softmax over ``labels``."""

    labels: tuple[str, ...]  # the classes, in the order of the weight's rows
    mean: torch.Tensor  # (F,) the training features' mean
    std: torch.Tensor  # (F,) their standard deviation (a constant feature: 1)
    weight: torch.Tensor  # (C, F)
    bias: torch.Tensor  # (C,)
    l2: float  # the penalty it was fitted with

    def probs(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C) float64 probabilities of each label for features ``x`` (N, F)."""
        x = torch.as_tensor(x, dtype=torch.float64)
        if x.dim() != 2 or x.shape[1] != self.mean.shape[0]:
            raise ValueError(f"features of shape {tuple(x.shape)}; this readout takes (N, {self.mean.shape[0]})")
        return torch.softmax((x - self.mean) / self.std @ self.weight.T + self.bias, dim=-1)

    def predict(self, x: torch.Tensor) -> list[str]:
        """The likeliest label of each row of ``x`` (N, F)."""
        return [self.labels[i] for i in self.probs(x).argmax(-1).tolist()]


def _targets(labels: Sequence[str], classes: Sequence[str] | None) -> tuple[tuple[str, ...], torch.Tensor]:
    classes = tuple(classes) if classes is not None else tuple(sorted(set(labels)))
    index = {c: i for i, c in enumerate(classes)}
    unknown = sorted(set(labels) - set(index))
    if unknown:
        raise ValueError(f"labels {unknown[:5]} are not among the classes {list(classes)[:10]}")
    return classes, torch.tensor([index[y] for y in labels], dtype=torch.long)


def fit(x: torch.Tensor, labels: Sequence[str], l2: float = 1.0, classes: Sequence[str] | None = None) -> Readout:
    """A readout fitted on features ``x`` (N, F) and their ``labels`` (N,) with penalty ``l2`` (by L-BFGS, float64).
    ``classes``: the labels it may give, in order (default: those seen, sorted); at least two must be seen."""
    x = torch.as_tensor(x, dtype=torch.float64)
    if x.dim() != 2 or x.shape[0] != len(labels):
        raise ValueError(f"features of shape {tuple(x.shape)} for {len(labels)} labels")
    if l2 <= 0:
        raise ValueError(f"l2 must be > 0, got {l2}")
    classes, y = _targets(labels, classes)
    if len(set(y.tolist())) < 2:
        raise ValueError("a readout needs examples of at least two labels")
    with torch.inference_mode(False), torch.enable_grad():  # callers may run under inference mode
        x, y = x.clone(), y.clone()  # tensors autograd may save, whatever mode made them
        mean = x.mean(0)
        std = x.std(0) if len(x) > 1 else torch.ones(x.shape[1], dtype=torch.float64)
        std = torch.where(std > 1e-12, std, torch.ones_like(std))
        z = (x - mean) / std  # (N, F)
        w = torch.zeros(len(classes), x.shape[1], dtype=torch.float64, requires_grad=True)  # (C, F)
        b = torch.zeros(len(classes), dtype=torch.float64, requires_grad=True)  # (C,)
        opt = torch.optim.LBFGS([w, b], max_iter=500, tolerance_grad=1e-9, line_search_fn="strong_wolfe")

        def closure():
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(z @ w.T + b, y) + l2 * (w ** 2).sum() / (2 * len(y))
            loss.backward()
            return loss

        opt.step(closure)
    return Readout(classes, mean, std, w.detach(), b.detach(), l2)


def folds_of(n: int, folds: int = FOLDS, seed: int = 0, groups: Sequence[int] | None = None) -> list[list[int]]:
    """``n`` examples dealt into ``folds`` folds at random (by ``seed``); with ``groups``, each group's examples
    stay in one fold."""
    if groups is None:
        groups = list(range(n))
    keys = sorted(set(groups))
    random.Random(seed).shuffle(keys)
    fold_of = {g: i % folds for i, g in enumerate(keys)}
    out: list[list[int]] = [[] for _ in range(min(folds, len(keys)))]
    for i, g in enumerate(groups):
        out[fold_of[g]].append(i)
    return [f for f in out if f]


def cross_fit(x: torch.Tensor, labels: Sequence[str], l2: float = 1.0, folds: int = FOLDS, seed: int = 0,
              classes: Sequence[str] | None = None) -> torch.Tensor:
    """Out-of-fold probabilities (N, C): each example's by a readout fitted on the other folds, never on itself
    (where the other folds hold a single label: that label's probability 1; none: every label alike). The columns
    follow ``classes`` (default: the labels seen, sorted)."""
    x = torch.as_tensor(x, dtype=torch.float64)
    classes, _ = _targets(labels, classes)
    out = torch.zeros(len(labels), len(classes), dtype=torch.float64)
    for held in folds_of(len(labels), folds, seed):
        rest = sorted(set(range(len(labels))) - set(held))
        seen = {labels[i] for i in rest}
        if len(seen) < 2:  # the other folds hold one label or none (a few examples)
            out[held] = torch.tensor([float(c in seen) if seen else 1 / len(classes) for c in classes],
                                     dtype=torch.float64)
            continue
        out[held] = fit(x[rest], [labels[i] for i in rest], l2, classes).probs(x[held])
    return out


def choose_l2(x: torch.Tensor, labels: Sequence[str], grid: Sequence[float] = L2_GRID, folds: int = FOLDS,
              seed: int = 0) -> float:
    """The penalty of ``grid`` whose out-of-fold log-likelihood on (``x``, ``labels``) is highest (the larger
    penalty on a tie)."""
    classes, y = _targets(labels, None)

    def loglik(l2: float) -> float:
        p = cross_fit(x, labels, l2, folds, seed, classes)
        return float(torch.log(p[torch.arange(len(y)), y].clamp_min(1e-12)).mean())

    scores = {l2: loglik(l2) for l2 in grid}
    best = max(scores.values())
    return max(l2 for l2, s in scores.items() if s >= best - 1e-12 or math.isclose(s, best))


def fit_cv(x: torch.Tensor, labels: Sequence[str], grid: Sequence[float] = L2_GRID, folds: int = FOLDS,
           seed: int = 0) -> Readout:
    """A readout on all of (``x``, ``labels``) at the penalty ``choose_l2`` picks on them."""
    return fit(x, labels, choose_l2(x, labels, grid, folds, seed))
