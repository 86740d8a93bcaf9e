"""Retrieval probe: does a question's query find its fact among the memory chunks? No training needed to ask.

A study (``training.studies``: it ships nothing). It chose the backbone layer cached in memory (retrieval alone
favours layer 20, the default; the heads that copy a fact are layer 18's 6 and 7, so runs since ``smol-l18`` cache
layer 18), that the memory search leaves out attention-sink chunks (``LongMemConfig.max_sinks`` = 0), and, from
``--answers`` and ``--values``, that training names come from no list and book text is quoted back
(``--quote-docs``). Figures: ``docs/runs/probe/`` (its README, the JSON files and their tables), ``docs/design.md``
("Memory skips attention-sink chunks"), ``docs/guide.md`` ("Three decisions rest on ...").

    python -m training.studies.probe                             # every backbone layer: which one to cache in memory
    python -m training.studies.probe --checkpoint runs/x/checkpoint  # a SideNet's memory layer, searching as it does
    python -m training.studies.probe --untrained                 # the untrained SideNet (the default config)
    python -m training.studies.probe --copy-heads                # which heads copy a fact inside the window
    python -m training.studies.probe --readout 18 --heads 6,7    # those heads reading memory, untrained: recall, NLL
    python -m training.studies.probe --checkpoint CKPT --answers  # token by token: what memory attends to, what is said
    python -m training.studies.probe --values 18                 # can a linear read-out tell a token from its values?

Recall items (``longmem.eval.datasets.recall``) are built in held-out book text; everything before the question's local
window goes into memory segment by segment, each encoded from position 0, exactly as evaluation does. The query is that
of the token just before the answer (the last word of the restated fact, "... is"). Every memory chunk is scored the
way the memory search scores it: the un-rotated query against the chunk's mean-pooled key, each query head against
its KV head.

Reported per layer: the rank of the best chunk holding any of the answer's tokens (how many chunks score higher;
0 = first) for the best head, the share of items where that rank is inside the K / C chunks the model retrieves, and
how many of a head's top chunks are segments' first chunks (attention sinks, ``longmem.memory.memory``). "limited" ranks
count at most ``max_sinks`` sink chunks ahead of the answer, as the search does by default.

Finding the answer is half of recall; the other half is a head that copies what it finds. ``--copy-heads`` puts
fact and question inside one window and reports, per layer and head, the attention the backbone itself gives from
the query to the answer's first token (its copying heads), and that token's rank under un-rotated scores (how the
memory layer scores it). ``--readout LAYER --heads H,H`` then asks whether those heads, reading memory instead of
their window, make the frozen backbone recall the fact without any training: backbone layer LAYER becomes a
memory layer (the MemTRM baseline's, untrained) whose listed heads attend to their retrieved memory tokens only and
whose other heads keep their local attention.

``--answers`` (with a checkpoint) follows every answer token: the model's greedy prediction and NLL, and for each
query head the share of its memory attention on the fact's copy of that token. It tells a miss in retrieval (no
head attends to the token) from a miss in read-out (a head attends to it, yet another token is predicted).

``--values LAYER`` asks whether a read-out can be learnt at all: a linear map from the values one KV head of backbone
layer LAYER stores for a token (and from all its KV heads together) through the frozen LM head's rows, fit by
cross-entropy to name the token the value sits on, on held-out book text. Token types are split in two: the map is
fit on the occurrences of one part and tested on those of the other, so its test accuracy is how well it names a
token it never saw, as a recalled name must be.
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from longmem.eval.datasets.recall import RecallItem, name_word, recall_documents
from longmem.memory.memory import MAX_SINKS
from longmem.memory.view import MemoryView
from longmem.model.backbone import load_backbone
from longmem.model.cpu import add_runtime_flags, setup_cpu
from longmem.model.longmem import LongMemConfig, LongMemModel
from longmem.util.data import add_data_flag, cache_root
from longmem.util.report import print_report

from ..data import book_split, tokenize_files


def answer_ranks(q: torch.Tensor, keys: torch.Tensor, chunk_size: int, answer: range, sinks: torch.Tensor,
                 max_sinks: int | None, top: int) -> dict:
    """Score every chunk for one query token and find the best chunk holding part of the answer.

    q (Hq, d) un-rotated query; keys (Hkv, T, d) un-rotated memory keys, T a multiple of ``chunk_size``; ``answer`` the
    answer's token positions in memory; sinks (T / C,) bool. Returns per query head the answer chunk's rank, its
    rank with at most ``max_sinks`` sink chunks counted, and the number of sink chunks among the ``top`` best."""
    hq, hkv = q.shape[0], keys.shape[0]
    chunks = keys.float().reshape(hkv, -1, chunk_size, keys.shape[-1]).mean(dim=2)  # (Hkv, n, d)
    scores = torch.einsum("hd,hnd->hn", q.float(), chunks[torch.arange(hq) // (hq // hkv)])  # (Hq, n)
    target = scores[:, _answer_chunks(answer, chunk_size)].max(dim=1, keepdim=True).values  # (Hq, 1)
    higher = scores > target  # (Hq, n)
    rank = higher.sum(dim=1)
    sink_higher = (higher & sinks).sum(dim=1)
    allowed = sink_higher if max_sinks is None else sink_higher.clamp(max=max_sinks)
    limited = rank - sink_higher + allowed
    top_sinks = sinks[scores.topk(min(top, scores.shape[1]), dim=1).indices].sum(dim=1)
    return {"rank": rank.tolist(), "limited": limited.tolist(), "top_sinks": top_sinks.tolist()}


def _answer_chunks(answer: range, chunk_size: int) -> list[int]:
    """The chunks (by position in memory) that hold part of the answer."""
    return sorted({p // chunk_size for p in answer})


def _summary(per_item: list[dict], top: int) -> dict:
    best = np.array([min(r["rank"]) for r in per_item])
    best_lim = np.array([min(r["limited"]) for r in per_item])
    return {"best_ranks": best.tolist(), "median_rank": float(np.median(best)), "hit": float(np.mean(best < top)),
            "median_rank_limited": float(np.median(best_lim)), "hit_limited": float(np.mean(best_lim < top)),
            "top_sinks": float(np.mean([np.mean(r["top_sinks"]) for r in per_item]))}


def _split(item: RecallItem, window: int) -> tuple[torch.Tensor, torch.Tensor, int, range]:
    """Memory tokens, local window, the query's position in the window, the answer's positions in memory."""
    ids = torch.as_tensor(item.ids, dtype=torch.long)
    n_ans = len(ids) - item.answer_start
    return ids[:-window], ids[-window:], window - n_ans - 1, range(item.answer_pos, item.answer_pos + n_ans)


def _sink_chunks(n_tokens: int, segment_len: int, chunk_size: int) -> torch.Tensor:
    sinks = torch.zeros(n_tokens // chunk_size, dtype=torch.bool)
    sinks[:: segment_len // chunk_size] = True
    return sinks


@torch.no_grad()
def probe_backbone(backbone, items: list[RecallItem], segment_len: int, chunk_size: int, top: int,
                   max_sinks: int | None, log=print) -> list[dict]:
    """Every layer of the backbone as the cached layer (queries and keys both from that layer)."""
    n_layers, layers = backbone.spec.n_layers, backbone.layers
    ops = backbone.ops
    per_layer: list[list[dict]] = [[] for _ in range(n_layers)]
    for i, item in enumerate(items):
        past, window, qpos, answer = _split(item, segment_len)
        keys: list[list[torch.Tensor]] = [[] for _ in range(n_layers)]
        for s in range(0, len(past) // chunk_size * chunk_size, segment_len):  # each segment alone, from position 0
            hidden = backbone(past[None, s:s + segment_len]).hidden
            for layer in range(n_layers):
                keys[layer].append(backbone.layer_kv(layer, hidden[layer])[0][0])  # (Hkv, T, d)
        hidden = backbone(window[None]).hidden
        for layer in range(n_layers):
            q = ops.qkv(layers[layer], ops.attn_norm(layers[layer], hidden[layer]))[0][0, :, qpos]  # (Hq, d)
            k = torch.cat(keys[layer], dim=1)
            k = k[:, : k.shape[1] // chunk_size * chunk_size]
            sinks = _sink_chunks(k.shape[1], segment_len, chunk_size)
            per_layer[layer].append(answer_ranks(q, k, chunk_size, answer, sinks, max_sinks, top))
        log(f"item {i + 1}/{len(items)}: best-head rank by layer "
            f"{[min(per_layer[layer][-1]['rank']) for layer in range(n_layers)]}")
    return [{"layer": layer, **_summary(per_layer[layer], top)} for layer in range(n_layers)]


@torch.no_grad()
def copy_heads(backbone, items: list[RecallItem]) -> dict:
    """Per layer and query head, over items whose fact is inside the window: the mean attention from the query (the
    token before the answer) onto the fact's first answer token, and that token's median rank among all earlier
    tokens under un-rotated q.k (0 = highest). Returns {"attention": (L, Hq) list, "rank": (L, Hq) list}."""
    spec, ops = backbone.spec, backbone.ops
    attn = np.zeros((len(items), spec.n_layers, spec.n_heads))
    rank = np.zeros_like(attn)
    for i, item in enumerate(items):
        ids = torch.as_tensor(item.ids, dtype=torch.long)[None]
        qpos, apos = item.answer_start - 1, item.answer_pos
        hidden = backbone(ids).hidden
        positions = torch.arange(ids.shape[1], device=ids.device)
        for layer in range(spec.n_layers):
            q, k, _ = ops.qkv(backbone.layers[layer], ops.attn_norm(backbone.layers[layer], hidden[layer]))
            qr, kr = backbone.rope(q, k, positions)
            group = spec.n_heads // k.shape[1]

            def scores(qq, kk, qpos=qpos, group=group):  # (Hq, qpos + 1): the query against every token up to itself
                kk = kk[0, :, : qpos + 1].repeat_interleave(group, dim=0)  # (Hq, qpos + 1, d)
                return torch.einsum("hd,htd->ht", qq[0, :, qpos].float(), kk.float()) / math.sqrt(qq.shape[-1])

            attn[i, layer] = torch.softmax(scores(qr, kr), dim=-1)[:, apos].cpu().numpy()  # the backbone's own
            raw = scores(q, k)  # un-rotated, as memory scores
            rank[i, layer] = (raw > raw[:, apos:apos + 1]).sum(dim=-1).cpu().numpy()
    return {"attention": attn.mean(axis=0).tolist(), "rank": np.median(rank, axis=0).tolist()}


def copy_heads_markdown(result: dict, n: int = 12) -> str:
    attn, rank = np.array(result["attention"]), np.array(result["rank"])
    best = sorted(((attn[li, h], li, h) for li in range(attn.shape[0]) for h in range(attn.shape[1])), reverse=True)
    lines = ["| layer | head | attention on the answer token | median un-rotated rank |", "|---:|---:|---:|---:|"]
    lines += [f"| {li} | {h} | {a:.3f} | {rank[li, h]:.0f} |" for a, li, h in best[:n]]
    lines += ["", "strongest head per layer: " + ", ".join(f"{li}: {attn[li].max():.2f}" for li in range(len(attn)))]
    return "\n".join(lines)


@torch.no_grad()
def readout(backbone, items: list[RecallItem], layer: int, heads: list[int], segment_len: int, chunk_size: int,
            topk: int, max_sinks: int | None) -> dict:
    """Recall of ``items`` by the frozen backbone whose layer ``layer`` reads memory through ``heads`` only
    (the others keep their local attention): exact-match accuracy and the answer tokens' mean NLL."""
    from longmem.eval.measures import recall_summary, recalled
    from longmem.model.baselines import MemTRM

    lm = MemTRM(backbone, cached_layer=layer, chunk_size=chunk_size, topk=topk, capacity=None, segment_len=segment_len,
                gate_init=30.0).eval()  # sigmoid(30) = 1: local attention only...
    lm.max_sinks = max_sinks
    lm.memory_layer.gate[heads] = -30.0  # ...except these heads, which read memory only
    res = [recalled(lm, item) for item in items]
    return {"layer": layer, "heads": heads, **recall_summary(res), "recalled": [r[0] for r in res]}


