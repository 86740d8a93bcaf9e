"""How well each signal of a reader's draft tells a right draft from a wrong one, alone and together, on a natural
run's record (issue 85: the checks that keep right answers). No reader runs: the signals are those the run recorded.

A study (``training.studies``: it ships nothing). It informed issue 85's choice of the checks that keep right answers:
the reader's own confirmation (``Reading.confirm``) was measured and not chosen, no combination of the signals was
shipped, and the probe of the reader's hidden state, better on the tuning sets, did not carry over to the dev sets
(``--ask``), so the issue is blocked on a reader that judges its own drafts. Figures: ``docs/design.md`` ("The
reader's own confirmation, and every signal together; measured, not chosen") and
``docs/history/notes-issue-85.md`` (sessions 33 and 34).

Signals per draft (a run at ``--set natural.decline=1``, so that every question has a draft; ``natural.confirm``
set to a small value for the reader's confirmation):

- ``decline``: the reader's probability of "The book does not say." after the prompt (``Reading.decline``; lower is
  surer of an answer);
- ``least sure``: the least log-probability of the draft's first ``SURE_TOKENS`` tokens (``Reading.sure``);
- ``mean log-prob``: the mean log-probability of the draft's tokens;
- ``confirm``: the reader's probability of Yes, asked whether the excerpts state its answer (``Reading.confirm``;
  left out where the run did not ask it);
- ``grounding``: the share of the draft's added words found in what it read (``tasks.evidence.grounding``);
- ``word check``: whether the word check at ``Reading.abstain`` = 0.5 shows any of it.

Printed: each signal's AUC (right drafts against wrong ones: answerable ones answered wrongly and unanswerable ones
answered), then a logistic regression over all of them scored book by book (each book's drafts by a model fitted on
the other books'), and what a user would get showing a draft (checked by the word check) only where that score is
above a threshold: right, wrong, unanswerable said, against the honesty a profile is held to.

    python -m training.studies.check_signals runs/tune-d

With ``--hidden``: the reader reads each recorded prompt, draft and confirmation question again (``Chat.probe``, one
pass each, with progress) and its last hidden state there becomes a signal too: a probe of what it computes, fitted
book by book like the rest (alone, and with the six signals). The prompt is rebuilt from the passages' texts without
their places, so it is close to what the app's reader read, not the same.

With ``--answers RUN2`` (a run of another reading on the same questions, e.g. spans): the first run's reply decides
whether to answer (as recorded at its thresholds, or at ``--at``), the second's draft answers, checked by the word
check: what reading more would add at the same honesty.

With ``--ask RUN2`` (with ``--hidden``): the probe is fitted on all of the first run's drafts, its threshold the one
that keeps the most right drafts within the honesty among the first run's book-by-book scores, and it is asked on
RUN2's drafts (e.g. the dev sets): what it would do on questions it was not fitted or tuned on, beside RUN2's
shipped checks, alone (with the word check) and on top of them. Hidden states are kept in each run's folder
(``hidden.<reader>.safetensors``) and read from there again.

Fit and tune on tuning sets only.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from longmem.eval.calibrate import checked, drafts, fate, reply_fate
from longmem.model.lm import Sampling, Window
from longmem.model.readers import load_reader
from longmem.tasks.answer import NOT_SAID
from longmem.tasks.chat import Chat
from longmem.tasks.evidence import grounding
from longmem.tasks.reading import CONFIRM, PROMPTS, SURE_TOKENS

SIGNALS = ("decline", "least sure", "mean log-prob", "confirm", "grounding", "word check")
LOWER_IS_SURER = {"decline"}  # signals whose lower values go with right drafts
CHECK = 0.5  # the word check's threshold (``Reading.abstain``)
HIDDEN_L2 = 100.0  # the hidden-state probe's penalty (1,536 features against ~160 drafts)
WRONG_AT_MOST, SAID_AT_LEAST = 20.0, 75.0  # the honesty the 1.5B's profile was chosen at (% of all; % of unanswerable)


def signals(r: dict) -> list[float]:
    """A draft's signals (``SIGNALS``), from its record row (``eval.calibrate.drafts``)."""
    probs = [max(p, 1e-6) for p in (r.get("probs") or [1e-6])]
    confirm = min(max(r.get("confirm") if r.get("confirm") is not None else 0.5, 1e-4), 1 - 1e-4)
    return [r.get("decline") or 0.0, math.log(min(probs[:SURE_TOKENS])), sum(map(math.log, probs)) / len(probs),
            math.log(confirm / (1 - confirm)), grounding(r["draft"], r["question"], r["passages"]) or 0.0,
            float(checked(r["draft"], r["question"], r["passages"], CHECK) != NOT_SAID)]


