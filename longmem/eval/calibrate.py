"""The app's check (``tasks.evidence.Checker``), calibrated for a reader on the drafts a natural run recorded: what
a user would have been shown at each threshold of ``Reading.abstain``, without asking the reader again.

    longmem eval natural --reader qwen2.5-coder-1.5b --out runs/tune --set natural.sets=natural-tune,...
    python -m longmem.eval.calibrate runs/tune                      # outcomes per threshold (markdown + JSON)
    python -m longmem.eval.calibrate runs/tune --thresholds 0.3,0.5

The natural suite makes the app's draft whole (``answer(..., whole_draft=True)``), so the draft does not depend on
the threshold: only what the check shows of it does. For each answerable or unanswerable question the run recorded
(its ``natural.tasks.jsonl``: the app's draft and the ids of the passages it read), the draft is checked again
against those passages (read back from the run's banks) at each threshold; the reply is what the check shows, or
"the book does not say" when it shows nothing. At the run's own threshold this gives back the recorded replies
(``agrees``: how many of them; a draft whose spacing the record normalised may split into sentences otherwise).
Calibrate on tuning sets only: a threshold chosen on the dev sets fits them and nothing else.

A reader held to its decline (``Reading.decline``, the book-or-not prompt) is calibrated the same way from a run at
``--set natural.decline=1`` (the reader never declines, and the record keeps each draft with its probability of
"The book does not say."): at a decline threshold d the reply is that the book does not say where that probability
is above d, else the draft checked at the threshold of the check (``--declines``: the two are swept together).

    longmem eval natural --reader qwen2.5-coder-1.5b --out runs/tune --set natural.decline=1 --set ...
    python -m longmem.eval.calibrate runs/tune --declines 0.5,0.7,0.9

And ``Reading.sure`` (an answer shown only when each of its first tokens had at least that probability) is read off
any run's record, which keeps each draft token's probability (``--sure``: swept with the others). ``Reading.confirm``
(the reader asked, once its answer is made, whether the excerpts state it) is read off a run that asked it
(``--set natural.confirm=0.0001``: asked and recorded, acting almost never; ``--confirms``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from longmem.eval.answering import contains, says_not_said
from longmem.eval.core import table
from longmem.eval.natural import package_set_path, read_questions
from longmem.storage import BankDirectory
from longmem.tasks.answer import NOT_SAID
from longmem.tasks.evidence import ASKED, REACH, Checker
from longmem.tasks.reading import SURE_TOKENS
from longmem.util.data import data_dir

THRESHOLDS = (0.0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 1.0)
SURES = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5)  # thresholds of ``Reading.sure`` swept with ``--sure``
NOT_ASKED = "a threshold of confirm is read off a run that asked its reader (--set natural.confirm=0.0001)"
CONFIRMS = (0.0, 0.5, 0.7, 0.8, 0.85, 0.88, 0.9, 0.92, 0.94)  # thresholds of ``Reading.confirm`` (``--confirms``)
DECLINES = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)  # decline thresholds swept with ``--declines`` and no list
WRONG_AT_MOST = 26.0  # % of all questions asked that may get a wrong answer (the 135M app's share on the dev sets)
SAID_AT_LEAST = 70.0  # % of the unanswerable questions that must get "the book does not say" (the target)


def checked(draft: str, question: str, passages: list[str], least: float, shape: tuple[int, int] = (REACH, ASKED)
            ) -> str:
    """What the check at ``least`` shows of ``draft`` (``NOT_SAID`` when nothing); 0: the draft as it is."""
    if least <= 0:
        return draft.strip()
    checker = Checker(question, passages, least, *shape)
    checker.feed(draft)
    checker.finish()
    return checker.shown or NOT_SAID


def _golds(names: set[str], data: Path) -> dict[str, tuple[str, ...]]:
    """"book:question" -> accepted answers, over the question sets ``names`` (the package's or the shared data's)."""
    out = {}
    for name in names:
        path = package_set_path(name) or data / "bookqa" / f"{name}.jsonl"
        for q in read_questions(path):
            out[f"{q.book}:{q.question}"] = q.answers
    return out


def run_bank(run: Path, book: str) -> tuple[BankDirectory, str]:
    """The directory and name of the bank of ``book`` among natural run ``run``'s banks."""
    root = run / "natural-banks"
    found = sorted(p.name for p in root.glob(f"{Path(book).stem}-*") if p.is_dir())
    if len(found) != 1:
        raise ValueError(f"{root}: {len(found)} banks for {book} (expected one: the run's)")
    return BankDirectory(root), found[0]