class _Recorder(MemoryView):
    """Keeps the queries the memory layer searches with and, for the query positions ``at`` of row 0, what the
    search returned: {position: (keys (Hq, K, d), mask (Hq, K), chunk serials (Hq, n_chunks))}."""

    def __init__(self, memory, at: range = range(0)):
        super().__init__(memory)
        self.queries: list[torch.Tensor] = []
        self.at, self.found, self._seen = at, {}, 0

    def search(self, queries, n_chunks):
        self._record(queries, n_chunks)
        return super().search(queries, n_chunks)

    def select(self, queries, n_chunks):  # the layer's masked dense path: the recorded positions searched again
        self._record(queries, n_chunks)
        return super().select(queries, n_chunks)

    def _record(self, queries, n_chunks):
        self.queries.append(queries.detach())
        for t in self.at:
            if self._seen <= t < self._seen + queries.shape[2]:
                j = t - self._seen
                r = self.memory.search(queries[:, :, j:j + 1], self.n_chunks or n_chunks)
                self.found[t] = (r.keys[0, :, 0], r.mask[0, :, 0], r.chunk_ids[0, :, 0])
        self._seen += queries.shape[2]


@torch.no_grad()
def probe_model(model: LongMemModel, items: list[RecallItem], log=print) -> dict:
    """The model's memory layer: its own queries against its memory, plus whether its search returned the answer."""
    chunk_size, top = model.chunk_size, model.config.topk // model.chunk_size
    per_item, found = [], []
    for i, item in enumerate(items):
        past, window, qpos, answer = _split(item, model.segment_len)
        memory = model.new_memory(capacity=None)
        model.memorize(past, memory)
        rec = _Recorder(memory)
        step = model.step(window[None], rec)
        q = torch.cat(rec.queries, dim=2)[0, :, qpos]  # (Hq, d)
        row = memory.rows[0]
        k = row.k[:, : row.n].reshape(row.k.shape[0], -1, row.k.shape[-1])  # (Hkv, n * chunk_size, d)
        per_item.append(answer_ranks(q, k, chunk_size, answer, row.starts[: row.n].any(dim=1), model.max_sinks, top))
        retrieved = torch.cat(step.chunk_ids, dim=2)[0, :, qpos]  # (Hq, n_chunks) chunk serials
        found.append(bool(torch.isin(retrieved, torch.tensor(_answer_chunks(answer, chunk_size))).any()))
        log(f"item {i + 1}/{len(items)}: ranks per head {per_item[-1]['rank']}, retrieved: {found[-1]}")
    return {"layer": f"memory layer (cached layer {model.cached_layer})", **_summary(per_item, top),
            "retrieved": float(np.mean(found))}