@torch.inference_mode()
def hidden_states(rows: list[dict], reader: str, prompt: str = "book-or-not") -> torch.Tensor:
    """(N, E) float64: reader ``reader``'s last hidden state (before its final norm) at the end of the confirmation
    question (``CONFIRM``) asked after each row's draft, the row's passages read under ``PROMPTS[prompt]`` (numbered,
    without their places)."""
    lm = load_reader(reader, "auto", "cpu", 8192)
    chat = Chat(lm, None, Sampling())
    probe = chat.probe(CONFIRM)
    tok = lm.backbone.tokenizer
    out = []
    for r in tqdm(rows, desc="hidden states", unit="draft"):
        excerpts = "\n\n".join(f"[{i}]\n{p}" for i, p in enumerate(r["passages"], 1))
        user = f"{PROMPTS[prompt]}\n\n{excerpts}\n\nQuestion: {r['question']}"
        draft = tok((r["draft"] or "").strip(), add_special_tokens=False, return_tensors="pt").input_ids
        ids = torch.cat([chat.prompt_ids(r["question"], user, history=False), draft,
                         torch.tensor([probe.ids])], dim=1)
        out.append(lm.step(ids[:, -lm.segment_len:], None, Window()).hidden[0, -1].double())
    return torch.stack(out)


def cached_states(run: Path, rows: list[dict], reader: str) -> torch.Tensor:
    """``hidden_states`` of ``rows`` (drafts of run folder ``run``), kept in ``run/hidden.<reader name>.safetensors``
    and read from there where that file holds them all (keyed by the rows' ids and drafts)."""
    path = run / f"hidden.{Path(reader).name}.safetensors"
    keys = [f"{r['id']}\n{r['draft']}" for r in rows]
    if path.is_file():
        kept = load_file(path)
        if all(k in kept for k in keys):
            return torch.stack([kept[k] for k in keys])
    states = hidden_states(rows, reader)
    tmp = path.with_suffix(".tmp")
    save_file({k: v.contiguous() for k, v in zip(keys, states)}, tmp)
    tmp.replace(path)
    return states


def best_threshold(table: list[dict]) -> dict | None:
    """The row of ``judged``'s table with the most right replies within the honesty (fewest wrong on a tie)."""
    honest = [o for o in table if o["honest"]]
    return max(honest, key=lambda o: (o["right"], -o["wrong"])) if honest else None


def auc(pos: list[float], neg: list[float]) -> float:
    """The chance that a random right draft's value is above a random wrong one's (ties: half)."""
    if not pos or not neg:
        return float("nan")
    return sum((a > b) + 0.5 * (a == b) for a in pos for b in neg) / (len(pos) * len(neg))


