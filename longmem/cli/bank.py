"""``longmem bank ...``: persistent memory banks from the command line (a thin layer over ``storage`` and ``ingest``).

    longmem bank create gatsby                       # an empty bank for the default model
    longmem bank ingest gatsby book.epub notes.md    # read files into it (resumes an interrupted run)
    longmem bank ingest sst2 train.tsv --create --text-column sentence --label-words 0=negative,1=positive
    longmem bank list | info NAME | verify NAME | rebuild-index NAME | rename OLD NEW | delete NAME [--document ID]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm import tqdm

from longmem.ingest import formats
from longmem.ingest.limits import ExtractLimits
from longmem.storage import Bank, BankDirectory, BankError
from longmem.text.io import InputError


def banks_dir_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--banks-dir", default=None,
                   help="directory holding the banks (default: $LONGMEM_BANKS_DIR, else the user data dir)")


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _pairs(text: str | None, flag: str) -> dict[str, str] | None:
    if text is None:
        return None
    out = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise InputError(f"{flag} expects VALUE=WORD pairs like 0=negative,1=positive; "
                                             f"got {item!r}")
        out[key.strip()] = value.strip()
    return out


def _list(text: str | None) -> list[str] | None:
    return None if text is None else [x.strip() for x in text.split(",") if x.strip()]


def load_memory(bank: Bank, model):
    """The bank's memory in RAM (checked against the model), with a progress bar for banks that take over half a
    second to load (a quick one prints no bar)."""
    with (tqdm(unit="chunk", unit_scale=True, desc=f"loading {bank.name}", file=sys.stderr, leave=False,
               delay=0.5) as bar,
          tqdm(unit="segment", desc=f"moving {bank.name}'s keys/values into files", file=sys.stderr, leave=False,
               delay=0.5) as moved):
        def update(done, total, bar=bar):
            bar.total = total
            bar.update(done - bar.n)
        memory = bank.load_memory(model, progress=update, moving=lambda d, t: update(d, t, moved))
    print(f"[bank {bank.name}: {len(memory):,} tokens in memory]", file=sys.stderr)
    return memory


def ingest_file(bank: Bank, model, path, demos=None, title: str | None = None, compile: bool = False):
    """``ingest`` (of a path, or of a ``readers.Source`` already open) with a progress bar (bytes, tokens stored)
    named after the file; ``compile`` as ``ingest``'s."""
    from longmem.ingest.pipeline import ingest
    from longmem.ingest.readers import Source

    name = path.name if isinstance(path, Source) else Path(path).name
    with tqdm(unit="B", unit_scale=True, desc=name, file=sys.stderr) as bar:
        def update(done, total, tokens):
            bar.total = total
            bar.set_postfix(tokens=f"{tokens:,}", refresh=False)
            bar.update(done - bar.n)
        return ingest(bank, model, path, demos=demos, title=title, progress=update, compile=compile)


# -- commands ------------------------------------------------------------------------------------------------------

def cmd_create(args, load_model) -> int:
    directory = BankDirectory(args.banks_dir)
    directory.path(args.name)  # a bad name fails before the model loads
    bank = directory.create(args.name, load_model(args), kv_dtype=args.kv_dtype)
    print(f"created bank {bank.name!r} in {bank.path}")
    bank.close()
    return 0


def cmd_ingest(args, load_model) -> int:
    from longmem.ingest.readers import DemoFormat, open_source

    demos = None
    if any(v is not None for v in (args.template, args.label_words, args.labels, args.text_column,
                                   args.label_column, args.columns)):
        demos = DemoFormat(**{k: v for k, v in dict(
            template=args.template, label_words=_pairs(args.label_words, "--label-words"), labels=_list(args.labels),
            text_column=args.text_column, label_column=args.label_column, columns=_list(args.columns)).items()
            if v is not None})
    if args.compile:  # refused before any file is read or any bank is made
        from longmem.model.backbone import check_compiler
        from longmem.model.device import resolve_device

        check_compiler(resolve_device(args.device))
    limits = ExtractLimits.from_args(args)
    sources = []
    try:
        for f in args.files:  # every file is read (once: ingest takes its text from here) before the model loads
            sources.append(open_source(f, demos if str(f).lower().endswith(formats.DEMO_SUFFIXES) else None, limits))
        directory = BankDirectory(args.banks_dir)
        if not directory.exists(args.name) and not args.create:
            directory.open(args.name)  # raises UnknownBank with the list of banks
        model = load_model(args)
        if directory.exists(args.name):
            bank = directory.open(args.name)
        else:
            bank = directory.create(args.name, model, args.kv_dtype)
        with bank:
            for f, source in zip(args.files, sources):
                _ingest_one(bank, model, f, source, demos if source.kind == "demos" else None, args.title,
                            args.compile)
    finally:
        for source in sources:
            source.close()
    return 0


