"""The facts suite: a fact stated in a short excerpt of book text, asked about plainly; the excerpt spliced into the
filler's bank D tokens before the question, answered by the entrants on a tiny llama, resumed per block."""

from __future__ import annotations

import numpy as np
import pytest
from tiny import char_tokenizer, chat_model

from longmem.eval.core import EvalContext
from longmem.eval.datasets.recall import NAME_FACTS, NUMBER_FACTS, make_fact_passage
from longmem.util.data import data_dir

BOOK = ("The tide came in slowly. Gulls cried over the pier! Nobody answered the bell. " * 12).strip()


def test_a_fact_passage_states_its_fact_between_whole_sentences():
    tok = char_tokenizer()
    ids = np.asarray(tok(BOOK, add_special_tokens=False).input_ids)
    for seed, kind in [(0, "number"), (1, "name"), (2, None)]:
        f = make_fact_passage(tok, ids, np.random.default_rng(seed), n_tokens=120, kind=kind)
        facts = {q: s for s, q in NUMBER_FACTS + NAME_FACTS}
        assert f.question in facts and facts[f.question].format(f.answer).strip() in f.text
        assert f.kind == (kind or f.kind) and (f.answer.isdigit() == (f.kind == "number"))
        assert f.text[0].isupper() and f.text.endswith((".", "!", "?"))  # starts and ends at sentence ends
        assert f == make_fact_passage(tok, ids, np.random.default_rng(seed), n_tokens=120, kind=kind)
    with pytest.raises(ValueError, match="kind must be"):
        make_fact_passage(tok, ids, np.random.default_rng(0), kind="colour")
    with pytest.raises(ValueError, match="needs a filler at least that long"):
        make_fact_passage(tok, ids[:50], np.random.default_rng(0), n_tokens=120)


@pytest.mark.heavy
@pytest.mark.shared_data
def test_a_run_answers_every_fact_at_each_distance_and_resumes(tmp_path):
    from longmem.eval.facts import Size, items, run
    from longmem.eval.recall import filler

    out, logs = tmp_path / "out", []
    setting = {"entrants": "longmem,app,rag_bm25,oracle", "facts": "3", "excerpt": "80",
               "distances": "600,1200", "block": "2", "new_tokens": "4"}
    ctx = EvalContext(chat_model(segment_len=256), [], data_dir(), out, overrides={"facts": setting}, resume=True,
                      log=logs.append)
    result = run(ctx)
    data = result.data
    assert [f["id"].rsplit("-", 1)[1] in ("number", "name") for f in data["facts"]] == [True] * 3
    assert set(data["results"]) == {"longmem", "app", "rag_bm25", "oracle"}
    for by_d in data["results"].values():
        assert set(by_d) == {"600", "1200"} and all(len(r["items"]) == 3 for r in by_d.values())
    assert set(data["gold_read"]) == {"lexical"}  # BM25 reads for LongMem and for BM25-RAG
    assert any("against its oracle" in n for n in result.notes) or "oracle" not in data["results"]
    assert (out / "facts.png").stat().st_size > 1000
    assert len((out / "facts.tasks.jsonl").read_text().splitlines()) == 4  # 2 blocks x 2 distances
    assert any((out / "bookqa-banks").glob("filler-600-*"))  # the filler banks are bookqa's, shared
    logs.clear()
    again = run(ctx)  # every block is reused: nothing is asked again
    assert again.data["results"] == data["results"] and not any("to run" in m for m in logs)
    short, _ = filler(ctx, 600)
    longer, borrowed = filler(ctx, len(short) + 5000)  # training books after the held-out ones
    assert borrowed > 0 and items(ctx, Size(facts=3), short) == items(ctx, Size(facts=3), longer)  # the same facts


def test_bad_facts_settings_are_refused_before_any_work(tmp_path):
    from longmem.eval.facts import run

    ctx = EvalContext(None, [], tmp_path, tmp_path, overrides={"facts": {"entrants": "oracle,nobody"}})
    with pytest.raises(ValueError, match="facts.entrants"):
        run(ctx)