@torch.no_grad()
def probe_answers(model: LongMemModel, items: list[RecallItem], log=print) -> dict:
    """Every answer token of every item: greedy prediction, NLL, and per query head the memory attention on the
    fact's copy of that token (the attention the memory layer computes: its un-rotated query against the retrieved
    keys, one softmax over them; 0 when the token's chunk was not retrieved)."""
    chunk_size, tok = model.chunk_size, model.backbone.tokenizer
    memory_share = (1 - torch.sigmoid(model.sidenet.gate.float())).tolist()  # per head, where memory was found
    per_item = []
    for i, item in enumerate(items):
        past, window, qpos, answer = _split(item, model.segment_len)
        memory = model.new_memory(capacity=None)
        model.memorize(past, memory)
        rec = _Recorder(memory, at=range(qpos, qpos + len(answer)))
        hidden = model.step(window[None], rec).hidden  # (1, T, E)
        q = torch.cat(rec.queries, dim=2)[0]  # (Hq, T, d)
        logp = torch.log_softmax(model.backbone.logits(hidden[:, qpos:qpos + len(answer)]).float()[0], dim=-1)
        targets = window[qpos + 1:qpos + 1 + len(answer)]
        copy = []  # (n_ans, Hq): attention on the token to copy
        for j, t in enumerate(range(qpos, qpos + len(answer))):
            keys, mask, chunks = rec.found[t]
            scores = torch.einsum("hd,hkd->hk", q[:, t].float(), keys.float()) / math.sqrt(q.shape[-1])
            probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1).nan_to_num(0.0)  # (Hq, K)
            positions = chunks[:, :, None] * chunk_size + torch.arange(chunk_size)
            positions = positions.reshape(chunks.shape[0], -1)  # (Hq, K)
            copy.append((probs * (positions == answer[j])).sum(dim=-1).tolist())
        per_item.append({"answer": item.answer, "kind": item.kind,
                         "tokens": [tok.decode([int(x)]) for x in targets],
                         "predicted": [tok.decode([int(x)]) for x in logp.argmax(-1)],
                         "nll": (-logp.gather(-1, targets[:, None])[:, 0]).tolist(), "copy_attention": copy})
        log(f"item {i + 1}/{len(items)}: {item.answer!r} -> {''.join(per_item[-1]['predicted'])!r}")
    return {"memory_share": memory_share, "items": per_item, **answers_summary(per_item)}