def recorded_units(run: Path) -> dict[str, dict]:
    """The units of run folder ``run``'s ``natural.tasks.jsonl`` by key, the last record of a unit winning (as a
    resumed run reads it)."""
    path = run / "natural.tasks.jsonl"
    if not path.is_file():
        raise ValueError(f"{run}: no natural.tasks.jsonl (run `longmem eval natural --out {run}` first)")
    units: dict[str, dict] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            units[row["key"]] = row
    return units


def drafts(run: Path, data: Path | None = None) -> list[dict]:
    """The app's recorded drafts of run folder ``run`` with what they read: {"id", "question", "golds", "draft",
    "passages", "answer" (the recorded reply), "least" (the run's threshold), "decline" (the reader's probability of
    declining, None where not read), "declines_at" (the run's decline threshold, 0: none)}, in record order (the last
    record of a unit wins, as a resumed run reads it)."""
    path = run / "natural.tasks.jsonl"
    units = recorded_units(run)
    golds = _golds({key.split("/")[0] for key in units}, data or data_dir())
    out = []
    for key, row in units.items():
        book, least = key.split("/", 1)[1], row["signature"]["size"]["abstain"]
        shape = (row["signature"]["size"].get("reach", REACH), row["signature"]["size"].get("asked_words", ASKED))
        declines_at = row["signature"]["size"].get("decline", 0.0)
        apps = row["value"]["scores"].get("app", [])
        if not any("read" in x for x in apps):
            raise ValueError(f"{path}, unit {key}: the app's replies have no passage ids (a run before "
                             "eval.calibrate existed): run it again")
        directory, name = run_bank(run, book)
        with directory.open(name) as bank:
            for x in apps:
                out.append({"id": x["id"], "question": x["id"].split(":", 1)[1], "golds": golds[x["id"]],
                            "draft": x["draft"], "passages": read_texts(bank, x["read"]),
                            "answer": x["answer"], "least": least, "decline": x.get("decline"),
                            "declines_at": declines_at, "probs": x.get("probs"), "shape": shape,
                            "confirm": x.get("confirm")})
    return out


def script_right(run: Path) -> dict[str, bool]:
    """The RAG script's replies recorded in run folder ``run`` (its ``rag_script`` entrant): for each answerable
    question's id, whether the script answered it right (the last record of a unit wins, as in ``drafts``)."""
    units = recorded_units(run)
    out = {x["id"]: x["contains"] >= 1.0 for row in units.values()
           for x in row["value"]["scores"].get("rag_script", []) if x["answerable"] and "contains" in x}
    if not out:
        raise ValueError(f"{run / 'natural.tasks.jsonl'}: the RAG script answered no answerable question there "
                         "(--set natural.entrants=...,rag_script)")
    return out


def read_texts(bank, read: list) -> list[str]:
    """The texts an answer read, as its record names them (``eval.answering.read_ref``): a passage's id, a span's
    passages' ids (its text runs from the first's start to the last's end: ``tasks.spans``), or a window of the raw
    text ({"window": [document, start, end]}); passages no longer stored are left out."""
    ids = [i for r in read if not isinstance(r, dict) for i in (r if isinstance(r, list) else [r])]
    refs = {p.id: p for p in bank.passages(ids)}
    out = []
    for r in read:
        if isinstance(r, dict):
            out.append(bank.document_text_between(*r["window"]))
            continue
        ps = [refs[i] for i in (r if isinstance(r, list) else [r]) if i in refs]
        if len(ps) == 1 and not isinstance(r, list):
            out.append(ps[0].text)
        elif ps:
            out.append(bank.document_text_between(ps[0].document_id, ps[0].char_start, ps[-1].char_end))
    return out


