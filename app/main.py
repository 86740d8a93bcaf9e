"""``python app.py``: start the LongMem web app on this machine (offline, bound to 127.0.0.1 by default).

    python app.py                         # the embedded default backbone with its shipped SideNet; opens a browser
    python app.py --port 7861 --no-browser --banks-dir ./banks --auth me:secret
    python app.py --backbone ./my-hf-model --checkpoint ./my-sidenet
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from longmem.ingest.limits import ExtractLimits

log = logging.getLogger("longmem.app")


def build_parser() -> argparse.ArgumentParser:
    from longmem.model.cpu import add_runtime_flags
    from longmem.model.device import add_device_flag

    p = argparse.ArgumentParser(prog="python app.py", description="The LongMem web app (Gradio, local, offline).")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 to let other machines in)")
    p.add_argument("--port", type=int, default=7860, help="port to listen on")
    p.add_argument("--banks-dir", default=None,
                   help="directory holding the memory banks (default: $LONGMEM_BANKS_DIR, else the user data dir)")
    p.add_argument("--no-browser", action="store_true", help="do not open a browser tab")
    p.add_argument("--auth", default=None, help="require a login, given as user:password")
    p.add_argument("--backbone", default="default",
                   help="'default' (embedded SmolLM2-135M-Instruct), a local .gguf file or Hugging Face model dir")
    p.add_argument("--checkpoint", default=None, help="SideNet checkpoint directory (default: the shipped one)")
    p.add_argument("--untrained", action="store_true", help="use an untrained SideNet (reproduces the backbone)")
    p.add_argument("--reader", default=None,
                   help="the model Chat answers with unless the tab is told another: 'auto' (the best installed: "
                        "qwen2.5-coder-1.5b, then qwen2.5-coder-0.5b once fetched, else the embedded 135M; "
                        "$LONGMEM_READER overrides), 'default' (the embedded SmolLM2-135M), or a name or path as "
                        "--backbone takes it. Another model than the bank's reads with the bank's memory off. "
                        "Default: the --backbone model when one is given, else auto")
    p.add_argument("--max-upload-mb", type=int, default=512, help="largest file accepted for upload, in MiB")
    ExtractLimits.add_arguments(p)  # what an upload may expand to: --max-chars, --max-unzipped-mb, ...
    add_runtime_flags(p)
    add_device_flag(p)
    return p


def parse_auth(text: str | None) -> tuple[str, str] | None:
    if text is None:
        return None
    user, sep, password = text.partition(":")
    if not sep or not user or not password:
        raise SystemExit("error: --auth expects user:password")
    return user, password


def make_workspace(args):
    """The model (loaded once, shared by every visitor) and the banks directory."""
    from longmem.model.cpu import setup_cpu
    from longmem.model.device import resolve_device
    from longmem.model.longmem import LongMemConfig, LongMemModel
    from longmem.service.workspace import Workspace
    from longmem.storage import BankDirectory

    device = resolve_device(args.device)  # a GPU that is not there fails before anything loads
    setup_cpu(args.threads)
    if args.checkpoint:
        from longmem.model.backbone import load_backbone

        model = LongMemModel.load(args.checkpoint, load_backbone(args.backbone, args.dtype, device), device)
    else:
        model = LongMemModel.from_config(LongMemConfig(backbone=args.backbone, dtype=args.dtype), device=device,
                                         pretrained=not args.untrained)
    return Workspace(model, BankDirectory(args.banks_dir), max_upload_bytes=args.max_upload_mb * 2**20,
                     checkpoint=args.checkpoint, limits=ExtractLimits.from_args(args), dtype=args.dtype,
                     reader=args.reader)


def launch(ws, args, block: bool = True):
    """Build the page for ``ws`` and serve it; returns the Gradio app (running in the background if not block)."""
    from .ui import CSS, build_app

    demo = build_app(ws)
    demo.queue(default_concurrency_limit=4, max_size=64)
    demo.launch(server_name=args.host, server_port=args.port, inbrowser=not args.no_browser,
                auth=parse_auth(args.auth), max_file_size=f"{args.max_upload_mb}mb", show_error=True, quiet=True,
                prevent_thread_lock=not block, css=CSS, footer_links=[])
    return demo


def main(argv: list[str] | None = None) -> int:
    t0 = time.perf_counter()
    args = build_parser().parse_args(argv)
    parse_auth(args.auth)  # a bad flag fails before the model loads
    from longmem.text.io import InputError

    try:
        ExtractLimits.from_args(args)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # offline: no telemetry calls
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "faiss.loader", "urllib3"):  # request lines and faiss's CPU-feature probing
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from longmem.model.backbone import BackboneError
    from longmem.model.device import DeviceError
    from longmem.model.longmem import CheckpointError

    try:
        ws = make_workspace(args)
        reader = ws.load_reader()  # before the page opens, not at the first question
    except (BackboneError, CheckpointError, DeviceError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    logging.getLogger("longmem.app").info("Chat answers with %s unless told another", reader)
    demo = launch(ws, args, block=False)
    print(f"LongMem is ready at http://{args.host}:{args.port} ({time.perf_counter() - t0:.1f} s after start; "
          "Ctrl-C to stop)", flush=True)
    try:
        demo.block_thread()
    except KeyboardInterrupt:
        pass
    finally:
        ws.close()
    return 0
