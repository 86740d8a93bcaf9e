"""Classify tab: the many-shot classifier builder. Upload labelled examples, map columns, choose a template (the
paper's presets or your own), how the classifier decides (a head fitted on the examples, or the paper's in-context
learning: how many demonstrations the prompt reads, found for each text in the bank or fixed) and how many examples
go into memory; see the head's cross-validated accuracy, unsure threshold and possible label errors; evaluate on a
held-out split (accuracy beside embeddings + logistic regression, per-label precision/recall, confusion matrix,
accuracy vs examples with 95% intervals); classify texts (with a confidence, or the demonstrations each read) or a
whole file. Classifiers are saved in their bank and reopen with it."""

from __future__ import annotations

import math
from pathlib import Path

import gradio as gr

from longmem.service import PRESETS, DemoFormat, Workspace, peek_columns

from .banks_tab import jobs_html
from .common import DEMO_TYPES, file_paths, notice_box, parse_label_words, reported, wire
from .shared import Shared

CUSTOM = "Custom"
FINDERS = [("the most similar ones in the bank (meaning and words)", "fused"),
           ("the most similar in memory", "memory"), ("those sharing the most words", "lexical"),
           ("the same fixed ones for every text (as in the paper)", "none")]
METHOD_CHOICES = [("a head fitted on the examples (recommended)", "head"),
                  ("the model reads label words after examples (the paper's in-context learning)", "in-context")]
SAMPLE = Path(__file__).parent / "samples" / "reviews.csv"  # 400 restaurant reviews made for the project (MIT)
SAMPLE_SPLIT = {"n_context": 8, "n_memory": 332, "n_test": 60}  # the whole sample: 8 + 332 + 60 = 400 rows
HIDDEN = gr.update(visible=False)


def preset_choices() -> list[tuple[str, str]]:
    """The templates a classifier can start from, named by their labels ("positive, negative (SST-2)")."""
    return [("my own template", CUSTOM)] + [(f"{', '.join(p.label_words.values())} ({k})", k)
                                             for k, p in PRESETS.items()]


