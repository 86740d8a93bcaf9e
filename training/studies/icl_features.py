"""Which features a readout fitted on the demonstrations should read (issue 86): a logistic regression
(``tasks.readout.fit_cv``) on each kind of feature of the same demonstrations, scored on the same test sentences as
the anchor a user would build (sentence embeddings + logistic regression), paired with it.

A study (``training.studies``: it ships nothing). It chose the classifier head's features (``tasks.head``): the
backbone's last state stacked with the MiniLM sentence embedding, not label-word scores, and (``--memory``) no memory
read. Figures: ``docs/design.md`` ("The classifier is measured against embeddings + logistic regression at full
strength", "The classifier decides with a head fitted on its examples") and ``docs/history/notes-issue-86.md``
("Which features a readout should read", "What the memory adds to the head").

Features of a text, read without demonstrations in the prompt (the set's template up to its label, as
``tasks.classify`` reads a text):

- ``embeddings``: the shipped all-MiniLM-L6-v2 sentence embedding (the anchor);
- ``<reader> state``: a reader's last hidden state (before its final norm) at the last prompt token;
- ``<reader> label words``: its log-probabilities of the set's label words there;
- ``embeddings + <reader> state``: both, side by side.

With ``--memory`` (the bank's LongMem model, SmolLM2 + its shipped SideNet, reading each text with demonstrations in a
memory of chunk size 2, as the record's ICL suite writes them), cross-fitted: a demonstration's features are read with
the other folds' demonstrations in memory (``readout.folds_of``), never its own; a test text's with all of them:

- ``memory state``: the LongMem model's last hidden state at the prompt's end, memory read;
- ``memory vote``: the share of each label among the demonstrations whose chunks its memory layer retrieved (over
  every head and token of the prompt: a kNN-Prompting-like vote, from the same pass);
- ``embeddings + <reader> state + memory ...``: stacked with the best features without memory (the first reader's).

    python -m training.studies.icl_features --sets SST-2 --readers default,qwen2.5-coder-1.5b --out runs/icl-features

Features are kept in ``--out`` (``<set>-<seed>-<demos>-<test>-<feature>.npy``) and read from there again. Dev
splits (the record's evaluation files) only: SST-2's test split is for the held-out check.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from longmem.eval.icl import make_task
from longmem.model.embedder import Embedder
from longmem.model.readers import load_reader
from longmem.tasks.examples import PRESETS, prompt_parts
from longmem.tasks.measure import paired_gap, score_predictions, wilson
from longmem.tasks.readout import fit_cv
from longmem.util.data import data_dir


@torch.inference_mode()
def reader_features(reader: str, template: str, labels: list[str], texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(N, E) last hidden states at each text's last prompt token and (N, L) log-probabilities of the label words'
    first tokens there, by reader ``reader``."""
    lm = load_reader(reader)
    tok = lm.backbone.tokenizer
    gap = prompt_parts(template, "x")[1]  # the whitespace before a label word, as the suite scores it
    firsts = [tok(gap + w, add_special_tokens=False).input_ids[0] for w in labels]
    states, logps = [], []
    for text in tqdm(texts, desc=f"{Path(reader).name} features", unit="text"):
        ids = tok(prompt_parts(template, text)[0], add_special_tokens=False, return_tensors="pt").input_ids
        hidden = lm.step(ids[:, -lm.segment_len:], None).hidden[:, -1:]  # (1, 1, E)
        logp = torch.log_softmax(lm.backbone.logits(hidden).float(), dim=-1)[0, 0]  # (V,)
        states.append(hidden[0, 0].double().numpy())
        logps.append(logp[firsts].double().numpy())
    return np.stack(states), np.stack(logps)


