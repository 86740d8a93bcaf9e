"""Which features a readout fitted on the demonstrations should read (issue 86): a logistic regression
(``tasks.readout.fit_cv``) on each kind of feature of the same demonstrations, scored on the same test sentences as
the anchor a user would build (sentence embeddings + logistic regression), paired with it.

Features of a text, read without demonstrations in the prompt (the set's template up to its label, as
``tasks.classify`` reads a text):

- ``embeddings``: the shipped all-MiniLM-L6-v2 sentence embedding (the anchor);
- ``<reader> state``: a reader's last hidden state (before its final norm) at the last prompt token;
- ``<reader> label words``: its log-probabilities of the set's label words there;
- ``embeddings + <reader> state``: both, side by side.

    python -m training.icl_features --sets SST-2 --readers default,qwen2.5-coder-1.5b --out runs/icl-features

Features are kept in ``--out`` (``<set>-<seed>-<demos>-<test>-<feature>.npy``) and read from there again. Dev
splits (the record's evaluation files) only: SST-2's test split is for the held-out check.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from longmem.eval.icl import make_task, prompt_parts
from longmem.model.embedder import Embedder
from longmem.model.readers import load_reader
from longmem.tasks.examples import PRESETS
from longmem.tasks.measure import score_predictions, wilson
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


def save(path: Path, x: np.ndarray) -> None:
    """``x`` to ``path`` (.npy), whole or not at all."""
    tmp = path.with_name(path.stem + ".tmp.npy")
    np.save(tmp, x)
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.icl_features", description=__doc__.split("\n\n")[0])
    p.add_argument("--sets", default="SST-2", help="comma-separated ICL sets (eval icl's names)")
    p.add_argument("--readers", default="default", help="comma-separated readers whose states are features")
    p.add_argument("--seeds", type=int, default=1, help="draws of demonstrations and test sentences per set")
    p.add_argument("--demos", type=int, default=2000, help="demonstrations the readouts are fitted on")
    p.add_argument("--test", type=int, default=300, help="test sentences per set and seed (from the dev split)")
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
                d = [int(a) - int(b) for a, b in zip(hits[row["feature"]], hits["embeddings"])]
                mean = sum(d) / len(d)
                sd = math.sqrt(sum((v - mean) ** 2 for v in d) / max(len(d) - 1, 1))
                row["minus_anchor"] = (100 * mean, 100 * 1.96 * sd / math.sqrt(len(d)))
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
