"""Suite 4, open-ended in-context learning on SQuAD (paper table 6): exact match and F1 of generated answers.

Per seed: ``n_context`` (3) solved demonstrations in the prompt, ``n_memory`` (200) more in LongMem's memory, and
test questions whose passages no demonstration uses (``longmem.eval.datasets.squad``). The 1k backbone reads the 3
demonstrations; the full-context backbone also reads as many memory demonstrations as fit before them. Each model
answers greedily after "Answer:" until a newline (at most ``max_new_tokens``); the answer is scored with the
official SQuAD v1.1 normalisation, EM and F1 in %.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

from longmem.eval.core import (
    WITH_MEMORY,
    Entrant,
    EvalContext,
    SuiteResult,
    Timer,
    mean_std,
    memory_empty,
    table,
    versus,
)
from longmem.eval.datasets.squad import (
    QA,
    answer_from_generation,
    exact_match,
    f1,
    format_demo,
    format_prompt,
    read_squad,
    split_squad,
)
from longmem.eval.scoring import Prefix
from longmem.memory.memory import Memory
from longmem.model.lm import SegmentLM

SEPARATOR = "\n"  # between demonstrations, and before the test passage


@dataclass
class Size:
    n_context: int = 3  # demonstrations in the prompt
    n_memory: int = 200  # demonstrations in LongMem's memory
    chunk_size: int = 2  # memory chunk size for demonstrations
    test: int = 300  # test questions per seed
    seeds: int = 1
    max_new_tokens: int = 24  # longest answer generated


QUICK = Size(n_memory=8, test=3)
FULL = Size()


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False).input_ids


def newline_ids(tokenizer) -> set[int]:
    """Tokens that contain a line break: an answer ends there."""
    pieces = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    return {i for i, p in enumerate(pieces) if "\n" in p}


def demos_ids(tokenizer, demos: Sequence[QA]) -> list[int]:
    return encode(tokenizer, "".join(format_demo(q) + SEPARATOR for q in demos)) if demos else []


def full_context_demos(tokenizer, context: Sequence[QA], memory: Sequence[QA], budget: int) -> list[int]:
    """The prompt's demonstrations preceded by as many memory demonstrations as fit in ``budget`` tokens."""
    shots = demos_ids(tokenizer, context)
    extra: list[int] = []
    for q in reversed(memory):
        ids = demos_ids(tokenizer, [q])
        if len(shots) + len(extra) + len(ids) > budget:
            break
        extra = ids + extra
    return extra + shots


def answer(lm: SegmentLM, memory: Memory | None, prefix: Prefix | None, context: list[int], qa: QA,
           max_new: int, stops: set[int]) -> str:
    """The model's greedy answer to ``qa`` after the demonstrations (``prefix``, already read, or ``context``)."""
    tok = lm.backbone.tokenizer
    ids = encode(tok, format_prompt(qa))
    if prefix is not None and len(ids) + max_new <= prefix.room:
        state = prefix.extend(ids)
    else:  # the demonstrations and this passage do not fit together: keep their end
        state = Prefix.read(lm, (context + ids)[-(lm.segment_len - max_new):], memory)
    return answer_from_generation(tok.decode(state.greedy(max_new, tuple(stops))))


def run_entrant(entrant: Entrant, context: list[QA], memory_demos: list[QA], test: list[QA], size: Size,
                bank: Memory | None, stops: set[int], log) -> dict:
    lm, tok = entrant.lm, entrant.lm.backbone.tokenizer
    budget = lm.segment_len - 512  # room for a test passage, question and answer
    ids = (full_context_demos(tok, context, memory_demos, budget) if entrant.key == "backbone_full"
           else demos_ids(tok, context)[-budget:])
    memory = bank if lm.uses_memory else None
    prefix = Prefix.read(lm, ids, memory) if ids else None
    em, f = [], []
    for qa in test:
        pred = answer(lm, memory, prefix, ids, qa, size.max_new_tokens, stops)
        em.append(100 * exact_match(pred, qa.answers))
        f.append(100 * f1(pred, qa.answers))
    log(f"squad {entrant.key}: EM {sum(em) / len(em):.1f}, F1 {sum(f) / len(f):.1f} ({len(test)} questions)")
    return {"em": sum(em) / len(em), "f1": sum(f) / len(f), "questions": len(test)}


def run(ctx: EvalContext) -> SuiteResult:
    size: Size = ctx.size("squad", QUICK, FULL)
    timer = Timer()
    qas = read_squad(ctx.data_dir / "squad" / "dev-v1.1.json")
    stops = newline_ids(ctx.tokenizer)
    runs = []
    empty = memory_empty(ctx.entrants)
    for s in range(size.seeds):
        split = split_squad(qas, size.n_context, size.n_memory, size.test, seed=ctx.seed + s)
        for e in ctx.entrants + empty:
            bank = None
            if e.lm.uses_memory:
                bank = e.lm.new_memory(capacity=None, chunk_size=size.chunk_size)
                if e.fills_memory:
                    e.lm.memorize(demos_ids(ctx.tokenizer, split.memory), bank)
            r = run_entrant(e, split.context, split.memory, split.test, size, bank, stops, ctx.log)
            runs.append({"model": e.key, "seed": ctx.seed + s, **r})
    rows, summary = [], {}

    def fmt(m: tuple[float, float], n: int) -> str:  # mean ± std over n seeds (the mean alone for one)
        return f"{m[0]:.1f}" if n < 2 else f"{m[0]:.1f} ± {m[1]:.1f}"

    for e in ctx.entrants + empty:
        sel = [r for r in runs if r["model"] == e.key]
        summary[e.key] = {m: mean_std([r[m] for r in sel]) for m in ("em", "f1")}
        rows.append([e.label, fmt(summary[e.key]["em"], len(sel)), fmt(summary[e.key]["f1"], len(sel))])
    scores = {k: {"EM": v["em"][0], "F1": v["f1"][0]} for k, v in summary.items()}
    notes = [versus(scores, lambda v: v, False) + f" Every model reads the same {size.n_context} demonstrations; "
             f"the models with memory hold {size.n_memory} more there (chunk size {size.chunk_size})."]
    for e in empty:
        m = e.empty_of
        em = {k: summary[k]["em"][0] for k in ("backbone_1k", e.key, m)}
        name, alone = WITH_MEMORY[m]
        notes.append(f"EM: {name} with its memory empty ({alone}) moves the 1k backbone's {em['backbone_1k']:.1f} to "
                     f"{em[e.key]:.1f}; memory then moves it to {em[m]:.1f}.")
    return SuiteResult("squad", f"Open-ended in-context learning on SQuAD (paper table 6): {size.n_context} "
                       f"demonstrations in context, {size.n_memory} in memory", [table(["model", "EM", "F1"], rows)],
                       {"runs": runs, "summary": summary, "models": {e.key: e.label for e in ctx.entrants + empty}},
                       asdict(size), [], notes, timer.seconds)