def answers_summary(per_item: list[dict], attended: float = 0.5) -> dict:
    """Token counts: answer tokens, those predicted right, those some head attends to (at least ``attended`` of
    its memory attention on the token to copy), and those attended to and still predicted wrong (read-out misses)."""
    rows = [(p == t, max(c)) for it in per_item for p, t, c in zip(it["predicted"], it["tokens"], it["copy_attention"])]
    return {"tokens": len(rows), "correct": sum(ok for ok, _ in rows),
            "attended": sum(a >= attended for _, a in rows),
            "attended_but_wrong": sum(a >= attended and not ok for ok, a in rows)}


def answers_markdown(result: dict) -> str:
    lines = ["| answer | predicted | NLL per token | best head's attention on each token |", "|---|---|---|---|"]
    for it in result["items"]:
        nll = " ".join(f"{x:.2f}" for x in it["nll"])
        att = " ".join(f"{max(c):.2f}" for c in it["copy_attention"])
        lines.append(f"| {'|'.join(it['tokens'])!r} | {'|'.join(it['predicted'])!r} | {nll} | {att} |")
    lines += ["", f"answer tokens {result['tokens']}: predicted right {result['correct']}, attended to by some head "
                  f"{result['attended']}, attended to but predicted wrong {result['attended_but_wrong']}"]
    return "\n".join(lines)