def outcomes(rows: list[dict], least: float, decline: float | None = None, sure: float | None = None,
             shape: tuple[int, int] = (REACH, ASKED), confirm: float | None = None,
             script: dict[str, bool] | None = None) -> dict:
    """What the check at ``least`` gives a user over ``rows`` (``drafts``), the reader declining where its
    probability of it is above ``decline`` (None: as recorded) and saying that the book does not say where its least
    sure first token was below ``sure`` (None: as recorded, 0: never) or where it confirmed its answer below
    ``confirm`` (None: not applied): answerable right / the book does not say / wrong, unanswerable said / invented,
    wrong answers of all asked (%), and how many replies equal the recorded ones (at the run's thresholds). With
    ``script`` (``script_right``), paired with the RAG script over the answerable questions both answered: its right
    answers (``script_right``), and the questions only the app gets right (``only_app``) or only the script
    (``only_script``)."""
    if decline is not None and any(r.get("declines_at", 0.0) < 1.0 for r in rows):
        raise ValueError("a decline threshold is read off a run that never declined (--set natural.decline=1); "
                         "this run's reader declined where sure, and its answer there was not made")
    if sure is not None and any(r.get("probs") is None for r in rows):
        raise ValueError("a threshold of sure is read off a run whose record keeps the draft tokens' probabilities "
                         "(run it again)")
    if confirm and not any(r.get("confirm") is not None for r in rows):
        raise ValueError(NOT_ASKED)
    o = {"least": least, "decline": decline, "sure": sure, "confirm": confirm, "shape": list(shape), "right": 0,
         "declined": 0, "wrong": 0, "not_said": 0, "invented": 0, "agrees": 0}
    if script is not None:
        o |= {"script_right": 0, "only_app": 0, "only_script": 0}
    for r in rows:
        shown = shown_of(r, least, decline, sure, shape, confirm)
        said = shown != NOT_SAID
        if r["golds"]:
            key = "right" if contains(shown, r["golds"]) else "wrong" if said and not says_not_said(shown) \
                else "declined"
        else:
            key = "not_said" if not said or says_not_said(shown) else "invented"
        o[key] += 1
        if script is not None and r["golds"] and r["id"] in script:
            theirs = script[r["id"]]
            o["script_right"] += theirs
            o["only_app"] += key == "right" and not theirs
            o["only_script"] += key != "right" and theirs
        o["agrees"] += (least == r["least"] and (decline is None or decline == r["declines_at"]) and sure is None
                        and not confirm
                        and tuple(shape) == tuple(r.get("shape", (REACH, ASKED)))
                        and " ".join(shown.split()) == " ".join(r["answer"].split()))
    asked = len(rows)
    o["answerable"], o["unanswerable"] = o["right"] + o["declined"] + o["wrong"], o["not_said"] + o["invented"]
    o["wrong_pct"] = 100 * (o["wrong"] + o["invented"]) / asked if asked else 0.0
    return o


CHECKS = ("words", "decline", "sure", "confirm")  # the checks of an answer: the word check (``Reading.abstain``), the
#                                                 reader's decline (``Reading.decline``), the least-sure rule
#                                                 (``Reading.sure``) and the reader's confirmation (``Reading.confirm``)


def shown_of(r: dict, least: float, decline: float | None = None, sure: float | None = None,
             shape: tuple[int, int] = (REACH, ASKED), confirm: float | None = None) -> str:
    """The reply row ``r``'s reader would show: ``NOT_SAID`` where its probability of declining is above ``decline``,
    its least sure first token below ``sure`` or its confirmation below ``confirm`` (None or 0: not applied; a row
    without the value: not applied either), else its draft as the check at ``least`` shows it."""
    declined = decline is not None and r.get("decline") is not None and r["decline"] > decline
    unsure = bool(sure) and min(r["probs"][:SURE_TOKENS], default=0.0) < sure
    unconfirmed = bool(confirm) and r.get("confirm") is not None and r["confirm"] < confirm
    if declined or unsure or unconfirmed:
        return NOT_SAID
    return checked(r["draft"], r["question"], r["passages"], least, shape)


def fate(r: dict, least: float, decline: float | None, sure: float | None,
         shape: tuple[int, int] = (REACH, ASKED), confirm: float | None = None) -> str:
    """What a user is shown of row ``r`` under those thresholds (``shown_of``, ``reply_fate``)."""
    return reply_fate(r, shown_of(r, least, decline, sure, shape, confirm))


def reply_fate(r: dict, shown: str) -> str:
    """"right", "wrong" (an answerable question answered wrongly, an unanswerable one answered) or "not said" for the
    reply ``shown`` to row ``r``'s question."""
    if shown == NOT_SAID or says_not_said(shown):
        return "not said"
    return "right" if r["golds"] and contains(shown, r["golds"]) else "wrong"