def _ingest_one(bank: Bank, model, f: str, source, demos, title: str | None, compile: bool = False) -> None:
    res = ingest_file(bank, model, source, demos=demos, title=title, compile=compile)
    doc = res.document
    if res.action == "skipped":
        print(f"{f}: already in bank {bank.name!r} as document {doc.id} ({doc.title}); skipped")
    else:
        print(f"{f}: {res.action} as document {doc.id} ({doc.title}): {res.tokens:,} tokens in "
              f"{res.seconds:.1f} s ({res.tokens_per_s:,.0f} tok/s)")


def cmd_list(args) -> int:
    directory = BankDirectory(args.banks_dir)
    names = directory.names()
    if not names:
        print(f"no banks in {directory.root}")
        return 0
    print(f"{'bank':24} {'documents':>9} {'tokens':>12} {'disk':>12}  backbone")
    for name in names:
        try:
            with directory.open(name) as bank:
                s = bank.stats()
                print(f"{name:24} {s['documents']:>9} {s['tokens']:>12,} {_mib(s['disk_bytes']):>12}  "
                      f"{bank.info.backbone_name}")
        except BankError as e:  # one damaged bank does not hide the others
            print(f"{name:24} unreadable: {e}")
    return 0


def cmd_info(args) -> int:
    with BankDirectory(args.banks_dir).open(args.name) as bank:
        info, s = bank.info, bank.stats()
        print(f"bank {bank.name} ({bank.path})")
        print(f"  backbone {info.backbone_name} (sha256 {info.backbone_sha256[:16]}…), layer {info.cached_layer}, "
              f"{info.n_kv_heads} KV heads x {info.head_dim}, chunks of {info.chunk_size}, segments of "
              f"{info.segment_len}, K/V {info.kv_dtype}")
        print(f"  {s['tokens']:,} tokens in {s['segments']:,} segments; K/V {_mib(s['kv_bytes'])}, disk "
              f"{_mib(s['disk_bytes'])}; created {info.created}, updated {info.updated}")
        for d in bank.documents():
            extra = f", {d.meta['n_examples']} demonstrations {d.meta['label_counts']}" if d.kind == "demos" else ""
            print(f"  [{d.id}] {d.title} ({d.source}, {d.kind}): {d.n_tokens:,} tokens, {d.status}{extra}")
    return 0


def cmd_verify(args) -> int:
    with BankDirectory(args.banks_dir).open(args.name) as bank:
        report = bank.verify()
    for note in report.notes:
        print(f"note: {note}")
    for problem in report.problems:
        print(f"PROBLEM: {problem}")
    print(f"bank {args.name}: {'ok' if report.ok else 'damaged'}")
    return 0 if report.ok else 1


def cmd_rebuild_index(args) -> int:
    with BankDirectory(args.banks_dir).open(args.name) as bank:
        done = bank.sync_index(rebuild=True)
        passages = bank.rebuild_passages()
    print(f"bank {args.name}: index files rebuilt from the bank's keys ({done['chunks']:,} chunks per head); "
          f"passages cut again from the stored text ({passages:,}) with their full-text index")
    return 0


def cmd_rename(args) -> int:
    BankDirectory(args.banks_dir).rename(args.old, args.new)
    print(f"renamed bank {args.old!r} to {args.new!r}")
    return 0