def markdown(rows: list[dict], top: int) -> str:
    lines = [f"| layer | median rank | in top {top} | median rank, sinks limited | in top {top}, sinks limited | "
             f"sink chunks in top {top} |", "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['layer']} | {r['median_rank']:.0f} | {100 * r['hit']:.0f}% | {r['median_rank_limited']:.0f} | "
              f"{100 * r['hit_limited']:.0f}% | {r['top_sinks']:.1f} |" for r in rows]
    if rows and "retrieved" in rows[0]:
        share = 100 * rows[0]["retrieved"]
        lines += ["", f"answer chunk among the chunks the search returned (any head): {share:.0f}%"]
    return "\n".join(lines)


def fit_readout(x: torch.Tensor, y: torch.Tensor, unembed: torch.Tensor, steps: int = 400, batch: int = 512,
                lr: float = 3e-3, seed: int = 0) -> nn.Linear:
    """A linear read-out ``logits = unembed @ W(x)`` from features x (N, d) to token ids y (N,), fit by Adam on
    cross-entropy over the whole vocabulary (``unembed``: (V, E), the frozen LM head's rows). x is standardised."""
    g = torch.Generator().manual_seed(seed)
    w = nn.Linear(x.shape[1], unembed.shape[1])
    with torch.no_grad():  # a reproducible start
        w.weight.copy_(torch.randn(w.weight.shape, generator=g) / math.sqrt(x.shape[1]))
        w.bias.zero_()
    opt = torch.optim.Adam(w.parameters(), lr=lr)
    for _ in range(steps):
        b = torch.randint(len(x), (min(batch, len(x)),), generator=g)
        loss = F.cross_entropy(w(x[b]) @ unembed.T, y[b])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return w


def readout_accuracy(w: nn.Linear, x: torch.Tensor, y: torch.Tensor, unembed: torch.Tensor) -> dict:
    """Top-1 and top-5 accuracy of ``fit_readout``'s map naming the tokens y (N,) from x (N, d)."""
    with torch.no_grad():
        top = torch.cat([(w(xb) @ unembed.T).topk(5, dim=1).indices for xb in x.split(1024)])
    return {"tokens": len(y), "top1": float((top[:, 0] == y).float().mean()) if len(y) else 0.0,
            "top5": float((top == y[:, None]).any(1).float().mean()) if len(y) else 0.0}


