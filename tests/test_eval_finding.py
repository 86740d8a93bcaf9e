"""The finding suite (``longmem.eval.finding``): Wilson intervals, first-gold ranks, settings refused before any work,
and a run on a tiny llama's real bank where every finder ranks the zeppelin's passage, resumed per set and book."""

from __future__ import annotations

import pytest
from test_eval_natural import data_folder

from longmem.eval.core import EvalContext
from longmem.eval.finding import first_gold, recall, run, wilson


def test_wilson_intervals_match_their_closed_form():
    low, high = wilson(5, 10)
    assert low == pytest.approx(0.2366, abs=1e-3) and high == pytest.approx(0.7634, abs=1e-3)
    low, high = wilson(0, 10)
    assert low == 0.0 and high == pytest.approx(0.2775, abs=1e-3)
    assert wilson(10, 10)[1] == 1.0 and wilson(0, 0) == (0.0, 1.0)


def test_the_first_gold_passage_is_ranked_and_recall_counts_within_k():
    assert first_gold([7, 3, 9, 4], {4, 9}) == 3
    assert first_gold([7, 3], {4}) == 0
    r = recall([1, 3, 0, 5, 2], 2)
    assert (r["hits"], r["n"], r["recall"]) == (2, 5, 0.4) and r["low"] < 0.4 < r["high"]


@pytest.mark.parametrize("setting, message", [({"finders": "app,nobody"}, "unknown: \\['nobody'\\]"),
                                              ({"finders": "app,app"}, "give each once"),
                                              ({"max_tokens": "-1"}, "must be >= 0"),
                                              ({"rerank_depth": "0"}, "rerank_depth must be in 1..50"),
                                              ({"sets": "no-such-set"}, "finding.sets: no question set 'no-such-set'")])
def test_bad_finding_settings_are_refused_before_any_work(tmp_path, setting, message):
    ctx = EvalContext(None, [], tmp_path, tmp_path, overrides={"finding": setting})  # no model: nothing may load
    with pytest.raises(ValueError, match=message):
        run(ctx)


@pytest.mark.heavy
def test_a_run_ranks_the_gold_passage_per_finder_and_resumes(tmp_path):
    from tiny import chat_model

    from longmem.model.embedder import Embedder, default_model_dir
    from longmem.model.question_encoder import QuestionEncoder, weights_sha256, with_factors

    encoder = tmp_path / "encoder"  # untrained factors: the stock embedder's ranking
    QuestionEncoder(with_factors(Embedder.load(), 2), {"rank": 2, "base_sha256": weights_sha256(
        default_model_dir())}).save(encoder)
    from longmem.model.reranker import Reranker

    reranker = tmp_path / "reranker"  # untrained: a random head's order of the app's best two
    Reranker.new(Embedder.load(), 2, max_length=64).save(reranker)
    data, out = data_folder(tmp_path), tmp_path / "out"
    logs: list[str] = []
    setting = {"sets": "natural-dev", "finders": "app,bm25,embed,trained,fused,rerank,memory", "encoder": str(encoder),
               "reranker": str(reranker), "rerank_depth": "2"}
    ctx = EvalContext(chat_model(segment_len=256), [], data, out, overrides={"finding": setting}, resume=True,
                      log=logs.append)
    result = run(ctx)
    ranks = result.data["ranks"]["natural-dev/tale.txt"]
    assert result.data["questions"]["natural-dev/tale.txt"] == ["What drifted over the harbour?",
                                                                "Who wrote the last line?"]
    assert ranks["app"][0] == ranks["bm25"][0] == 1  # BM25 ranks the zeppelin's passage first
    assert ranks["bm25"][1] == 0 < ranks["app"][1]  # no word of the second in the book: the app reads what memory
    #                                                 finds, BM25 finds nothing
    assert ranks["trained"] == ranks["embed"]  # untrained factors rank as the stock embedder
    for app, rerank in zip(ranks["app"], ranks["rerank"]):  # the reranker orders the app's best two, no others
        assert (0 < rerank <= 2) if 0 < app <= 2 else rerank == app
    assert all(len(r) == 2 and all(x >= 0 for x in r) for r in ranks.values())
    cells = result.data["results"]["natural-dev"]
    assert set(cells) == set(setting["finders"].split(",")) and set(cells["app"]) == {"1", "2", "4", "8"}
    assert cells["app"]["8"]["recall"] >= cells["app"]["1"]["recall"]
    assert (out / "finding.png").stat().st_size > 1000
    assert "at 4: only it vs only app" in result.tables[0]
    logs.clear()
    again = run(ctx)  # resumed: nothing is ranked again
    assert again.data["ranks"] == result.data["ranks"] and not any("finding, tale.txt" in m for m in logs)