def cmd_delete(args) -> int:
    directory = BankDirectory(args.banks_dir)
    with directory.open(args.name) as bank:
        if args.document is not None:
            what = f"document {args.document} ({bank.document(args.document).title}) from bank {args.name!r}"
        else:
            s = bank.stats()
            what = f"bank {args.name!r} ({s['documents']} documents, {s['tokens']:,} tokens)"
        if not args.yes:
            if not sys.stdin.isatty():
                print(f"error: refusing to delete {what} without --yes", file=sys.stderr)
                return 2
            if input(f"delete {what}? [y/N] ").strip().lower() not in ("y", "yes"):
                print("nothing deleted")
                return 1
        if args.document is not None:
            bank.delete_document(args.document)
    if args.document is None:
        directory.delete(args.name)
    print(f"deleted {what}")
    return 0


def add_parser(sub, model_args) -> None:
    """The ``bank`` command group; ``model_args`` adds the model options to commands that need the model."""
    bank = sub.add_parser("bank", help="persistent memory banks: create, ingest, list, info, verify, ...")
    cmds = bank.add_subparsers(dest="bank_command", required=True)

    p = cmds.add_parser("create", help="create an empty bank for a model")
    p.add_argument("name", help="bank name (letters, digits, '.', '_', '-')")
    p.add_argument("--kv-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"],
                   help="storage dtype of the keys/values (bfloat16 halves disk and RAM)")
    model_args(p)
    banks_dir_arg(p)

    p = cmds.add_parser("ingest", help=f"read files into a bank ({formats.listed()}; "
                                        f"{formats.listed(labelled=True)} demonstrations)")
    p.add_argument("name", help="bank name")
    p.add_argument("files", nargs="+", help="files to ingest; an interrupted ingestion of a file resumes")
    p.add_argument("--create", action="store_true", help="create the bank if it does not exist")
    p.add_argument("--kv-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"],
                   help="with --create: storage dtype of the keys/values")
    p.add_argument("--title", default=None, help="document title (default: from the file)")
    p.add_argument("--compile", action="store_true",
                   help="run the backbone's layers compiled (torch.compile; needs g++): faster on long books after "
                        "seconds of compiling, the keys and values stored equal within rounding")
    g = p.add_argument_group(f"demonstrations ({formats.listed(labelled=True)})")
    g.add_argument("--template", default=None, help="one demonstration (default 'Review: {text} Sentiment: {label}')")
    g.add_argument("--label-words", default=None, help="label value -> word, e.g. 0=negative,1=positive")
    g.add_argument("--labels", default=None, help="allowed label values, comma-separated (default: any, or the "
                                                  "keys of --label-words)")
    g.add_argument("--text-column", default=None, help="column or JSON key with the text (default 'text')")
    g.add_argument("--label-column", default=None, help="column or JSON key with the label (default 'label')")
    g.add_argument("--columns", default=None, help="column names of a header-less CSV, e.g. label,text")
    ExtractLimits.add_arguments(p)
    model_args(p)
    banks_dir_arg(p)

    p = cmds.add_parser("list", help="list the banks")
    banks_dir_arg(p)
    p = cmds.add_parser("info", help="a bank's metadata and documents")
    p.add_argument("name")
    banks_dir_arg(p)
    p = cmds.add_parser("verify", help="check a bank's SQLite data, K/V files and index files (repairs the index "
                                       "files)")
    p.add_argument("name")
    banks_dir_arg(p)
    p = cmds.add_parser("rebuild-index",
                        help="rebuild a bank's faiss index files (from its keys) and its passages' full-text index")
    p.add_argument("name")
    banks_dir_arg(p)
    p = cmds.add_parser("rename", help="rename a bank")
    p.add_argument("old")
    p.add_argument("new")
    banks_dir_arg(p)
    p = cmds.add_parser("delete", help="delete a bank, or one document of it")
    p.add_argument("name")
    p.add_argument("--document", type=int, default=None, help="delete only this document (id from `bank info`)")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    banks_dir_arg(p)


def run(args, load_model) -> int:
    commands = {"create": cmd_create, "ingest": cmd_ingest}
    if args.bank_command in commands:
        return commands[args.bank_command](args, load_model)
    return {"list": cmd_list, "info": cmd_info, "verify": cmd_verify, "rebuild-index": cmd_rebuild_index,
            "rename": cmd_rename, "delete": cmd_delete}[args.bank_command](args)
