"""A classifier fitted on its labelled examples (issue 86): what the bank's model computes for a text, beside the
text's sentence embedding, read by a logistic regression fitted on the examples (``tasks.readout``).

    featurizer = Featurizer(model, template, embedder.encode)
    head, fitted = head_for(bank, "sentiment", featurizer, examples, labels)  # stored with the bank, or fitted
    head.summary()                                        # cross-validated accuracy, unsure threshold, ...
    rows = head.rows(featurizer(texts), texts)            # label, confidence, unsure, each label's probability
    Head.from_bytes(head.to_bytes())                      # safetensors; its JSON in the file's metadata

The features of a text (``FEATURES``):

- ``state``: the bank's frozen backbone's last hidden state (before its final norm) at the last token of the text
  written in the classifier's template up to its label (what the in-context classifier reads its label words from),
  the text alone: no demonstrations, no memory;
- ``embeddings``: the shipped sentence embedder's vector of the text (all-MiniLM-L6-v2: the anchor's own feature).

Why these: ``training/studies/icl_features`` on the five ICL sets' dev splits (``docs/history/notes-issue-86.md``): the
backbone's state with the embeddings stacked is above the embeddings alone on every set; label-word scores read far
less; the memory's features (the state with demonstrations in memory, the labels of those retrieved) add nothing a
head can use (``docs/design.md``).

At fitting time, out-of-fold predictions (``readout.cross_fit``, each example predicted by a head fitted without
its fold) give what the user sees before trusting it: the cross-validated accuracy with its interval, per-label
F1 and the confusion matrix (``measure.score_predictions``); the confidence below which an answer is marked unsure;
and the examples whose label disagrees with their out-of-fold prediction (possible label errors, by confident
learning's per-label thresholds, Northcutt et al. 2021).
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from longmem.tasks.examples import prompt_parts
from longmem.tasks.measure import EvalResult, score_predictions, wilson
from longmem.tasks.readout import FOLDS, Readout, choose_l2, cross_fit, fit

Progress = Callable[[int, int], None]  # (done, total)

FEATURES = ("embeddings", "state")  # what a head can read (see the module doc), in the order they are stacked
STATE_BATCH = 16  # texts per forward pass of the backbone (right-padded: causal attention keeps each text's own
#                   state, up to rounding)
UNSURE_ACCURACY = 0.9  # an answer is sure when the out-of-fold answers at or above its confidence were right this often
MIN_SURE = 20  # ... counted over at least this many examples
MAX_EXAMPLES = 10_000  # examples a head is fitted on at most (more: a sample, seeded; memory holds them all)
MAX_LABELS = 200  # distinct labels a classifier takes (more: most likely the text column read as the label)
BANK_CLASSIFIER = "bank demonstrations"  # the saved classifier ``bank_head`` keeps for a bank's demonstrations
SUSPECTS_KEPT = 200  # possible label errors kept with a head, least likely label first
FORMAT = 1  # the layout of ``Head.to_bytes``


class HeadError(ValueError):
    """Examples a head cannot be fitted on, or a stored head that cannot be read."""


def text_key(text: str) -> str:
    """A stable id of a text (its features are cached under it: they do not depend on its label)."""
    return hashlib.sha256(text.strip().encode()).hexdigest()[:16]


class Featurizer:
    """Features (``FEATURES``) of texts as a classifier with ``template`` reads them. ``model``: any
    ``model.lm.SegmentLM`` (its ``backbone`` is read, its memory never); ``embed``: texts -> (N, E) array (the
    sentence embedder's ``encode``), needed only when ``features`` holds "embeddings"."""

    def __init__(self, model, template: str, embed: Callable[[list[str]], np.ndarray] | None,
                 features: Sequence[str] = FEATURES, embedder_name: str = "all-MiniLM-L6-v2",
                 batch: int = STATE_BATCH):
        unknown = [f for f in features if f not in FEATURES]
        if unknown or not features:
            raise HeadError(f"unknown head features {unknown or 'none'}; choose among {', '.join(FEATURES)}")
        if "embeddings" in features and embed is None:
            raise HeadError("the head reads sentence embeddings, and no sentence embedder is installed")
        if "{label}" not in template or "{text}" not in template.split("{label}")[0]:
            raise HeadError(f"template {template!r} needs {{text}} before {{label}}")
        self.model, self.template, self.embed = model, template, embed
        self.features = tuple(f for f in FEATURES if f in features)
        self.embedder_name, self.batch = embedder_name, batch

    def signature(self) -> dict:
        """What the features depend on: a head's cached features are reused only under the same signature."""
        bb = self.model.backbone
        return {"features": list(self.features), "template": self.template,
                "backbone": bb.name, "backbone_sha256": bb.fingerprint(), "dtype": str(bb.dtype).removeprefix("torch."),
                "window": self.model.segment_len,
                "embedder": self.embedder_name if "embeddings" in self.features else None}

    def prompt_ids(self, text: str) -> list[int]:
        """The token ids the backbone reads for ``text``: the template up to its label, without the whitespace
        before it; the last ``segment_len`` tokens of a longer one."""
        if not text.strip():
            raise HeadError("the text to classify is empty")
        own = prompt_parts(self.template, text)[0]
        ids = self.model.backbone.tokenizer(own, add_special_tokens=False).input_ids
        return ids[-self.model.segment_len:]

    @torch.inference_mode()
    def states(self, texts: Sequence[str], progress: Progress | None = None) -> torch.Tensor:
        """(N, E) float32: the backbone's last hidden state at each text's last prompt token. Texts run in batches of
        similar length, right-padded (causal attention: a token never reads the padding after it, so each state is
        the text's own up to rounding, which a batch's kernels may change in bfloat16)."""
        bb = self.model.backbone
        ids = [self.prompt_ids(t) for t in texts]
        out = torch.zeros(len(texts), bb.spec.hidden)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        pad = bb.tokenizer.pad_token_id if bb.tokenizer.pad_token_id is not None else 0
        for s in range(0, len(order), self.batch):
            rows = order[s:s + self.batch]
            width = max(len(ids[i]) for i in rows)
            x = torch.full((len(rows), width), pad, dtype=torch.long)  # (b, T)
            for j, i in enumerate(rows):
                x[j, :len(ids[i])] = torch.tensor(ids[i])
            hidden = bb(x.to(bb.device), keep={bb.spec.n_layers}).hidden[bb.spec.n_layers]  # (b, T, E)
            last = torch.tensor([len(ids[i]) - 1 for i in rows], device=hidden.device)
            out[rows] = hidden[torch.arange(len(rows), device=hidden.device), last].float().cpu()
            if progress is not None:
                progress(min(s + self.batch, len(order)), len(order))
        return out

    def __call__(self, texts: Sequence[str], progress: Progress | None = None) -> torch.Tensor:
        """(N, F) float32 features of ``texts``, the kinds stacked in ``FEATURES`` order. ``progress(done, total)``
        counts texts, each kind in turn."""
        texts = list(texts)
        for t in texts:
            if not t.strip():
                raise HeadError("a text to classify is empty")
        parts, kinds = [], len(self.features)
        for i, kind in enumerate(self.features):
            report = (lambda d, _t, base=i: progress(base * len(texts) + d, kinds * len(texts))) if progress else None
            if kind == "embeddings":
                parts.append(torch.from_numpy(np.asarray(self.embed(texts), dtype=np.float32)))
                if report:
                    report(len(texts), len(texts))
            else:
                parts.append(self.states(texts, report))
        return torch.cat(parts, dim=1) if texts else torch.zeros(0, 0)


@dataclass
class Head:
    """A fitted head: its readout, what it reads (``signature``) and what cross-validation said about it."""

    readout: Readout
    signature: dict  # ``Featurizer.signature`` of the features it was fitted on
    keys: list[str]  # ``text_key`` of each example it was fitted on, in order
    x: torch.Tensor  # (N, F) float32: those examples' features (kept to refit as examples are added)
    oof: torch.Tensor  # (N, C) out-of-fold probabilities of each example (columns: ``readout.labels``)
    truths: list[str]  # the examples' labels
    unsure_below: float  # answers with a lower confidence are marked unsure (``unsure_threshold``)
    seed: int = 0  # of the folds
    suspects: list[dict] = field(default_factory=list)  # possible label errors (``label_suspects``)

    @property
    def labels(self) -> tuple[str, ...]:
        return self.readout.labels

    def cross_validated(self) -> EvalResult:
        """The out-of-fold predictions scored against the examples' labels: accuracy, per-label F1, confusion."""
        predicted = [self.labels[i] for i in self.oof.argmax(-1).tolist()]
        return score_predictions(list(self.labels), self.truths, predicted)

    def summary(self) -> dict:
        """What the user sees of the fit (JSON-able): the cross-validated accuracy with its 95% interval, macro F1,
        the share of examples answered sure and their accuracy (the threshold's aim: ``UNSURE_ACCURACY``), the
        penalty, the count of possible label errors."""
        cv = self.cross_validated()
        n = len(self.truths)
        k = round(cv.accuracy * n)
        conf = self.oof.max(-1).values
        sure = conf >= self.unsure_below
        right = torch.tensor([p == t for p, t in zip(cv.predictions, cv.truths)])
        return {"examples": n, "folds": FOLDS, "cv_accuracy": cv.accuracy, "cv_interval": list(wilson(k, n)),
                "cv_macro_f1": cv.macro_f1, "unsure_below": self.unsure_below, "unsure_target": UNSURE_ACCURACY,
                "sure_share": float(sure.float().mean()) if n else 0.0,
                "sure_accuracy": float(right[sure].float().mean()) if bool(sure.any()) else None,
                "l2": self.readout.l2, "suspects": len(self.suspects)}

    def describe(self) -> str:
        """One line on the fit: examples, cross-validated accuracy with its interval, possible label errors."""
        s = self.summary()
        low, high = s["cv_interval"]
        return (f"head fitted on {s['examples']:,} examples: cross-validated accuracy {100 * s['cv_accuracy']:.1f}% "
                f"({100 * low:.0f}-{100 * high:.0f}), {s['suspects']} possible label errors; answers below "
                f"{100 * min(s['unsure_below'], 1):.0f}% confidence are marked unsure")

    def rows(self, x: torch.Tensor, texts: Sequence[str]) -> list[dict]:
        """One row per text: the predicted label, its probability ("confidence"), "unsure" (below
        ``unsure_below``) and each label's probability as "prob_<label>"."""
        probs = self.readout.probs(x.double())
        out = []
        for text, p in zip(texts, probs.tolist()):
            best = max(range(len(p)), key=p.__getitem__)
            out.append({"text": text, "prediction": self.labels[best], "confidence": p[best],
                        "unsure": p[best] < self.unsure_below,
                        **{f"prob_{w}": v for w, v in zip(self.labels, p)}})
        return out

    # -- saving: safetensors, the JSON in its metadata ------------------------------------------------------------
    def to_bytes(self, provenance: dict | None = None) -> bytes:
        from safetensors.torch import save

        r = self.readout
        tensors = {"mean": r.mean, "std": r.std, "weight": r.weight, "bias": r.bias, "x": self.x, "oof": self.oof}
        meta = {"format": FORMAT, "labels": list(r.labels), "l2": r.l2, "signature": self.signature,
                "keys": self.keys, "truths": self.truths, "unsure_below": self.unsure_below, "seed": self.seed,
                "suspects": self.suspects, "provenance": provenance or {}}
        return save({k: v.contiguous() for k, v in tensors.items()}, metadata={"head": json.dumps(meta)})

    @classmethod
    def from_bytes(cls, blob: bytes) -> "Head":
        from safetensors import SafetensorError
        from safetensors.torch import load

        try:
            t = load(blob)
            header_len = int.from_bytes(blob[:8], "little")  # safetensors: u64 header length, then the JSON header
            meta = json.loads(json.loads(blob[8:8 + header_len])["__metadata__"]["head"])
        except (SafetensorError, ValueError, KeyError, TypeError) as e:
            raise HeadError(f"a stored classifier head could not be read: {e}") from e
        if meta.get("format") != FORMAT:
            raise HeadError(f"a stored classifier head has format {meta.get('format')}; this LongMem reads {FORMAT}")
        readout = Readout(tuple(meta["labels"]), t["mean"], t["std"], t["weight"], t["bias"], meta["l2"])
        return cls(readout, meta["signature"], meta["keys"], t["x"], t["oof"], meta["truths"],
                   meta["unsure_below"], meta["seed"], meta["suspects"])


def example_features(featurizer: Featurizer, texts: Sequence[str], cached: "Head | None" = None,
                     progress: Progress | None = None) -> tuple[torch.Tensor, list[str]]:
    """(N, F) features of ``texts`` and their ``text_key``s; those ``cached`` holds under the same signature are
    reused, only the others are computed (``progress`` counts those)."""
    keys = [text_key(t) for t in texts]
    if not keys:
        return torch.zeros(0, 0), []
    have = {k: i for i, k in enumerate(cached.keys)} if cached is not None and \
        cached.signature == featurizer.signature() else {}
    missing = [i for i, k in enumerate(keys) if k not in have]
    fresh = featurizer([texts[i] for i in missing], progress) if missing else None
    width = fresh.shape[1] if fresh is not None else cached.x.shape[1]
    x = torch.zeros(len(texts), width)
    if fresh is not None:
        x[missing] = fresh
    reused = [i for i, k in enumerate(keys) if k in have]
    if reused:
        x[reused] = cached.x[[have[keys[i]] for i in reused]]
    return x, keys


def head_examples(examples: Sequence, seed: int = 0, limit: int = MAX_EXAMPLES) -> list:
    """The examples a head is fitted on: all of them, or a sample of ``limit`` (by ``seed``, in their order)."""
    if len(examples) <= limit:
        return list(examples)
    return [examples[i] for i in sorted(random.Random(seed).sample(range(len(examples)), limit))]


def head_for(bank, classifier: str, featurizer: Featurizer, examples: Sequence, labels: Sequence[str],
             seed: int = 0, progress: Progress | None = None) -> tuple[Head, bool]:
    """(the head of saved classifier ``classifier`` of ``bank`` (a ``storage.Bank``) for ``examples``
    (``tasks.examples.Example``s, at most ``MAX_EXAMPLES`` of them: ``head_examples``) and ``labels``, whether it was
    fitted now): the stored one while it is current (same features, examples and labels), else fitted now and
    stored (the features of examples it already had reused: adding examples computes only theirs; ``progress``
    counts the features computed)."""
    examples = head_examples(examples, seed)
    blob = bank.classifier_head(classifier)
    try:
        stored = Head.from_bytes(blob) if blob else None
    except HeadError:  # another format: fitted again
        stored = None
    signature, truths = featurizer.signature(), [e.label for e in examples]
    if stored is not None and stored.signature == signature and stored.truths == truths \
            and stored.keys == [text_key(e.text) for e in examples] and stored.labels == tuple(labels):
        return stored, False
    x, keys = example_features(featurizer, [e.text for e in examples], stored, progress)
    head = fit_head(x, truths, labels, signature, keys, seed)
    bank.save_classifier_head(classifier, head.to_bytes({"examples": len(examples), "format": FORMAT,
                                                         "fitted": time.strftime("%Y-%m-%dT%H:%M:%S%z")}))
    return head, True


def bank_head(bank, model, embed: Callable[[list[str]], np.ndarray] | None, classifier: str | None = None,
              progress: Progress | None = None) -> tuple[Head, Featurizer, bool]:
    """(head, its featurizer, whether it was fitted now) classifying with ``bank``'s examples (a ``storage.Bank``;
    ``embed``: the sentence embedder's ``encode``, None to read the model's state alone): saved classifier
    ``classifier``'s in-memory examples, or (None) the demonstrations the bank holds (``demos.bank_examples``; one
    template; at most ``MAX_EXAMPLES``, ``head_examples``), kept as the saved classifier ``BANK_CLASSIFIER`` so that
    its head is stored with the bank and fitted again, reusing the features it had, when demonstrations are added.
    HeadError names what is missing."""
    from longmem.tasks.classify import Classifier, ClassifierSpec
    from longmem.tasks.demos import bank_examples
    from longmem.tasks.examples import Example

    saved = bank.classifiers()
    if classifier is not None:
        if classifier not in saved:
            raise HeadError(f"bank {bank.name!r} has no classifier {classifier!r} (it has: "
                            f"{', '.join(saved) or 'none'})")
        spec = ClassifierSpec.from_dict(saved[classifier]["spec"])
        examples = [Example(e["text"], e["label"]) for e in saved[classifier].get("memory_examples", [])]
    else:
        stored = Classifier.from_documents(model, None, bank.documents())  # the template and label words
        examples = head_examples(bank_examples(bank, stored.template, stored.labels))
        spec = ClassifierSpec(BANK_CLASSIFIER, stored.template, stored.labels, source="the bank's demonstrations",
                              n_memory=len(examples))
    problem = head_problem([e.label for e in examples])
    if problem:
        raise HeadError(f"{problem} (bank {bank.name!r}{f', classifier {classifier!r}' if classifier else ''})")
    if classifier is None:
        record = {"spec": spec.to_dict(), "chunk_size": model.chunk_size,
                  "memory_examples": [{"text": e.text, "label": e.label} for e in examples]}
        if saved.get(BANK_CLASSIFIER) != record:
            bank.save_classifier(BANK_CLASSIFIER, record)
    featurizer = Featurizer(model, spec.template, embed, FEATURES if embed is not None else ("state",))
    head, fitted = head_for(bank, spec.name, featurizer, examples, spec.labels, spec.seed, progress)
    return head, featurizer, fitted


def unsure_threshold(confidence: torch.Tensor, right: torch.Tensor, target: float = UNSURE_ACCURACY,
                     min_sure: int = MIN_SURE) -> float:
    """The lowest confidence t such that the examples answered with confidence >= t were right at least ``target``
    of the time (out of fold), over at least ``min_sure`` of them; above every confidence (all unsure) when none
    reaches it. Examples of equal confidence are on the same side of t."""
    if not len(confidence):
        return 0.5
    order = torch.argsort(confidence, descending=True)
    conf = confidence[order]
    hits = torch.cumsum(right[order].double(), 0)
    counts = torch.arange(1, len(order) + 1, dtype=torch.float64)
    ends = torch.ones(len(conf), dtype=torch.bool)  # the last of each run of equal confidences
    ends[:-1] = conf[1:] != conf[:-1]
    ok = ((hits / counts) >= target) & (counts >= min_sure) & ends
    if not bool(ok.any()):
        return 1.0 + 1e-9
    return float(conf[int(torch.nonzero(ok).max())])


def label_suspects(oof: torch.Tensor, truths: Sequence[str], labels: Sequence[str],
                   keep: int = SUSPECTS_KEPT) -> list[dict]:
    """Examples whose given label disagrees with their out-of-fold prediction, by confident learning: example i,
    labelled y, is a suspect when another label j has p_j >= t_j, t_j the mean p_j over the examples labelled j (the
    likeliest such j is named). [{"index", "label", "predicted", "p_label", "p_predicted"}], least likely given
    label first, at most ``keep``."""
    index = {w: i for i, w in enumerate(labels)}
    y = torch.tensor([index[t] for t in truths])
    thresholds = torch.tensor([float(oof[y == j, j].mean()) if bool((y == j).any()) else 1.0
                               for j in range(len(labels))], dtype=oof.dtype)
    out = []
    for i in range(len(truths)):
        above = (oof[i] >= thresholds).clone()
        above[y[i]] = False
        if not bool(above.any()):
            continue
        j = int(torch.where(above, oof[i], torch.full_like(oof[i], -1.0)).argmax())
        if oof[i, j] <= oof[i, y[i]]:
            continue
        out.append({"index": i, "label": truths[i], "predicted": labels[j], "p_label": float(oof[i, y[i]]),
                    "p_predicted": float(oof[i, j])})
    out.sort(key=lambda s: s["p_label"])
    return out[:keep]


def head_problem(truths: Sequence[str]) -> str | None:
    """Why examples labelled ``truths`` cannot have a head (None: they can): fewer than two labels among them, or
    more than ``MAX_LABELS``."""
    seen = sorted(set(truths))
    if len(seen) < 2:
        return f"a head needs examples of at least two labels; the examples hold {seen[0]!r} only" if seen \
            else "a head needs labelled examples; there are none"
    if len(seen) > MAX_LABELS:
        return f"the examples have {len(seen):,} distinct labels; a classifier takes at most {MAX_LABELS}"
    return None


def fit_head(x: torch.Tensor, truths: Sequence[str], labels: Sequence[str], signature: dict,
             keys: Sequence[str], seed: int = 0) -> Head:
    """A head on features ``x`` (N, F) of examples labelled ``truths`` (each one of ``labels``): its penalty by
    cross-validation (``readout.choose_l2``), fitted on all of them, with out-of-fold probabilities at that penalty
    for the figures, the unsure threshold and the possible label errors. HeadError when the examples hold fewer than
    two labels (``head_problem``) or a label outside ``labels``."""
    truths = list(truths)
    if len(truths) != x.shape[0] or len(keys) != len(truths):
        raise HeadError(f"{x.shape[0]} feature rows and {len(keys)} keys for {len(truths)} labels")
    outside = sorted(set(truths) - set(labels))
    if outside:
        raise HeadError(f"examples labelled {outside[:5]}, not among the classifier's labels {list(labels)[:10]}")
    problem = head_problem(truths)
    if problem:
        raise HeadError(problem)
    x = x.double()
    l2 = choose_l2(x, truths, seed=seed)
    readout = fit(x, truths, l2, labels)
    oof = cross_fit(x, truths, l2, seed=seed, classes=labels)
    conf = oof.max(-1).values
    right = torch.tensor([labels[i] == t for i, t in zip(oof.argmax(-1).tolist(), truths)])
    return Head(readout, signature, list(keys), x.float(), oof, truths, unsure_threshold(conf, right), seed,
                label_suspects(oof, truths, labels))