def fit_logistic(x: torch.Tensor, y: torch.Tensor, l2: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights (F,) and bias of a logistic regression of ``y`` (N,) on standardised ``x`` (N, F), L2-penalised."""
    w = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=500)

    def closure():
        opt.zero_grad()
        loss = (torch.nn.functional.binary_cross_entropy_with_logits(x @ w + b, y)
                + l2 * (w ** 2).sum() / (2 * len(y)))
        loss.backward()
        return loss
    opt.step(closure)
    return w.detach(), b.detach()


def book_by_book(x: torch.Tensor, y: torch.Tensor, books: list[str], l2: float = 1.0) -> torch.Tensor:
    """Each draft's score by a logistic regression (penalty ``l2``) fitted on the other books' drafts (N,)."""
    out = torch.zeros(len(books), dtype=torch.float64)
    for book in sorted(set(books)):
        train = torch.tensor([b != book for b in books])
        mean, std = x[train].mean(0), x[train].std(0) + 1e-9
        w, b = fit_logistic((x[train] - mean) / std, y[train], l2)
        out[~train] = torch.sigmoid((x[~train] - mean) / std @ w + b)
    return out


def judged(rows: list[dict], scores: dict[int, float]) -> list[dict]:
    """What a user gets showing row i's draft, checked by the word check, only where ``scores[i]`` is at least a
    threshold (rows without a score: never), per threshold from 0.025 to 0.95."""
    out = []
    for t in [i / 40 for i in range(1, 39)]:
        shown = [checked(r["draft"], r["question"], r["passages"], CHECK) if scores.get(i, 0.0) >= t else NOT_SAID
                 for i, r in enumerate(rows)]
        out.append({"threshold": t, **tally(rows, [reply_fate(r, s) for r, s in zip(rows, shown)])})
    return out


def tally(rows: list[dict], fates: list[str]) -> dict:
    n, unanswerable = len(rows), sum(not r["golds"] for r in rows)
    said = sum(1 for r, f in zip(rows, fates) if not r["golds"] and f == "not said")
    wrong = fates.count("wrong")
    return {"right": fates.count("right"), "wrong": wrong, "wrong_pct": round(100 * wrong / n, 1), "said": said,
            "unanswerable": unanswerable,
            "honest": 100 * wrong / n <= WRONG_AT_MOST and 100 * said >= SAID_AT_LEAST * unanswerable}


def asked_elsewhere(states: torch.Tensor, y: torch.Tensor, table: list[dict], run: Path, reader: str,
                    at: tuple[float, float, float]) -> dict:
    """The hidden-state probe fitted on all of ``states`` (N, E) with labels ``y`` (N,), at the threshold
    ``best_threshold(table)`` chose, asked on run folder ``run``'s drafts: tallies of the probe with the word check,
    the checks at ``at`` (CHECK, DECLINE, SURE), and the probe on top of those checks."""
    best = best_threshold(table)
    if best is None:
        raise ValueError("no threshold of the probe keeps to the honesty on the run it is fitted on")
    rows = drafts(run)
    fates = [fate(r, 0.0, 1.0, 0.0) for r in rows]
    keep = [i for i, f in enumerate(fates) if f != "not said"]
    mean, std = states.mean(0), states.std(0) + 1e-9
    w, b = fit_logistic((states - mean) / std, y, HIDDEN_L2)
    there = cached_states(run, [rows[i] for i in keep], reader)
    scores = dict(zip(keep, torch.sigmoid((there - mean) / std @ w + b).tolist()))
    t = best["threshold"]
    probe = [checked(r["draft"], r["question"], r["passages"], CHECK) if scores.get(i, 0.0) >= t else NOT_SAID
             for i, r in enumerate(rows)]
    shipped = [fate(r, *at) for r in rows]
    on_top = [f if scores.get(i, 0.0) >= t else "not said" for i, f in enumerate(shipped)]
    y2 = [fates[i] == "right" for i in keep]
    v = [scores[i] for i in keep]
    return {"run": str(run), "threshold": t, "drafts": len(keep), "right_drafts": sum(y2),
            "auc": round(auc([a for a, r in zip(v, y2) if r], [a for a, r in zip(v, y2) if not r]), 3),
            "probe": tally(rows, [reply_fate(r, s) for r, s in zip(rows, probe)]),
            "checks": tally(rows, shipped), "probe_on_top": tally(rows, on_top),
            "all_drafts": tally(rows, fates)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.studies.check_signals", description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a natural run at --set natural.decline=1 (its natural.tasks.jsonl and banks)")
    p.add_argument("--answers", default=None, help="a run of another reading on the same questions whose drafts "
                                                   "answer where the first run's reply does")
    p.add_argument("--hidden", action="store_true",
                   help="also the reader's last hidden state at the confirmation question, read again (minutes)")
    p.add_argument("--ask", default=None, metavar="RUN2",
                   help="with --hidden: fit the probe on all of RUN's drafts, choose its threshold on their "
                        "book-by-book scores, and ask it on RUN2's drafts (questions it was not tuned on)")
    p.add_argument("--reader", default="qwen2.5-coder-1.5b", help="the reader whose hidden states --hidden reads")
    p.add_argument("--at", default="0.5,0.7,0.1", metavar="CHECK,DECLINE,SURE",
                   help="the first run's checks deciding whether to answer, with --answers (default: the 1.5B's "
                        "profile, 0.5,0.7,0.1)")
    args = p.parse_args(argv)
    if args.ask and not args.hidden:
        p.error("--ask asks the hidden-state probe: give --hidden too")
    rows = drafts(Path(args.run))
    fates = [fate(r, 0.0, 1.0, 0.0) for r in rows]
    keep = [i for i, f in enumerate(fates) if f != "not said"]  # drafts that answer (the reader wrote no decline)
    asked = any(rows[i].get("confirm") is not None for i in keep)  # a run that asked the reader's confirmation
    used = [j for j, name in enumerate(SIGNALS) if asked or name != "confirm"]
    x = torch.tensor([[signals(rows[i])[j] for j in used] for i in keep], dtype=torch.float64)
    y = torch.tensor([fates[i] == "right" for i in keep], dtype=torch.float64)
    out: dict = {"run": args.run, "drafts": len(keep), "right": int(y.sum()), "auc": {}}
    for k, name in enumerate(SIGNALS[j] for j in used):
        v = (-x[:, k] if name in LOWER_IS_SURER else x[:, k]).tolist()
        out["auc"][name] = round(auc([a for a, t in zip(v, y) if t], [a for a, t in zip(v, y) if not t]), 3)
    score = book_by_book(x, y, [rows[i]["id"].split(":")[0] for i in keep]).tolist()
    out["auc"]["all, book by book"] = round(auc([s for s, t in zip(score, y) if t],
                                                [s for s, t in zip(score, y) if not t]), 3)
    out["judged"] = judged(rows, dict(zip(keep, score)))
    if args.hidden:
        states = cached_states(Path(args.run), [rows[i] for i in keep], args.reader)
        books = [rows[i]["id"].split(":")[0] for i in keep]
        for name, feats in (("hidden state", states), ("hidden state and the signals", torch.cat([states, x], 1))):
            sc = book_by_book(feats, y, books, HIDDEN_L2)
            out["auc"][f"{name}, book by book"] = round(auc([s for s, t in zip(sc.tolist(), y) if t],
                                                            [s for s, t in zip(sc.tolist(), y) if not t]), 3)
            out.setdefault("judged_hidden", {})[name] = judged(rows, dict(zip(keep, sc.tolist())))
    check, decline, sure = (float(v) for v in args.at.split(","))
    if args.hidden and args.ask:
        out["asked"] = asked_elsewhere(states, y, out["judged_hidden"]["hidden state"], Path(args.ask), args.reader,
                                       (check, decline, sure))
    out["checks"] = tally(rows, [fate(r, check, decline, sure) for r in rows])
    if args.answers:
        other = {r["id"]: r for r in drafts(Path(args.answers))}
        both = [r for r in rows if r["id"] in other]
        decides = [fate(r, check, decline, sure) != "not said" for r in both]
        shown = [checked(other[r["id"]]["draft"], r["question"], other[r["id"]]["passages"], CHECK) if d
                 else NOT_SAID for r, d in zip(both, decides)]
        out["answered_by_the_other"] = tally(both, [reply_fate(r, s) for r, s in zip(both, shown)])
        out["first_alone"] = tally(both, [fate(r, check, decline, sure) for r in both])
    print(json.dumps(out))
    print(f"\n{out['drafts']} drafts ({out['right']} right). AUC, right against wrong drafts:\n")
    print("| signal | AUC |\n| --- | ---: |\n" + "\n".join(f"| {k} | {v:.2f} |" for k, v in out["auc"].items()))
    print("\nShown where the book-by-book score is above the threshold, then checked by the word check:\n")
    print("| threshold | right | wrong (of all) | unanswerable said | within the honesty |\n"
          "| ---: | ---: | ---: | ---: | --- |")
    for o in out["judged"]:
        print(f"| {o['threshold']:.2f} | {o['right']} | {o['wrong']} ({o['wrong_pct']:g}%) | {o['said']} of "
              f"{o['unanswerable']} | {'yes' if o['honest'] else ''} |")
    for name, table in out.get("judged_hidden", {}).items():
        best = best_threshold(table)
        print(f"\n{name} (book by book): " + (f"the most right within the honesty: {best['right']}, wrong "
              f"{best['wrong']} ({best['wrong_pct']:g}%), said {best['said']} of {best['unanswerable']} (threshold "
              f"{best['threshold']:g})" if best else "no threshold keeps to the honesty"))
    if "asked" in out:
        a = out["asked"]
        print(f"\nThe probe fitted on {args.run}, threshold {a['threshold']:g}, asked on {a['run']} ({a['drafts']} "
              f"drafts, {a['right_drafts']} right; AUC {a['auc']:.2f}):\n")
        print("| on the asked run | right | wrong (of all) | unanswerable said |\n| --- | ---: | ---: | ---: |")
        for name, key in (("every draft", "all_drafts"), ("the checks at " + args.at, "checks"),
                          ("the probe, then the word check", "probe"), ("the probe on top of the checks",
                                                                        "probe_on_top")):
            o = a[key]
            print(f"| {name} | {o['right']} | {o['wrong']} ({o['wrong_pct']:g}%) | {o['said']} of "
                  f"{o['unanswerable']} |")
    c = out["checks"]
    print(f"\nThe checks at {args.at}: right {c['right']}, wrong {c['wrong']} ({c['wrong_pct']:g}%), said {c['said']} "
          f"of {c['unanswerable']}.")
    if args.answers:
        a, f = out["answered_by_the_other"], out["first_alone"]
        print(f"Answered by {args.answers}'s drafts where {args.run}'s reply answers ({len(both)} questions): right "
              f"{a['right']}, wrong {a['wrong']} ({a['wrong_pct']:g}%), said {a['said']} of {a['unanswerable']}; "
              f"the first alone: right {f['right']}, wrong {f['wrong']} ({f['wrong_pct']:g}%), said {f['said']}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
