"""The classifier builder of a workspace: split a labelled file into in-context demonstrations, in-memory
demonstrations (ingested into a bank by a job) and a held-out set; save the classifier with its bank; evaluate it
(with plots); classify texts and whole files. ``Workspace.classifiers`` is one of these.

    job = ws.classifiers.build("sst2", "sentiment", "train.tsv", PRESETS["SST-2"].demo_format(), 4, 2000, 200)
    ws.classifiers.evaluate("sst2", "sentiment")          # accuracy, per-label metrics, confusion + curve PNGs,
                                                          # beside embeddings + logistic regression on the same examples
    ws.classifiers.classify("sst2", "sentiment", ["a gorgeous film"])

How a classifier decides (``ClassifierSpec.method``): by default a head fitted on its in-memory examples reads the
bank model's state and the sentence embedding of each text (``longmem.tasks.head``), fitted when the examples are
ingested (a classifier saved before heads existed gets one on first use) and stored with the bank, cross-validated
(its figures, unsure threshold and possible label errors come with it). Or, "in-context", the paper's: the likeliest
label word after fixed demonstrations in the prompt, or those found for each text in its bank
(``longmem.tasks.demos``). ``method``, ``finder``, ``shots``, ``balance`` and ``calibrate`` are saved with it and
can be changed for one call (``settings``).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from pathlib import Path
from typing import Callable, Protocol

import numpy as np
import torch

from longmem.ingest.readers import DemoFormat
from longmem.model.longmem import LongMemModel
from longmem.service.jobs import JobManager
from longmem.service.sessions import Sessions
from longmem.storage import BankDirectory
from longmem.storage.bank import Bank
from longmem.tasks.classify import METHODS, Choice, ClassifierSpec, classify_rows, write_predictions_csv
from longmem.tasks.demos import DemoFinder, accuracy_vs_bank, jsonl_format, write_demos
from longmem.tasks.examples import Example, format_demo, read_examples, read_texts, split_examples
from longmem.tasks.head import (
    BANK_CLASSIFIER,
    FEATURES,
    MAX_LABELS,
    Featurizer,
    Head,
    head_examples,
    head_for,
    head_problem,
)
from longmem.tasks.measure import (
    CurvePoint,
    accuracy_vs_memory,
    anchor_results,
    default_sizes,
    fitted_results,
    majority_accuracy,
    plot_confusion,
    plot_curve,
    score_predictions,
    wilson,
)
from longmem.tasks.measure import evaluate as evaluate_classifier
from longmem.text.io import InputError


class BuilderHost(Protocol):
    """What the builder needs from the workspace that owns it (``Workspace`` is one): its model, its banks, its jobs
    and its sessions (a bank's loaded session, ``.bank`` and ``.memory``: ``sessions.session``), the upload size
    limit, and five services: check an upload, make a bank, a job's work that reads files into a bank, a folder for
    scratch files, and running model work one call at a time."""

    model: LongMemModel
    directory: BankDirectory
    jobs: JobManager
    max_upload_bytes: int
    sessions: Sessions  # each bank's loaded memory (``Sessions.session``)

    def check_upload(self, path: str | os.PathLike, demos: DemoFormat | None = None) -> None: ...
    def create_bank(self, name: str) -> None: ...
    def ingest_work(self, name: str, paths: list[Path], titles: list[str], demos: DemoFormat | None,
                    then: Callable[[Bank], str] | None = None) -> Callable: ...
    def scratch_dir(self) -> Path: ...
    def run_locked(self, fn: Callable[[], object]): ...


class ClassifierBuilder:
    """Build, evaluate and use the classifiers saved in a host's banks (see the module docstring)."""

    def __init__(self, host: BuilderHost):
        self.host = host
        self._embedder = None  # the sentence embedder (heads, the anchor), loaded on first use
        self._fitting: dict[tuple[str, str], threading.Lock] = {}  # (bank, classifier) -> held while its head is fitted
        self._fitting_guard = threading.Lock()

    def _embed(self):
        """The shipped sentence embedder's ``encode`` (``model.embedder``), loaded once; None where it is not
        installed (the evaluation then shows no anchor)."""
        if self._embedder is None:
            from longmem.model.embedder import Embedder, EmbedderError
            try:
                self._embedder = Embedder.load()
            except EmbedderError:
                return None
        return self._embedder.encode

    def build(self, name: str, classifier: str, path: str | os.PathLike, fmt: DemoFormat, n_context: int,
              n_memory: int | None, n_test: int, seed: int = 0, chunk_size: int | None = None, create: bool = True,
              finder: str = "none", balance: bool = False, calibrate: bool = False, method: str = "head") -> str:
        """Split a labelled file into in-context demonstrations, in-memory demonstrations (ingested into bank
        ``name`` by a job) and a held-out test set; the classifier is saved with the bank when the job is done, and
        (``method`` "head") its head fitted on the in-memory examples in the same job. ``finder`` other than
        "none": an in-context prompt reads the ``n_context`` demonstrations found in the bank for each text
        (``balance``d over the labels or not) instead of fixed ones. Returns the job id."""
        if not classifier or not classifier.strip():
            raise InputError("give the classifier a name")
        if classifier.strip() == BANK_CLASSIFIER:
            raise InputError(f"{BANK_CLASSIFIER!r} is the name kept for the bank's own demonstrations; choose another")
        if method not in METHODS:
            raise InputError(f"a classifier's method must be one of {', '.join(METHODS)}, got {method!r}")
        Choice(finder, n_context, balance)  # refuses bad settings before anything is read
        self.host.check_upload(path, fmt)
        examples = read_examples(path, fmt, skip_empty=True)
        # a head reads no demonstrations in a prompt: none are set apart for one
        split = split_examples(examples, n_context if method == "in-context" else 0, n_memory, n_test, seed)
        words = list(dict.fromkeys((fmt.label_words or {}).values())) or sorted({e.label for e in examples})
        seen = sorted({e.label for e in examples})
        if len(seen) < 2:
            raise InputError(f"{Path(path).name}: every example is labelled {seen[0]!r}; a classifier needs at "
                             "least two labels (is the label column right?)")
        if len(words) > MAX_LABELS:
            raise InputError(f"{Path(path).name}: {len(words):,} distinct labels; a classifier takes at most "
                             f"{MAX_LABELS} (is the label column right?)")
        spec = ClassifierSpec(name=classifier.strip(), template=fmt.template, labels=words,
                              context=[format_demo(fmt.template, e) for e in split.context], source=Path(path).name,
                              n_memory=len(split.memory), n_test=len(split.test), seed=seed, test=split.test,
                              finder=finder, shots=n_context, balance=balance, calibrate=calibrate, method=method)
        if method == "head":
            problem = head_problem([e.label for e in split.memory])
            if problem:
                raise InputError(f"{problem}: keep more examples in memory, or choose the in-context method")
        saved = {"spec": spec.to_dict(), "chunk_size": chunk_size or self.host.model.chunk_size,
                 "memory_examples": [{"text": e.text, "label": e.label} for e in split.memory]}
        if not self.host.directory.exists(name):
            if not create:
                self.host.directory.open(name)
            self.host.create_bank(name)
        with self.host.directory.open(name) as bank:
            bank.check(self.host.model)

        def save(bank: Bank) -> str:
            bank.save_classifier(spec.name, saved)
            return f"classifier {spec.name!r} saved ({len(split.context)} in context, {len(split.memory)} in memory, " \
                   f"{len(split.test)} held out)"

        if not split.memory:  # in-context only: nothing to ingest
            return self.host.jobs.submit("classifier", name, spec.name,
                                         lambda ctx: save(self.host.directory.open(name)))
        demo_file = write_demos(self.host.scratch_dir() / f"{name}-{spec.name}-{seed}-demos.jsonl", split.memory)
        demos = jsonl_format(fmt.template)
        title = f"{spec.name} demonstrations ({len(split.memory):,} from {Path(path).name}).jsonl"
        ingest = self.host.ingest_work(name, [demo_file], [title], demos, save)

        def work(ctx) -> str:
            done = ingest(ctx)
            if spec.method != "head":
                return done
            n = len(head_examples(split.memory, seed))
            ctx.new_file(f"{spec.name}: fitting its head on {n:,} examples (their features first)",
                         unit="text features")
            head = self._head(name, spec, saved, ctx.count)
            return f"{done}; {head.describe()}"

        return self.host.jobs.submit("ingest", name, title, work)

    # -- the head (method "head") ----------------------------------------------------------------------------------
    def _featurizer(self, spec: ClassifierSpec) -> Featurizer:
        """What a head of ``spec`` reads: the bank model's state and, where the embedder is installed, the
        sentence embeddings."""
        embed = self._embed()
        return Featurizer(self.host.model, spec.template, embed, FEATURES if embed is not None else ("state",))

    def head(self, name: str, classifier: str, progress=None) -> Head:
        """The fitted head of a saved classifier (fitted now, with ``progress(done, total)``, when it has none or its
        examples or model changed since)."""
        spec, saved = self._spec(name, classifier)
        return self._head(name, spec, saved, progress)

    def _head(self, name: str, spec: ClassifierSpec, saved: dict, progress=None) -> Head:
        """The head, fitted when needed: one fit at a time per classifier (a second caller waits, then finds it
        stored). The model is not locked for it: the backbone runs one forward pass at a time (``Backbone``), so
        a chat goes on between its batches, as beside an ingestion."""
        examples = [Example(e["text"], e["label"]) for e in saved.get("memory_examples", [])]
        problem = head_problem([e.label for e in examples])
        if problem:
            raise InputError(f"classifier {spec.name!r} cannot have a head ({problem}); use its in-context method")
        with self._fitting_guard:
            lock = self._fitting.setdefault((name, spec.name), threading.Lock())
        with lock, self.host.directory.open(name) as bank:
            return head_for(bank, spec.name, self._featurizer(spec), examples, spec.labels, spec.seed, progress)[0]

    def names(self, name: str) -> list[str]:
        with self.host.directory.open(name) as bank:
            return list(bank.classifiers())

    def _spec(self, name: str, classifier: str, settings: dict | None = None) -> tuple[ClassifierSpec, dict]:
        """The saved classifier, with ``settings`` (finder, shots, balance, calibrate) changed for this call."""
        with self.host.directory.open(name) as bank:
            saved = bank.classifiers().get(classifier)
        if saved is None:
            raise KeyError(f"bank {name!r} has no classifier {classifier!r}")
        spec = ClassifierSpec.from_dict(saved["spec"])
        if "method" not in saved["spec"] and head_problem([e["label"] for e in saved.get("memory_examples", [])]):
            spec = dataclasses.replace(spec, method="in-context")  # saved before heads, with no examples for one
        unknown = set(settings or {}) - {"finder", "shots", "balance", "calibrate", "method"}
        if unknown:
            raise ValueError(f"unknown classifier settings: {', '.join(sorted(unknown))}")
        spec = dataclasses.replace(spec, **(settings or {}))  # checks the method
        if spec.finder != "none":
            Choice(spec.finder, spec.shots, spec.balance)  # checks them
        return spec, saved

    def _classifier(self, name: str, spec: ClassifierSpec, chunk_size: int | None):
        """The classifier over the bank's loaded memory (callers hold the model lock)."""
        s = self.host.sessions.session(name, chunk_size)
        demos = DemoFinder(s.bank, self.host.model, s.memory, spec.template, spec.labels) if spec.finder != "none" \
            else None
        return spec.classifier(self.host.model, s.memory, demos)

    def evaluate(self, name: str, classifier: str, curve: bool = True, progress=None,
                 settings: dict | None = None) -> dict:
        """Accuracy, per-label metrics and confusion matrix on the held-out set, plus accuracy vs the number of
        in-memory examples (0, 100, 500, 2,000 and all, each with a 95% interval over the held-out set: a head fitted
        on the first that many; in-context, that many in memory, a classifier that finds its demonstrations finding
        them among those); plots as PNG. Beside it the anchor, what a user would build from the same in-memory
        examples (``measure.anchor_results``: sentence embeddings + logistic regression), at all of them and, with
        the curve, at each size of it. A head's classifier with no held-out examples gets its cross-validated figures
        in their place ("result": ``Head.cross_validated``; no curve, no anchor). Returns {"result", "held_out" (the
        held-out examples; 0: "result" is cross-validated), "curve", "majority", "method", "head" (a head's
        ``Head.summary``: its cross-validated figures; None in-context), "suspects" (a head's possible label errors,
        each with its "text"), "anchor" (its EvalResult, None without in-memory examples or an embedder),
        "anchor_examples", "anchor_interval" (95%, Wilson), "anchor_curve" (CurvePoints), "confusion_png",
        "curve_png"}."""
        spec, saved = self._spec(name, classifier, settings)
        if not spec.test and spec.method != "head":
            raise ValueError(f"classifier {classifier!r} has no held-out examples to evaluate on")
        mem_examples = [Example(e["text"], e["label"]) for e in saved.get("memory_examples", [])]
        sizes = default_sizes(len(mem_examples))
        if spec.method == "head" and not spec.test:  # the examples' cross-validated figures alone
            head = self._head(name, spec, saved, progress)
            result, points, cached = head.cross_validated(), [], None
        elif spec.method == "head":
            kinds = len(self._featurizer(spec).features)
            fitted_on = len(head_examples(mem_examples, spec.seed))
            total = kinds * (fitted_on + len(spec.test)) + (len(sizes) if curve else 0)
            report = (lambda base: (lambda d, _t: progress(base + d, total))) if progress else (lambda base: None)
            result, points, vectors, head = self._evaluate_head(name, spec, saved, mem_examples,
                                                                sizes if curve else [], kinds, report)
            embed = self._embed()

            def embedded(texts: list[str]) -> np.ndarray:  # the head's own embeddings, the others in one batch
                missing = list(dict.fromkeys(t for t in texts if t not in vectors))
                if missing:
                    vectors.update(zip(missing, embed(missing)))
                return np.stack([vectors[t] for t in texts])
            cached = embedded if embed is not None else None
        else:
            result, points = self._evaluate_in_context(name, spec, saved, mem_examples, sizes, curve, progress)
            head, cached = None, self._embed()
        at = [n for n in sizes if n > 0] if curve else [len(mem_examples)]
        try:
            anchored = self.host.run_locked(lambda: anchor_results(
                cached, spec.labels, mem_examples, spec.test, at, spec.seed)) if mem_examples and cached and spec.test \
                else []
        except ValueError:  # examples the anchor cannot score (a label outside the classifier's): shown without it
            anchored = []
        full = anchored[-1][1] if anchored and anchored[-1][0] == len(mem_examples) else None
        anchor_curve = [CurvePoint(n, r.accuracy, 0, len(r.truths)) for n, r in anchored] if curve else []
        out_dir = self.host.scratch_dir()
        stem = f"{name}-{classifier}".replace("/", "_")
        with self.host.directory.open(name) as bank:
            saved["spec"]["last_eval"] = result.to_dict()
            bank.save_classifier(classifier, saved)
        if head is not None:
            how = "a head on the model's state" + (" + embeddings" if "embeddings" in head.signature["features"]
                                                   else "")
        else:
            how = "fixed demonstrations" if spec.finder == "none" else f"{spec.shots} found by {spec.finder}"
            how += ", calibrated" if spec.calibrate else ""
        fitted_on = head_examples(mem_examples, spec.seed) if head is not None else []  # the suspects' indexes
        scored = spec.test or fitted_on
        return {"result": result,
                "held_out": len(spec.test),
                "curve": points,
                "majority": majority_accuracy(scored),
                "method": spec.method,
                "head": head.summary() if head is not None else None,
                "suspects": [{**s, "text": fitted_on[s["index"]].text} for s in head.suspects] if head else [],
                "anchor": full,
                "anchor_examples": len(mem_examples),
                "anchor_interval": wilson(round(full.accuracy * len(full.truths)), len(full.truths)) if full else None,
                "anchor_curve": anchor_curve,
                "confusion_png": str(plot_confusion(result, out_dir / f"{stem}-confusion.png")),
                "curve_png": str(plot_curve(points, out_dir / f"{stem}-curve.png",
                                            baseline=majority_accuracy(scored), label=f"LongMem, {how}",
                                            anchor=anchor_curve))
                if points else None}

    def _evaluate_head(self, name: str, spec: ClassifierSpec, saved: dict, examples: list[Example],
                       sizes: list[int], kinds: int, report):
        """(held-out result, curve points, {text: its sentence embedding} of the examples and held-out texts where
        the head reads them, the head): the head fitted (when needed), the held-out texts' features (``kinds`` of
        them), and at each curve size a head fitted on the first that many of its examples (``readout.fit_cv``;
        sizes whose examples hold fewer than two labels, 0 among them, are left out: no head is fitted on them)."""
        examples = head_examples(examples, spec.seed)  # those the head is fitted on
        n = len(examples)
        head = self._head(name, spec, saved, report(0))
        featurizer = self._featurizer(spec)
        test_texts = [e.text for e in spec.test]
        xt = self.host.run_locked(lambda: featurizer(test_texts, report(kinds * n)))
        truths = [e.label for e in spec.test]
        result = score_predictions(spec.labels, truths, head.readout.predict(xt))
        fewer = [k for k in sizes if 0 < k < n]
        points = [CurvePoint(k, r.accuracy, 0, len(truths))
                  for k, r in fitted_results(head.x, xt, spec.labels, examples, spec.test, fewer, spec.seed)]
        if sizes:
            points.append(CurvePoint(n, result.accuracy, 0, len(truths)))
        tick = report(kinds * (n + len(truths)))
        if tick is not None:
            tick(len(sizes), None)
        vectors = {}
        if "embeddings" in head.signature["features"]:
            dim = xt.shape[1] - self.host.model.backbone.spec.hidden  # stacked first (``FEATURES`` order)
            texts = [e.text for e in examples] + test_texts
            for t, v in zip(texts, torch.cat([head.x, xt])[:, :dim].numpy()):
                vectors[t] = v
        return result, points, vectors, head

    def _evaluate_in_context(self, name: str, spec: ClassifierSpec, saved: dict, mem_examples: list[Example],
                             sizes: list[int], curve: bool, progress):
        """(held-out result, curve points) of the in-context method."""
        chunk_size = saved.get("chunk_size")
        n_curve = (len(spec.test) * len(sizes) + len(mem_examples)) if curve else 0
        total = len(spec.test) + n_curve
        report = (lambda base: (lambda d, _t: progress(base + d, total))) if progress else (lambda base: None)

        def run():
            result = evaluate_classifier(self._classifier(name, spec, chunk_size), spec.test, report(0))
            if not curve:
                return result, []
            if spec.finder == "none":
                points = accuracy_vs_memory(self.host.model, spec.template, spec.labels, spec.context, mem_examples,
                                            spec.test, sizes, progress=report(len(spec.test)), chunk_size=chunk_size,
                                            calibrate=spec.calibrate)
            else:
                points = accuracy_vs_bank(self.host.model, spec.template, spec.labels, spec.context, mem_examples,
                                          spec.test, Choice(spec.finder, spec.shots, spec.balance),
                                          self.host.scratch_dir(), sizes, spec.calibrate, chunk_size,
                                          report(len(spec.test)))
            return result, points

        return self.host.run_locked(run)

    def classify(self, name: str, classifier: str, texts: list[str], progress=None,
                 settings: dict | None = None) -> list[dict]:
        """Label ``texts``: one row per text with the prediction and its confidence; a head's rows (``Head.rows``)
        also say whether the answer is unsure and each label's probability, in-context rows every label's score
        and the demonstrations read when they are found per text (``classify.classify_rows``)."""
        texts = [t for t in texts if t and t.strip()]
        if not texts:
            raise InputError("nothing to classify: the text is empty")
        spec, saved = self._spec(name, classifier, settings)
        if spec.method == "head":
            head = self._head(name, spec, saved, progress)  # a classifier saved before heads: fitted now, once
            featurizer = self._featurizer(spec)
            x = self.host.run_locked(lambda: featurizer(texts, progress))
            return [{**row, "error": ""} for row in head.rows(x, texts)]
        return self.host.run_locked(lambda: classify_rows(self._classifier(name, spec, saved.get("chunk_size")), texts,
                                                        progress))

    def classify_file(self, name: str, classifier: str, path: str | os.PathLike, text_column: str = "text",
                      columns: list[str] | None = None, progress=None, settings: dict | None = None) -> Path:
        """Label every text of a file (CSV/TSV/JSONL column, or the lines of a .txt); returns a CSV of results."""
        p = Path(path)
        if p.is_file() and p.stat().st_size > self.host.max_upload_bytes:
            raise InputError(f"{p.name} is larger than the {self.host.max_upload_bytes / 2**20:,.0f} MiB limit")
        rows = self.classify(name, classifier, read_texts(p, text_column, columns), progress, settings)
        return write_predictions_csv(rows, self.host.scratch_dir() / f"{p.stem}-predictions.csv")