def check_costs(rows: list[dict], least: float, decline: float, sure: float,
                shape: tuple[int, int] = (REACH, ASKED), confirm: float = 0.0) -> list[dict]:
    """Per check, on a run that never declined: the right drafts it kills and the wrong ones it stops, alone (the
    other checks off) and within the set (the others on: what turning it off would change). A draft is right when the
    whole draft holds an accepted answer; wrong when it answers wrongly (or answers an unanswerable question). The
    reader's confirmation is among the checks when ``confirm`` > 0 (a run that asked it)."""
    if any(r.get("declines_at", 0.0) < 1.0 for r in rows):
        raise ValueError("each check's costs are read off a run that never declined (--set natural.decline=1)")
    if confirm and not any(r.get("confirm") is not None for r in rows):
        raise ValueError(NOT_ASKED)
    on = {"words": least, "decline": decline, "sure": sure, "confirm": confirm}
    off = {"words": 0.0, "decline": 1.0, "sure": 0.0, "confirm": 0.0}

    def fates(at: dict) -> list[str]:
        return [fate(r, at["words"], at["decline"], at["sure"], shape, at["confirm"]) for r in rows]
    bare, full = fates(off), fates(on)
    out = []
    for c in CHECKS:
        if c == "confirm" and not confirm:
            continue
        alone, without = fates(off | {c: on[c]}), fates(on | {c: off[c]})
        out.append({"check": c, "threshold": on[c],
                    "alone_kills_right": sum(b == "right" and a != "right" for b, a in zip(bare, alone)),
                    "alone_stops_wrong": sum(b == "wrong" and a == "not said" for b, a in zip(bare, alone)),
                    "within_kills_right": sum(w == "right" and f != "right" for w, f in zip(without, full)),
                    "within_stops_wrong": sum(w == "wrong" and f == "not said" for w, f in zip(without, full))})
    return out


def costs_markdown(costs: list[dict], drafts_right: int, drafts_wrong: int) -> str:
    rows = [[c["check"], f"{c['threshold']:g}", str(c["alone_kills_right"]), str(c["alone_stops_wrong"]),
             str(c["within_kills_right"]), str(c["within_stops_wrong"])] for c in costs]
    return (f"Each check on the drafts ({drafts_right} right, {drafts_wrong} wrong, unchecked):\n\n"
            + table(["check", "threshold", "alone: right killed", "alone: wrong stopped", "with the others: right "
                     "killed", "with the others: wrong stopped"], rows))


def markdown(results: list[dict], run: Path) -> str:
    swept = [k for k in ("decline", "sure", "confirm") if any(o.get(k) is not None for o in results)]
    shapes = len({tuple(o["shape"]) for o in results}) > 1
    paired = "script_right" in results[0]
    rows = [[f"{o[k]:g}" for k in swept] + ["{}, {}".format(*o["shape"])] * shapes + [
        f"{o['least']:g}", str(o["right"])] + [f"{o['script_right']}: {o['only_app']} / {o['only_script']}"] * paired
        + [str(o["declined"]), str(o["wrong"]), str(o["not_said"]), str(o["invented"]), f"{o['wrong_pct']:.0f}%"]
        for o in results]
    head = (f"The app's check on {run}'s drafts ({results[0]['answerable']} answerable, "
            f"{results[0]['unanswerable']} unanswerable questions), per threshold (0: every draft shown)"
            + "".join(f", per threshold of {k}" for k in swept) + ":")
    return "\n\n".join([head, table(swept + ["reach, question words"] * shapes + ["threshold", "right"] + [
        "the script's right: only the app / only the script"] * paired + [
        "says the book does not say", "wrong", "unanswerable: says so", "invents", "wrong answers, of all asked"],
        rows)])


