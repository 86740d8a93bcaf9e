"""The classifier builder of a workspace: split a labelled file into in-context demonstrations, in-memory
demonstrations (ingested into a bank by a job) and a held-out set; save the classifier with its bank; evaluate it
(with plots); classify texts and whole files. ``Workspace.classifiers`` is one of these.

    job = ws.classifiers.build("sst2", "sentiment", "train.tsv", PRESETS["SST-2"].demo_format(), 4, 2000, 200)
    ws.classifiers.evaluate("sst2", "sentiment")          # accuracy, per-label metrics, confusion + curve PNGs,
                                                          # beside embeddings + logistic regression on the same examples
    ws.classifiers.classify("sst2", "sentiment", ["a gorgeous film"])

A classifier reads fixed demonstrations in its prompt, or finds them for each text in its bank
(``longmem.tasks.demos``): ``finder``, ``shots``, ``balance`` and ``calibrate`` are saved with it and can be changed
for one call (``settings``).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Callable, Protocol

from longmem.ingest.readers import DemoFormat
from longmem.model.longmem import LongMemModel
from longmem.service.jobs import JobManager
from longmem.service.sessions import Sessions
from longmem.storage import BankDirectory
from longmem.storage.bank import Bank
from longmem.tasks.classify import Choice, ClassifierSpec, classify_rows, write_predictions_csv
from longmem.tasks.demos import DemoFinder, accuracy_vs_bank, jsonl_format, write_demos
from longmem.tasks.examples import Example, format_demo, read_examples, read_texts, split_examples
from longmem.tasks.measure import (
    CurvePoint,
    EvalResult,
    accuracy_vs_memory,
    anchor_results,
    default_sizes,
    majority_accuracy,
    plot_confusion,
    plot_curve,
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
        self._embedder = None  # the anchor's sentence embedder, loaded on the first evaluation

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
              finder: str = "none", balance: bool = False, calibrate: bool = False) -> str:
        """Split a labelled file into in-context demonstrations, in-memory demonstrations (ingested into bank
        ``name`` by a job) and a held-out test set; the classifier is saved with the bank when the job is done.
        ``finder`` other than "none": the prompt reads the ``n_context`` demonstrations found in the bank for each
        text (``balance``d over the labels or not) instead of fixed ones. Returns the job id."""
        if not classifier or not classifier.strip():
            raise InputError("give the classifier a name")
        Choice(finder, n_context, balance)  # refuses bad settings before anything is read
        self.host.check_upload(path, fmt)
        examples = read_examples(path, fmt, skip_empty=True)
        split = split_examples(examples, n_context, n_memory, n_test, seed)
        words = list(dict.fromkeys((fmt.label_words or {}).values())) or sorted({e.label for e in examples})
        spec = ClassifierSpec(name=classifier.strip(), template=fmt.template, labels=words,
                              context=[format_demo(fmt.template, e) for e in split.context], source=Path(path).name,
                              n_memory=len(split.memory), n_test=len(split.test), seed=seed, test=split.test,
                              finder=finder, shots=n_context, balance=balance, calibrate=calibrate)
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
        work = self.host.ingest_work(name, [demo_file], [title], demos, save)
        return self.host.jobs.submit("ingest", name, title, work)

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
        unknown = set(settings or {}) - {"finder", "shots", "balance", "calibrate"}
        if unknown:
            raise ValueError(f"unknown classifier settings: {', '.join(sorted(unknown))}")
        spec = dataclasses.replace(spec, **(settings or {}))
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
        """Accuracy, per-label metrics and confusion matrix on the held-out set (bank memory), plus accuracy vs the
        number of in-memory demonstrations (0, 100, 500, 2,000 and all, each with a 95% interval over the held-out
        set; a classifier that finds its demonstrations finds them among those in memory); plots as PNG. Beside it
        the anchor, what a user would build from the same in-memory examples (``measure.anchor_results``: sentence
        embeddings + logistic regression), at all of them and, with the curve, at each size of it. Returns
        {"result", "curve", "majority", "anchor" (its EvalResult, None without in-memory examples or an embedder),
        "anchor_examples", "anchor_interval" (95%, Wilson), "anchor_curve" (CurvePoints), "confusion_png",
        "curve_png"}."""
        spec, saved = self._spec(name, classifier, settings)
        if not spec.test:
            raise ValueError(f"classifier {classifier!r} has no held-out examples to evaluate on")
        mem_examples = [Example(e["text"], e["label"]) for e in saved.get("memory_examples", [])]
        chunk_size = saved.get("chunk_size")
        sizes = default_sizes(len(mem_examples))
        n_curve = (len(spec.test) * len(sizes) + len(mem_examples)) if curve else 0
        n_anchor = len(spec.test) + len(mem_examples) if mem_examples else 0  # texts the anchor embeds
        total = len(spec.test) + n_curve + n_anchor
        report = (lambda base: (lambda d, _t: progress(base + d, total))) if progress else (lambda base: None)

        def anchor() -> list[tuple[int, EvalResult]]:
            embed = self._embed() if mem_examples else None
            if embed is None:
                return []
            done, embedded = report(len(spec.test) + n_curve), 0

            def counted(texts: list[str]):  # the anchor's progress: texts embedded
                nonlocal embedded
                out = embed(texts)
                embedded += len(texts)
                if done is not None:
                    done(embedded, None)
                return out
            at = [n for n in sizes if n > 0] if curve else [len(mem_examples)]
            return anchor_results(counted, spec.labels, mem_examples, spec.test, at, spec.seed)

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

        result, points = self.host.run_locked(run)
        try:
            anchored = self.host.run_locked(anchor)
        except ValueError:  # examples the anchor cannot score (a label outside the classifier's): shown without it
            anchored = []
        full = anchored[-1][1] if anchored and anchored[-1][0] == len(mem_examples) else None
        anchor_curve = [CurvePoint(n, r.accuracy, 0, len(r.truths)) for n, r in anchored] if curve else []
        out_dir = self.host.scratch_dir()
        stem = f"{name}-{classifier}".replace("/", "_")
        with self.host.directory.open(name) as bank:
            saved["spec"]["last_eval"] = result.to_dict()
            bank.save_classifier(classifier, saved)
        how = "fixed demonstrations" if spec.finder == "none" else f"{spec.shots} found by {spec.finder}"
        return {"result": result,
                "curve": points,
                "majority": majority_accuracy(spec.test),
                "anchor": full,
                "anchor_examples": len(mem_examples),
                "anchor_interval": wilson(round(full.accuracy * len(full.truths)), len(full.truths)) if full else None,
                "anchor_curve": anchor_curve,
                "confusion_png": str(plot_confusion(result, out_dir / f"{stem}-confusion.png")),
                "curve_png": str(plot_curve(points, out_dir / f"{stem}-curve.png",
                                            baseline=majority_accuracy(spec.test),
                                            label=f"LongMem, {how}" + (", calibrated" if spec.calibrate else ""),
                                            anchor=anchor_curve))
                if points else None}

    def classify(self, name: str, classifier: str, texts: list[str], progress=None,
                 settings: dict | None = None) -> list[dict]:
        """Label ``texts``: one row per text with the prediction, its confidence, every label's score and the
        demonstrations it read when they are found per text (``classify.classify_rows``)."""
        texts = [t for t in texts if t and t.strip()]
        if not texts:
            raise InputError("nothing to classify: the text is empty")
        spec, saved = self._spec(name, classifier, settings)
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