def value_readout(backbone, ids: torch.Tensor, layer: int, steps: int = 400, seed: int = 0, log=print) -> dict:
    """How well a linear read-out names a token from the values backbone ``layer`` stores for it (``--values``):
    per KV head and all heads together, on token types it was fit on and on types it never saw (all of them, and
    the capitalized whole words a name is made of, ``name_word``). ids: (S, L) segments of text, each encoded from
    position 0."""
    feats = []
    with torch.no_grad():
        for row in ids:  # (L,)
            out = backbone(row[None].to(backbone.device), n_layers=layer + 1, keep={layer})
            feats.append(backbone.layer_kv(layer, out.hidden[layer])[1][0].float().transpose(0, 1).cpu())  # (L, Hkv, d)
    v, y = torch.cat(feats), ids.flatten()  # (N, Hkv, d), (N,)
    first = (torch.arange(len(y)) % ids.shape[1]) == 0  # a segment's first token: an attention sink, not a token
    pieces = backbone.tokenizer.convert_ids_to_tokens(list(range(len(backbone.tokenizer))))
    word = torch.tensor([bool(name_word(p)) for p in pieces] + [False] * (backbone.spec.vocab_size - len(pieces)))
    fit_type = torch.rand(backbone.spec.vocab_size, generator=torch.Generator().manual_seed(seed)) < 0.7
    fit, unseen = ~first & fit_type[y], ~first & ~fit_type[y]
    unembed = backbone.model.get_output_embeddings().weight.detach().float().cpu()  # (V, E)
    rows = []
    for name, x in [*[(f"KV head {h}", v[:, h]) for h in range(v.shape[1])], ("all KV heads", v.flatten(1))]:
        x = (x - x[fit].mean(0)) / (x[fit].std(0) + 1e-6)
        w = fit_readout(x[fit], y[fit], unembed, steps=steps, seed=seed)
        rows.append({"values": name, "dims": x.shape[1], "fit": readout_accuracy(w, x[fit], y[fit], unembed),
                     "unseen": readout_accuracy(w, x[unseen], y[unseen], unembed),
                     "unseen_words": readout_accuracy(w, x[unseen & word[y]], y[unseen & word[y]], unembed)})
        log(f"layer {layer}, {name}: unseen top-1 {rows[-1]['unseen']['top1']:.3f}")
    return {"layer": layer, "rows": rows}


