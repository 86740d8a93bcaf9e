"""The ``longmem`` command line: chat about or continue text held in memory, classify, manage banks, benchmark.

    longmem chat --file book.txt          # memorize the book for this run, then ask about it
    longmem chat --bank gatsby            # ... or use a persistent bank (see `longmem bank --help`)
    longmem generate --file book.txt      # continue the book from its end (or --prompt TEXT)
    longmem classify --bank sst2 --text "a gorgeous film"   # many-shot classification with demos in a bank
    longmem bench [--quick]               # speed and memory of LongMem vs the backbone (JSON + markdown)
    longmem eval all --quick              # the paper's evaluation suites (tables, JSON, plots)
    longmem models get qwen2.5-coder-0.5b # a larger reader, fetched on request (--backbone qwen2.5-coder-0.5b)
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import sys
import tempfile
from typing import Iterator

from tqdm import tqdm

from longmem.cli import bank as cli_bank
from longmem.cli import models as cli_models
from longmem.ingest import formats
from longmem.model.cpu import add_runtime_flags, setup_cpu
from longmem.model.device import add_device_flag, resolve_device

PLUGINS = "longmem.commands"  # entry points of commands that live outside the library (the trainer)


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backbone", default="default",
                   help="'default' (embedded SmolLM2-135M-Instruct), a local .gguf file or Hugging Face model dir")
    p.add_argument("--checkpoint", default=None,
                   help="SideNet checkpoint directory (default: the shipped trained SideNet of the backbone, if any)")
    p.add_argument("--untrained", action="store_true", help="use an untrained SideNet (reproduces the backbone)")
    add_runtime_flags(p)
    add_device_flag(p)


def _sampling_args(p: argparse.ArgumentParser, tokens: int = 200, temperature: float = 0.7) -> None:
    p.add_argument("--max-new-tokens", type=int, default=tokens, help=f"tokens to generate at most (default {tokens})")
    p.add_argument("--temperature", type=float, default=temperature,
                   help=f"sampling temperature (0 = greedy; default {temperature:g})")
    p.add_argument("--top-p", type=float, default=0.9, help="nucleus sampling mass")
    p.add_argument("--seed", type=int, default=None, help="random seed for reproducible sampling")


def _load_model(args):
    from longmem.model.longmem import LongMemConfig, LongMemModel

    device = resolve_device(args.device)  # a GPU that is not there fails before anything loads
    setup_cpu(args.threads)
    if args.checkpoint:
        return LongMemModel.load(args.checkpoint, device=device, runtime={"dtype": args.dtype}).eval()
    return LongMemModel.from_config(LongMemConfig(backbone=args.backbone, dtype=args.dtype), device=device,
                                    pretrained=not args.untrained).eval()


def _memory(args, model):
    """The run's memory: a persistent bank's (``--bank``) or an empty one, unbounded either way."""
    if getattr(args, "bank", None):
        from longmem.cli.bank import load_memory
        from longmem.storage import BankDirectory

        with BankDirectory(args.banks_dir).open(args.bank) as bank:
            return load_memory(bank, model)
    return model.new_memory(capacity=None)


def _check_bank(args) -> None:
    """An unknown bank fails before the model loads."""
    if getattr(args, "bank", None):
        from longmem.storage import BankDirectory

        BankDirectory(args.banks_dir).open(args.bank).close()


def _memorize_ids(model, ids, memory) -> int:
    with tqdm(total=ids.shape[1], unit="tok", desc="memorizing", file=sys.stderr) as bar:
        model.memorize(ids, memory, progress=lambda done, _total: bar.update(done - bar.n))
    return ids.shape[1]


def _sampling(args):
    from longmem.model.lm import Sampling
    from longmem.tasks.answer import ANSWER_SAMPLING

    return Sampling(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                    seed=args.seed, backbone_stops=getattr(args, "backbone_stops", "no") == "yes",
                    no_repeat=ANSWER_SAMPLING.no_repeat if args.command == "chat" else 0)


def _stream(model, prompt_ids, memory, sampling) -> None:
    from longmem.text.io import stream_text

    for piece in stream_text(model.backbone.tokenizer, model.generate(prompt_ids, memory, sampling)):
        print(piece, end="", flush=True)
    print()


def _chat_bank(args, model, stack: contextlib.ExitStack, source):
    """The bank a chat reads: ``--bank``, or the file (``source``, read already) ingested into a temporary bank for
    this run; None without either (an empty memory, nothing to read)."""
    from longmem.storage import BankDirectory

    if args.bank:
        return stack.enter_context(BankDirectory(args.banks_dir).open(args.bank))
    if source is not None:
        root = stack.enter_context(tempfile.TemporaryDirectory(prefix="longmem-chat-"))
        bank = stack.enter_context(BankDirectory(root).create("file", model))
        res = cli_bank.ingest_file(bank, model, source)
        print(f"[{res.tokens:,} tokens of {args.file} stored in a temporary bank]", file=sys.stderr)
        return bank
    return None


def _questions(args, echo: bool = True) -> Iterator[str]:
    if args.ask:
        if echo:
            print(f"> {args.ask}")
        yield args.ask
        return
    while True:
        try:
            question = input("> ").strip()
        except (EOFError, KeyboardInterrupt):
            print()
            return
        if question in ("/quit", "/exit"):
            return
        if question:
            yield question


def _chat_setup(args, model, reading):
    """The chat's reading set-up (``tasks.setup``): ``--reader`` (None: the model loaded when ``--checkpoint`` or
    ``--untrained`` is given, else ``readers.default_for`` the loaded backbone); the bank's own model when that is the
    reader named, else the named model's frozen backbone with its own window and settings, memory off, but for what
    the flags turn off."""
    from longmem.tasks.setup import reading_setup

    default = model.config.backbone if args.reader is None and (args.checkpoint or args.untrained) else None
    return reading_setup(model, args.reader, reading, set() if args.abstain == "yes" else {"abstain"}, default)


def _reply_json(reply, reader: str) -> str:
    """One answer as ``--json`` prints it: {"answer", "said", "reader", "memory", "passages"}, each passage read with
    its document, place, text and whether the answer rests on it."""
    import json

    passages = [{"document": c.document, "place": c.place, "text": c.text, "rests": c.rests} for c in reply.citations]
    return json.dumps({"answer": reply.text, "said": reply.said, "reader": reader, "memory": reply.memory,
                       "passages": passages}, ensure_ascii=False)


def cmd_chat(args) -> int:
    from longmem.ingest.readers import open_source
    from longmem.tasks.answer import answer
    from longmem.tasks.chat import Chat
    from longmem.tasks.reading import PassageFinder, Reading

    if args.file and args.bank:
        raise ValueError("give --file or --bank, not both (`longmem bank ingest NAME FILE` adds a file to a bank)")
    if args.json and not args.ask:
        raise ValueError("--json answers one question: give it with --ask")
    reading = Reading(finder=args.finder, passages=args.passages,  # bad settings fail before the model loads
                      **({} if args.abstain == "yes" else {"abstain": 0.0}))
    with contextlib.ExitStack() as stack:
        # the file is read once (within the extraction limits), before the model loads: bad input fails first
        source = stack.enter_context(open_source(args.file)) if args.file else None
        _check_bank(args)
        model = _load_model(args)
        setup = _chat_setup(args, model, reading)
        reader, own, name, reading = setup.lm, setup.own, setup.label, setup.reading
        bank = _chat_bank(args, model, stack, source)
        memory = cli_bank.load_memory(bank, model) if bank is not None else model.new_memory(capacity=None)
        finder = PassageFinder(bank, model, memory) if bank is not None and args.finder != "none" else None
        chat = Chat(reader, memory if own else None, setup.decoding(_sampling(args)))
        if not own and not args.json:
            print(f"[{name} reads the passages found; the bank's memory is not read]", file=sys.stderr)
        for question in _questions(args, echo=not args.json):
            try:
                reply = answer(chat, finder, question, reading, reader=name)
            except ValueError as e:  # a question that cannot be asked: say why and go on
                print(f"error: {e}", file=sys.stderr)
                if args.json:
                    return 2
                continue
            if args.json:
                for _ in reply:
                    pass
                print(_reply_json(reply, name))
                continue
            for piece in reply:
                print(piece, end="", flush=True)
            print()
            for c in reply.citations:
                print(f"  [{c.number}] {c.place}: \u201c{c.quote()}\u201d" + " (the answer rests on this)" * c.rests)
    return 0


def cmd_generate(args) -> int:
    from longmem.text.io import read_text

    if args.file is None and args.prompt is None:
        print("error: give --file and/or --prompt", file=sys.stderr)
        return 2
    text = read_text(args.file) if args.file else None  # bad input fails before the model loads
    _check_bank(args)
    model = _load_model(args)
    memory = _memory(args, model)
    tok = model.backbone.tokenizer
    if args.prompt is not None:
        if text is not None:
            _memorize_ids(model, tok(text, return_tensors="pt").input_ids, memory)
        ids = tok(args.prompt, return_tensors="pt").input_ids
    else:  # continue the file from its end: all but the last half-window goes into memory first
        ids = tok(text, return_tensors="pt").input_ids
        head = max(0, ids.shape[1] - model.segment_len // 2)
        if head:
            _memorize_ids(model, ids[:, :head], memory)
        ids = ids[:, head:]
    if ids.shape[1] == 0:
        print("error: the prompt is empty", file=sys.stderr)
        return 2
    _stream(model, ids, memory, _sampling(args))
    return 0


def cmd_classify(args) -> int:
    from longmem.cli.bank import load_memory
    from longmem.storage import BankDirectory
    from longmem.tasks.classify import Choice, Classifier
    from longmem.tasks.demos import DemoFinder

    texts = args.text or [line.strip() for line in sys.stdin if line.strip()]
    if not texts:
        print("error: give --text (repeatable) or texts on standard input, one per line", file=sys.stderr)
        return 2
    choice = Choice(args.finder, args.shots, args.balance)  # bad settings fail before the model loads
    if args.classifier is not None and args.method != "head":
        print("error: --classifier names a saved classifier for --method head", file=sys.stderr)
        return 2
    with BankDirectory(args.banks_dir).open(args.bank) as bank:
        model = _load_model(args)
        if args.method == "head":
            return _classify_with_head(args, bank, model, texts)
        documents = bank.documents()
        memory = load_memory(bank, model)
        if args.chunk_size and args.chunk_size != memory.chunk_size:
            memory = memory.rechunk(args.chunk_size)
        stored = Classifier.from_documents(model, memory, documents)  # the bank's template and label words
        finder = DemoFinder(bank, model, memory, stored.template, stored.labels) if args.finder != "none" else None
        classifier = Classifier(model, memory, args.template or stored.template, stored.labels,
                                choose=finder.chooser(choice) if finder is not None else None,
                                calibrate=args.calibrate)  # validates the template
        for text in texts:
            scores = classifier.scores(text)
            best = max(scores, key=scores.get)
            confidence = 1 / sum(math.exp(s - scores[best]) for s in scores.values())  # softmax over the labels
            detail = "  ".join(f"{w}={s:.2f}" for w, s in scores.items())
            print(f"{best}\t{confidence:.3f}\t-\t{text}" if not args.verbose else
                  f"{best}\t{confidence:.3f}\t-\t{detail}\t{text}")
            if args.show_demos:
                for demo in classifier.read(text):
                    print(f"  read: {demo}")
    return 0


def _classify_with_head(args, bank, model, texts: list[str]) -> int:
    """``classify --method head``: the head fitted on the bank's examples (``tasks.head.bank_head``, fitted and
    stored with the bank on first use, with a progress bar), one line per text: label, confidence, "sure" or
    "unsure", the text (the in-context method prints "-" in the third column)."""
    from longmem.model.embedder import Embedder, EmbedderError
    from longmem.tasks.head import bank_head

    try:
        embed = Embedder.load().encode
    except EmbedderError as e:
        print(f"note: no sentence embedder ({e}); the head reads the model's state alone", file=sys.stderr)
        embed = None
    bar = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, desc="fitting the head: features of the examples", unit="text", file=sys.stderr)
        bar.update(done - bar.n)

    head, featurizer, fitted = bank_head(bank, model, embed, args.classifier, progress)
    if bar is not None:
        bar.close()
    if fitted:
        print(head.describe(), file=sys.stderr)
    for row in head.rows(featurizer(texts), texts):
        sure = "unsure" if row["unsure"] else "sure"
        detail = "  ".join(f"{w}={row[f'prob_{w}']:.3f}" for w in head.labels)
        print(f"{row['prediction']}\t{row['confidence']:.3f}\t{sure}\t{row['text']}" if not args.verbose else
              f"{row['prediction']}\t{row['confidence']:.3f}\t{sure}\t{detail}\t{row['text']}")
    return 0


def cmd_bench(args, rest: list[str]) -> int:
    from longmem.bench import inference as bench
    bench.main(rest)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from longmem.tasks.answer import ANSWER_SAMPLING
    from longmem.tasks.reading import DEFAULT_FINDER, FINDERS, PASSAGES_READ

    parser = argparse.ArgumentParser(prog="longmem", description="A language model with a long-term memory.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more")
    sub = parser.add_subparsers(dest="command", required=True)

    chat = sub.add_parser("chat", help="ask about a book (a file or a bank): answers read the passages found for "
                                       "each question and cite them")
    chat.add_argument("--file", help=f"a book to read for this run ({formats.listed()})")
    chat.add_argument("--ask", help="ask this one question and exit (non-interactive)")
    chat.add_argument("--finder", "--reading", dest="finder", default=DEFAULT_FINDER, choices=list(FINDERS),
                      help="how the passages an answer reads are found: BM25 over the bank's passages (lexical), "
                           "LongMem's memory retrieval and BM25 fused, memory retrieval alone, BM25 over windows of "
                           "the book's text (windows: how a --reader other than the bank's model reads, whatever "
                           "this says but none), or none (the paper's memory fusion alone); --reading is its old name")
    chat.add_argument("--passages", type=int, default=PASSAGES_READ,
                      help=f"passages an answer reads at most (default {PASSAGES_READ})")
    chat.add_argument("--backbone-stops", default="yes" if ANSWER_SAMPLING.backbone_stops else "no",
                      choices=["yes", "no"],
                      help="end an answer where the frozen backbone would end it (yes), or only where LongMem "
                           "itself emits the end-of-turn token (no)")
    chat.add_argument("--abstain", default="yes", choices=["yes", "no"],
                      help="say that the book does not say when the passages read do not hold the answer's words "
                           "(yes), or show every answer as made (no)")
    chat.add_argument("--reader", default=None,
                      help="the model that reads the passages found and answers: 'auto' (the best installed: "
                           "qwen2.5-coder-1.5b, then qwen2.5-coder-0.5b once fetched with `longmem models get`, else "
                           "'default', the embedded SmolLM2-135M; $LONGMEM_READER overrides), or a name or path as "
                           "--backbone takes it. Another model than the bank's reads with the bank's memory off, no "
                           "re-ingestion needed. Default: the --backbone model when --backbone or --checkpoint is "
                           "given, else auto")
    chat.add_argument("--json", action="store_true",
                      help="with --ask: print one JSON object, {answer, said (false: the book does not say), reader, "
                           "memory (read or not), passages: [{document, place, text}]}")
    _model_args(chat)
    _sampling_args(chat, ANSWER_SAMPLING.max_new_tokens, ANSWER_SAMPLING.temperature)

    gen = sub.add_parser("generate", help="continue a text file from its end, or a prompt with a file in memory")
    gen.add_argument("--file", help="text file (continued from its end unless --prompt is given)")
    gen.add_argument("--prompt", help="text to continue (the --file then only fills memory)")
    _model_args(gen)
    _sampling_args(gen)

    cls = sub.add_parser("classify", help="label texts with the labelled examples stored in a bank: one line per "
                                          "text, tab-separated: label, confidence, sure/unsure (a head; '-' "
                                          "in-context), text")
    cls.add_argument("--bank", required=True, help="bank holding the demonstrations")
    cls.add_argument("--method", default="head", choices=["head", "in-context"],
                     help="head: a head fitted on the bank's examples reads the model's state and the text's "
                          "sentence embedding (fitted and stored with the bank on first use, again when examples "
                          "are added); in-context: the likeliest label word after the demonstrations read in the "
                          "prompt and memory (the paper's; --template, --finder, --shots, --balance, --calibrate, "
                          "--chunk-size and --show-demos apply to it alone)")
    cls.add_argument("--classifier", default=None,
                     help="with head: a classifier saved in the bank (the app's Classify tab), its examples; "
                          "default: the bank's demonstrations (at most 10,000, a seeded sample beyond)")
    cls.add_argument("--text", action="append", help="text to classify (repeatable; default: stdin lines)")
    cls.add_argument("--template", default=None, help="prompt template (default: the demonstrations' own)")
    cls.add_argument("--finder", default="fused", choices=["fused", "memory", "lexical", "none"],
                     help="how the demonstrations read in the prompt are found in the bank for each text: LongMem's "
                          "memory retrieval and BM25 fused, one of them, or none (memory alone, as the paper)")
    cls.add_argument("--shots", type=int, default=20, help="demonstrations found and read in the prompt per text")
    cls.add_argument("--balance", action="store_true", help="take the labels in turn when choosing demonstrations")
    cls.add_argument("--calibrate", action="store_true",
                     help="divide each label's probability by its probability for a content-free input (contextual "
                          "calibration)")
    cls.add_argument("--chunk-size", "--csz", type=int, default=2,
                     help="memory chunk size to retrieve with (the paper's 2 for demonstrations; 0 = the bank's own)")
    cls.add_argument("--show-demos", action="store_true", help="print the demonstrations each prediction read")
    _model_args(cls)
    cli_bank.banks_dir_arg(cls)

    for p in (chat, gen):
        p.add_argument("--bank", default=None, help="persistent memory bank to load (see `longmem bank`)")
        cli_bank.banks_dir_arg(p)
    cli_bank.add_parser(sub, _model_args)
    cli_models.add_parser(sub)

    sub.add_parser("bench", help="benchmark speed and memory (options: longmem bench --help)", add_help=False)
    sub.add_parser("train", help="adaptation training of the SideNet (options: longmem train --help)",
                   add_help=False)
    sub.add_parser("eval", help="the paper's evaluation suites vs the baselines (longmem eval --help)",
                   add_help=False)
    return parser


def plugin(name: str):
    """The command ``name`` an installed package registers under the ``longmem.commands`` entry points: ``longmem
    train`` runs the trainer (``training``, a script beside the library) without the library importing it."""
    from importlib.metadata import entry_points

    found = list(entry_points(group=PLUGINS, name=name))
    if not found:
        raise SystemExit(f"longmem {name}: no such command is installed (entry point group {PLUGINS!r}; "
                         "`pip install -e .` in the checkout registers the trainer)")
    return found[0].load()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    if args.command == "bench":
        return cmd_bench(args, rest)
    if args.command == "train":
        return plugin("train")(rest)
    if args.command == "eval":
        from longmem.cli.eval import main as eval_main

        return eval_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    from longmem.model.backbone import BackboneError
    from longmem.model.longmem import CheckpointError
    from longmem.storage import BankError
    from longmem.text.io import InputError

    try:
        if args.command == "bank":
            return cli_bank.run(args, _load_model)
        if args.command == "models":
            return cli_models.run(args)
        return {"chat": cmd_chat, "generate": cmd_generate, "classify": cmd_classify}[args.command](args)
    except (InputError, BackboneError, CheckpointError, BankError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: what was stored stays (an ingestion resumes), a text extraction is ended
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