def choose(results: list[dict], wrong_at_most: float = WRONG_AT_MOST,
           said_at_least: float = SAID_AT_LEAST) -> dict | None:
    """The threshold that answers most questions right with wrong answers at most ``wrong_at_most`` % of all asked and
    "the book does not say" for at least ``said_at_least`` % of the unanswerable questions (ties: the lower wrong
    share, then the higher threshold, the lower decline threshold (declining early, without writing an answer that
    would not be shown), the lower sure, the lower confirm); None when none keeps to both."""
    ok = [o for o in results if o["wrong_pct"] <= wrong_at_most
          and 100 * o["not_said"] >= said_at_least * max(1, o["unanswerable"])]
    return max(ok, key=lambda o: (o["right"], -o["wrong_pct"], o["least"], -(o.get("decline") or 0.0),
                                  -(o.get("sure") or 0.0), -(o.get("confirm") or 0.0))) if ok else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m longmem.eval.calibrate", description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a natural run's --out folder (its natural.tasks.jsonl and natural-banks/)")
    p.add_argument("--thresholds", default=",".join(f"{t:g}" for t in THRESHOLDS),
                   help="comma-separated thresholds of Reading.abstain to check the drafts at")
    p.add_argument("--declines", nargs="?", const=",".join(f"{t:g}" for t in DECLINES), default=None,
                   help="comma-separated thresholds of Reading.decline, swept with --thresholds, on a run at "
                        "--set natural.decline=1 (no list: "
                        f"{','.join(f'{t:g}' for t in DECLINES)}); default: the run's replies as recorded")
    p.add_argument("--sure", nargs="?", const=",".join(f"{t:g}" for t in SURES), default=None,
                   help="comma-separated thresholds of Reading.sure, swept with the others (no list: "
                        f"{','.join(f'{t:g}' for t in SURES)}); default: the run's replies as recorded")
    p.add_argument("--confirms", nargs="?", const=",".join(f"{t:g}" for t in CONFIRMS), default=None,
                   help="comma-separated thresholds of Reading.confirm, swept with the others, on a run that asked "
                        f"its reader (no list: {','.join(f'{t:g}' for t in CONFIRMS)}); default: not applied")
    p.add_argument("--wrong-at-most", type=float, default=WRONG_AT_MOST,
                   help=f"%% of all questions that may be answered wrongly (default {WRONG_AT_MOST:g})")
    p.add_argument("--said-at-least", type=float, default=SAID_AT_LEAST,
                   help=f"%% of unanswerable questions that must be told the book does not say (default "
                        f"{SAID_AT_LEAST:g})")
    p.add_argument("--shapes", default=f"{REACH}:{ASKED}",
                   help="comma-separated shapes of the check's stretches, REACH:WORDS (sentences either side; the "
                        "question's words a stretch must hold: Reading.reach, Reading.asked_words), swept with the "
                        f"others (default {REACH}:{ASKED})")
    p.add_argument("--costs", default=None, metavar="CHECK,DECLINE,SURE[,CONFIRM]",
                   help="also each check's right drafts killed and wrong ones stopped at these thresholds (of the "
                        "word check, the decline, sure and, on a run that asked it, confirm; a run at --set "
                        "natural.decline=1), e.g. 0.5,0.7,0.1")
    p.add_argument("--script", nargs="?", const="", default=None, metavar="RUN",
                   help="pair each outcome with the RAG script's replies recorded in RUN (a natural run's --out "
                        "folder whose entrants included rag_script; no RUN: this run's own; give the run first)")
    p.add_argument("--data-dir", default=None, help="the shared data folder (default: $LONGMEM_DATA_DIR, else "
                                                    "../shared/data)")
    args = p.parse_args(argv)
    try:
        thresholds = [float(t) for t in args.thresholds.split(",") if t.strip()]
        declines = [float(t) for t in args.declines.split(",") if t.strip()] if args.declines else [None]
        sures = [float(t) for t in args.sure.split(",") if t.strip()] if args.sure else [None]
        confirms = [float(t) for t in args.confirms.split(",") if t.strip()] if args.confirms else [None]
        rows = drafts(Path(args.run), Path(args.data_dir) if args.data_dir else None)
        shapes = [tuple(int(x) for x in sh.split(":")) for sh in args.shapes.split(",") if sh.strip()]
        if any(len(sh) != 2 for sh in shapes):
            raise ValueError(f"--shapes: REACH:WORDS pairs, got {args.shapes!r}")
        script = None if args.script is None else script_right(Path(args.script or args.run))
        results = [outcomes(rows, t, d, u, sh, c, script) for sh in shapes for d in declines for u in sures
                   for c in confirms for t in thresholds]
        at = [float(x) for x in args.costs.split(",")] if args.costs else None
        if at is not None and len(at) not in (3, 4):
            raise ValueError("--costs takes three or four thresholds: the word check's, the decline's, sure's and "
                             "confirm's")
        costs = check_costs(rows, *at[:3], shapes[0], *at[3:]) if at else None
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    best = choose(results, args.wrong_at_most, args.said_at_least)
    print(json.dumps({"run": args.run, "questions": len(rows), "results": results,
                      "chosen": best["least"] if best else None, "chosen_decline": best["decline"] if best else None,
                      "chosen_sure": best["sure"] if best else None, "chosen_shape": best["shape"] if best else None,
                      "chosen_confirm": best["confirm"] if best else None,
                      **({"costs": costs} if costs else {})}))
    print(markdown(results, Path(args.run)))
    if costs:
        fates = [fate(r, 0.0, 1.0, 0.0) for r in rows]
        print("\n" + costs_markdown(costs, fates.count("right"), fates.count("wrong")))
    print(f"\nChosen (most right with wrong answers <= {args.wrong_at_most:g}% of all asked and the book said not to "
          f"say for >= {args.said_at_least:g}% of the unanswerable): "
          + (f"{best['least']:g}" + "".join(f", {k} {best[k]:g}" for k in ("decline", "sure", "confirm")
                                            if best[k] is not None)
             + ", stretch (reach, question words) {}, {}".format(*best["shape"]) if best else "none keeps to it"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