@torch.inference_mode()
def memory_features(template: str, labels: list[str], demos: list, texts: list[str], seed: int,
                    chunk_size: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """(N + M, E) LongMem states and (N + M, L) retrieved-label shares for the ``demos`` (N, cross-fitted: each read
    with the other folds' demonstrations in memory) and then ``texts`` (M, read with all N in memory)."""
    from longmem.eval.icl import MEMORY_SEPARATOR, demo_memory
    from longmem.memory.view import MemoryView
    from longmem.model.longmem import LongMemModel
    from longmem.tasks.examples import format_demo
    from longmem.tasks.readout import folds_of

    lm = LongMemModel.from_config().eval()
    tok = lm.backbone.tokenizer
    index = {w: i for i, w in enumerate(labels)}

    def owners(held: list) -> np.ndarray:
        """The demonstration (index into ``held``) behind each chunk serial of their memory."""
        pieces = [format_demo(template, e) for e in held]
        starts = np.cumsum([0] + [len(p) + len(MEMORY_SEPARATOR) for p in pieces])[:-1]
        stream = MEMORY_SEPARATOR.join(pieces)
        offsets = tok(stream, add_special_tokens=False, return_offsets_mapping=True).offset_mapping
        by_token = np.searchsorted(starts, [a for a, _ in offsets], side="right") - 1
        return by_token[::chunk_size]  # a chunk belongs to the demonstration of its first token

    def read(memory, held: list, text: str) -> tuple[np.ndarray, np.ndarray]:
        view, own = MemoryView(memory), owners(held)
        ids = tok(prompt_parts(template, text)[0], add_special_tokens=False, return_tensors="pt").input_ids
        hidden = lm.step(ids[:, -lm.segment_len:], view).hidden[0, -1]  # (E,)
        vote = np.zeros(len(labels))
        for serial, count in view.hits.items():
            if serial < len(own):
                vote[index[held[own[serial]].label]] += count
        return hidden.double().numpy(), vote / max(vote.sum(), 1)

    states, votes = np.zeros((len(demos) + len(texts), lm.backbone.spec.hidden)), \
        np.zeros((len(demos) + len(texts), len(labels)))
    jobs = [(fold, sorted(set(range(len(demos))) - set(fold))) for fold in folds_of(len(demos), seed=seed)]
    jobs.append((list(range(len(demos), len(demos) + len(texts))), list(range(len(demos)))))
    bar = tqdm(total=len(demos) + len(texts), desc="memory features", unit="text")
    for rows, kept in jobs:
        held = [demos[i] for i in kept]
        memory = demo_memory(lm, held, template, chunk_size)
        for r in rows:
            text = demos[r].text if r < len(demos) else texts[r - len(demos)]
            states[r], votes[r] = read(memory, held, text)
            bar.update()
    bar.close()
    return states, votes


def save(path: Path, x: np.ndarray) -> None:
    """``x`` to ``path`` (.npy), whole or not at all."""
    tmp = path.with_name(path.stem + ".tmp.npy")
    np.save(tmp, x)
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.studies.icl_features", description=__doc__.split("\n\n")[0])
    p.add_argument("--sets", default="SST-2", help="comma-separated ICL sets (eval icl's names)")
    p.add_argument("--readers", default="default", help="comma-separated readers whose states are features")
    p.add_argument("--seeds", type=int, default=1, help="draws of demonstrations and test sentences per set")
    p.add_argument("--demos", type=int, default=2000, help="demonstrations the readouts are fitted on")
    p.add_argument("--test", type=int, default=300, help="test sentences per set and seed (from the dev split)")
    p.add_argument("--memory", action="store_true",
                   help="add the LongMem model's features with the demonstrations in memory (cross-fitted)")
    p.add_argument("--out", default="runs/icl-features", help="folder for the features and the results")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    embedder, results = None, []
    for name in args.sets.split(","):
        preset = PRESETS[name]
        train, evaluation = preset.read(data_dir())
        for seed in range(args.seeds):
            task = make_task(preset, train, evaluation, 0, args.demos, args.test, seed)
            texts = [e.text for e in task.memory + task.test]
            n = len(task.memory)

            stem = f"{name}-{seed}-{args.demos}-{args.test}"  # the texts are the draw's: set, seed and sizes
            path = out / f"{stem}-embeddings.npy"
            if not path.is_file():
                embedder = embedder or Embedder.load()
                save(path, embedder.encode(texts).astype(np.float64))
            feats = {"embeddings": np.load(path)}
            for reader in args.readers.split(","):
                short = Path(reader).name
                state_path, words_path = (out / f"{stem}-{short}-{kind}.npy" for kind in ("state", "words"))
                if not (state_path.is_file() and words_path.is_file()):
                    s, w = reader_features(reader, preset.template, preset.labels, texts)
                    save(state_path, s)
                    save(words_path, w)
                feats[f"{short} state"] = np.load(state_path)
                feats[f"{short} label words"] = np.load(words_path)
                feats[f"embeddings + {short} state"] = np.concatenate([feats["embeddings"], feats[f"{short} state"]], 1)
            if args.memory:
                state_path, vote_path = (out / f"{stem}-memory-{kind}.npy" for kind in ("state", "vote"))
                if not (state_path.is_file() and vote_path.is_file()):
                    s, v = memory_features(preset.template, preset.labels, task.memory,
                                           [e.text for e in task.test], seed)
                    save(state_path, s)
                    save(vote_path, v)
                feats["memory state"], feats["memory vote"] = np.load(state_path), np.load(vote_path)
                first = Path(args.readers.split(",")[0]).name
                best = feats[f"embeddings + {first} state"]
                feats[f"embeddings + {first} state + memory vote"] = np.concatenate([best, feats["memory vote"]], 1)
                feats["embeddings + memory state"] = np.concatenate([feats["embeddings"], feats["memory state"]], 1)
                feats[f"embeddings + {first} state + memory state"] = np.concatenate([best, feats["memory state"]], 1)
            truths = [e.label for e in task.test]
            hits = {}
            for kind, x in feats.items():
                x = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64))
                readout = fit_cv(x[:n], [e.label for e in task.memory], seed=seed)
                r = score_predictions(preset.labels, truths, readout.predict(x[n:]))
                hits[kind] = [a == b for a, b in zip(r.predictions, truths)]
                results.append({"set": name, "seed": seed, "feature": kind, "accuracy": r.accuracy,
                                "macro_f1": r.macro_f1, "l2": readout.l2, "n": len(truths)})
            for row in results[-len(feats):]:
                row["minus_anchor"] = paired_gap(hits[row["feature"]], hits["embeddings"])[:2]
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(json.dumps(results))
    print("\n| set | seed | feature | accuracy % (95%) | minus the anchor, paired (points) | penalty |\n"
          "| --- | ---: | --- | ---: | ---: | ---: |")
    for r in results:
        low, high = wilson(round(r["accuracy"] * r["n"]), r["n"])
        print(f"| {r['set']} | {r['seed']} | {r['feature']} | {100 * r['accuracy']:.1f} ({100 * low:.0f}-"
              f"{100 * high:.0f}) | {r['minus_anchor'][0]:+.1f} ± {r['minus_anchor'][1]:.1f} | {r['l2']:g} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
