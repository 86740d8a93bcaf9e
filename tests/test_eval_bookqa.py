"""The bookqa suite's item mechanics on a tiny llama and a real bank: an item's paragraph spliced into the filler's
bank and memory is found, read and cited like any document, and afterwards both are exactly as they were."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import story
from tiny import chat_model

from longmem.eval.bookqa import gold_found, spliced
from longmem.eval.datasets.squad import QA
from longmem.ingest.pipeline import ingest
from longmem.storage import BankDirectory
from longmem.tasks.reading import PassageFinder, Reading, reading_prompt

QA_ITEM = QA(id="q1", title="Lighthouses", question="Who lit the great lamp at Pharos?", answers=("Sostratus",),
             passage="The great lamp at Pharos was lit by Sostratus of Cnidus. Sailors saw its fire from far out "
                     "at sea, and the harbour of Alexandria grew rich on the ships it guided home.")


def test_a_spliced_paragraph_is_found_and_leaves_no_trace(tmp_path):
    model = chat_model(segment_len=256)
    book = tmp_path / "filler.txt"
    book.write_text(story(zeppelin=False))
    with BankDirectory(tmp_path / "banks").create("filler", model) as bank:
        ingest(bank, model, book)
        memory = bank.load_memory(model)
        before = {t: bank.db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("segments", "passages",
                                                                                         "documents")}
        q = torch.randn(1, model.backbone.spec.n_heads, 6, model.backbone.spec.head_dim,
                        generator=torch.Generator().manual_seed(0))
        searched = memory.search(q, 4)
        n = len(memory)
        with spliced(bank, model, memory, QA_ITEM) as (doc_id, places):
            assert len(memory) > n and bank.document(doc_id).status == "complete"
            finder = PassageFinder(bank, model, memory, places)
            found = finder.find(QA_ITEM.question, Reading(finder="lexical", passages=2))
            assert found[0].passage.document_id == doc_id and "Sostratus" in found[0].passage.text
            serial = n // model.chunk_size + 3  # a chunk of the paragraph votes for its passage
            assert {p.id for p in bank.passages(list(places.votes({serial: 1})))} == {found[0].passage.id}
            prompt = reading_prompt(QA_ITEM.question, [gold_found(QA_ITEM, doc_id)])
            assert QA_ITEM.passage in prompt and "Lighthouses, 0% in" in prompt  # the prompt's wording (prompt_place)
        after = {t: bank.db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in before}
        assert after == before and len(memory) == n
        again = memory.search(q, 4)
        assert torch.equal(again.chunk_ids, searched.chunk_ids) and torch.equal(again.keys, searched.keys)
        assert bank.search_passages("Sostratus Pharos", 5) == [] and bank.verify().ok
        assert not np.isin(QA_ITEM.id, [d.source for d in bank.documents()])


def test_an_answer_counts_when_it_contains_a_gold_answer():
    from longmem.eval.answering import contains

    assert contains("The V&A co-owns Canova's The Three Graces.", ["The Three Graces"]) == 1.0
    assert contains("It was lit by Sostratus of Cnidus.", ["Pharos", "Sostratus"]) == 1.0
    assert contains("The answer is: Denver", ["Denver Broncos"]) == 0.0
    assert contains("Teslas friend", ["Tesla"]) == 0.0  # whole words only


def test_a_subset_of_entrants_records_the_finders_it_reads_with():
    from longmem.eval.answering import LABELS, finders

    assert finders(list(LABELS)) == ["lexical", "memory", "fused", "embed", "script"]
    assert finders(["oracle"]) == []
    assert finders(["rag_bm25", "longmem_fused"]) == ["fused", "lexical"]  # BM25-RAG reads the lexical finder's
    assert finders(["rag_embed"]) == ["embed"]


@pytest.mark.parametrize("setting, message", [({"entrants": "oracle,nobody"}, "unknown: \\['nobody'\\]"),
                                              ({"entrants": "oracle,oracle"}, "give each once"),
                                              ({"block": "0"}, "bookqa.block must be >= 1"),
                                              ({"blocks": "0,10"}, "bookqa.blocks: no block 10 \\(100 items")])
def test_bad_bookqa_settings_are_refused_before_any_work(tmp_path, setting, message):
    from longmem.eval.bookqa import run
    from longmem.eval.core import EvalContext

    ctx = EvalContext(None, [], tmp_path, tmp_path, overrides={"bookqa": setting})  # no model: nothing may load
    with pytest.raises(ValueError, match=message):
        run(ctx)


def test_the_blocks_a_run_makes_are_chosen_and_checked():
    from longmem.eval.bookqa import Size, chosen_blocks, chosen_items

    assert chosen_blocks("bookqa", Size(questions=25, block=10), 25) == [0, 10, 20]
    assert chosen_blocks("bookqa", Size(questions=25, block=10, blocks=[2, 0]), 25) == [0, 20]
    assert chosen_items("bookqa", Size(block=2, blocks=[1]), list("abcde")) == ["c", "d"]
    assert chosen_items("bookqa", Size(block=2, blocks=[2]), list("abcde")) == ["e"]  # the last block may be short
    with pytest.raises(ValueError, match="bookqa.blocks: no block 3 \\(5 items in blocks of 2: blocks 0-2\\)"):
        chosen_items("bookqa", Size(block=2, blocks=[3]), list("abcde"))