def values_markdown(result: dict) -> str:
    r0 = result["rows"][0]
    lines = [f"| layer {result['layer']} values | dims | top-1 / top-5, types fit on ({r0['fit']['tokens']} tokens) | "
             f"unseen types ({r0['unseen']['tokens']}) | unseen capitalized words ({r0['unseen_words']['tokens']}) |",
             "|---|---:|---:|---:|---:|"]
    for r in result["rows"]:
        acc = [f"{r[k]['top1']:.3f} / {r[k]['top5']:.3f}" for k in ("fit", "unseen", "unseen_words")]
        lines.append(f"| {r['values']} | {r['dims']} | " + " | ".join(acc) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m training.studies.probe", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", default=None, help="probe this SideNet checkpoint's memory layer")
    p.add_argument("--untrained", action="store_true", help="probe the untrained SideNet's memory layer")
    p.add_argument("--backbone", default="default", help="backbone for the per-layer probe")
    p.add_argument("--copy-heads", action="store_true",
                   help="fact inside the window: which backbone heads attend from the question to the answer")
    p.add_argument("--cached-layer", type=int, default=None,
                   help="with --untrained: the backbone layer in memory (default: the model's default)")
    p.add_argument("--readout", type=int, default=None, metavar="LAYER",
                   help="recall through backbone layer LAYER's --heads reading memory, untrained")
    p.add_argument("--heads", default="", help="with --readout: comma-separated query heads that read memory")
    p.add_argument("--answers", action="store_true",
                   help="with --checkpoint/--untrained: each answer token's prediction, NLL and memory attention")
    p.add_argument("--values", type=int, default=None, metavar="LAYER",
                   help="how well a linear read-out names a token from backbone layer LAYER's values")
    p.add_argument("--segments", type=int, default=48, help="with --values: segments of held-out text to read")
    add_data_flag(p)
    p.add_argument("--books", type=int, default=2, help="held-out books the recall items are drawn from")
    p.add_argument("--items", type=int, default=8, help="recall items")
    p.add_argument("--distance", type=int, default=8192, help="minimum tokens between a fact and its question")
    p.add_argument("--segment-len", type=int, default=1024, help="segment length (per-layer probe)")
    p.add_argument("--chunk-size", "--csz", type=int, default=4, help="chunk size (per-layer probe)")
    p.add_argument("--topk", type=int, default=64, help="memory tokens retrieved per query, K (per-layer probe)")
    p.add_argument("--max-sinks", type=int, default=MAX_SINKS, help="sink chunks a search may return (-1 = no limit)")
    p.add_argument("--seed", type=int, default=1234, help="recall items seed")
    add_runtime_flags(p)
    p.add_argument("--out", default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    if sum([args.copy_heads, args.readout is not None, args.answers, args.values is not None]) > 1:
        p.error("--copy-heads, --readout, --answers and --values are separate probes: give one")
    if args.readout is not None and not args.heads.strip():
        p.error("--readout needs --heads (the query heads that read memory, e.g. --heads 6,7)")
    if args.answers and not (args.checkpoint or args.untrained):
        p.error("--answers follows a SideNet's memory layer: give --checkpoint DIR or --untrained")
    setup_cpu(args.threads)
    max_sinks = None if args.max_sinks < 0 else args.max_sinks
    log = lambda m: print(f"[probe] {m}", file=sys.stderr, flush=True)  # noqa: E731
    model = None
    if args.checkpoint:
        model = LongMemModel.load(args.checkpoint, runtime={"max_sinks": max_sinks, "dtype": args.dtype})
    elif args.untrained:
        model = LongMemModel.from_config(LongMemConfig(max_sinks=max_sinks, cached_layer=args.cached_layer,
                                                       dtype=args.dtype), pretrained=False)
    backbone = model.backbone if model is not None else load_backbone(args.backbone, args.dtype)
    segment_len = model.segment_len if model is not None else args.segment_len
    _, test_files = book_split(args.data)
    books = tokenize_files(test_files[: args.books], backbone.tokenizer, cache_root() / "tokens")
    if args.values is not None:
        if not 0 <= args.values < backbone.spec.n_layers:
            p.error(f"--values {args.values}: the backbone has layers 0-{backbone.spec.n_layers - 1}")
        text = np.concatenate([d.ids[: len(d.ids) // segment_len * segment_len] for d in books])
        if len(text) < args.segments * segment_len:
            p.error(f"the {args.books} held-out books hold {len(text) // segment_len} segments, not {args.segments}")
        ids = torch.as_tensor(text[: args.segments * segment_len], dtype=torch.long).view(args.segments, segment_len)
        result = {**value_readout(backbone, ids, args.values, log=log), "args": vars(args)}
        return print_report(result, values_markdown(result), args.out)
    if args.copy_heads:
        items = recall_documents(backbone.tokenizer, [d.ids for d in books], args.items, segment_len // 2,
                                 segment_len, seed=args.seed)
        result = {**copy_heads(backbone, items), "args": vars(args)}
        return print_report(result, copy_heads_markdown(result), args.out)
    items = recall_documents(backbone.tokenizer, [d.ids for d in books], args.items, args.distance,
                             args.distance + segment_len, seed=args.seed)
    if args.readout is not None:
        heads = [int(h) for h in args.heads.split(",") if h.strip()]
        result = {**readout(backbone, items, args.readout, heads, segment_len, args.chunk_size, args.topk, max_sinks),
                  "args": vars(args)}
        return print_report(result, None, args.out)
    if model is not None and args.answers:
        result = {**probe_answers(model.eval(), items, log), "args": vars(args)}
        return print_report(result, answers_markdown(result), args.out)
    if model is not None:
        model.eval()
        rows, top = [probe_model(model, items, log)], model.config.topk // model.chunk_size
    else:
        top = args.topk // args.chunk_size
        rows = probe_backbone(backbone, items, segment_len, args.chunk_size, top, max_sinks, log)
    return print_report({"rows": rows, "args": vars(args)}, markdown(rows, top), args.out)


if __name__ == "__main__":
    main()