def build(ws: Workspace, shared: Shared) -> None:
    gr.Markdown("Build a classifier from labelled examples: they go into memory, and a head fitted on them decides "
                "from what the model computes for each text (or, as in the paper, the model reads a few examples "
                "with each text). No file at hand? Try the sample: 400 short restaurant reviews, positive or "
                "negative.")
    sample = gr.Button(f"Build a sample classifier ({SAMPLE_SPLIT['n_memory'] + SAMPLE_SPLIT['n_context']} reviews "
                       f"to learn from, {SAMPLE_SPLIT['n_test']} to test on)", elem_id="classify-sample")
    with gr.Row():
        bank = gr.Dropdown(label="Bank for the examples (a new name creates it)", choices=[],
                           allow_custom_value=True, elem_id="classify-bank")
        shared.remember(bank, "classify")
        name = gr.Textbox(label="Classifier name", value="sentiment", elem_id="classifier-name")
    with gr.Row():
        upload = gr.File(label=f"Labelled examples ({' '.join(DEMO_TYPES)})", file_types=DEMO_TYPES,
                         elem_id="classify-upload")
        header = gr.Checkbox(label="First row is a header", value=True)
    preview = gr.Dataframe(label="First rows", interactive=False, wrap=True, max_height=260, visible=False,
                           elem_id="classify-preview")
    with gr.Row():
        text_col = gr.Dropdown(label="Text column", choices=[], allow_custom_value=True, elem_id="text-column")
        label_col = gr.Dropdown(label="Label column", choices=[], allow_custom_value=True, elem_id="label-column")
    with gr.Row():
        preset = gr.Dropdown(label="Start from a template", choices=preset_choices(), value="SST-2",
                             info="the paper's templates (appendix D), by their labels")
        template = gr.Textbox(label="Template: how one example reads ({text} and {label})",
                              value=PRESETS["SST-2"].template, elem_id="template")
        words = gr.Textbox(label="Label words (value=word, comma-separated; empty: labels as written)",
                           value=_words(PRESETS["SST-2"].label_words), elem_id="label-words")
    with gr.Row():
        method = gr.Dropdown(label="How it decides", choices=METHOD_CHOICES, value="head", elem_id="classify-method",
                             info="a head reads what the model computes for each text, fitted on the examples in "
                                  "memory; in-context, the model reads examples before each text")
        n_context = gr.Slider(0, 32, value=20, step=1, label="Examples the model reads with each text (in-context)",
                              elem_id="n-context")
        finder = gr.Dropdown(label="Which ones", choices=FINDERS, value="fused", elem_id="demo-finder")
        n_memory = gr.Number(label="Examples kept in memory", value=2000, precision=0, elem_id="n-memory")
        n_test = gr.Number(label="Examples held out to measure accuracy", value=100, precision=0, elem_id="n-test")
    with gr.Accordion("Advanced", open=False):
        with gr.Row():
            balance = gr.Checkbox(label="Read as many examples of each label", value=False)
            calibrate = gr.Checkbox(label="Correct for a bias toward some labels", value=False,
                                    info="divides each label's probability by its probability for an empty text")
            seed = gr.Number(label="Seed (which examples go where)", value=0, precision=0)
            sizes = [d for d in range(ws.model.chunk_size, 0, -1) if ws.model.chunk_size % d == 0]
            chunk_size = gr.Dropdown(choices=sizes, value=2 if 2 in sizes else sizes[0],
                                     label="Memory piece size (chunk size, tokens)", info="2 suits short labels")
    build_btn = gr.Button("Build classifier", variant="primary", elem_id="build-classifier")
    notice = notice_box("classify-notice")
    status = gr.Markdown(elem_id="build-status")
    progress = gr.HTML()

    gr.Markdown("### Evaluate and use")
    with gr.Row():
        saved = gr.Dropdown(label="Saved classifier", choices=[], allow_custom_value=True, elem_id="saved-classifier")
        refresh = gr.Button("Refresh list")
        curve = gr.Checkbox(label="Also plot accuracy against the examples in memory", value=True)
        evaluate = gr.Button("Evaluate on the held-out examples", elem_id="evaluate")
    summary = gr.Markdown(elem_id="eval-summary")
    suspects = gr.Dataframe(headers=["text", "labelled", "the head says", "probability of its label"],
                            interactive=False, wrap=True, max_height=300, visible=False, elem_id="label-suspects",
                            label="Possible label errors: examples whose label the head, fitted without them, doubts")
    per_label = gr.Dataframe(headers=["label", "precision", "recall", "f1", "support"], interactive=False,
                             label="Per label", visible=False, elem_id="per-label")
    with gr.Row():
        confusion = gr.Image(label="Confusion matrix", type="filepath", show_label=False, visible=False)
        curve_img = gr.Image(label="Accuracy vs examples in memory", type="filepath", show_label=False,
                             visible=False)
    with gr.Row():
        text = gr.Textbox(label="Text to classify", scale=4, elem_id="classify-text")
        one = gr.Button("Classify", scale=1, elem_id="classify-one")
    label = gr.Label(label="Prediction", elem_id="prediction", visible=False)
    read = gr.Markdown(elem_id="demos-read")
    with gr.Row():
        batch = gr.File(label=f"File to classify ({' '.join(DEMO_TYPES)}, or .txt with one text per line)",
                        file_types=[*DEMO_TYPES, ".txt"])
        batch_col = gr.Textbox(label="Its text column", value="text")
        run_batch = gr.Button("Classify file")
    results = gr.File(label="Results (CSV)", elem_id="classify-results", visible=False)
    timer = gr.Timer(1.0)

    # -- handlers -------------------------------------------------------------------------------------------------
    def on_upload(files, has_header):
        paths = file_paths(files)
        if not paths:
            return HIDDEN, gr.update(choices=[]), gr.update(choices=[])
        columns, rows = peek_columns(paths[0], has_header)
        guess = lambda *names: next((c for c in columns if c.lower() in names), None)  # noqa: E731
        t = guess("text", "sentence", "review") or (columns[-1] if columns else None)
        lab = guess("label", "labels", "class", "y") or (columns[0] if columns else None)
        return (gr.update(value={"headers": columns, "data": rows}, visible=True), gr.update(choices=columns, value=t),
                gr.update(choices=columns, value=lab))

    def on_preset(p):
        if p not in PRESETS:
            return gr.skip(), gr.skip()
        return PRESETS[p].template, _words(PRESETS[p].label_words)

    def do_build(bank_name, clf, files, has_header, tcol, lcol, tmpl, wordmap, k, m, t, s, size, how, bal, cal,
                 way="head"):
        paths = file_paths(files)
        if not paths:
            raise ValueError("upload a CSV/TSV/JSONL file of labelled examples first")
        if not bank_name or not bank_name.strip():
            raise ValueError("choose a bank, or type a new bank name")
        columns = None if has_header else peek_columns(paths[0], False)[0]
        fmt = DemoFormat(template=tmpl, label_words=parse_label_words(wordmap), text_column=tcol or "text",
                         label_column=lcol or "label", columns=columns)
        job = ws.classifiers.build(bank_name.strip(), clf, paths[0], fmt, int(k), int(m), int(t), int(s), int(size),
                                   finder=how, balance=bool(bal), calibrate=bool(cal), method=way or "head")
        fitted = " and its head fitted on them" if (way or "head") == "head" else ""
        return (f"Building {clf!r}: the examples are being written into memory{fitted} (job {job}). When it is "
                "done, it appears under Saved classifier below."), shared.bump()

    def sample_form():
        """The form filled in for the sample file (a new bank of its own), ready to build."""
        bank_name = ws.directory.free_name("sample-reviews")
        columns, rows = peek_columns(str(SAMPLE), True)
        return (bank_name, "restaurant-reviews", str(SAMPLE), gr.update(value={"headers": columns, "data": rows},
                                                                          visible=True),
                gr.update(choices=columns, value="text"), gr.update(choices=columns, value="label"), CUSTOM,
                "Review: {text} Sentiment: {label}", "", SAMPLE_SPLIT["n_context"], SAMPLE_SPLIT["n_memory"],
                SAMPLE_SPLIT["n_test"])

    def list_saved(bank_name):
        names = ws.classifiers.names(bank_name) if bank_name and ws.directory.exists(bank_name) else []
        return gr.update(choices=names, value=names[0] if names else None)

    def do_evaluate(bank_name, clf, with_curve, progress=gr.Progress()):
        if not bank_name or not clf:
            raise ValueError("pick a bank and one of its saved classifiers")
        out = ws.classifiers.evaluate(bank_name, clf, with_curve,
                                     progress=lambda d, n: progress(d / max(n, 1), desc="evaluating"))
        r = out["result"]
        lines = [f"**Accuracy {100 * r.accuracy:.1f}%** on {len(r.predictions)} held-out examples "
                 f"(always answering the most common label: {100 * out['majority']:.1f}%; macro F1 "
                 f"{r.macro_f1:.3f})." if out["held_out"] else
                 "No examples were held out: the per-label figures and the confusion matrix below are the head's, "
                 f"cross-validated on its examples (always answering the most common label: "
                 f"{100 * out['majority']:.1f}%)."]
        h = out["head"]
        if h is not None:
            low, high = h["cv_interval"]
            sure = (f"answers below {100 * h['unsure_below']:.0f}% confidence are marked unsure (those above were "
                    f"right at least {100 * h['unsure_target']:.0f}% of the time): "
                    f"{100 * h['sure_share']:.0f}% of the examples were answered sure, and right "
                    f"{100 * h['sure_accuracy']:.0f}% of the time" if h["sure_accuracy"] is not None
                    else f"no confidence is right {100 * h['unsure_target']:.0f}% of the time, so every answer is "
                         "marked unsure")
            lines.append(f"Cross-validated on its {h['examples']:,} examples ({h['folds']} folds): "
                         f"**{100 * h['cv_accuracy']:.1f}%** ({100 * low:.0f}-{100 * high:.0f}; macro F1 "
                         f"{h['cv_macro_f1']:.3f}); {sure}. Possible label errors: {h['suspects']}.")
        a = out["anchor"]
        if a is not None:
            low, high = out["anchor_interval"]
            lines.append(f"What you could build instead from the same {out['anchor_examples']:,} examples, sentence "
                         f"embeddings + logistic regression: **{100 * a.accuracy:.1f}%** ({100 * low:.0f}-"
                         f"{100 * high:.0f}; macro F1 {a.macro_f1:.3f}).")
        if out["curve"]:
            lines.append("Accuracy by examples in memory (95% interval): " + ", ".join(
                f"{p.n_memory:,} → {100 * p.accuracy:.1f}% ({100 * p.interval[0]:.0f}-{100 * p.interval[1]:.0f})"
                for p in out["curve"]))
        table = [[w, round(m.precision, 3), round(m.recall, 3), round(m.f1, 3), m.support]
                 for w, m in r.per_label.items()]
        shown = lambda v: gr.update(value=v, visible=v is not None)  # noqa: E731
        doubts = [[d["text"], d["label"], d["predicted"], round(d["p_label"], 3)] for d in out["suspects"]]
        return ("\n\n".join(lines), shown(table), shown(out["confusion_png"]), shown(out["curve_png"]),
                shown(doubts or None))

    def do_one(bank_name, clf, t, progress=gr.Progress()):
        if not bank_name or not clf:
            raise ValueError("pick a bank and one of its saved classifiers")
        [row] = ws.classifiers.classify(bank_name, clf, [t],  # the first use of an old classifier fits its head
                                        progress=lambda d, n: progress(d / max(n, 1), desc="classifying"))
        if row["error"]:
            raise ValueError(row["error"])
        probs = {k[len("prob_"):]: v for k, v in row.items() if k.startswith("prob_")}
        if probs:  # a head's answer
            how = ("marked **unsure**: below the head's unsure threshold (the evaluation says where it lies and how "
                   "often the answers above it were right)") if row["unsure"] else "sure"
            return gr.update(value=probs, visible=True), f"Confidence {100 * row['confidence']:.0f}%, {how}."
        scores = {k[len("score_"):]: v for k, v in row.items() if k.startswith("score_")}
        top = max(scores.values())
        z = sum(math.exp(v - top) for v in scores.values())
        demos = row["read"].split("\n") if row["read"] else []
        shown = (f"**Read {len(demos)} examples found in the bank** (closest last):\n\n"
                 + "\n".join(f"{i}. {_escape(d)}" for i, d in enumerate(demos, 1))) if demos else \
            "The prompt read the classifier's fixed examples."
        return gr.update(value={w: math.exp(v - top) / z for w, v in scores.items()}, visible=True), shown

    def do_batch(bank_name, clf, files, col, progress=gr.Progress()):
        paths = file_paths(files)
        if not bank_name or not clf or not paths:
            raise ValueError("pick a bank, a saved classifier and a file to classify")
        out = ws.classifiers.classify_file(bank_name, clf, paths[0], (col or "text").strip(),
                                           progress=lambda d, n: progress(d / max(n, 1), desc="classifying"))
        return gr.update(value=str(out), visible=True)

    def poll(was: bool, bank_name):
        """While a job runs, show its progress; when it has just finished, show the outcome and the saved list."""
        running = any(j.active for j in ws.jobs.list())
        if running or was:
            finished = was and not running
            return jobs_html(ws), list_saved(bank_name) if finished else gr.skip(), running
        return gr.skip(), gr.skip(), False

    build_inputs = [bank, name, upload, header, text_col, label_col, template, words, n_context, n_memory, n_test,
                    seed, chunk_size, finder, balance, calibrate, method]
    wire(upload.change, on_upload, [upload, header], [preview, text_col, label_col], notice, api_name="preview")
    wire(header.change, on_upload, [upload, header], [preview, text_col, label_col], notice)
    preset.change(on_preset, [preset], [template, words], api_name="preset")
    wire(build_btn.click, do_build, build_inputs, [status, shared.version], notice, api_name="build_classifier")
    filled = wire(sample.click, sample_form, None, [bank, name, upload, preview, text_col, label_col, preset,
                                                    template, words, n_context, n_memory, n_test], notice)
    filled.then(reported(do_build, 2), build_inputs, [notice, status, shared.version], api_visibility="private")
    wire(bank.change, list_saved, [bank], [saved], notice)
    wire(refresh.click, list_saved, [bank], [saved], notice, api_name="classifiers")
    wire(evaluate.click, do_evaluate, [bank, saved, curve], [summary, per_label, confusion, curve_img, suspects],
         notice,
         concurrency_id="model", concurrency_limit=1, api_name="evaluate")
    for event, api in ((one.click, "classify"), (text.submit, None)):
        wire(event, do_one, [bank, saved, text], [label, read], notice, concurrency_id="model", concurrency_limit=1,
             api_name=api)
    wire(run_batch.click, do_batch, [bank, saved, batch, batch_col], [results], notice, concurrency_id="model",
         concurrency_limit=1, api_name="classify_file")
    was_running = gr.State(False)
    timer.tick(poll, [was_running, bank], [progress, saved, was_running], show_progress="hidden", queue=False,
               api_visibility="private")


def _escape(text: str) -> str:
    """A demonstration as literal Markdown text (its own asterisks, brackets ... shown, not rendered)."""
    return "".join("\\" + c if c in "\\`*_{}[]()#+-.!|<>" else c for c in text)


def _words(mapping: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in mapping.items())

